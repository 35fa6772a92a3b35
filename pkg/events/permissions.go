package events

import "slices"

// Identities on the bus: every service connects as its own NATS user, and
// NATS allows each exactly the subjects Permissions lists, so no one else
// can publish a job, a result or a public event.
const (
	// WatcherIdentity publishes fetch and deletion jobs and reads the
	// public events.
	WatcherIdentity = "watcher"
	// FetcherIdentity takes fetch jobs and publishes package jobs and
	// fetch results.
	FetcherIdentity = "fetcher"
	// PackagerIdentity takes package jobs and publishes their results.
	PackagerIdentity = "packager"
	// ArtifactServerIdentity takes results and publishes the public
	// events.
	ArtifactServerIdentity = "artifact-server"
	// SubscriberIdentity may only read the public events.
	SubscriberIdentity = "subscriber"
	// ReceiverIdentity is the internet-facing webhook receiver: it may
	// only publish the hooks it accepted.
	ReceiverIdentity = "receiver"
)

// Identities lists every identity, services first.
func Identities() []string {
	return []string{WatcherIdentity, FetcherIdentity, PackagerIdentity, ArtifactServerIdentity, ReceiverIdentity, SubscriberIdentity}
}

// InboxPrefix is the prefix of the reply subjects an identity's
// connection uses (nats.CustomInboxPrefix): each identity may only
// subscribe to its own replies, never to another's.
func InboxPrefix(identity string) string { return "_INBOX_" + token(identity) }

// Permission lists the subjects an identity may publish and subscribe to.
type Permission struct {
	Publish   []string
	Subscribe []string
}

// role is what an identity does on the bus.
type role struct {
	// publishes are the subject prefixes it publishes jobs or events on.
	publishes []string
	// streams it consumes, if any, each with the durable consumer named
	// consumer.
	streams  []string
	consumer string
	// readsStream lets it read messages of its stream by sequence (the
	// packager's janitors list the jobs still waiting).
	readsStream bool
}

func roleOf(identity string) (role, bool) {
	switch identity {
	case WatcherIdentity:
		// Deletion jobs go to the packagers.
		// It also turns the hooks receivers accepted into fetch jobs.
		return role{publishes: []string{FetchSubjectPrefix, PackageSubjectPrefix}, streams: []string{EventStream, HookStream}, consumer: WatcherConsumer}, true
	case FetcherIdentity:
		return role{publishes: []string{PackageSubjectPrefix, PublishSubjectPrefix}, streams: []string{FetchStream}, consumer: FetcherConsumer}, true
	case PackagerIdentity:
		return role{publishes: []string{PublishSubjectPrefix}, streams: []string{PackageStream}, consumer: PackagerConsumer, readsStream: true}, true
	case ArtifactServerIdentity:
		return role{publishes: []string{EventSubjectPrefix}, streams: []string{PublishStream}, consumer: ArtifactServerConsumer}, true
	case ReceiverIdentity:
		// Internet-facing: it consumes nothing and publishes only hooks.
		return role{publishes: []string{HookSubjectPrefix}}, true
	case SubscriberIdentity:
		return role{}, true
	}
	return role{}, false
}

// StreamOwner returns the identity that owns a stream: the service that
// consumes it, which alone may update its configuration. Every service may
// create the streams (CreateStream fails, changing nothing, when a stream
// exists with another configuration), so services start in any order.
func StreamOwner(stream string) string {
	for _, id := range Identities() {
		if r, _ := roleOf(id); slices.Contains(r.streams, stream) {
			return id
		}
	}
	return ""
}

// Permissions returns what NATS allows an identity: publishing on its
// subjects, the JetStream API calls its start-up and its worker make
// (stream info and creation, updating the stream it owns, creating and
// pulling from its own durable consumer, acknowledging its messages), and
// its own inbox. ok is false for an unknown identity.
func Permissions(identity string) (p Permission, ok bool) {
	r, ok := roleOf(identity)
	if !ok {
		return Permission{}, false
	}
	if identity == SubscriberIdentity {
		return Permission{Subscribe: []string{EventSubjectPrefix + ".>"}}, true
	}
	for _, prefix := range r.publishes {
		p.Publish = append(p.Publish, prefix+".>")
	}
	p.Publish = append(p.Publish, "$JS.API.INFO")
	for _, s := range Streams(1) {
		p.Publish = append(p.Publish, "$JS.API.STREAM.INFO."+s.Name, "$JS.API.STREAM.CREATE."+s.Name)
	}
	api := "$JS.API.CONSUMER."
	for _, stream := range r.streams {
		p.Publish = append(p.Publish,
			"$JS.API.STREAM.UPDATE."+stream,
			api+"CREATE."+stream+"."+r.consumer,
			api+"CREATE."+stream+"."+r.consumer+".>",
			api+"DURABLE.CREATE."+stream+"."+r.consumer,
			api+"INFO."+stream+"."+r.consumer,
			api+"MSG.NEXT."+stream+"."+r.consumer,
			"$JS.ACK."+stream+"."+r.consumer+".>",
		)
		if r.readsStream {
			p.Publish = append(p.Publish, "$JS.API.STREAM.MSG.GET."+stream)
		}
	}
	p.Subscribe = []string{InboxPrefix(identity) + ".>"}
	slices.Sort(p.Publish)
	return p, true
}
