package bench

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
)

const mib = 1 << 20

// FluxVersion is the Flux source-controller the benchmark builds and runs
// side by side (hack/build-tools.sh).
const FluxVersion = "v1.9.1"

// Target is what Headwater must reach in a scenario: ratios of its numbers
// to its baseline's measured in the same run (0 sets none), and absolute
// bounds.
type Target struct {
	// Wall, CPU and Memory bound Headwater's wall time, CPU time and
	// memory as ratios of the baseline's: the sums over its processes, NATS
	// included; memory is the peak of the sampled PSS sum
	// (Measurement.PeakPSS).
	Wall, CPU, Memory float64
	// MaxWall bounds Headwater's wall time.
	MaxWall time.Duration
	// MaxRSS bounds single processes' peak RSS, by process name.
	MaxRSS map[string]uint64
	// MaxCounters bounds counters of the measurement, by name.
	MaxCounters map[string]int64
	// CounterRatios bounds counters of the measurement as ratios of the
	// baseline's same counter, by name (CounterAPIRequests: 0.25).
	CounterRatios map[string]float64
	// MemorySlope bounds Headwater's memory per 1,000 sources after the
	// first stage (Measurement.MemorySlope, Slope) as a ratio of the
	// baseline's.
	MemorySlope float64
	// MaxP99 bounds the 99th percentile of the latencies the scenario
	// timed (Measurement.Latency); the table shows its p50 and p99.
	MaxP99 time.Duration
	// MinPackagingMBps bounds from below the packager's rate on the
	// scenario's content (Measurement.PackagingRate), in MB/s.
	MinPackagingMBps float64
	// MaxStarvation bounds the small tenant's time to Ready under another
	// tenant's load as a ratio of its time on the idle system
	// (Measurement.Fairness).
	MaxStarvation float64
}

// Row is one scenario: Headwater's measurement and its baseline's (Flux's,
// or for S3 storage Headwater's on directory storage).
type Row struct {
	// Scenario names the scenario.
	Scenario string
	// Target is what Headwater must reach.
	Target Target
	// Headwater is Headwater's measurement, and HeadwaterErr why it is
	// missing or incomplete.
	Headwater    *Measurement
	HeadwaterErr error
	// BaseName names the baseline ("Flux v1.9.1"); empty when the scenario
	// has none.
	BaseName string
	// Base is the baseline's measurement, and BaseErr why it is missing.
	Base    *Measurement
	BaseErr error
}

