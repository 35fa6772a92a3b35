// Command helmrelease installs or upgrades a Helm release from a
// HelmChart's artifact the way Flux's helm-controller does, for the
// cluster tests that run it as a Job beside Headwater's drop-in
// (e2e/clustertest, TestFluxControllers/HelmRelease). helm-controller's
// module is not served by the Go module proxy this project builds from, so
// this is its path for a chart, written with the same Helm v3 SDK and
// Flux's published source API:
//
//  1. wait until the HelmChart is Ready with an artifact for its current
//     generation (helm-controller waits for the chart's source);
//  2. download status.artifact.url (the Service source-controller) and
//     check the archive against status.artifact.digest, refusing a
//     mismatch, as helm-controller's artifact fetcher does;
//  3. load the chart and install it, or upgrade the release when it
//     exists (helm-controller's action.Install / action.Upgrade), with the
//     values given, waiting for its resources;
//  4. print one JSON line: the release, its revision and status, and the
//     chart's version and digest.
//
// It runs in-cluster with its ServiceAccount (helm-controller's rights:
// read HelmCharts, manage what the chart holds and Helm's release
// Secrets).
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	fluxmeta "github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/kube"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// options are the command's flags.
type options struct {
	chart           types.NamespacedName
	release         string
	targetNamespace string
	values          string
	timeout         time.Duration
}

func main() {
	var o options
	fs := flag.NewFlagSet("helmrelease", flag.ExitOnError)
	fs.StringVar(&o.chart.Namespace, "chart-namespace", "flux-system", "The HelmChart's namespace.")
	fs.StringVar(&o.chart.Name, "chart", "", "The HelmChart's name.")
	fs.StringVar(&o.release, "release", "", "The release's name.")
	fs.StringVar(&o.targetNamespace, "target-namespace", "default", "The namespace the release is installed into (and its storage namespace).")
	fs.StringVar(&o.values, "values", "", "The release's values, as YAML or JSON.")
	fs.DurationVar(&o.timeout, "timeout", 3*time.Minute, "How long to wait for the chart and for the release's resources.")
	_ = fs.Parse(os.Args[1:])
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if o.chart.Name == "" || o.release == "" {
		log.Error("-chart and -release are required")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*o.timeout)
	defer cancel()
	if err := run(ctx, log, o); err != nil {
		log.Error("release failed", "release", o.release, "error", err.Error())
		os.Exit(1)
	}
}

// outcome is the line run prints.
type outcome struct {
	Release      string `json:"release"`
	Namespace    string `json:"namespace"`
	Revision     int    `json:"revision"`
	Status       string `json:"status"`
	Action       string `json:"action"`
	ChartVersion string `json:"chartVersion"`
	Digest       string `json:"digest"`
	URL          string `json:"url"`
}

func run(ctx context.Context, log *slog.Logger, o options) error {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return fmt.Errorf("in-cluster configuration: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := sourcev1.AddToScheme(scheme); err != nil {
		return err
	}
	cl, err := ctrlclient.New(cfg, ctrlclient.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	art, err := readyArtifact(ctx, cl, o.chart, o.timeout)
	if err != nil {
		return err
	}
	log.Info("chart artifact ready", "helmchart", o.chart.String(), "revision", art.Revision, "digest", art.Digest, "url", art.URL)
	chrt, err := fetchChart(ctx, art)
	if err != nil {
		return err
	}
	var vals map[string]any
	if err := yaml.Unmarshal([]byte(o.values), &vals); err != nil {
		return fmt.Errorf("-values: %w", err)
	}

	getter := kube.GetConfig("", "", o.targetNamespace)
	ac := new(action.Configuration)
	if err := ac.Init(getter, o.targetNamespace, "secret", func(format string, v ...any) {
		log.Debug(fmt.Sprintf(format, v...))
	}); err != nil {
		return fmt.Errorf("helm configuration: %w", err)
	}
	var rel *release.Release
	act := "upgrade"
	if _, err := action.NewHistory(ac).Run(o.release); errors.Is(err, driver.ErrReleaseNotFound) {
		act = "install"
		install := action.NewInstall(ac)
		install.ReleaseName = o.release
		install.Namespace = o.targetNamespace
		install.Wait = true
		install.Timeout = o.timeout
		rel, err = install.RunWithContext(ctx, chrt, vals)
		if err != nil {
			return fmt.Errorf("install %s: %w", o.release, err)
		}
	} else if err != nil {
		return fmt.Errorf("history of %s: %w", o.release, err)
	} else {
		upgrade := action.NewUpgrade(ac)
		upgrade.Namespace = o.targetNamespace
		upgrade.Wait = true
		upgrade.Timeout = o.timeout
		rel, err = upgrade.RunWithContext(ctx, o.release, chrt, vals)
		if err != nil {
			return fmt.Errorf("upgrade %s: %w", o.release, err)
		}
	}
	return json.NewEncoder(os.Stdout).Encode(outcome{
		Release: rel.Name, Namespace: rel.Namespace, Revision: rel.Version, Status: rel.Info.Status.String(), Action: act,
		ChartVersion: rel.Chart.Metadata.Version, Digest: art.Digest, URL: art.URL,
	})
}

// readyArtifact waits until the HelmChart is Ready for its generation and
// has an artifact, and returns it.
func readyArtifact(ctx context.Context, cl ctrlclient.Client, key types.NamespacedName, timeout time.Duration) (*fluxmeta.Artifact, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var hc sourcev1.HelmChart
	why := "not read yet"
	for {
		err := cl.Get(ctx, key, &hc)
		ready := apimeta.FindStatusCondition(hc.Status.Conditions, fluxmeta.ReadyCondition)
		switch {
		case err != nil:
			why = err.Error()
		case ready == nil || ready.Status != metav1.ConditionTrue:
			why = fmt.Sprintf("not Ready: %+v", ready)
		case ready.ObservedGeneration != hc.Generation:
			why = fmt.Sprintf("Ready for generation %d, the chart is at %d", ready.ObservedGeneration, hc.Generation)
		case hc.Status.Artifact == nil:
			why = "Ready without an artifact"
		default:
			return hc.Status.Artifact, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("HelmChart %s: %s", key, why)
		case <-time.After(time.Second):
		}
	}
}

// fetchChart downloads the artifact, checks its digest and loads the
// chart from it.
func fetchChart(ctx context.Context, art *fluxmeta.Artifact) (*chart.Chart, error) {
	algo, want, ok := strings.Cut(art.Digest, ":")
	if !ok || algo != "sha256" {
		return nil, fmt.Errorf("artifact digest %q: want sha256:<hex>", art.Digest)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, art.URL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("download %s: %w", art.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("download %s: %s", art.URL, resp.Status)
	}
	var buf bytes.Buffer
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(&buf, h), resp.Body); err != nil {
		return nil, fmt.Errorf("download %s: %w", art.URL, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return nil, fmt.Errorf("artifact %s has digest sha256:%s, the HelmChart says %s", art.URL, got, art.Digest)
	}
	chrt, err := loader.LoadArchive(&buf)
	if err != nil {
		return nil, fmt.Errorf("load the chart of %s: %w", art.URL, err)
	}
	return chrt, nil
}
