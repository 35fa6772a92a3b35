package clustertest

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	fluxmeta "github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/minio/minio-go/v7"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/headwater-gitops/headwater/e2e/cluster/kubetest"
	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
	"github.com/headwater-gitops/headwater/testsupport/registry"
)

// canI asks the API server whether the ServiceAccount sa of Headwater's
// namespace may do verb on resource (in namespace, or cluster-wide when
// empty).
func canI(t *testing.T, sa, verb, resource, namespace string) bool {
	t.Helper()
	args := []string{"auth", "can-i", verb, resource, "--as=system:serviceaccount:" + ns + ":" + sa}
	if namespace == "" {
		args = append(args, "--all-namespaces")
	} else {
		args = append(args, "-n", namespace)
	}
	out, err := env.C.Kubectl(context.Background(), args...).Run()
	answer := strings.TrimSpace(out)
	if err != nil && answer != "no" {
		t.Fatalf("kubectl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return answer == "yes"
}

// testLeastPrivilege checks each service account's rights as the API
// server sees them.
func testLeastPrivilege(t *testing.T) {
	for _, c := range []struct {
		sa, verb, resource, namespace string
		want                          bool
	}{
		// The watcher writes status, Events and finalizers; it reads no
		// Secret.
		{"watcher", "patch", "gitrepositories.source.toolkit.fluxcd.io/status", "", true},
		{"watcher", "create", "events", "default", true},
		{"watcher", "get", "secrets", "default", false},
		{"watcher", "delete", "gitrepositories.source.toolkit.fluxcd.io", "", false},
		// Fetchers read the Secrets sources name, one at a time, and
		// write nothing.
		{"fetcher", "get", "secrets", "default", true},
		{"fetcher", "list", "secrets", "default", false},
		{"fetcher", "watch", "secrets", "default", false},
		{"fetcher", "patch", "gitrepositories.source.toolkit.fluxcd.io/status", "", false},
		{"fetcher", "create", "events", "default", false},
		// Packagers and artifact-servers never talk to the API.
		{"packager", "get", "gitrepositories.source.toolkit.fluxcd.io", "", false},
		{"packager", "get", "secrets", ns, false},
		{"artifact-server", "get", "gitrepositories.source.toolkit.fluxcd.io", "", false},
		{"artifact-server", "get", "secrets", ns, false},
		// The setup Job creates the bus's Secrets in its own namespace
		// only, and never lists or deletes one.
		{"setup", "create", "secrets", ns, true},
		{"setup", "create", "secrets", "default", false},
		{"setup", "list", "secrets", ns, false},
		{"setup", "delete", "secrets", ns, false},
		{"setup", "get", "gitrepositories.source.toolkit.fluxcd.io", "", false},
	} {
		if got := canI(t, c.sa, c.verb, c.resource, c.namespace); got != c.want {
			t.Errorf("%s may %s %s in %q: %v, want %v", c.sa, c.verb, c.resource, c.namespace, got, c.want)
		}
	}
}

// testIntegrity corrupts and then deletes the stored artifact of gr in
// the in-cluster object store: each time the next reconcile records a
// Warning Event and rebuilds the same artifact.
func testIntegrity(t *testing.T, cl ctrlclient.Client, gr *sourcev1.GitRepository) {
	mc, bucket := inClusterS3(t)
	ctx := context.Background()
	a := gr.Status.Artifact
	key := findKey(t, mc, bucket, a.Path)
	for _, c := range []struct {
		name, reason string
		damage       func() error
	}{
		{"corrupted", "ArtifactVerificationFailed", func() error {
			_, err := mc.PutObject(ctx, bucket, key, strings.NewReader("not a tarball"), 13, minio.PutObjectOptions{})
			return err
		}},
		{"deleted", "ArtifactMissing", func() error { return mc.RemoveObject(ctx, bucket, key, minio.RemoveObjectOptions{}) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := len(events(t, gr.Namespace, gr.Name, c.reason))
			if err := c.damage(); err != nil {
				t.Fatal(err)
			}
			requestReconcile(t, cl, gr)
			kubetest.Eventually(t, 2*time.Minute, c.reason+" Event and the artifact rebuilt", func(ctx context.Context) error {
				if n := len(events(t, gr.Namespace, gr.Name, c.reason)); n <= before {
					return fmt.Errorf("no new %s Event", c.reason)
				}
				digest, err := fetchArtifact(ctx, a)
				if err != nil {
					return err
				}
				if digest != a.Digest {
					return fmt.Errorf("artifact digest %s, want %s", digest, a.Digest)
				}
				return nil
			})
		})
	}
}

// findKey is the object key of an artifact path (the store may add a
// prefix).
func findKey(t *testing.T, mc *minio.Client, bucket, path string) string {
	t.Helper()
	for o := range mc.ListObjects(context.Background(), bucket, minio.ListObjectsOptions{Recursive: true}) {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		if o.Key == path || strings.HasSuffix(o.Key, "/"+path) {
			return o.Key
		}
	}
	t.Fatalf("no object for %s in bucket %s", path, bucket)
	return ""
}

// testKinds makes a Bucket on the in-cluster MinIO, a HelmChart from a
// chart repository and an OCIRepository from a registry, and waits for
// each to be Ready.
func testKinds(t *testing.T, cl ctrlclient.Client) {
	ctx := context.Background()
	t.Run("Bucket", func(t *testing.T) {
		mc, _ := inClusterS3(t)
		if err := mc.MakeBucket(ctx, "sources", minio.MakeBucketOptions{}); err != nil {
			t.Fatal(err)
		}
		for k, v := range map[string]string{"app/deploy.yaml": "kind: Deployment\n", "README.md": "bucket\n"} {
			if _, err := mc.PutObject(ctx, "sources", k, strings.NewReader(v), int64(len(v)), minio.PutObjectOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		s3, err := env.C.Client.CoreV1().Secrets(ns).Get(ctx, "headwater-s3", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		creds := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bucket-creds", Namespace: "default"},
			Data: map[string][]byte{"accesskey": s3.Data["accesskey"], "secretkey": s3.Data["secretkey"]}}
		if err := cl.Create(ctx, creds); err != nil {
			t.Fatal(err)
		}
		b := &sourcev1.Bucket{
			ObjectMeta: metav1.ObjectMeta{Name: "sources", Namespace: "default"},
			Spec: sourcev1.BucketSpec{
				Provider: "generic", BucketName: "sources", Insecure: true,
				Endpoint:  "minio." + ns + ".svc.cluster.local:9000",
				Interval:  metav1.Duration{Duration: time.Minute},
				SecretRef: &fluxmeta.LocalObjectReference{Name: "bucket-creds"},
			},
		}
		if err := cl.Create(ctx, b); err != nil {
			t.Fatal(err)
		}
		a := waitSourceReady(t, cl, b, 3*time.Minute)
		t.Logf("Bucket Ready: %s", a.Revision)
	})
	t.Run("HelmChart", func(t *testing.T) {
		repo := &chartrepo.Server{}
		if err := repo.Start(env.C.HostIP + ":0"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = repo.Stop() })
		if err := repo.Add(chartrepo.Chart{Name: "podinfo", Version: "6.5.0", Values: map[string]any{"message": "hi"}}); err != nil {
			t.Fatal(err)
		}
		hr := &sourcev1.HelmRepository{
			ObjectMeta: metav1.ObjectMeta{Name: "charts", Namespace: "default"},
			Spec:       sourcev1.HelmRepositorySpec{URL: repo.URL(), Interval: metav1.Duration{Duration: time.Minute}},
		}
		if err := cl.Create(ctx, hr); err != nil {
			t.Fatal(err)
		}
		waitSourceReady(t, cl, hr, 3*time.Minute)
		hc := &sourcev1.HelmChart{
			ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: "default"},
			Spec: sourcev1.HelmChartSpec{
				Chart: "podinfo", Version: "6.x",
				SourceRef: sourcev1.LocalHelmChartSourceReference{Kind: sourcev1.HelmRepositoryKind, Name: "charts"},
				Interval:  metav1.Duration{Duration: time.Minute},
			},
		}
		if err := cl.Create(ctx, hc); err != nil {
			t.Fatal(err)
		}
		a := waitSourceReady(t, cl, hc, 3*time.Minute)
		if a.Revision != "6.5.0" {
			t.Errorf("HelmChart revision %s, want 6.5.0", a.Revision)
		}
	})
	t.Run("OCIRepository", func(t *testing.T) {
		reg, err := registry.Start(filepath.Join(t.TempDir(), "registry"), registry.Options{ListenIP: env.C.HostIP})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = reg.Stop() })
		reg.Push(t, "app", "v1", registry.FluxArtifact(t, map[string]string{"deploy.yaml": "kind: Deployment\n"}, "https://example.com/app", "main@sha1:0123456789abcdef0123456789abcdef01234567"))
		oci := &sourcev1.OCIRepository{
			ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "default"},
			Spec: sourcev1.OCIRepositorySpec{
				URL: reg.URL("app"), Insecure: true,
				Reference: &sourcev1.OCIRepositoryRef{Tag: "v1"},
				Interval:  metav1.Duration{Duration: time.Minute},
			},
		}
		if err := cl.Create(ctx, oci); err != nil {
			t.Fatal(err)
		}
		a := waitSourceReady(t, cl, oci, 3*time.Minute)
		if !strings.HasPrefix(a.Revision, "v1@sha256:") {
			t.Errorf("OCIRepository revision %s, want v1@sha256:...", a.Revision)
		}
	})
}

