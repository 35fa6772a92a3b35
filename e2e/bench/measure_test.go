package bench

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestDiff(t *testing.T) {
	got := diff(map[string]float64{"GET": 10, "PATCH": 4}, map[string]float64{"GET": 10, "PATCH": 9, "POST": 2})
	if len(got) != 2 || got["PATCH"] != 5 || got["POST"] != 2 {
		t.Errorf("diff = %v, want PATCH 5 and POST 2 only", got)
	}
}

func TestShortType(t *testing.T) {
	for in, want := range map[string]string{
		"io.headwater.job.fetch.requested.v1":   "fetch.requested",
		"io.headwater.job.package.succeeded.v1": "package.succeeded",
		"io.headwater.artifact.stored.v1":       "artifact.stored",
		"other":                                 "other",
	} {
		if got := shortType(in); got != want {
			t.Errorf("shortType(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestProcReadings(t *testing.T) {
	pid := os.Getpid()
	before, err := procCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	// Burn some CPU so the counter must move (it counts 10 ms ticks).
	deadline := time.Now().Add(200 * time.Millisecond)
	x := 0
	for time.Now().Before(deadline) {
		x++
	}
	after, err := procCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	if after.total() <= before.total() {
		t.Errorf("CPU time did not grow: %v then %v (loops %d)", before, after, x)
	}
	peak, err := peakRSS(pid)
	if err != nil {
		t.Fatal(err)
	}
	st, err := procStatus(pid, "VmRSS")
	if err != nil {
		t.Fatal(err)
	}
	if peak == 0 || peak < st["VmRSS"]/2 {
		t.Errorf("peak RSS %d implausible beside RSS %d", peak, st["VmRSS"])
	}
	busy, cpus, err := machineCPU()
	if err != nil {
		t.Fatal(err)
	}
	if cpus < 1 || busy < after.own {
		t.Errorf("machine: %d CPUs, %v busy, less than this process's %v", cpus, busy, after.own)
	}
	if _, err := procCPU(-1); err == nil {
		t.Error("procCPU of a missing process: no error")
	}
}

func TestAPIRequestsString(t *testing.T) {
	got := apiRequestsString(map[string]float64{"PATCH/200": 10, "PATCH/409": 2, "GET/200": 5, "POST/201": 1})
	if want := "GET 5, PATCH 12 (409: 2), POST 1"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestMet(t *testing.T) {
	m := &Measurement{Wall: 10 * time.Second, Usage: []Usage{
		{Name: "watcher", Role: RoleService, CPU: 5 * time.Second, PeakRSS: 40 * mib},
		{Name: "fetcher", Role: RoleService, CPU: 5 * time.Second, PeakRSS: 40 * mib},
		{Name: "etcd", Role: RoleControlPlane, CPU: 50 * time.Second, PeakRSS: 400 * mib},
	}, Counters: map[string]int64{CounterGitFetches: 10, CounterSourceWrites: 1, CounterAPIRequests: 100},
		PeakPSS: 60 * mib, PeakAnon: 30 * mib}
	if got := m.ServiceCPU(); got != 10*time.Second {
		t.Errorf("ServiceCPU = %v, want 10s (control plane excluded)", got)
	}
	flux := &Measurement{Wall: 60 * time.Second, Usage: []Usage{
		{Name: FluxSourceController, Role: RoleService, CPU: 30 * time.Second, PeakRSS: 70 * mib},
	}, Counters: map[string]int64{CounterAPIRequests: 500}, PeakPSS: 65 * mib, PeakAnon: 40 * mib}
	// Memory compares the PSS sums (60 vs 65 MiB), not the RSS sums (80 vs 70).
	unsampled := *flux
	unsampled.PeakPSS = 0
	tests := []struct {
		target Target
		base   *Measurement
		want   string
	}{
		{targetA, flux, "wall yes, CPU no, memory yes, git fetches yes"},
		{Target{Memory: 0.9}, flux, "memory no"},
		{Target{Memory: 1}, &unsampled, "memory (PSS not sampled) no"},
		{Target{CounterRatios: map[string]float64{CounterAPIRequests: 0.25}}, flux, "API requests (100 vs 500) yes"},
		{Target{CounterRatios: map[string]float64{CounterAPIRequests: 0.1}}, flux, "API requests (100 vs 500) no"},
		{Target{CounterRatios: map[string]float64{CounterGitRequests: 1}}, flux, "git requests (0 vs 0) no"},
		{Target{CounterRatios: map[string]float64{CounterAPIRequests: 0.25}}, nil, "n/a"},
		{Target{Wall: 0.1}, flux, "wall no"},
		{Target{MaxWall: 10 * time.Second, MaxRSS: map[string]uint64{"fetcher": 40 * mib, "packager": mib}}, nil,
			"wall yes, fetcher yes, packager no"},
		{targetD, flux, "CPU yes, memory yes, git fetches no, source writes no"},
		{Target{Wall: 1}, nil, "n/a"},
		{Target{}, flux, "n/a"},
	}
	for _, tt := range tests {
		if got := tt.target.Met(m, tt.base); got != tt.want {
			t.Errorf("%v: Met = %q, want %q", tt.target, got, tt.want)
		}
	}
	if got := targetA.Met(nil, flux); got != "n/a" {
		t.Errorf("Met without a measurement = %q", got)
	}
	// Scenario k's latency target shows the figures in the table.
	hooked := *m
	hooked.Latency = latencyOf("hook", []time.Duration{300 * time.Millisecond, 400 * time.Millisecond, 2500 * time.Millisecond})
	for _, tt := range []struct {
		m    *Measurement
		want string
	}{
		{&hooked, "p99 (p50 0.40 s, p99 2.50 s) no"},
		{m, "p99 (not measured) no"},
	} {
		if got := targetK.Met(tt.m, nil); got != tt.want {
			t.Errorf("targetK.Met = %q, want %q", got, tt.want)
		}
	}
	if got := targetK.String(); got != "p99 ≤ 2s" {
		t.Errorf("targetK = %q", got)
	}
	// Scenario c's packaging target: content over the packager's busy time.
	packaged := *m
	packaged.ContentBytes = 600e6
	packaged.Jobs = map[string]map[string]JobStat{"packager": {"fetch.succeeded": {Count: 1, Busy: 2 * time.Second}}}
	for _, tt := range []struct {
		m    *Measurement
		want string
	}{
		{&packaged, "packaging (300 MB/s) yes"},
		{m, "packaging (not measured) no"},
	} {
		if got := (Target{MinPackagingMBps: 250}).Met(tt.m, nil); got != tt.want {
			t.Errorf("packaging target Met = %q, want %q", got, tt.want)
		}
	}
	var out strings.Builder
	WriteTable(&out, []Row{
		{Scenario: "x", Target: targetA, Headwater: m, BaseName: "Flux " + FluxVersion, Base: flux},
		{Scenario: "y", Target: Target{}, Headwater: m},
		{Scenario: "z", Target: targetB, HeadwaterErr: errors.New("boom"), BaseName: "Flux " + FluxVersion, Base: flux},
	})
	for _, want := range []string{
		"| x | Flux v1.9.1 | 60.0 | 30.0 | 65 | 40 | 70 | 10.0 | 10.0 | 60 | 30 | 80 | 0.17x | 0.33x | 0.92x | 1.14x | wall ≤ 0.25x, CPU ≤ 0.25x, memory ≤ 1x, git fetches ≤ 10 | wall yes, CPU no, memory yes, git fetches yes |",
		"| y | none |  |  |  |  |  | 10.0 | 10.0 | 60 | 30 | 80 |  |  |  |  | none set | n/a |",
		"| z | Flux v1.9.1 | 60.0 | 30.0 | 65 | 40 | 70 | failed |  |  |  |  |  |  |  |  | ",
		"kube-apiserver + etcd: CPU 50.0 s, peak RSS 400 MiB",
		"counted: API requests 100, git fetches 10, source writes 1",
		"z: error: boom",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestLatencyOf(t *testing.T) {
	var samples []time.Duration
	for i := 100; i >= 1; i-- {
		samples = append(samples, time.Duration(i)*time.Millisecond)
	}
	l := latencyOf("x", samples)
	if l.N != 100 || l.P50 != 50*time.Millisecond || l.P99 != 99*time.Millisecond || l.Max != 100*time.Millisecond {
		t.Errorf("latencyOf(1..100 ms) = %+v", l)
	}
	if latencyOf("x", nil) != nil {
		t.Error("latencyOf(no samples) is not nil")
	}
	if one := latencyOf("x", []time.Duration{time.Second}); one.P50 != time.Second || one.P99 != time.Second {
		t.Errorf("latencyOf(one sample) = %+v", one)
	}
}

func TestForEach(t *testing.T) {
	names := make([]string, 100)
	var calls atomic.Int32
	if err := forEach(context.Background(), names, func(context.Context, int, string) error {
		calls.Add(1)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 100 {
		t.Errorf("%d calls, want 100", calls.Load())
	}
	boom := errors.New("boom")
	err := forEach(context.Background(), names, func(_ context.Context, i int, _ string) error {
		if i == 3 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Errorf("err = %v, want boom", err)
	}
}

func TestParseServiceArgs(t *testing.T) {
	got, err := parseServiceArgs("fetcher:-concurrency=8 watcher:-concurrency=8 fetcher:-x")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || len(got["fetcher"]) != 2 || got["watcher"][0] != "-concurrency=8" {
		t.Errorf("got %v", got)
	}
	for _, bad := range []string{"fetcher", "nosuch:-x", "fetcher:x"} {
		if _, err := parseServiceArgs(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestMetFairness: scenario f's target compares the small tenant's loaded
// time with its idle time, and shows the baseline's beside it.
func TestMetFairness(t *testing.T) {
	h := &Measurement{Fairness: &Fairness{Idle: 2 * time.Second, Loaded: 3 * time.Second}}
	flux := &Measurement{Fairness: &Fairness{Idle: time.Second, Loaded: 41 * time.Second}}
	starved := &Measurement{Fairness: &Fairness{Idle: time.Second, Loaded: 53 * time.Second}}
	tests := []struct {
		h, base *Measurement
		want    string
	}{
		{h, flux, "small tenant: Headwater idle 2.00 s, loaded 3.00 s (1.5x); baseline idle 1.00 s, loaded 41.00 s (41.0x) yes"},
		{starved, nil, "small tenant: Headwater idle 1.00 s, loaded 53.00 s (53.0x) no"},
		{&Measurement{}, nil, "small tenant: Headwater not measured no"},
	}
	for _, tt := range tests {
		if got := targetF.Met(tt.h, tt.base); got != tt.want {
			t.Errorf("Met = %q, want %q", got, tt.want)
		}
	}
	if got := targetF.String(); got != "small tenant loaded ≤ 2x idle" {
		t.Errorf("String = %q", got)
	}
}
