package helmfetch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets/secretstest"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// serve starts a chart repository with two versions of podinfo.
func serve(t *testing.T, srv *chartrepo.Server) *chartrepo.Server {
	t.Helper()
	srv.Dir = t.TempDir()
	must(t, srv.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = srv.Stop() })
	must(t, srv.Add(chartrepo.Chart{Name: "podinfo", Version: "6.1.0"}, chartrepo.Chart{Name: "podinfo", Version: "6.2.0"}))
	return srv
}

func request(spec sourcev1.HelmRepositorySpec) *events.FetchRequested {
	return &events.FetchRequested{
		Job:            events.Job{ID: "job", Object: events.ObjectRef{Kind: Kind, Namespace: "default", Name: "podinfo"}},
		HelmRepository: &spec,
	}
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// fetch resolves and downloads req with s, and returns the content and
// the downloaded index.
func fetch(t *testing.T, s *Source, req *events.FetchRequested) (source.Resolved, *source.Content, []byte) {
	t.Helper()
	ctx := context.Background()
	res, err := s.Resolve(ctx, req)
	must(t, err)
	t.Cleanup(func() { _ = res.(*resolved).Close() })
	dir := t.TempDir()
	content, err := res.Download(ctx, dir)
	must(t, err)
	b, err := os.ReadFile(filepath.Join(dir, IndexFile))
	must(t, err)
	return res, content, b
}

func TestFetchIndex(t *testing.T) {
	srv := serve(t, &chartrepo.Server{})
	s := NewSource(nil, 0, NewValidators(0), nil)
	req := request(sourcev1.HelmRepositorySpec{URL: srv.URL()})

	res, content, got := fetch(t, s, req)
	index := srv.Index()
	if string(got) != string(index) {
		t.Fatal("the stored index differs from the one served")
	}
	rev := digest(index)
	if res.Revision() != rev || content.Revision != rev {
		t.Fatalf("revision %s / %s, want %s", res.Revision(), content.Revision, rev)
	}
	if want := "index-" + strings.TrimPrefix(rev, "sha256:") + ".yaml"; content.ArtifactName != want {
		t.Fatalf("artifact name %s, want %s", content.ArtifactName, want)
	}
	if want := "stored fetched index of size " + HumanSize(int64(len(index))) + " from '" + srv.URL() + "'"; content.EventMessage != want {
		t.Fatalf("event message %q, want %q", content.EventMessage, want)
	}

	// Unchanged: one 304, the revision remembered, nothing downloaded.
	res2, err := s.Resolve(context.Background(), req)
	must(t, err)
	if res2.Revision() != rev || res2.(*resolved).file != "" {
		t.Fatalf("after a 304: revision %s, file %q", res2.Revision(), res2.(*resolved).file)
	}
	if d, nm, _ := srv.Counts(); d != 1 || nm != 1 {
		t.Fatalf("downloads %d, 304s %d; want 1 and 1", d, nm)
	}
	// Content needed after a 304 (the artifact is missing): downloaded.
	dir := t.TempDir()
	c2, err := res2.Download(context.Background(), dir)
	must(t, err)
	if c2.Revision != rev {
		t.Fatalf("revision %s after download, want %s", c2.Revision, rev)
	}

	// A new chart version: a new index and revision.
	must(t, srv.Add(chartrepo.Chart{Name: "podinfo", Version: "6.3.0"}))
	res3, err := s.Resolve(context.Background(), req)
	must(t, err)
	if res3.Revision() != digest(srv.Index()) || res3.Revision() == rev {
		t.Fatalf("revision %s after a new version, want %s", res3.Revision(), digest(srv.Index()))
	}
	must(t, res3.(*resolved).Close())

	// Another source with the same URL shares the content.
	other := request(sourcev1.HelmRepositorySpec{URL: srv.URL() + "/"})
	other.Job.Object.Name = "other"
	res4, err := s.Resolve(context.Background(), other)
	must(t, err)
	id3, _ := res3.(source.Shareable).ContentIdentity()
	id4, _ := res4.(source.Shareable).ContentIdentity()
	if strings.Join(id3, ",") != strings.Join(id4, ",") {
		t.Fatalf("content identities differ: %v, %v", id3, id4)
	}
}

func TestFetchIndexAuth(t *testing.T) {
	srv := serve(t, &chartrepo.Server{Username: "helm", Password: "s3cret", TLS: true})
	ca, err := srv.CACert()
	must(t, err)
	certPEM, keyPEM, err := srv.ClientCert("client")
	must(t, err)
	mtls := serve(t, &chartrepo.Server{TLS: true, RequireClientCert: true})
	mca, err := mtls.CACert()
	must(t, err)
	mcert, mkey, err := mtls.ClientCert("client")
	must(t, err)
	kube := secretstest.Reader(t, "default", map[string]map[string]string{
		"auth":        {"username": "helm", "password": "s3cret"},
		"wrong":       {"username": "helm", "password": "nope"},
		"half":        {"username": "helm"},
		"ca":          {"ca.crt": string(ca)},
		"auth-and-ca": {"username": "helm", "password": "s3cret", "ca.crt": string(ca), "tls.crt": string(certPEM), "tls.key": string(keyPEM)},
		"mtls":        {"ca.crt": string(mca), "tls.crt": string(mcert), "tls.key": string(mkey)},
		"mtls-no-key": {"ca.crt": string(mca), "tls.crt": string(mcert)},
	})
	ref := func(name string) *meta.LocalObjectReference { return &meta.LocalObjectReference{Name: name} }
	for _, tc := range []struct {
		name     string
		spec     sourcev1.HelmRepositorySpec
		reader   secrets.Reader
		reason   string // empty: success
		handling failure.Handling
		message  string
	}{
		{name: "basic auth and certSecretRef", spec: sourcev1.HelmRepositorySpec{URL: srv.URL(), SecretRef: ref("auth"), CertSecretRef: ref("ca")}},
		{name: "TLS keys in secretRef", spec: sourcev1.HelmRepositorySpec{URL: srv.URL(), SecretRef: ref("auth-and-ca")}},
		{name: "mutual TLS", spec: sourcev1.HelmRepositorySpec{URL: mtls.URL(), CertSecretRef: ref("mtls")}},
		{name: "wrong credentials", spec: sourcev1.HelmRepositorySpec{URL: srv.URL(), SecretRef: ref("wrong"), CertSecretRef: ref("ca")},
			reason: meta.FailedReason, message: "401 Unauthorized"},
		{name: "no credentials", spec: sourcev1.HelmRepositorySpec{URL: srv.URL(), CertSecretRef: ref("ca")},
			reason: meta.FailedReason, message: "401 Unauthorized"},
		{name: "unknown authority", spec: sourcev1.HelmRepositorySpec{URL: srv.URL(), SecretRef: ref("auth")},
			reason: meta.FailedReason, message: "certificate"},
		{name: "no client certificate", spec: sourcev1.HelmRepositorySpec{URL: mtls.URL(), CertSecretRef: ref("ca")},
			reason: meta.FailedReason, message: "failed to fetch Helm repository index"},
		{name: "missing secret", spec: sourcev1.HelmRepositorySpec{URL: srv.URL(), SecretRef: ref("absent")},
			reason: sourcev1.AuthenticationFailedReason, message: "failed to get secret 'default/absent'"},
		{name: "no cluster", spec: sourcev1.HelmRepositorySpec{URL: srv.URL(), SecretRef: ref("auth")}, reader: secrets.Unavailable{Err: os.ErrNotExist},
			reason: sourcev1.AuthenticationFailedReason, message: "no Kubernetes API server is configured"},
		{name: "username without password", spec: sourcev1.HelmRepositorySpec{URL: srv.URL(), SecretRef: ref("half")},
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling, message: "required fields 'username' and 'password'"},
		{name: "client certificate without key", spec: sourcev1.HelmRepositorySpec{URL: mtls.URL(), CertSecretRef: ref("mtls-no-key")},
			reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling, message: "must contain both 'tls.crt' and 'tls.key'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.reader
			if r == nil {
				r = kube
			}
			s := NewSource(r, 0, NewValidators(0), nil)
			res, err := s.Resolve(context.Background(), request(tc.spec))
			if tc.reason == "" {
				must(t, err)
				_ = res.(*resolved).Close()
				return
			}
			checkFailure(t, err, tc.reason, tc.handling, tc.message)
			if strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("the failure shows the password: %v", err)
			}
		})
	}
}

