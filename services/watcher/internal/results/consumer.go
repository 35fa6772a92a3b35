// Package results applies the artifact-server's public events to the
// sources they are about: it is the only place status changes after a job,
// and the only place the watcher records Kubernetes Events for outcomes.
package results

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	eventv1 "github.com/fluxcd/pkg/apis/event/v1beta1"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/pkg/tracing"
	"github.com/headwater-gitops/headwater/services/watcher/internal/controller"
	"github.com/headwater-gitops/headwater/services/watcher/internal/notify"
	"github.com/headwater-gitops/headwater/services/watcher/internal/patch"
	"github.com/headwater-gitops/headwater/services/watcher/internal/seal"
	"github.com/headwater-gitops/headwater/services/watcher/internal/sourcekind"
	"github.com/headwater-gitops/headwater/services/watcher/internal/status"
)

// Consumer is a manager Runnable that consumes the public event stream. Like
// the reconcilers it runs on the elected leader only.
type Consumer struct {
	// Conn is the bus connection.
	Conn *bus.Conn
	// Jobs publishes clean-up jobs for artifacts of deleted objects.
	Jobs controller.Publisher
	// Seal verifies that an outcome's job is one the watcher issued, and
	// seals the clean-up jobs.
	Seal *seal.Key
	// Client reads objects from the informer cache and patches status; a
	// write based on a stale read conflicts and is retried on a Live read,
	// so an outcome is always applied on top of every earlier write.
	Client client.Client
	// Live reads objects from the API server.
	Live client.Reader
	// Recorder records Kubernetes Events, but for a new artifact's, which
	// the consumer writes itself before acknowledging the outcome. It
	// takes Flux's trace type (eventv1.EventTypeTrace) as a notify.Recorder
	// does.
	Recorder recorder.EventRecorder
	// Notify posts the Events the consumer writes itself to the
	// notification-controller; nil posts none.
	Notify *notify.Forwarder
	// Instance names this watcher replica in the Events it writes
	// (reportingInstance).
	Instance string
	// Concurrency bounds the outcomes applied at once.
	Concurrency int
	// Metrics records handled messages.
	Metrics *telemetry.JobMetrics
	// Forged counts the outcomes refused because the watcher did not issue
	// their job (headwater_forged_outcomes_total); may be nil.
	Forged prometheus.Counter
	// Superseded counts the outcomes not written because a newer job's
	// outcome for the same source was written first
	// (headwater_superseded_outcomes_total); may be nil.
	Superseded prometheus.Counter
	// Steady, when set, learns the artifact-server's advertised address
	// from the artifacts announced (see controller.Steady).
	Steady *controller.Steady
	// Retries, by kind name, schedule the next reconcile of a source whose
	// fetch failed for a reason that passes, and forget its failures when
	// an outcome succeeds (see controller.Retries); nil schedules none.
	Retries map[string]*controller.Retries
	// Kinds are the kinds whose outcomes are applied, the plug-in kinds
	// included (Client and Live must then be a sourcekind.PluginClient and
	// PluginReader); nil means the built-in kinds.
	Kinds sourcekind.Set
	// OnArtifact, when set, is called for a plug-in kind's new artifact
	// once it is in the object's status: the hook of what publishes it
	// further (an ExternalArtifact for Flux's consumers). obj is the
	// object as written (a *sourcekind.PluginObject), art its new
	// status.artifact, URL included. It is called at least once per new
	// artifact (again if the outcome is redelivered, e.g. after this
	// replica died before acknowledging it), on the elected leader, from
	// the consumer's workers: it must be idempotent and should not block
	// for long. An error it returns is logged; the outcome is not retried
	// for it.
	OnArtifact func(ctx context.Context, obj sourcekind.Object, art *meta.Artifact) error
	// Producers, by job kind, apply the outcomes of the objects that are
	// no Flux source kind but produce artifacts (an ArtifactGenerator's
	// jobs): the consumer checks the seal and hands them the outcome.
	Producers map[string]OutcomeHandler
	// Owns, when set, reports whether a source belongs to this watcher's
	// shard (shard.Shard.Owns): every shard receives every outcome and
	// writes those of its own sources alone, checked on the object it
	// writes, so that a source whose shard label moved is written by its
	// new shard only, the outcome of its former shard's job included.
	// Nil owns every source.
	Owns func(client.Object) bool
	// Done, when set, is told the ID of every job whose outcome arrived
	// (its seal checked), whichever shard's: it frees the job's slot
	// (fairshare.Queue.Done).
	Done func(jobID string)
	// Consumer is the durable consumer on the event stream
	// (events.WatcherShardConsumer); empty is events.WatcherConsumer.
	Consumer string
	// Log is the consumer's logger.
	Log logr.Logger

	// OrderStore, when set, keeps the order of each source's outcomes
	// beyond this process (KVOrder on events.OrderBucket), for the next
	// leader or the shard a source moves to; nil keeps it in memory.
	OrderStore OrderStore

	// order writes each source's outcomes in the order of their jobs.
	order order
}

