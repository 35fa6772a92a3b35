package v1alpha1

import (
	"github.com/fluxcd/pkg/apis/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SubscriptionKind is the kind of the Subscription.
const SubscriptionKind = "Subscription"

// HMACKey is the key of the Secret named by spec.http.secretRef that holds
// the key the dispatcher signs each HTTP delivery with.
const HMACKey = "hmacKey"

// SignatureHeader is the HTTP header carrying a delivery's signature:
// "sha256=<hex HMAC-SHA256 of the request body with the Secret's hmacKey>".
// It covers the body only; SignatureV2Header covers the CloudEvent's id,
// type and time and a timestamp as well (see docs/events.md).
const SignatureHeader = "X-Headwater-Signature"

// FluxSignatureHeader carries the same value as SignatureHeader, where
// Flux's notification-controller Receiver of type generic-hmac looks for
// it, so a Subscription can notify one.
const FluxSignatureHeader = "X-Signature"

// SignatureV2Header carries the version 2 signature (package
// pkg/signature): "t=<Unix seconds>,v2=<hex HMAC-SHA256 of
// "v2\n<t>\n<ce-id>\n<ce-type>\n<ce-time>\n<body>">".
const SignatureV2Header = "X-Headwater-Signature-V2"

// Defaults of the HTTP delivery.
const (
	// DefaultMaxAttempts is how often an event is offered to an HTTP sink
	// before it becomes a dead letter.
	DefaultMaxAttempts = 10
	// DefaultTimeout bounds one HTTP delivery.
	DefaultTimeout = "10s"
)

// Subscription conditions and reasons.
const (
	// ReadyCondition is True while the dispatcher delivers and the last
	// event offered was accepted (reason Succeeded); False when the
	// Subscription cannot be served (reason of the problem, e.g.
	// SecretNotFound, InvalidSpec, ConsumerConflict, AccessDenied) or the last event
	// ended as a dead letter (reason DeliveryFailed). Unknown until the
	// first report. Positive polarity.
	ReadyCondition = meta.ReadyCondition
	// SucceededReason: the last event offered was accepted.
	SucceededReason = meta.SucceededReason
	// DeliveryFailedReason: the last event offered became a dead letter.
	DeliveryFailedReason = "DeliveryFailed"
	// InvalidSpecReason: the spec cannot be served (a malformed selector).
	InvalidSpecReason = "InvalidSpec"
	// SecretNotFoundReason: the HMAC Secret or its key is missing.
	SecretNotFoundReason = "SecretNotFound"
	// ConsumerConflictReason: the named NATS consumer exists for another
	// Subscription.
	ConsumerConflictReason = "ConsumerConflict"
	// AccessDeniedReason: the Subscription names another namespace while
	// the dispatcher refuses cross-namespace references
	// (-no-cross-namespace-refs); Flux's reason.
	AccessDeniedReason = "AccessDenied"
)

// SubscriptionSpec says what a subscriber wants and where it goes. Exactly
// one of http and nats is set.
//
// +kubebuilder:validation:XValidation:rule="has(self.http) != has(self.nats)",message="set exactly one of http and nats"
type SubscriptionSpec struct {
	// Sources selects the sources whose events are delivered; empty
	// selects every source.
	// +optional
	Sources SourceSelector `json:"sources,omitempty"`

	// Types are the CloudEvent types delivered; default: every public
	// type (io.headwater.artifact.stored.v1, ...unchanged.v1, ...failed.v1,
	// ...deleted.v1).
	// +optional
	// +kubebuilder:validation:MaxItems=16
	Types []string `json:"types,omitempty"`

	// HTTP delivers each event to an HTTP endpoint.
	// +optional
	HTTP *HTTPSink `json:"http,omitempty"`

	// NATS keeps the events in a durable JetStream consumer for the
	// subscriber to pull.
	// +optional
	NATS *NATSSink `json:"nats,omitempty"`
}

// SourceSelector selects sources. Each list, when set, must contain the
// source's value; the label selector, when set, must match the labels the
// source had when its reconcile started (carried in the event).
type SourceSelector struct {
	// Kinds of the sources: GitRepository, HelmRepository, HelmChart,
	// Bucket, OCIRepository.
	// +optional
	// +kubebuilder:validation:items:Enum=GitRepository;HelmRepository;HelmChart;Bucket;OCIRepository
	Kinds []string `json:"kinds,omitempty"`

	// Namespaces of the sources.
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`

	// Names of the sources.
	// +optional
	Names []string `json:"names,omitempty"`

	// LabelSelector matches the sources' labels.
	// +optional
	LabelSelector *metav1.LabelSelector `json:"labelSelector,omitempty"`
}

// HTTPSink is an endpoint that receives events in the CloudEvents HTTP
// binding (binary content mode), retried with backoff.
type HTTPSink struct {
	// URL receives a POST per event.
	// +kubebuilder:validation:Pattern="^https?://"
	URL string `json:"url"`

	// SecretRef names a Secret in the Subscription's namespace whose
	// hmacKey signs each request: the X-Headwater-Signature header (and
	// X-Signature, for Flux's generic-hmac Receiver) is sha256=<hex
	// HMAC-SHA256 of the body>; X-Headwater-Signature-V2 also covers the
	// ce-id, ce-type and ce-time headers and a timestamp (docs/events.md).
	// +optional
	SecretRef *meta.LocalObjectReference `json:"secretRef,omitempty"`

	// MaxAttempts bounds the deliveries of one event; after the last
	// failed one the event is a dead letter. Retries back off 1 s, 2 s,
	// 4 s, ... up to 2 minutes.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	MaxAttempts int `json:"maxAttempts,omitempty"`

	// Timeout bounds one delivery.
	// +optional
	// +kubebuilder:default="10s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern="^([0-9]+(\\.[0-9]+)?(ms|s|m))+$"
	Timeout *metav1.Duration `json:"timeout,omitempty"`
}

// NATSSink keeps a Subscription's events for a subscriber to pull.
type NATSSink struct {
	// Consumer is the name of the durable consumer on the
	// HEADWATER_SUBSCRIPTIONS stream that holds the events; the NATS
	// identity `subscriber` may pull from it.
	// +kubebuilder:validation:Pattern="^[A-Za-z0-9_-]{1,64}$"
	Consumer string `json:"consumer"`
}

// SubscriptionStatus is how delivery goes, written by the watcher from the
// dispatcher's reports.
type SubscriptionStatus struct {
	// ObservedGeneration is the generation the dispatcher last reported
	// on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready.
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Delivered counts events the sink accepted.
	// +optional
	Delivered int64 `json:"delivered,omitempty"`

	// FailedAttempts counts failed deliveries, retried ones included.
	// +optional
	FailedAttempts int64 `json:"failedAttempts,omitempty"`

	// DeadLetters counts events given up after the last attempt.
	// +optional
	DeadLetters int64 `json:"deadLetters,omitempty"`

	// LastDeliveredTime is when the sink last accepted an event.
	// +optional
	LastDeliveredTime *metav1.Time `json:"lastDeliveredTime,omitempty"`

	// LastDeadLetter is the last event given up.
	// +optional
	LastDeadLetter *DeadLetter `json:"lastDeadLetter,omitempty"`
}

// DeadLetter is an event the sink never accepted.
type DeadLetter struct {
	// EventID is the CloudEvent id.
	EventID string `json:"eventID"`
	// EventType is the CloudEvent type.
	EventType string `json:"eventType"`
	// Subject is the CloudEvent subject: <kind>/<namespace>/<name>.
	Subject string `json:"subject"`
	// Time is when the last attempt failed.
	Time metav1.Time `json:"time"`
	// Attempts is how many deliveries were tried.
	Attempts int64 `json:"attempts"`
	// Error is why the last attempt failed.
	Error string `json:"error"`
}

// GetConditions returns the status conditions.
func (in *Subscription) GetConditions() []metav1.Condition { return in.Status.Conditions }

// SetConditions sets the status conditions.
func (in *Subscription) SetConditions(c []metav1.Condition) { in.Status.Conditions = c }

// Subscription declares that a subscriber wants some of Headwater's public
// CloudEvents delivered to an HTTP endpoint or kept in a NATS consumer.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=hwsub
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].status"
// +kubebuilder:printcolumn:name="Delivered",type="integer",JSONPath=".status.delivered"
// +kubebuilder:printcolumn:name="Dead letters",type="integer",JSONPath=".status.deadLetters"
// +kubebuilder:printcolumn:name="Status",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].message"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type Subscription struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SubscriptionSpec   `json:"spec,omitempty"`
	Status SubscriptionStatus `json:"status,omitempty"`
}

// SubscriptionList is a list of Subscriptions.
//
// +kubebuilder:object:root=true
type SubscriptionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Subscription `json:"items"`
}
