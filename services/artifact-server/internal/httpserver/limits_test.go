package httpserver

import (
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// serveLimited serves a trivial handler under l on a loopback port.
func serveLimited(t *testing.T, l Limits) (addr string, reg *prometheus.Registry) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg = prometheus.NewRegistry()
	srv := l.Server(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	go func() { _ = srv.Serve(l.Listener(ln, reg)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String(), reg
}

// TestConnectionCap: with the cap held by two idle clients, a third waits
// (counted) and is served once one of them leaves.
func TestConnectionCap(t *testing.T) {
	addr, reg := serveLimited(t, Limits{ReadHeaderTimeout: time.Minute, IdleTimeout: time.Minute, MaxConnections: 2})
	var idle []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	gauge := func() float64 { return metric(t, reg, "headwater_artifact_server_connections") }
	waited := func() float64 { return metric(t, reg, "headwater_artifact_server_connections_waited_total") }
	deadline := time.Now().Add(10 * time.Second)
	for gauge() != 2 {
		if time.Now().After(deadline) {
			t.Fatal("the two idle clients do not hold the cap")
		}
		time.Sleep(10 * time.Millisecond)
	}
	served := make(chan error, 1)
	go func() {
		resp, err := http.Get("http://" + addr + "/x")
		if err == nil {
			_ = resp.Body.Close()
		}
		served <- err
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-served:
		t.Fatalf("the third client was served past the cap: %v", err)
	default:
	}
	// Nothing was accepted after a wait yet: the server reaching its cap
	// is not itself a client that waited.
	if v := waited(); v != 0 {
		t.Errorf("headwater_artifact_server_connections_waited_total %v before any waiting client was accepted, want 0", v)
	}
	_ = idle[0].Close()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("the third client once a slot freed: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the third client was not served once a slot freed")
	}
	// The third client waited, and is counted once.
	if v := waited(); v != 1 {
		t.Errorf("headwater_artifact_server_connections_waited_total %v once the waiting client was served, want 1", v)
	}
}

// TestSlowClientIsCut: a client that never finishes its headers is
// disconnected after ReadHeaderTimeout, and its slot is given back.
func TestSlowClientIsCut(t *testing.T) {
	addr, _ := serveLimited(t, Limits{ReadHeaderTimeout: 100 * time.Millisecond, MaxConnections: 1})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /x HTTP/1.1\r\nHost: a\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(c); errors.Is(err, net.ErrClosed) || isTimeout(err) {
		t.Fatalf("the slow client was not disconnected: %v", err)
	}
	// Its slot is free again.
	resp, err := http.Get("http://" + addr + "/x")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// metric is the value of the counter or gauge name on reg (0 when absent).
func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
