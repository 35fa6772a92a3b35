package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/e2e/promtext"
	"github.com/headwater-gitops/headwater/pkg/events"
)

// Role says which part of the system a measured process is.
type Role int

// The roles, in report order.
const (
	// RoleService is a process of the system under test: one of
	// Headwater's four services or its NATS server, or Flux's
	// source-controller. Their sums are what the systems compare by.
	RoleService Role = iota
	// RoleControlPlane is kube-apiserver or etcd.
	RoleControlPlane
	// RoleStorage is the S3 server (MinIO) Headwater's storage is on, when
	// it is: part of what Headwater needs, reported apart from the services.
	RoleStorage
	// RoleBench is the benchmark process itself (the git server with its
	// git http-backend children, the load generator, and NATS when it is
	// embedded) and the upstream servers it starts (the OCI registry).
	RoleBench
)

// Usage is what one process used during a measurement.
type Usage struct {
	// Name is the service or binary name.
	Name string
	// Role is the part of the system the process is.
	Role Role
	// CPU is user plus system time, including waited-for children.
	CPU time.Duration
	// ChildrenCPU is the part of CPU used by waited-for children.
	ChildrenCPU time.Duration
	// PeakRSS is the resident-set high-water mark (VmHWM) in bytes.
	PeakRSS uint64
	// PeakSinceStart tells that PeakRSS could not be reset when the
	// measurement started, so it may be a peak from before it.
	PeakSinceStart bool
	// PeakPSS and PeakAnon are the highest PSS and anonymous memory of the
	// process's samples (smaps_rollup), for the system's processes only
	// (RoleService); 0 when not sampled.
	PeakPSS, PeakAnon uint64
	// Bus is what the process sent to NATS (In) and NATS delivered to it
	// (Out) over its connections, NATS's /connz counters (acknowledgements
	// and JetStream API requests included); nil when not counted (NATS
	// embedded, or not a service).
	Bus *BusTraffic
}

// JobStat sums one service's handling of one CloudEvent type.
type JobStat struct {
	// Count is how many messages were handled.
	Count float64
	// Busy is the time spent handling them, summed over workers.
	Busy time.Duration
}

// PackagingRate is ContentBytes over the time the packager spent on the
// content it was handed (its busy time on fetch.succeeded jobs: reading
// the staged tar, compressing, hashing and storing), in bytes per second;
// 0 when either is unknown.
func (m *Measurement) PackagingRate() float64 {
	busy := m.Jobs["packager"][shortType(events.TypeFetched)].Busy
	if m.ContentBytes <= 0 || busy <= 0 {
		return 0
	}
	return float64(m.ContentBytes) / busy.Seconds()
}

