package events

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
)

// FuzzDecode feeds arbitrary bytes to Decode, which every service runs on
// whatever arrives on its subject: it must never panic, must reject what is
// not a Headwater CloudEvent with ErrMalformed, and what it accepts must
// encode and decode again to the same type, ID and data.
func FuzzDecode(f *testing.F) {
	for typ, data := range sampleData() {
		body, err := Encode("fuzz", typ, "id-"+typ, "gitrepository/default/podinfo", data)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(body)
	}
	f.Add([]byte(`{"specversion":"1.0","id":"x","source":"s","type":"io.example.unknown.v1","data":{}}`))
	f.Add([]byte(`{"specversion":"1.0","id":"x","source":"s","type":"` + TypeFetched + `","data":"not an object"}`))
	f.Add([]byte("not json"))
	// Trace contexts, good and bad: never a reason to refuse a message.
	valid := `{"specversion":"1.0","id":"x","source":"s","type":"` + TypeDeleted + `","datacontenttype":"application/json",` +
		`"data":{"job":{"id":"j","object":{"kind":"GitRepository","namespace":"n","name":"o"}}},`
	f.Add([]byte(valid + `"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","tracestate":"a=b"}`))
	f.Add([]byte(valid + `"traceparent":"00-zz-zz-zz","tracestate":"=,="}`))
	f.Add([]byte(valid + `"traceparent":{"nested":true}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := Decode(body)
		if err != nil {
			return
		}
		_ = m.TraceContext(context.Background()) // must not panic, whatever it carries
		again, err := Encode("fuzz", m.Event.Type(), m.Event.ID(), m.Event.Subject(), m.Data)
		if err != nil {
			t.Fatalf("a decoded %s does not encode: %v", m.Event.Type(), err)
		}
		m2, err := Decode(again)
		if err != nil {
			t.Fatalf("a re-encoded %s does not decode: %v", m.Event.Type(), err)
		}
		a, _ := json.Marshal(m.Data)
		b, _ := json.Marshal(m2.Data)
		if m2.Event.Type() != m.Event.Type() || m2.Event.ID() != m.Event.ID() || !bytes.Equal(a, b) {
			t.Fatalf("round trip changed the message: %s %s %s, then %s %s %s", m.Event.Type(), m.Event.ID(), a,
				m2.Event.Type(), m2.Event.ID(), b)
		}
	})
}
