package bench

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// TestNATSVarz reads a real NATS server's counters before and after a
// client publishes three messages of 100 bytes to itself.
func TestNATSVarz(t *testing.T) {
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, HTTPHost: "127.0.0.1", HTTPPort: -1, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer s.Shutdown()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS not ready")
	}
	addr := fmt.Sprintf("127.0.0.1:%d", s.MonitorAddr().Port)
	before, err := natsVarz(t.Context(), addr)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("bench.varz")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := nc.Publish("bench.varz", make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if _, err := sub.NextMsg(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	after, err := natsVarz(t.Context(), addr)
	if err != nil {
		t.Fatal(err)
	}
	if in := after.InMsgs - before.InMsgs; in != 3 {
		t.Errorf("in messages %d, want 3", in)
	}
	if out := after.OutMsgs - before.OutMsgs; out != 3 {
		t.Errorf("out messages %d, want 3", out)
	}
	if b := after.InBytes - before.InBytes; b != 300 {
		t.Errorf("in bytes %d, want 300", b)
	}
}
