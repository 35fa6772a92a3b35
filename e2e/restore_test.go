package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/pkg/contentcache"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
	"github.com/headwater-gitops/headwater/testsupport/miniotest"
)

// restorePrefix is where the restore test's Envs keep their artifacts.
const restorePrefix = "restore"

// TestRestoreIntoFreshCluster is the restore of docs/operating.md: Env A
// (API server, NATS, services) stores the artifacts of two GitRepositories
// in a MinIO bucket and stops for good; Env B, a fresh cluster (new API
// server and etcd, new NATS with empty streams and KV buckets) on the same
// bucket, gets the same manifests. Both sources are Ready at the same
// revision, path and digest as before. The one whose content cache entry
// is in the bucket (.cache/, recorded when its artifact was stored, kept
// for -content-cache-ttl after its last use) is not fetched again: the
// git server answers a listing of its references and no fetch of objects,
// and the packager copies the cached artifact after checking its size and
// digest against the entry. The one whose entry is gone (removed here, as
// the packager's janitor removes an entry unused for the TTL) is fetched
// again, and its artifact made anew is the same, byte for byte.
func TestRestoreIntoFreshCluster(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	srv := miniotest.New(t)
	// The upstream outlives both clusters, as a real one does.
	git := &gitserver.Server{Root: t.TempDir()}
	if err := git.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = git.Stop() })
	work := t.TempDir()
	const cached, evicted = "restore-cached", "restore-evicted"
	commits := map[string]string{}
	for _, name := range []string{cached, evicted} {
		repo, err := gitserver.NewRepo(git.Root, name, filepath.Join(work, name), branch)
		if err != nil {
			t.Fatal(err)
		}
		files := sampleFiles(t)
		files["NAME"] = name + "\n" // a content of its own: a cache entry of its own
		commits[name] = commit(t, repo, files, "Initial commit of "+name)
	}

	// Env A stores the artifacts, then is gone.
	a := startRestoreEnv(t, "RestoreA", srv)
	before := map[string]string{} // name -> "path digest"
	digests := map[string]string{}
	for _, name := range []string{cached, evicted} {
		a.createSource(t, name, git.RepoURL(name))
	}
	for _, name := range []string{cached, evicted} {
		art := a.waitArtifact(t, name, revision(commits[name])).Status.Artifact
		before[name] = art.Path + " " + art.Digest
		digests[name] = art.Digest
	}
	a.stop(t)

	// The janitor's removal of an entry nobody used for the TTL.
	removeCacheEntry(t, srv, digests[evicted])

	fetched := map[string]int64{cached: git.FetchesOf(cached), evicted: git.FetchesOf(evicted)}
	listed := git.ListingsOf(cached)
	b := startRestoreEnv(t, "RestoreB", srv)
	applied := time.Now()
	for _, name := range []string{cached, evicted} {
		b.createSource(t, name, git.RepoURL(name))
	}
	for _, name := range []string{cached, evicted} {
		obj := b.waitArtifact(t, name, revision(commits[name]))
		t.Logf("%s Ready in the fresh cluster %s after it was applied", name, time.Since(applied).Round(100*time.Millisecond))
		art := obj.Status.Artifact
		if got := art.Path + " " + art.Digest; got != before[name] {
			t.Errorf("%s restored with artifact %q, Env A stored %q", name, got, before[name])
		}
		if got := sha256Digest(download(t, art.URL)); got != art.Digest {
			t.Errorf("%s: %s served with digest %s, status says %s", name, art.URL, got, art.Digest)
		}
	}
	if n := git.FetchesOf(cached) - fetched[cached]; n != 0 {
		t.Errorf("%s, whose artifact and cache entry are in the bucket, was fetched %d times by the fresh cluster, want 0", cached, n)
	}
	if n := git.ListingsOf(cached) - listed; n < 1 {
		t.Errorf("%s: the fresh cluster never listed its references (%d): its revision was not resolved", cached, n)
	}
	if n := git.FetchesOf(evicted) - fetched[evicted]; n < 1 {
		t.Errorf("%s, whose cache entry was removed, was not fetched again (%d fetches): what does the fresh cluster reuse?", evicted, n)
	}
	t.Logf("fresh cluster: %s fetched %d times, %s %d times", cached, git.FetchesOf(cached)-fetched[cached], evicted, git.FetchesOf(evicted)-fetched[evicted])
}

