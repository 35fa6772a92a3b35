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
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-logr/logr"
	"github.com/minio/minio-go/v7"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/headwater-gitops/headwater/pkg/bus"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/pkg/telemetry"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/bucketfetch"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/testsupport/miniotest"
	"github.com/headwater-gitops/headwater/testsupport/natsserver"
)

// bucketEnv is a fetcher worker on an embedded NATS server, with directory
// storage and a MinIO server behind a proxy that counts object downloads.
type bucketEnv struct {
	*env
	minio    *miniotest.Server
	endpoint string       // the proxy's host:port
	gets     atomic.Int64 // GETs of objects: not listings, not bucket checks
}

const testBucket = "testbucket"

func newBucketEnv(t *testing.T) *bucketEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	e := &bucketEnv{env: &env{ctx: ctx}}

	ns, err := natsserver.Start(natsserver.Options{StoreDir: t.TempDir()})
	must(t, err)
	e.conn, err = bus.Connect(ctx, bus.Options{URL: ns.ClientURL()}, "fetcher-test", logr.Discard())
	must(t, err)
	must(t, e.conn.EnsureStreams(ctx))
	cons, err := e.conn.EnsureConsumer(ctx, events.FetchStream,
		events.Consumer(events.FetchStream, events.FetcherConsumer, events.ConsumerOptions{MaxDeliver: 2}))
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

	// The bucket, served through a proxy that counts object downloads.
	e.minio = miniotest.New(t)
	e.minio.MakeBucket(t, testBucket)
	target, err := url.Parse(e.minio.URL())
	must(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	counting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.TrimPrefix(r.URL.Path, "/"+testBucket+"/") != r.URL.Path &&
			len(r.URL.Path) > len("/"+testBucket+"/") {
			e.gets.Add(1)
		}
		proxy.ServeHTTP(w, r)
	}))
	e.endpoint = counting.Listener.Addr().String()

	scheme := runtime.NewScheme()
	must(t, corev1.AddToScheme(scheme))
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "minio-credentials"},
		Data:       map[string][]byte{"accesskey": []byte(e.minio.AccessKey), "secretkey": []byte(e.minio.SecretKey)},
	}).Build()

	e.reg = prometheus.NewRegistry()
	e.tempDir = t.TempDir()
	h := &Handler{
		Sources:   map[string]source.Source{bucketfetch.Kind: &bucketfetch.Source{Secrets: secrets.NewKube(kube), Concurrency: 2}},
		Storage:   e.store,
		Publisher: e.conn.NewPublisher("fetcher"),
		TempDir:   e.tempDir,
		Metrics:   NewMetrics(e.reg),
	}
	w := &bus.Worker{
		Service:     "fetcher",
		Consumer:    cons,
		Concurrency: 2,
		Handler:     h.Handle,
		Report:      h.Report,
		Metrics:     telemetry.NewJobMetrics(e.reg, "fetcher"),
		Log:         logr.Discard(),
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
		counting.Close()
		e.conn.Close()
		ns.Shutdown()
		ns.WaitForShutdown()
		_ = e.store.Close()
	})
	return e
}

// put stores an object in the bucket.
func (e *bucketEnv) put(t *testing.T, key, content string) {
	t.Helper()
	_, err := e.minio.Client.PutObject(e.ctx, testBucket, key, strings.NewReader(content), int64(len(content)), minio.PutObjectOptions{})
	must(t, err)
}

// request publishes a FetchRequested for the testbucket Bucket.
func (e *bucketEnv) request(t *testing.T, jobID string, prev *meta.Artifact, mutate ...func(*sourcev1.BucketSpec)) events.Job {
	t.Helper()
	req := &events.FetchRequested{
		Job: events.Job{ID: jobID, RequestedAt: time.Now().UTC(),
			Object: events.ObjectRef{Kind: sourcev1.BucketKind, Namespace: "default", Name: "testbucket", UID: "uid-1", Generation: 1}},
		Bucket: &sourcev1.BucketSpec{Provider: sourcev1.BucketProviderGeneric, BucketName: testBucket, Endpoint: e.endpoint,
			Insecure: true, SecretRef: &meta.LocalObjectReference{Name: "minio-credentials"}},
		Previous: prev,
	}
	for _, m := range mutate {
		m(req.Bucket)
	}
	must(t, e.pub.Publish(e.ctx, events.FetchSubject(req.Job.Object.Kind), events.TypeFetchRequested, req.Job, req))
	return req.Job
}

// stagedFiles returns the regular files of a staged tar with their content.
func (e *bucketEnv) stagedFiles(t *testing.T, key string) map[string]string {
	t.Helper()
	obj, err := e.store.Open(e.ctx, key)
	must(t, err)
	defer obj.Close()
	out := map[string]string{}
	tr := tar.NewReader(obj)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		must(t, err)
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			must(t, err)
			out[h.Name] = string(b)
		}
	}
}

// storeArtifact stores content as the artifact of a Fetched job, as the
// packager would, and returns the record the watcher keeps in status.
func (e *bucketEnv) storeArtifact(t *testing.T, f *events.Fetched, content string) *meta.Artifact {
	t.Helper()
	key := storage.ArtifactKey(sourcev1.BucketKind, "default", "testbucket", f.ArtifactName)
	_, err := e.store.Put(e.ctx, key, strings.NewReader(content))
	must(t, err)
	sum := sha256.Sum256([]byte(content))
	return &meta.Artifact{Path: key, Revision: f.Revision, Digest: "sha256:" + hex.EncodeToString(sum[:])}
}