// WriteTable writes rows as a markdown table, then the details of each
// measurement.
func WriteTable(w io.Writer, rows []Row) {
	fmt.Fprintln(w)
	fmt.Fprintf(w, "## Headwater vs Flux source-controller %s, side by side\n", FluxVersion)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Both systems ran in this process's run, one after the other, each on a fresh local kube-apiserver and etcd")
	fmt.Fprintln(w, "and the same git server, registry and chart repository, on this machine. Wall: from the first create (or")
	fmt.Fprintln(w, "annotate) until the last object is seen in the awaited state (d: a fixed window). CPU: utime+stime of the")
	fmt.Fprintln(w, "system's processes (Headwater: its services, the receiver in k, the dispatcher in l, and NATS; Flux: source-controller) including waited-for")
	fmt.Fprintln(w, "children. PSS and anon: the peak of the sum of those processes' Pss and Anonymous (smaps_rollup), sampled")
	fmt.Fprintf(w, "every %s (shared pages counted once: what the node holds for them); the memory ratio and target compare PSS.\n", memoryEvery)
	fmt.Fprintln(w, "RSS: the sum of their VmHWM, reset when the scenario starts (an upper bound of their peak together, shared")
	fmt.Fprintln(w, "pages counted in each). Ratios are Headwater / baseline; lower is better.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| scenario | baseline | wall s | CPU s | PSS MiB | anon MiB | RSS MiB | Headwater wall s | CPU s | PSS MiB | anon MiB | RSS MiB | wall ratio | CPU ratio | memory (PSS) ratio | RSS ratio | target | met? |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
	for _, r := range rows {
		base := r.BaseName
		if base == "" {
			base = "none"
		}
		b := numbers(r.Base, r.BaseErr, r.BaseName != "")
		h := numbers(r.Headwater, r.HeadwaterErr, true)
		var wr, cr, pr, rr string
		if r.Base != nil && r.Headwater != nil {
			wr = ratioString(r.Headwater.Wall, r.Base.Wall)
			cr = ratioString(r.Headwater.ServiceCPU(), r.Base.ServiceCPU())
			pr = ratioString(time.Duration(r.Headwater.PeakPSS), time.Duration(r.Base.PeakPSS))
			rr = ratioString(time.Duration(r.Headwater.ServicePeakRSS()), time.Duration(r.Base.ServicePeakRSS()))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			r.Scenario, base, strings.Join(b[:], " | "), strings.Join(h[:], " | "), wr, cr, pr, rr, r.Target.String(), r.Target.Met(r.Headwater, r.Base))
	}
	fmt.Fprintln(w)
	for _, r := range rows {
		if r.Headwater != nil {
			writeDetails(w, r.Scenario+", Headwater", r.Headwater)
		}
		if r.Base != nil {
			writeDetails(w, r.Scenario+", "+r.BaseName, r.Base)
		}
		for _, e := range []error{r.HeadwaterErr, r.BaseErr} {
			if e != nil {
				fmt.Fprintf(w, "- %s: error: %v\n", r.Scenario, e)
			}
		}
	}
}

// numbers formats a measurement's wall, CPU, peak PSS sum, peak
// anonymous sum and peak RSS sum for the table, or says why there is none.
func numbers(m *Measurement, err error, expected bool) [5]string {
	switch {
	case m != nil:
		pss, anon := "-", "-"
		if m.PeakPSS > 0 {
			pss, anon = fmt.Sprintf("%.0f", float64(m.PeakPSS)/mib), fmt.Sprintf("%.0f", float64(m.PeakAnon)/mib)
		}
		return [5]string{fmt.Sprintf("%.1f", m.Wall.Seconds()), fmt.Sprintf("%.1f", m.ServiceCPU().Seconds()),
			pss, anon, fmt.Sprintf("%.0f", float64(m.ServicePeakRSS())/mib)}
	case err != nil:
		return [5]string{"failed"}
	case expected:
		return [5]string{"not run"}
	}
	return [5]string{}
}

// ratioString is a / b to two digits, "-" when b is zero.
func ratioString(a, b time.Duration) string {
	if b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", float64(a)/float64(b))
}

// String describes the target.
func (t Target) String() string {
	var parts []string
	ratio := func(what string, f float64) {
		if f > 0 {
			parts = append(parts, fmt.Sprintf("%s ≤ %.2gx", what, f))
		}
	}
	ratio("wall", t.Wall)
	ratio("CPU", t.CPU)
	ratio("memory", t.Memory)
	if t.MaxWall > 0 {
		parts = append(parts, fmt.Sprintf("wall ≤ %s", t.MaxWall))
	}
	for _, name := range slices.Sorted(maps.Keys(t.MaxRSS)) {
		parts = append(parts, fmt.Sprintf("%s ≤ %s", name, bytesString(t.MaxRSS[name])))
	}
	for _, name := range slices.Sorted(maps.Keys(t.MaxCounters)) {
		parts = append(parts, fmt.Sprintf("%s ≤ %d", name, t.MaxCounters[name]))
	}
	for _, name := range slices.Sorted(maps.Keys(t.CounterRatios)) {
		ratio(name, t.CounterRatios[name])
	}
	ratio("memory per 1,000 sources", t.MemorySlope)
	if t.MaxP99 > 0 {
		parts = append(parts, fmt.Sprintf("p99 ≤ %s", t.MaxP99))
	}
	if t.MinPackagingMBps > 0 {
		parts = append(parts, fmt.Sprintf("packaging ≥ %.0f MB/s", t.MinPackagingMBps))
	}
	if t.MaxStarvation > 0 {
		parts = append(parts, fmt.Sprintf("small tenant loaded ≤ %gx idle", t.MaxStarvation))
	}
	if len(parts) == 0 {
		return "none set"
	}
	return strings.Join(parts, ", ")
}

// Met says, per targeted quantity, whether h meets the target against
// base.
func (t Target) Met(h, base *Measurement) string {
	if h == nil {
		return "n/a"
	}
	var parts []string
	check := func(what string, ok bool) {
		verdict := "no"
		if ok {
			verdict = "yes"
		}
		parts = append(parts, what+" "+verdict)
	}
	if base != nil {
		if t.Wall > 0 {
			check("wall", float64(h.Wall) <= t.Wall*float64(base.Wall))
		}
		if t.CPU > 0 {
			check("CPU", float64(h.ServiceCPU()) <= t.CPU*float64(base.ServiceCPU()))
		}
		if t.Memory > 0 {
			if h.PeakPSS == 0 || base.PeakPSS == 0 {
				check("memory (PSS not sampled)", false)
			} else {
				check("memory", float64(h.PeakPSS) <= t.Memory*float64(base.PeakPSS))
			}
		}
		for _, name := range slices.Sorted(maps.Keys(t.CounterRatios)) {
			hn, hok := h.Counters[name]
			bn, bok := base.Counters[name]
			check(fmt.Sprintf("%s (%d vs %d)", name, hn, bn), hok && bok && float64(hn) <= t.CounterRatios[name]*float64(bn))
		}
		if t.MemorySlope > 0 {
			hs, hok := h.MemorySlope.Slope()
			bs, bok := base.MemorySlope.Slope()
			if hok && bok {
				check(fmt.Sprintf("memory per 1,000 sources (%.1f vs %.1f MiB)", hs/mib, bs/mib), hs <= t.MemorySlope*bs)
			} else {
				check("memory per 1,000 sources (not measured)", false)
			}
		}
	}
	if t.MaxWall > 0 {
		check("wall", h.Wall <= t.MaxWall)
	}
	for _, name := range slices.Sorted(maps.Keys(t.MaxRSS)) {
		peak, found := uint64(0), false
		for _, u := range h.Usage {
			if u.Name == name {
				peak, found = u.PeakRSS, true
			}
		}
		check(name, found && peak <= t.MaxRSS[name])
	}
	for _, name := range slices.Sorted(maps.Keys(t.MaxCounters)) {
		n, found := h.Counters[name]
		check(name, found && n <= t.MaxCounters[name])
	}
	if t.MaxP99 > 0 {
		if l := h.Latency; l != nil {
			check(fmt.Sprintf("p99 (p50 %.2f s, p99 %.2f s)", l.P50.Seconds(), l.P99.Seconds()), l.P99 <= t.MaxP99)
		} else {
			check("p99 (not measured)", false)
		}
	}
	if t.MinPackagingMBps > 0 {
		if rate := h.PackagingRate(); rate > 0 {
			check(fmt.Sprintf("packaging (%.0f MB/s)", rate/1e6), rate/1e6 >= t.MinPackagingMBps)
		} else {
			check("packaging (not measured)", false)
		}
	}
	if t.MaxStarvation > 0 {
		what := "small tenant: Headwater " + h.Fairness.String()
		if base != nil {
			what += "; baseline " + base.Fairness.String()
		}
		check(what, h.Fairness != nil && h.Fairness.Ratio() > 0 && h.Fairness.Ratio() <= t.MaxStarvation)
	}
	if len(parts) == 0 {
		return "n/a"
	}
	return strings.Join(parts, ", ")
}

// writeDetails lists what each process used and what the services did.
func writeDetails(w io.Writer, scenario string, m *Measurement) {
	head := fmt.Sprintf("%s: wall %.1f s (apply %.1f s)", scenario, m.Wall.Seconds(), m.Apply.Seconds())
	if m.ArtifactBytes > 0 {
		head += fmt.Sprintf(", artifact %s", bytesString(uint64(m.ArtifactBytes)))
	}
	if rate := m.PackagingRate(); rate > 0 {
		head += fmt.Sprintf(", packaged at %.0f MB/s (%s of content over the packager's busy time)", rate/1e6, bytesString(uint64(m.ContentBytes)))
	}
	fmt.Fprintln(w, "- "+head)
	var cp Usage
	for _, u := range m.Usage {
		line := fmt.Sprintf("%s: CPU %.1f s, peak RSS %.0f MiB", u.Name, u.CPU.Seconds(), float64(u.PeakRSS)/mib)
		if u.PeakSinceStart {
			line += " (peak since process start)"
		}
		if u.PeakPSS > 0 {
			line += fmt.Sprintf(", peak PSS %.0f MiB, peak anon %.0f MiB", float64(u.PeakPSS)/mib, float64(u.PeakAnon)/mib)
		}
		switch u.Role {
		case RoleControlPlane:
			cp.CPU += u.CPU
			cp.PeakRSS += u.PeakRSS
		case RoleStorage:
			line = "storage " + line
		case RoleBench:
			if u.Name == "bench process" {
				line = fmt.Sprintf("bench process (git server, load generator, NATS when embedded): CPU %.1f s + git http-backend children %.1f s, peak RSS %.0f MiB",
					(u.CPU - u.ChildrenCPU).Seconds(), u.ChildrenCPU.Seconds(), float64(u.PeakRSS)/mib)
			} else {
				line = "upstream " + line
			}
		}
		for _, typ := range slices.Sorted(maps.Keys(m.Jobs[u.Name])) {
			j := m.Jobs[u.Name][typ]
			line += fmt.Sprintf("; %s %.0f jobs, busy %.1f s (mean %s)", typ, j.Count, j.Busy.Seconds(), meanString(j))
		}
		if b := u.Bus; b != nil {
			line += fmt.Sprintf("; bus: sent %d messages (%s), received %d (%s)",
				b.InMsgs, bytesString(uint64(max(b.InBytes, 0))), b.OutMsgs, bytesString(uint64(max(b.OutBytes, 0))))
		}
		fmt.Fprintln(w, "  - "+line)
	}
	writeShards(w, m)
	if cp.CPU > 0 {
		fmt.Fprintf(w, "  - kube-apiserver + etcd: CPU %.1f s, peak RSS %.0f MiB\n", cp.CPU.Seconds(), float64(cp.PeakRSS)/mib)
	}
	if l := m.CreatedToReady; l != nil {
		fmt.Fprintf(w, "  - created -> Ready by the API server's timestamps (creationTimestamp -> Ready's lastTransitionTime, whole seconds): %s; first created -> last Ready %.0f s (wall here %.1f s)\n",
			l, m.CreatedToLastReady.Seconds(), m.Wall.Seconds())
	}
	if b := m.Bus; b != nil {
		fmt.Fprintf(w, "  - bus (NATS /varz): in %d messages, %s; out %d messages, %s\n",
			b.InMsgs, bytesString(uint64(max(b.InBytes, 0))), b.OutMsgs, bytesString(uint64(max(b.OutBytes, 0))))
	}
	if line := afterApplyString(m); line != "" {
		fmt.Fprintln(w, "  - "+line)
	}
	if m.CPUs > 0 {
		var ours time.Duration
		for _, u := range m.Usage {
			ours += u.CPU
		}
		// The CPU time runs a little past the wall time (see settle).
		fmt.Fprintf(w, "  - machine: %.1f CPU-s busy of %.1f available (%d CPUs x wall); the processes above %.1f, everything else %.1f\n",
			m.MachineBusy.Seconds(), m.Wall.Seconds()*float64(m.CPUs), m.CPUs, ours.Seconds(), max(0, (m.MachineBusy-ours).Seconds()))
	}
	if len(m.MemorySlope) > 0 {
		fmt.Fprintln(w, "  - memory by Ready sources: "+m.MemorySlope.String())
	}
	if s := m.MemorySampling; s != nil && s.Samples > 0 {
		fmt.Fprintf(w, "  - memory: peak of the sampled sums PSS %.0f MiB, anon %.0f MiB; %d samples every %s, each (every process's smaps_rollup) %s on average, %s at most\n",
			float64(m.PeakPSS)/mib, float64(m.PeakAnon)/mib, s.Samples, s.Every, s.Mean.Round(10*time.Microsecond), s.Max.Round(10*time.Microsecond))
	}
	if n, ok := m.SystemAPIRequests(); ok {
		var parts []string
		for _, agent := range slices.Sorted(maps.Keys(m.APIRequestsByAgent)) {
			parts = append(parts, fmt.Sprintf("%s %d", agent, m.APIRequestsByAgent[agent]))
		}
		fmt.Fprintf(w, "  - API server requests (audit log) by user agent: %s; the system's %d\n", strings.Join(parts, ", "), n)
	}
	if len(m.APIRequests) > 0 {
		fmt.Fprintln(w, "  - controller API requests: "+apiRequestsString(m.APIRequests))
	}
	if len(m.JobResults) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(m.JobResults)) {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, m.JobResults[k]))
		}
		fmt.Fprintln(w, "  - job results other than success: "+strings.Join(parts, ", "))
	}
	if len(m.Counters) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(m.Counters)) {
			parts = append(parts, fmt.Sprintf("%s %d", k, m.Counters[k]))
		}
		fmt.Fprintln(w, "  - counted: "+strings.Join(parts, ", "))
	}
	for _, n := range m.Notes {
		fmt.Fprintln(w, "  - note: "+n)
	}
}

