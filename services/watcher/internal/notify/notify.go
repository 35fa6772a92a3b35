// Package notify posts the watcher's Kubernetes Events to Flux's
// notification-controller (the watcher's -events-addr, Flux's flag), the
// way Flux's source-controller posts them (fluxcd/pkg/runtime/events): the
// event v1beta1 format with reportingController "source-controller",
// severity info for Normal and error for Warning, trace Events recorded in
// Kubernetes only, the object's event.toolkit.fluxcd.io/ annotations and
// the artifact's source.toolkit.fluxcd.io/revision and .../digest as
// metadata, a 5 s request timeout and retryablehttp's retries (4 after the
// first attempt, 1 s to 30 s apart, none on 429, which the
// notification-controller answers to a duplicate). Unlike Flux, which posts
// in the reconcile, the watcher queues the Event and posts it from one
// background loop, so a slow or absent receiver never holds a reconcile or
// the acknowledgement of a job's outcome; when the queue is full the Event
// is dropped (and counted).
package notify

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	eventv1 "github.com/fluxcd/pkg/apis/event/v1beta1"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"
	"github.com/hashicorp/go-retryablehttp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/reference"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// ReportingController is the reportingController of every Event posted:
// Flux's source-controller's, so Alerts and Providers see no difference.
const ReportingController = "source-controller"

// Metadata keys Flux's source-controller sets on the Events about an
// artifact (a new one, a recovery).
var (
	// RevisionKey holds the artifact's revision.
	RevisionKey = sourcev1.GroupVersion.Group + "/" + eventv1.MetaRevisionKey
	// DigestKey holds the artifact's digest.
	DigestKey = sourcev1.GroupVersion.Group + "/" + eventv1.MetaDigestKey
)

// ArtifactMetadata is the metadata Flux posts with an Event about the
// artifact of the given revision and digest.
func ArtifactMetadata(revision, digest string) map[string]string {
	return map[string]string{RevisionKey: revision, DigestKey: digest}
}

// Annotations is what Flux annotates an Event about obj with, in
// Kubernetes and in the notification: metadata (may be nil) and obj's own
// annotations under event.toolkit.fluxcd.io/. Nil when there are none.
func Annotations(obj runtime.Object, metadata map[string]string) map[string]string {
	out := maps.Clone(metadata)
	if a, ok := obj.(interface{ GetAnnotations() map[string]string }); ok {
		for k, v := range a.GetAnnotations() {
			if strings.HasPrefix(k, eventv1.Group+"/") {
				if out == nil {
					out = map[string]string{}
				}
				out[k] = v
			}
		}
	}
	return out
}

// Flux's HTTP client settings (fluxcd/pkg/runtime/events.NewRecorder, with
// go-retryablehttp's defaults).
const (
	// requestTimeout bounds one attempt.
	requestTimeout = 5 * time.Second
	// retryMax is the number of retries after the first attempt.
	retryMax = 4
	// retryWaitMin and retryWaitMax bound the exponential backoff between
	// attempts.
	retryWaitMin = 1 * time.Second
	retryWaitMax = 30 * time.Second
)

// DefaultQueueSize is how many Events wait to be posted before new ones
// are dropped.
const DefaultQueueSize = 1024

// Forwarder posts Events to a notification-controller. A nil *Forwarder
// posts nothing. Start must run for queued Events to be posted.
type Forwarder struct {
	addr     string
	scheme   *runtime.Scheme
	instance string
	client   *retryablehttp.Client
	queue    chan eventv1.Event
	results  *prometheus.CounterVec
	log      logr.Logger
}

var _ manager.Runnable = (*Forwarder)(nil)

// Options configure a Forwarder.
type Options struct {
	// Addr is the notification-controller's events URL, e.g.
	// http://notification-controller.flux-system.svc.cluster.local./
	Addr string
	// Scheme resolves the kind and API version of the objects posted about.
	Scheme *runtime.Scheme
	// QueueSize bounds the Events waiting to be posted; DefaultQueueSize
	// when 0.
	QueueSize int
	// Registerer, when set, gets headwater_notifications_total.
	Registerer prometheus.Registerer
	// Log reports Events that could not be posted.
	Log logr.Logger
}

