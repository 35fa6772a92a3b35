// Command headwater-idle measures what an idle Headwater costs: it starts
// the system as the e2e harness does (NATS in a process of its own), with no
// source, lets it settle, then records over a window the CPU time of every
// process it started (/proc/<pid>/stat, utime+stime) and the messages NATS
// counted (/varz in and out, /connz per connection). With -profile-dir it
// also takes a CPU profile of each service over the window (-pprof-addr);
// with -scrape it scrapes every service's /metrics as Prometheus would.
//
//	go run ./cmd/headwater-idle -bin-dir ../bin -assets-dir ../bin/k8s \
//	    -crd-dir ../deploy/crds -receivers-crd-dir ../deploy/components/receivers/crd
//
// The figures of docs/design.md, "The idle baseline", come from it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/pkg/flagenv"
)

// options are the command's flags (environment: HEADWATER_<FLAG>).
type options struct {
	binDir, assetsDir, crdDir, receiversCRDDir, dir string
	settle, window, scrape                          time.Duration
	receivers, dispatcher, noServices               bool
	profileDir                                      string
	watcherArgs                                     string
}

func (o *options) bindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.binDir, "bin-dir", "bin", "Directory of the service binaries and headwater-nats.")
	fs.StringVar(&o.assetsDir, "assets-dir", os.Getenv("KUBEBUILDER_ASSETS"), "Directory of kube-apiserver, etcd and kubectl.")
	fs.StringVar(&o.crdDir, "crd-dir", "deploy/crds", "Directory of the CRD manifests.")
	fs.StringVar(&o.receiversCRDDir, "receivers-crd-dir", "", "Directory of the Receiver CRD; set with -receivers.")
	fs.StringVar(&o.dir, "dir", "", "State directory; default: a new temporary one.")
	fs.DurationVar(&o.settle, "settle", 30*time.Second, "Time left to the system after start-up before the window opens.")
	fs.DurationVar(&o.window, "window", 2*time.Minute, "Length of the measured window.")
	fs.DurationVar(&o.scrape, "scrape", 0, "Scrape every service's /metrics this often during the window (as Prometheus); 0 scrapes none.")
	fs.BoolVar(&o.receivers, "receivers", false, "Run the webhook receiver, and the watcher with -receivers.")
	fs.BoolVar(&o.dispatcher, "dispatcher", false, "Run the dispatcher.")
	fs.BoolVar(&o.noServices, "no-services", false, "Run the control plane and NATS alone: what they cost without Headwater.")
	fs.StringVar(&o.watcherArgs, "watcher-args", "", "Further arguments of the watcher, space-separated (e.g. -leader-elect=false).")
	fs.StringVar(&o.profileDir, "profile-dir", "", "Write a CPU profile of each service over the window into this directory.")
}

