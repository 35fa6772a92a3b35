package main

import (
	"fmt"
	"regexp"
	"strings"
)

// A Workload is a workload of deploy/ whose resources (and for a
// Deployment its replicas, for a third-party image the image) the chart's
// values set, under Key.
type Workload struct {
	Kind, Name, Container string
	// Key is the values key: .Values.<Key>.replicas, .resources, .image,
	// and the pod's settings (PodValues).
	Key string
	// ServiceAccount is the ServiceAccount its pods run as, whose name,
	// creation and annotations .Values.<Key>.serviceAccount sets.
	ServiceAccount string
}

// Workloads are the workloads the chart's values size.
var Workloads = []Workload{
	{"Deployment", "watcher", "watcher", "watcher", "watcher"},
	// components/shards' ShardTemplate: every shard, sized and placed by
	// the watcher's values.
	{"Deployment", "watcher-" + ShardTemplate, "watcher", "watcher", "watcher-" + ShardTemplate},
	{"Deployment", "fetcher", "fetcher", "fetcher", "fetcher"},
	{"Deployment", "packager", "packager", "packager", "packager"},
	{"Deployment", "artifact-server", "artifact-server", "artifactServer", "artifact-server"},
	{"Deployment", "receiver", "receiver", "receivers", "receiver"},
	{"Deployment", "dispatcher", "dispatcher", "dispatcher", "dispatcher"},
	{"StatefulSet", "nats", "nats", "nats", "nats"},
	{"StatefulSet", "minio", "minio", "minio", "minio"},
	{"Job", "headwater-setup", "setup", "setup", "setup"},
}

// Namespace is the namespace deploy/ installs into, which the chart makes
// the release's.
const Namespace = "headwater-system"

// S3Secret is the Secret of the S3 settings deploy/ reads; the chart's
// storage.s3.existingSecret names it when storage.type is s3.
const S3Secret = "headwater-s3"

// NATSExternalSecret is the Secret of components/nats-external holding
// the URL of an existing NATS; the chart's nats.external.existingSecret
// names it.
const NATSExternalSecret = "headwater-nats-external"

// TracingEndpoint is components/tracing's OTLP endpoint, which the
// chart's tracing.endpoint sets.
const TracingEndpoint = "http://opentelemetry-collector.observability.svc:4318"

// ArtifactsClaim is components/dir-storage's claim, whose size is
// storage.directory.size.
const ArtifactsClaim = "headwater-artifacts"

// HelmLabels are the labels the chart adds to every object, beyond what
// deploy/ renders, with their template; a comparison of the two ignores
// them and nothing else.
var HelmLabels = map[string]string{
	"helm.sh/chart":                `{{ include "headwater.chart" . }}`,
	"app.kubernetes.io/managed-by": `{{ .Release.Service }}`,
}

// CRDAnnotations are the annotations the chart adds to every
// CustomResourceDefinition, beyond what deploy/ renders: `helm uninstall`
// then keeps the CRDs, and with them every source (as `kubectl delete -k`
// would not, but a package manager's uninstall should not take the
// users' objects with it). A comparison ignores them too.
var CRDAnnotations = map[string]string{
	"helm.sh/resource-policy": "keep",
}

// Defaults are the values deploy/ renders, which become values.yaml's
// defaults: replicas, resources and third-party images by workload key,
// Headwater's image repository and tag, the artifact volume's size.
type Defaults struct {
	Replicas   map[string]any
	Resources  map[string]any
	Images     map[string]string
	Repository string
	Tag        string
	ClaimSize  string
}

// Parameterizer replaces, in rendered objects, the parameters the chart's
// values set with tokens, and turns the tokens of marshalled YAML into
// template expressions. It records the values it replaces as Defaults,
// and fails where two renderings disagree on one.
type Parameterizer struct {
	// Repository and Tag are those of Headwater's images in deploy/
	// (<Repository>/<service>:<Tag>).
	Repository, Tag string
	Defaults        Defaults
	inline          map[string]string
	block           map[string]string
}

