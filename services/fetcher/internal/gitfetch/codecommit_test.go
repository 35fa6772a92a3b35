package gitfetch

import (
	"context"
	"encoding/pem"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/providertoken"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source/sourcetest"
	"github.com/headwater-gitops/headwater/testsupport/cloudid"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
)

// codeCommitName is the CodeCommit host the test's git server stands for.
const codeCommitName = "git-codecommit." + cloudid.Region + ".amazonaws.com"

// codeCommitFixture is STS and a git server behind HTTPS that lets in only
// CodeCommit credentials signed with the credentials STS issued.
type codeCommitFixture struct {
	aws    *cloudid.AWS
	front  *httptest.Server
	env    map[string]string
	ca     string
	commit string
}

func newCodeCommitFixture(t *testing.T) *codeCommitFixture {
	t.Helper()
	f := &codeCommitFixture{aws: &cloudid.AWS{RoleARN: cloudid.RoleARN, WebIdentityToken: cloudid.ServiceAccountToken, Region: cloudid.Region}}
	must(t, f.aws.Start())
	t.Cleanup(func() { _ = f.aws.Close() })
	git := &gitserver.Server{Root: t.TempDir(), Authorize: f.aws.CodeCommit(codeCommitName)}
	must(t, git.Start("127.0.0.1:0"))
	t.Cleanup(func() { _ = git.Stop() })
	f.commit = newRepoIn(t, git.Root, "repo")
	backend, err := url.Parse(strings.TrimSuffix(git.RepoURL("repo"), "/repo.git"))
	must(t, err)
	f.front = httptest.NewTLSServer(httputil.NewSingleHostReverseProxy(backend))
	t.Cleanup(f.front.Close)
	f.ca = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.front.Certificate().Raw}))
	token := filepath.Join(t.TempDir(), "token")
	must(t, os.WriteFile(token, []byte(cloudid.ServiceAccountToken), 0o600))
	f.env = map[string]string{providertoken.EnvAWSRoleARN: cloudid.RoleARN, providertoken.EnvAWSWebIdentityTokenFile: token,
		providertoken.EnvAWSEndpointURLSTS: f.aws.URL()}
	return f
}

// source is a Source with the fixture's environment edited by edit.
func (f *codeCommitFixture) source(cache *providertoken.Cache, edit func(map[string]string)) *Source {
	env := maps.Clone(f.env)
	if edit != nil {
		edit(env)
	}
	return &Source{Tokens: cache, Getenv: sourcetest.Getenv(env), RefCache: NewRefCache(time.Hour, 0, nil),
		Aliases: map[string]string{strings.TrimPrefix(f.front.URL, "https://"): codeCommitName}}
}

func TestCodeCommit(t *testing.T) {
	f := newCodeCommitFixture(t)
	src := f.source(providertoken.NewCache(0, nil), nil)
	c := providerCase{provider: sourcev1.GitProviderAWS, url: f.front.URL + "/repo.git", secret: map[string]string{"ca.crt": f.ca}}
	for range 3 {
		c.run(t, src, f.commit)
	}
	if n := f.aws.CredentialsMinted(); n != 1 {
		t.Errorf("STS credentials for 3 fetches: %d, want 1 (the signed login cached)", n)
	}
	// Without the provider the server refuses: the signature is what lets
	// the clone in.
	anonymous := providerCase{url: c.url, secret: c.secret, reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient,
		message: "authentication required"}
	anonymous.run(t, src, f.commit)
}

func TestCodeCommitFailures(t *testing.T) {
	f := newCodeCommitFixture(t)
	const prefix = "failed to configure authentication options: failed to get access token for Git repository: " +
		"failed to create provider access token for the controller: "
	forged := filepath.Join(t.TempDir(), "forged")
	must(t, os.WriteFile(forged, []byte("eyJhbGciOiJSUzI1NiJ9.forged.sig"), 0o600))
	cases := []struct {
		providerCase
		env     func(map[string]string)
		status  int
		sa      string
		unalias bool
	}{
		{providerCase: providerCase{name: "wrong role ARN", reason: sourcev1.AuthenticationFailedReason, handling: failure.Final,
			message: prefix + "failed to retrieve credentials: operation error STS: AssumeRoleWithWebIdentity, https response error StatusCode: 403"},
			env: func(e map[string]string) { e[providertoken.EnvAWSRoleARN] = "arn:aws:iam::123456789012:role/other" }},
		{providerCase: providerCase{name: "forged token", reason: sourcev1.AuthenticationFailedReason, handling: failure.Final,
			message: "InvalidIdentityToken"},
			env: func(e map[string]string) { e[providertoken.EnvAWSWebIdentityTokenFile] = forged }},
		{providerCase: providerCase{name: "no IRSA", reason: sourcev1.AuthenticationFailedReason, handling: failure.Final,
			message: prefix + "no AWS web identity"},
			env: func(e map[string]string) { delete(e, providertoken.EnvAWSWebIdentityTokenFile) }},
		{providerCase: providerCase{name: "STS 500", reason: sourcev1.AuthenticationFailedReason, handling: failure.Transient,
			message: "StatusCode: 500"}, status: http.StatusInternalServerError},
		{providerCase: providerCase{name: "not a CodeCommit URL", reason: sourcev1.AuthenticationFailedReason, handling: failure.Stalling,
			message: "failed to configure authentication options: invalid AWS CodeCommit Git URL: " + strings.TrimPrefix(f.front.URL, "https://")},
			unalias: true},
		{providerCase: providerCase{name: "service account", reason: "UnsupportedProvider", handling: failure.Stalling,
			message: "object-level workload identity (spec.serviceAccountName with provider 'aws') is not supported for Git"}, sa: "tenant-a"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.aws.FailWith(tc.status)
			defer f.aws.FailWith(0)
			src := f.source(nil, tc.env)
			if tc.unalias {
				src.Aliases = nil
			}
			req := request(f.front.URL+"/repo.git", &sourcev1.GitRepositoryRef{Branch: "master"})
			req.GitRepository.Provider = sourcev1.GitProviderAWS
			req.GitRepository.ServiceAccountName = tc.sa
			_, err := src.Resolve(context.Background(), req)
			checkProviderFailure(t, err, tc.reason, tc.handling, tc.message)
		})
	}
	t.Run("plain HTTP", func(t *testing.T) {
		src := f.source(nil, nil)
		src.Aliases = map[string]string{"127.0.0.1:1": codeCommitName}
		req := request("http://127.0.0.1:1/repo.git", &sourcev1.GitRepositoryRef{Branch: "master"})
		req.GitRepository.Provider = sourcev1.GitProviderAWS
		_, err := src.Resolve(context.Background(), req)
		checkProviderFailure(t, err, sourcev1.AuthenticationFailedReason, failure.Stalling, "AWS CodeCommit authentication requires an HTTPS Git URL")
	})
	if n := f.aws.CredentialsMinted(); n != 0 {
		t.Errorf("credentials issued for failing fetches: %d", n)
	}
}