// cpuSeconds is process_cpu_seconds_total of every pod of component.
func cpuSeconds(t *testing.T, component string, port int) map[string]float64 {
	m := map[string]float64{}
	for _, p := range pods(t, component) {
		m[p.Name] = metric(t, fmt.Sprintf("http://%s:%d/metrics", p.Status.PodIP, port), "process_cpu_seconds_total")
	}
	return m
}

// fetcherJobs is headwater_jobs_total of every fetcher pod.
func fetcherJobs(t *testing.T) map[string]float64 {
	m := map[string]float64{}
	for _, p := range pods(t, "fetcher") {
		m[p.Name] = metric(t, fmt.Sprintf("http://%s:9101/metrics", p.Status.PodIP), "headwater_jobs_total", `service="fetcher"`)
	}
	return m
}

// testThroughput measures how long n new sources, each of its own
// repository of 300 small files, take to become Ready with 1, 2 and 3
// fetcher replicas, and each replica's CPU and jobs.
func testThroughput(t *testing.T, cl ctrlclient.Client) {
	const n = 40
	var table []string
	for _, replicas := range []int{1, 2, 3} {
		env.Kubectl(t, "-n", ns, "scale", "deployment/fetcher", fmt.Sprintf("--replicas=%d", replicas))
		if err := env.C.WaitRollout(context.Background(), ns, "deployment/fetcher", 3*time.Minute); err != nil {
			t.Fatal(err)
		}
		kubetest.Eventually(t, time.Minute, "fetcher pods", func(context.Context) error {
			if got := len(pods(t, "fetcher")); got != replicas {
				return fmt.Errorf("%d fetcher pods", got)
			}
			return nil
		})
		heads := map[string]string{}
		for i := range n {
			name := fmt.Sprintf("load-%d-%d", replicas, i)
			files := map[string]string{}
			for f := range 300 {
				files[fmt.Sprintf("manifests/%03d.yaml", f)] = randomText(2048)
			}
			_, h := newRepo(t, name, files)
			heads[name] = h
		}
		cpu0 := cpuSeconds(t, "fetcher", 9101)
		jobs0 := fetcherJobs(t)
		start := time.Now()
		for name := range heads {
			gitRepository(t, cl, "default", name, name, time.Hour)
		}
		for name, h := range heads {
			readyAt(t, cl, "default", name, h, 5*time.Minute)
		}
		took := time.Since(start)
		cpu1 := cpuSeconds(t, "fetcher", 9101)
		jobs1 := fetcherJobs(t)
		var per, perJobs []string
		for pod, v := range cpu1 {
			per = append(per, fmt.Sprintf("%.2f", v-cpu0[pod]))
			perJobs = append(perJobs, fmt.Sprintf("%.0f", jobs1[pod]-jobs0[pod]))
		}
		sort.Strings(per)
		sort.Strings(perJobs)
		table = append(table, fmt.Sprintf("| %d | %d | %.1f s | %.1f sources/s | %s | %s |", replicas, n, took.Seconds(), n/took.Seconds(), strings.Join(per, ", "), strings.Join(perJobs, ", ")))
	}
	t.Logf("throughput on this node (2 cores shared by the whole cluster):\n| fetcher replicas | new sources | all Ready in | rate | CPU-s per fetcher | jobs per fetcher |\n|---|---|---|---|---|---|\n%s", strings.Join(table, "\n"))
}

