package controller

// The watcher's permissions, generated into deploy/base/rbac/watcher by
// `make manifests`: it reconciles every Flux source kind (their status and
// finalizers included) and records Events, in both Event APIs. It reads no
// Secrets; the fetchers do.

// +kubebuilder:rbac:groups=source.toolkit.fluxcd.io,resources=gitrepositories;helmrepositories;helmcharts;buckets;ocirepositories,verbs=get;list;watch;patch;update
// +kubebuilder:rbac:groups=source.toolkit.fluxcd.io,resources=gitrepositories/status;helmrepositories/status;helmcharts/status;buckets/status;ocirepositories/status,verbs=get;patch;update
// +kubebuilder:rbac:groups=source.toolkit.fluxcd.io,resources=gitrepositories/finalizers;helmrepositories/finalizers;helmcharts/finalizers;buckets/finalizers;ocirepositories/finalizers,verbs=get;patch;update
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
