package fetch

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
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
	"github.com/headwater-gitops/headwater/pkg/contentcache"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/gitfetch"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// binDir holds the binaries tests build; TestMain removes it.
var binDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// packagerBinary builds the packager service once per test binary.
var packagerBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "fetch-test-packager-")
	if err != nil {
		return "", err
	}
	binDir = dir
	bin := filepath.Join(dir, "packager")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/headwater-gitops/headwater/services/packager").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build packager: %w\n%s", err, out)
	}
	return bin, nil
})

// pipeline is the fetcher's handler and the real packager service on an
// embedded NATS server and a shared directory storage, fetching from a git
// server behind a proxy that counts clones and listings.
type pipeline struct {
	t        *testing.T
	ctx      context.Context
	conn     *bus.Conn
	store    *storage.Dir
	pub      *bus.Publisher
	results  jetstream.Consumer
	repo     *gitserver.Repo
	repoURL  string
	commit   string
	reg      *prometheus.Registry
	clones   atomic.Int64 // POST git-upload-pack
	listings atomic.Int64 // GET info/refs
}

func newPipeline(t *testing.T) *pipeline {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the packager service")
	}
	bin, err := packagerBinary()
	must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	p := &pipeline{t: t, ctx: ctx}

	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir()})
	must(t, err)
	p.conn, err = bus.Connect(ctx, bus.Options{URL: ns.ClientURL()}, "fetcher-test", logr.Discard())
	must(t, err)
	must(t, p.conn.EnsureStreams(ctx))
	cons, err := p.conn.EnsureConsumer(ctx, events.FetchStream,
		events.Consumer(events.FetchStream, events.FetcherConsumer, events.ConsumerOptions{MaxDeliver: 3}))
	must(t, err)
	p.results, err = p.conn.EnsureConsumer(ctx, events.PublishStream,
		events.Consumer(events.PublishStream, "test-announcer", events.ConsumerOptions{}))
	must(t, err)
	dataDir := t.TempDir()
	p.store, err = storage.NewDir(dataDir)
	must(t, err)
	p.pub = p.conn.NewPublisher("watcher-test")

	root := t.TempDir()
	p.repo, err = gitserver.NewRepo(root, "app", t.TempDir(), "master")
	must(t, err)
	must(t, p.repo.Write(map[string]string{"README.md": "hello", "deploy/app.yaml": "kind: ConfigMap\n", "docs/guide.md": "guide"}))
	p.commit, err = p.repo.Commit("initial commit")
	must(t, err)
	srv := &gitserver.Server{Root: root}
	must(t, srv.Start("127.0.0.1:0"))
	target, err := url.Parse(srv.URL())
	must(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	counting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/git-upload-pack"):
			p.clones.Add(1)
		case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/info/refs"):
			p.listings.Add(1)
		}
		proxy.ServeHTTP(w, r)
	}))
	p.repoURL = counting.URL + "/app.git"

	p.reg = prometheus.NewRegistry()
	h := &Handler{
		Sources: map[string]source.Source{gitfetch.Kind: &gitfetch.Source{
			RefCache: gitfetch.NewRefCache(gitfetch.DefaultRefCacheTTL, 0, nil),
		}},
		Storage:      p.store,
		Publisher:    p.conn.NewPublisher("fetcher"),
		TempDir:      t.TempDir(),
		Metrics:      NewMetrics(p.reg),
		ContentCache: true,
	}
	w := &bus.Worker{Service: "fetcher", Consumer: cons, Concurrency: 2, Handler: h.Handle, Report: h.Report,
		Metrics: telemetry.NewJobMetrics(p.reg, "fetcher"), Log: logr.Discard()}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	var output bytes.Buffer
	cmd := exec.Command(bin, "-nats-url="+ns.ClientURL(), "-storage-path="+dataDir, "-telemetry-addr=", "-log-format=text")
	cmd.Stdout, cmd.Stderr = &output, &output
	must(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()

	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("packager output:\n%s", output.String())
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
		counting.Close()
		_ = srv.Stop()
		p.conn.Close()
		ns.Shutdown()
		ns.WaitForShutdown()
		_ = p.store.Close()
	})
	return p
}

// request publishes a FetchRequested for the GitRepository default/<name>.
func (p *pipeline) request(name string, mutate func(*events.FetchRequested)) events.Job {
	p.t.Helper()
	req := &events.FetchRequested{
		Job: events.Job{ID: name + "-" + fmt.Sprint(time.Now().UnixNano()), RequestedAt: time.Now().UTC(),
			Object: events.ObjectRef{Kind: sourcev1.GitRepositoryKind, Namespace: "default", Name: name, UID: "uid-" + name, Generation: 1}},
		GitRepository: &sourcev1.GitRepositorySpec{URL: p.repoURL, Reference: &sourcev1.GitRepositoryRef{Branch: "master"}},
	}
	if mutate != nil {
		mutate(req)
	}
	must(p.t, p.pub.Publish(p.ctx, events.FetchSubject(req.Job.Object.Kind), events.TypeFetchRequested, req.Job, req))
	return req.Job
}

