package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/minio/minio-go/v7"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
	"github.com/headwater-gitops/headwater/testsupport/miniotest"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// The fault suite's size. `go test` (and `make test`) runs the small
// version; `make test-faults` sets the flags for a few hundred sources.
var (
	faultSources    = flag.Int("fault-sources", 40, "GitRepositories the fault suite keeps, per storage (make test-faults: 300).")
	faultRepos      = flag.Int("fault-repos", 8, "Git repositories the fault suite's sources are spread over.")
	faultRounds     = flag.Int("fault-rounds", 1, "Rounds of each fault kind the fault suite injects, per storage.")
	faultSequential = flag.Bool("fault-sequential", false, "Run the fault suite on directory storage, then on MinIO, rather than on both at once.")
	faultSeed       = flag.Uint64("fault-seed", 0, "Seed of the fault suite's random choices; 0 takes one from the clock (it is logged).")
)

const (
	// faultStagingTTL is the packager's -staging-ttl in the fault suite:
	// staged content a killed service left behind is swept after it.
	faultStagingTTL = 10 * time.Second
	// faultCacheTTL is the packager's -content-cache-ttl (its minimum):
	// the cache janitor sweeps every quarter of it.
	faultCacheTTL = 5 * time.Minute
	// faultRetention is the packager's -artifact-retention-records, with
	// no grace period: a source's directory holds at most this many
	// artifacts once its last packaging has finished.
	faultRetention = 2
	// faultRoundTimeout bounds a round's wait for its sources; one that
	// has not recovered by then is lost.
	faultRoundTimeout = 5 * time.Minute
	// faultS3Prefix is where the MinIO fault Env keeps its storage.
	faultS3Prefix = "faults"
)

// The faults the suite injects, each a kill -9 of one process at a random
// moment while the round's jobs are under way, then its restart.
const (
	faultFetcher        = "fetcher"
	faultPackager       = "packager"
	faultArtifactServer = "artifact-server"
	faultWatcherLeader  = "watcher leader"
	faultNATS           = "NATS server"
)

var faultKinds = []string{faultFetcher, faultPackager, faultArtifactServer, faultWatcherLeader, faultNATS}

// TestFaultSuite keeps GitRepositories over a set of git repositories, on
// directory storage and on MinIO, and in rounds pushes a commit to a third
// of the repositories, asks their sources to reconcile (as a push webhook
// does) and, at a random moment while those jobs are under way, kills one
// process with SIGKILL and starts it again: a fetcher, a packager, an
// artifact-server (two replicas of each), the leading watcher (of two), or
// the NATS server (restarted on the same JetStream store and port). After
// each round every source must be Ready with the artifact of its latest
// commit, whose digest verifies when downloaded; the storage must hold
// exactly what the statuses and retention account for; staged content and
// the fetchers' scratch directories must be empty, the content cache
// consistent; and every new revision must have had its ArtifactStored
// CloudEvent (seen by a subscriber with the subscriber identity) and its
// NewArtifact Kubernetes Event. It prints, per storage, a table of the
// faults injected, the sources they affected (those still working on their
// new revision at the moment of the fault), how many recovered, how many
// were lost (which fails the test) and the time from the fault to the
// source's recovery.
func TestFaultSuite(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	seed := *faultSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("fault suite: %d sources over %d repositories per storage, %d round(s) of each fault, seed %d (-fault-seed replays the choices)",
		*faultSources, *faultRepos, *faultRounds, seed)
	for i, storage := range []string{"directory", "MinIO"} {
		t.Run(storage, func(t *testing.T) {
			if !*faultSequential {
				t.Parallel()
			}
			f := startFaultEnv(t, storage)
			f.setup(t)
			rnd := rand.New(rand.NewPCG(seed, uint64(i)))
			var kinds []string
			for range *faultRounds {
				kinds = append(kinds, faultKinds...)
			}
			rnd.Shuffle(len(kinds), func(a, b int) { kinds[a], kinds[b] = kinds[b], kinds[a] })
			for n, kind := range kinds {
				f.round(t, rnd, n+1, kind)
			}
			f.checkFinal(t)
			t.Logf("fault suite on %s storage, %d sources over %d repositories:\n%s", storage, len(f.sources), len(f.repos), f.table())
			for _, k := range faultKinds {
				if s := f.stats[k]; s != nil && (s.lost > 0 || s.orphans > 0) {
					t.Errorf("%s: %d source(s) lost, %d orphaned data", k, s.lost, s.orphans)
				}
			}
		})
	}
}

