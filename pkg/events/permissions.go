package events

import (
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Identities on the bus: every service connects as its own NATS user, and
// NATS allows each exactly the subjects Permissions lists, so no one else
// can publish a job, a result or a public event.
const (
	// WatcherIdentity publishes fetch, deletion and ArtifactGenerator
	// (generate) jobs and reads the public events.
	WatcherIdentity = "watcher"
	// FetcherIdentity takes fetch jobs and publishes package jobs and
	// fetch results.
	FetcherIdentity = "fetcher"
	// PackagerIdentity takes package jobs and publishes their results.
	PackagerIdentity = "packager"
	// ArtifactServerIdentity takes results and publishes the public
	// events.
	ArtifactServerIdentity = "artifact-server"
	// DispatcherIdentity delivers the public events to Subscriptions:
	// it reads them through one consumer per Subscription, republishes
	// those of `nats` Subscriptions and reports deliveries to the watcher.
	DispatcherIdentity = "dispatcher"
	// ReceiverIdentity is the internet-facing webhook receiver: it may
	// publish the hooks it accepted, and nothing else.
	ReceiverIdentity = "receiver"
	// SubscriberIdentity may only read the public events, and pull from
	// the durable consumers of `nats` Subscriptions.
	SubscriberIdentity = "subscriber"
)

// pluginPrefix begins the identity and the consumer of a plug-in kind's
// fetcher (PluginIdentity, PluginConsumer).
const pluginPrefix = "plugin-"

// PluginIdentity is the bus identity of a plug-in kind's fetcher:
// "plugin-<kind>" (kind in lower case, e.g. "plugin-httpsource"). It takes
// that kind's fetch jobs only, through PluginConsumer(kind), and publishes
// only on that kind's package and publish subjects, so a plug-in can
// neither read another kind's jobs nor answer for them. Identities lists
// the built-in identities only; a plug-in's is made where the kind is
// registered (headwater-nats -plugin-kinds, setup -plugin-kinds).
func PluginIdentity(kind string) string { return pluginPrefix + token(kind) }

// PluginKindOf returns the kind (in lower case) whose fetcher identity is
// identity, and whether identity is a plug-in's at all.
func PluginKindOf(identity string) (string, bool) {
	kind, ok := strings.CutPrefix(identity, pluginPrefix)
	return kind, ok && kind != "" && token(kind) == kind
}

// Identities lists every identity, services first.
func Identities() []string {
	return []string{WatcherIdentity, FetcherIdentity, PackagerIdentity, ArtifactServerIdentity, ReceiverIdentity, DispatcherIdentity, SubscriberIdentity}
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
	// stream and consumer it consumes, if any.
	stream, consumer string
	// readsStream lets it read messages of its stream by sequence (the
	// packager's janitors list the jobs still waiting).
	readsStream bool
	// also are further streams and consumers it consumes; a consumer "*"
	// is any consumer of that stream.
	also []streamConsumer
	// optional are streams and consumers it consumes only where the
	// component that feeds them is deployed (the watcher's hooks and
	// delivery reports): it creates such a stream when it joins it, not
	// at start-up (StreamsOf).
	optional []streamConsumer
	// awaits are optional streams whose creation it listens for
	// (StreamCreatedAdvisory): it joins them once their component has
	// created them.
	awaits []string
	// owns is a stream it owns without consuming it.
	owns string
	// manages are streams on which it creates, updates and deletes any
	// consumer (the dispatcher's consumers for `nats` Subscriptions).
	manages []string
	// buckets are the key-value buckets (Buckets) it alone creates,
	// reads, writes and watches (the fetchers' FlightBucket, the
	// watcher's OrderBucket).
	buckets []string
	// subscribes are the core NATS subjects it subscribes to, besides
	// its inbox (the watcher's artifact address announcements).
	subscribes []string
	// announces are the core NATS subjects it publishes on, whole (the
	// artifact-server's address announcement).
	announces []string
	// feeds are subjects it publishes on, whole, into streams it creates
	// when missing (a plug-in fetcher's one kind's package and publish
	// subjects).
	feeds []string
	// filter are the subjects its consumer takes; empty for all.
	filter []string
}

// streamConsumer is a durable consumer on a stream.
type streamConsumer struct{ stream, consumer string }

func roleOf(identity string) (role, bool) {
	switch identity {
	case WatcherIdentity:
		// Deletion and ArtifactGenerator jobs go to the packagers.
		return role{publishes: []string{FetchSubjectPrefix, PackageSubjectPrefix}, stream: EventStream, consumer: WatcherConsumer,
			// It also writes the Subscriptions' status from the delivery
			// reports, once a dispatcher has made their stream, and, with
			// -receivers, turns the hooks receivers accepted into fetch
			// jobs (see docs/design.md, "The idle baseline").
			optional: []streamConsumer{{DeliveryStream, WatcherConsumer}, {HookStream, WatcherConsumer}},
			// A watcher shard has a consumer of its own on the event
			// stream (WatcherShardConsumer); NATS matches whole
			// tokens only, so "watcher-*" cannot be written: any
			// consumer of that stream (docs/design.md, "Watcher
			// shards").
			also:   []streamConsumer{{EventStream, "*"}},
			awaits: []string{DeliveryStream},
			// It keeps the order of the outcomes it wrote, so that a
			// new leader writes no older job's.
			buckets: []string{OrderBucket},
			// It learns where artifacts are served when an
			// artifact-server starts.
			subscribes: []string{ArtifactAddressSubject}}, true
	case FetcherIdentity:
		// Its replicas combine fetches of the same content in a bucket,
		// and share the holds and limits of upstream hosts in another.
		return role{publishes: []string{PackageSubjectPrefix, PublishSubjectPrefix}, stream: FetchStream, consumer: FetcherConsumer,
			buckets: []string{FlightBucket, HostBucket}}, true
	case PackagerIdentity:
		return role{publishes: []string{PublishSubjectPrefix}, stream: PackageStream, consumer: PackagerConsumer, readsStream: true}, true
	case ArtifactServerIdentity:
		return role{publishes: []string{EventSubjectPrefix}, stream: PublishStream, consumer: ArtifactServerConsumer,
			announces: []string{ArtifactAddressSubject}}, true
	case ReceiverIdentity:
		// Internet-facing: it consumes nothing and publishes only hooks.
		return role{publishes: []string{HookSubjectPrefix}}, true
	case DispatcherIdentity:
		// One consumer per Subscription on the event stream, named by
		// its UID: NATS permissions cannot match a prefix of a token, so
		// the dispatcher may use any consumer name there (see
		// docs/design.md, "Subscriptions").
		return role{publishes: []string{DeliverySubjectPrefix, SubscriptionSubjectPrefix},
			also: []streamConsumer{{EventStream, "*"}}, owns: SubscriptionStream,
			manages: []string{EventStream, SubscriptionStream}}, true
	case SubscriberIdentity:
		return role{}, true
	}
	if kind, ok := PluginKindOf(identity); ok {
		// A plug-in kind's fetcher: its kind's jobs, its kind's results.
		return role{stream: FetchStream, consumer: PluginConsumer(kind), filter: []string{FetchSubject(kind)},
			feeds: []string{PackageSubject(kind), PublishSubject(kind)}}, true
	}
	return role{}, false
}

// ConsumerFilter returns the subjects the consumer of identity takes on
// stream: on FetchStream, a plug-in fetcher's kind and the built-in
// fetchers' kinds (BuiltinFetchSubjects); nil (all) elsewhere.
func ConsumerFilter(identity, stream string) []string {
	if stream != FetchStream {
		return nil
	}
	if identity == FetcherIdentity {
		return BuiltinFetchSubjects()
	}
	r, _ := roleOf(identity)
	return r.filter
}

// StreamOwner returns the identity that owns a stream: the service that
// consumes it, which alone may update its configuration. Every service
// that publishes to or consumes a stream may create it (CreateStream
// fails, changing nothing, when a stream exists with another
// configuration), so services start in any order.
func StreamOwner(stream string) string {
	for _, id := range Identities() {
		r, _ := roleOf(id)
		if r.stream == stream || r.owns == stream {
			return id
		}
	}
	for _, id := range Identities() {
		r, _ := roleOf(id)
		for _, c := range slices.Concat(r.also, r.optional) {
			if c.stream == stream && c.consumer != "*" {
				return id
			}
		}
	}
	return ""
}

// StreamsOf returns the names of the streams an identity creates at
// start-up: those it publishes to and those it consumes, so that a stream
// exists only where a component that uses it is deployed. The streams it
// consumes only where their component is deployed (the watcher's hooks
// and delivery reports) are left out: it creates them when it joins them.
// An identity that is no service's (a test, a tool) gets every stream.
func StreamsOf(identity string) []string {
	r, ok := roleOf(identity)
	var names []string
	for _, cfg := range Streams(1) {
		if !ok || r.uses(cfg) {
			names = append(names, cfg.Name)
		}
	}
	return names
}

// uses tells whether the role publishes to or consumes cfg's stream, the
// optional streams left out.
func (r role) uses(cfg jetstream.StreamConfig) bool {
	if r.stream == cfg.Name || r.owns == cfg.Name || slices.Contains(r.manages, cfg.Name) {
		return true
	}
	for _, c := range r.also {
		if c.stream == cfg.Name {
			return true
		}
	}
	for _, prefix := range r.publishes {
		if slices.Contains(cfg.Subjects, prefix+".>") {
			return true
		}
	}
	for _, subject := range r.feeds {
		for _, s := range cfg.Subjects {
			if p, ok := strings.CutSuffix(s, ">"); ok && strings.HasPrefix(subject, p) {
				return true
			}
		}
	}
	return false
}

// StreamCreatedAdvisory is the subject on which JetStream announces that a
// stream was created: an identity that awaits an optional stream (the
// watcher, the dispatcher's delivery reports) listens on it.
func StreamCreatedAdvisory(stream string) string {
	return "$JS.EVENT.ADVISORY.STREAM.CREATED." + stream
}

// Permissions returns what NATS allows an identity: publishing on its
// subjects, the JetStream API calls its start-up and its worker make
// (info and creation of the streams it uses, its optional ones included,
// and of no other; updating the stream it owns; creating and pulling from
// its own durable consumer, acknowledging its messages), the key-value
// buckets it owns, its own inbox, and the creation advisories of the
// optional streams it awaits. ok is false for an unknown identity.
func Permissions(identity string) (p Permission, ok bool) {
	r, ok := roleOf(identity)
	if !ok {
		return Permission{}, false
	}
	api := "$JS.API.CONSUMER."
	if identity == SubscriberIdentity {
		// It pulls from the consumers the dispatcher made for `nats`
		// Subscriptions; no Headwater service consumes that stream.
		p.Publish = []string{
			"$JS.API.INFO",
			"$JS.API.STREAM.INFO." + SubscriptionStream,
			api + "INFO." + SubscriptionStream + ".*",
			api + "MSG.NEXT." + SubscriptionStream + ".*",
			"$JS.ACK." + SubscriptionStream + ".>",
		}
		p.Subscribe = []string{EventSubjectPrefix + ".>", InboxPrefix(identity) + ".>"}
		slices.Sort(p.Publish)
		return p, true
	}
	for _, prefix := range r.publishes {
		p.Publish = append(p.Publish, prefix+".>")
	}
	p.Publish = append(p.Publish, r.announces...)
	p.Publish = append(p.Publish, r.feeds...)
	p.Publish = append(p.Publish, "$JS.API.INFO")
	streams := StreamsOf(identity)
	for _, c := range r.optional {
		streams = append(streams, c.stream)
	}
	for _, s := range streams {
		p.Publish = append(p.Publish, "$JS.API.STREAM.INFO."+s, "$JS.API.STREAM.CREATE."+s)
		if StreamOwner(s) == identity {
			p.Publish = append(p.Publish, "$JS.API.STREAM.UPDATE."+s)
		}
	}
	consumers := slices.Concat(r.also, r.optional)
	if r.stream != "" {
		consumers = append([]streamConsumer{{r.stream, r.consumer}}, consumers...)
	}
	for _, c := range consumers {
		if c == (streamConsumer{r.stream, r.consumer}) && len(r.filter) == 1 {
			// A consumer with one filter is created only on the subject
			// that names it, which NATS checks against the request's
			// configuration: a plug-in fetcher cannot point its consumer
			// at another kind's jobs (the legacy DURABLE.CREATE and the
			// unfiltered CREATE, which carry any filter, are not given).
			p.Publish = append(p.Publish, api+"CREATE."+c.stream+"."+c.consumer+"."+r.filter[0])
		} else {
			p.Publish = append(p.Publish,
				api+"CREATE."+c.stream+"."+c.consumer,
				api+"CREATE."+c.stream+"."+c.consumer+".>",
				api+"DURABLE.CREATE."+c.stream+"."+c.consumer)
		}
		p.Publish = append(p.Publish,
			api+"INFO."+c.stream+"."+c.consumer,
			api+"MSG.NEXT."+c.stream+"."+c.consumer,
			"$JS.ACK."+c.stream+"."+c.consumer+".>",
		)
		if IsWorkQueue(c.stream) {
			// A work queue's consumer whose state a former release kept
			// on disk is replaced (bus.Conn.EnsureConsumer): the
			// messages stay in the stream.
			p.Publish = append(p.Publish, api+"DELETE."+c.stream+"."+c.consumer)
		}
	}
	for _, s := range r.manages {
		p.Publish = append(p.Publish,
			api+"CREATE."+s+".*", api+"CREATE."+s+".*.>", api+"DURABLE.CREATE."+s+".*",
			api+"INFO."+s+".*", api+"DELETE."+s+".*")
	}
	if r.readsStream {
		p.Publish = append(p.Publish, "$JS.API.STREAM.MSG.GET."+r.stream)
	}
	if identity == WatcherIdentity {
		// It looks up whether a plug-in kind's fetcher has joined (its
		// consumer exists) before making the kind's jobs.
		p.Publish = append(p.Publish, api+"INFO."+FetchStream+".*")
	}
	for _, b := range r.buckets {
		p.Publish = append(p.Publish, bucketPermissions(b)...)
	}
	p.Subscribe = append([]string{InboxPrefix(identity) + ".>"}, r.subscribes...)
	for _, s := range r.awaits {
		p.Subscribe = append(p.Subscribe, StreamCreatedAdvisory(s))
	}
	slices.Sort(p.Publish)
	p.Publish = slices.Compact(p.Publish)
	return p, true
}

// bucketPermissions are the subjects of a key-value bucket's owner: its
// stream's creation, update and reads (direct or not), writing its keys,
// and the ordered consumers of a watch (created with any name, deleted
// when reset, answering flow control).
func bucketPermissions(bucket string) []string {
	stream := BucketStream(bucket)
	api := "$JS.API."
	return []string{
		api + "STREAM.INFO." + stream,
		api + "STREAM.CREATE." + stream,
		api + "STREAM.UPDATE." + stream,
		api + "STREAM.MSG.GET." + stream,
		api + "DIRECT.GET." + stream,
		api + "DIRECT.GET." + stream + ".>",
		"$KV." + bucket + ".>",
		api + "CONSUMER.CREATE." + stream,
		api + "CONSUMER.CREATE." + stream + ".>",
		api + "CONSUMER.INFO." + stream + ".*",
		api + "CONSUMER.DELETE." + stream + ".*",
		"$JS.FC." + stream + ".>",
	}
}
