package events

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	cenats "github.com/cloudevents/sdk-go/protocol/nats/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/nats-io/nats.go"
)

// PublicTypes is every public type, for the wire format golden files.
var publicTypes = []string{TypeArtifactStored, TypeArtifactUnchanged, TypeArtifactFailed, TypeArtifactDeleted}

// wireDir holds one golden file per public type and transport:
// testdata/wire/<type>/{nats,http-structured,http-binary}.txt.
const wireDir = "testdata/wire"

// publicEvent is a public event as the artifact-server announces it, made
// by Encode, with a fixed time so that it can be compared byte for byte.
func publicEvent(t *testing.T, eventType string) cloudevents.Event {
	t.Helper()
	data := sampleData()[eventType]
	job := JobOf(data)
	body, err := Encode(ArtifactServerIdentity, eventType, MessageID(job, eventType), ObjectSubject(job.Object), data)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Decode(body)
	if err != nil {
		t.Fatal(err)
	}
	m.Event.SetTime(time.Date(2026, 1, 2, 3, 4, 7, 0, time.UTC))
	return m.Event
}

// natsWire is a public event as a NATS message: subject, headers as the
// artifact-server sets them, body.
func natsWire(t *testing.T, e cloudevents.Event) []byte {
	t.Helper()
	var body bytes.Buffer
	if err := cenats.WriteMsg(context.Background(), binding.ToMessage(&e), &body); err != nil {
		t.Fatal(err)
	}
	// What the artifact-server publishes is Encode's output; it must be
	// the same bytes as the CloudEvents NATS binding writes.
	encoded, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(encoded, body.Bytes()) {
		t.Errorf("Encode's body differs from the sdk-go NATS binding's:\n%s\n%s", encoded, body.Bytes())
	}
	job := JobOf(sampleData()[e.Type()])
	var b bytes.Buffer
	fmt.Fprintf(&b, "SUBJECT %s\n", EventSubject(job.Object.Kind, job.Object.Namespace, job.Object.Name))
	fmt.Fprintf(&b, "Content-Type: %s\n", ContentType)
	fmt.Fprintf(&b, "Nats-Msg-Id: %s\n\n", e.ID())
	b.Write(body.Bytes())
	b.WriteString("\n")
	return b.Bytes()
}

// httpWire is a public event as an HTTP request in the CloudEvents HTTP
// binding, in structured or binary content mode, as sdk-go writes it.
func httpWire(t *testing.T, e cloudevents.Event, structured bool) []byte {
	t.Helper()
	ctx := binding.WithForceBinary(context.Background())
	if structured {
		ctx = binding.WithForceStructured(context.Background())
	}
	req, err := http.NewRequest(http.MethodPost, "http://sink.example/", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := cehttp.WriteRequest(ctx, binding.ToMessage(&e), req); err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	b.WriteString("POST / HTTP/1.1\n")
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range req.Header {
			if !yield(k) {
				return
			}
		}
	}) {
		for _, v := range req.Header[k] {
			fmt.Fprintf(&b, "%s: %s\n", k, v)
		}
	}
	b.WriteString("\n")
	b.Write(body)
	b.WriteString("\n")
	return b.Bytes()
}

// parseWire splits a golden file into its header lines and body.
func parseWire(t *testing.T, b []byte) (first string, header http.Header, body []byte) {
	t.Helper()
	head, body, ok := bytes.Cut(b, []byte("\n\n"))
	if !ok {
		t.Fatal("golden file has no blank line before the body")
	}
	lines := strings.Split(string(head), "\n")
	header = http.Header{}
	for _, l := range lines[1:] {
		k, v, _ := strings.Cut(l, ": ")
		header.Add(k, v)
	}
	return lines[0], header, bytes.TrimSuffix(body, []byte("\n"))
}

// TestWireFormat keeps the golden files of every public event in every
// transport (testdata/wire) in step with what Headwater sends, reads each
// back with sdk-go's own bindings, validates the event (event.Validate) and
// its data against the type's JSON Schema in docs/schemas. Run with
// -update after a deliberate change.
func TestWireFormat(t *testing.T) {
	for _, typ := range publicTypes {
		t.Run(typ, func(t *testing.T) {
			e := publicEvent(t, typ)
			schema, err := os.ReadFile(filepath.Join(schemaDir, typ+".json"))
			if err != nil {
				t.Fatal(err)
			}
			s := compileSchema(t, typ, schema)
			for _, w := range []struct {
				file string
				make func() []byte
				read func(first string, h http.Header, body []byte) binding.Message
			}{
				{"nats.txt", func() []byte { return natsWire(t, e) }, func(first string, h http.Header, body []byte) binding.Message {
					if got := h.Get("Content-Type"); got != ContentType {
						t.Errorf("NATS Content-Type %q, want %q", got, ContentType)
					}
					return cenats.NewMessage(&nats.Msg{Subject: strings.TrimPrefix(first, "SUBJECT "), Header: nats.Header(h), Data: body})
				}},
				{"http-structured.txt", func() []byte { return httpWire(t, e, true) }, httpMessage},
				{"http-binary.txt", func() []byte { return httpWire(t, e, false) }, httpMessage},
			} {
				path := filepath.Join(wireDir, typ, w.file)
				want := w.make()
				if *update {
					if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(path, want, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				golden, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(golden, want) {
					t.Errorf("%s differs from what Headwater sends (go test ./events -run TestWireFormat -update, in pkg, after a deliberate change):\n%s\nwant:\n%s", path, golden, want)
				}

				first, h, body := parseWire(t, golden)
				got, err := binding.ToEvent(context.Background(), w.read(first, h, body))
				if err != nil {
					t.Fatalf("%s: sdk-go cannot read it: %v", path, err)
				}
				if err := got.Validate(); err != nil {
					t.Errorf("%s: invalid CloudEvent: %v", path, err)
				}
				if got.String() != e.String() {
					t.Errorf("%s reads back as\n%s\nwant\n%s", path, got, e)
				}
				if err := validateData(t, s, got.Data()); err != nil {
					t.Errorf("%s: data does not match docs/schemas/%s.json: %v", path, typ, err)
				}
				if _, err := Decode(mustMarshal(t, got)); err != nil {
					t.Errorf("%s: Decode: %v", path, err)
				}
			}
		})
	}
}

// httpMessage reads a golden HTTP request as sdk-go's HTTP binding does.
func httpMessage(_ string, h http.Header, body []byte) binding.Message {
	req, _ := http.NewRequest(http.MethodPost, "http://sink.example/", bytes.NewReader(body))
	req.Header = h
	return cehttp.NewMessageFromHttpRequest(req)
}

func mustMarshal(t *testing.T, e *cloudevents.Event) []byte {
	t.Helper()
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
