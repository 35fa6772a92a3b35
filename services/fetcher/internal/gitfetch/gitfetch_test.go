package gitfetch

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/fluxcd/pkg/apis/meta"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

// fixture is a repository served over smart HTTP:
//
//	master: c1 (tag v1.0.0, lightweight) <- c2 (tags v1.1.0 annotated, v2.0.0)
//	dev:    c2 <- c3
type fixture struct {
	srv        *gitserver.Server
	url        string
	c1, c2, c3 string
}

func newFixture(t *testing.T, username, password string) *fixture {
	t.Helper()
	root := t.TempDir()
	repo, err := gitserver.NewRepo(root, "repo", t.TempDir(), "master")
	must(t, err)
	f := &fixture{}
	must(t, repo.Write(map[string]string{"README.md": "one", "deploy/app.yaml": "kind: ConfigMap\n", "logo.png": "png"}))
	f.c1, err = repo.Commit("first commit")
	must(t, err)
	must(t, repo.Tag("v1.0.0", ""))
	must(t, repo.Write(map[string]string{"README.md": "two"}))
	f.c2, err = repo.Commit("second commit with a subject that is longer than fifty characters\n\nand a body")
	must(t, err)
	must(t, repo.Tag("v1.1.0", "release 1.1.0"))
	must(t, repo.Tag("v2.0.0", ""))
	must(t, repo.Git("checkout", "--quiet", "-b", "dev"))
	must(t, repo.Write(map[string]string{"README.md": "dev"}))
	f.c3, err = repo.Commit("dev work")
	must(t, err)
	must(t, repo.Git("checkout", "--quiet", "master"))

	f.srv = &gitserver.Server{Root: root, Username: username, Password: password}
	must(t, f.srv.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = f.srv.Stop() })
	f.url = f.srv.RepoURL("repo")
	return f
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func request(url string, ref *sourcev1.GitRepositoryRef) *events.FetchRequested {
	return &events.FetchRequested{
		Job: events.Job{ID: "job-1", Object: events.ObjectRef{Kind: Kind, Namespace: "default", Name: "podinfo"}},
		GitRepository: &sourcev1.GitRepositorySpec{
			URL:       url,
			Reference: ref,
			Timeout:   &metav1.Duration{Duration: 30 * time.Second},
		},
	}
}