// Measurement is what one scenario measured, from the moment its objects
// started being applied until the last one reached the awaited state.
type Measurement struct {
	// Wall is the elapsed time.
	Wall time.Duration
	// Apply is how long applying the objects took (included in Wall).
	Apply time.Duration
	// Usage has one entry per measured process.
	Usage []Usage
	// APIRequests are the watcher's Kubernetes API requests by HTTP
	// method and status code, "PATCH/200" (its client-go metrics); with
	// several watcher processes (shards, replicas) their sum.
	APIRequests map[string]float64
	// APIRequestsByProcess are the same requests of each controller
	// process (watcher, watcher-2, ...), by its name.
	APIRequestsByProcess map[string]map[string]float64
	// Shards are the watcher shards the scenario ran (GitLoad.Shards);
	// nil for one unsharded watcher.
	Shards []Shard
	// Jobs are the bus messages handled by service and type.
	Jobs map[string]map[string]JobStat
	// JobResults are the non-success results by service, type and result.
	JobResults map[string]float64
	// MachineBusy is the CPU time the whole machine was busy, ours or not.
	MachineBusy time.Duration
	// CPUs is the number of CPUs of the machine.
	CPUs int
	// ArtifactBytes is the size of the artifact, when one is reported.
	ArtifactBytes int64
	// ContentBytes is the size of the content packaged, uncompressed, when
	// the scenario knows it (one source's).
	ContentBytes int64
	// Counters are counts a scenario takes of what the system asked of
	// others (e.g. CounterGitFetches), by name.
	Counters map[string]int64
	// Notes say what could not be measured.
	Notes []string
	// Fairness, when set, is the small tenant's time to Ready on the idle
	// system and under another tenant's load (scenario f).
	Fairness *Fairness
	// Latency, when set, summarises the latencies the scenario timed
	// (scenario k: hook POST to new revision in status).
	Latency *Latency
	// PeakPSS and PeakAnon are the peaks of the sampled sums of the
	// system's processes' PSS and anonymous memory: what they held
	// together at the worst sampled moment, shared pages counted once.
	// PeakPSS is what Target.Memory compares.
	PeakPSS, PeakAnon uint64
	// MemorySampling says how PeakPSS and PeakAnon were sampled; nil when
	// they were not.
	MemorySampling *MemorySampling
	// APIRequestsByAgent are the requests the API server received during
	// the measurement, by the product of their user agent (the binary's
	// name, "watcher", "source-controller", "bench.test"), when the Env
	// kept an audit log (harness.Config.AuditLog); nil otherwise.
	APIRequestsByAgent map[string]int64
	// MemorySlope, in scenario es, is the memory of the system's
	// processes at each stage of Ready sources.
	MemorySlope MemorySlope
	// CreatedToReady are the times from each created object's
	// creationTimestamp to its Ready condition's lastTransitionTime, by
	// the API server's record; CreatedToLastReady is from the first
	// creationTimestamp to the last Ready. Nil and 0 when the measurement
	// created no object.
	CreatedToReady     *Latency
	CreatedToLastReady time.Duration
	// Bus is what the NATS server counted during the measurement (its
	// /varz), when it runs in a process of its own; nil otherwise.
	Bus *BusTraffic
	// AfterApply is what the API server did from the end of the apply to
	// the end of the measurement, when the load generator had stopped
	// writing and every request it served came from the system (and the
	// benchmark's one watch); nil when not measured.
	AfterApply *AfterApply
}

// BusTraffic is the messages and bytes the NATS server received from its
// clients (in) and delivered to them (out): JetStream's own acknowledgements
// and API requests included.
type BusTraffic struct {
	InMsgs, OutMsgs, InBytes, OutBytes int64
}

