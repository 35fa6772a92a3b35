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
	return p.PublishEvent(ctx, subject, eventType, events.MessageID(job, eventType), events.ObjectSubject(job.Object), data)
}

// PublishEvent sends data as a CloudEvent of eventType that belongs to no
// job (a delivery report) on subject, with id as its event and message ID
// and ceSubject as its CloudEvent subject, and waits for JetStream to
// store it. The message carries the trace context as Publish's does.
func (p *Publisher) PublishEvent(ctx context.Context, subject, eventType, id, ceSubject string, data any) (err error) {
	ctx, span := startPublishSpan(ctx, p.service, subject, eventType, id, ceSubject)
	defer func() { endSpan(span, "", err) }()
	body, err := events.EncodeContext(ctx, p.service, eventType, id, ceSubject, data)
	if err != nil {
		return err
	}
	msg := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{}}
	msg.Header.Set("Content-Type", events.ContentType)
	if _, err := p.js.PublishMsg(ctx, msg, jetstream.WithMsgID(id)); err != nil {
		return fmt.Errorf("publish %s to %s: %w", eventType, subject, err)
	}
	return nil
}