func main() {
	var o options
	fs := flag.NewFlagSet("headwater-idle", flag.ExitOnError)
	o.bindFlags(fs)
	if err := flagenv.Parse(fs, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "headwater-idle:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "headwater-idle:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, out io.Writer) error {
	if o.dir == "" {
		d, err := os.MkdirTemp("", "headwater-idle-")
		if err != nil {
			return err
		}
		o.dir = d
	}
	services := append([]string{}, harness.ServiceNames...)
	if o.receivers {
		services = append(services, harness.Receiver)
	}
	if o.dispatcher {
		services = append(services, harness.Dispatcher)
	}
	ports, err := harness.FreePorts(len(services))
	if err != nil {
		return err
	}
	pprof := map[string]string{}
	extra := map[string][]string{}
	for i, s := range services {
		pprof[s] = "127.0.0.1:" + strconv.Itoa(ports[i])
		extra[s] = []string{"-pprof-addr", pprof[s]}
	}
	extra[harness.Watcher] = append(extra[harness.Watcher], strings.Fields(o.watcherArgs)...)
	env, err := harness.Start(ctx, harness.Config{
		Dir: o.dir, BinDir: o.binDir, AssetsDir: o.assetsDir, CRDDir: o.crdDir,
		ReceiverCRDDir: o.receiversCRDDir, Receivers: o.receivers, Dispatcher: o.dispatcher,
		NATSBin: filepath.Join(o.binDir, "headwater-nats"), ExtraArgs: extra, NoServices: o.noServices,
		Progress: func(msg string) { fmt.Fprintln(os.Stderr, "==>", msg) },
	})
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()
	monitor, err := monitorAddr(env)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "==> settling for %s\n", o.settle)
	if !sleep(ctx, o.settle) {
		return ctx.Err()
	}

	// The API requests the services made, by method, from client-go's
	// counter (read before the window opens and after it closes: a scrape
	// reads the consumers' state, which would count in the window).
	api0 := apiRequests(ctx, env)
	procs := children(os.Getpid())
	cpu0 := cpuOf(procs)
	varz0, conns0, err := natsState(ctx, monitor)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, o.window)
	defer cancel()
	var wg sync.WaitGroup
	if o.profileDir != "" && !o.noServices {
		for _, s := range services {
			wg.Go(func() {
				if err := profile(ctx, pprof[s], o.window, filepath.Join(o.profileDir, s+".pprof")); err != nil {
					fmt.Fprintf(os.Stderr, "profile %s: %v\n", s, err)
				}
			})
		}
	}
	scrapes := 0
	if o.scrape > 0 {
		t := time.NewTicker(o.scrape)
		for done := false; !done; {
			for _, s := range env.Services() {
				if s.TelemetryAddr != "" {
					scrapeOnce(wctx, s.TelemetryAddr)
				}
			}
			scrapes++
			select {
			case <-wctx.Done():
				done = true
			case <-t.C:
			}
		}
		t.Stop()
	} else {
		<-wctx.Done()
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	cpu1 := cpuOf(procs)
	varz1, conns1, err := natsState(ctx, monitor)
	if err != nil {
		return err
	}
	wg.Wait()
	api1 := apiRequests(ctx, env)

	secs := o.window.Seconds()
	fmt.Fprintf(out, "window %s, settle %s, receivers %t, dispatcher %t, scrapes %d\n", o.window, o.settle, o.receivers, o.dispatcher, scrapes)
	fmt.Fprintf(out, "%-18s %10s %10s\n", "process", "cpu ms", "ms/min")
	var names []string
	for n := range cpu1 {
		names = append(names, n)
	}
	sort.Strings(names)
	var total time.Duration
	for _, n := range names {
		d := cpu1[n] - cpu0[n]
		total += d
		fmt.Fprintf(out, "%-18s %10d %10.1f\n", n, d.Milliseconds(), float64(d.Milliseconds())*60/secs)
	}
	fmt.Fprintf(out, "%-18s %10d %10.1f\n", "total", total.Milliseconds(), float64(total.Milliseconds())*60/secs)
	in, outm := varz1.InMsgs-varz0.InMsgs, varz1.OutMsgs-varz0.OutMsgs
	fmt.Fprintf(out, "nats: in %d msgs (%.2f/s), out %d msgs (%.2f/s), streams %d, consumers %d\n",
		in, float64(in)/secs, outm, float64(outm)/secs, varz1.Streams, varz1.Consumers)
	for _, key := range sortedKeys(api1) {
		fmt.Fprintf(out, "api requests %-30s %6.0f\n", key, api1[key]-api0[key])
	}
	for _, name := range sortedKeys(conns1) {
		c1, c0 := conns1[name], conns0[name]
		fmt.Fprintf(out, "  %-28s in %6d out %6d (subscriptions %d)\n", name, c1.InMsgs-c0.InMsgs, c1.OutMsgs-c0.OutMsgs, c1.NumSubs)
	}
	return nil
}