func TestResolveAndDownload(t *testing.T) {
	f := newFixture(t, "", "")
	cases := []struct {
		name    string
		ref     *sourcev1.GitRepositoryRef
		rev     string
		commit  string
		readme  string
		message string
	}{
		{name: "no ref is branch master", ref: nil, rev: "master@sha1:" + f.c2, commit: f.c2, readme: "two",
			message: "stored artifact for commit 'second commit with a subject that is longer than f...'"},
		{name: "empty ref is branch master", ref: &sourcev1.GitRepositoryRef{}, rev: "master@sha1:" + f.c2, commit: f.c2, readme: "two"},
		{name: "branch", ref: &sourcev1.GitRepositoryRef{Branch: "dev"}, rev: "dev@sha1:" + f.c3, commit: f.c3, readme: "dev",
			message: "stored artifact for commit 'dev work'"},
		{name: "lightweight tag", ref: &sourcev1.GitRepositoryRef{Tag: "v1.0.0"}, rev: "v1.0.0@sha1:" + f.c1, commit: f.c1, readme: "one",
			message: "stored artifact for commit 'first commit'"},
		{name: "annotated tag is peeled", ref: &sourcev1.GitRepositoryRef{Tag: "v1.1.0"}, rev: "v1.1.0@sha1:" + f.c2, commit: f.c2, readme: "two"},
		{name: "tag over branch", ref: &sourcev1.GitRepositoryRef{Tag: "v1.0.0", Branch: "dev"}, rev: "v1.0.0@sha1:" + f.c1, commit: f.c1, readme: "one"},
		{name: "semver highest match", ref: &sourcev1.GitRepositoryRef{SemVer: ">=1.0.0 <2.0.0"}, rev: "v1.1.0@sha1:" + f.c2, commit: f.c2, readme: "two"},
		{name: "semver over branch", ref: &sourcev1.GitRepositoryRef{SemVer: "1.0.x", Branch: "dev"}, rev: "v1.0.0@sha1:" + f.c1, commit: f.c1, readme: "one"},
		{name: "commit alone", ref: &sourcev1.GitRepositoryRef{Commit: f.c1}, rev: "sha1:" + f.c1, commit: f.c1, readme: "one"},
		{name: "commit on branch", ref: &sourcev1.GitRepositoryRef{Commit: f.c2, Branch: "dev"}, rev: "dev@sha1:" + f.c2, commit: f.c2, readme: "two"},
		{name: "commit over tag", ref: &sourcev1.GitRepositoryRef{Commit: f.c3, Tag: "v1.0.0"}, rev: "sha1:" + f.c3, commit: f.c3, readme: "dev"},
		{name: "name of a branch", ref: &sourcev1.GitRepositoryRef{Name: "refs/heads/dev"}, rev: "refs/heads/dev@sha1:" + f.c3, commit: f.c3, readme: "dev"},
		{name: "name of an annotated tag", ref: &sourcev1.GitRepositoryRef{Name: "refs/tags/v1.1.0"}, rev: "refs/tags/v1.1.0@sha1:" + f.c2, commit: f.c2, readme: "two"},
		{name: "name over tag", ref: &sourcev1.GitRepositoryRef{Name: "refs/heads/master", Tag: "v1.0.0"}, rev: "refs/heads/master@sha1:" + f.c2, commit: f.c2, readme: "two"},
	}
	src := &Source{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			res, err := src.Resolve(ctx, request(f.url, tc.ref))
			if err != nil {
				t.Fatalf("resolve: %v", err)
			}
			if got := res.Revision(); got != tc.rev {
				t.Errorf("resolved revision = %q, want %q", got, tc.rev)
			}
			dir := t.TempDir()
			content, err := res.Download(ctx, dir)
			if err != nil {
				t.Fatalf("download: %v", err)
			}
			if content.Revision != tc.rev {
				t.Errorf("downloaded revision = %q, want %q", content.Revision, tc.rev)
			}
			if want := tc.commit + ".tar.gz"; content.ArtifactName != want {
				t.Errorf("artifact name = %q, want %q", content.ArtifactName, want)
			}
			if tc.message != "" && content.EventMessage != tc.message {
				t.Errorf("event message = %q, want %q", content.EventMessage, tc.message)
			}
			b, err := fs.ReadFile(content.Tree(), "README.md")
			if err != nil || string(b) != tc.readme {
				t.Errorf("README.md = %q (%v), want %q", b, err, tc.readme)
			}
			if _, err := fs.Stat(content.Tree(), ".git"); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("work tree has a .git entry (%v)", err)
			}
			if !content.Exclude("logo.png", false) || content.Exclude("deploy/app.yaml", false) {
				t.Errorf("default ignore rules not applied")
			}
		})
	}
}

