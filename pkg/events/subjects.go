package events

import (
	"fmt"
	"strings"
)

// Subject prefixes. Kinds appear in subjects in lower case ("gitrepository").
const (
	// FetchSubjectPrefix is the prefix of the fetch job subjects.
	FetchSubjectPrefix = "headwater.jobs.fetch"
	// PackageSubjectPrefix is the prefix of the package job subjects.
	PackageSubjectPrefix = "headwater.jobs.package"
	// PublishSubjectPrefix is the prefix of the results the artifact-server
	// turns into public events.
	PublishSubjectPrefix = "headwater.jobs.publish"
	// EventSubjectPrefix is the prefix of the public event subjects.
	EventSubjectPrefix = "headwater.events"
	// HookSubjectPrefix is the prefix of the webhook subjects.
	HookSubjectPrefix = "headwater.hooks"
	// DeliverySubjectPrefix is the prefix of the dispatcher's delivery
	// reports to the watcher.
	DeliverySubjectPrefix = "headwater.delivery"
	// SubscriptionSubjectPrefix is the prefix of the subjects the
	// dispatcher republishes a `nats` Subscription's events on.
	SubscriptionSubjectPrefix = "headwater.subscriptions"
	// ControlSubjectPrefix is the prefix of the control messages between
	// services: core NATS, stored by no stream.
	ControlSubjectPrefix = "headwater.control"
	// ArtifactAddressSubject is where an artifact-server tells the
	// watchers, when it starts, the address it advertises
	// (TypeArtifactAddress): core NATS, not stored.
	ArtifactAddressSubject = ControlSubjectPrefix + ".artifact-address.announced"
)

// DeliverySubject is where the dispatcher reports on a Subscription:
// headwater.delivery.<namespace>.<name>.
func DeliverySubject(namespace, name string) string {
	return DeliverySubjectPrefix + "." + token(namespace) + "." + token(name)
}

// SubscriptionSubject is where the events a `nats` Subscription selected
// are republished, for its durable consumer:
// headwater.subscriptions.<namespace>.<name>.
func SubscriptionSubject(namespace, name string) string {
	return SubscriptionSubjectPrefix + "." + token(namespace) + "." + token(name)
}

// SourceFilterSubject is the public subject pattern of the events of the
// given kind, namespace and name, an empty value matching any (as "*").
func SourceFilterSubject(kind, namespace, name string) string {
	tok := func(s string) string {
		if s == "" {
			return "*"
		}
		return token(s)
	}
	return EventSubjectPrefix + "." + tok(kind) + "." + tok(namespace) + "." + tok(name)
}

// FetchSubject is where fetch jobs for a kind are published.
func FetchSubject(kind string) string { return FetchSubjectPrefix + "." + token(kind) }

// PackageSubject is where packaging and deletion jobs for a kind are published.
func PackageSubject(kind string) string { return PackageSubjectPrefix + "." + token(kind) }

// PublishSubject is where results for a kind are published.
func PublishSubject(kind string) string { return PublishSubjectPrefix + "." + token(kind) }

// EventSubject is the public subject of one source's events:
// headwater.events.<kind>.<namespace>.<name>. Kubernetes names may contain
// dots, which NATS uses as token separators, so dots in the name are written
// as underscores (which Kubernetes names cannot contain, so the mapping is
// one to one). Subscribe to headwater.events.> for everything, or to
// headwater.events.gitrepository.<namespace>.* for one namespace.
func EventSubject(kind, namespace, name string) string {
	return fmt.Sprintf("%s.%s.%s.%s", EventSubjectPrefix, token(kind), token(namespace), token(name))
}

// HookSubject is where the hooks a Receiver accepted are published:
// headwater.hooks.<namespace>.<name>, spelled as in EventSubject.
func HookSubject(namespace, name string) string {
	return fmt.Sprintf("%s.%s.%s", HookSubjectPrefix, token(namespace), token(name))
}

// token lower-cases s and replaces the characters NATS reserves.
func token(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '.', '*', '>', ' ', '\t', '\r', '\n':
			return '_'
		}
		return r
	}, strings.ToLower(s))
}

// MessageID is the JetStream message ID of a message of the given type made
// for a job; publishing the same job's message twice is deduplicated.
func MessageID(job Job, eventType string) string {
	return job.ID + "/" + eventType
}

// CheckRoute returns an error wrapping ErrMalformed when a job message on
// subject is about another kind than the subject's: a fetch, package or
// publish subject ends with the kind of every job on it, and NATS lets an
// identity publish only its kinds' subjects (a plug-in fetcher its one
// kind's), so a job of another kind on it was forged by whoever may
// publish there. Subjects of other prefixes are not checked.
func CheckRoute(subject string, job Job) error {
	for _, prefix := range []string{FetchSubjectPrefix, PackageSubjectPrefix, PublishSubjectPrefix} {
		kind, ok := strings.CutPrefix(subject, prefix+".")
		if !ok {
			continue
		}
		if kind != token(job.Object.Kind) {
			return fmt.Errorf("%w: a %s job on %s, a subject of kind %q", ErrMalformed, job.Object.Kind, subject, kind)
		}
		return nil
	}
	return nil
}
