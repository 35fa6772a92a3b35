package sink

import (
	"context"
	"flag"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestURLsFlag(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    []string
		wantErr string
	}{
		{"repeated", []string{"-s", "http://a/x", "-s", "https://b"}, []string{"http://a/x", "https://b"}, ""},
		{"comma-separated", []string{"-s", "http://a, http://b,,"}, []string{"http://a", "http://b"}, ""},
		{"not http", []string{"-s", "nats://a"}, nil, "want http"},
		{"no host", []string{"-s", "http:///path"}, nil, "want http"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var u URLs
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(new(strings.Builder))
			fs.Var(&u, "s", "")
			err := fs.Parse(tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || strings.Contains(err.Error(), "hunter2") {
					t.Fatalf("err = %v, want one containing %q and no secret", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(u, " ") != strings.Join(tt.want, " ") {
				t.Errorf("URLs = %v, want %v", u, tt.want)
			}
		})
	}
}

// TestSetDoesNotEchoCredentials: the error of a rejected URL names it
// without its user information and query. (The flag package itself quotes
// command-line values, which are visible in the process list anyway; the
// environment path through flagenv does not.)
func TestSetDoesNotEchoCredentials(t *testing.T) {
	var u URLs
	err := u.Set("ftp://user:hunter2@a/?token=hunter2")
	if err == nil || !strings.Contains(err.Error(), `"ftp://a/"`) || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("err = %v", err)
	}
}

func TestRedact(t *testing.T) {
	tests := map[string]string{
		"https://user:pass@hooks.example/a?token=x#f": "https://hooks.example/a",
		"http://hooks.example:8080/":                  "http://hooks.example:8080/",
		"http://[::1":                                 "<unparseable url>",
	}
	for in, want := range tests {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func testEvent(id string) event.Event {
	e := event.New()
	e.SetID(id)
	e.SetSource("headwater/artifact-server")
	e.SetType("io.headwater.artifact.stored.v1")
	e.SetSubject("gitrepository/default/podinfo")
	_ = e.SetData(event.ApplicationJSON, map[string]string{"revision": "main@sha1:abc"})
	return e
}

// TestBinaryDelivery checks the event arrives in binary content mode, with
// its attributes as ce- headers and its data as the body.
func TestBinaryDelivery(t *testing.T) {
	got := make(chan *http.Request, 1)
	bodies := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b strings.Builder
		buf := make([]byte, 512)
		for {
			n, err := r.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		got <- r
		bodies <- b.String()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	reg := prometheus.NewRegistry()
	s, err := New([]string{srv.URL}, Options{}, reg, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	s.Send(testEvent("id-1"))
	var r *http.Request
	select {
	case r = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("no delivery")
	}
	for h, want := range map[string]string{
		"Ce-Id": "id-1", "Ce-Type": "io.headwater.artifact.stored.v1", "Ce-Source": "headwater/artifact-server",
		"Ce-Subject": "gitrepository/default/podinfo", "Ce-Specversion": "1.0", "Content-Type": "application/json",
	} {
		if v := r.Header.Get(h); v != want {
			t.Errorf("%s = %q, want %q", h, v, want)
		}
	}
	if body := <-bodies; !strings.Contains(body, `"main@sha1:abc"`) {
		t.Errorf("body = %q", body)
	}
	deadline := time.Now().Add(20 * time.Second)
	for testutil.ToFloat64(s.results.WithLabelValues(srv.URL, "success")) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("success not counted")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFullQueueDrops never blocks the sender: with nothing delivering, a
// queue of one keeps the first event and drops the rest.
func TestFullQueueDrops(t *testing.T) {
	s, err := New([]string{"http://127.0.0.1:1/"}, Options{QueueSize: 1}, prometheus.NewRegistry(), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		s.Send(testEvent(id))
	}
	if got := testutil.ToFloat64(s.results.WithLabelValues("http://127.0.0.1:1/", "dropped")); got != 2 {
		t.Errorf("dropped = %v, want 2", got)
	}
	if len(s.targets[0].queue) != 1 {
		t.Errorf("queued = %d, want 1", len(s.targets[0].queue))
	}
}

func TestNilSinks(t *testing.T) {
	var s *Sinks
	s.Send(testEvent("x")) // must not panic
	done := make(chan struct{})
	go func() { defer close(done); s.Run(context.Background()) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run of nil sinks does not return")
	}
}
