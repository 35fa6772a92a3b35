package main

import (
	"regexp"
	"strings"
)

// ShardTemplate is the shard of components/shards whose objects (its
// watcher Deployment, ServiceAccount, bindings, Role and
// PodDisruptionBudget) the chart renders once for each entry of
// .Values.shards, with the entry in place of the shard's name; the
// component's other shards are left out. The objects are kustomize's, so
// a shard is exactly the drop-in overlay's copy of the watcher (and the
// drop-in's patches reach it as they reach the component's).
const ShardTemplate = "shard1"

// FleetShards is the part of the main watcher's HEADWATER_FLEET_SELECTORS
// in components/shards that names the component's shards; the chart names
// .Values.shards instead.
const FleetShards = "sharding.fluxcd.io/key in (shard1,shard2)"

// shardName matches the names of the objects of components/shards' shards:
// watcher-shard1, headwater-watcher-leader-election-shard2, ...
var shardName = regexp.MustCompile(`-shard[0-9]+$`)

// isShardTemplate reports whether the object named name is one of
// ShardTemplate's.
func isShardTemplate(name string) bool {
	return strings.HasSuffix(name, "-"+ShardTemplate)
}

// isOtherShard reports whether the object named name is one of a shard of
// components/shards other than ShardTemplate, which the chart leaves out.
func isOtherShard(name string) bool {
	return shardName.MatchString(name) && !isShardTemplate(name)
}

// shardFile is the template file's name for an object of ShardTemplate:
// "shards" in place of the shard's name.
func shardFile(name string) string {
	return strings.TrimSuffix(name, ShardTemplate) + "shards"
}

// shardText turns the template text of an object of ShardTemplate into
// that of the shard $shard: a document of its own, the shard's name the
// variable's.
func shardText(text string) string {
	return "---\n" + strings.ReplaceAll(text, ShardTemplate, "{{ $shard }}")
}

// wrapShards wraps the emitted template of an object of ShardTemplate
// (header line first) in a range over .Values.shards, with the root
// context as dot inside (so the object's own template reads .Values and
// .Release unchanged) and the shards' values checked first.
func wrapShards(text string) string {
	header, body, _ := strings.Cut(text, "\n")
	return header + "\n" +
		`{{- include "headwater.shards" . -}}` + "\n" +
		"{{- range $shard := .Values.shards }}{{ with $ }}\n" +
		body +
		"{{- end }}\n{{ end }}"
}

// shardsHelper is the helper the shards' templates include: the values
// that cannot go with shards fail the render, saying why.
const shardsHelper = `
{{- /*
headwater.shards: fails on values that cannot go with watcher shards
(docs/sharding.md): receivers.enabled, whose -receivers serves every
source (a shard refuses it).
*/ -}}
{{- define "headwater.shards" -}}
{{- if and .Values.shards .Values.receivers.enabled -}}
{{- fail "shards and receivers.enabled are both set: the receiver's -receivers serves every source, which a watcher shard refuses; serve Flux's webhook Receivers with Flux's notification-controller (docs/sharding.md)" -}}
{{- end -}}
{{- end -}}
`