func TestResolveFailures(t *testing.T) {
	f := newFixture(t, "", "")
	cases := []struct {
		name     string
		url      string
		ref      *sourcev1.GitRepositoryRef
		prev     bool
		provider string
		reason   string
		stalled  bool
		message  string
	}{
		{name: "missing branch", url: f.url, ref: &sourcev1.GitRepositoryRef{Branch: "nope"},
			reason:  sourcev1.GitOperationFailedReason,
			message: "failed to checkout and determine revision: unable to clone '" + f.url + `': couldn't find remote ref "refs/heads/nope"`},
		{name: "missing tag", url: f.url, ref: &sourcev1.GitRepositoryRef{Tag: "v9"},
			reason:  sourcev1.GitOperationFailedReason,
			message: "failed to checkout and determine revision: unable to clone '" + f.url + `': couldn't find remote ref "refs/tags/v9"`},
		{name: "no semver match", url: f.url, ref: &sourcev1.GitRepositoryRef{SemVer: ">=3.0.0"},
			reason: sourcev1.GitOperationFailedReason, message: "failed to checkout and determine revision: no match found for semver: >=3.0.0"},
		{name: "invalid semver", url: f.url, ref: &sourcev1.GitRepositoryRef{SemVer: "not a range"},
			reason: sourcev1.GitOperationFailedReason, stalled: true, message: "failed to checkout and determine revision: semver parse error: "},
		{name: "missing name", url: f.url, ref: &sourcev1.GitRepositoryRef{Name: "refs/pull/1/head"},
			reason: sourcev1.GitOperationFailedReason, message: "failed to checkout and determine revision: unable to resolve ref 'refs/pull/1/head' to a specific commit"},
		{name: "name with a trailing slash", url: f.url, ref: &sourcev1.GitRepositoryRef{Name: "refs/heads/"},
			reason: sourcev1.GitOperationFailedReason, stalled: true, message: "Git refs cannot begin or end with a slash"},
		{name: "missing repository", url: f.srv.RepoURL("nope"),
			reason: sourcev1.GitOperationFailedReason, message: "failed to checkout and determine revision: unable to clone '" + f.srv.RepoURL("nope") + "': repository not found"},
		{name: "unreachable host", url: "http://127.0.0.1:1/repo.git",
			reason: sourcev1.GitOperationFailedReason, message: "failed to checkout and determine revision: unable to clone 'http://127.0.0.1:1/repo.git': "},
		{name: "unreachable host with an artifact lists", url: "http://127.0.0.1:1/repo.git", prev: true,
			reason: sourcev1.GitOperationFailedReason, message: "failed to checkout and determine revision: unable to list remote for 'http://127.0.0.1:1/repo.git': "},
		{name: "credentials in the URL are never shown", url: "http://user:s3cr3t@127.0.0.1:1/repo.git?token=s3cr3t",
			reason: sourcev1.GitOperationFailedReason, message: "unable to clone 'http://127.0.0.1:1/repo.git': "},
		{name: "unparseable URL", url: "http://user:s3cr3t@127.0.0.1:bad/repo.git",
			reason: sourcev1.URLInvalidReason, stalled: true, message: "failed to parse url 'http://127.0.0.1:bad/repo.git'"},
		{name: "unsupported scheme", url: "ftp://example.com/repo.git",
			reason: sourcev1.URLInvalidReason, stalled: true, message: "unsupported scheme 'ftp'"},
		{name: "github provider without a secret", url: f.url, provider: sourcev1.GitProviderGitHub,
			reason: sourcev1.InvalidProviderConfigurationReason, stalled: true,
			message: "secretRef with github app data must be specified when provider is set to github"},
		{name: "azure provider without a workload identity", url: f.url, provider: sourcev1.GitProviderAzure,
			reason: sourcev1.AuthenticationFailedReason, message: "failed to configure authentication options: " +
				"failed to get access token for Git repository: failed to create provider access token for the controller: " +
				"Workload Identity: missing environment variables for workload identity. Check webhook and pod configuration"},
		{name: "github provider over ssh", url: "ssh://git@example.com/repo.git", provider: sourcev1.GitProviderGitHub,
			reason: sourcev1.InvalidProviderConfigurationReason, stalled: true, message: "provider 'github' authenticates over HTTP(S) only"},
		{name: "aws provider on a plain HTTP URL", url: f.url, provider: sourcev1.GitProviderAWS,
			reason: sourcev1.AuthenticationFailedReason, stalled: true, message: "AWS CodeCommit authentication requires an HTTPS Git URL"},
		{name: "unknown provider", url: f.url, provider: "gitea",
			reason: source.UnsupportedProviderReason, stalled: true, message: "git provider 'gitea' is not supported: use 'generic', 'github', 'azure' or 'aws'"},
		{name: "ssh without a secret", url: "ssh://git@example.com/repo.git",
			reason: sourcev1.AuthenticationFailedReason, stalled: true,
			message: "failed to configure authentication options: invalid 'ssh' auth option: 'identity' is required"},
	}
	// A fetcher without the environment of a workload identity.
	src := &Source{Getenv: func(string) (string, bool) { return "", false }}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := request(tc.url, tc.ref)
			req.GitRepository.Provider = tc.provider
			if tc.prev {
				req.Previous = &meta.Artifact{Path: "gitrepository/default/podinfo/x.tar.gz", Revision: "master@sha1:x"}
			}
			_, err := src.Resolve(context.Background(), req)
			checkFailure(t, err, tc.reason, tc.stalled, tc.message)
		})
	}
}

func TestDownloadMissingCommit(t *testing.T) {
	f := newFixture(t, "", "")
	missing := strings.Repeat("ab", 20)
	res, err := (&Source{}).Resolve(context.Background(), request(f.url, &sourcev1.GitRepositoryRef{Commit: missing, Branch: "master"}))
	if err != nil {
		t.Fatalf("resolve: %v", err)
	}
	if want := "master@sha1:" + missing; res.Revision() != want {
		t.Errorf("revision = %q, want %q", res.Revision(), want)
	}
	_, err = res.Download(context.Background(), t.TempDir())
	checkFailure(t, err, sourcev1.GitOperationFailedReason, false,
		"failed to checkout and determine revision: unable to resolve commit object for '"+missing+"': object not found")
}

