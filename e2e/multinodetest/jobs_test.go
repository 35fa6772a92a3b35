package multinodetest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/headwater-gitops/headwater/e2e/cluster"
	"github.com/headwater-gitops/headwater/e2e/cluster/kubetest"
	"github.com/headwater-gitops/headwater/e2e/promtext"
)

// telemetryPorts are the fetcher's and the packager's telemetry ports
// (HEADWATER_TELEMETRY_ADDR in deploy/base), where their /metrics is.
var telemetryPorts = map[string]int{"fetcher": 9101, "packager": 9102}

// checkTakesJobs waits until the fetcher and the packager on node have
// each handled jobs since they last started: headwater_jobs_total with
// result success above zero on their own /metrics (a counter that starts
// at zero with the process), read from node from at the pod's address. A
// pod that is Ready on a returned node but takes no job from the bus (its
// consumer never bound again, say) fails it. when says which return.
func checkTakesJobs(t *testing.T, node string, from *cluster.Node, when string) {
	t.Helper()
	hc := from.HTTPClient()
	var handled []string
	kubetest.Eventually(t, 3*time.Minute, "the fetcher and the packager on "+node+" handling jobs "+when, func(ctx context.Context) error {
		apps, err := podsByApp(ctx)
		if err != nil {
			return err
		}
		handled = handled[:0]
		for _, app := range []string{"fetcher", "packager"} {
			var pod *corev1.Pod
			for i := range apps[app] {
				p := &apps[app][i]
				if p.Spec.NodeName == node && p.DeletionTimestamp == nil && kubetest.PodReady(p) && p.Status.PodIP != "" {
					pod = p
				}
			}
			if pod == nil {
				return fmt.Errorf("no %s Ready on %s", app, node)
			}
			url := fmt.Sprintf("http://%s/metrics", net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(telemetryPorts[app])))
			body, err := get(ctx, hc, url)
			if err != nil {
				return fmt.Errorf("%s %s on %s: %w", app, pod.Name, node, err)
			}
			ss, err := promtext.Parse(body)
			if err != nil {
				return fmt.Errorf("%s %s on %s: %w", app, pod.Name, node, err)
			}
			byResult := ss.SumBy("headwater_jobs_total", "result")
			if byResult["success"] == 0 {
				return fmt.Errorf("%s %s on %s (Ready, started %s) has handled no job successfully since it started: headwater_jobs_total by result %v",
					app, pod.Name, node, startedAt(pod), byResult)
			}
			handled = append(handled, fmt.Sprintf("%s %s: %v", app, pod.Name, byResult))
		}
		return nil
	})
	t.Logf("on %s %s, jobs handled since each started (headwater_jobs_total by result): %s", node, when, strings.Join(handled, "; "))
}

// startedAt is when pod's container last started, as its status says.
func startedAt(pod *corev1.Pod) string {
	for _, s := range pod.Status.ContainerStatuses {
		if s.State.Running != nil {
			return s.State.Running.StartedAt.Format(time.TimeOnly)
		}
	}
	return "?"
}
