package receiver

// The watcher's extra permissions with the receivers component, generated
// into deploy/components/receivers/rbac by `make manifests` (and not into
// the base role): it writes the status of Receivers and reads the one
// Secret each names, to compute its webhook path as Flux does (a GET, never
// a list or a watch). It reads no other Secret.

// +kubebuilder:rbac:groups=notification.toolkit.fluxcd.io,resources=receivers,verbs=get;list;watch
// +kubebuilder:rbac:groups=notification.toolkit.fluxcd.io,resources=receivers/status,verbs=get;patch;update
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