// TestBucketWalkthrough follows Flux's Bucket walkthrough at the
// fetcher: a new bucket is fetched, an unchanged one downloads nothing, a
// changed one is fetched again.
func TestBucketWalkthrough(t *testing.T) {
	e := newBucketEnv(t)
	e.put(t, "TESTFILE.md", "11111")

	job := e.request(t, "job-1", nil)
	f := e.fetched(t)
	hexRev, ok := strings.CutPrefix(f.Revision, "sha256:")
	if !ok || len(hexRev) != 64 {
		t.Fatalf("revision = %q, want sha256:<hex>", f.Revision)
	}
	want := events.Fetched{
		Job: job, Revision: f.Revision, Staging: storage.StagingKey("job-1"), ArtifactName: hexRev + ".tar.gz",
		EventMessage: "stored artifact with 1 fetched files from 'testbucket' bucket",
	}
	f.Job.RequestedAt, want.Job.RequestedAt = time.Time{}, time.Time{}
	if !reflect.DeepEqual(*f, want) {
		t.Errorf("fetched = %+v\nwant      %+v", *f, want)
	}
	if got, want := e.stagedFiles(t, f.Staging), map[string]string{"TESTFILE.md": "11111"}; !reflect.DeepEqual(got, want) {
		t.Errorf("staged files = %v, want %v", got, want)
	}
	gets := e.gets.Load()
	if gets != 1 {
		t.Errorf("object downloads = %d, want 1", gets)
	}

	// The stored artifact holds the bucket's revision: nothing is
	// downloaded.
	prev := e.storeArtifact(t, f, "artifact bytes")
	job2 := e.request(t, "job-2", prev)
	out := e.outcome(t, events.TypeFetchUnchanged)
	if out.Job.ID != job2.ID || out.Revision != f.Revision || !reflect.DeepEqual(out.Artifact, prev) || out.Failure != nil {
		t.Errorf("unchanged outcome = %+v, want revision %s and artifact %+v", out, f.Revision, prev)
	}
	e.waitEmpty(t)
	if got := e.gets.Load(); got != gets {
		t.Errorf("an unchanged bucket was downloaded: %d object downloads, want %d", got, gets)
	}

	// The object is overwritten: a new revision, and its content.
	e.put(t, "TESTFILE.md", "22222")
	e.request(t, "job-3", prev)
	f3 := e.fetched(t)
	if f3.Revision == f.Revision || f3.ArtifactName != strings.TrimPrefix(f3.Revision, "sha256:")+".tar.gz" {
		t.Errorf("revision after a change = %s (artifact %s), before %s", f3.Revision, f3.ArtifactName, f.Revision)
	}
	if got, want := e.stagedFiles(t, f3.Staging), map[string]string{"TESTFILE.md": "22222"}; !reflect.DeepEqual(got, want) {
		t.Errorf("staged files = %v, want %v", got, want)
	}
	if got := e.gets.Load(); got != gets+1 {
		t.Errorf("object downloads = %d, want %d", got, gets+1)
	}
}

func TestBucketFailures(t *testing.T) {
	e := newBucketEnv(t)
	cases := []struct {
		name    string
		mutate  func(*sourcev1.BucketSpec)
		failure events.Failure
	}{
		{
			name:   "missing bucket",
			mutate: func(s *sourcev1.BucketSpec) { s.BucketName = "nope" },
			failure: events.Failure{Condition: sourcev1.FetchFailedCondition, Reason: sourcev1.BucketOperationFailedReason,
				Message: "bucket 'nope' not found", Transient: true, Retrying: true},
		},
		{
			name: "azure endpoint that is no URL",
			mutate: func(s *sourcev1.BucketSpec) {
				s.Provider, s.Endpoint = sourcev1.BucketProviderAzure, "account.blob.core.windows.net"
			},
			failure: events.Failure{Condition: sourcev1.FetchFailedCondition, Reason: sourcev1.URLInvalidReason,
				Message: "invalid endpoint 'account.blob.core.windows.net': want the account's blob service URL, https://<account>.blob.core.windows.net", Stalled: true},
		},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job := e.request(t, "job-"+tc.name, nil, tc.mutate)
			out := e.outcome(t, events.TypeFetchFailed)
			if out.Job.ID != job.ID || out.Failure == nil || *out.Failure != tc.failure {
				t.Errorf("outcome %d = %+v, failure %+v\nwant failure %+v", i, out, out.Failure, tc.failure)
			}
			// A transient failure is retried once (MaxDeliver 2), a stalled
			// one is not; either way the job ends.
			e.waitEmpty(t)
		})
	}
	if n := jobsTotal(t, e.reg, "failed"); n != 2 {
		t.Errorf("terminated jobs = %v, want 2", n)
	}
	if n := jobsTotal(t, e.reg, "retry"); n != 1 {
		t.Errorf("retried attempts = %v, want 1 (the missing bucket's)", n)
	}
}
