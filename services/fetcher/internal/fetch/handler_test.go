package fetch

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/gitfetch"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// env is a fetcher worker on an embedded NATS server, with directory
// storage and a git server behind a proxy that counts fetches.
type env struct {
	conn     *bus.Conn
	store    *storage.Dir
	pub      *bus.Publisher
	reg      *prometheus.Registry
	repoURL  string
	commit   string
	uploads  atomic.Int64 // git-upload-pack requests: clones, not listings
	listings atomic.Int64 // info/refs requests: listings
	// beforeClone, when set, runs before a clone is passed on upstream.
	beforeClone atomic.Pointer[func()]
	packages    jetstream.Consumer
	results     jetstream.Consumer
	mu          sync.Mutex
	attempts    []attempt
	ctx         context.Context
	tempDir     string
	// flights is the events.FlightBucket of the fetchers.
	flights jetstream.KeyValue
	// cons is the fetchers' consumer, and workers what their Run returns.
	cons    jetstream.Consumer
	workers chan error
	started int
}

// attempt is one call of the handler and what it returned.
type attempt struct {
	job      string
	delivery uint64
	err      error
}

// newEnv starts the env; opts adjust the handler before it starts.
func newEnv(t *testing.T, maxAttempts int, opts ...func(*Handler)) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	e := &env{ctx: ctx}

	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir()})
	must(t, err)
	e.conn, err = bus.Connect(ctx, bus.Options{URL: ns.ClientURL()}, "fetcher-test", logr.Discard())
	must(t, err)
	must(t, e.conn.EnsureStreams(ctx))
	cons, err := e.conn.EnsureConsumer(ctx, events.FetchStream,
		events.Consumer(events.FetchStream, events.FetcherConsumer, events.ConsumerOptions{MaxDeliver: maxAttempts}))
	must(t, err)
	e.packages, err = e.conn.EnsureConsumer(ctx, events.PackageStream,
		events.Consumer(events.PackageStream, "test-packager", events.ConsumerOptions{}))
	must(t, err)
	e.results, err = e.conn.EnsureConsumer(ctx, events.PublishStream,
		events.Consumer(events.PublishStream, "test-announcer", events.ConsumerOptions{}))
	must(t, err)
	e.store, err = storage.NewDir(t.TempDir())
	must(t, err)
	e.pub = e.conn.NewPublisher("watcher-test")
	e.flights, err = e.conn.JS.CreateKeyValue(ctx, events.Buckets(1)[0])
	must(t, err)
	e.cons, e.workers = cons, make(chan error, 4)

	// The repository, served through a proxy that counts clones.
	root := t.TempDir()
	repo, err := gitserver.NewRepo(root, "podinfo", t.TempDir(), "master")
	must(t, err)
	must(t, repo.Write(map[string]string{
		"README.md": "hello", "deploy/app.yaml": "kind: ConfigMap\n", "logo.png": "png", ".gitignore": "*.tmp\n",
		".github/workflows/ci.yaml": "on: push\n",
	}))
	e.commit, err = repo.Commit("initial commit")
	must(t, err)
	srv := &gitserver.Server{Root: root}
	must(t, srv.Start("127.0.0.1:0"))
	target, err := url.Parse(srv.URL())
	must(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	counting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/git-upload-pack") {
			e.uploads.Add(1)
			if hook := e.beforeClone.Load(); hook != nil {
				(*hook)()
			}
		}
		if strings.HasSuffix(r.URL.Path, "/info/refs") {
			e.listings.Add(1)
		}
		proxy.ServeHTTP(w, r)
	}))
	e.repoURL = counting.URL + "/podinfo.git"

	e.reg = prometheus.NewRegistry()
	e.tempDir = t.TempDir()
	t.Cleanup(func() {
		cancel()
		for range e.started {
			if err := <-e.workers; err != nil {
				t.Errorf("worker: %v", err)
			}
		}
		counting.Close()
		_ = srv.Stop()
		e.conn.Close()
		ns.Shutdown()
		ns.WaitForShutdown()
		_ = e.store.Close()
	})
	e.replica(t, e.reg, opts...)
	return e
}

