package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"
)

// notes is templates/NOTES.txt: what was installed, how to check it, and
// where the artifact-server is.
const notes = `{{- /* ` + header + ` */ -}}
{{- $ns := .Release.Namespace -}}
{{- $storage := include "headwater.storage" . -}}
{{- $nats := include "headwater.nats" . -}}
Headwater {{ .Chart.AppVersion }} is installed as release {{ .Release.Name }} in namespace {{ $ns }}:
the watcher, fetchers, packagers and artifact-servers
{{- if .Values.receivers.enabled }}, the webhook receiver{{ end }}
{{- if .Values.dispatcher.enabled }}, the dispatcher{{ end }};
NATS JetStream: {{ $nats }}{{ if .Values.nats.tls.enabled }} (TLS){{ end }}; artifacts: {{ $storage }}
{{- if eq $storage "s3" }} (Secret {{ .Values.storage.s3.existingSecret }}){{ end }}.
{{- if .Values.fluxDropIn.enabled }}

This is the drop-in for Flux's source-controller: the watcher waits while
Flux's source-controller Deployment has replicas. Scale it to 0:

  kubectl -n {{ $ns }} scale deployment source-controller --replicas=0

(docs/migrate-from-flux.md has the whole switch, and the way back.)
{{- end }}
{{- if not .Values.crds.install }}

The CRDs are not installed by this release (crds.install false): the
watcher waits, its /readyz saying which, until they are served.
{{- end }}

Check it:

  kubectl -n {{ $ns }} wait --for=condition=complete job/headwater-setup --timeout=5m
  kubectl -n {{ $ns }} rollout status deployment/watcher deployment/fetcher deployment/packager deployment/artifact-server
  kubectl -n {{ $ns }} get pods
  kubectl get gitrepositories,ocirepositories,helmrepositories,helmcharts,buckets -A

The artifact-server serves the artifacts behind the Service
source-controller, as Flux's does:

  http://source-controller.{{ $ns }}.svc.cluster.local/
{{- if .Values.receivers.enabled }}

Flux's webhook Receivers are served behind the Service webhook-receiver
(port 80): route your Git host's webhooks to it (deploy/examples/receiver-ingress.yaml).
{{- end }}
`

// chartReadmeIntro starts the chart's README.md.
const chartReadmeIntro = `# The Headwater chart

<!-- ` + header + ` The table is values.yaml's comments. -->

Headwater, a horizontally scalable source controller serving Flux's source
API, on NATS JetStream. The chart renders the same objects as the
kustomizations of deploy/ (docs/design.md, "One truth for kustomize and
Helm"): its defaults are ` + "`kubectl apply -k deploy/`" + `.

    helm install headwater oci://ghcr.io/headwater-gitops/charts/headwater \
      --version <version> -n headwater-system --create-namespace

or from a release's package (` + "`make release`" + `: bin/release/headwater-<version>.tgz)
or this directory. In place of Flux's source-controller:
` + "`--set fluxDropIn.enabled=true -n flux-system`" + ` (docs/migrate-from-flux.md).
deploy/README.md says how to pick the storage, the bus and the optional
services, and how to scale.

The cluster-scoped objects (ClusterRoles and their bindings) are named
after the release (` + "`<fullname>-<role>`" + `; the release headwater gets
deploy/'s names), so releases in two namespaces do not collide; the CRDs
are shared (` + "`crds.install=false`" + ` on the second). Namespaced objects keep
deploy/'s names: one release per namespace.

Every workload (watcher, fetcher, packager, artifactServer, receivers,
dispatcher, setup, nats, minio) takes the same pod settings; the table
lists them once per workload.

## Values

| Key | Default | Description |
|-----|---------|-------------|
`

// valuesKey matches a key of values.yaml: its indentation, name and
// value (empty for a map that follows on the next lines).
var valuesKey = regexp.MustCompile(`^( *)([A-Za-z0-9_]+):(?: (.*))?$`)

// ChartReadme writes the chart's README.md from values.yaml: a row per
// value, its description the comment above it; a map whose keys have no
// comments of their own is one row.
func ChartReadme(values []byte) (string, error) {
	var all map[string]any
	if err := yaml.Unmarshal(values, &all); err != nil {
		return "", fmt.Errorf("values.yaml: %w", err)
	}
	type entry struct {
		path    []string
		leaf    bool
		comment string
	}
	var entries []entry
	var comment []string
	var stack []string
	for _, l := range strings.Split(string(values), "\n") {
		t := strings.TrimSpace(l)
		switch {
		case t == "":
			comment = nil
			continue
		case strings.HasPrefix(t, "#"):
			comment = append(comment, strings.TrimSpace(strings.TrimPrefix(t, "#")))
			continue
		}
		m := valuesKey.FindStringSubmatch(l)
		if m == nil {
			// A line of a default's own YAML (a list's item).
			comment = nil
			continue
		}
		depth := len(m[1]) / 2
		if depth > len(stack) {
			return "", fmt.Errorf("values.yaml: %q is indented too far", l)
		}
		stack = append(stack[:depth], m[2])
		entries = append(entries, entry{path: append([]string(nil), stack...), leaf: m[3] != "", comment: strings.Join(comment, " ")})
		comment = nil
	}
	var b strings.Builder
	b.WriteString(chartReadmeIntro)
	under := func(p, q []string) bool {
		return len(q) > len(p) && strings.Join(q[:len(p)], ".") == strings.Join(p, ".")
	}
	for i := 0; i < len(entries); i++ {
		e := entries[i]
		commented := false
		j := i + 1
		for ; j < len(entries) && under(e.path, entries[j].path); j++ {
			if entries[j].comment != "" {
				commented = true
			}
		}
		if !e.leaf && commented {
			// The keys below have their own rows.
			if e.comment != "" {
				fmt.Fprintf(&b, "| `%s` | | %s |\n", strings.Join(e.path, "."), cell(e.comment))
			}
			continue
		}
		var v any = all
		for _, p := range e.path {
			v = v.(map[string]any)[p]
		}
		d, err := json.Marshal(v)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "| `%s` | `%s` | %s |\n", strings.Join(e.path, "."), d, cell(e.comment))
		i = j - 1
	}
	return b.String(), nil
}

// cell makes s fit a Markdown table's cell.
func cell(s string) string {
	return strings.ReplaceAll(s, "|", `\|`)
}
