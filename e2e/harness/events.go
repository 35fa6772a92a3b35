package harness

import (
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// PublicEvents is the NATS subject of every public Headwater CloudEvent.
const PublicEvents = events.EventSubjectPrefix + ".>"

// EventHandler receives one public event: the NATS subject, and the decoded
// message or the reason it does not decode.
type EventHandler func(subject string, m *events.Message, err error)

// SubscribeEvents subscribes to every public CloudEvent on the NATS server at
// url, as any user's subscriber would (auth: its credentials, e.g. the
// subscriber identity's), and calls fn for each, one at a time, in order.
// Call the returned function to unsubscribe.
func SubscribeEvents(url string, auth nats.Option, fn EventHandler) (stop func(), err error) {
	nc, err := nats.Connect(url, nats.Name("headwater-harness-events"), auth)
	if err != nil {
		return nil, fmt.Errorf("subscribe to events: %w", err)
	}
	_, err = nc.Subscribe(PublicEvents, func(msg *nats.Msg) {
		m, err := events.Decode(msg.Data)
		fn(msg.Subject, m, err)
	})
	if err == nil {
		// Make sure the server has the subscription before returning, so
		// no event published afterwards is missed.
		err = nc.Flush()
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("subscribe to events: %w", err)
	}
	return func() { _ = nc.Drain() }, nil
}
