package bus_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// busReady reads headwater_bus_ready from reg.
func busReady(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "headwater_bus_ready" {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("headwater_bus_ready not registered")
	return 0
}

// TestConnectGivesUpAfterTimeout: with -nats-connect-timeout, Connect
// stops trying and says why; each failed attempt is the status, with the
// URL and without its credentials.
func TestConnectGivesUpAfterTimeout(t *testing.T) {
	status := bus.NewStatus()
	if err := status.Check(); err == nil || err.Error() != "not connected yet" {
		t.Fatalf("Check() before Connect = %v", err)
	}
	// Port 1 is never a NATS server.
	o := bus.Options{URL: "nats://user:s3cret@127.0.0.1:1", ConnectTimeout: 1500 * time.Millisecond}
	_, err := bus.Connect(context.Background(), o, "t", testr.New(t), bus.ReportTo(status))
	if err == nil || !strings.Contains(err.Error(), "gave up after -nats-connect-timeout 1.5s") {
		t.Fatalf("Connect = %v, want it to give up", err)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Connect = %v: a timeout is a failure, not a stop", err)
	}
	check := status.Check()
	for _, e := range []error{err, check} {
		if e == nil || !strings.Contains(e.Error(), "connecting to nats://127.0.0.1:1: ") || strings.Contains(e.Error(), "s3cret") {
			t.Errorf("error %q: want the attempt, with the URL and without its credentials", e)
		}
	}
	if _, err := bus.Connect(context.Background(), bus.Options{ConnectTimeout: -time.Second}, "t", testr.New(t)); err == nil {
		t.Error("Connect accepted a negative timeout")
	}
}

// TestStatusFollowsConnect: the status waits while no server listens, is
// joining once connected, up after Up, and follows the connection after.
func TestStatusFollowsConnect(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	status := bus.NewStatus()
	reg := prometheus.NewRegistry()
	status.Register(reg, "t")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		conn *bus.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		c, err := bus.Connect(ctx, bus.Options{URL: "nats://127.0.0.1:" + strconv.Itoa(port)}, "t", testr.New(t), bus.ReportTo(status))
		done <- result{c, err}
	}()
	eventually(t, "a failed attempt reported", func() bool {
		err := status.Check()
		return err != nil && strings.HasPrefix(err.Error(), "connecting to nats://127.0.0.1:")
	})
	if v := busReady(t, reg); v != 0 {
		t.Errorf("headwater_bus_ready = %v while connecting", v)
	}

	ns, err := natsserver.Start(natsserver.Options{Port: port, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	var r result
	select {
	case r = <-done:
	case <-time.After(wait):
		t.Fatal("Connect did not connect once the server was up")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.conn.Close()
	if err := status.Check(); err == nil || !strings.Contains(err.Error(), "setting up streams") {
		t.Errorf("Check() once connected = %v, want joining", err)
	}
	status.Up(r.conn)
	if err := status.Check(); err != nil {
		t.Errorf("Check() once up = %v", err)
	}
	if v := busReady(t, reg); v != 1 {
		t.Errorf("headwater_bus_ready = %v once up", v)
	}
	ns.Shutdown()
	ns.WaitForShutdown()
	eventually(t, "the loss reported", func() bool { return status.Check() != nil })
}
