package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"sigs.k8s.io/yaml"
)

// helpers is templates/_helpers.tpl: what the generated templates call.
const helpers = `{{- /* ` + header + ` */ -}}

{{- /*
headwater.storage: the kustomization of deploy/ the storage values pick,
as hack/chartgen names it: minio (deploy/), s3 (overlays/s3), dir-rwo
(overlays/single-node) or dir-rwx (overlays/rwx).
*/ -}}
{{- define "headwater.storage" -}}
{{- $s := .Values.storage -}}
{{- if eq $s.type "directory" -}}
{{- if eq $s.directory.accessMode "ReadWriteMany" -}}dir-rwx{{- else -}}dir-rwo{{- end -}}
{{- else -}}
{{- $s.type -}}
{{- end -}}
{{- end -}}

{{- /*
headwater.s3Secret: the Secret of the S3 settings: yours with storage.type
s3 (required), otherwise the one the setup Job makes for MinIO.
*/ -}}
{{- define "headwater.s3Secret" -}}
{{- if eq .Values.storage.type "s3" -}}
{{- required "storage.type is s3: set storage.s3.existingSecret to the name of your Secret with the keys endpoint, bucket, accesskey and secretkey, in the release's namespace (deploy/README.md, \"Your S3\")" .Values.storage.s3.existingSecret -}}
{{- else -}}
` + S3Secret + `
{{- end -}}
{{- end -}}

{{- /*
headwater.nats: the NATS the services use, as hack/chartgen names it:
bundled (deploy/base), cluster (components/nats-cluster) or external
(components/nats-external).
*/ -}}
{{- define "headwater.nats" -}}
{{- if .Values.nats.external.enabled -}}
{{- if .Values.nats.cluster.enabled -}}
{{- fail "nats.external.enabled and nats.cluster.enabled are both true: the cluster is of the bundled servers, which an external NATS replaces; enable one" -}}
{{- end -}}
external
{{- else if .Values.nats.cluster.enabled -}}
cluster
{{- else -}}
bundled
{{- end -}}
{{- end -}}

{{- /*
headwater.fullname: the release's full name, which replaces "headwater-"
in the names of the cluster-scoped objects (ClusterRoles and their
bindings), so that releases in two namespaces do not share them:
fullnameOverride, else the release's name if it contains the chart's (or
nameOverride), else both joined. The release headwater renders deploy/'s
names. Namespaced objects keep deploy/'s names: one release per namespace.
*/ -}}
{{- define "headwater.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* headwater.chart: the value of the label helm.sh/chart. */ -}}
{{- define "headwater.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}
`

// addFixed adds the files that are not rendered from deploy/: Chart.yaml,
// the helpers, values.yaml (its defaults those deploy/ renders) and
// values.schema.json.
func (c *Chart) addFixed(d Defaults) error {
	c.Files["Chart.yaml"] = []byte(fmt.Sprintf(`# %s
apiVersion: v2
name: headwater
description: >-
  Headwater, a horizontally scalable source controller for GitOps serving
  Flux's source API (source.toolkit.fluxcd.io/v1), on NATS JetStream. The
  same objects as the kustomizations of deploy/, for the same choices.
type: application
version: %s
appVersion: %s
home: https://github.com/headwater-gitops/headwater
sources:
  - https://github.com/headwater-gitops/headwater
`, header, strings.TrimPrefix(d.Tag, "v"), d.Tag))
	c.Files["templates/_helpers.tpl"] = []byte(helpers + shardsHelper)
	values, err := valuesYAML(d)
	if err != nil {
		return err
	}
	c.Files["values.yaml"] = values
	readme, err := ChartReadme(values)
	if err != nil {
		return err
	}
	c.Files["README.md"] = []byte(readme)
	c.Files["templates/NOTES.txt"] = []byte(notes)
	schema, err := json.MarshalIndent(valuesSchema(), "", "  ")
	if err != nil {
		return err
	}
	c.Files["values.schema.json"] = append(schema, '\n')
	return nil
}

