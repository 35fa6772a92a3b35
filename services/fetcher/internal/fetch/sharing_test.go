package fetch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/contentcache"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// handedOver is a Publisher that keeps the Fetched jobs handed to the
// packager: sharing decides what is handed over, the bus (tested with a
// real server beside the handler) how.
type handedOver struct {
	mu  sync.Mutex
	got map[string]*events.Fetched
}

func (p *handedOver) Publish(_ context.Context, subject, eventType string, job events.Job, data any) error {
	out, ok := data.(*events.Fetched)
	if !ok || eventType != events.TypeFetched || subject != events.PackageSubject(job.Object.Kind) {
		return errors.New("not a Fetched job for the packager")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.got == nil {
		p.got = map[string]*events.Fetched{}
	}
	p.got[job.ID] = out
	return nil
}

func (p *handedOver) of(job string) *events.Fetched {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.got[job]
}

// resolvedContent is a resolved source whose content may be shared; proving
// access reports on proving (when set) and fails with denied.
type resolvedContent struct {
	identity []string
	denied   error
	proving  chan struct{}
}

func (r *resolvedContent) Revision() string { return "main@sha1:0123" }
func (r *resolvedContent) Download(context.Context, string) (*source.Content, error) {
	return nil, errors.New("not downloaded in these tests")
}
func (r *resolvedContent) ContentIdentity() ([]string, bool) { return r.identity, r.identity != nil }
func (r *resolvedContent) ProveAccess(context.Context) error {
	if r.proving != nil {
		r.proving <- struct{}{}
	}
	return r.denied
}

// resolvedPrivate is a resolved source whose content is its own.
type resolvedPrivate struct{}

func (resolvedPrivate) Revision() string { return "v1" }
func (resolvedPrivate) Download(context.Context, string) (*source.Content, error) {
	return nil, errors.New("not downloaded")
}

// sharingFixture is a handler with the content cache on, over directory
// storage.
type sharingFixture struct {
	h     *Handler
	store *storage.Dir
	pub   *handedOver
	ctx   context.Context
}

func newSharingFixture(t *testing.T) *sharingFixture {
	t.Helper()
	store, err := storage.NewDir(t.TempDir())
	must(t, err)
	pub := &handedOver{}
	return &sharingFixture{h: &Handler{Storage: store, Publisher: pub, ContentCache: true}, store: store, pub: pub, ctx: t.Context()}
}

func fetchJob(id string) *events.FetchRequested {
	return &events.FetchRequested{Job: events.Job{ID: id, Object: events.ObjectRef{Kind: "GitRepository", Namespace: "ns", Name: id}}}
}

// stage puts content at job's staging key and returns the job's Fetched.
func (f *sharingFixture) stage(t *testing.T, req *events.FetchRequested, content string) *events.Fetched {
	t.Helper()
	key := storage.StagingKey(req.Job.ID)
	_, err := f.store.Put(f.ctx, key, strings.NewReader(content))
	must(t, err)
	return &events.Fetched{Job: req.Job, Revision: "main@sha1:0123", Staging: key, ArtifactName: "0123.tar.gz"}
}

// read returns what storage holds at key.
func (f *sharingFixture) read(t *testing.T, key string) string {
	t.Helper()
	obj, err := f.store.Open(f.ctx, key)
	must(t, err)
	defer obj.Close()
	b, err := io.ReadAll(obj)
	must(t, err)
	return string(b)
}

type joined struct {
	result string
	err    error
}

// joinAsync joins s in the background; it reports once s is proving its
// access, that is, once it waits on the flight it joined.
func joinAsync(f *sharingFixture, s *sharing) <-chan joined {
	c := make(chan joined, 1)
	go func() {
		result, err := s.join(f.ctx, f.ctx)
		c <- joined{result, err}
	}()
	return c
}

func within(t *testing.T, c <-chan joined) joined {
	t.Helper()
	select {
	case j := <-c:
		return j
	case <-time.After(30 * time.Second):
		t.Fatal("join did not return")
		return joined{}
	}
}

// TestSharingOnlyWhatMayBeShared: with the content cache off, for content
// that is a source's own, or without an identity, there is no sharing,
// and a nil sharing does nothing.
func TestSharingOnlyWhatMayBeShared(t *testing.T) {
	f := newSharingFixture(t)
	req := fetchJob("a")
	if s := f.h.sharing(req, resolvedPrivate{}, "v1", nil); s != nil {
		t.Errorf("content that may not be shared: %+v", s)
	}
	if s := f.h.sharing(req, &resolvedContent{}, "v1", nil); s != nil {
		t.Errorf("content without an identity: %+v", s)
	}
	off := &Handler{Storage: f.store, Publisher: f.pub}
	if s := off.sharing(req, &resolvedContent{identity: []string{"u"}}, "v1", nil); s != nil {
		t.Errorf("content cache off: %+v", s)
	}
	var s *sharing
	if result, err := s.join(f.ctx, f.ctx); result != "" || err != nil {
		t.Errorf("nil join = %q, %v", result, err)
	}
	if k := s.contentKey("v1"); k != "" {
		t.Errorf("nil content key %q", k)
	}
	s.offer(f.ctx, &events.Fetched{})
	s.leave(f.ctx)

	on := f.h.sharing(req, &resolvedContent{identity: []string{"u"}}, "v1", nil)
	if on == nil || on.key != contentcache.Key("GitRepository", []string{"u"}, "v1", nil, 0) || on.contentKey("v2") == on.key {
		t.Errorf("sharing %+v, want the content key of v1", on)
	}
}

// TestSharingFollowerCopiesTheLeader: of two fetches of one content, the
// first downloads; the second, once its own credentials proved they can
// read the upstream, copies what the first staged to its own staging key
// and hands that to the packager with its own notices. A follower whose
// credentials are refused gets the failure, and the leader carries on.
func TestSharingFollowerCopiesTheLeader(t *testing.T) {
	f := newSharingFixture(t)
	identity := []string{"https://example.com/repo.git"}
	leaderReq, followerReq, deniedReq := fetchJob("leader"), fetchJob("follower"), fetchJob("denied")
	leader := f.h.sharing(leaderReq, &resolvedContent{identity: identity}, "main@sha1:0123", nil)
	defer leader.leave(f.ctx)
	if result, err := leader.join(f.ctx, f.ctx); result != "" || err != nil {
		t.Fatalf("leader join = %q, %v; want to download", result, err)
	}

	proving := make(chan struct{}, 2)
	notices := []events.Notice{{Warning: true, Reason: events.ArtifactMissingReason, Message: "gone"}}
	follower := f.h.sharing(followerReq, &resolvedContent{identity: identity, proving: proving}, "main@sha1:0123", notices)
	denied := f.h.sharing(deniedReq, &resolvedContent{identity: identity, proving: proving,
		denied: failure.New(failure.Stalling, sourcev1.FetchFailedCondition, sourcev1.AuthenticationFailedReason, "denied")}, "main@sha1:0123", nil)
	followed, refused := joinAsync(f, follower), joinAsync(f, denied)
	<-proving
	<-proving

	if j := within(t, refused); j.result != "" || failure.As(j.err) == nil || failure.As(j.err).Reason != sourcev1.AuthenticationFailedReason {
		t.Errorf("denied follower = %q, %v; want its authentication failure", j.result, j.err)
	}
	out := f.stage(t, leaderReq, "the content")
	leader.offer(f.ctx, out)
	if j := within(t, followed); j.result != ResultJoined || j.err != nil {
		t.Fatalf("follower = %q, %v; want joined", j.result, j.err)
	}
	got := f.pub.of("follower")
	want := *out
	want.Job, want.Staging, want.Notices = followerReq.Job, storage.StagingKey("follower"), notices
	if got == nil || !reflect.DeepEqual(*got, want) {
		t.Fatalf("follower handed %+v, want %+v", got, want)
	}
	if c := f.read(t, got.Staging); c != "the content" {
		t.Errorf("follower's staged copy %q", c)
	}
	if f.pub.of("denied") != nil {
		t.Errorf("the denied follower was handed content")
	}
}

// TestSharingLeaderFailureLetsFollowersFetch: a leader that leaves without
// content lets its follower download itself.
func TestSharingLeaderFailureLetsFollowersFetch(t *testing.T) {
	f := newSharingFixture(t)
	identity := []string{"https://example.com/repo.git"}
	leader := f.h.sharing(fetchJob("leader"), &resolvedContent{identity: identity}, "main@sha1:0123", nil)
	if result, err := leader.join(f.ctx, f.ctx); result != "" || err != nil {
		t.Fatalf("leader join = %q, %v", result, err)
	}
	proving := make(chan struct{}, 1)
	follower := f.h.sharing(fetchJob("follower"), &resolvedContent{identity: identity, proving: proving}, "main@sha1:0123", nil)
	followed := joinAsync(f, follower)
	<-proving
	leader.leave(f.ctx)
	if j := within(t, followed); j.result != "" || j.err != nil {
		t.Fatalf("follower of a failed leader = %q, %v; want to download", j.result, j.err)
	}
	if follower.leader {
		t.Errorf("the follower leads a flight")
	}
	follower.offer(f.ctx, f.stage(t, fetchJob("follower"), "its own"))
	follower.leave(f.ctx)
	// No flight is left behind: the next fetch leads its own.
	next := f.h.sharing(fetchJob("next"), &resolvedContent{identity: identity}, "main@sha1:0123", nil)
	defer next.leave(f.ctx)
	if result, err := next.join(f.ctx, f.ctx); result != "" || err != nil || !next.leader {
		t.Errorf("next join = %q, %v, leader %v; want to lead a download", result, err, next.leader)
	}
}

// TestSharingCopiesALandingMomentsAgo: a fetch that starts just after a
// flight of its content landed copies what it staged, and lands with its
// copy; once the packager took that content, the next one downloads.
func TestSharingCopiesALandingMomentsAgo(t *testing.T) {
	f := newSharingFixture(t)
	identity := []string{"https://example.com/repo.git"}
	firstReq := fetchJob("first")
	first := f.h.sharing(firstReq, &resolvedContent{identity: identity}, "main@sha1:0123", nil)
	if result, err := first.join(f.ctx, f.ctx); result != "" || err != nil {
		t.Fatalf("first join = %q, %v", result, err)
	}
	out := f.stage(t, firstReq, "the content")
	first.offer(f.ctx, out)
	first.leave(f.ctx)

	late := f.h.sharing(fetchJob("late"), &resolvedContent{identity: identity}, "main@sha1:0123", nil)
	if result, err := late.join(f.ctx, f.ctx); result != ResultJoined || err != nil {
		t.Fatalf("late join = %q, %v; want joined", result, err)
	}
	got := f.pub.of("late")
	if got == nil || f.read(t, got.Staging) != "the content" {
		t.Fatalf("late handed %+v", got)
	}

	// The late fetch's copy landed in turn; the packager takes both.
	must(t, f.store.Delete(f.ctx, out.Staging))
	must(t, f.store.Delete(f.ctx, got.Staging))
	later := f.h.sharing(fetchJob("later"), &resolvedContent{identity: identity}, "main@sha1:0123", nil)
	defer later.leave(f.ctx)
	if result, err := later.join(f.ctx, f.ctx); result != "" || err != nil || !later.leader {
		t.Errorf("later join = %q, %v; want to lead a download", result, err)
	}
}

// TestSharingReusesTheContentCache: content the cache holds is handed
// over as a reuse, not downloaded; when the source's own artifact failed
// its digest, the cached one must pass it first.
func TestSharingReusesTheContentCache(t *testing.T) {
	f := newSharingFixture(t)
	identity := []string{"https://example.com/repo.git"}
	s := f.h.sharing(fetchJob("a"), &resolvedContent{identity: identity}, "main@sha1:0123", nil)
	info, err := f.store.Put(f.ctx, "gitrepository/ns/other/0123.tar.gz", strings.NewReader("artifact"))
	must(t, err)
	idx := contentcache.Index{Key: s.key, Artifact: contentcache.ArtifactKey(s.key), Digest: sha256Of("artifact"),
		Algorithm: "sha256", Size: info.Size, Revision: "main@sha1:0123", ArtifactName: "0123.tar.gz"}
	must(t, contentcache.Record(f.ctx, f.store, info, idx))
	if result, err := s.join(f.ctx, f.ctx); result != ResultReused || err != nil {
		t.Fatalf("join = %q, %v; want reused", result, err)
	}
	got := f.pub.of("a")
	if got == nil || got.Reuse == nil || got.Reuse.Key != idx.Artifact || got.ContentKey != s.key || got.Staging != storage.StagingKey("a") {
		t.Fatalf("handed %+v, want a reuse of %s", got, idx.Artifact)
	}

	// The cached copy is damaged: a source whose own artifact failed its
	// digest does not reuse it.
	_, err = f.store.Put(f.ctx, idx.Artifact, strings.NewReader("artifacZ"))
	must(t, err)
	notices := []events.Notice{{Warning: true, Reason: events.ArtifactVerificationFailedReason}}
	v := f.h.sharing(fetchJob("b"), &resolvedContent{identity: identity}, "main@sha1:0123", notices)
	defer v.leave(f.ctx)
	if result, err := v.join(f.ctx, f.ctx); result != "" || err != nil {
		t.Errorf("join over a damaged cache = %q, %v; want to download", result, err)
	}
}

// sha256Of is the digest of content in Flux's format.
func sha256Of(content string) string {
	sum := sha256.Sum256([]byte(content))
	return "sha256:" + hex.EncodeToString(sum[:])
}