// New returns a Forwarder posting to o.Addr, or nil when o.Addr is empty
// (Flux's rule: no address, no posts).
func New(o Options) (*Forwarder, error) {
	if o.Addr == "" {
		return nil, nil
	}
	// The address is not repeated in errors: it may carry credentials.
	u, err := url.Parse(o.Addr)
	if err != nil {
		return nil, errors.New("events address: not a valid URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, errors.New("events address: want an http:// or https:// URL")
	}
	if o.QueueSize <= 0 {
		o.QueueSize = DefaultQueueSize
	}
	// Flux posts the pod's hostname as reportingInstance.
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("hostname: %w", err)
	}
	c := retryablehttp.NewClient()
	c.HTTPClient.Timeout = requestTimeout
	c.RetryMax, c.RetryWaitMin, c.RetryWaitMax = retryMax, retryWaitMin, retryWaitMax
	c.CheckRetry = checkRetry
	c.Logger = nil
	f := &Forwarder{
		addr:     o.Addr,
		scheme:   o.Scheme,
		instance: host,
		client:   c,
		queue:    make(chan eventv1.Event, o.QueueSize),
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Name: "notifications_total",
			Help: "Events for the notification-controller (-events-addr) by result: posted, failed (after the retries) or dropped (queue full).",
		}, []string{"result"}),
		log: o.Log,
	}
	for _, r := range []string{resultPosted, resultFailed, resultDropped} {
		f.results.WithLabelValues(r)
	}
	if o.Registerer != nil {
		if err := o.Registerer.Register(f.results); err != nil {
			return nil, fmt.Errorf("register notification metrics: %w", err)
		}
	}
	return f, nil
}

// Results of a posted Event, the label of headwater_notifications_total.
const (
	resultPosted  = "posted"
	resultFailed  = "failed"
	resultDropped = "dropped"
)

// checkRetry is Flux's retry policy: retryablehttp's, but a 429 (the
// notification-controller's answer to a duplicate Event) is final.
func checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if resp != nil && resp.StatusCode == http.StatusTooManyRequests {
		return false, nil
	}
	return retryablehttp.ErrorPropagatedRetryPolicy(ctx, resp, err)
}

// severity maps a Kubernetes Event type to Flux's severity.
func severity(eventType string) string {
	switch eventType {
	case corev1.EventTypeWarning:
		return eventv1.EventSeverityError
	case eventv1.EventTypeTrace:
		return eventv1.EventSeverityTrace
	default:
		return eventv1.EventSeverityInfo
	}
}

// Forward queues an Event about obj for posting, with metadata (may be
// nil) and obj's annotations under event.toolkit.fluxcd.io/. Trace Events
// are not posted, nor Events about an object without a kind, name or
// namespace. It never blocks: when the queue is full the Event is dropped.
func (f *Forwarder) Forward(obj runtime.Object, metadata map[string]string, eventType, reason, message string) {
	if f == nil {
		return
	}
	sev := severity(eventType)
	if sev == eventv1.EventSeverityTrace {
		return
	}
	ref, err := reference.GetReference(f.scheme, obj)
	if err != nil {
		f.log.Error(err, "cannot post event: no object reference", "reason", reason)
		return
	}
	if ref.Kind == "" || ref.Name == "" || ref.Namespace == "" {
		f.log.Error(fmt.Errorf("incomplete object reference %s %s/%s", ref.Kind, ref.Namespace, ref.Name),
			"cannot post event", "reason", reason)
		return
	}
	meta := Annotations(obj, metadata)
	ev := eventv1.Event{
		InvolvedObject:      *ref,
		Severity:            sev,
		Timestamp:           metav1.Now(),
		Message:             message,
		Reason:              reason,
		Metadata:            meta,
		ReportingController: ReportingController,
		ReportingInstance:   f.instance,
	}
	select {
	case f.queue <- ev:
	default:
		f.results.WithLabelValues(resultDropped).Inc()
		f.log.Info("notification queue full: event dropped", "reason", reason,
			"kind", ref.Kind, "namespace", ref.Namespace, "name", ref.Name)
	}
}

