package bench

import (
	"strings"
	"testing"
)

func TestMemorySlope(t *testing.T) {
	s := MemorySlope{
		{Sources: 1000, PSS: 180 * mib, Anon: 80 * mib},
		{Sources: 2000, PSS: 190 * mib, Anon: 88 * mib},
		{Sources: 10000, PSS: 270 * mib, Anon: 160 * mib},
	}
	for _, tt := range []struct {
		from, to int
		want     float64
		ok       bool
	}{
		{1000, 2000, 10 * mib, true},
		{1000, 10000, 10 * mib, true}, // 90 MiB over 9,000 sources
		{2000, 10000, 10 * mib, true},
		{1000, 1000, 0, false},
		{1000, 5000, 0, false},
	} {
		got, ok := s.PerThousand(tt.from, tt.to)
		if ok != tt.ok || got != tt.want {
			t.Errorf("PerThousand(%d, %d) = %v MiB, %v; want %v MiB, %v", tt.from, tt.to, got/mib, ok, tt.want/mib, tt.ok)
		}
	}
	shrank := MemorySlope{{Sources: 1000, PSS: 100 * mib}, {Sources: 3000, PSS: 90 * mib}}
	if got, ok := shrank.Slope(); !ok || got != -5*mib {
		t.Errorf("Slope of a shrinking system = %v MiB, %v; want -5 MiB", got/mib, ok)
	}
	if _, ok := (MemorySlope{{Sources: 1000, PSS: mib}}).Slope(); ok {
		t.Error("Slope of one point: ok")
	}
	want := "PSS 180 MiB (anon 80) at 1000, 190 MiB (anon 88) at 2000 (+10.0 MiB per 1,000 from 1000), 270 MiB (anon 160) at 10000 (+10.0 MiB per 1,000 from 1000)"
	if got := s.String(); got != want {
		t.Errorf("String = %q, want %q", got, want)
	}

	flux := &Measurement{MemorySlope: MemorySlope{{Sources: 1000, PSS: 100 * mib}, {Sources: 2000, PSS: 120 * mib}}}
	for _, tt := range []struct {
		h    *Measurement
		base *Measurement
		want string
	}{
		{&Measurement{MemorySlope: s}, flux, "memory per 1,000 sources (10.0 vs 20.0 MiB) yes"},
		{&Measurement{MemorySlope: MemorySlope{{Sources: 1000, PSS: 100 * mib}, {Sources: 10000, PSS: 400 * mib}}}, flux,
			"memory per 1,000 sources (33.3 vs 20.0 MiB) no"},
		{&Measurement{}, flux, "memory per 1,000 sources (not measured) no"},
		{&Measurement{MemorySlope: s}, nil, "n/a"},
	} {
		if got := targetES.Met(tt.h, tt.base); got != tt.want {
			t.Errorf("Met = %q, want %q", got, tt.want)
		}
	}
	if got := targetES.String(); got != "memory per 1,000 sources ≤ 1x" {
		t.Errorf("targetES = %q", got)
	}
	var out strings.Builder
	writeDetails(&out, "es", &Measurement{MemorySlope: s})
	if !strings.Contains(out.String(), "memory by Ready sources: PSS 180 MiB") {
		t.Errorf("details lack the points:\n%s", out.String())
	}
}

func TestStagesString(t *testing.T) {
	for in, want := range map[string]string{
		stagesString([]int{1000}):              "1000",
		stagesString([]int{1000, 2000}):        "1000 and 2000",
		stagesString([]int{1000, 2000, 10000}): "1000, 2000 and 10000",
	} {
		if in != want {
			t.Errorf("got %q, want %q", in, want)
		}
	}
}
