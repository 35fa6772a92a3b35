package main

import (
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestChartReadme checks that the committed README.md is the one
// values.yaml's comments make, and that it has a row, with its
// description, for a commented value, a whole map and a pod setting.
func TestChartReadme(t *testing.T) {
	values, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := ChartReadme(values)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if got != string(committed) {
		t.Error("charts/headwater/README.md is not what values.yaml makes: run make chart")
	}
	for _, row := range []string{
		"| `storage.type` | `\"minio\"` | minio: an in-cluster MinIO",
		"| `fetcher.resources` | `{\"limits\":",
		"| `fetcher.extraArgs` | `[]` | Flags added to its container's",
		"| `minio.serviceAccount.annotations` | `{}` | Its annotations: workload identity",
		"| `imagePullSecrets` | `[]` | Pulled with these Secrets",
	} {
		if !strings.Contains(got, row) {
			t.Errorf("README.md has no row %s...", row)
		}
	}
}

// TestChartNotes renders NOTES.txt for the default install and the
// drop-in, and checks it says where the artifact-server is and what to
// do next.
func TestChartNotes(t *testing.T) {
	for _, tc := range []struct {
		name, ns string
		values   map[string]any
		want     []string
	}{
		{"default", Namespace, map[string]any{}, []string{
			"installed as release headwater in namespace headwater-system",
			"NATS JetStream: bundled; artifacts: minio.",
			"http://source-controller.headwater-system.svc.cluster.local/",
			"kubectl -n headwater-system wait --for=condition=complete job/headwater-setup",
		}},
		{"drop-in with receivers", "flux-system", map[string]any{
			"fluxDropIn": map[string]any{"enabled": true}, "receivers": map[string]any{"enabled": true},
			"crds": map[string]any{"install": false},
		}, []string{
			"kubectl -n flux-system scale deployment source-controller --replicas=0",
			", the webhook receiver;",
			"Service webhook-receiver",
			"The CRDs are not installed by this release",
			"http://source-controller.flux-system.svc.cluster.local/",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			notes := helmNotes(t, tc.ns, tc.values)
			t.Logf("NOTES.txt:\n%s", notes)
			for _, w := range tc.want {
				if !strings.Contains(notes, w) {
					t.Errorf("NOTES.txt does not say %q", w)
				}
			}
			if strings.Contains(notes, "<no value>") {
				t.Error("NOTES.txt renders <no value>")
			}
		})
	}
}

// helmNotes renders the chart's NOTES.txt as `helm install --dry-run`
// prints it.
func helmNotes(t *testing.T, ns string, values map[string]any) string {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	install := action.NewInstall(&action.Configuration{})
	install.DryRun = true
	install.DryRunOption = "true"
	install.ClientOnly = true
	install.Replace = true
	install.ReleaseName = "headwater"
	install.Namespace = ns
	rel, err := install.Run(chrt, values)
	if err != nil {
		t.Fatal(err)
	}
	return rel.Info.Notes
}
