package sourcekind

import (
	"context"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
)

func TestRefuseCredentials(t *testing.T) {
	tests := []struct {
		raw     string
		refused bool
	}{
		{"https://github.com/stefanprodan/podinfo", false},
		{"ssh://git@github.com/stefanprodan/podinfo", false},
		{"ssh://git:s3cr3t@github.com/stefanprodan/podinfo", true},
		{"https://x-access-token:s3cr3t@github.com/org/repo.git", true},
		{"https://user@example.com/repo.git", true},
		{"minio.example.com:9000", false},
		{"AKIA:s3cr3t@minio.example.com:9000", true},
		{"http://[::1", false}, // unparsable: the fetcher reports it
		{"oci://ghcr.io/stefanprodan/manifests/podinfo", false},
		{"oci://user:s3cr3t@ghcr.io/stefanprodan/manifests/podinfo", true},
		// Unparsable, with what may be credentials: an unescaped '%' or
		// '/' in the password, or a bad host after the user-info.
		{"https://user:s3cr3t%zz@github.com/org/repo.git", true},
		{"https://user:s3/cr3t@github.com/org/repo.git", true},
		{"oci://s3cr3t@[::1/podinfo", true},
		{"AKIA:s3cr3t%@minio.example.com:9000", true},
	}
	for _, tc := range tests {
		err := refuseCredentials("spec.url", tc.raw)
		if (err != nil) != tc.refused {
			t.Errorf("%q: refused = %v, want %v", tc.raw, err != nil, tc.refused)
			continue
		}
		if err == nil {
			continue
		}
		f := failure.As(err)
		if f == nil || f.Handling != failure.Stalling || f.Reason != sourcev1.URLInvalidReason || f.Condition != sourcev1.FetchFailedCondition {
			t.Errorf("%q: %+v, want a stalling FetchFailed/URLInvalid", tc.raw, f)
		}
		if strings.Contains(err.Error(), "cr3t") || !strings.Contains(err.Error(), "spec.secretRef") {
			t.Errorf("%q: message %q must not repeat the credentials and must name spec.secretRef", tc.raw, err.Error())
		}
	}
}

// TestHelmRepositoryRefusesCredentials checks that a HelmRepository whose
// URL carries credentials makes no job.
func TestHelmRepositoryRefusesCredentials(t *testing.T) {
	h := &sourcev1.HelmRepository{Spec: sourcev1.HelmRepositorySpec{URL: "https://user:s3cr3t@charts.example.com"}}
	req := &events.FetchRequested{}
	_, err := HelmRepository().Request(context.Background(), nil, h, req)
	if f := failure.As(err); f == nil || f.Reason != sourcev1.URLInvalidReason || req.HelmRepository != nil {
		t.Fatalf("Request = %v with spec %v, want URLInvalid and no spec", err, req.HelmRepository)
	}
}

// TestKindsRefuseCredentials checks that every kind whose spec names a URL
// makes no job when the URL carries credentials.
func TestKindsRefuseCredentials(t *testing.T) {
	const raw = "https://user:s3cr3t@example.com/repo"
	for _, tc := range []struct {
		kind Kind
		obj  Object
	}{
		{GitRepository(), &sourcev1.GitRepository{Spec: sourcev1.GitRepositorySpec{URL: raw}}},
		{HelmRepository(), &sourcev1.HelmRepository{Spec: sourcev1.HelmRepositorySpec{URL: raw}}},
		{OCIRepository(), &sourcev1.OCIRepository{Spec: sourcev1.OCIRepositorySpec{URL: "oci://user:s3cr3t@ghcr.io/org/app"}}},
		{OCIRepository(), &sourcev1.OCIRepository{Spec: sourcev1.OCIRepositorySpec{URL: "oci://user:s3cr3t%zz@ghcr.io/org/app"}}},
		{Bucket(), &sourcev1.Bucket{Spec: sourcev1.BucketSpec{Endpoint: "AKIA:s3cr3t@minio.example.com:9000", BucketName: "b"}}},
	} {
		req := &events.FetchRequested{}
		_, err := tc.kind.Request(context.Background(), nil, tc.obj, req)
		if f := failure.As(err); f == nil || f.Reason != sourcev1.URLInvalidReason || req.Spec() != nil {
			t.Errorf("%s: Request = %v with spec %v, want URLInvalid and no spec", tc.kind.Name, err, req.Spec())
		}
	}
}