// natsVarz reads the counters of BusTraffic from NATS's /varz at addr.
func natsVarz(ctx context.Context, addr string) (BusTraffic, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/varz", nil)
	if err != nil {
		return BusTraffic{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return BusTraffic{}, fmt.Errorf("NATS /varz: %w", err)
	}
	defer resp.Body.Close()
	var v struct {
		InMsgs   int64 `json:"in_msgs"`
		OutMsgs  int64 `json:"out_msgs"`
		InBytes  int64 `json:"in_bytes"`
		OutBytes int64 `json:"out_bytes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return BusTraffic{}, fmt.Errorf("NATS /varz: %w", err)
	}
	return BusTraffic{InMsgs: v.InMsgs, OutMsgs: v.OutMsgs, InBytes: v.InBytes, OutBytes: v.OutBytes}, nil
}

// AfterApply is the API server's CPU and the controller's requests from
// the end of a scenario's apply to the end of its measurement: the cost,
// on the API server, of the system's own status writes, reads and watches.
type AfterApply struct {
	// Wall is the time from the end of the apply to the end.
	Wall time.Duration
	// APIServerCPU is kube-apiserver's CPU time, EtcdCPU etcd's.
	APIServerCPU, EtcdCPU time.Duration
	// Requests are the controller's API requests (its client-go metrics)
	// by method, as Measurement.APIRequests.
	Requests map[string]float64
}

// Writes are the requests of a that change objects (POST, PUT, PATCH,
// DELETE).
func (a *AfterApply) Writes() float64 {
	var n float64
	for k, v := range a.Requests {
		method, _, _ := strings.Cut(k, "/")
		switch method {
		case "POST", "PUT", "PATCH", "DELETE":
			n += v
		}
	}
	return n
}

// ServiceCPU is the CPU time of the system's processes together.
func (m *Measurement) ServiceCPU() time.Duration {
	var d time.Duration
	for _, u := range m.Usage {
		if u.Role == RoleService {
			d += u.CPU
		}
	}
	return d
}

// ServicePeakRSS is the sum of the system's processes' peak RSS: an upper
// bound of their peak together.
func (m *Measurement) ServicePeakRSS() uint64 {
	var n uint64
	for _, u := range m.Usage {
		if u.Role == RoleService {
			n += u.PeakRSS
		}
	}
	return n
}

type measuredProc struct {
	name      string
	role      Role
	pid       int
	cpu       cpuTimes
	peakReset bool
	metrics   string // telemetry address, for services
	before    promtext.Samples
	// controller tells the processes that reconcile the sources: the
	// watcher and its replicas or shards, or Flux's source-controller.
	controller bool
}

// meter measures one scenario on an Env.
type meter struct {
	procs   []*measuredProc
	notes   []string
	machine time.Duration
	start   time.Time
	// memory samples the system's processes (RoleService), in the order
	// of procs.
	memory *memorySampler
	// auditLog is the API server's audit log, when it keeps one.
	auditLog string
	// natsMonitor is NATS's monitoring address, bus0 its counters at the
	// start.
	natsMonitor string
	bus0        BusTraffic
	// conns0 are NATS's client connections at the start, for each
	// process's traffic; natsPort is the port they connect to.
	conns0   map[uint64]natsConn
	natsPort int
	// applied holds, from markApplied, the control plane's CPU and the
	// controller's requests when the apply ended.
	applied *appliedMark
}

// appliedMark is the state markApplied reads.
type appliedMark struct {
	at       time.Time
	cpu      map[string]cpuTimes // by process name: kube-apiserver, etcd
	requests map[string]float64
}

// controllerRequests are the API requests by method and code of the
// system's controllers (the watcher processes, or Flux's
// source-controller) together, from their metrics.
func (m *meter) controllerRequests(ctx context.Context) (map[string]float64, error) {
	var out map[string]float64
	for _, p := range m.procs {
		if p.metrics == "" || !p.controller {
			continue
		}
		ss, err := scrape(ctx, p.metrics)
		if err != nil {
			return nil, err
		}
		if out == nil {
			out = map[string]float64{}
		}
		for k, v := range ss.SumBy("rest_client_requests_total", "method", "code") {
			out[k] += v
		}
	}
	if out == nil {
		return nil, errors.New("no controller with metrics")
	}
	return out, nil
}

// markApplied reads the control plane's CPU and the controller's requests
// at the end of the apply, for Measurement.AfterApply.
func (m *meter) markApplied(ctx context.Context) error {
	mark := &appliedMark{at: time.Now(), cpu: map[string]cpuTimes{}}
	for _, p := range m.procs {
		if p.role == RoleControlPlane {
			c, err := procCPU(p.pid)
			if err != nil {
				return err
			}
			mark.cpu[p.name] = c
		}
	}
	reqs, err := m.controllerRequests(ctx)
	if err != nil {
		return err
	}
	mark.requests = reqs
	m.applied = mark
	return nil
}

// afterApply is what happened since markApplied, until end.
func (m *meter) afterApply(ctx context.Context, end time.Time) (*AfterApply, error) {
	if m.applied == nil {
		return nil, nil
	}
	a := &AfterApply{Wall: end.Sub(m.applied.at)}
	for _, p := range m.procs {
		before, ok := m.applied.cpu[p.name]
		if !ok {
			continue
		}
		c, err := procCPU(p.pid)
		if err != nil {
			return nil, err
		}
		switch p.name {
		case "kube-apiserver":
			a.APIServerCPU = c.total() - before.total()
		case "etcd":
			a.EtcdCPU = c.total() - before.total()
		}
	}
	reqs, err := m.controllerRequests(ctx)
	if err != nil {
		return nil, err
	}
	a.Requests = diff(m.applied.requests, reqs)
	return a, nil
}

// startMeter resets the peak RSS of every process, and reads their CPU
// times and the services' metrics.
func startMeter(ctx context.Context, env *harness.Env) (*meter, error) {
	m := &meter{auditLog: env.AuditLogPath, natsMonitor: env.NATSMonitorAddr}
	for _, s := range env.Services() {
		m.procs = append(m.procs, &measuredProc{name: s.Name, role: RoleService, pid: s.Pid(), metrics: s.TelemetryAddr,
			controller: filepath.Base(s.Path) == harness.Watcher || s.Name == FluxSourceController})
	}
	children, err := childrenByName("kube-apiserver", "etcd")
	if err != nil {
		m.notes = append(m.notes, "control plane not measured: "+err.Error())
	}
	optional, _ := childrenByName("minio", "registry") // when the scenario runs them
	maps.Copy(children, optional)
	for _, c := range []struct {
		name string
		role Role
	}{{"kube-apiserver", RoleControlPlane}, {"etcd", RoleControlPlane}, {"minio", RoleStorage}, {"registry", RoleBench}} {
		if pid, ok := children[c.name]; ok {
			m.procs = append(m.procs, &measuredProc{name: c.name, role: c.role, pid: pid})
		}
	}
	m.procs = append(m.procs, &measuredProc{name: "bench process", role: RoleBench, pid: os.Getpid()})
	for _, p := range m.procs {
		p.peakReset = resetPeakRSS(p.pid) == nil
		if p.metrics != "" {
			if p.before, err = scrape(ctx, p.metrics); err != nil {
				return nil, err
			}
		}
	}
	if m.natsMonitor != "" {
		if m.bus0, err = natsVarz(ctx, m.natsMonitor); err != nil {
			return nil, err
		}
		if m.natsPort, err = urlPort(env.NATSURL); err != nil {
			return nil, err
		}
		if m.conns0, err = natsConnz(ctx, m.natsMonitor); err != nil {
			return nil, err
		}
	}
	// CPU last, so the scrapes above are not counted.
	for _, p := range m.procs {
		if p.cpu, err = procCPU(p.pid); err != nil {
			return nil, err
		}
	}
	if m.machine, _, err = machineCPU(); err != nil {
		return nil, err
	}
	var pids []int
	for _, p := range m.procs {
		if p.role == RoleService {
			pids = append(pids, p.pid)
		}
	}
	m.memory = startMemorySampler(ctx, pids, memoryEvery)
	m.start = time.Now()
	return m, nil
}

// stop reads everything again and returns the difference; end is when the
// awaited state was reached.
func (m *meter) stop(ctx context.Context, end time.Time) (*Measurement, error) {
	out := &Measurement{
		Wall:                 end.Sub(m.start),
		APIRequests:          map[string]float64{},
		APIRequestsByProcess: map[string]map[string]float64{},
		Jobs:                 map[string]map[string]JobStat{},
		JobResults:           map[string]float64{},
		Notes:                m.notes,
	}
	var errs []error
	after, err := m.afterApply(ctx, end)
	if err != nil {
		errs = append(errs, fmt.Errorf("after the apply: %w", err))
	}
	out.AfterApply = after
	if m.natsMonitor != "" {
		bus, err := natsVarz(ctx, m.natsMonitor)
		if err != nil {
			errs = append(errs, err)
		} else {
			out.Bus = &BusTraffic{InMsgs: bus.InMsgs - m.bus0.InMsgs, OutMsgs: bus.OutMsgs - m.bus0.OutMsgs,
				InBytes: bus.InBytes - m.bus0.InBytes, OutBytes: bus.OutBytes - m.bus0.OutBytes}
		}
	}
	machine, cpus, err := machineCPU()
	if err != nil {
		errs = append(errs, err)
	}
	out.MachineBusy, out.CPUs = machine-m.machine, cpus
	peaks, sampling := m.memory.finish()
	out.PeakPSS, out.PeakAnon, out.MemorySampling = peaks.pss, peaks.anon, &sampling
	if sampling.Err != nil {
		out.Notes = append(out.Notes, fmt.Sprintf("memory: %d samples left out: %v", sampling.Failed, sampling.Err))
	}
	service := 0 // index of the next RoleService process in peaks.each
	for _, p := range m.procs {
		var own memoryUse
		if p.role == RoleService {
			if service < len(peaks.each) {
				own = peaks.each[service]
			}
			service++
		}
		cpu, err := procCPU(p.pid)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		peak, err := peakRSS(p.pid)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out.Usage = append(out.Usage, Usage{Name: p.name, Role: p.role, PeakRSS: peak, PeakSinceStart: !p.peakReset,
			CPU: cpu.total() - p.cpu.total(), ChildrenCPU: cpu.children - p.cpu.children,
			PeakPSS: own.PSS, PeakAnon: own.Anon})
	}
	for _, p := range m.procs {
		if p.metrics == "" {
			continue
		}
		after, err := scrape(ctx, p.metrics)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if p.controller {
			own := diff(p.before.SumBy("rest_client_requests_total", "method", "code"), after.SumBy("rest_client_requests_total", "method", "code"))
			for method, n := range own {
				out.APIRequests[method] += n
			}
			out.APIRequestsByProcess[p.name] = own
		}
		counts := diff(p.before.SumBy("headwater_job_duration_seconds_count", "type"), after.SumBy("headwater_job_duration_seconds_count", "type"))
		sums := diff(p.before.SumBy("headwater_job_duration_seconds_sum", "type"), after.SumBy("headwater_job_duration_seconds_sum", "type"))
		for typ, n := range counts {
			if out.Jobs[p.name] == nil {
				out.Jobs[p.name] = map[string]JobStat{}
			}
			out.Jobs[p.name][shortType(typ)] = JobStat{Count: n, Busy: time.Duration(sums[typ] * float64(time.Second))}
		}
		for key, n := range diff(p.before.SumBy("headwater_jobs_total", "type", "result"), after.SumBy("headwater_jobs_total", "type", "result")) {
			typ, result, _ := strings.Cut(key, "/")
			if result != "success" {
				out.JobResults[p.name+" "+shortType(typ)+" "+result] += n
			}
		}
	}
	if err := m.busByProcess(ctx, out); err != nil {
		errs = append(errs, err)
	}
	if m.auditLog != "" {
		if out.APIRequestsByAgent, err = auditRequests(m.auditLog, m.start, end); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("measure: %w", errors.Join(errs...))
	}
	return out, nil
}

// shortType drops the common prefix and version of a CloudEvent type:
// io.headwater.job.fetch.requested.v1 -> fetch.requested.
func shortType(t string) string {
	t = strings.TrimPrefix(t, "io.headwater.")
	t = strings.TrimPrefix(t, "job.")
	if i := strings.LastIndex(t, ".v"); i > 0 {
		t = t[:i]
	}
	return t
}

// busByProcess sets each service's Usage.Bus from NATS's connections,
// when NATS runs in a process of its own.
func (m *meter) busByProcess(ctx context.Context, out *Measurement) error {
	if m.natsMonitor == "" {
		return nil
	}
	conns, err := natsConnz(ctx, m.natsMonitor)
	if err != nil {
		return err
	}
	var pids []int
	for _, p := range m.procs {
		if p.role == RoleService && p.name != harness.NATS {
			pids = append(pids, p.pid)
		}
	}
	byPid, err := busByProcess(m.conns0, conns, pids, m.natsPort)
	if err != nil {
		return fmt.Errorf("bus by process: %w", err)
	}
	for i := range out.Usage {
		for _, p := range m.procs {
			if p.name != out.Usage[i].Name {
				continue
			}
			if t, ok := byPid[p.pid]; ok {
				out.Usage[i].Bus = &t
			}
		}
	}
	return nil
}

// urlPort is the port of a URL such as nats://127.0.0.1:4222.
func urlPort(raw string) (int, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return 0, fmt.Errorf("port of %q: %w", raw, err)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		return 0, fmt.Errorf("port of %q: %w", raw, err)
	}
	return p, nil
}
