package sourcekit

import (
	"crypto/rand"
	"testing"
	"time"

	"github.com/headwater-gitops/headwater/pkg/storage"
)

// BenchmarkUnchangedCheck is a steady plug-in source's job: a 4 MiB
// artifact stored on directory storage, a Fetch that answers unchanged
// (a 304), a quiet job (nothing is published). It reports the bytes of
// the stored artifact read per job besides the time: with the kit's
// default -artifact-verify-interval ("verified"), and with 0, which reads
// the artifact at every check, as the kit did before it kept
// storage.Verified ("read-every-time").
func BenchmarkUnchangedCheck(b *testing.B) {
	content := make([]byte, 4<<20)
	if _, err := rand.Read(content); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name     string
		interval time.Duration
	}{{"verified", storage.DefaultVerifyInterval}, {"read-every-time", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			s := newSteady(b, content, bc.interval)
			for b.Loop() {
				if err := s.check(); err != nil {
					b.Fatal(err)
				}
			}
			if s.fetches == 0 || s.notOffered != 0 {
				b.Fatalf("%d fetches, %d without the intact artifact as Previous", s.fetches, s.notOffered)
			}
			b.ReportMetric(float64(s.store.read.Load())/float64(s.fetches), "B-read/op")
		})
	}
}