// replica starts a fetcher on the env's consumer with a handler of its
// own, its metrics on reg; opts adjust the handler. A Leases the options
// set without a bucket gets the env's.
func (e *env) replica(t *testing.T, reg *prometheus.Registry, opts ...func(*Handler)) {
	t.Helper()
	h := &Handler{
		Sources:   map[string]source.Source{gitfetch.Kind: &gitfetch.Source{}},
		Storage:   e.store,
		Publisher: e.conn.NewPublisher("fetcher"),
		TempDir:   e.tempDir,
		Metrics:   NewMetrics(reg),
	}
	for _, o := range opts {
		o(h)
	}
	if h.Leases != nil && h.Leases.KV == nil {
		h.Leases.KV = e.flights
	}
	w := &bus.Worker{
		Service:     "fetcher",
		Consumer:    e.cons,
		Concurrency: 2,
		Handler: func(ctx context.Context, m *events.Message, d bus.Delivery) error {
			err := h.Handle(ctx, m, d)
			e.mu.Lock()
			e.attempts = append(e.attempts, attempt{job: events.JobOf(m.Data).ID, delivery: d.Attempt, err: err})
			e.mu.Unlock()
			return err
		},
		Report:  h.Report,
		Metrics: telemetry.NewJobMetrics(reg, "fetcher"),
		Log:     logr.Discard(),
	}
	e.started++
	go func() { e.workers <- w.Run(e.ctx) }()
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// request publishes a FetchRequested for the podinfo GitRepository.
func (e *env) request(t *testing.T, jobID string, mutate func(*events.FetchRequested)) events.Job {
	t.Helper()
	req := &events.FetchRequested{
		Job: events.Job{ID: jobID, RequestedAt: time.Now().UTC(),
			Object: events.ObjectRef{Kind: sourcev1.GitRepositoryKind, Namespace: "default", Name: "podinfo", UID: "uid-1", Generation: 1}},
		GitRepository: &sourcev1.GitRepositorySpec{URL: e.repoURL, Reference: &sourcev1.GitRepositoryRef{Branch: "master"}},
	}
	if mutate != nil {
		mutate(req)
	}
	must(t, e.pub.Publish(e.ctx, events.FetchSubject(req.Job.Object.Kind), events.TypeFetchRequested, req.Job, req))
	return req.Job
}

// next returns the next message of a test consumer, acknowledged.
func (e *env) next(t *testing.T, c jetstream.Consumer) *events.Message {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		batch, err := c.Fetch(1, jetstream.FetchMaxWait(time.Second))
		must(t, err)
		for msg := range batch.Messages() {
			must(t, msg.DoubleAck(e.ctx))
			m, err := events.Decode(msg.Data())
			must(t, err)
			return m
		}
	}
	t.Fatal("no message within 30s")
	return nil
}

// fetched returns the next Fetched job for the packager.
func (e *env) fetched(t *testing.T) *events.Fetched {
	t.Helper()
	m := e.next(t, e.packages)
	if m.Event.Type() != events.TypeFetched {
		t.Fatalf("package stream: got %s, want %s", m.Event.Type(), events.TypeFetched)
	}
	return m.Data.(*events.Fetched)
}

// outcome returns the next result for the artifact-server, of type want.
func (e *env) outcome(t *testing.T, want string) *events.Outcome {
	t.Helper()
	m := e.next(t, e.results)
	if m.Event.Type() != want {
		t.Fatalf("publish stream: got %s (%+v), want %s", m.Event.Type(), m.Data, want)
	}
	return m.Data.(*events.Outcome)
}

// staged lists the regular files of a staged tar.
func (e *env) staged(t *testing.T, key string) []string {
	t.Helper()
	obj, err := e.store.Open(e.ctx, key)
	must(t, err)
	defer obj.Close()
	var files []string
	tr := tar.NewReader(obj)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		must(t, err)
		if h.Typeflag == tar.TypeReg {
			files = append(files, h.Name)
		}
	}
	sort.Strings(files)
	return files
}