// jobObject is the object a job is about as far as a shard can tell: its
// namespace and its labels when the job was made.
func jobObject(ref events.ObjectRef) client.Object {
	return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name, Labels: ref.Labels}}
}

// owns reports whether obj belongs to the consumer's shard.
func (c *Consumer) owns(obj client.Object) bool { return c.Owns == nil || c.Owns(obj) }

// OutcomeHandler applies the public events of the jobs of one kind of
// producer. Its error makes the consumer try the event again; one that
// wraps events.ErrMalformed terminates it.
type OutcomeHandler interface {
	HandleOutcome(ctx context.Context, eventType string, o *events.Outcome) error
}

var _ manager.Runnable = (*Consumer)(nil)

// outcomeAttempts bounds the attempts to write one outcome into status. An
// outcome is only lost to an API server that stays unreachable for the
// whole backoff (about 25 minutes); the next interval's job then reports
// again.
const outcomeAttempts = 20

// Start consumes until ctx ends.
func (c *Consumer) Start(ctx context.Context) error {
	name := c.Consumer
	if name == "" {
		name = events.WatcherConsumer
	}
	// Every job of this process is requested after it begins to write
	// outcomes (a leader's reconciles and this consumer start once it
	// is elected).
	c.order.store, c.order.since = c.OrderStore, time.Now()
	cons, err := c.Conn.JoinStream(ctx, events.EventStream, name,
		events.ConsumerOptions{MaxAckPending: 4 * max(c.Concurrency, 1), DeliverNew: true, MaxDeliver: outcomeAttempts})
	if err != nil {
		return err
	}
	w := &bus.Worker{
		Service:     "watcher",
		Consumer:    cons,
		Concurrency: c.Concurrency,
		Handler:     c.handle,
		Metrics:     c.Metrics,
		Log:         c.Log,
	}
	return w.Run(ctx)
}