func checkFailure(t *testing.T, err error, reason string, h failure.Handling, message string) {
	t.Helper()
	f := failure.As(err)
	if f == nil {
		t.Fatalf("error %v is not a failure", err)
	}
	if f.Condition != sourcev1.FetchFailedCondition || f.Reason != reason || f.Handling != h || !strings.Contains(f.Error(), message) {
		t.Fatalf("failure %s/%s (%s): %q; want %s/%s (%s) containing %q", f.Condition, f.Reason, f.Handling, f.Error(),
			sourcev1.FetchFailedCondition, reason, h, message)
	}
}

func TestFetchIndexBadInput(t *testing.T) {
	srv := serve(t, &chartrepo.Server{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	closed := "http://" + ln.Addr().String()
	must(t, ln.Close())
	bomb := "apiVersion: v1\nentries:\n  a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n" +
		"  b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n  c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
	for _, tc := range []struct {
		name     string
		index    string // served when not empty
		url      string
		maxSize  int64
		reason   string
		handling failure.Handling
		message  string
	}{
		{name: "not YAML", index: "<html>Not Found</html>\n", reason: sourcev1.IndexationFailedReason, handling: failure.Final,
			message: "failed to load Helm repository from index YAML: not a Helm repository index"},
		{name: "alias bomb", index: bomb, reason: sourcev1.IndexationFailedReason, handling: failure.Final,
			message: "YAML aliases are not allowed"},
		{name: "no apiVersion", index: "entries: {}\n", reason: sourcev1.IndexationFailedReason, handling: failure.Final,
			message: "no API version specified"},
		{name: "over the size limit", index: "apiVersion: v1\nentries: {}\n# " + strings.Repeat("x", 4096) + "\n", maxSize: 1024,
			reason: meta.FailedReason, handling: failure.Final, message: "exceeds the maximum size of 1.024kB"},
		{name: "unreachable", url: closed, reason: meta.FailedReason, message: "connection refused"},
		{name: "not found", url: srv.URL() + "/missing/", reason: meta.FailedReason, message: "404 Not Found"},
		{name: "oci URL", url: "oci://ghcr.io/charts", reason: sourcev1.URLInvalidReason, handling: failure.Stalling,
			message: "'oci' URL scheme cannot be used with 'default' HelmRepository type"},
		{name: "bad scheme", url: "ftp://charts.example.com", reason: sourcev1.URLInvalidReason, handling: failure.Stalling,
			message: "scheme 'ftp' is not supported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.index != "" {
				srv.SetIndex([]byte(tc.index))
			}
			u := tc.url
			if u == "" {
				u = srv.URL()
			}
			s := NewSource(nil, tc.maxSize, NewValidators(0), nil)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := s.Resolve(ctx, request(sourcev1.HelmRepositorySpec{URL: u}))
			checkFailure(t, err, tc.reason, tc.handling, tc.message)
			if s.Validators.Len() != 0 {
				t.Fatal("a failed fetch left validators behind")
			}
		})
	}
}