func TestAuthentication(t *testing.T) {
	f := newFixture(t, "flux", "s3cr3t")
	secret := func(name string, data map[string]string) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Data: map[string][]byte{}}
		for k, v := range data {
			s.Data[k] = []byte(v)
		}
		return s
	}
	scheme := runtime.NewScheme()
	must(t, corev1.AddToScheme(scheme))
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		secret("right", map[string]string{"username": "flux", "password": "s3cr3t"}),
		secret("wrong", map[string]string{"username": "flux", "password": "guess"}),
		secret("token", map[string]string{"bearerToken": "t0ken"}),
		secret("password-only", map[string]string{"password": "s3cr3t"}),
		secret("unrelated", map[string]string{"foo": "bar"}),
	).Build()
	src := &Source{Secrets: secrets.NewKube(kube)}

	cases := []struct {
		name    string
		secret  string
		url     string
		reason  string
		stalled bool
		message string
	}{
		{name: "right credentials", secret: "right"},
		{name: "credentials in the URL", url: strings.Replace(f.url, "http://", "http://flux:s3cr3t@", 1)},
		{name: "no credentials", reason: sourcev1.AuthenticationFailedReason, message: "authentication required"},
		{name: "wrong credentials", secret: "wrong", reason: sourcev1.AuthenticationFailedReason, message: "authentication required"},
		{name: "bearer token refused", secret: "token", reason: sourcev1.AuthenticationFailedReason, message: "authentication required"},
		{name: "missing secret", secret: "absent", reason: sourcev1.AuthenticationFailedReason,
			message: `failed to get secret 'default/absent': secrets "absent" not found`},
		{name: "password without username", secret: "password-only", reason: sourcev1.AuthenticationFailedReason, stalled: true,
			message: "failed to configure authentication options: invalid 'http' auth option: 'password' requires 'username' to be set"},
		{name: "secret without credentials", secret: "unrelated", reason: sourcev1.AuthenticationFailedReason, stalled: true,
			message: "failed to configure authentication options: secret 'default/unrelated' has none of the keys"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := tc.url
			if u == "" {
				u = f.url
			}
			req := request(u, &sourcev1.GitRepositoryRef{Branch: "master"})
			if tc.secret != "" {
				req.GitRepository.SecretRef = &meta.LocalObjectReference{Name: tc.secret}
			}
			res, err := src.Resolve(context.Background(), req)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("resolve: %v", err)
				}
				content, err := res.Download(context.Background(), t.TempDir())
				if err != nil {
					t.Fatalf("download: %v", err)
				}
				if want := "master@sha1:" + f.c2; content.Revision != want {
					t.Errorf("revision = %q, want %q", content.Revision, want)
				}
				return
			}
			checkFailure(t, err, tc.reason, tc.stalled, tc.message)
		})
	}
}

func TestNoCluster(t *testing.T) {
	src := &Source{Secrets: secrets.Unavailable{Err: errors.New("no kubeconfig")}}
	req := request("http://127.0.0.1:1/repo.git", nil)
	req.GitRepository.SecretRef = &meta.LocalObjectReference{Name: "creds"}
	_, err := src.Resolve(context.Background(), req)
	checkFailure(t, err, sourcev1.AuthenticationFailedReason, false,
		"failed to get secret 'default/creds': no Kubernetes API server is configured: no kubeconfig")
}

func TestEmptyRepository(t *testing.T) {
	root := t.TempDir()
	if _, err := gitserver.NewRepo(root, "empty", t.TempDir(), "master"); err != nil {
		t.Fatal(err)
	}
	srv := &gitserver.Server{Root: root}
	must(t, srv.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = srv.Stop() })
	_, err := (&Source{}).Resolve(context.Background(), request(srv.RepoURL("empty"), nil))
	checkFailure(t, err, source.EmptyGitRepositoryReason, false, "git repository is empty")
}

func TestTimeout(t *testing.T) {
	src := &Source{}
	req := request("http://example.com/repo.git", nil)
	if got := src.Timeout(req); got != 30*time.Second {
		t.Errorf("timeout = %v, want 30s", got)
	}
	req.GitRepository.Timeout = nil
	if got := src.Timeout(req); got != source.DefaultTimeout {
		t.Errorf("default timeout = %v, want %v", got, source.DefaultTimeout)
	}
}

// checkFailure asserts err is a *failure.Error with the reason, stall and a
// message containing want, and no credential.
func checkFailure(t *testing.T, err error, reason string, stalled bool, want string) {
	t.Helper()
	var ferr *failure.Error
	if !errors.As(err, &ferr) {
		t.Fatalf("error = %v (%T), want a *failure.Error", err, err)
	}
	f := ferr.Data()
	t.Logf("failure: %+v", *f)
	if f.Reason != reason || f.Stalled != stalled || !strings.Contains(f.Message, want) {
		t.Errorf("failure = %+v\nwant reason %s, stalled %v, message containing %q", f, reason, stalled, want)
	}
	if strings.Contains(f.Message, "s3cr3t") {
		t.Errorf("message leaks a credential: %q", f.Message)
	}
}
