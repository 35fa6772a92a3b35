package secrets

// The fetcher's permissions, generated into deploy/base/rbac/fetcher by
// `make manifests`: it reads the Secrets and ConfigMaps sources name, one
// GET at a time; no list, no watch, no writes.

// +kubebuilder:rbac:groups="",resources=secrets;configmaps,verbs=get