// outcomes returns the results of n jobs, by job ID, failing on any
// result other than Packaged.
func (p *pipeline) outcomes(n int) map[string]*events.Outcome {
	p.t.Helper()
	out := map[string]*events.Outcome{}
	deadline := time.Now().Add(60 * time.Second)
	for len(out) < n && time.Now().Before(deadline) {
		batch, err := p.results.Fetch(n-len(out), jetstream.FetchMaxWait(time.Second))
		must(p.t, err)
		for msg := range batch.Messages() {
			must(p.t, msg.DoubleAck(p.ctx))
			m, err := events.Decode(msg.Data())
			must(p.t, err)
			o := m.Data.(*events.Outcome)
			if m.Event.Type() != events.TypePackaged {
				p.t.Fatalf("result %s for %s: %+v", m.Event.Type(), o.Job.Object.Name, o.Failure)
			}
			out[o.Job.ID] = o
		}
	}
	if len(out) < n {
		p.t.Fatalf("%d of %d jobs packaged within 60s", len(out), n)
	}
	return out
}

// packaged requests a fetch of source name and returns its Packaged outcome.
func (p *pipeline) packaged(name string, mutate func(*events.FetchRequested)) *events.Outcome {
	p.t.Helper()
	job := p.request(name, mutate)
	return p.outcomes(1)[job.ID]
}

// checkArtifact checks that out's artifact is stored at the path of source
// name, under the commit's name, with out's digest.
func (p *pipeline) checkArtifact(name, commit string, out *events.Outcome) {
	p.t.Helper()
	a := out.Artifact
	want := storage.ArtifactKey(sourcev1.GitRepositoryKind, "default", name, commit+".tar.gz")
	if a == nil || a.Path != want || a.Revision != "master@sha1:"+commit || a.Size == nil {
		p.t.Fatalf("%s: artifact %+v, want path %s and revision master@sha1:%s", name, a, want, commit)
	}
	if err := storage.Verify(p.ctx, p.store, a.Path, a.Digest); err != nil {
		p.t.Fatalf("%s: %v", name, err)
	}
	if err := storage.Verify(p.ctx, p.store, storage.ArtifactKey(sourcev1.GitRepositoryKind, "default", name, storage.LatestName), a.Digest); err != nil {
		p.t.Fatalf("%s: latest: %v", name, err)
	}
}

// TestSameContentFetchedOnce runs the fetcher and the packager over one
// repository: sources with the same content cost one clone, each still
// gets its artifact at its own path; what changes the content (the ignore
// rules, a new commit) is cloned again.
func TestSameContentFetchedOnce(t *testing.T) {
	p := newPipeline(t)

	const sources = 10
	var digest string
	for i := range sources {
		name := fmt.Sprintf("app-%02d", i)
		out := p.packaged(name, nil)
		p.checkArtifact(name, p.commit, out)
		if i == 0 {
			digest = out.Artifact.Digest
		}
		if out.Artifact.Digest != digest {
			t.Errorf("%s: digest %s, want the first source's %s", name, out.Artifact.Digest, digest)
		}
		if out.EventMessage != "stored artifact for commit 'initial commit'" {
			t.Errorf("%s: event message %q", name, out.EventMessage)
		}
	}
	if n := p.clones.Load(); n != 1 {
		t.Errorf("%d sources of one repository, fetched one after the other, cloned %d times, want once", sources, n)
	}
	// The fetcher observes a job's duration after it published the job,
	// so the last outcome may arrive first.
	if n := eventuallyHistogramCount(t, p.reg, "headwater_fetch_duration_seconds", ResultReused, sources-1); n != sources-1 {
		t.Errorf("reused fetches = %d, want %d", n, sources-1)
	}

	// Bit rot in one file: on directory storage every source's artifact and
	// the cache's copy are that file. The first source to notice is
	// fetched afresh (the cache's copy is broken too), which repairs the
	// cache; the next one reuses the repaired copy.
	corrupt := storage.ArtifactKey(sourcev1.GitRepositoryKind, "default", "app-00", p.commit+".tar.gz")
	f, err := os.OpenFile(filepath.Join(p.store.Path(), filepath.FromSlash(corrupt)), os.O_WRONLY, 0)
	must(t, err)
	_, err = f.WriteAt([]byte("rot"), 20)
	must(t, err)
	must(t, f.Close())
	for _, name := range []string{"app-01", "app-02"} {
		prev := &meta.Artifact{Path: storage.ArtifactKey(sourcev1.GitRepositoryKind, "default", name, p.commit+".tar.gz"),
			Revision: "master@sha1:" + p.commit, Digest: digest}
		out := p.packaged(name, func(r *events.FetchRequested) { r.Previous = prev })
		p.checkArtifact(name, p.commit, out)
		if out.Artifact.Digest != digest || len(out.Notices) != 1 || out.Notices[0].Reason != ArtifactVerificationFailedReason {
			t.Errorf("%s rebuilt: digest %s, notices %+v; want %s and an ArtifactVerificationFailed notice", name, out.Artifact.Digest, out.Notices, digest)
		}
	}
	if n := p.clones.Load(); n != 2 {
		t.Errorf("clones after repairing bit rot = %d, want 2", n)
	}

	// Other ignore rules make other content: a clone and another digest.
	ignore := "docs/\n"
	out := p.packaged("app-ignore", func(r *events.FetchRequested) { r.GitRepository.Ignore = &ignore })
	p.checkArtifact("app-ignore", p.commit, out)
	if out.Artifact.Digest == digest {
		t.Errorf("other ignore rules gave the same digest %s", digest)
	}
	if n := p.clones.Load(); n != 3 {
		t.Errorf("clones after a source with other ignore rules = %d, want 3", n)
	}
	// ... which the next source with those rules reuses.
	p.checkArtifact("app-ignore-2", p.commit, p.packaged("app-ignore-2", func(r *events.FetchRequested) { r.GitRepository.Ignore = &ignore }))
	if n := p.clones.Load(); n != 3 {
		t.Errorf("clones after a second source with the same ignore rules = %d, want 3", n)
	}

	// A new commit is new content.
	must(t, p.repo.Write(map[string]string{"README.md": "hello again"}))
	commit2, err := p.repo.Commit("second commit")
	must(t, err)
	// The listing cache may answer with the old commit for a moment.
	deadline := time.Now().Add(30 * time.Second)
	for {
		out = p.packaged("app-00", nil)
		if out.Artifact.Revision != "master@sha1:"+p.commit || time.Now().After(deadline) {
			break
		}
	}
	p.checkArtifact("app-00", commit2, out)
	if n := p.clones.Load(); n != 4 {
		t.Errorf("clones after a new commit = %d, want 4", n)
	}

	// Sources fetched at once all get the same artifact, whoever clones.
	jobs := map[string]string{}
	for i := range sources {
		name := fmt.Sprintf("app-%02d", i)
		jobs[p.request(name, nil).ID] = name
	}
	for id, out := range p.outcomes(sources) {
		p.checkArtifact(jobs[id], commit2, out)
	}
	if n := p.clones.Load(); n < 4 || n > 4+sources {
		t.Errorf("clones = %d", n)
	}
}

