// Package v1alpha1 is the source.headwater.dev/v1alpha1 API: HTTPSource,
// Headwater's worked example of a plug-in source kind
// (docs/writing-a-source-kind.md). An HTTPSource's artifact is a tarball
// or a single file served over HTTP(S), fetched with conditional requests.
// The watcher reconciles it as any plug-in kind (-plugin-kinds
// source.headwater.dev/v1alpha1/HTTPSource); the httpsource-fetcher
// fetches it.
//
// +kubebuilder:object:generate=true
// +groupName=source.headwater.dev
package v1alpha1
