package v1alpha1

import (
	"github.com/fluxcd/pkg/apis/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// HTTPSourceKind is the kind of the HTTPSource.
const HTTPSourceKind = "HTTPSource"

// HTTPSourceSpec says where the content is and how often to look.
type HTTPSourceSpec struct {
	// URL of the content: a gzipped tarball (.tar.gz, .tgz, or served as
	// application/gzip), whose tree becomes the artifact, or any other
	// single file, which becomes the artifact's only file. http or https;
	// credentials go in the Secret of secretRef, never in the URL.
	// +kubebuilder:validation:Pattern="^https?://"
	// +required
	URL string `json:"url"`

	// Interval at which the URL is checked (one conditional request when
	// nothing changed).
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern="^([0-9]+(\\.[0-9]+)?(ms|s|m|h))+$"
	// +required
	Interval metav1.Duration `json:"interval"`

	// Suspend tells the watcher to stop checking the URL.
	// +optional
	Suspend bool `json:"suspend,omitempty"`

	// SecretRef names a Secret in the same namespace with the credentials
	// of the URL: username and password (basic authentication) or token
	// (a bearer token).
	// +optional
	SecretRef *meta.LocalObjectReference `json:"secretRef,omitempty"`

	// Timeout of the whole fetch; default 60s.
	// +kubebuilder:default="60s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern="^([0-9]+(\\.[0-9]+)?(ms|s|m))+$"
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`
}

// HTTPSourceStatus is written by Headwater's watcher, as a Flux source's.
type HTTPSourceStatus struct {
	// ObservedGeneration is the last generation reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, Reconciling, Stalled, ArtifactInStorage,
	// FetchFailed, StorageOperationFailed, ArtifactOutdated.
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Artifact is the last artifact stored.
	// +optional
	Artifact *meta.Artifact `json:"artifact,omitempty"`

	meta.ReconcileRequestStatus `json:",inline"`
}

// HTTPSource is content served over HTTP(S), as a Flux source artifact.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="URL",type="string",JSONPath=".spec.url"
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].status"
// +kubebuilder:printcolumn:name="Status",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].message"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type HTTPSource struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec HTTPSourceSpec `json:"spec,omitempty"`
	// +kubebuilder:default={"observedGeneration":-1}
	Status HTTPSourceStatus `json:"status,omitempty"`
}

// HTTPSourceList is a list of HTTPSources.
//
// +kubebuilder:object:root=true
type HTTPSourceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []HTTPSource `json:"items"`
}
