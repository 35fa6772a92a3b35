package events

import (
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Stream names.
const (
	// FetchStream holds fetch jobs until a fetcher has done them.
	FetchStream = "HEADWATER_FETCH"
	// PackageStream holds packaging and deletion jobs.
	PackageStream = "HEADWATER_PACKAGE"
	// PublishStream holds results waiting to be announced.
	PublishStream = "HEADWATER_PUBLISH"
	// EventStream keeps the recent public events of every source.
	EventStream = "HEADWATER_EVENTS"
	// HookStream holds the webhooks receivers accepted until the watcher
	// has turned them into fetch jobs.
	HookStream = "HEADWATER_HOOKS"
	// DeliveryStream holds the dispatcher's delivery reports until the
	// watcher has written them into the Subscriptions' status.
	DeliveryStream = "HEADWATER_DELIVERY"
	// SubscriptionStream keeps the events the dispatcher selected for
	// each `nats` Subscription, for its durable consumer.
	SubscriptionStream = "HEADWATER_SUBSCRIPTIONS"
)

// Durable consumer names, one per service; replicas of a service share it,
// so each job goes to exactly one replica.
const (
	FetcherConsumer        = "fetcher"
	PackagerConsumer       = "packager"
	ArtifactServerConsumer = "artifact-server"
	WatcherConsumer        = "watcher"
)

// WatcherShardConsumer is the durable consumer on EventStream of the
// watcher shard named shard (the watcher's shard ID, docs/sharding.md):
// WatcherConsumer for the unsharded watcher, "watcher-<shard>" for a
// shard. Every shard receives every public event and applies the outcomes
// of the sources it owns, so that a source whose shard label moves is
// taken over with the outcome of a job its former shard issued.
func WatcherShardConsumer(shard string) string {
	if shard == "" {
		return WatcherConsumer
	}
	return WatcherConsumer + "-" + token(shard)
}

// SubscriptionConsumer is the durable consumer on EventStream that the
// dispatcher replicas share for one Subscription, named by its UID: each
// Subscription has its own, so a slow or dead sink only holds up its own.
func SubscriptionConsumer(uid string) string { return "subscription-" + token(uid) }

// DuplicateWindow is how long JetStream remembers message IDs: a job
// published twice within it is stored once.
const DuplicateWindow = 10 * time.Minute

// Streams returns the configuration of every stream Headwater uses, each
// kept in replicas copies: 1 on a single NATS server, 3 on a clustered one
// so that a stream survives the loss of a server (values below 1 mean 1).
// Job streams are work queues (a message is removed once acknowledged);
// the event stream keeps the last events of each source for a day so a
// subscriber that was away can catch up.
func Streams(replicas int) []jetstream.StreamConfig {
	replicas = max(replicas, 1)
	job := func(name, prefix, description string) jetstream.StreamConfig {
		return jetstream.StreamConfig{
			Replicas:    replicas,
			Name:        name,
			Description: description,
			Subjects:    []string{prefix + ".>"},
			Retention:   jetstream.WorkQueuePolicy,
			Storage:     jetstream.FileStorage,
			Duplicates:  DuplicateWindow,
			MaxAge:      24 * time.Hour,
			Discard:     jetstream.DiscardOld,
		}
	}
	return []jetstream.StreamConfig{
		job(FetchStream, FetchSubjectPrefix, "Headwater fetch jobs: one per source reconcile"),
		job(PackageStream, PackageSubjectPrefix, "Headwater packaging and deletion jobs"),
		job(PublishStream, PublishSubjectPrefix, "Headwater job results waiting to be announced"),
		job(HookStream, HookSubjectPrefix, "Headwater webhooks accepted by a receiver, waiting for the watcher"),
		job(DeliveryStream, DeliverySubjectPrefix, "Headwater delivery reports for the Subscriptions' status"),
		{
			Name:              EventStream,
			Description:       "Headwater public CloudEvents, per source",
			Subjects:          []string{EventSubjectPrefix + ".>"},
			Retention:         jetstream.LimitsPolicy,
			Storage:           jetstream.FileStorage,
			Duplicates:        DuplicateWindow,
			MaxAge:            24 * time.Hour,
			MaxMsgsPerSubject: 16,
			Discard:           jetstream.DiscardOld,
			Replicas:          replicas,
		},
		{
			Name:        SubscriptionStream,
			Description: "Headwater public CloudEvents selected for each nats Subscription",
			Subjects:    []string{SubscriptionSubjectPrefix + ".>"},
			Retention:   jetstream.LimitsPolicy,
			Storage:     jetstream.FileStorage,
			Duplicates:  DuplicateWindow,
			MaxAge:      24 * time.Hour,
			Discard:     jetstream.DiscardOld,
			Replicas:    replicas,
		},
	}
}

// DefaultMaxDeliver is how often a job is attempted when a service does not
// say: with bus.Backoff, about 15 s of retries before the failure is final
// and the next interval makes a new job.
const DefaultMaxDeliver = 5

// ConsumerOptions size a service's consumer.
type ConsumerOptions struct {
	// MaxAckPending bounds the jobs in flight across all replicas.
	MaxAckPending int
	// AckWait is how long a job may go without an ack or an InProgress
	// signal before it is redelivered to another replica.
	AckWait time.Duration
	// MaxDeliver bounds how often one job is attempted; the worker
	// terminates the last attempt (see bus.Worker). Zero means
	// DefaultMaxDeliver, -1 no bound.
	MaxDeliver int
	// DeliverNew starts a newly created consumer at the next message rather
	// than the first one kept in the stream (for the limits-retention event
	// stream, where old messages stay after they are acknowledged).
	DeliverNew bool
	// FilterSubjects, when set, are the only subjects the consumer takes.
	// A work queue gives each subject to one consumer at most, so the
	// built-in fetchers take their kinds' fetch subjects
	// (BuiltinFetchSubjects) and each plug-in fetcher its own kind's
	// (PluginConsumer).
	FilterSubjects []string
}

// Consumer returns the durable consumer configuration of a service on its
// stream. Workers send InProgress while they work, so AckWait only needs to
// cover a stalled or crashed worker.
func Consumer(stream, name string, o ConsumerOptions) jetstream.ConsumerConfig {
	if o.MaxAckPending <= 0 {
		o.MaxAckPending = 1024
	}
	if o.AckWait <= 0 {
		o.AckWait = 30 * time.Second
	}
	if o.MaxDeliver == 0 {
		o.MaxDeliver = DefaultMaxDeliver
	}
	deliver := jetstream.DeliverAllPolicy
	if o.DeliverNew {
		deliver = jetstream.DeliverNewPolicy
	}
	// One filter is sent as FilterSubject: the client then creates the
	// consumer on $JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>, and
	// NATS refuses a request whose configuration filters otherwise, so a
	// permission naming that subject ties the consumer to its filter
	// (Permissions, a plug-in fetcher's).
	var filter string
	filters := o.FilterSubjects
	if len(filters) == 1 {
		filter, filters = filters[0], nil
	}
	return jetstream.ConsumerConfig{
		Durable:        name,
		Description:    "Headwater " + name + " on " + stream,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        o.AckWait,
		MaxDeliver:     o.MaxDeliver,
		MaxAckPending:  o.MaxAckPending,
		DeliverPolicy:  deliver,
		MemoryStorage:  IsWorkQueue(stream),
		FilterSubject:  filter,
		FilterSubjects: filters,
	}
}

// BuiltinKinds are the kinds the built-in fetcher fetches, as they appear
// in Job.Object.Kind.
var BuiltinKinds = []string{"GitRepository", "Bucket", "OCIRepository", "HelmRepository", "HelmChart"}

// BuiltinFetchSubjects are the fetch subjects of BuiltinKinds: the filter
// of the built-in fetchers' consumer, which leaves the jobs of plug-in
// kinds to their own fetchers.
func BuiltinFetchSubjects() []string {
	subjects := make([]string, len(BuiltinKinds))
	for i, k := range BuiltinKinds {
		subjects[i] = FetchSubject(k)
	}
	return subjects
}

// PluginConsumer is the durable consumer on FetchStream that the replicas
// of a plug-in kind's fetcher share, filtered to FetchSubject(kind):
// "plugin-<kind>" (kind in lower case).
func PluginConsumer(kind string) string { return pluginPrefix + token(kind) }

// FetchConsumer is the durable consumer on FetchStream that takes the
// fetch jobs of kind (as in Job.Object.Kind): FetcherConsumer for
// BuiltinKinds, PluginConsumer(kind) for a plug-in kind. The watcher reads
// its backlog to hold jobs back fairly (docs/design.md, "Fair share
// between namespaces").
func FetchConsumer(kind string) string {
	if slices.Contains(BuiltinKinds, kind) {
		return FetcherConsumer
	}
	return PluginConsumer(kind)
}

// IsWorkQueue reports whether stream is one of the work-queue streams of
// Streams, where a message is removed once acknowledged.
//
// Their consumers keep their state (delivered and acknowledged sequences)
// in memory, not on disk: the stream itself, on disk, holds every message
// not yet acknowledged, so a consumer that lost its state with a NATS
// server restart delivers exactly those again, which is what its state
// would have said. Writing that state to disk, up to ten times a second
// per consumer (a temporary file and a rename each time), was a fifth of
// NATS's CPU under load. A consumer lost that way is created again by its
// service (bus.Worker.Rejoin).
func IsWorkQueue(stream string) bool {
	for _, cfg := range Streams(1) {
		if cfg.Name == stream {
			return cfg.Retention == jetstream.WorkQueuePolicy
		}
	}
	return false
}