// faultEnv is a private Env the fault suite drives, with its repositories,
// sources and figures.
type faultEnv struct {
	*privateEnv
	storage string
	js      jetstream.JetStream // as the admin, to read the event stream
	tracker *sourceTracker
	repos   []*faultRepo
	sources []faultSource
	latest  map[string]string // source -> the revision it must have
	stats   map[string]*faultStats
	// caughtUp counts the CloudEvents the live subscriber missed (it was
	// disconnected while NATS restarted) and the event stream still had.
	caughtUp int
}

// faultRepo is a served repository and every commit pushed to it.
type faultRepo struct {
	name    string
	repo    *gitserver.Repo
	commits map[string]string // commit -> its subject
	pushes  int
}

// faultSource is a GitRepository of the suite and its repository.
type faultSource struct {
	name string
	repo int
}

// faultStats are one fault kind's figures.
type faultStats struct {
	injected, affected, recovered, lost, orphans int
	recovery                                     []time.Duration
}

// startFaultEnv starts the fault suite's Env on storage ("directory" or
// "MinIO"): two replicas of every service, the watchers electing a
// leader, retention of faultRetention artifacts, staged content swept
// after faultStagingTTL.
func startFaultEnv(t *testing.T, storage string) *faultEnv {
	t.Helper()
	var srv *miniotest.Server
	if storage == "MinIO" {
		srv = miniotest.New(t)
	}
	pe := startPrivateEnv(t, "faults-"+strings.ToLower(storage), func(cfg *harness.Config) {
		if srv != nil {
			cfg.S3 = &harness.S3Storage{Endpoint: srv.Endpoint, Bucket: s3Bucket, Prefix: faultS3Prefix, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey}
		}
		cfg.ArtifactServerReplicas, cfg.PackagerReplicas, cfg.FetcherReplicas, cfg.WatcherReplicas = 2, 2, 2, 2
		cfg.ExtraArgs[harness.Watcher] = append(cfg.ExtraArgs[harness.Watcher], "-leader-elect=true")
		cfg.ExtraArgs[harness.Packager] = append(cfg.ExtraArgs[harness.Packager],
			"-artifact-retention-records", fmt.Sprint(faultRetention), "-artifact-retention-ttl", "0s",
			"-staging-ttl", faultStagingTTL.String(), "-content-cache-ttl", faultCacheTTL.String())
	})
	pe.minio = srv
	f := &faultEnv{privateEnv: pe, storage: storage, latest: map[string]string{}, stats: map[string]*faultStats{}}

	auth, err := pe.NATSOption(natsserver.Admin)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(pe.NATSURL, auth, nats.MaxReconnects(-1), nats.ReconnectWait(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if f.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}

	c, err := client.NewWithWatch(pe.RESTConfig, client.Options{Scheme: pe.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	f.tracker = &sourceTracker{first: map[string]map[string]time.Time{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.tracker.run(ctx, c)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

// setup creates the repositories and the sources, and waits until every
// source is Ready with its repository's first commit.
func (f *faultEnv) setup(t *testing.T) {
	t.Helper()
	repos := max(*faultRepos, 1)
	for i := range max(*faultSources, 1) {
		f.sources = append(f.sources, faultSource{name: fmt.Sprintf("fault-%03d", i), repo: i % repos})
	}
	for j := range repos {
		name := fmt.Sprintf("faults-%02d", j)
		repo, err := f.NewRepo(name, branch)
		if err != nil {
			t.Fatal(err)
		}
		f.repos = append(f.repos, &faultRepo{name: name, repo: repo, commits: map[string]string{}})
		f.push(t, j)
	}
	err := forEachConcurrently(t.Context(), len(f.sources), func(ctx context.Context, i int) error {
		s := f.sources[i]
		obj := &sourcev1.GitRepository{
			ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: namespace},
			Spec: sourcev1.GitRepositorySpec{
				URL:       f.Git.RepoURL(f.repos[s.repo].name),
				Interval:  metav1.Duration{Duration: 10 * time.Minute},
				Reference: &sourcev1.GitRepositoryRef{Branch: branch},
			},
		}
		return f.Client.Create(ctx, obj)
	})
	if err != nil {
		t.Fatalf("create sources: %v", err)
	}
	want := map[string]string{}
	for _, s := range f.sources {
		want[s.name] = f.latest[s.name]
	}
	start := time.Now()
	if missing := f.tracker.wait(t.Context(), want, faultRoundTimeout); len(missing) > 0 {
		t.Fatalf("%d of %d sources not Ready with their first revision after %s: %v", len(missing), len(want), faultRoundTimeout, head(missing))
	}
	t.Logf("%s storage: %d sources Ready in %s", f.storage, len(f.sources), time.Since(start).Round(time.Millisecond))
	if lost, orphans := f.check(t, want); len(lost) > 0 || len(orphans) > 0 {
		t.Fatalf("before any fault: %v", head(append(sortedProblems(lost), orphans...)))
	}
}

// push commits a change to repository j and records it as the revision
// every source of the repository must get.
func (f *faultEnv) push(t *testing.T, j int) {
	t.Helper()
	r := f.repos[j]
	r.pushes++
	subject := fmt.Sprintf("Change %d of %s", r.pushes, r.name)
	if err := r.repo.Write(map[string]string{
		"README.md":       "# " + r.name + "\n",
		"deploy/app.yaml": fmt.Sprintf("kind: App\nname: %s\nversion: %d\n", r.name, r.pushes),
	}); err != nil {
		t.Fatal(err)
	}
	c, err := r.repo.Commit(subject)
	if err != nil {
		t.Fatal(err)
	}
	r.commits[c] = subject
	for _, s := range f.sources {
		if s.repo == j {
			f.latest[s.name] = revision(c)
		}
	}
}

// round pushes to a third of the repositories, requests a reconcile of
// their sources and injects a fault of kind while they work, once a
// random number of them (from none to half) have their new revision; then
// it waits for every source and checks the whole system.
func (f *faultEnv) round(t *testing.T, rnd *rand.Rand, n int, kind string) {
	t.Helper()
	picked := rnd.Perm(len(f.repos))[:max(len(f.repos)/3, 1)]
	want := map[string]string{}
	for _, j := range picked {
		f.push(t, j)
		for _, s := range f.sources {
			if s.repo == j {
				want[s.name] = f.latest[s.name]
			}
		}
	}
	names := slices.Sorted(maps.Keys(want))
	threshold := rnd.IntN(len(names)/2 + 1)
	choice := rnd.Uint64()

	requested := make(chan error, 1)
	go func() {
		requested <- forEachConcurrently(t.Context(), len(names), func(ctx context.Context, i int) error {
			return f.requestReconcileCtx(ctx, names[i])
		})
	}()
	// The fault comes once threshold sources of the round have their new
	// revision.
	for f.tracker.count(want) < threshold {
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	injectedAt := time.Now()
	var affected []string
	for _, name := range names {
		if _, ok := f.tracker.readyAt(name, want[name]); !ok {
			affected = append(affected, name)
		}
	}
	hit, err := f.inject(t.Context(), kind, choice)
	if err != nil {
		t.Fatalf("round %d: inject %s: %v", n, kind, err)
	}
	if err := <-requested; err != nil {
		t.Fatalf("round %d: request reconciles: %v", n, err)
	}
	missing := f.tracker.wait(t.Context(), want, faultRoundTimeout)

	st := f.stats[kind]
	if st == nil {
		st = &faultStats{}
		f.stats[kind] = st
	}
	st.injected++
	st.affected += len(affected)
	lost, orphans := f.check(t, want)
	for _, name := range missing {
		lost[name] = append(lost[name], fmt.Sprintf("not Ready with %s within %s of the fault", want[name], faultRoundTimeout))
	}
	for _, name := range affected {
		at, ok := f.tracker.readyAt(name, want[name])
		if ok && len(lost[name]) == 0 {
			st.recovered++
			st.recovery = append(st.recovery, max(at.Sub(injectedAt), 0))
		}
	}
	st.lost += len(lost)
	st.orphans += len(orphans)
	t.Logf("%s storage, round %d: %s (%s) killed after %d of %d sources had their new revision; %d affected, %d lost, %d orphaned data",
		f.storage, n, kind, hit, threshold, len(names), len(affected), len(lost), len(orphans))
	for _, p := range head(append(sortedProblems(lost), orphans...)) {
		t.Errorf("%s storage, round %d (%s): %s", f.storage, n, kind, p)
	}
}

// inject kills the process kind names (a replica chosen by choice) with
// SIGKILL and starts it again, and says which it was.
func (f *faultEnv) inject(ctx context.Context, kind string, choice uint64) (string, error) {
	if kind == faultNATS {
		return "embedded", f.RestartNATS()
	}
	var victim *harness.Service
	switch kind {
	case faultFetcher, faultPackager, faultArtifactServer:
		replicas := f.Replicas(kind)
		victim = replicas[choice%uint64(len(replicas))]
	case faultWatcherLeader:
		// The leader is the replica that says so; after the last round's
		// failover one may still be taking over.
		err := pollUntil(ctx, timeout, func() error {
			for _, s := range f.Watchers() {
				if s.Running() && isLeader(s) {
					victim = s
					return nil
				}
			}
			return errors.New("no watcher replica leads")
		})
		if err != nil {
			return "", err
		}
	default:
		return "", fmt.Errorf("unknown fault %q", kind)
	}
	victim.Kill()
	startCtx, cancel := context.WithTimeout(ctx, 2*timeout)
	defer cancel()
	return victim.Name, victim.Start(startCtx)
}

// check checks the whole system once every source should have its latest
// revision, want being the sources that got a new one this round. It
// returns what was lost, per source (an artifact, its status, its
// CloudEvent or its Event), and the data found orphaned (anything in
// storage no status accounts for, staged content, temporary files and
// scratch data left beyond the janitors' TTL, a broken cache entry).
func (f *faultEnv) check(t *testing.T, want map[string]string) (lost map[string][]string, orphans []string) {
	t.Helper()
	lost = map[string][]string{}
	add := func(name, format string, args ...any) {
		lost[name] = append(lost[name], fmt.Sprintf(format, args...))
	}
	orphan := func(format string, args ...any) {
		orphans = append(orphans, fmt.Sprintf(format, args...))
	}

	// Every source is Ready with the artifact of its latest commit, and
	// the artifact downloads with its digest.
	var list sourcev1.GitRepositoryList
	if err := f.Client.List(t.Context(), &list, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	objs := map[string]*sourcev1.GitRepository{}
	for i := range list.Items {
		objs[list.Items[i].Name] = &list.Items[i]
	}
	var mu sync.Mutex
	err := forEachConcurrently(t.Context(), len(f.sources), func(ctx context.Context, i int) error {
		name := f.sources[i].name
		obj := objs[name]
		var p string
		switch ready := apimetaReady(obj); {
		case obj == nil:
			p = "gone"
		case ready == nil || ready.Status != metav1.ConditionTrue:
			p = fmt.Sprintf("not Ready: %+v", ready)
		case obj.Status.Artifact == nil || obj.Status.Artifact.Revision != f.latest[name]:
			p = fmt.Sprintf("artifact %+v, want revision %s", obj.Status.Artifact, f.latest[name])
		default:
			status, body, err := httpGetCtx(ctx, obj.Status.Artifact.URL)
			switch {
			case err != nil:
				p = err.Error()
			case status != 200:
				p = fmt.Sprintf("GET %s: %d", obj.Status.Artifact.URL, status)
			case sha256Digest(body) != obj.Status.Artifact.Digest:
				p = fmt.Sprintf("GET %s: digest %s, status says %s", obj.Status.Artifact.URL, sha256Digest(body), obj.Status.Artifact.Digest)
			}
		}
		if p != "" {
			mu.Lock()
			add(name, "%s", p)
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	f.checkStorage(t, objs, add, orphan)
	f.checkCloudEvents(t, want, add)
	f.checkKubeEvents(t, want, add)
	f.checkScratch(t, orphan)
	slices.Sort(orphans)
	return lost, orphans
}

// checkStorage compares the storage with the statuses: each source's
// directory holds its status artifact (of the size in status; else it is
// lost), its latest pointer and older artifacts of its repository's
// commits only, no more than retention keeps once the source's packaging
// is done (else they are orphaned); no directory belongs to no source;
// staged content and the temporary files of writes a killed process
// abandoned are gone within the staging janitor's TTL; and every content
// cache index has its cached artifact.
func (f *faultEnv) checkStorage(t *testing.T, objs map[string]*sourcev1.GitRepository, add func(string, string, ...any), orphan func(string, ...any)) {
	t.Helper()
	files := f.storageFiles(t, "gitrepository/"+namespace)
	bySource := map[string]map[string]int64{}
	for key, size := range files {
		name, file, _ := strings.Cut(key, "/")
		if bySource[name] == nil {
			bySource[name] = map[string]int64{}
		}
		bySource[name][file] = size
	}
	known := map[string]bool{}
	for _, s := range f.sources {
		known[s.name] = true
		obj, stored := objs[s.name], bySource[s.name]
		if obj == nil || obj.Status.Artifact == nil {
			continue // reported already
		}
		a := obj.Status.Artifact
		file := strings.TrimPrefix(a.Path, "gitrepository/"+namespace+"/"+s.name+"/")
		if size, ok := stored[file]; !ok {
			add(s.name, "status artifact %s is not in storage (stored: %v)", a.Path, slices.Sorted(maps.Keys(stored)))
		} else if a.Size != nil && size >= 0 && size != *a.Size {
			add(s.name, "stored %s has %d bytes, status says %d", a.Path, size, *a.Size)
		}
		if _, ok := stored["latest.tar.gz"]; !ok {
			add(s.name, "no latest.tar.gz in storage")
		}
		artifacts := 0
		for name := range stored {
			commit, ok := strings.CutSuffix(name, ".tar.gz")
			switch {
			case name == "latest.tar.gz":
			case ok && f.repos[s.repo].commits[commit] != "":
				artifacts++
			case isTemporary(name):
				// Checked below, once the janitor's TTL has passed.
			default:
				orphan("%s: storage holds %s, which no status or retention accounts for", s.name, name)
			}
		}
		if artifacts > faultRetention {
			orphan("%s: storage holds %d artifacts, retention keeps %d", s.name, artifacts, faultRetention)
		}
	}
	for name := range bySource {
		if !known[name] {
			orphan("storage holds gitrepository/%s/%s/ of no source", namespace, name)
		}
	}

	// Staged content: the packager deletes it once its job is done, the
	// janitor what a killed process left behind, after faultStagingTTL;
	// and the temporary files of writes a killed process abandoned.
	err := pollUntil(t.Context(), 4*faultStagingTTL+timeout, func() error {
		if left := f.storageFiles(t, ".staging"); len(left) > 0 {
			return fmt.Errorf("staged content left: %v", head(slices.Sorted(maps.Keys(left))))
		}
		var temporary []string
		for key := range f.storageFiles(t, "") {
			if isTemporary(pathBase(key)) {
				temporary = append(temporary, key)
			}
		}
		if len(temporary) > 0 {
			slices.Sort(temporary)
			return fmt.Errorf("temporary files left: %v", head(temporary))
		}
		return nil
	})
	if err != nil {
		orphan("%v", err)
	}

	// The content cache: an index without its cached artifact is a
	// broken entry. (A cached artifact without index, left by a packager
	// killed between the two writes, is swept by the janitor every
	// quarter of the cache TTL; checkFinal waits for that.)
	cache := f.storageFiles(t, ".cache")
	for key := range cache {
		if k, ok := strings.CutSuffix(key, ".json"); ok {
			if _, ok := cache[k+".tar.gz"]; !ok {
				orphan("content cache index %s has no cached artifact", key)
			}
		} else if !strings.HasSuffix(key, ".tar.gz") && !isTemporary(key) {
			orphan("content cache holds %s", key)
		}
	}
}

// checkFinal waits for the content cache janitor to remove every cached
// artifact without an index.
func (f *faultEnv) checkFinal(t *testing.T) {
	t.Helper()
	err := pollUntil(t.Context(), faultCacheTTL/4+2*timeout, func() error {
		cache := f.storageFiles(t, ".cache")
		var orphans []string
		for key := range cache {
			if k, ok := strings.CutSuffix(key, ".tar.gz"); ok {
				if _, ok := cache[k+".json"]; !ok {
					orphans = append(orphans, key)
				}
			}
		}
		if len(orphans) > 0 {
			return fmt.Errorf("cached artifacts without index: %v", orphans)
		}
		return nil
	})
	if err != nil {
		t.Errorf("%s storage: %v", f.storage, err)
	}
}

// checkCloudEvents checks that every source of want had an ArtifactStored
// CloudEvent for its new revision: seen by the live subscriber or, when
// it was disconnected (NATS restarting), kept on the event stream that
// subscribers catch up from.
func (f *faultEnv) checkCloudEvents(t *testing.T, want map[string]string, add func(string, string, ...any)) {
	t.Helper()
	stored := func(e recordedEvent, rev string) bool {
		o := e.outcome()
		return e.err == nil && e.msg.Event.Type() == events.TypeArtifactStored && o != nil && o.Artifact != nil && o.Artifact.Revision == rev
	}
	// The announcements may still be on their way to the subscriber.
	var unseen []string
	_ = pollUntil(t.Context(), 10*time.Second, func() error {
		unseen = unseen[:0]
		for name, rev := range want {
			if !slices.ContainsFunc(f.recorder.forSubject(events.EventSubject(kind, namespace, name)), func(e recordedEvent) bool { return stored(e, rev) }) {
				unseen = append(unseen, name)
			}
		}
		if len(unseen) > 0 {
			return errors.New("unseen")
		}
		return nil
	})
	for _, name := range unseen {
		kept, err := f.streamEvents(t.Context(), events.EventSubject(kind, namespace, name))
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(kept, func(e recordedEvent) bool { return stored(e, want[name]) }) {
			f.caughtUp++
			continue
		}
		add(name, "no %s CloudEvent for %s", events.TypeArtifactStored, want[name])
	}
}

// streamEvents reads every event the event stream keeps on subject.
func (f *faultEnv) streamEvents(ctx context.Context, subject string) ([]recordedEvent, error) {
	c, err := f.js.OrderedConsumer(ctx, events.EventStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", subject, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", subject, err)
	}
	var out []recordedEvent
	for pending := int(info.NumPending); pending > 0; {
		batch, err := c.Fetch(pending, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", subject, err)
		}
		got := 0
		for msg := range batch.Messages() {
			m, err := events.Decode(msg.Data())
			out = append(out, recordedEvent{subject: msg.Subject(), msg: m, err: err})
			got++
		}
		if batch.Error() != nil || got == 0 {
			return out, batch.Error()
		}
		pending -= got
	}
	return out, nil
}

// checkKubeEvents checks that every source of want had a NewArtifact
// Kubernetes Event for its new revision (whose message names the
// commit's subject, as Flux's does). Events are recorded asynchronously,
// so it waits for them.
func (f *faultEnv) checkKubeEvents(t *testing.T, want map[string]string, add func(string, string, ...any)) {
	t.Helper()
	subjects := map[string]string{}
	for name, rev := range want {
		commit := strings.TrimPrefix(rev, branch+"@sha1:")
		for _, s := range f.sources {
			if s.name == name {
				subjects[name] = f.repos[s.repo].commits[commit]
			}
		}
	}
	var missing []string
	_ = pollUntil(t.Context(), timeout, func() error {
		var list corev1.EventList
		if err := f.Client.List(t.Context(), &list, client.InNamespace(namespace)); err != nil {
			return err
		}
		found := map[string]bool{}
		for _, e := range list.Items {
			if e.InvolvedObject.Kind == kind && e.Reason == "NewArtifact" && strings.Contains(e.Message, "'"+subjects[e.InvolvedObject.Name]+"'") {
				found[e.InvolvedObject.Name] = true
			}
		}
		missing = missing[:0]
		for name := range want {
			if !found[name] {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			return errors.New("missing")
		}
		return nil
	})
	for _, name := range missing {
		add(name, "no NewArtifact Event for %s (%q)", want[name], subjects[name])
	}
}

// checkScratch checks that no fetcher keeps scratch data of a finished
// job or of a killed process: each fetcher's TMPDIR holds only its work
// directory, which holds its lock and the one run directory of the live
// process, with no job's directory left in it (a job still under way, such
// as an interval's reconcile, may have one for a moment).
func (f *faultEnv) checkScratch(t *testing.T, orphan func(string, ...any)) {
	t.Helper()
	for _, s := range f.Replicas(harness.Fetcher) {
		err := pollUntil(t.Context(), timeout, func() error {
			left, err := scratchLeft(s.TempDir)
			if err != nil {
				t.Fatal(err)
			}
			runs := slices.DeleteFunc(slices.Clone(left), func(p string) bool { return !strings.HasPrefix(filepath.Base(p), "run-") })
			if len(runs) != 1 || len(left) != 1 {
				return fmt.Errorf("%s's scratch directory holds %v, want one run directory of the live process", s.Name, left)
			}
			return nil
		})
		if err != nil {
			orphan("%v", err)
		}
	}
}

// scratchLeft lists what a fetcher's TMPDIR holds besides its work
// directory and lock and the Helm index cache of its run directory.
func scratchLeft(tmp string) ([]string, error) {
	var left []string
	err := filepath.WalkDir(tmp, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(tmp, p)
		parts := strings.Split(rel, string(filepath.Separator))
		switch {
		case rel == ".", rel == "headwater-fetcher", len(parts) == 2 && parts[0] == "headwater-fetcher" && parts[1] == ".lock":
		case len(parts) == 2 && parts[0] == "headwater-fetcher" && strings.HasPrefix(parts[1], "run-") && d.IsDir():
			left = append(left, rel) // one is the live process's
		case len(parts) == 3 && strings.HasPrefix(parts[2], "helm-index-recent-"):
			return fs.SkipDir
		default:
			left = append(left, rel)
			if d.IsDir() {
				return fs.SkipDir
			}
		}
		return nil
	})
	return left, err
}

// storageFiles lists every object or file under dir ("" for all) of the
// storage, hidden ones included, as path below dir -> size (-1 for a
// symlink).
func (f *faultEnv) storageFiles(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	if f.minio != nil {
		prefix := strings.TrimSuffix(faultS3Prefix+"/"+dir, "/") + "/"
		for o := range f.minio.Client.ListObjects(t.Context(), s3Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
			if o.Err != nil {
				t.Fatalf("list %s: %v", prefix, o.Err)
			}
			out[strings.TrimPrefix(o.Key, prefix)] = o.Size
		}
		return out
	}
	root := filepath.Join(f.StoragePath, filepath.FromSlash(dir))
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		size := int64(-1)
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				size = fi.Size()
			}
		}
		out[filepath.ToSlash(rel)] = size
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// table formats the figures, one row per fault kind.
func (f *faultEnv) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "| %-15s | %8s | %8s | %9s | %4s | %7s | %12s | %12s |\n", "fault", "injected", "affected", "recovered", "lost", "orphans", "recovery p50", "recovery p99")
	fmt.Fprintf(&b, "|%s|%s|%s|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 17), strings.Repeat("-", 10), strings.Repeat("-", 10), strings.Repeat("-", 11), strings.Repeat("-", 6), strings.Repeat("-", 9), strings.Repeat("-", 14), strings.Repeat("-", 14))
	for _, k := range faultKinds {
		s := f.stats[k]
		if s == nil {
			continue
		}
		fmt.Fprintf(&b, "| %-15s | %8d | %8d | %9d | %4d | %7d | %12s | %12s |\n", k, s.injected, s.affected, s.recovered, s.lost, s.orphans,
			percentile(s.recovery, 50), percentile(s.recovery, 99))
	}
	fmt.Fprintf(&b, "CloudEvents the live subscriber missed while NATS restarted, read from the event stream: %d", f.caughtUp)
	return b.String()
}

// percentile is the p-th percentile of d (nearest rank), "-" when empty.
func percentile(d []time.Duration, p int) string {
	if len(d) == 0 {
		return "-"
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := max((p*len(s)+99)/100-1, 0)
	return s[i].Round(10 * time.Millisecond).String()
}

// requestReconcileCtx sets reconcile.fluxcd.io/requestedAt on a
// GitRepository of the Env, as a push webhook's receiver does.
func (f *faultEnv) requestReconcileCtx(ctx context.Context, name string) error {
	var obj sourcev1.GitRepository
	if err := f.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &obj); err != nil {
		return err
	}
	base := client.MergeFrom(obj.DeepCopy())
	if obj.Annotations == nil {
		obj.Annotations = map[string]string{}
	}
	obj.Annotations[meta.ReconcileRequestAnnotation] = time.Now().UTC().Format(time.RFC3339Nano)
	return f.Client.Patch(ctx, &obj, base)
}

// sourceTracker follows the GitRepositories of the default namespace with
// one list and watch and remembers when each was first seen Ready with
// each revision.
type sourceTracker struct {
	mu    sync.Mutex
	first map[string]map[string]time.Time // name -> revision -> first seen Ready with it
}

// run lists and watches until ctx ends, relisting when a watch ends.
func (tr *sourceTracker) run(ctx context.Context, c client.WithWatch) {
	for ctx.Err() == nil {
		var list sourcev1.GitRepositoryList
		if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		for i := range list.Items {
			tr.observe(&list.Items[i])
		}
		w, err := c.Watch(ctx, &sourcev1.GitRepositoryList{}, client.InNamespace(namespace),
			&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
		if err != nil {
			continue
		}
		for ev := range w.ResultChan() {
			if o, ok := ev.Object.(*sourcev1.GitRepository); ok && ev.Type != watch.Error {
				tr.observe(o)
			}
		}
		w.Stop()
	}
}

// observe records o's revision if o is Ready with it for its generation.
func (tr *sourceTracker) observe(o *sourcev1.GitRepository) {
	ready := apimetaReady(o)
	if ready == nil || ready.Status != metav1.ConditionTrue || o.Status.Artifact == nil || o.Status.ObservedGeneration != o.Generation {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	revs := tr.first[o.Name]
	if revs == nil {
		revs = map[string]time.Time{}
		tr.first[o.Name] = revs
	}
	if _, ok := revs[o.Status.Artifact.Revision]; !ok {
		revs[o.Status.Artifact.Revision] = time.Now()
	}
}

// readyAt is when the source name was first seen Ready with rev.
func (tr *sourceTracker) readyAt(name, rev string) (time.Time, bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	at, ok := tr.first[name][rev]
	return at, ok
}

// count is how many sources of want have been seen Ready with their
// revision.
func (tr *sourceTracker) count(want map[string]string) int {
	n := 0
	for name, rev := range want {
		if _, ok := tr.readyAt(name, rev); ok {
			n++
		}
	}
	return n
}

// wait waits until every source of want has been seen Ready with its
// revision, or d passes, and returns those that have not, sorted.
func (tr *sourceTracker) wait(ctx context.Context, want map[string]string, d time.Duration) []string {
	var missing []string
	_ = pollUntil(ctx, d, func() error {
		missing = missing[:0]
		for name, rev := range want {
			if _, ok := tr.readyAt(name, rev); !ok {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			return errors.New("waiting")
		}
		return nil
	})
	slices.Sort(missing)
	return missing
}

// pollUntil calls check every pollStep until it returns nil, d passes (it
// returns check's last error) or ctx ends.
func pollUntil(ctx context.Context, d time.Duration, check func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := check()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollStep):
		}
	}
}

// forEachConcurrently calls fn for 0..n-1, eight at a time, and returns
// the first error.
func forEachConcurrently(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := fn(ctx, i); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}

// httpGetCtx GETs url and returns the status code and body.
func httpGetCtx(ctx context.Context, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// apimetaReady is the Ready condition of o, nil for none or no object.
func apimetaReady(o *sourcev1.GitRepository) *metav1.Condition {
	if o == nil {
		return nil
	}
	return apimeta.FindStatusCondition(o.Status.Conditions, meta.ReadyCondition)
}

// isTemporary reports whether a stored file's name is that of a directory
// storage write's temporary file (".<name>.tmp-<hex>").
func isTemporary(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, ".tmp-")
}

// pathBase is the last element of a slash-separated path.
func pathBase(p string) string {
	return p[strings.LastIndex(p, "/")+1:]
}

// sortedProblems flattens problems into sorted lines.
func sortedProblems(problems map[string][]string) []string {
	var out []string
	for name, ps := range problems {
		for _, p := range ps {
			out = append(out, name+": "+p)
		}
	}
	slices.Sort(out)
	return out
}

// head is the first 20 of s, saying how many more there are.
func head(s []string) []string {
	if len(s) <= 20 {
		return s
	}
	return append(slices.Clone(s[:20]), fmt.Sprintf("... and %d more", len(s)-20))
}

// forSubject returns the recorded events on subject so far.
func (r *eventRecorder) forSubject(subject string) []recordedEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []recordedEvent
	for _, e := range r.events {
		if e.subject == subject {
			out = append(out, e)
		}
	}
	return out
}