// afterApplyString says what the API server spent on the system's own
// requests once the load generator stopped writing (AfterApply), per
// request and per created source; "" when not measured.
func afterApplyString(m *Measurement) string {
	a := m.AfterApply
	if a == nil || m.CreatedToReady == nil || m.CreatedToReady.N == 0 {
		return ""
	}
	n := float64(m.CreatedToReady.N)
	var total float64
	for _, v := range a.Requests {
		total += v
	}
	line := fmt.Sprintf("API server after the apply (%.1f s, only the system's requests and the benchmark's one watch): kube-apiserver CPU %.1f s, etcd %.1f s; the controller's requests %s",
		a.Wall.Seconds(), a.APIServerCPU.Seconds(), a.EtcdCPU.Seconds(), apiRequestsString(a.Requests))
	if total > 0 {
		line += fmt.Sprintf(" (%.0f, %.0f writes): %.2f ms of kube-apiserver CPU per request", total, a.Writes(), a.APIServerCPU.Seconds()*1000/total)
	}
	var whole time.Duration
	for _, u := range m.Usage {
		if u.Name == "kube-apiserver" {
			whole = u.CPU
		}
	}
	return line + fmt.Sprintf("; per created source: %.2f ms after the apply, %.2f ms over the whole window (the creates included)",
		a.APIServerCPU.Seconds()*1000/n, whole.Seconds()*1000/n)
}