func (c *Consumer) handle(ctx context.Context, msg *events.Message, d bus.Delivery) (err error) {
	o, ok := msg.Data.(*events.Outcome)
	if !ok {
		return fmt.Errorf("%w: unexpected %s on the event stream", events.ErrMalformed, msg.Event.Type())
	}
	kind, ok := c.Kinds.ByName(o.Job.Object.Kind)
	producer := c.Producers[o.Job.Object.Kind]
	if !ok && producer == nil {
		return fmt.Errorf("%w: unknown kind %q", events.ErrMalformed, o.Job.Object.Kind)
	}
	// The outcome's log lines name the object as a reconcile's do.
	log := logr.FromContextOrDiscard(ctx).WithValues(ObjectIdentity(o.Job.Object.Kind, o.Job.Object.Namespace, o.Job.Object.Name)...)
	ctx = logr.NewContext(ctx, log)
	if err := c.Seal.Verify(o.Job); err != nil {
		// Whoever published it may publish outcomes but made up the job:
		// the worker logs and terminates it; nothing is written.
		if c.Forged != nil {
			c.Forged.Inc()
		}
		return fmt.Errorf("%w: refusing the outcome for %s %s/%s: %w", events.ErrMalformed,
			o.Job.Object.Kind, o.Job.Object.Namespace, o.Job.Object.Name, err)
	}
	if c.Done != nil {
		c.Done(o.Job.ID)
	}
	// Whether the object was this shard's when its job was made: every
	// shard receives every outcome, and reads the API server only for
	// its own.
	jobOwned := c.owns(jobObject(o.Job.Object))
	if producer != nil {
		if !jobOwned {
			// A generator that moved here since has made a job of
			// its own.
			return nil
		}
		return producer.HandleOutcome(ctx, msg.Event.Type(), o)
	}
	if msg.Event.Type() == events.TypeArtifactDeleted {
		// The object's artifacts are gone; its status has nothing to say.
		// The shard that deleted it records the Event.
		if o.Job.ID == events.DeletionJobID(o.Job.Object.UID) {
			c.forget(ctx, o)
		}
		if jobOwned {
			c.garbageCollected(o)
		}
		return nil
	}
	if t := msg.Event.Type(); t == events.TypeArtifactStored || t == events.TypeArtifactUnchanged {
		c.Steady.Learn(o.Artifact)
	}
	obj := kind.New()
	key := types.NamespacedName{Namespace: o.Job.Object.Namespace, Name: o.Job.Object.Name}
	err = c.Client.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) && !jobOwned {
		// Another shard's source (or one that moved here and that this
		// shard's cache has not seen yet: its reconcile makes a job of
		// its own).
		log.V(1).Info("ignoring outcome for a source of another shard")
		return nil
	}
	if apierrors.IsNotFound(err) {
		// The cache may not have seen a new object yet: ask the API server.
		err = c.Live.Get(ctx, key, obj)
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			c.forget(ctx, o)
			return c.orphaned(ctx, msg.Event.Type(), o)
		}
		return fmt.Errorf("get %s: %w", key, err)
	}
	if string(obj.GetUID()) != o.Job.Object.UID {
		log.V(1).Info("ignoring outcome for a previous object with the same name")
		return nil
	}
	if !c.owns(obj) {
		log.V(1).Info("ignoring outcome for a source of another shard")
		return nil
	}

	// One outcome of a source at a time, and none of a job older than
	// the newest one written.
	src, err := c.order.lock(ctx, obj.GetUID(), o.Job.RequestedAt)
	if err != nil {
		// The bus that brought the outcome cannot say where the source's
		// order stands: try again.
		return err
	}
	defer c.order.unlock(obj.GetUID(), src)
	if src.superseded(o.Job.RequestedAt) {
		if c.Superseded != nil {
			c.Superseded.Inc()
		}
		log.Info("ignoring the outcome of a job older than one whose outcome is written", "type", msg.Event.Type(),
			"job", o.Job.ID, "requestedAt", o.Job.RequestedAt, "newestRequestedAt", src.newest)
		return nil
	}

	ctx, span := tracing.StartJob(ctx, tracer, "write status", o.Job)
	defer func() { tracing.End(span, err) }()
	var recorded, announced []status.Event
	written := false
	err = status.Patch(ctx, c.Client, c.Live, kind, obj, func(cur sourcekind.Object) bool {
		if string(cur.GetUID()) != o.Job.Object.UID || !c.owns(cur) {
			// Deleted and made again, or moved to another shard
			// since it was read: not this outcome's, or not ours.
			recorded, announced, written = nil, nil, false
			return false
		}
		recorded = status.Apply(kind, cur, msg.Event.Type(), o)
		announced = status.Reannounce(kind, cur, msg.Event.Type(), o)
		written = true
		return true
	})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	if written {
		if err := c.order.written(ctx, obj.GetUID(), src, o.Job.RequestedAt); err != nil {
			// Written, and ordered in this process: only a next leader
			// may write an older job's outcome (it would before the
			// bucket, too).
			log.Error(err, "the outcome is written, but the bucket of the outcome order was not updated")
		}
	}
	// A new artifact's Event is written before the outcome is
	// acknowledged: if this replica dies or the API server refuses it,
	// the outcome comes back, finds its artifact in status already and
	// records the Event again (at least once; a redelivery of an outcome
	// that deserved none, its digest being the stored one, records one
	// too). The other Events go through the recorder, which aggregates
	// repeats.
	var durable []status.Event
	for _, e := range recorded {
		if slices.Contains(announced, e) {
			durable = append(durable, e)
			continue
		}
		c.Recorder.AnnotatedEventf(obj, nil, metadata(e), e.Type, e.Reason, "Reconcile", "%s", e.Message)
	}
	if len(durable) == 0 && d.Attempt > 1 {
		durable = announced
	}
	if err := c.record(ctx, obj, durable); err != nil {
		return err
	}
	logOutcome(log, kind, msg.Event.Type(), o)
	c.retry(ctx, log, key, obj, msg.Event.Type(), o)
	c.onArtifact(ctx, log, kind, obj, msg.Event.Type(), o)
	return nil
}

// forget drops the order of o's source, deleted.
func (c *Consumer) forget(ctx context.Context, o *events.Outcome) {
	if err := c.order.forget(ctx, types.UID(o.Job.Object.UID)); err != nil {
		// The entry expires with the bucket's TTL.
		logr.FromContextOrDiscard(ctx).Error(err, "forgetting a deleted source's outcome order")
	}
}