// artifact stores content as the podinfo artifact and returns its record,
// with the digest of want (the content the status says it has).
func (e *env) artifact(t *testing.T, content, want string) *meta.Artifact {
	t.Helper()
	key := storage.ArtifactKey(sourcev1.GitRepositoryKind, "default", "podinfo", e.commit+".tar.gz")
	if content != "" {
		_, err := e.store.Put(e.ctx, key, strings.NewReader(content))
		must(t, err)
	}
	sum := sha256.Sum256([]byte(want))
	return &meta.Artifact{Path: key, Revision: "master@sha1:" + e.commit, Digest: "sha256:" + hex.EncodeToString(sum[:])}
}

// waitEmpty waits until the fetch stream holds no message: every job was
// acknowledged or terminated.
func (e *env) waitEmpty(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		s, err := e.conn.JS.Stream(e.ctx, events.FetchStream)
		must(t, err)
		info, err := s.Info(e.ctx)
		must(t, err)
		if info.State.Msgs == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("fetch stream still holds messages after 30s")
}

func (e *env) attemptsOf(job string) []attempt {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []attempt
	for _, a := range e.attempts {
		if a.job == job {
			out = append(out, a)
		}
	}
	return out
}

func TestFetchThenUnchanged(t *testing.T) {
	e := newEnv(t, 5)
	rev := "master@sha1:" + e.commit

	job := e.request(t, "job-1", nil)
	f := e.fetched(t)
	want := events.Fetched{
		Job: job, Revision: rev, Staging: storage.StagingKey("job-1"), ArtifactName: e.commit + ".tar.gz",
		EventMessage: "stored artifact for commit 'initial commit'",
	}
	f.Job.RequestedAt, want.Job.RequestedAt = time.Time{}, time.Time{}
	if !reflect.DeepEqual(*f, want) {
		t.Errorf("fetched = %+v\nwant      %+v", *f, want)
	}
	// Flux's default ignore rules: no VCS files, CI configuration or images.
	if got, want := e.staged(t, f.Staging), []string{"README.md", "deploy/app.yaml"}; !reflect.DeepEqual(got, want) {
		t.Errorf("staged files = %q, want %q", got, want)
	}
	clones := e.uploads.Load()
	if clones == 0 {
		t.Fatal("the proxy counted no clone")
	}

	// The stored artifact holds the revision: nothing is downloaded.
	prev := e.artifact(t, "artifact bytes", "artifact bytes")
	job2 := e.request(t, "job-2", func(r *events.FetchRequested) { r.Previous = prev })
	out := e.outcome(t, events.TypeFetchUnchanged)
	if out.Job.ID != job2.ID || out.Revision != rev || !reflect.DeepEqual(out.Artifact, prev) || out.Failure != nil {
		t.Errorf("unchanged outcome = %+v, want revision %s and artifact %+v", out, rev, prev)
	}
	e.waitEmpty(t)
	if got := e.uploads.Load(); got != clones {
		t.Errorf("an unchanged revision was cloned: %d clones, want %d", got, clones)
	}

	if left, err := os.ReadDir(e.tempDir); err != nil || len(left) != 0 {
		t.Errorf("temporary clones left behind: %v %v", left, err)
	}
	if n := counterValue(t, e.reg, "headwater_fetch_bytes_total"); n <= 0 {
		t.Errorf("headwater_fetch_bytes_total = %v, want > 0", n)
	}
	for _, result := range []string{ResultFetched, ResultUnchanged} {
		if n := histogramCount(t, e.reg, "headwater_fetch_duration_seconds", result); n != 1 {
			t.Errorf("headwater_fetch_duration_seconds{result=%q} count = %d, want 1", result, n)
		}
	}
}

