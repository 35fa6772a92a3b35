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

// Reference is what Flux source-controller v1.9 measured in a scenario on
// this kind of machine (2 cores, local API server, local git server). A
// zero field was not measured.
type Reference struct {
	// Wall is the elapsed time.
	Wall time.Duration
	// CPU is the controller's CPU time.
	CPU time.Duration
	// PeakRSS is the controller's peak memory in bytes.
	PeakRSS uint64
}

// The reference numbers of Flux source-controller v1.9.
var (
	// FluxManySmall: 1000 GitRepositories over 10 small repositories.
	FluxManySmall = Reference{Wall: 61 * time.Second, CPU: 66 * time.Second, PeakRSS: 126 * mib}
	// FluxLargeTree: one repository with a 256 MiB tree.
	FluxLargeTree = Reference{Wall: 19700 * time.Millisecond}
	// FluxHelmIndex: one 48 MiB Helm repository index.
	FluxHelmIndex = Reference{PeakRSS: 1280 * mib}
	// FluxManyOCI: 1000 OCIRepositories, from Flux's own benchmark of
	// Flux 2.8 on a 16-core runner (not measured here).
	FluxManyOCI = Reference{Wall: 85 * time.Second, PeakRSS: 67 * mib}
)

// Headwater's targets: a quarter of Flux's times, a tenth of its memory.
const (
	timeFactor   = 4
	memoryFactor = 10
)

// Row is one line of the table.
type Row struct {
	// Scenario names the scenario.
	Scenario string
	// Flux is the reference.
	Flux Reference
	// Measured is Headwater's measurement, nil if there is none.
	Measured *Measurement
	// Status replaces the numbers when there are none ("not
	// implemented", a failure).
	Status string
}

// WriteTable writes rows as a markdown table, then the details of each
// measured row.
func WriteTable(w io.Writer, rows []Row) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "## Headwater vs Flux source-controller v1.9")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Flux could not be built here: its column holds reference numbers measured earlier on this kind of machine")
	fmt.Fprintln(w, "(2 cores, local API server, local git server), not numbers from this run. Targets: a quarter of Flux's")
	fmt.Fprintln(w, "times (wall and CPU), a tenth of its memory. Wall: from the first create (or annotate) until the last object")
	fmt.Fprintln(w, "is seen in the awaited state. CPU: utime+stime of the four service processes over that interval. Peak RSS:")
	fmt.Fprintln(w, "sum of the four services' VmHWM, reset when the scenario starts (an upper bound of their peak together).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| scenario | Headwater wall s | Headwater CPU s | Headwater peak RSS MiB (sum of services) | Flux v1.9 reference | target | met? |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---|---|---|")
	for _, r := range rows {
		wall, cpu, rss, met := r.Status, "", "", "n/a"
		if r.Measured != nil {
			wall = fmt.Sprintf("%.1f", r.Measured.Wall.Seconds())
			cpu = fmt.Sprintf("%.1f", r.Measured.ServiceCPU().Seconds())
			rss = fmt.Sprintf("%.0f", float64(r.Measured.ServicePeakRSS())/mib)
			met = r.Flux.met(r.Measured)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", r.Scenario, wall, cpu, rss, r.Flux, r.Flux.target(), met)
	}
	fmt.Fprintln(w)
	for _, r := range rows {
		if r.Measured != nil {
			writeDetails(w, r.Scenario, r.Measured)
		}
	}
}

// String describes the reference numbers.
func (r Reference) String() string {
	var parts []string
	if r.Wall > 0 {
		parts = append(parts, fmt.Sprintf("%.3g s", r.Wall.Seconds()))
	}
	if r.CPU > 0 {
		parts = append(parts, fmt.Sprintf("%.3g CPU-s", r.CPU.Seconds()))
	}
	if r.PeakRSS > 0 {
		parts = append(parts, "peak "+bytesString(r.PeakRSS))
	}
	if len(parts) == 0 {
		return "not measured"
	}
	return strings.Join(parts, ", ")
}

// target describes Headwater's target for the scenario.
func (r Reference) target() string {
	var parts []string
	if r.Wall > 0 {
		parts = append(parts, fmt.Sprintf("≤ %.3g s", r.Wall.Seconds()/timeFactor))
	}
	if r.CPU > 0 {
		parts = append(parts, fmt.Sprintf("≤ %.3g CPU-s", r.CPU.Seconds()/timeFactor))
	}
	if r.PeakRSS > 0 {
		parts = append(parts, "≤ "+bytesString(r.PeakRSS/memoryFactor))
	}
	if len(parts) == 0 {
		return "none set"
	}
	return strings.Join(parts, ", ")
}

// met says, per targeted quantity, whether m meets the target.
func (r Reference) met(m *Measurement) string {
	var parts []string
	check := func(what string, set bool, ok bool) {
		if !set {
			return
		}
		verdict := "no"
		if ok {
			verdict = "yes"
		}
		parts = append(parts, what+" "+verdict)
	}
	check("wall", r.Wall > 0, m.Wall <= r.Wall/timeFactor)
	check("CPU", r.CPU > 0, m.ServiceCPU() <= r.CPU/timeFactor)
	check("RSS", r.PeakRSS > 0, m.ServicePeakRSS() <= r.PeakRSS/memoryFactor)
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
	fmt.Fprintln(w, "- "+head)
	var cp Usage
	for _, u := range m.Usage {
		line := fmt.Sprintf("%s: CPU %.1f s, peak RSS %.0f MiB", u.Name, u.CPU.Seconds(), float64(u.PeakRSS)/mib)
		if u.PeakSinceStart {
			line += " (peak since process start)"
		}
		switch u.Role {
		case RoleControlPlane:
			cp.CPU += u.CPU
			cp.PeakRSS += u.PeakRSS
		case RoleBench:
			line = fmt.Sprintf("bench process (embedded NATS, git server, load generator): CPU %.1f s + git http-backend children %.1f s, peak RSS %.0f MiB",
				(u.CPU - u.ChildrenCPU).Seconds(), u.ChildrenCPU.Seconds(), float64(u.PeakRSS)/mib)
		}
		for _, typ := range slices.Sorted(maps.Keys(m.Jobs[u.Name])) {
			j := m.Jobs[u.Name][typ]
			line += fmt.Sprintf("; %s %.0f jobs, busy %.1f s (mean %s)", typ, j.Count, j.Busy.Seconds(), meanString(j))
		}
		fmt.Fprintln(w, "  - "+line)
	}
	if cp.CPU > 0 {
		fmt.Fprintf(w, "  - kube-apiserver + etcd: CPU %.1f s, peak RSS %.0f MiB\n", cp.CPU.Seconds(), float64(cp.PeakRSS)/mib)
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
	if len(m.APIRequests) > 0 {
		fmt.Fprintln(w, "  - watcher API requests: "+apiRequestsString(m.APIRequests))
	}
	if len(m.JobResults) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(m.JobResults)) {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, m.JobResults[k]))
		}
		fmt.Fprintln(w, "  - job results other than success: "+strings.Join(parts, ", "))
	}
	for _, n := range m.Notes {
		fmt.Fprintln(w, "  - note: "+n)
	}
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