// drainTimeout bounds the posting of the Events still queued when the
// watcher stops.
const drainTimeout = 5 * time.Second

// Start posts queued Events, one at a time and in order, until ctx ends;
// then, for up to drainTimeout, it posts what is still queued (and the
// Event whose post ctx's end interrupted).
func (f *Forwarder) Start(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			f.drain(nil)
			return nil
		case ev := <-f.queue:
			err := f.post(ctx, ev)
			if err != nil && ctx.Err() != nil {
				f.drain(&ev)
				return nil
			}
			f.count(ev, err)
		}
	}
}

// drain posts first (when not nil), then the queued Events, until the
// queue is empty or drainTimeout has passed.
func (f *Forwarder) drain(first *eventv1.Event) {
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	if first != nil {
		f.count(*first, f.post(ctx, *first))
	}
	for ctx.Err() == nil {
		select {
		case ev := <-f.queue:
			f.count(ev, f.post(ctx, ev))
		default:
			return
		}
	}
}

// count counts and logs the result of posting ev.
func (f *Forwarder) count(ev eventv1.Event, err error) {
	if err != nil {
		f.results.WithLabelValues(resultFailed).Inc()
		f.log.Error(err, "unable to post event", "reason", ev.Reason, "kind", ev.InvolvedObject.Kind,
			"namespace", ev.InvolvedObject.Namespace, "name", ev.InvolvedObject.Name)
		return
	}
	f.results.WithLabelValues(resultPosted).Inc()
}

// NeedLeaderElection is false: a replica posts what it recorded, and only
// the leader records.
func (f *Forwarder) NeedLeaderElection() bool { return false }

// post sends one Event, with Flux's retries. As Flux's, an answer that is
// not retried (a 4xx) ends the attempt without an error.
func (f *Forwarder) post(ctx context.Context, ev eventv1.Event) error {
	body, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encode event: %w", err)
	}
	req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, f.addr, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("event request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := f.client.Do(req)
	if err != nil {
		return fmt.Errorf("post event: %w", err)
	}
	return resp.Body.Close()
}

// Recorder records Kubernetes Events as Flux's event recorder does, and
// posts them through a Forwarder (which may be nil): a trace Event
// (eventv1.EventTypeTrace) is recorded as a Normal Event and not posted.
type Recorder struct {
	// Recorder writes the Kubernetes Events.
	Recorder recorder.EventRecorder
	// Forwarder posts them; nil posts nothing.
	Forwarder *Forwarder
}

var _ recorder.EventRecorder = (*Recorder)(nil)

// Eventf records an Event and posts it.
func (r *Recorder) Eventf(regarding, related runtime.Object, eventType, reason, action, note string, args ...any) {
	r.AnnotatedEventf(regarding, related, nil, eventType, reason, action, note, args...)
}

// AnnotatedEventf records an Event with annotations and posts it with them
// as metadata; both also carry the object's event.toolkit.fluxcd.io/
// annotations, as Flux's.
func (r *Recorder) AnnotatedEventf(regarding, related runtime.Object, annotations map[string]string,
	eventType, reason, action, note string, args ...any) {
	k8sType := eventType
	if eventType == eventv1.EventTypeTrace {
		k8sType = corev1.EventTypeNormal
	}
	if all := Annotations(regarding, annotations); len(all) > 0 {
		r.Recorder.AnnotatedEventf(regarding, related, all, k8sType, reason, action, note, args...)
	} else {
		r.Recorder.Eventf(regarding, related, k8sType, reason, action, note, args...)
	}
	r.Forwarder.Forward(regarding, annotations, eventType, reason, fmt.Sprintf(note, args...))
}
