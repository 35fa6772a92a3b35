package secrets

// The fetcher's permissions, generated into deploy/base/rbac/fetcher by
// `make manifests`: it reads the Secrets and ConfigMaps sources name, and
// the ServiceAccounts whose image pull secrets an OCIRepository uses
// (spec.serviceAccountName), one GET at a time; no list, no watch, no
// writes.

// +kubebuilder:rbac:groups="",resources=secrets;configmaps;serviceaccounts,verbs=get