func TestValidatorsBounded(t *testing.T) {
	v := NewValidators(2)
	for _, k := range []string{"a", "b", "c"} {
		v.put(k, map[string][]string{"Etag": {`"` + k + `"`}}, "sha256:"+k)
	}
	if v.Len() != 2 {
		t.Fatalf("%d entries, want 2", v.Len())
	}
	if _, ok := v.get("a"); ok {
		t.Fatal("the least recently used entry was kept")
	}
	v.put("b", map[string][]string{}, "sha256:b")
	if _, ok := v.get("b"); ok {
		t.Fatal("a response without validators kept its key")
	}
}

func TestHumanSize(t *testing.T) {
	for size, want := range map[int64]string{444: "444B", 1234: "1.234kB", 52428800: "52.43MB", 0: "0B"} {
		if got := HumanSize(size); got != want {
			t.Errorf("HumanSize(%d) = %s, want %s", size, got, want)
		}
	}
}

// TestFetchIndexTogether fetches one repository for several sources at
// once, as when they are created together: one download, and the others
// revalidate (304) and take the downloaded file.
func TestFetchIndexTogether(t *testing.T) {
	srv := serve(t, &chartrepo.Server{})
	s := NewSource(nil, 0, NewValidators(0), nil)
	var err error
	s.Recent, err = NewRecent(t.TempDir(), time.Minute, 2)
	must(t, err)
	t.Cleanup(func() { _ = s.Recent.Close() })
	const n = 6
	errs := make(chan error, n)
	revs := make(chan string, n)
	for i := 0; i < n; i++ {
		go func() {
			res, err := s.Resolve(context.Background(), request(sourcev1.HelmRepositorySpec{URL: srv.URL()}))
			if err != nil {
				errs <- err
				return
			}
			defer res.(*resolved).Close()
			c, err := res.Download(context.Background(), t.TempDir())
			if err != nil {
				errs <- err
				return
			}
			b, err := os.ReadFile(c.File)
			if err == nil && digest(b) != c.Revision {
				err = os.ErrInvalid
			}
			revs <- c.Revision
			errs <- err
		}()
	}
	for i := 0; i < n; i++ {
		must(t, <-errs)
	}
	want := digest(srv.Index())
	for i := 0; i < n; i++ {
		if r := <-revs; r != want {
			t.Fatalf("revision %s, want %s", r, want)
		}
	}
	if d, nm, _ := srv.Counts(); d != 1 || nm != n-1 {
		t.Fatalf("%d downloads and %d 304s, want 1 and %d", d, nm, n-1)
	}
}
