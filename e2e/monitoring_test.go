package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/headwater-gitops/headwater/pkg/apis/events/v1alpha1"
)

// monitoringDir holds the Grafana dashboard and the alert rules.
var monitoringDir = filepath.Join("..", "deploy", "components", "monitoring")

// metricName matches a Headwater metric in a PromQL expression.
var metricName = regexp.MustCompile(`\bheadwater_[a-z0-9_]+`)

// TestMonitoringMetricsExist checks that every headwater_ metric the
// Grafana dashboard and the alert rules of deploy/components/monitoring use
// is served by a service: after a source has gone through the system, the
// families the services serve on /metrics (a histogram's _bucket, _sum and
// _count series by its family) hold every name the expressions use.
func TestMonitoringMetricsExist(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	used := map[string][]string{} // metric -> where it is used
	for where, expr := range monitoringExprs(t) {
		for _, m := range metricName.FindAllString(expr, -1) {
			used[m] = append(used[m], where)
		}
	}
	if len(used) < 10 {
		t.Fatalf("the dashboard and the rules use %d headwater_ metrics: %v", len(used), used)
	}

	const name = "monitoring"
	// Two Subscriptions of the source, so the delivery families have
	// series: one sink takes its events, the other refuses them until its
	// one attempt is a dead letter.
	selector := v1alpha1.SourceSelector{Namespaces: []string{namespace},
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"e2e.headwater.dev/team": name}}}
	ok, okURL := newSink(t, nil, http.StatusOK)
	_, deadURL := newSink(t, nil, http.StatusServiceUnavailable)
	createSubscription(t, &v1alpha1.Subscription{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.SubscriptionSpec{Sources: selector, HTTP: &v1alpha1.HTTPSink{URL: okURL}}})
	createSubscription(t, &v1alpha1.Subscription{ObjectMeta: metav1.ObjectMeta{Name: name + "-dead"},
		Spec: v1alpha1.SubscriptionSpec{Sources: selector, HTTP: &v1alpha1.HTTPSink{URL: deadURL, MaxAttempts: 1}}})
	_, c := newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
	createSource(t, name, env.Git.RepoURL(name), branch, func(g *sourcev1.GitRepository) {
		g.Labels = map[string]string{"e2e.headwater.dev/team": name}
	})
	src := waitArtifact(t, name, revision(c))
	// A download, so the artifact-server's request families have series.
	if body := download(t, src.Status.Artifact.URL); sha256Digest(body) != src.Status.Artifact.Digest {
		t.Fatalf("the artifact downloads with digest %s, status says %s", sha256Digest(body), src.Status.Artifact.Digest)
	}
	ok.waitStored(t, name, revision(c))
	waitSubscription(t, name+"-dead", metav1.ConditionFalse, v1alpha1.DeliveryFailedReason)

	eventually(t, "every metric the dashboard and the alerts use is served", func() error {
		served, err := servedFamilies()
		if err != nil {
			return err
		}
		var missing []string
		for m, where := range used {
			base := m
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(m, suffix); ok && served[b] == "histogram" {
					base = b
				}
			}
			if served[base] == "" {
				slices.Sort(where)
				missing = append(missing, fmt.Sprintf("%s (in %s)", m, strings.Join(slices.Compact(where), ", ")))
			}
		}
		if len(missing) > 0 {
			slices.Sort(missing)
			return fmt.Errorf("no service serves %s", strings.Join(missing, "; "))
		}
		return nil
	})
}

// monitoringExprs returns every PromQL expression of the dashboard (each
// panel's targets) and of the PrometheusRule (each rule), by where it is.
func monitoringExprs(t *testing.T) map[string]string {
	t.Helper()
	exprs := map[string]string{}

	b, err := os.ReadFile(filepath.Join(monitoringDir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	}
	var dashboard struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(b, &dashboard); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	for _, p := range dashboard.Panels {
		for i, target := range p.Targets {
			exprs[fmt.Sprintf("panel %q target %d", p.Title, i)] = target.Expr
		}
	}

	b, err = os.ReadFile(filepath.Join(monitoringDir, "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Kind string `json:"kind"`
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert string `json:"alert"`
					Expr  string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &rule); err != nil {
		t.Fatalf("prometheusrule.yaml: %v", err)
	}
	if rule.Kind != "PrometheusRule" {
		t.Fatalf("prometheusrule.yaml is a %q", rule.Kind)
	}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			exprs["alert "+r.Alert] = r.Expr
		}
	}
	return exprs
}

// servedFamilies scrapes every service's /metrics and returns the metric
// families they serve, with their types.
func servedFamilies() (map[string]string, error) {
	families := map[string]string{}
	c := &http.Client{Timeout: 10 * time.Second}
	for _, s := range env.Services() {
		if s.TelemetryAddr == "" {
			continue
		}
		resp, err := c.Get("http://" + s.TelemetryAddr + "/metrics")
		if err != nil {
			return nil, fmt.Errorf("%s metrics: %w", s.Name, err)
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
				families[f[2]] = f[3]
			}
		}
		err = sc.Err()
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("%s metrics: %w", s.Name, err)
		}
	}
	return families, nil
}