// onArtifact calls OnArtifact for a plug-in kind's new artifact, once
// status holds it.
func (c *Consumer) onArtifact(ctx context.Context, log logr.Logger, kind sourcekind.Kind, obj sourcekind.Object, eventType string, o *events.Outcome) {
	if c.OnArtifact == nil || kind.Plugin == nil || eventType != events.TypeArtifactStored || o.Artifact == nil {
		return
	}
	art := obj.GetArtifact()
	if art == nil || art.Digest != o.Artifact.Digest {
		// A newer outcome's artifact is in status already.
		return
	}
	if err := c.OnArtifact(ctx, obj, art.DeepCopy()); err != nil {
		log.Error(err, "publishing the new artifact of a plug-in kind failed", "revision", art.Revision, "digest", art.Digest)
	}
}

// retry schedules the next reconcile of a source whose job failed for a
// reason that passes and that the bus no longer retries, and forgets the
// failures of one whose job succeeded. An outcome of an older generation
// than obj's schedules nothing: the newer job's outcome will.
func (c *Consumer) retry(ctx context.Context, log logr.Logger, key types.NamespacedName, obj sourcekind.Object, eventType string, o *events.Outcome) {
	r := c.Retries[o.Job.Object.Kind]
	if r == nil || o.Job.Object.Generation != obj.GetGeneration() {
		return
	}
	switch eventType {
	case events.TypeArtifactStored, events.TypeArtifactUnchanged:
		r.Succeeded(key)
	case events.TypeArtifactFailed:
		f := o.Failure
		if f != nil && f.RetryAfterMilliseconds > 0 && !f.Stalled {
			// The host said when: then, and the backoff is not counted.
			delay := r.Failed(ctx, key, time.Duration(f.RetryAfterMilliseconds)*time.Millisecond)
			log.V(1).Info("rate limited: next attempt when the host allows", "delay", delay.String())
			return
		}
		if f == nil || !f.Transient || f.Retrying || f.Stalled {
			return
		}
		delay := r.Failed(ctx, key, 0)
		log.V(1).Info("retrying a failure that passes", "reason", f.Reason, "failures", r.Failures(key), "delay", delay.String())
	}
}

// metadata is what Flux annotates an Event with: the artifact's revision
// and digest on the Events about it; nil on the others.
func metadata(e status.Event) map[string]string {
	if e.Revision == "" && e.Digest == "" {
		return nil
	}
	return notify.ArtifactMetadata(e.Revision, e.Digest)
}

// maxNoteLength is the longest note (message) the events.k8s.io API
// accepts.
const maxNoteLength = 1024

// record writes evs about obj to the API server, each as an events.k8s.io
// Event as the manager's recorder would, but synchronously, and queues it
// for the notification-controller once written.
func (c *Consumer) record(ctx context.Context, obj client.Object, evs []status.Event) error {
	if len(evs) == 0 {
		return nil
	}
	gvk := obj.GetObjectKind().GroupVersionKind()
	if gvk.Empty() {
		// A typed object read from the API server has no kind set (a
		// plug-in kind's always has).
		var err error
		if gvk, err = apiutil.GVKForObject(obj, c.Client.Scheme()); err != nil {
			return fmt.Errorf("record events: %w", err)
		}
	}
	now := time.Now()
	for i, e := range evs {
		note := e.Message
		if len(note) > maxNoteLength {
			note = strings.ToValidUTF8(note[:maxNoteLength], "")
		}
		ev := &eventsv1.Event{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x%02x", obj.GetName(), now.UnixNano(), i), Namespace: obj.GetNamespace(),
				Annotations: notify.Annotations(obj, metadata(e))},
			EventTime:           metav1.NewMicroTime(now),
			ReportingController: EventSource,
			ReportingInstance:   c.Instance,
			Action:              "Reconcile",
			Reason:              e.Reason,
			Note:                note,
			Type:                e.Type,
			Regarding: corev1.ObjectReference{Kind: gvk.Kind, APIVersion: gvk.GroupVersion().String(),
				Namespace: obj.GetNamespace(), Name: obj.GetName(), UID: obj.GetUID(), ResourceVersion: obj.GetResourceVersion()},
		}
		if err := (patch.Writer{Client: c.Client}).Create(ctx, ev); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("record %s event: %w", e.Reason, err)
		}
		c.Notify.Forward(obj, metadata(e), e.Type, e.Reason, e.Message)
	}
	return nil
}

