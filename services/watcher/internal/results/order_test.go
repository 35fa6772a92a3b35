package results

import (
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// TestOrder checks the per-source order: an older job is superseded once
// a newer one is written, not before; entries of sources with nothing
// written go with their last user, written ones with forget.
func TestOrder(t *testing.T) {
	var o order
	t0 := time.Date(2026, 12, 4, 20, 0, 0, 0, time.UTC)
	older, newer := t0, t0.Add(time.Second)

	s := o.lock("a")
	if s.superseded(older) {
		t.Error("a job superseded before any outcome was written")
	}
	o.unlock("a", s)
	if n := o.len(); n != 0 {
		t.Errorf("entries after a check that wrote nothing = %d, want 0", n)
	}

	s = o.lock("a")
	s.written(newer)
	o.unlock("a", s)
	s = o.lock("a")
	if !s.superseded(older) || s.superseded(newer) || s.superseded(newer.Add(time.Millisecond)) {
		t.Errorf("after writing %s: superseded(older)=%t, superseded(same)=%t, superseded(later)=%t; want true, false, false",
			newer, s.superseded(older), s.superseded(newer), s.superseded(newer.Add(time.Millisecond)))
	}
	// Writing an older job (a redelivery of one written before the
	// order began) keeps the newest.
	s.written(older)
	if !s.superseded(older) {
		t.Error("writing an older job moved the newest back")
	}
	o.unlock("a", s)
	if s := o.lock("b"); s.superseded(older) {
		t.Error("another source's order leaked")
	} else {
		o.unlock("b", s)
	}
	o.forget("a")
	if n := o.len(); n != 0 {
		t.Errorf("entries after forget = %d, want 0", n)
	}
}

// TestOrderSerializes runs outcomes of one source from many goroutines:
// each sees every write before it, so the newest survives whatever the
// order they run in.
func TestOrderSerializes(t *testing.T) {
	var o order
	const n = 200
	t0 := time.Date(2026, 12, 4, 20, 0, 0, 0, time.UTC)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		written []time.Time
	)
	inside := 0
	for i := range n {
		wg.Go(func() {
			at := t0.Add(time.Duration(i) * time.Millisecond)
			s := o.lock(types.UID("x"))
			defer o.unlock("x", s)
			inside++ // a race the detector reports if lock does not serialize
			if !s.superseded(at) {
				s.written(at)
				mu.Lock()
				written = append(written, at)
				mu.Unlock()
			}
			inside--
		})
	}
	wg.Wait()
	for i := 1; i < len(written); i++ {
		if !written[i].After(written[i-1]) {
			t.Fatalf("write %d (%s) after %s: an older job written after a newer", i, written[i], written[i-1])
		}
	}
	s := o.lock("x")
	defer o.unlock("x", s)
	if want := t0.Add((n - 1) * time.Millisecond); !s.newest.Equal(want) || inside != 0 {
		t.Errorf("newest = %s, want %s", s.newest, want)
	}
}