// TestFetchedCarriesContentKey checks the key the fetcher hands the
// packager, and that a recorded key is reused with the recorded artifact.
func TestFetchedCarriesContentKey(t *testing.T) {
	e := newEnv(t, 1, func(h *Handler) { h.ContentCache = true })
	e.request(t, "job-1", nil)
	f := e.fetched(t)
	if len(f.ContentKey) != 64 || f.Reuse != nil {
		t.Fatalf("fetched: content key %q, reuse %+v; want a key and no reuse", f.ContentKey, f.Reuse)
	}

	// Record an entry as the packager does.
	idx := contentcache.Index{Key: f.ContentKey, Artifact: contentcache.ArtifactKey(f.ContentKey), Digest: "sha256:abc",
		Algorithm: "sha256", Size: 7, Revision: f.Revision, ArtifactName: f.ArtifactName, EventMessage: f.EventMessage}
	body := fmt.Sprintf(`{"key":%q,"artifact":%q,"digest":%q,"algorithm":%q,"size":%d,"revision":%q,"artifactName":%q,"eventMessage":%q}`,
		idx.Key, idx.Artifact, idx.Digest, idx.Algorithm, idx.Size, idx.Revision, idx.ArtifactName, idx.EventMessage)
	_, err := e.store.Put(e.ctx, contentcache.IndexKey(f.ContentKey), strings.NewReader(body))
	must(t, err)
	_, err = e.store.Put(e.ctx, idx.Artifact, strings.NewReader("tarball"))
	must(t, err)
	// An index due for a refresh: the packager, the cache's one writer,
	// refreshes it; the fetcher only reads it.
	old := time.Now().Add(-2 * contentcache.RefreshAfter).Truncate(time.Second)
	must(t, os.Chtimes(filepath.Join(e.store.Path(), filepath.FromSlash(contentcache.IndexKey(f.ContentKey))), old, old))
	clones := e.uploads.Load()

	job := e.request(t, "job-2", func(r *events.FetchRequested) { r.Job.Object.Name = "other" })
	got := e.fetched(t)
	want := &events.Reuse{Key: idx.Artifact, Digest: idx.Digest, Size: idx.Size}
	if got.Job.ID != job.ID || got.Reuse == nil || *got.Reuse != *want || got.ContentKey != f.ContentKey ||
		got.ArtifactName != f.ArtifactName || got.EventMessage != f.EventMessage || got.Revision != f.Revision ||
		got.Staging != storage.StagingKey(job.ID) {
		t.Fatalf("reusing fetched = %+v, want reuse %+v with the first job's names", got, want)
	}
	if _, err := e.store.Stat(e.ctx, got.Staging); err == nil {
		t.Error("a reusing job staged content")
	}
	if n := e.uploads.Load(); n != clones {
		t.Errorf("a reusing job cloned: %d clones, want %d", n, clones)
	}
	if st, err := e.store.Stat(e.ctx, contentcache.IndexKey(f.ContentKey)); err != nil || !st.ModTime.Equal(old) {
		t.Errorf("index after the fetcher reused it: %+v, %v; want it untouched", st, err)
	}
}
