package hook

// The receiver's permissions, generated into
// deploy/components/receivers/rbac/receiver by `make manifests`: it lists
// and watches Receivers (to find one by webhook path), and lists and
// watches Secrets, one at a time: only those its Receivers name, each by
// the field selector metadata.name (SecretWatches), holding their tokens
// and nothing else. It writes nothing; the watcher writes the Receivers'
// status.

// +kubebuilder:rbac:groups=notification.toolkit.fluxcd.io,resources=receivers,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=list;watch
