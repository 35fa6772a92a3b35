package hook

// The receiver's permissions, generated into
// deploy/components/receivers/rbac/receiver by `make manifests`: it lists
// and watches Receivers (to find one by webhook path) and gets the one
// Secret a request's Receiver names, never listing or watching Secrets. It
// writes nothing; the watcher writes the Receivers' status.

// +kubebuilder:rbac:groups=notification.toolkit.fluxcd.io,resources=receivers,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