// A steady source's quiet job publishes nothing when nothing changed, and
// everything a job without the flag would when something did.
func TestQuietJob(t *testing.T) {
	e := newEnv(t, 5)
	rev := "master@sha1:" + e.commit
	e.request(t, "job-1", nil)
	e.fetched(t)
	clones := e.uploads.Load()

	quiet := func(prev *meta.Artifact) func(*events.FetchRequested) {
		return func(r *events.FetchRequested) { r.Previous = prev; r.Quiet = true }
	}
	prev := e.artifact(t, "artifact bytes", "artifact bytes")
	e.request(t, "quiet-unchanged", quiet(prev))
	e.waitEmpty(t)
	info, err := e.results.Info(e.ctx)
	must(t, err)
	if info.NumPending != 0 || info.NumAckPending != 0 {
		t.Errorf("a quiet unchanged job published results: %d pending, %d unacknowledged", info.NumPending, info.NumAckPending)
	}
	if n := histogramCount(t, e.reg, "headwater_fetch_duration_seconds", ResultQuiet); n != 1 {
		t.Errorf("headwater_fetch_duration_seconds{result=%q} count = %d, want 1", ResultQuiet, n)
	}

	// A new upstream revision, and a corrupt stored artifact, are news.
	old := *prev
	old.Revision = "master@sha1:0000000000000000000000000000000000000000"
	e.request(t, "quiet-new-revision", quiet(&old))
	if f := e.fetched(t); f.Revision != rev {
		t.Errorf("quiet job with a new revision: fetched %q, want %q", f.Revision, rev)
	}
	corrupt := e.artifact(t, "tampered bytes", "artifact bytes")
	e.request(t, "quiet-corrupt", quiet(corrupt))
	if f := e.fetched(t); len(f.Notices) != 1 || f.Notices[0].Reason != ArtifactVerificationFailedReason {
		t.Errorf("quiet job with a corrupt artifact: notices %+v, want %s", f.Notices, ArtifactVerificationFailedReason)
	}

	// The same job without the flag announces the unchanged revision.
	intact := e.artifact(t, "artifact bytes", "artifact bytes")
	job := e.request(t, "announced", func(r *events.FetchRequested) { r.Previous = intact })
	if out := e.outcome(t, events.TypeFetchUnchanged); out.Job.ID != job.ID || out.Revision != rev {
		t.Errorf("unchanged outcome = %+v, want job %s revision %s", out, job.ID, rev)
	}
	e.waitEmpty(t)
	if got := e.uploads.Load() - clones; got != 2 {
		t.Errorf("clones after the first fetch: %d, want 2 (the new revision and the corrupt artifact)", got)
	}
}

func TestRebuildsBrokenArtifact(t *testing.T) {
	cases := []struct {
		name    string
		stored  string // stored content; "" for none
		force   bool
		notices func(prev *meta.Artifact) []events.Notice
	}{
		{
			name:   "corrupt artifact",
			stored: "tampered bytes",
			notices: func(prev *meta.Artifact) []events.Notice {
				return []events.Notice{{Warning: true, Reason: ArtifactVerificationFailedReason,
					Message: "failed to verify integrity of artifact: computed digest doesn't match '" + prev.Digest + "'"}}
			},
		},
		{
			name: "missing artifact",
			notices: func(prev *meta.Artifact) []events.Notice {
				return []events.Notice{{Warning: true, Reason: ArtifactMissingReason,
					Message: "artifact '" + prev.Path + "' is missing from storage: rebuilding"}}
			},
		},
		{
			name:    "forced",
			stored:  "artifact bytes",
			force:   true,
			notices: func(*meta.Artifact) []events.Notice { return nil },
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 5)
			prev := e.artifact(t, tc.stored, "artifact bytes")
			e.request(t, "job-1", func(r *events.FetchRequested) { r.Previous = prev; r.Force = tc.force })
			f := e.fetched(t)
			if f.Revision != prev.Revision {
				t.Errorf("revision = %q, want %q", f.Revision, prev.Revision)
			}
			if want := tc.notices(prev); !reflect.DeepEqual(f.Notices, want) {
				t.Errorf("notices = %+v, want %+v", f.Notices, want)
			}
			if got := e.staged(t, f.Staging); len(got) != 2 {
				t.Errorf("staged files = %q, want README.md and deploy/app.yaml", got)
			}
		})
	}
}