// valuesYAML writes values.yaml with deploy/'s defaults.
func valuesYAML(d Defaults) ([]byte, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n", header)
	b.WriteString(`# The values of the Headwater chart. values.schema.json checks them: an
# unknown key or a wrong type fails helm install, upgrade and template.
# Each choice below picks what a kustomization of deploy/ would (named in
# its comment); the chart renders the same objects (hack/chartgen tests
# it). Helm does not create the namespace: helm install -n headwater-system
# --create-namespace (and label it pod-security.kubernetes.io/enforce:
# restricted, as deploy/base does).

# Headwater's image, every service in one (each Deployment's -target picks
# its own): <repository>/headwater:<tag>.
image:
`)
	fmt.Fprintf(&b, "  repository: %s\n  tag: %s\n", d.Repository, d.Tag)
	b.WriteString(globalValues)
	fmt.Fprintf(&b, `
# Where artifacts are stored (deploy/README.md, "Pick the storage").
storage:
  # minio: an in-cluster MinIO (deploy/); s3: your S3-compatible store
  # (overlays/s3); directory: a directory on a volume every fetcher,
  # packager and artifact-server mounts (components/dir-storage).
  type: minio
  s3:
    # Required with type s3: a Secret in the release's namespace with the
    # keys endpoint, bucket, accesskey and secretkey (and optionally
    # region, prefix, insecure).
    existingSecret: ""
  directory:
    # ReadWriteOnce: one volume, the pods that mount it kept on its node
    # (overlays/single-node); ReadWriteMany: overlays/rwx.
    accessMode: ReadWriteOnce
    # The volume's size.
    size: %s
`, d.ClaimSize)
	section := func(comment, key string, enabled, replicas, image bool) error {
		fmt.Fprintf(&b, "\n# %s\n%s:\n", comment, key)
		if enabled {
			b.WriteString("  # Installs it.\n  enabled: false\n")
		}
		if replicas {
			fmt.Fprintf(&b, "  # Its Deployment's replicas.\n  replicas: %v\n", d.Replicas[key])
		}
		if image {
			fmt.Fprintf(&b, "  # Its image.\n  image: %s\n", d.Images[key])
		}
		res, ok := d.Resources[key]
		if !ok {
			return fmt.Errorf("no rendering has the resources of %s", key)
		}
		y, err := yaml.Marshal(map[string]any{"resources": res})
		if err != nil {
			return err
		}
		b.WriteString("  # Requests and limits of its container.\n")
		for _, l := range strings.Split(strings.TrimSuffix(string(y), "\n"), "\n") {
			b.WriteString("  " + l + "\n")
		}
		b.WriteString(podValuesYAML(key))
		return nil
	}
	for _, s := range []struct {
		comment, key              string
		enabled, replicas, images bool
	}{
		{"The watcher: one leader, the others standing by.", "watcher", false, true, false},
		{"The fetchers: scale by queue depth (deploy/README.md, \"Scaling\").", "fetcher", false, true, false},
		{"The packagers: CPU-bound.", "packager", false, true, false},
		{"The artifact-servers, behind the Service source-controller.", "artifactServer", false, true, false},
		{"Flux's webhook Receivers, served by Headwater (components/receivers): only where Flux's notification-controller does not serve them.", "receivers", true, true, false},
		{"Subscriptions to the public events (components/dispatcher).", "dispatcher", true, true, false},
		{"The in-cluster MinIO of storage.type minio.", "minio", false, false, true},
		{"The Job that makes the bus keys (and MinIO's credentials).", "setup", false, false, false},
	} {
		if err := section(s.comment, s.key, s.enabled, s.replicas, s.images); err != nil {
			return nil, err
		}
	}
	b.WriteString(`
# The bundled NATS JetStream server.
nats:
`)
	fmt.Fprintf(&b, "  # Its image.\n  image: %s\n", d.Images["nats"])
	y, err := yaml.Marshal(map[string]any{"resources": d.Resources["nats"]})
	if err != nil {
		return nil, err
	}
	b.WriteString("  # Requests and limits of its container.\n")
	for _, l := range strings.Split(strings.TrimSuffix(string(y), "\n"), "\n") {
		b.WriteString("  " + l + "\n")
	}
	b.WriteString(podValuesYAML("nats"))
	b.WriteString(`  # Three servers, every stream in three copies (components/nats-cluster).
  cluster:
    enabled: false
  # TLS with client certificates on every bus connection, from the Secrets
  # headwater-nats-tls and headwater-nats-client-tls (components/nats-tls);
  # with an external NATS, the client certificate only.
  tls:
    enabled: false
  # An existing NATS JetStream instead of the bundled server
  # (components/nats-external): every service dials the URL in the key
  # url of the Secret existingSecret, which you create, as its own user
  # (its NKey seed in headwater-nats-<identity>, made by the setup Job;
  # define those users on your server as deploy/base/nats/auth.conf does).
  external:
    enabled: false
    existingSecret: ` + NATSExternalSecret + `

# PodMonitors, alerts and a Grafana dashboard for the Prometheus Operator
# (components/monitoring).
monitoring:
  enabled: false

# OpenTelemetry tracing (components/tracing): every service exports its
# spans by OTLP over HTTP (http/protobuf) to endpoint, an OpenTelemetry
# collector's; one trace per change (docs/operating.md). Further OTEL_*
# variables (a sampler, say) go in each service's extraEnv.
tracing:
  enabled: false
  endpoint: ` + TracingEndpoint + `

# Object-level workload identity (components/workload-identity), as Flux's
# --feature-gates=ObjectLevelWorkloadIdentity=true: a source with a cloud
# provider (aws, azure) and spec.serviceAccountName logs in as that
# ServiceAccount of its own namespace; the fetcher may then create
# ServiceAccount tokens, which it may not otherwise (docs/security.md).
# Flux's --default-service-account: HEADWATER_DEFAULT_SERVICE_ACCOUNT in
# fetcher.extraEnv.
workloadIdentity:
  enabled: false

# The egress policy of the services that request tenants' URLs (the
# fetchers and the dispatcher; docs/security.md, "Egress"): a private
# address (the cluster's Services and Pods, 10.0.0.0/8, 172.16.0.0/12,
# 192.168.0.0/16, 100.64.0.0/10, fc00::/7), loopback or link-local is
# refused to a source's URL or a Subscription's sink unless listed here.
egress:
  # CIDRs or addresses, each optionally with :port, e.g.
  # [10.96.12.34:3000] for an in-cluster git server's Service (its
  # -allowed-destinations). Headwater's own NATS and artifact-server stay
  # refused whatever this says.
  allowedDestinations: []

# A drop-in for Flux's source-controller (components/flux-dropin): install
# into Flux's namespace (helm install -n flux-system) after scaling Flux's
# source-controller to 0; no Flux CRDs, events to Flux's
# notification-controller. See docs/migrate-from-flux.md.
fluxDropIn:
  enabled: false

# Watcher shards, as Flux shards source-controller (components/shards,
# docs/sharding.md): a watcher Deployment watcher-<shard> for each name,
# reconciling the sources labelled sharding.fluxcd.io/key: <shard>; the
# main watcher then takes the sources without the label and reports those
# no shard selects. The shards run the watcher's image, replicas,
# resources and pod settings, as ServiceAccount <watcher's>-<shard>. Not
# with receivers.enabled. E.g. [shard1, shard2].
shards: []
`)
	return []byte(b.String()), nil
}