// testFaults keeps sources moving (a new commit on every repository
// before each fault) while it deletes a fetcher pod, the packager pod, the
// watcher leader's pod and the NATS pod, then restarts every Deployment:
// every source ends Ready at its branch head with an artifact whose digest
// is right.
func testFaults(t *testing.T, cl ctrlclient.Client) {
	const n = 20
	ctx := context.Background()
	type src struct {
		name string
		head string
		repo *gitserver.Repo
	}
	var srcs []*src
	for i := range n {
		name := fmt.Sprintf("fault-%d", i)
		r, h := newRepo(t, name, map[string]string{"app.yaml": name + "\n"})
		srcs = append(srcs, &src{name: name, head: h, repo: r})
		gitRepository(t, cl, "default", name, name, 30*time.Second)
	}
	commitAll := func(round string) {
		for _, s := range srcs {
			r := s.repo
			if err := r.Write(map[string]string{"round.txt": round + "\n"}); err != nil {
				t.Fatal(err)
			}
			h, err := r.Commit(round)
			if err != nil {
				t.Fatal(err)
			}
			s.head = h
		}
	}
	deletePod := func(what string, p corev1.Pod) {
		t.Logf("fault: delete %s pod %s", what, p.Name)
		if err := env.C.Client.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	faults := []struct {
		name string
		do   func()
	}{
		{"fetcher", func() { deletePod("a fetcher", pods(t, "fetcher")[0]) }},
		{"packager", func() { deletePod("the packager", pods(t, "packager")[0]) }},
		{"watcher leader", func() { deletePod("the watcher leader", watcherLeader(t)) }},
		{"nats", func() { deletePod("the NATS", pods(t, "nats")[0]) }},
	}
	for _, f := range faults {
		commitAll("before " + f.name)
		time.Sleep(3 * time.Second) // let the new commits' jobs get under way
		f.do()
		waitPodsReady(t, 5*time.Minute)
	}
	commitAll("before the rolling update")
	for _, d := range []string{"watcher", "fetcher", "packager", "artifact-server"} {
		env.Kubectl(t, "-n", ns, "rollout", "restart", "deployment/"+d)
	}
	for _, d := range []string{"watcher", "fetcher", "packager", "artifact-server"} {
		if err := env.C.WaitRollout(ctx, ns, "deployment/"+d, 5*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range srcs {
		gr := readyAt(t, cl, "default", s.name, s.head, 5*time.Minute)
		digest, err := fetchArtifact(ctx, gr.Status.Artifact)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if digest != gr.Status.Artifact.Digest {
			t.Errorf("%s: artifact digest %s, status says %s", s.name, digest, gr.Status.Artifact.Digest)
		}
	}
}

// watcherLeader is the pod that holds the watcher's leader-election Lease.
func watcherLeader(t *testing.T) corev1.Pod {
	t.Helper()
	leases, err := env.C.Client.CoordinationV1().Leases(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods(t, "watcher") {
		for _, l := range leases.Items {
			if l.Spec.HolderIdentity != nil && strings.HasPrefix(*l.Spec.HolderIdentity, p.Name) {
				return p
			}
		}
	}
	t.Fatal("no watcher pod holds a Lease")
	return corev1.Pod{}
}