func TestFailures(t *testing.T) {
	cases := []struct {
		name     string
		mutate   func(*events.FetchRequested)
		failure  events.Failure
		attempts int // handler calls until the job is terminated
	}{
		{
			name:   "missing branch, retried then final",
			mutate: func(r *events.FetchRequested) { r.GitRepository.Reference.Branch = "nope" },
			failure: events.Failure{Condition: sourcev1.FetchFailedCondition, Reason: sourcev1.GitOperationFailedReason,
				Message:   `failed to checkout and determine revision: unable to clone '{url}': couldn't find remote ref "refs/heads/nope"`,
				Transient: true, Retrying: true},
			attempts: 2,
		},
		{
			name:   "invalid URL stalls at once",
			mutate: func(r *events.FetchRequested) { r.GitRepository.URL = "http://user:s3cr3t@host:port/x.git" },
			failure: events.Failure{Condition: sourcev1.FetchFailedCondition, Reason: sourcev1.URLInvalidReason, Stalled: true,
				Message: `failed to parse url 'http://host:port/x.git': parse "http://host:port/x.git": invalid port ":port" after host`},
			attempts: 1,
		},
		{
			name: "unsupported kind",
			mutate: func(r *events.FetchRequested) {
				r.Job.Object.Kind = sourcev1.BucketKind
				r.GitRepository = nil
				r.Bucket = &sourcev1.BucketSpec{BucketName: "b", Endpoint: "minio:9000"}
			},
			failure: events.Failure{Condition: sourcev1.FetchFailedCondition, Reason: source.UnsupportedKindReason, Stalled: true,
				Message: "fetching sources of kind 'Bucket' is not supported"},
			attempts: 1,
		},
		{
			name:   "no spec for the kind",
			mutate: func(r *events.FetchRequested) { r.GitRepository = nil },
			failure: events.Failure{Condition: sourcev1.FetchFailedCondition, Reason: source.InvalidSpecReason, Stalled: true,
				Message: "fetch request for GitRepository 'default/podinfo' has no GitRepository spec"},
			attempts: 1,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 2)
			job := e.request(t, "job-1", tc.mutate)
			out := e.outcome(t, events.TypeFetchFailed)
			want := tc.failure
			want.Message = strings.ReplaceAll(want.Message, "{url}", e.repoURL)
			if out.Job.ID != job.ID || out.Failure == nil || *out.Failure != want {
				t.Errorf("failure = %+v\nwant      %+v", out.Failure, want)
			}
			e.waitEmpty(t)
			if got := e.attemptsOf(job.ID); len(got) != tc.attempts {
				t.Fatalf("handler calls = %+v, want %d", got, tc.attempts)
			}
			// Every attempt but the last was retried; the last terminated.
			if n := jobsTotal(t, e.reg, "retry"); n != float64(tc.attempts-1) {
				t.Errorf("retried attempts = %v, want %d", n, tc.attempts-1)
			}
			if n := jobsTotal(t, e.reg, "failed"); n != 1 {
				t.Errorf("terminated attempts = %v, want 1", n)
			}
			if n := histogramCount(t, e.reg, "headwater_fetch_duration_seconds", ResultFailed); n != uint64(tc.attempts) {
				t.Errorf("failed fetches observed = %d, want %d", n, tc.attempts)
			}
		})
	}
}