// apiRequestsString sums requests by method, naming the status codes
// other than 2xx: "GET 1000, PATCH 5482 (409: 12)".
func apiRequestsString(reqs map[string]float64) string {
	total := map[string]float64{}
	odd := map[string][]string{}
	for _, k := range slices.Sorted(maps.Keys(reqs)) {
		method, code, _ := strings.Cut(k, "/")
		total[method] += reqs[k]
		if !strings.HasPrefix(code, "2") {
			odd[method] = append(odd[method], fmt.Sprintf("%s: %.0f", code, reqs[k]))
		}
	}
	var parts []string
	for _, method := range slices.Sorted(maps.Keys(total)) {
		p := fmt.Sprintf("%s %.0f", method, total[method])
		if len(odd[method]) > 0 {
			p += " (" + strings.Join(odd[method], ", ") + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}

func meanString(j JobStat) string {
	if j.Count == 0 {
		return "-"
	}
	return (time.Duration(float64(j.Busy) / j.Count)).Round(100 * time.Microsecond).String()
}

// bytesString prints a size in MiB, or GiB from 1 GiB.
func bytesString(n uint64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.3g GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.3g MiB", float64(n)/mib)
}

// writeShards lists what each watcher shard's process used, in total and
// per source it owns, and with several shards their sum.
func writeShards(w io.Writer, m *Measurement) {
	if len(m.Shards) == 0 {
		return
	}
	var sum Usage
	sumReqs := map[string]float64{}
	var sumBus BusTraffic
	sources := 0
	for _, sh := range m.Shards {
		var u Usage
		for _, v := range m.Usage {
			if v.Name == sh.Process {
				u = v
			}
		}
		reqs := m.APIRequestsByProcess[sh.Process]
		fmt.Fprintf(w, "  - shard %s (%s, -watch-label-selector=%s, %d sources): %s\n",
			sh.Name, sh.Process, sh.Selector, sh.Sources, shardCost(u, reqs, sh.Sources))
		sum.CPU += u.CPU
		sum.PeakRSS += u.PeakRSS
		sum.PeakPSS += u.PeakPSS
		if u.Bus != nil {
			sumBus.InMsgs += u.Bus.InMsgs
			sumBus.OutMsgs += u.Bus.OutMsgs
			sumBus.InBytes += u.Bus.InBytes
			sumBus.OutBytes += u.Bus.OutBytes
			sum.Bus = &sumBus
		}
		for k, v := range reqs {
			sumReqs[k] += v
		}
		sources += sh.Sources
	}
	if len(m.Shards) > 1 {
		fmt.Fprintf(w, "  - the %d shards together (%d sources): %s\n", len(m.Shards), sources, shardCost(sum, sumReqs, sources))
	}
}

// shardCost is one shard's (or the shards' sum's) CPU, memory, API
// requests and bus messages, in total and per source of n.
func shardCost(u Usage, reqs map[string]float64, n int) string {
	per := func(v float64) float64 { return v / float64(max(n, 1)) }
	var total float64
	for _, v := range reqs {
		total += v
	}
	line := fmt.Sprintf("CPU %.2f s (%.2f ms per source), peak RSS %.0f MiB, peak PSS %.0f MiB; API requests %.0f (%.2f per source: %s)",
		u.CPU.Seconds(), per(u.CPU.Seconds()*1000), float64(u.PeakRSS)/mib, float64(u.PeakPSS)/mib, total, per(total), apiRequestsString(reqs))
	if b := u.Bus; b != nil {
		line += fmt.Sprintf("; bus: sent %d messages (%.2f per source, %s), received %d (%.2f per source, %s)",
			b.InMsgs, per(float64(b.InMsgs)), bytesString(uint64(max(b.InBytes, 0))),
			b.OutMsgs, per(float64(b.OutMsgs)), bytesString(uint64(max(b.OutBytes, 0))))
	}
	return line
}