// TestRecovered checks the messages of the Event for a recovery that kept
// the stored artifact, as Flux's source-controller v1.9.1 words them.
func TestRecovered(t *testing.T) {
	oci := &sourcev1.OCIRepository{Spec: sourcev1.OCIRepositorySpec{URL: "oci://registry/app"}}
	tests := []struct {
		name string
		kind Kind
		obj  Object
		art  *meta.Artifact
		want string
	}{
		{name: "git", kind: GitRepository(), obj: &sourcev1.GitRepository{},
			art:  &meta.Artifact{Revision: "main@sha1:abc"},
			want: "stored artifact for commit 'main@sha1:abc'"},
		{name: "oci", kind: OCIRepository(), obj: oci, art: &meta.Artifact{Revision: "v1@sha256:def"},
			want: "stored artifact with revision 'v1@sha256:def' from 'oci://registry/app'"},
		{name: "oci with origin", kind: OCIRepository(), obj: oci,
			art: &meta.Artifact{Revision: "v1@sha256:def", Metadata: map[string]string{
				"org.opencontainers.image.source": "https://github.com/org/app", "org.opencontainers.image.revision": "main@sha1:abc"}},
			want: "stored artifact with revision 'v1@sha256:def' from 'oci://registry/app', origin source 'https://github.com/org/app', origin revision 'main@sha1:abc'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.kind.Recovered(tt.obj, tt.art); got != tt.want {
				t.Errorf("Recovered = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestRemote(t *testing.T) {
	git := func(ns, url, secret string) Object {
		o := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "x"}, Spec: sourcev1.GitRepositorySpec{URL: url}}
		if secret != "" {
			o.Spec.SecretRef = &meta.LocalObjectReference{Name: secret}
		}
		return o
	}
	k := GitRepository()
	same := [][2]Object{
		{git("a", "https://git.example/app", ""), git("b", "https://git.example/app", "")},
		{git("a", "https://git.example/app", "creds"), git("a", "https://git.example/app", "creds")},
	}
	for _, p := range same {
		if k.Remote(p[0]) != k.Remote(p[1]) {
			t.Errorf("%s/%v and %s/%v: different remotes, want one", p[0].GetNamespace(), p[0], p[1].GetNamespace(), p[1])
		}
	}
	differ := [][2]Object{
		{git("a", "https://git.example/app", ""), git("a", "https://git.example/other", "")},
		{git("a", "https://git.example/app", ""), git("a", "https://git.example/app", "creds")},
		// A Secret of the same name in another namespace is another
		// credential.
		{git("a", "https://git.example/app", "creds"), git("b", "https://git.example/app", "creds")},
	}
	for _, p := range differ {
		if k.Remote(p[0]) == k.Remote(p[1]) {
			t.Errorf("%q: one remote for two sources that must not share a listing", k.Remote(p[0]))
		}
	}
	chart := func(ns, repo string) Object {
		return &sourcev1.HelmChart{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c"},
			Spec: sourcev1.HelmChartSpec{SourceRef: sourcev1.LocalHelmChartSourceReference{Kind: sourcev1.HelmRepositoryKind, Name: repo}}}
	}
	if hc := HelmChart(); hc.Remote(chart("a", "r")) != hc.Remote(chart("a", "r")) || hc.Remote(chart("a", "r")) == hc.Remote(chart("b", "r")) {
		t.Error("HelmCharts: one remote per source object")
	}
	samples := map[string]Object{
		sourcev1.GitRepositoryKind:  git("a", "https://git.example/app", ""),
		sourcev1.BucketKind:         &sourcev1.Bucket{Spec: sourcev1.BucketSpec{Endpoint: "s3.example", BucketName: "b"}},
		sourcev1.OCIRepositoryKind:  &sourcev1.OCIRepository{Spec: sourcev1.OCIRepositorySpec{URL: "oci://registry/app"}},
		sourcev1.HelmRepositoryKind: &sourcev1.HelmRepository{Spec: sourcev1.HelmRepositorySpec{URL: "https://charts.example"}},
		sourcev1.HelmChartKind:      chart("a", "r"),
	}
	for _, kind := range Kinds() {
		if kind.Remote(samples[kind.Name]) == "" {
			t.Errorf("%s names no remote", kind.Name)
		}
	}
}
