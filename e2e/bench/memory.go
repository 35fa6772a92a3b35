package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// memoryEvery is how often a measurement samples the memory of the
// system's processes. Reading smaps_rollup walks every mapping of a process
// under its mmap lock, so the rate is modest; MemorySampling reports what
// the readings cost.
const memoryEvery = 500 * time.Millisecond

// memoryUse is what /proc/<pid>/smaps_rollup says of a process, in bytes.
type memoryUse struct {
	// PSS is the proportional set size: the resident pages, each page
	// shared with other processes (the text of one binary run twice, the
	// page cache of a file both map) divided among them, so the PSS of
	// processes adds up to what they hold together.
	PSS uint64
	// Anon is the resident anonymous memory (heap, stacks, Go's arenas):
	// what the kernel cannot drop or share.
	Anon uint64
}

// parseSmapsRollup reads the Pss and Anonymous lines of a smaps_rollup
// text (proc(5)), which the kernel writes in kB.
func parseSmapsRollup(text string) (memoryUse, error) {
	var u memoryUse
	var seen int
	for line := range strings.Lines(text) {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		var dst *uint64
		switch name {
		case "Pss":
			dst = &u.PSS
		case "Anonymous":
			dst = &u.Anon
		default:
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return memoryUse{}, fmt.Errorf("smaps_rollup: %s: %q is not a size in kB", name, strings.TrimSpace(rest))
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return memoryUse{}, fmt.Errorf("smaps_rollup: %s: %w", name, err)
		}
		*dst = kb << 10
		seen++
	}
	if seen != 2 {
		return memoryUse{}, fmt.Errorf("smaps_rollup: no Pss or no Anonymous line (%d of 2 found)", seen)
	}
	return u, nil
}

// readSmapsRollup reads a process's smaps_rollup.
func readSmapsRollup(pid int) (memoryUse, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return memoryUse{}, fmt.Errorf("process %d: %w", pid, err)
	}
	u, err := parseSmapsRollup(string(b))
	if err != nil {
		return memoryUse{}, fmt.Errorf("process %d: %w", pid, err)
	}
	return u, nil
}

// memoryPeaks keeps the peaks of memory samples. A sample reads every
// process once, a few milliseconds apart: its sum is what the processes
// held together at that moment. The peak of the sums is what the node had
// to hold for them at once, which the sum of each process's own peak (as
// the peak RSS columns add up) overstates when the processes peak at
// different times.
type memoryPeaks struct {
	// samples is the number of complete samples added.
	samples int
	// pss and anon are the peaks of the sampled sums.
	pss, anon uint64
	// each holds each process's own peaks, in the order of the samples.
	each []memoryUse
}

// add takes one sample: the use of each process, in the same order every
// time.
func (p *memoryPeaks) add(sample []memoryUse) {
	if len(p.each) < len(sample) {
		p.each = append(p.each, make([]memoryUse, len(sample)-len(p.each))...)
	}
	var sum memoryUse
	for i, u := range sample {
		sum.PSS += u.PSS
		sum.Anon += u.Anon
		p.each[i].PSS = max(p.each[i].PSS, u.PSS)
		p.each[i].Anon = max(p.each[i].Anon, u.Anon)
	}
	p.pss = max(p.pss, sum.PSS)
	p.anon = max(p.anon, sum.Anon)
	p.samples++
}

// MemorySampling says how the memory of a measurement's processes was
// sampled, and what it cost.
type MemorySampling struct {
	// Samples is the number of complete samples (every process read).
	Samples int
	// Every is the interval between samples.
	Every time.Duration
	// Mean and Max are the wall time of one sample (every process's
	// smaps_rollup read once), spent in the benchmark process.
	Mean, Max time.Duration
	// Failed is the number of samples left out because a read failed (a
	// process had exited), and Err the last failure.
	Failed int
	Err    error
}

// memorySampler samples the memory of a fixed set of processes from the
// moment it starts until finish.
type memorySampler struct {
	pids  []int
	every time.Duration

	mu    sync.Mutex
	peaks memoryPeaks
	stats MemorySampling
	total time.Duration

	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// startMemorySampler samples pids at once and then every interval until
// finish is called or ctx ends.
func startMemorySampler(ctx context.Context, pids []int, every time.Duration) *memorySampler {
	s := &memorySampler{pids: pids, every: every, stop: make(chan struct{}), done: make(chan struct{})}
	s.stats.Every = every
	s.sample()
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				s.sample()
			case <-s.stop:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return s
}

// sample reads every process once and adds the sample, unless a read
// failed.
func (s *memorySampler) sample() {
	start := time.Now()
	uses := make([]memoryUse, len(s.pids))
	var err error
	for i, pid := range s.pids {
		if uses[i], err = readSmapsRollup(pid); err != nil {
			break
		}
	}
	took := time.Since(start)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.stats.Failed++
		s.stats.Err = err
		return
	}
	s.peaks.add(uses)
	s.stats.Samples++
	s.total += took
	s.stats.Max = max(s.stats.Max, took)
}

// finish takes a last sample, stops sampling and returns the peaks and
// what sampling cost.
func (s *memorySampler) finish() (memoryPeaks, MemorySampling) {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
	s.sample()
	s.mu.Lock()
	defer s.mu.Unlock()
	stats := s.stats
	if stats.Samples > 0 {
		stats.Mean = s.total / time.Duration(stats.Samples)
	}
	peaks := s.peaks
	peaks.each = append([]memoryUse(nil), s.peaks.each...)
	return peaks, stats
}
