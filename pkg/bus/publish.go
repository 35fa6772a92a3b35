package bus

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// Publisher publishes CloudEvents for one service.
type Publisher struct {
	js      jetstream.JetStream
	service string
}

// NewPublisher returns a Publisher whose events name service as their source.
func (c *Conn) NewPublisher(service string) *Publisher {
	return &Publisher{js: c.JS, service: service}
}

// Publish sends data as a CloudEvent of eventType for job on subject and
// waits for JetStream to store it. The message ID is events.MessageID(job,
// eventType), so publishing the same job's event twice stores it once.
//
// The message carries the trace context of its "publish" span, a child of
// the span ctx carries (see TracerName).
func (p *Publisher) Publish(ctx context.Context, subject, eventType string, job events.Job, data any) error {
	_, err := p.PublishSeq(ctx, subject, eventType, job, data)
	return err
}

// PublishSeq is Publish, returning the stream sequence JetStream stored the
// message at (that of the message stored first when it was a duplicate):
// a consumer whose Delivered.Stream is at or past it has taken it.
func (p *Publisher) PublishSeq(ctx context.Context, subject, eventType string, job events.Job, data any) (uint64, error) {
	ack, err := p.publish(ctx, subject, eventType, events.MessageID(job, eventType), events.ObjectSubject(job.Object), data)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// PublishEvent sends data as a CloudEvent of eventType that belongs to no
// job (a delivery report) on subject, with id as its event and message ID
// and ceSubject as its CloudEvent subject, and waits for JetStream to
// store it. The message carries the trace context as Publish's does.
func (p *Publisher) PublishEvent(ctx context.Context, subject, eventType, id, ceSubject string, data any) error {
	_, err := p.publish(ctx, subject, eventType, id, ceSubject, data)
	return err
}

// publish is PublishEvent, returning JetStream's acknowledgement.
func (p *Publisher) publish(ctx context.Context, subject, eventType, id, ceSubject string, data any) (ack *jetstream.PubAck, err error) {
	ctx, span := startPublishSpan(ctx, p.service, subject, eventType, id, ceSubject)
	defer func() { endSpan(span, "", err) }()
	body, err := events.EncodeContext(ctx, p.service, eventType, id, ceSubject, data)
	if err != nil {
		return nil, err
	}
	msg := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{}}
	msg.Header.Set("Content-Type", events.ContentType)
	if ack, err = p.js.PublishMsg(ctx, msg, jetstream.WithMsgID(id)); err != nil {
		return nil, fmt.Errorf("publish %s to %s: %w", eventType, subject, err)
	}
	return ack, nil
}