// NewParameterizer returns a Parameterizer for Headwater's images
// <repository>/<service>:<tag>.
func NewParameterizer(repository, tag string) *Parameterizer {
	return &Parameterizer{
		Repository: repository,
		Tag:        tag,
		Defaults: Defaults{
			Replicas: map[string]any{}, Resources: map[string]any{}, Images: map[string]string{},
			Repository: repository, Tag: tag,
		},
		inline: map[string]string{},
		block:  map[string]string{},
	}
}

// token returns the placeholder that stands for expr in marshalled YAML.
func (p *Parameterizer) token(kind, name, expr string) string {
	t := "HWTMPL." + kind + "." + name + ".HWEND"
	if kind == "inline" {
		p.inline[t] = expr
	} else {
		p.block[t] = expr
	}
	return t
}

// record keeps v as the default of key in defaults, or fails if another
// rendering had another value.
func record[T any](defaults map[string]T, key string, v T) error {
	if old, ok := defaults[key]; ok && fmt.Sprint(old) != fmt.Sprint(v) {
		return fmt.Errorf("%s is %v in one rendering and %v in another: the chart has one default", key, old, v)
	}
	defaults[key] = v
	return nil
}

// Parameterize replaces the parameters in o with tokens.
func (p *Parameterizer) Parameterize(o Object) error {
	labels, err := mapAt(o.Map, "metadata", "labels")
	if err != nil {
		return fmt.Errorf("%s: %w", o.Key(), err)
	}
	for name, expr := range HelmLabels {
		labels[name] = p.token("inline", "label."+name, expr)
	}
	if o.Kind == "CustomResourceDefinition" {
		annotations, err := mapAt(o.Map, "metadata", "annotations")
		if err != nil {
			return fmt.Errorf("%s: %w", o.Key(), err)
		}
		for name, v := range CRDAnnotations {
			annotations[name] = v
		}
	}
	if o.Kind == "PersistentVolumeClaim" && o.Name == ArtifactsClaim {
		req, err := mapAt(o.Map, "spec", "resources", "requests")
		if err != nil {
			return fmt.Errorf("%s: %w", o.Key(), err)
		}
		size := fmt.Sprint(req["storage"])
		if p.Defaults.ClaimSize != "" && p.Defaults.ClaimSize != size {
			return fmt.Errorf("%s: size %s in one rendering and %s in another: the chart has one default", o.Key(), p.Defaults.ClaimSize, size)
		}
		p.Defaults.ClaimSize = size
		req["storage"] = p.token("inline", "claimsize", "{{ .Values.storage.directory.size | quote }}")
	}
	for _, w := range Workloads {
		if w.Kind != o.Kind || w.Name != o.Name {
			continue
		}
		spec, err := mapAt(o.Map, "spec")
		if err != nil {
			return fmt.Errorf("%s: %w", o.Key(), err)
		}
		if w.Kind == "Deployment" {
			if err := record(p.Defaults.Replicas, w.Key, spec["replicas"]); err != nil {
				return err
			}
			spec["replicas"] = p.token("inline", "replicas."+w.Key, "{{ .Values."+w.Key+".replicas }}")
		}
		pod, err := mapAt(spec, "template", "spec")
		if err != nil {
			return fmt.Errorf("%s: %w", o.Key(), err)
		}
		containers, _ := pod["containers"].([]any)
		found := false
		for _, c := range containers {
			c, ok := c.(map[string]any)
			if !ok || c["name"] != w.Container {
				continue
			}
			found = true
			if err := record(p.Defaults.Resources, w.Key, c["resources"]); err != nil {
				return err
			}
			c["resources"] = p.token("block", "resources."+w.Key, ".Values."+w.Key+".resources")
			image, _ := c["image"].(string)
			if svc, ok := strings.CutPrefix(image, p.Repository+"/"); ok && strings.HasSuffix(svc, ":"+p.Tag) {
				svc = strings.TrimSuffix(svc, ":"+p.Tag)
				c["image"] = p.token("inline", "image."+svc,
					fmt.Sprintf("{{ printf \"%%s/%s:%%s\" .Values.image.repository .Values.image.tag | quote }}", svc))
			} else {
				if err := record(p.Defaults.Images, w.Key, image); err != nil {
					return err
				}
				c["image"] = p.token("inline", "image."+w.Key, "{{ .Values."+w.Key+".image | quote }}")
			}
		}
		if !found {
			return fmt.Errorf("%s has no container %s", o.Key(), w.Container)
		}
		if sa := pod["serviceAccountName"]; sa != w.ServiceAccount {
			return fmt.Errorf("%s runs as ServiceAccount %v, not %s", o.Key(), sa, w.ServiceAccount)
		}
		pod["serviceAccountName"] = p.serviceAccountName(w)
		template, err := mapAt(spec, "template")
		if err != nil {
			return fmt.Errorf("%s: %w", o.Key(), err)
		}
		for _, c := range containers {
			if c := c.(map[string]any); c["name"] == w.Container {
				if err := p.egress(c); err != nil {
					return fmt.Errorf("%s: %w", o.Key(), err)
				}
				if err := p.podSettings(w, template, pod, c); err != nil {
					return fmt.Errorf("%s: %w", o.Key(), err)
				}
			}
		}
	}
	return p.releaseNames(o)
}

