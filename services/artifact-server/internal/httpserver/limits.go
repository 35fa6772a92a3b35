package httpserver

import (
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/headwater-gitops/headwater/pkg/telemetry"
)

// Limits bound what one client can hold of the artifact server: the time
// to send a request, to receive a response and to keep an idle connection,
// and the connections open at once.
type Limits struct {
	// ReadHeaderTimeout bounds reading a request's headers.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request.
	ReadTimeout time.Duration
	// WriteTimeout bounds a response, from the end of its request's
	// headers: the largest artifact must be sent within it.
	WriteTimeout time.Duration
	// IdleTimeout bounds a kept-alive connection between requests.
	IdleTimeout time.Duration
	// MaxConnections bounds the connections open at once; a client past
	// it waits (in the listen backlog) until one closes. Zero means none.
	MaxConnections int
}

// DefaultLimits are the artifact server's defaults: 10 s for headers, 1
// minute for a request (a GET has no body), 10 minutes for a response
// (100 MiB at 170 KiB/s), 2 minutes idle, 1024 connections.
var DefaultLimits = Limits{
	ReadHeaderTimeout: 10 * time.Second,
	ReadTimeout:       time.Minute,
	WriteTimeout:      10 * time.Minute,
	IdleTimeout:       2 * time.Minute,
	MaxConnections:    1024,
}

// Server returns an http.Server for h with l's timeouts.
func (l Limits) Server(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
	}
}

// Listener wraps ln so that at most l.MaxConnections of its connections
// are open at once, and reports on reg
// headwater_artifact_server_connections (open),
// headwater_artifact_server_max_connections and
// headwater_artifact_server_connections_waited_total (accepts that waited
// for a free slot: a sign the cap is reached).
func (l Limits) Listener(ln net.Listener, reg prometheus.Registerer) net.Listener {
	open := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: telemetry.Namespace, Name: "artifact_server_connections",
		Help: "Connections open to the artifact server.",
	})
	capacity := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: telemetry.Namespace, Name: "artifact_server_max_connections",
		Help: "The artifact server's connection cap (-max-connections; 0 for none).",
	})
	waited := prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: telemetry.Namespace, Name: "artifact_server_connections_waited_total",
		Help: "Connections accepted only once another closed, the cap being reached.",
	})
	reg.MustRegister(open, capacity, waited)
	capacity.Set(float64(l.MaxConnections))
	c := &capped{Listener: ln, open: open, waited: waited, done: make(chan struct{})}
	if l.MaxConnections > 0 {
		c.slots = make(chan struct{}, l.MaxConnections)
	}
	return c
}

// capped is a listener with a semaphore of connections (as
// golang.org/x/net/netutil.LimitListener, with metrics).
type capped struct {
	net.Listener
	slots     chan struct{}
	open      prometheus.Gauge
	waited    prometheus.Counter
	done      chan struct{}
	closeOnce sync.Once
}

// Accept takes a slot, waiting for one while the cap is reached, then
// accepts. A connection accepted after such a wait is counted as having
// waited: it is the one that queued (in the kernel's backlog) while the
// cap held, and not the loop's own wait, which begins as soon as the last
// slot is taken, whether or not anybody is waiting.
func (c *capped) Accept() (net.Conn, error) {
	waited := false
	if c.slots != nil {
		select {
		case c.slots <- struct{}{}:
		default:
			waited = true
			select {
			case c.slots <- struct{}{}:
			case <-c.done:
				return nil, net.ErrClosed
			}
		}
	}
	conn, err := c.Listener.Accept()
	if err != nil {
		c.release()
		return nil, err
	}
	if waited {
		c.waited.Inc()
	}
	c.open.Inc()
	return &slotConn{Conn: conn, release: func() { c.open.Dec(); c.release() }}, nil
}

func (c *capped) release() {
	if c.slots != nil {
		<-c.slots
	}
}

func (c *capped) Close() error {
	c.closeOnce.Do(func() { close(c.done) })
	return c.Listener.Close()
}

// slotConn gives its slot back once, when closed.
type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (s *slotConn) Close() error {
	err := s.Conn.Close()
	s.once.Do(s.release)
	return err
}
