package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/minio/minio-go/v7"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
	"github.com/headwater-gitops/headwater/testsupport/miniotest"
)

// s3Bucket and s3Prefix are where the S3 Env keeps its artifacts.
const (
	s3Bucket = "headwater"
	s3Prefix = "e2e"
)

// privateEnv is an Env a test starts for itself (startPrivateEnv), with a
// control plane, NATS and a git server of its own, so it runs alongside the
// package's Env: the S3 Env, whose fetcher, packager and two artifact-server
// replicas share a MinIO bucket (minio), and the sha512 and failover Envs.
type privateEnv struct {
	*harness.Env
	minio    *miniotest.Server
	recorder *eventRecorder
}

// startPrivateEnv starts an Env of the test's own, set up by configure,
// alongside the package's Env, and stops it when the test ends, after
// checking that every service is still running and then exits cleanly on
// SIGTERM. label names it in messages and in its state directory.
func startPrivateEnv(t *testing.T, label string, configure func(*harness.Config)) *privateEnv {
	t.Helper()
	cfg, err := testConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Dir, err = os.MkdirTemp("", "headwater-e2e-"+strings.ToLower(label)+"-")
	if err != nil {
		t.Fatal(err)
	}
	configure(&cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	e, err := harness.Start(ctx, cfg)
	if err != nil {
		dumpServiceLogs(os.Stderr, cfg.Dir)
		t.Fatalf("start the %s Env (state and logs in %s): %v", label, cfg.Dir, err)
	}
	t.Cleanup(func() {
		for _, svc := range e.Services() {
			if !svc.Running() {
				t.Errorf("%s Env: %s is not running (exit: %v)", label, svc.Name, svc.ExitErr())
			}
		}
		if t.Failed() {
			for _, svc := range e.Services() {
				t.Logf("--- %s Env %s (running=%v)\n%s", label, svc.Name, svc.Running(), svc.LogTail(80))
			}
		}
		if err := e.Stop(); err != nil {
			t.Errorf("stop the %s Env (every service must exit cleanly on SIGTERM): %v", label, err)
		}
		if t.Failed() {
			t.Logf("%s Env state and logs kept in %s", label, cfg.Dir)
		} else {
			_ = os.RemoveAll(cfg.Dir)
		}
	})
	s := &privateEnv{Env: e, recorder: &eventRecorder{}}
	stop, err := harness.SubscribeEvents(e.NATSURL, subscriberAuth(e), s.recorder.record)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return s
}

// startS3Env starts an S3 Env for the test and stops it when the test ends.
// Retention keeps the newest 2 artifacts with no grace period, and the single
// watcher runs without leader election, so a killed one does not leave a
// lease behind for its successor to wait out.
func startS3Env(t *testing.T) *privateEnv {
	t.Helper()
	srv := miniotest.New(t)
	s := startPrivateEnv(t, "S3", func(cfg *harness.Config) {
		cfg.S3 = &harness.S3Storage{Endpoint: srv.Endpoint, Bucket: s3Bucket, Prefix: s3Prefix, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey}
		cfg.ArtifactServerReplicas = 2
		cfg.ExtraArgs = map[string][]string{
			harness.Packager: {"-artifact-retention-records", "2", "-artifact-retention-ttl", "0s"},
			harness.Watcher:  {"-leader-elect=false"},
		}
	})
	s.minio = srv
	return s
}

// TestS3Storage runs the whole system with S3 as the shared storage: the
// GitRepository walkthrough, served by either artifact-server replica; every
// service killed and started again, the artifact still served and the status
// still right; and retention on the bucket.
func TestS3Storage(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	e := startS3Env(t)
	const name = "s3-podinfo"
	repo, commit1 := e.newRepo(t, name, sampleFiles(t))
	e.createSource(t, name, e.Git.RepoURL(name))
	obj := e.waitArtifact(t, name, revision(commit1))
	e.checkStored(t, obj, commit1, treeAt(t, repo, commit1))

	t.Run("stored in the bucket", func(t *testing.T) {
		a := obj.Status.Artifact
		info, err := e.minio.Client.StatObject(t.Context(), s3Bucket, s3Prefix+"/"+a.Path, minio.StatObjectOptions{})
		if err != nil {
			t.Fatalf("artifact %s is not in bucket %s under %s/: %v", a.Path, s3Bucket, s3Prefix, err)
		}
		if a.Size == nil || info.Size != *a.Size {
			t.Errorf("object of %d bytes, status says %v", info.Size, a.Size)
		}
		var files []string
		err = filepath.WalkDir(e.StoragePath, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				files = append(files, p)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(files) > 0 {
			t.Errorf("the directory storage is used alongside S3: %v", files)
		}
	})

	t.Run("CloudEvent", func(t *testing.T) {
		ce := e.waitCloudEvent(t, name, events.TypeArtifactStored, func(o *events.Outcome) bool {
			return o.Artifact != nil && o.Artifact.Digest == obj.Status.Artifact.Digest
		})
		if ce.outcome().Artifact.URL != obj.Status.Artifact.URL {
			t.Errorf("CloudEvent artifact url %s, want %s", ce.outcome().Artifact.URL, obj.Status.Artifact.URL)
		}
	})

	// Every service is killed, as a crash would, then started again.
	t.Run("restart every service", func(t *testing.T) {
		pids := map[string]int{}
		for _, s := range e.Services() {
			pids[s.Name] = s.Pid()
			s.Kill()
		}
		for _, s := range e.Services() {
			if err := s.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			if s.Pid() == pids[s.Name] {
				t.Fatalf("%s was not restarted", s.Name)
			}
		}
		after := e.get(t, name)
		if a, prev := after.Status.Artifact, obj.Status.Artifact; a == nil || a.Digest != prev.Digest || a.URL != prev.URL {
			t.Fatalf("artifact after the restart %+v, want %+v", a, prev)
		}
		e.checkServed(t, obj.Status.Artifact)

		// The restarted pipeline sees the stored artifact: a reconcile with
		// nothing new keeps it.
		token := e.requestReconcile(t, name)
		e.waitCloudEvent(t, name, events.TypeArtifactUnchanged, func(o *events.Outcome) bool {
			return o.Job.ReconcileToken == token && o.Artifact != nil && o.Artifact.Digest == obj.Status.Artifact.Digest
		})
		var now *sourcev1.GitRepository
		eventually(t, "lastHandledReconcileAt "+token, func() error {
			now = e.get(t, name)
			if now.Status.LastHandledReconcileAt != token {
				return fmt.Errorf("lastHandledReconcileAt %q", now.Status.LastHandledReconcileAt)
			}
			return nil
		})
		e.checkStored(t, now, commit1, treeAt(t, repo, commit1))
		if a, prev := now.Status.Artifact, obj.Status.Artifact; !a.LastUpdateTime.Equal(&prev.LastUpdateTime) {
			t.Errorf("artifact lastUpdateTime %s after a reconcile with nothing new, was %s", a.LastUpdateTime, prev.LastUpdateTime)
		}
	})

	// Four new commits with retention of 2 and no grace period: the bucket
	// keeps the newest two artifacts and the latest pointer.
	t.Run("retention", func(t *testing.T) {
		var commits []string
		var last *sourcev1.GitRepository
		for i := range 4 {
			c := commit(t, repo, map[string]string{"CHANGELOG.md": fmt.Sprintf("# Changes\n\n%d\n", i)}, fmt.Sprintf("Change %d", i))
			e.requestReconcile(t, name)
			last = e.waitArtifact(t, name, revision(c))
			commits = append(commits, c)
		}
		e.checkStored(t, last, commits[3], treeAt(t, repo, commits[3]))
		dir := path.Dir(last.Status.Artifact.Path)
		want := []string{commits[2] + ".tar.gz", commits[3] + ".tar.gz", "latest.tar.gz"}
		slices.Sort(want)
		eventually(t, "the bucket keeps the newest two artifacts", func() error {
			if got := e.listBucket(t, dir); !slices.Equal(got, want) {
				return fmt.Errorf("%s/%s/ holds %v, want %v", s3Prefix, dir, got, want)
			}
			return nil
		})
		eventually(t, "no staged content is left", func() error {
			if got := e.listBucket(t, ".staging"); len(got) > 0 {
				return fmt.Errorf("%s/.staging/ holds %v", s3Prefix, got)
			}
			return nil
		})
		e.checkServed(t, last.Status.Artifact)
		gone := e.Env.ArtifactURL(path.Join(dir, commit1+".tar.gz"))
		if status, _ := httpGet(t, gone); status != http.StatusNotFound {
			t.Errorf("GET %s (collected) answers %d, want 404", gone, status)
		}
	})
}

// checkServed downloads artifact a and its latest.tar.gz from every
// artifact-server replica: each must serve exactly the artifact in status.
func (e *privateEnv) checkServed(t *testing.T, a *meta.Artifact) {
	t.Helper()
	if len(e.ArtifactServerAddrs) < 2 {
		t.Fatalf("%d artifact-server replicas, want 2", len(e.ArtifactServerAddrs))
	}
	latest := path.Join(path.Dir(a.Path), "latest.tar.gz")
	for i, addr := range e.ArtifactServerAddrs {
		for _, key := range []string{a.Path, latest} {
			url := "http://" + addr + "/" + key
			if got := sha256Digest(download(t, url)); got != a.Digest {
				t.Errorf("replica %d: %s has digest %s, want %s", i+1, url, got, a.Digest)
			}
		}
	}
}

// listBucket lists the file names in the storage directory dir of the
// bucket.
func (e *privateEnv) listBucket(t *testing.T, dir string) []string {
	t.Helper()
	prefix := s3Prefix + "/" + strings.Trim(dir, "/") + "/"
	var names []string
	for o := range e.minio.Client.ListObjects(t.Context(), s3Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if o.Err != nil {
			t.Fatalf("list %s: %v", prefix, o.Err)
		}
		names = append(names, strings.TrimPrefix(o.Key, prefix))
	}
	slices.Sort(names)
	return names
}

// checkStored checks what Flux shows for a GitRepository of the S3 Env
// that stored an artifact for commit, and that the artifact holds tree.
func (e *privateEnv) checkStored(t *testing.T, obj *sourcev1.GitRepository, commit string, tree map[string]string) {
	t.Helper()
	a := obj.Status.Artifact
	p := fmt.Sprintf("gitrepository/%s/%s/%s.tar.gz", obj.Namespace, obj.Name, commit)
	if a.Path != p || a.Revision != revision(commit) || !digestPattern.MatchString(a.Digest) {
		t.Errorf("artifact path %q revision %q digest %q, want %q %q sha256:<hex>", a.Path, a.Revision, a.Digest, p, revision(commit))
	}
	if want := e.ArtifactURL(p); a.URL != want {
		t.Errorf("artifact url %q, want %q", a.URL, want)
	}
	for _, typ := range []string{meta.ReadyCondition, sourcev1.ArtifactInStorageCondition} {
		c := apimeta.FindStatusCondition(obj.Status.Conditions, typ)
		if c == nil || c.Status != metav1.ConditionTrue || c.Message != storedMessage(commit) {
			t.Errorf("%s condition %+v, want True %q", typ, c, storedMessage(commit))
		}
	}
	body := download(t, a.URL)
	if got := sha256Digest(body); got != a.Digest {
		t.Errorf("downloaded %s has digest %s, status says %s", a.URL, got, a.Digest)
	}
	if d := diffTrees(untarArtifact(t, body), tree); d != "" {
		t.Errorf("artifact is not the tree at %s: %s", commit, d)
	}
	e.checkServed(t, a)
}

// newRepo creates a repository served by the S3 Env's git server, with
// files committed on master, and returns it with the commit.
func (e *privateEnv) newRepo(t *testing.T, name string, files map[string]string) (*gitserver.Repo, string) {
	t.Helper()
	repo, err := e.NewRepo(name, branch)
	if err != nil {
		t.Fatal(err)
	}
	return repo, commit(t, repo, files, "Initial commit of "+name)
}

// createSource creates a GitRepository in the S3 Env.
func (e *privateEnv) createSource(t *testing.T, name, url string) {
	t.Helper()
	obj := &sourcev1.GitRepository{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: sourcev1.GitRepositorySpec{
			URL:       url,
			Interval:  metav1.Duration{Duration: 5 * time.Minute},
			Reference: &sourcev1.GitRepositoryRef{Branch: branch},
		},
	}
	if err := e.Client.Create(t.Context(), obj); err != nil {
		t.Fatalf("create gitrepository %s: %v", name, err)
	}
}

// get returns the GitRepository name of the S3 Env.
func (e *privateEnv) get(t *testing.T, name string) *sourcev1.GitRepository {
	t.Helper()
	var obj sourcev1.GitRepository
	if err := e.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, &obj); err != nil {
		t.Fatalf("get gitrepository %s: %v", name, err)
	}
	return &obj
}

// requestReconcile sets reconcile.fluxcd.io/requestedAt on a GitRepository
// of the S3 Env and returns the token.
func (e *privateEnv) requestReconcile(t *testing.T, name string) string {
	t.Helper()
	obj := e.get(t, name)
	base := client.MergeFrom(obj.DeepCopy())
	token := time.Now().UTC().Format(time.RFC3339Nano)
	if obj.Annotations == nil {
		obj.Annotations = map[string]string{}
	}
	obj.Annotations[meta.ReconcileRequestAnnotation] = token
	if err := e.Client.Patch(t.Context(), obj, base); err != nil {
		t.Fatalf("patch gitrepository %s: %v", name, err)
	}
	return token
}

// waitArtifact waits until a GitRepository of the S3 Env is Ready for its
// generation with an artifact of revision rev.
func (e *privateEnv) waitArtifact(t *testing.T, name, rev string) *sourcev1.GitRepository {
	t.Helper()
	var obj *sourcev1.GitRepository
	eventually(t, fmt.Sprintf("S3 Env: gitrepository %s Ready with revision %s", name, rev), func() error {
		obj = e.get(t, name)
		ready := apimeta.FindStatusCondition(obj.Status.Conditions, meta.ReadyCondition)
		switch {
		case ready == nil:
			return errors.New("no Ready condition yet")
		case ready.Status != metav1.ConditionTrue:
			return fmt.Errorf("Ready=%s %s: %s", ready.Status, ready.Reason, ready.Message)
		case obj.Status.Artifact == nil || obj.Status.Artifact.Revision != rev:
			return fmt.Errorf("artifact %+v", obj.Status.Artifact)
		case obj.Status.ObservedGeneration != obj.Generation:
			return fmt.Errorf("observedGeneration %d, generation %d", obj.Status.ObservedGeneration, obj.Generation)
		}
		return nil
	})
	return obj
}

// waitCloudEvent waits for a public CloudEvent of the S3 Env about the
// GitRepository name.
func (e *privateEnv) waitCloudEvent(t *testing.T, name, eventType string, match func(*events.Outcome) bool) recordedEvent {
	t.Helper()
	return waitCloudEvent(t, e.recorder, kind, name, eventType, match)
}