// valuesSchema is values.schema.json: every key typed, no key unknown.
func valuesSchema() map[string]any {
	object := func(props map[string]any, required ...string) map[string]any {
		o := map[string]any{"type": "object", "additionalProperties": false, "properties": props}
		if len(required) > 0 {
			o["required"] = required
		}
		return o
	}
	str := map[string]any{"type": "string", "minLength": 1}
	boolean := map[string]any{"type": "boolean"}
	quantities := map[string]any{
		"type":                 "object",
		"additionalProperties": map[string]any{"type": []string{"string", "integer", "number"}},
	}
	resources := object(map[string]any{"requests": quantities, "limits": quantities})
	replicas := map[string]any{"type": "integer", "minimum": 0}
	service := func(enabled, withReplicas, image bool) map[string]any {
		props := podValuesSchema()
		props["resources"] = resources
		if enabled {
			props["enabled"] = boolean
		}
		if withReplicas {
			props["replicas"] = replicas
		}
		if image {
			props["image"] = str
		}
		return object(props)
	}
	toggle := object(map[string]any{"enabled": boolean})
	return map[string]any{
		"$schema":              "http://json-schema.org/draft-07/schema#",
		"title":                "Values of the Headwater chart",
		"type":                 "object",
		"additionalProperties": false,
		"properties": map[string]any{
			"image": object(map[string]any{"repository": str, "tag": str}),
			"storage": object(map[string]any{
				"type": map[string]any{"type": "string", "enum": []string{"minio", "s3", "directory"}},
				"s3":   object(map[string]any{"existingSecret": map[string]any{"type": "string"}}),
				"directory": object(map[string]any{
					"accessMode": map[string]any{"type": "string", "enum": []string{"ReadWriteOnce", "ReadWriteMany"}},
					"size":       str,
				}),
			}),
			"watcher":        service(false, true, false),
			"fetcher":        service(false, true, false),
			"packager":       service(false, true, false),
			"artifactServer": service(false, true, false),
			"receivers":      service(true, true, false),
			"dispatcher":     service(true, true, false),
			"minio":          service(false, false, true),
			"setup":          service(false, false, false),
			"nats": object(with(podValuesSchema(), map[string]any{
				"image":     str,
				"resources": resources,
				"cluster":   toggle,
				"tls":       toggle,
				"external":  object(map[string]any{"enabled": boolean, "existingSecret": str}),
			})),
			"nameOverride":      map[string]any{"type": "string"},
			"fullnameOverride":  map[string]any{"type": "string"},
			"imagePullSecrets":  imagePullSecretsSchema,
			"nodeSelector":      stringMap,
			"tolerations":       objectList,
			"priorityClassName": map[string]any{"type": "string"},
			"podAnnotations":    stringMap,
			"podLabels":         stringMap,
			"crds":              object(map[string]any{"install": boolean}),
			"monitoring":        toggle,
			"tracing":           object(map[string]any{"enabled": boolean, "endpoint": str}),
			"egress": object(map[string]any{"allowedDestinations": map[string]any{
				"type": "array", "items": map[string]any{"type": "string", "minLength": 1},
			}}),
			"fluxDropIn":       toggle,
			"workloadIdentity": toggle,
			"shards": map[string]any{
				"type":        "array",
				"uniqueItems": true,
				"items": map[string]any{
					// A DNS label, short enough for the longest name made
					// of it (headwater-watcher-leader-election-<shard>).
					"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 30,
				},
			},
		},
	}
}