// restoreEnv is one of the restore test's clusters.
type restoreEnv struct {
	*privateEnv
	stopped bool
}

// startRestoreEnv starts an Env on MinIO srv (bucket s3Bucket, prefix
// restorePrefix) with its own control plane and NATS; it is stopped when
// the test ends unless stop stopped it before.
func startRestoreEnv(t *testing.T, label string, srv *miniotest.Server) *restoreEnv {
	t.Helper()
	cfg, err := testConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Dir, err = os.MkdirTemp("", "headwater-e2e-"+strings.ToLower(label)+"-")
	if err != nil {
		t.Fatal(err)
	}
	cfg.S3 = &harness.S3Storage{Endpoint: srv.Endpoint, Bucket: s3Bucket, Prefix: restorePrefix, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey}
	cfg.ExtraArgs[harness.Watcher] = append(cfg.ExtraArgs[harness.Watcher], "-leader-elect=false")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	e, err := harness.Start(ctx, cfg)
	if err != nil {
		dumpServiceLogs(os.Stderr, cfg.Dir)
		t.Fatalf("start the %s Env (state and logs in %s): %v", label, cfg.Dir, err)
	}
	r := &restoreEnv{privateEnv: &privateEnv{Env: e, minio: srv}}
	t.Cleanup(func() {
		if t.Failed() {
			for _, svc := range e.Services() {
				t.Logf("--- %s Env %s (running=%v)\n%s", label, svc.Name, svc.Running(), svc.LogTail(80))
			}
		}
		if !r.stopped {
			r.stop(t)
		}
		if t.Failed() {
			t.Logf("%s Env state and logs kept in %s", label, cfg.Dir)
		} else {
			_ = os.RemoveAll(cfg.Dir)
		}
	})
	return r
}

// stop stops the Env: every service must exit cleanly.
func (r *restoreEnv) stop(t *testing.T) {
	t.Helper()
	r.stopped = true
	if err := r.Stop(); err != nil {
		t.Errorf("stop the Env (every service must exit cleanly on SIGTERM): %v", err)
	}
}

// removeCacheEntry deletes the content cache entry (index and cached
// artifact) whose artifact has digest from the restore bucket.
func removeCacheEntry(t *testing.T, srv *miniotest.Server, digest string) {
	t.Helper()
	ctx := t.Context()
	prefix := restorePrefix + "/" + contentcache.Dir + "/"
	var found []string
	for o := range srv.Client.ListObjects(ctx, s3Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		if !strings.HasSuffix(o.Key, ".json") {
			continue
		}
		obj, err := srv.Client.GetObject(ctx, s3Bucket, o.Key, minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(obj)
		_ = obj.Close()
		if err != nil {
			t.Fatal(err)
		}
		var idx contentcache.Index
		if err := json.Unmarshal(body, &idx); err != nil {
			t.Fatalf("%s: %v", o.Key, err)
		}
		if idx.Digest == digest {
			found = append(found, o.Key, restorePrefix+"/"+idx.Artifact)
		}
	}
	if len(found) != 2 {
		t.Fatalf("content cache entries of digest %s: %v, want one (index and artifact)", digest, found)
	}
	for _, key := range found {
		if err := srv.Client.RemoveObject(ctx, s3Bucket, key, minio.RemoveObjectOptions{}); err != nil {
			t.Fatal(fmt.Errorf("remove %s: %w", key, err))
		}
	}
}