func TestMalformedMessageIsTerminated(t *testing.T) {
	e := newEnv(t, 5)
	for _, body := range []string{"not json", `{"specversion":"1.0","id":"x","source":"s","type":"io.example.unknown"}`} {
		if _, err := e.conn.JS.Publish(e.ctx, events.FetchSubject("gitrepository"), []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	e.request(t, "job-1", nil)
	if f := e.fetched(t); f.Revision != "master@sha1:"+e.commit {
		t.Errorf("revision after malformed messages = %q", f.Revision)
	}
	e.waitEmpty(t)
	if n := jobsTotal(t, e.reg, "rejected"); n != 2 {
		t.Errorf("rejected messages = %v, want 2", n)
	}
}

func TestSameJobSameResult(t *testing.T) {
	e := newEnv(t, 5)
	e.request(t, "job-1", nil)
	first := e.fetched(t)
	// The watcher publishes the same job again after the duplicate
	// window: the staging key is the same.
	req := &events.FetchRequested{
		Job:           events.Job{ID: "job-1", Object: events.ObjectRef{Kind: sourcev1.GitRepositoryKind, Namespace: "default", Name: "podinfo"}},
		GitRepository: &sourcev1.GitRepositorySpec{URL: e.repoURL},
	}
	// Publish under a new message ID, as a redelivery from a new stream would.
	body, err := events.Encode("watcher-test", events.TypeFetchRequested, "redelivery", "gitrepository/default/podinfo", req)
	must(t, err)
	_, err = e.conn.JS.Publish(e.ctx, events.FetchSubject("GitRepository"), body)
	must(t, err)
	e.waitEmpty(t)
	if got := e.attemptsOf("job-1"); len(got) != 2 || got[1].err != nil {
		t.Fatalf("handler calls = %+v, want two successful ones", got)
	}
	if first.Staging != storage.StagingKey("job-1") {
		t.Errorf("staging key = %q, want %q", first.Staging, storage.StagingKey("job-1"))
	}
	// The second Fetched has the first's message ID: JetStream drops it.
	batch, err := e.packages.Fetch(1, jetstream.FetchMaxWait(500*time.Millisecond))
	must(t, err)
	for msg := range batch.Messages() {
		t.Errorf("a second Fetched was stored for the same job: %s", msg.Data())
	}
}

func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	must(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func histogramCount(t *testing.T, reg *prometheus.Registry, name, result string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	must(t, err)
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					n += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return n
}

// eventuallyHistogramCount waits for the count of name's samples with the
// result to reach want (a handler observes its duration after it published
// its job, so a test may see the job first), and returns the last count.
func eventuallyHistogramCount(t *testing.T, reg *prometheus.Registry, name, result string, want uint64) uint64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := histogramCount(t, reg, name, result)
		if n >= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func jobsTotal(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	return labelledCounter(t, "headwater_jobs_total", "result", result, reg)
}

// labelledCounter sums the counter name's series whose label has value,
// over regs.
func labelledCounter(t *testing.T, name, label, value string, regs ...*prometheus.Registry) float64 {
	t.Helper()
	var n float64
	for _, reg := range regs {
		mfs, err := reg.Gather()
		must(t, err)
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == label && l.GetValue() == value {
						n += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	return n
}

// TestIntegrityCheckedWhileUpstreamIsDown checks that a stored artifact is
// checked even when the upstream cannot be reached: the failure carries a
// notice for a corrupt or missing artifact, and none for an intact one.
func TestIntegrityCheckedWhileUpstreamIsDown(t *testing.T) {
	cases := []struct {
		name, stored string
		notice       string // the notice's reason; "" for none
		inMessage    string
	}{
		{"intact", "artifact bytes", "", ""},
		{"corrupt", "tampered bytes", ArtifactVerificationFailedReason, "computed digest doesn't match"},
		{"missing", "", ArtifactMissingReason, "rebuilt once the source can be fetched"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 1)
			prev := e.artifact(t, tc.stored, "artifact bytes")
			e.request(t, "job-1", func(r *events.FetchRequested) {
				r.Previous = prev
				r.GitRepository.URL = "http://127.0.0.1:1/gone.git"
			})
			out := e.outcome(t, events.TypeFetchFailed)
			if out.Failure == nil || out.Failure.Reason != sourcev1.GitOperationFailedReason {
				t.Fatalf("failure = %+v, want the unreachable upstream's", out.Failure)
			}
			switch {
			case tc.notice == "" && len(out.Notices) != 0:
				t.Errorf("notices %+v for an intact artifact", out.Notices)
			case tc.notice != "" && (len(out.Notices) != 1 || out.Notices[0].Reason != tc.notice || !out.Notices[0].Warning ||
				!strings.Contains(out.Notices[0].Message, tc.inMessage)):
				t.Errorf("notices %+v, want one Warning %s saying %q", out.Notices, tc.notice, tc.inMessage)
			}
		})
	}
}

// TestConcurrentFetchesOfOneContentDownloadOnce starts two fetches of the
// same content at once: the first clones; the second, which resolved the
// same revision with its own credentials, waits for it and hands a copy of
// what it staged to the packager. One clone, two jobs, the same bytes.
func TestConcurrentFetchesOfOneContentDownloadOnce(t *testing.T) {
	e := newEnv(t, 5, func(h *Handler) { h.ContentCache = true })
	// The clone waits until both fetches have listed the remote, so the
	// second is sure to find the first under way.
	hold := func() {
		deadline := time.Now().Add(10 * time.Second)
		for e.listings.Load() < 2 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	e.beforeClone.Store(&hold)
	e.request(t, "job-a", nil)
	e.request(t, "job-b", func(r *events.FetchRequested) { r.Job.Object.Name, r.Job.Object.UID = "podinfo-b", "uid-b" })
	first, second := e.fetched(t), e.fetched(t)
	if n := e.uploads.Load(); n != 1 {
		t.Errorf("%d clones for two fetches of one content, want 1", n)
	}
	if first.Staging == second.Staging || first.ContentKey == "" || first.ContentKey != second.ContentKey || first.Revision != second.Revision {
		t.Fatalf("jobs %+v and %+v: want their own staging keys, one content key and revision", first, second)
	}
	a, b := e.staged(t, first.Staging), e.staged(t, second.Staging)
	if len(a) == 0 || !slices.Equal(a, b) {
		t.Errorf("staged %q and %q, want the same content", a, b)
	}
	if n := eventuallyHistogramCount(t, e.reg, "headwater_fetch_duration_seconds", ResultJoined, 1); n != 1 {
		t.Errorf("%d fetches joined another, want 1", n)
	}
}

// TestFetchJustAfterALandingCopiesItsStagedContent fetches one content
// twice, the second only once the first staged its content and before any
// packager recorded it in the content cache: the second copies what the
// first staged instead of cloning. Once the staged content is gone (the
// packager took it) and the cache does not know the content, a third
// fetch clones.
func TestFetchJustAfterALandingCopiesItsStagedContent(t *testing.T) {
	e := newEnv(t, 5, func(h *Handler) { h.ContentCache = true })
	e.request(t, "job-a", nil)
	first := e.fetched(t)
	e.request(t, "job-b", func(r *events.FetchRequested) { r.Job.Object.Name, r.Job.Object.UID = "podinfo-b", "uid-b" })
	second := e.fetched(t)
	if n := e.uploads.Load(); n != 1 {
		t.Errorf("%d clones for a fetch just after another of its content, want 1", n)
	}
	if first.Staging == second.Staging || first.ContentKey != second.ContentKey || first.Revision != second.Revision {
		t.Fatalf("jobs %+v and %+v: want their own staging keys, one content key and revision", first, second)
	}
	if a, b := e.staged(t, first.Staging), e.staged(t, second.Staging); len(a) == 0 || !slices.Equal(a, b) {
		t.Errorf("staged %q and %q, want the same content", a, b)
	}
	if n := eventuallyHistogramCount(t, e.reg, "headwater_fetch_duration_seconds", ResultJoined, 1); n != 1 {
		t.Errorf("%d fetches joined another, want 1", n)
	}

	want := e.staged(t, first.Staging)
	must(t, e.store.Delete(e.ctx, first.Staging))
	must(t, e.store.Delete(e.ctx, second.Staging))
	e.request(t, "job-c", func(r *events.FetchRequested) { r.Job.Object.Name, r.Job.Object.UID = "podinfo-c", "uid-c" })
	third := e.fetched(t)
	if n := e.uploads.Load(); n != 2 {
		t.Errorf("%d clones once the staged content was gone and the cache did not know it, want 2", n)
	}
	if got := e.staged(t, third.Staging); !slices.Equal(got, want) {
		t.Errorf("third fetch staged %q, want %q", got, want)
	}
}
