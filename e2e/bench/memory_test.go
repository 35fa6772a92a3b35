package bench

import (
	"context"
	"os"
	"testing"
	"time"
)

// rollup is a smaps_rollup of a kernel 6.x, with sizes in kB.
const rollup = `55f1e4a19000-7ffd43037000 ---p 00000000 00:00 0                          [rollup]
Rss:               51200 kB
Pss:               20480 kB
Pss_Dirty:          8192 kB
Pss_Anon:           8000 kB
Pss_File:          12480 kB
Pss_Shmem:             0 kB
Shared_Clean:      40960 kB
Shared_Dirty:          0 kB
Private_Clean:      2048 kB
Private_Dirty:      8192 kB
Referenced:        51200 kB
Anonymous:          8192 kB
KSM:                   0 kB
LazyFree:              0 kB
AnonHugePages:         0 kB
Swap:                  0 kB
SwapPss:               0 kB
Locked:                0 kB
`

func TestParseSmapsRollup(t *testing.T) {
	got, err := parseSmapsRollup(rollup)
	if err != nil {
		t.Fatal(err)
	}
	// Pss, not Pss_Anon or Rss; Anonymous, not AnonHugePages or Pss_Anon.
	if want := (memoryUse{PSS: 20 * mib, Anon: 8 * mib}); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	for name, text := range map[string]string{
		"empty":        "",
		"no Anonymous": "Pss: 4 kB\n",
		"no Pss":       "Pss_Anon: 4 kB\nAnonymous: 4 kB\n",
		"not a number": "Pss: x kB\nAnonymous: 4 kB\n",
		"not kB":       "Pss: 4 MB\nAnonymous: 4 kB\n",
		"no unit":      "Pss: 4\nAnonymous: 4 kB\n",
	} {
		if u, err := parseSmapsRollup(text); err == nil {
			t.Errorf("%s: parsed as %+v without error", name, u)
		}
	}
}

func TestMemoryPeaksArePeaksOfSums(t *testing.T) {
	var p memoryPeaks
	// Two processes that peak at different moments: the sum of their own
	// peaks (100+100) is more than they ever held together (120).
	for _, sample := range [][]memoryUse{
		{{PSS: 100 * mib, Anon: 10 * mib}, {PSS: 20 * mib, Anon: 50 * mib}},
		{{PSS: 30 * mib, Anon: 40 * mib}, {PSS: 100 * mib, Anon: 5 * mib}},
		{{PSS: 50 * mib, Anon: 20 * mib}, {PSS: 50 * mib, Anon: 20 * mib}},
	} {
		p.add(sample)
	}
	if p.samples != 3 {
		t.Errorf("samples = %d, want 3", p.samples)
	}
	if p.pss != 130*mib {
		t.Errorf("peak PSS sum = %d MiB, want 130 (sample 2)", p.pss/mib)
	}
	if p.anon != 60*mib {
		t.Errorf("peak anon sum = %d MiB, want 60 (sample 1)", p.anon/mib)
	}
	want := []memoryUse{{PSS: 100 * mib, Anon: 40 * mib}, {PSS: 100 * mib, Anon: 50 * mib}}
	if len(p.each) != 2 || p.each[0] != want[0] || p.each[1] != want[1] {
		t.Errorf("each process's peaks = %+v, want %+v", p.each, want)
	}
}

func TestMemorySampler(t *testing.T) {
	self := os.Getpid()
	s := startMemorySampler(context.Background(), []int{self, self}, 10*time.Millisecond)
	// Hold 64 MiB more, touched, while the sampler samples.
	ballast := make([]byte, 64*mib)
	for i := range ballast {
		ballast[i] = 1
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		n := s.stats.Samples
		s.mu.Unlock()
		if n >= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	peaks, stats := s.finish()
	ballast[0] = 2 // keep it alive through the last sample
	if stats.Samples < 4 || stats.Failed != 0 || stats.Mean <= 0 || stats.Max < stats.Mean {
		t.Errorf("stats = %+v, want at least 4 samples (first, 3 ticks, last), none failed, a cost", stats)
	}
	// The same process twice, read a moment apart: every sampled sum holds
	// both readings, so the peak sum is at least either's peak and at most
	// their peaks added.
	if len(peaks.each) != 2 || peaks.each[0].Anon < 64*mib || peaks.each[1].Anon < 64*mib {
		t.Fatalf("peaks = %+v, want this process's anon >= 64 MiB in both places", peaks)
	}
	for _, sum := range []struct {
		name       string
		peak, a, b uint64
	}{
		{"PSS", peaks.pss, peaks.each[0].PSS, peaks.each[1].PSS},
		{"anon", peaks.anon, peaks.each[0].Anon, peaks.each[1].Anon},
	} {
		if sum.peak < max(sum.a, sum.b) || sum.peak > sum.a+sum.b {
			t.Errorf("%s: peak of sums %d outside [%d, %d]", sum.name, sum.peak, max(sum.a, sum.b), sum.a+sum.b)
		}
	}

	gone := startMemorySampler(context.Background(), []int{self, -1}, time.Hour)
	if _, stats := gone.finish(); stats.Samples != 0 || stats.Failed != 2 || stats.Err == nil {
		t.Errorf("sampling a missing process: %+v, want 2 failed samples and none taken", stats)
	}
}
