// Package announce turns the job results on headwater.jobs.publish.> into
// Headwater's public CloudEvents on headwater.events.<kind>.<namespace>.<name>,
// with the artifact's download URL filled in.
package announce

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/tracing"
)

// Publisher publishes a CloudEvent for a job idempotently; *bus.Publisher
// is one.
type Publisher interface {
	Publish(ctx context.Context, subject, eventType string, job events.Job, data any) error
}

// EventSink receives every public event after it is on the bus; *sink.Sinks
// is one. Send must not block.
type EventSink interface {
	Send(e event.Event)
}

// Announcer publishes the public event of each job result.
type Announcer struct {
	// Publisher publishes on the bus; its deterministic message IDs make a
	// redelivered result announce once.
	Publisher Publisher
	// Service names the publisher in the CloudEvent source of sink copies;
	// it must match the Publisher's.
	Service string
	// Advertised is the host[:port] of artifact URLs:
	// http://<Advertised>/<artifact path>.
	Advertised string
	// Sink, when set, also receives every announced event.
	Sink EventSink
}

// Handle is a bus.Handler for the publish stream. A result type is
// announced as its public type (events.PublicType) on
// events.EventSubject(kind, namespace, name) for the same job; any other
// type is terminated. A failed publish is retried by the worker.
//
// The announcement is a span of its own ("announce"), a child of the
// worker's; the public event carries the trace on.
func (a *Announcer) Handle(ctx context.Context, msg *events.Message, _ bus.Delivery) (err error) {
	ctx, span := tracing.StartJob(ctx, tracer, "announce", events.JobOf(msg.Data))
	defer func() { tracing.End(span, err) }()
	public, ok := events.PublicType(msg.Event.Type())
	if !ok {
		return fmt.Errorf("%w: announce: %q is not a job result type", events.ErrMalformed, msg.Event.Type())
	}
	in, ok := msg.Data.(*events.Outcome)
	if !ok {
		return fmt.Errorf("%w: announce: %s data is %T, not an outcome", events.ErrMalformed, msg.Event.Type(), msg.Data)
	}
	out := a.Public(in)
	obj := out.Job.Object
	subject := events.EventSubject(obj.Kind, obj.Namespace, obj.Name)
	if err := a.Publisher.Publish(ctx, subject, public, out.Job, out); err != nil {
		return fmt.Errorf("announce %s: %w", public, err)
	}
	logr.FromContextOrDiscard(ctx).V(1).Info("announced result", "public", public, "eventsubject", subject)
	if a.Sink != nil {
		a.sendToSink(ctx, public, out)
	}
	return nil
}

// Public returns a copy of a result's outcome with the artifact URLs filled
// in (its artifact's and its generated outputs'); in is not modified.
func (a *Announcer) Public(in *events.Outcome) *events.Outcome {
	out := *in
	if in.Artifact != nil {
		art := *in.Artifact
		art.URL = a.URL(art.Path)
		out.Artifact = &art
	}
	if in.Outputs != nil {
		out.Outputs = make([]events.GeneratedOutput, len(in.Outputs))
		for i, o := range in.Outputs {
			o.Artifact.URL = a.URL(o.Artifact.Path)
			out.Outputs[i] = o
		}
	}
	return &out
}

// URL is the download URL of the artifact stored at path.
func (a *Announcer) URL(path string) string { return a.BaseURL() + strings.TrimPrefix(path, "/") }

// sendToSink hands the sink the event as published: same ID, type, source,
// subject and data.
func (a *Announcer) sendToSink(ctx context.Context, public string, out *events.Outcome) {
	log := logr.FromContextOrDiscard(ctx)
	body, err := events.EncodeContext(ctx, a.Service, public, events.MessageID(out.Job, public), events.ObjectSubject(out.Job.Object), out)
	if err != nil {
		log.Error(err, "encoding event for sinks")
		return
	}
	var e event.Event
	if err := json.Unmarshal(body, &e); err != nil {
		log.Error(err, "encoding event for sinks")
		return
	}
	a.Sink.Send(e)
}

// BaseURL is what every artifact URL starts with: http://<Advertised>/.
func (a *Announcer) BaseURL() string { return "http://" + a.Advertised + "/" }

// AnnounceAddress tells the watchers the address this artifact-server
// advertises (events.TypeArtifactAddress on events.ArtifactAddressSubject,
// core NATS), so that a watcher learns at once that artifact URLs changed
// and stops treating sources with the old ones as steady. It is not
// stored: a watcher that misses it learns the address from the next
// artifact announced. id identifies this announcement (the replica and
// its start).
func (a *Announcer) AnnounceAddress(nc *nats.Conn, id string) error {
	body, err := events.Encode(a.Service, events.TypeArtifactAddress, id, a.Service, &events.ArtifactAddress{BaseURL: a.BaseURL()})
	if err != nil {
		return err
	}
	msg := &nats.Msg{Subject: events.ArtifactAddressSubject, Data: body, Header: nats.Header{}}
	msg.Header.Set("Content-Type", events.ContentType)
	if err := nc.PublishMsg(msg); err != nil {
		return fmt.Errorf("announce the artifact address: %w", err)
	}
	return nc.Flush()
}