// EventSource is the reportingController of the watcher's Events.
const EventSource = "headwater-watcher"

// orphaned handles an outcome for an object that no longer exists: an
// artifact stored after the object's deletion job ran is removed too.
func (c *Consumer) orphaned(ctx context.Context, eventType string, o *events.Outcome) error {
	if eventType != events.TypeArtifactStored {
		return nil
	}
	job := events.Job{ID: events.DeletionJobID(o.Job.Object.UID) + "/" + o.Job.ID, Object: o.Job.Object, RequestedAt: o.Job.RequestedAt}
	c.Seal.Seal(&job)
	return c.Jobs.Publish(ctx, events.PackageSubject(o.Job.Object.Kind), events.TypeDeleteRequested, job,
		&events.DeleteRequested{Job: job})
}

// garbageCollected records Flux's GarbageCollectionSucceeded Event when the
// artifacts of a deleted source are gone: the outcome of the deletion job
// the finalizer made (not of the clean-up of an artifact stored after it).
// The object is usually gone by then; the Event names it by kind,
// namespace, name and UID. As Flux's, it is a trace: a Normal Event, not
// posted to the notification-controller.
func (c *Consumer) garbageCollected(o *events.Outcome) {
	if o.Job.ID != events.DeletionJobID(o.Job.Object.UID) || c.Recorder == nil {
		return
	}
	kind, ok := c.Kinds.ByName(o.Job.Object.Kind)
	if !ok {
		return
	}
	obj := kind.New()
	obj.SetNamespace(o.Job.Object.Namespace)
	obj.SetName(o.Job.Object.Name)
	obj.SetUID(types.UID(o.Job.Object.UID))
	c.Recorder.Eventf(obj, nil, eventv1.EventTypeTrace, "GarbageCollectionSucceeded", "Reconcile", "%s", status.GarbageCollectedMessage)
}

// logOutcome logs each outcome, as Flux logs what it records.
func logOutcome(log logr.Logger, kind sourcekind.Kind, eventType string, o *events.Outcome) {
	switch eventType {
	case events.TypeArtifactUnchanged:
		if kind.UpToDateReason != sourcev1.ArtifactUpToDateReason {
			log.Info("no changes since last reconciliation", "reason", kind.UpToDateReason,
				"message", status.NoChangeMessage(o.Revision))
		}
		if o.Artifact != nil {
			log.Info("artifact up-to-date", "reason", "ArtifactUpToDate",
				"message", fmt.Sprintf("artifact up-to-date with remote revision: '%s'", o.Artifact.Revision))
		}
	case events.TypeArtifactStored:
		log.Info("stored artifact", "revision", o.Revision, "message", o.EventMessage)
	case events.TypeArtifactFailed:
		if o.Failure != nil {
			log.Info("reconcile failed", "reason", o.Failure.Reason, "message", o.Failure.Message, "stalled", o.Failure.Stalled)
		}
	}
}

// NewForgedCounter registers headwater_forged_outcomes_total on reg: the
// outcomes refused because their job was not issued by the watcher. Any
// increase means a service identity publishes what it should not.
func NewForgedCounter(reg prometheus.Registerer) prometheus.Counter {
	return newCounter(reg, "forged_outcomes_total", "Job outcomes refused because the watcher did not issue their job (no or a wrong seal).")
}

// newCounter registers the counter headwater_<name> on reg.
func newCounter(reg prometheus.Registerer, name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: telemetry.Namespace, Name: name, Help: help})
	reg.MustRegister(c)
	return c
}

// ObjectIdentity are the keys and values controller-runtime adds to the
// log lines of a reconcile, and Flux's controllers write, for an object of
// kind: the controller (the kind in lower case), controllerKind, the
// object under its kind as {"name", "namespace"}, then namespace and
// name. `flux logs --kind --name --namespace` filters on them; the lines
// of a job's outcome carry them as the watcher's reconciles do.
func ObjectIdentity(kind, namespace, name string) []any {
	return []any{"controller", strings.ToLower(kind), "controllerKind", kind,
		kind, objectRef{Name: name, Namespace: namespace}, "namespace", namespace, "name", name}
}

// objectRef is an object under its kind in a log line, as klog.KRef
// writes it.
type objectRef struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
}
