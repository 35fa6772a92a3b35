// Package sink delivers Headwater's public CloudEvents to HTTP endpoints
// (the CloudEvents HTTP protocol binding, binary content mode), beside their
// announcement on NATS. Delivery is best effort and never holds up the bus:
// each endpoint has its own bounded queue and worker, a full queue drops the
// event, and a failed delivery is logged and counted, not retried.
package sink

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// URLs is a flag.Value collecting sink URLs from a repeated flag, each value
// possibly a comma-separated list, so one environment variable can name
// several sinks.
type URLs []string

// String joins the URLs with commas.
func (u *URLs) String() string {
	if u == nil {
		return ""
	}
	return strings.Join(*u, ",")
}

// Set adds the comma-separated http(s) URLs in v.
func (u *URLs) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		p, err := url.Parse(s)
		if err != nil {
			return fmt.Errorf("event sink url %q: %w", Redact(s), errors.Unwrap(err))
		}
		if (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return fmt.Errorf("event sink url %q: want http:// or https:// with a host", Redact(s))
		}
		*u = append(*u, s)
	}
	return nil
}

// Redact strips user information, query and fragment from a URL, so it can
// be logged and used as a metric label without leaking credentials.
func Redact(raw string) string {
	p, err := url.Parse(raw)
	if err != nil {
		return "<unparseable url>"
	}
	p.User = nil
	p.RawQuery = ""
	p.ForceQuery = false
	p.Fragment = ""
	p.RawFragment = ""
	return p.String()
}

// Options tune delivery.
type Options struct {
	// Timeout bounds one delivery; default 5s.
	Timeout time.Duration
	// QueueSize bounds the events waiting for one sink; default 256.
	QueueSize int
}

// Sinks delivers events to a set of HTTP endpoints. A nil *Sinks delivers
// nothing.
type Sinks struct {
	targets []*target
	timeout time.Duration
	log     logr.Logger
	results *prometheus.CounterVec
}

type target struct {
	name   string // redacted URL
	client cloudevents.Client
	queue  chan event.Event
}

// New prepares delivery to urls and registers
// headwater_event_sink_deliveries_total{sink,result} (result: success,
// failed, dropped) on reg. Call Run to start delivering.
func New(urls []string, o Options, reg prometheus.Registerer, log logr.Logger) (*Sinks, error) {
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.QueueSize <= 0 {
		o.QueueSize = 256
	}
	s := &Sinks{
		timeout: o.Timeout,
		log:     log,
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: telemetry.Namespace, Name: "event_sink_deliveries_total",
			Help: "Public CloudEvents delivered to HTTP sinks, by sink and result (success, failed, dropped).",
		}, []string{"sink", "result"}),
	}
	for _, u := range urls {
		p, err := cehttp.New(cehttp.WithTarget(u))
		if err != nil {
			return nil, fmt.Errorf("event sink %s: %w", Redact(u), err)
		}
		c, err := cloudevents.NewClient(p)
		if err != nil {
			return nil, fmt.Errorf("event sink %s: %w", Redact(u), err)
		}
		s.targets = append(s.targets, &target{name: Redact(u), client: c, queue: make(chan event.Event, o.QueueSize)})
		// Every result of every sink is a series from the start, so a
		// rate over it (an alert on failures) sees its first increase.
		for _, r := range []string{"success", "failed", "dropped"} {
			s.results.WithLabelValues(Redact(u), r)
		}
	}
	if err := reg.Register(s.results); err != nil {
		return nil, fmt.Errorf("event sink metrics: %w", err)
	}
	return s, nil
}

// Send queues e for every sink without waiting; when a sink's queue is full
// the event is dropped for that sink and counted.
func (s *Sinks) Send(e event.Event) {
	if s == nil {
		return
	}
	for _, t := range s.targets {
		select {
		case t.queue <- e:
		default:
			s.results.WithLabelValues(t.name, "dropped").Inc()
			s.log.Info("event sink queue full; dropping event", "sink", t.name, "id", e.ID(), "type", e.Type())
		}
	}
}

// Run delivers queued events until ctx ends; events still queued then are
// not delivered.
func (s *Sinks) Run(ctx context.Context) {
	if s == nil {
		return
	}
	var wg sync.WaitGroup
	for _, t := range s.targets {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case e := <-t.queue:
					s.deliver(ctx, t, e)
				}
			}
		})
	}
	wg.Wait()
}

func (s *Sinks) deliver(ctx context.Context, t *target, e event.Event) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if res := t.client.Send(ctx, e); !cloudevents.IsACK(res) {
		s.results.WithLabelValues(t.name, "failed").Inc()
		s.log.Info("event sink delivery failed", "sink", t.name, "id", e.ID(), "type", e.Type(),
			"error", safeError(res))
		return
	}
	s.results.WithLabelValues(t.name, "success").Inc()
}

// safeError describes a failed delivery without the URL the HTTP client
// quotes, which may carry credentials in its query.
func safeError(err error) string {
	if err == nil {
		return "not acknowledged"
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Op + ": " + ue.Err.Error()
	}
	return err.Error()
}
