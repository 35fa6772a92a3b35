package bus

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// errJoining is a service's readiness once connected, while it sets up
// its streams and consumer.
var errJoining = errors.New("connected, setting up streams and consumer")

// Status is how far a service has got onto the bus, as its readiness check
// (Check) and the headwater_bus_ready metric (Register) tell: not connected
// yet; each failed attempt to connect (Connect with ReportTo); connected,
// setting up streams and consumer; and, once the service calls Up, whether
// its connection is up. Safe for concurrent use.
type Status struct {
	mu sync.Mutex
	// err is why the service is not on the bus yet, until Up.
	err error
	// conn is the connection, once Up.
	conn *Conn
}

// NewStatus returns the status of a service that has not connected yet.
func NewStatus() *Status {
	return &Status{err: errors.New("not connected yet")}
}

// set records why the service is not on the bus yet; a nil s records
// nothing.
func (s *Status) set(err error) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

// Up records that the service is on the bus over c, its streams and
// consumer set up: from now on Check follows c.Healthy.
func (s *Status) Up(c *Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conn, s.err = c, nil
}

// Check is the service's readiness check of the bus (a telemetry.Check):
// nil once it is Up while its connection is, otherwise why not.
func (s *Status) Check() error {
	s.mu.Lock()
	c, err := s.conn, s.err
	s.mu.Unlock()
	if c == nil {
		return err
	}
	return c.Healthy()
}

// Register registers headwater_bus_ready{service} on reg: 1 while Check
// passes, 0 otherwise. Like MustRegister, it panics if reg already has it.
func (s *Status) Register(reg prometheus.Registerer, service string) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: telemetry.Namespace, Name: "bus_ready",
		Help:        "1 while the service is on the bus: connected to NATS, with its streams and consumer set up; 0 otherwise.",
		ConstLabels: prometheus.Labels{"service": service},
	}, func() float64 {
		if s.Check() != nil {
			return 0
		}
		return 1
	}))
}