// monitorAddr finds the NATS process's monitoring address in its readiness URL.
func monitorAddr(env *harness.Env) (string, error) {
	s := env.Service(harness.NATS)
	if s == nil {
		return "", fmt.Errorf("nats runs in no process of its own")
	}
	u, err := url.Parse(s.ReadyURL)
	if err != nil {
		return "", err
	}
	return u.Host, nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// process is a child process: its command name and pid.
type process struct {
	pid  int
	name string
}

// children lists the processes whose parent is ppid.
func children(ppid int) []process {
	ents, _ := os.ReadDir("/proc")
	var ps []process
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < open {
			continue
		}
		f := strings.Fields(s[close+1:])
		if len(f) > 2 && f[1] == strconv.Itoa(ppid) {
			ps = append(ps, process{pid: pid, name: s[open+1 : close]})
		}
	}
	return ps
}

// cpuOf returns the user and system time of each process, by name.
func cpuOf(ps []process) map[string]time.Duration {
	m := map[string]time.Duration{}
	for _, p := range ps {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		m[p.name] += time.Duration(ut+st) * 10 * time.Millisecond
	}
	return m
}

// varzInfo is what /varz and /jsz say that the window needs.
type varzInfo struct {
	InMsgs    int64 `json:"in_msgs"`
	OutMsgs   int64 `json:"out_msgs"`
	Streams   int   `json:"streams"`
	Consumers int   `json:"consumers"`
}

// natsState reads NATS's counters and its connections from the
// monitoring address, as the window opens or closes.
func natsState(ctx context.Context, addr string) (varzInfo, map[string]connInfo, error) {
	v, err := varz(ctx, addr)
	if err != nil {
		return v, nil, err
	}
	c, err := connz(ctx, addr)
	return v, c, err
}

func varz(ctx context.Context, addr string) (v varzInfo, err error) {
	if err := getJSON(ctx, "http://"+addr+"/varz", &v); err != nil {
		return v, err
	}
	return v, getJSON(ctx, "http://"+addr+"/jsz", &v)
}

// connInfo is one client connection of /connz.
type connInfo struct {
	Name    string `json:"name"`
	InMsgs  int64  `json:"in_msgs"`
	OutMsgs int64  `json:"out_msgs"`
	NumSubs int    `json:"subscriptions"`
}

// connz returns the client connections by name.
func connz(ctx context.Context, addr string) (map[string]connInfo, error) {
	var c struct {
		Connections []connInfo `json:"connections"`
	}
	if err := getJSON(ctx, "http://"+addr+"/connz?limit=1000", &c); err != nil {
		return nil, err
	}
	m := map[string]connInfo{}
	for _, ci := range c.Connections {
		name := ci.Name
		for i := 2; ; i++ {
			if _, dup := m[name]; !dup {
				break
			}
			name = ci.Name + "#" + strconv.Itoa(i)
		}
		m[name] = ci
	}
	return m, nil
}

func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func getJSON(ctx context.Context, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// profile writes a CPU profile of the service serving pprof on addr.
func profile(ctx context.Context, addr string, d time.Duration, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(d.Seconds())), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// apiRequests sums rest_client_requests_total by service and method over
// the services that serve it (those with a Kubernetes client).
func apiRequests(ctx context.Context, env *harness.Env) map[string]float64 {
	m := map[string]float64{}
	for _, s := range env.Services() {
		if s.TelemetryAddr == "" {
			continue
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.TelemetryAddr+"/metrics", nil)
		if err != nil {
			continue
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.HasPrefix(line, "rest_client_requests_total{") {
				continue
			}
			i := strings.Index(line, `method="`)
			j := strings.LastIndexByte(line, ' ')
			if i < 0 || j < 0 {
				continue
			}
			method := line[i+len(`method="`):]
			method = method[:strings.IndexByte(method, '"')]
			v, err := strconv.ParseFloat(line[j+1:], 64)
			if err == nil {
				m[s.Name+" "+method] += v
			}
		}
	}
	return m
}

// scrapeOnce reads a service's /metrics and discards it.
func scrapeOnce(ctx context.Context, addr string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
}
