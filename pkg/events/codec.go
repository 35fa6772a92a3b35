package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"
)

// ContentType is the NATS Content-Type header of every message: a CloudEvent
// in structured content mode (the CloudEvents NATS protocol binding).
const ContentType = "application/cloudevents+json"

// ErrMalformed is wrapped by every decoding error: the message is not a valid
// Headwater CloudEvent and will never become one, so consumers terminate it.
var ErrMalformed = errors.New("malformed message")

// dataTypes maps each known event type to a constructor of its data struct.
var dataTypes = map[string]func() any{
	TypeFetchRequested:    func() any { return new(FetchRequested) },
	TypeDeleteRequested:   func() any { return new(DeleteRequested) },
	TypeGenerateRequested: func() any { return new(GenerateRequested) },
	TypeFetched:           func() any { return new(Fetched) },
	TypeFetchUnchanged:    func() any { return new(Outcome) },
	TypeFetchFailed:       func() any { return new(Outcome) },
	TypePackaged:          func() any { return new(Outcome) },
	TypePackageFailed:     func() any { return new(Outcome) },
	TypeDeleted:           func() any { return new(Outcome) },
	TypeArtifactStored:    func() any { return new(Outcome) },
	TypeArtifactUnchanged: func() any { return new(Outcome) },
	TypeArtifactFailed:    func() any { return new(Outcome) },
	TypeArtifactDeleted:   func() any { return new(Outcome) },
	TypeHookReceived:      func() any { return new(HookReceived) },
	TypeDeliveryReported:  func() any { return new(DeliveryReport) },
	TypeArtifactAddress:   func() any { return new(ArtifactAddress) },
}

// Message is a decoded bus message: the CloudEvent and its typed data, one of
// *FetchRequested, *DeleteRequested, *GenerateRequested, *Fetched, *Outcome, *HookReceived,
// *DeliveryReport or *ArtifactAddress.
type Message struct {
	Event cloudevents.Event
	Data  any
}

// Encode builds the CloudEvent for data and returns its JSON encoding. id
// becomes the event ID (use MessageID); service names the publisher; subject
// is the CloudEvent subject, "<kind>/<namespace>/<name>" by convention.
// The event carries no trace context: publishers use EncodeContext.
func Encode(service, eventType, id, subject string, data any) ([]byte, error) {
	return EncodeContext(context.Background(), service, eventType, id, subject, data)
}

// EncodeContext is Encode for a message published within ctx: when ctx
// carries a span context, the event carries it as the CloudEvents
// distributed-tracing extension (TraceParentExtension,
// TraceStateExtension).
func EncodeContext(ctx context.Context, service, eventType, id, subject string, data any) ([]byte, error) {
	if _, ok := dataTypes[eventType]; !ok {
		return nil, fmt.Errorf("encode: unknown event type %q", eventType)
	}
	e := cloudevents.New()
	e.SetID(id)
	e.SetSource(Source + "/" + service)
	e.SetType(eventType)
	e.SetSubject(subject)
	e.SetTime(time.Now().UTC())
	setTrace(ctx, &e)
	if err := e.SetData(cloudevents.ApplicationJSON, data); err != nil {
		return nil, fmt.Errorf("encode %s data: %w", eventType, err)
	}
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", eventType, err)
	}
	return b, nil
}

// Decode parses a message body into a Message. Any error wraps ErrMalformed.
func Decode(body []byte) (*Message, error) {
	var e cloudevents.Event
	if err := json.Unmarshal(body, &e); err != nil {
		// A trace context that is no CloudEvents value (an object, an
		// array) is dropped, not the message: tracing never rejects a job.
		stripped, ok := withoutTrace(body)
		if !ok || json.Unmarshal(stripped, &e) != nil {
			return nil, fmt.Errorf("%w: not a CloudEvent: %w", ErrMalformed, err)
		}
	}
	if err := e.Validate(); err != nil {
		return nil, fmt.Errorf("%w: invalid CloudEvent: %w", ErrMalformed, err)
	}
	newData, ok := dataTypes[e.Type()]
	if !ok {
		return nil, fmt.Errorf("%w: unknown event type %q", ErrMalformed, e.Type())
	}
	data := newData()
	if err := e.DataAs(data); err != nil {
		return nil, fmt.Errorf("%w: %s data: %w", ErrMalformed, e.Type(), err)
	}
	if err := validate(data); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrMalformed, e.Type(), err)
	}
	return &Message{Event: e, Data: data}, nil
}

// ObjectSubject is the CloudEvent subject for an object: "<kind>/<namespace>/<name>".
func ObjectSubject(o ObjectRef) string {
	return strings.ToLower(o.Kind) + "/" + o.Namespace + "/" + o.Name
}

// JobOf returns the job a decoded data struct belongs to.
func JobOf(data any) Job {
	switch d := data.(type) {
	case *FetchRequested:
		return d.Job
	case *DeleteRequested:
		return d.Job
	case *GenerateRequested:
		return d.Job
	case *Fetched:
		return d.Job
	case *Outcome:
		return d.Job
	case *HookReceived:
		return d.Job
	}
	return Job{}
}

// validate checks what every consumer relies on: a job naming an object,
// or a report naming a Subscription.
func validate(data any) error {
	if a, ok := data.(*ArtifactAddress); ok {
		if u, err := url.Parse(a.BaseURL); err != nil || u.Host == "" || !strings.HasSuffix(a.BaseURL, "/") {
			return fmt.Errorf("artifact address %q is not a base URL (http://host/)", a.BaseURL)
		}
		return nil
	}
	if r, ok := data.(*DeliveryReport); ok {
		if r.Subscription.Namespace == "" || r.Subscription.Name == "" || r.Subscription.UID == "" {
			return errors.New("delivery report does not name a subscription")
		}
		return nil
	}
	j := JobOf(data)
	switch {
	case j.ID == "":
		return errors.New("job has no id")
	case j.Object.Kind == "" || j.Object.Namespace == "" || j.Object.Name == "":
		return errors.New("job does not name an object")
	}
	if h, ok := data.(*HookReceived); ok && h.Job.Object.Kind != ReceiverKind {
		return errors.New("hook does not name a Receiver")
	}
	if f, ok := data.(*Fetched); ok && (f.Staging == "" || f.ArtifactName == "") {
		return errors.New("fetched job has no staging key or artifact name")
	}
	return nil
}
