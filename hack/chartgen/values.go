package main

import (
	"fmt"
	"strings"
)

// globalValues is the part of values.yaml that names the release's
// objects and holds the defaults of every workload's pod settings.
const globalValues = `
# The cluster-scoped objects (ClusterRoles and their bindings) are named
# <fullname>-<role>; the release headwater gets deploy/'s names.
# Namespaced objects keep deploy/'s names (the Service source-controller is
# what Flux's consumers dial): install one release per namespace.
# nameOverride: the chart's name in <release>-<name>, the full name of a
# release whose name does not contain it.
nameOverride: ""
# The full name, whatever the release's.
fullnameOverride: ""

# Pulled with these Secrets (of the release's namespace), every pod:
# [{name: my-registry}].
imagePullSecrets: []

# Every workload's nodeSelector, unless its own is set.
nodeSelector: {}
# Every workload's tolerations, unless its own are set.
tolerations: []
# Every workload's PriorityClass, unless its own is set.
priorityClassName: ""
# Added to every pod's labels (a workload's podLabels win on the same key).
podLabels: {}
# Added to every pod's annotations (a workload's podAnnotations win on the
# same key).
podAnnotations: {}

crds:
  # The CRDs (Flux's source API, the Receiver with receivers.enabled, and
  # Headwater's Subscription): false where they are installed otherwise (a
  # second release, or Flux's own). helm uninstall keeps them either way.
  install: true
`

// A podValueDoc is one of a workload's pod settings in values.yaml: its
// default and the comment above it.
type podValueDoc struct {
	key, def, doc string
}

// podValueDocs are the pod settings of every workload, in values.yaml's
// order.
var podValueDocs = []podValueDoc{
	{"nodeSelector", "{}", "Node labels its pods must match (default: the global nodeSelector)."},
	{"tolerations", "[]", "Taints its pods tolerate (default: the global tolerations)."},
	{"affinity", "{}", "Replaces deploy/'s affinity (replicas spread over nodes; with a\n# ReadWriteOnce directory, next to the volume: keep that podAffinity)."},
	{"topologySpreadConstraints", "[]", "Its pods' topologySpreadConstraints."},
	{"priorityClassName", `""`, "Its pods' PriorityClass (default: the global priorityClassName)."},
	{"podLabels", "{}", "Added to its pods' labels."},
	{"podAnnotations", "{}", "Added to its pods' annotations."},
	{"podSecurityContext", "{}", "Replaces its pods' securityContext, whole (deploy/'s runs as non-root\n# with the RuntimeDefault seccomp profile, as the restricted Pod Security\n# Standard requires)."},
	{"securityContext", "{}", "Replaces its container's securityContext, whole (deploy/'s drops every\n# capability and mounts the root file system read-only)."},
	{"extraArgs", "[]", "Flags added to its container's (any flag of the service, e.g.\n# [-log-level=debug]; an environment variable in extraEnv works too)."},
	{"extraEnv", "[]", "Environment variables added to its container's: [{name, value}] or\n# [{name, valueFrom}]."},
}

// podValuesYAML is the part of a workload's section of values.yaml that
// sets its pod (indented under its key).
func podValuesYAML(key string) string {
	var b strings.Builder
	for _, v := range podValueDocs {
		fmt.Fprintf(&b, "  # %s\n  %s: %s\n", strings.ReplaceAll(v.doc, "\n# ", "\n  # "), v.key, v.def)
	}
	b.WriteString(`  serviceAccount:
    # false: the ServiceAccount name must exist (its RBAC bindings are
    # still made, for that name).
    create: true
    # Its name (default: deploy/'s, the workload's).
    name: ""
    # Its annotations: workload identity (eks.amazonaws.com/role-arn,
    # iam.gke.io/gcp-service-account, azure.workload.identity/client-id).
    annotations: {}
`)
	return b.String()
}

// Schemas of the pod settings.
var (
	stringMap = map[string]any{
		"type":                 "object",
		"additionalProperties": map[string]any{"type": "string"},
	}
	anyObject  = map[string]any{"type": "object"}
	objectList = map[string]any{"type": "array", "items": anyObject}
	envList    = map[string]any{"type": "array", "items": map[string]any{
		"type": "object", "required": []string{"name"},
		"properties": map[string]any{"name": map[string]any{"type": "string", "minLength": 1}},
	}}
	imagePullSecretsSchema = map[string]any{"type": "array", "items": map[string]any{
		"type": "object", "required": []string{"name"}, "additionalProperties": false,
		"properties": map[string]any{"name": map[string]any{"type": "string", "minLength": 1}},
	}}
)

// podValuesSchema returns the schema of a workload's pod settings, by key.
func podValuesSchema() map[string]any {
	return map[string]any{
		"nodeSelector":              stringMap,
		"tolerations":               objectList,
		"affinity":                  anyObject,
		"topologySpreadConstraints": objectList,
		"priorityClassName":         map[string]any{"type": "string"},
		"podLabels":                 stringMap,
		"podAnnotations":            stringMap,
		"podSecurityContext":        anyObject,
		"securityContext":           anyObject,
		"extraArgs":                 map[string]any{"type": "array", "items": map[string]any{"type": "string"}},
		"extraEnv":                  envList,
		"serviceAccount": map[string]any{
			"type": "object", "additionalProperties": false,
			"properties": map[string]any{
				"create":      map[string]any{"type": "boolean"},
				"name":        map[string]any{"type": "string"},
				"annotations": stringMap,
			},
		},
	}
}

// with returns m with the entries of more added.
func with(m, more map[string]any) map[string]any {
	for k, v := range more {
		m[k] = v
	}
	return m
}
