// Package v1alpha1 is the events.headwater.dev/v1alpha1 API: the
// Subscription, with which a subscriber declares which public CloudEvents
// of which sources it wants, and where Headwater delivers them (an HTTP
// endpoint in the CloudEvents HTTP binding, or a durable NATS consumer).
// The dispatcher delivers; the watcher writes the status.
//
// +kubebuilder:object:generate=true
// +groupName=events.headwater.dev
package v1alpha1