// mapAt returns the map at path in m, creating it where missing.
func mapAt(m map[string]any, path ...string) (map[string]any, error) {
	for i, k := range path {
		next, ok := m[k]
		if !ok || next == nil {
			n := map[string]any{}
			m[k] = n
			m = n
			continue
		}
		if m, ok = next.(map[string]any); !ok {
			return nil, fmt.Errorf("%s is not a map", strings.Join(path[:i+1], "."))
		}
	}
	return m, nil
}

var (
	blockToken = regexp.MustCompile(`(?m)^( *)([^ :]+): (HWTMPL\.block\.\S+\.HWEND)$`)
	s3Secret   = regexp.MustCompile(regexp.QuoteMeta(S3Secret) + `([^-\w]|$)`)
)

// Template turns the marshalled YAML of a parameterized object into
// template text: braces of its own escaped, the namespace the release's,
// the S3 Secret the chosen one, and every token its expression.
func (p *Parameterizer) Template(y string) (string, error) {
	y = strings.ReplaceAll(y, "{{", `{{"{{"}}`)
	y = strings.ReplaceAll(y, Namespace, "{{ .Release.Namespace }}")
	y = s3Secret.ReplaceAllString(y, `{{ include "headwater.s3Secret" . }}$1`)
	y = strings.ReplaceAll(y, NATSExternalSecret, "{{ .Values.nats.external.existingSecret }}")
	y = strings.ReplaceAll(y, TracingEndpoint, "{{ .Values.tracing.endpoint | quote }}")
	y = strings.ReplaceAll(y, FleetShards, `sharding.fluxcd.io/key in ({{ join "," .Values.shards }})`)
	var err error
	y = blockToken.ReplaceAllStringFunc(y, func(line string) string {
		m := blockToken.FindStringSubmatch(line)
		expr, ok := p.block[m[3]]
		if !ok {
			err = fmt.Errorf("unknown token %s", m[3])
			return line
		}
		return fmt.Sprintf("%s%s:{{- toYaml %s | nindent %d }}", m[1], m[2], expr, len(m[1])+2)
	})
	if err != nil {
		return "", err
	}
	if y, err = p.expandStructural(y); err != nil {
		return "", err
	}
	for t, expr := range p.inline {
		y = strings.ReplaceAll(y, t, expr)
	}
	if strings.Contains(y, "HWTMPL.") {
		return "", fmt.Errorf("a token is left in a template:\n%s", y)
	}
	return y, nil
}
