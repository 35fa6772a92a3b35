package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	gcrv1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/minio/minio-go/v7"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/headwater-gitops/headwater/e2e/harness"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/testsupport/chartrepo"
	"github.com/headwater-gitops/headwater/testsupport/gitserver"
	"github.com/headwater-gitops/headwater/testsupport/miniotest"
	"github.com/headwater-gitops/headwater/testsupport/registry"
)

// e2eHelmIndexMaxSize is the fetcher's -helm-index-max-size in these
// tests: larger than any index a test serves, except the one that checks
// the limit.
const e2eHelmIndexMaxSize = 256 << 10

// badInput is one row of the bad-input corpus: something a user (or
// whoever can reach a source, a Secret or the bus) can hand Headwater, and
// what Headwater must make of it.
type badInput struct {
	name string
	// kind is the resource the input reaches (a source kind), or "NATS"
	// for input put on the bus.
	kind string

	// input makes the hostile input and the object of kind name over it.
	// A row over a source that was Ready first makes it Ready, then
	// breaks it, and returns the artifact it had: that artifact must stay
	// in status and still download with its digest.
	input func(t *testing.T, name string) (previous *meta.Artifact)
	// refused, instead, makes an attempt the system must turn away at
	// the door (the API server, NATS) and returns its error.
	refused func(t *testing.T, name string) error
	// dropped, instead, puts input on the bus that the services must
	// drop, and checks that they did.
	dropped func(t *testing.T, name string)

	// cond is the condition the failure sets True with reason; Ready is
	// False with the same reason (and message).
	cond, reason string
	// stalled: Stalled=True too, as the input cannot work until the user
	// changes it; otherwise the source is retried and not Stalled.
	stalled bool
	// inMsg is in the condition's and the Warning Event's messages, or in
	// the refusal.
	inMsg string
	// event is the Warning Event's reason, reason when empty.
	event string
	// noCloudEvent: the watcher refuses the spec itself, before any job,
	// so no service publishes a failed CloudEvent.
	noCloudEvent bool

	// ready: the source becomes Ready, the hostile part left out.
	ready bool
	// check, when set, checks more of the object once the rest holds.
	check func(t *testing.T, obj fluxSource)
}

// TestBadInput is the bad-input corpus, one table: hostile paths in git
// trees, bucket keys, chart archives and OCI layers; decompression bombs;
// YAML alias bombs; files over the limit; Secrets missing keys or with
// malformed ones; specs the API server refuses and specs it accepts that
// stall; spoofed and malformed messages on the bus. Every failure a user
// can cause shows in the resource's conditions (Flux's reason, a message
// that says what is wrong) and in a Warning Event, loses no artifact
// already stored, and crashes no service.
func TestBadInput(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	pids := map[string]int{}
	for _, s := range env.Services() {
		pids[s.Name] = s.Pid()
	}
	closed := fmt.Sprintf("127.0.0.1:%d", closedPort(t))
	silent := silentListener(t)

	// One server of each kind holds every row's hostile input.
	reg := badRegistry(t)
	s3 := miniotest.New(t)
	s3.MakeBucket(t, "hostile")
	createSecret(t, "badinput-s3", map[string]string{"accesskey": s3.AccessKey, "secretkey": s3.SecretKey})
	badChartRepository(t)
	indexes := &chartrepo.Server{Dir: t.TempDir()}
	if err := indexes.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = indexes.Stop() })

	tests := []badInput{
		// Unreachable and wrong Git remotes.
		{
			name: "unreachable-host", kind: kind,
			input: func(t *testing.T, name string) *meta.Artifact {
				createSource(t, name, "http://"+closed+"/"+name+".git", branch)
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.GitOperationFailedReason,
			inMsg: "failed to checkout and determine revision: ", check: messageNames(closed),
		},
		{
			// A server that accepts connections and never answers: the
			// fetch gives up after spec.timeout.
			name: "silent-host", kind: kind,
			input: func(t *testing.T, name string) *meta.Artifact {
				createSource(t, name, "http://"+silent+"/"+name+".git", branch, func(o *sourcev1.GitRepository) {
					o.Spec.Timeout = &metav1.Duration{Duration: 3 * time.Second}
				})
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.GitOperationFailedReason,
			inMsg: "failed to checkout and determine revision: ", check: messageNames(silent),
		},
		{
			name: "missing-branch", kind: kind,
			input: func(t *testing.T, name string) *meta.Artifact {
				newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
				createSource(t, name, env.Git.RepoURL(name), "does-not-exist")
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.GitOperationFailedReason, inMsg: "does-not-exist",
		},
		{
			name: "ready-then-missing-branch", kind: kind,
			input: func(t *testing.T, name string) *meta.Artifact {
				_, c := newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
				createSource(t, name, env.Git.RepoURL(name), branch)
				prev := waitArtifact(t, name, revision(c)).Status.Artifact
				patch(t, name, func(o *sourcev1.GitRepository) { o.Spec.Reference.Branch = "gone" })
				return prev
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.GitOperationFailedReason, inMsg: "gone",
		},

		// Credentials in a URL never reach the bus: the source stalls
		// and says where they belong, without repeating them; the bus tap
		// checks that none of urlCredentials was ever on the bus.
		{
			name: "credentials-in-url", kind: kind,
			input: func(t *testing.T, name string) *meta.Artifact {
				newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
				createSource(t, name, strings.Replace(env.Git.RepoURL(name), "://", "://user:"+urlCredential(name)+"@", 1), branch)
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.URLInvalidReason, stalled: true, inMsg: "spec.secretRef",
			check: checkCredentialsHidden, noCloudEvent: true,
		},
		{
			// A password with a character a URL must escape: the URL
			// does not parse, and still carries the token.
			name: "credentials-in-invalid-url", kind: kind,
			input: func(t *testing.T, name string) *meta.Artifact {
				newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
				createSource(t, name, strings.Replace(env.Git.RepoURL(name), "://", "://user:"+urlCredential(name)+"%@", 1), branch)
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.URLInvalidReason, stalled: true, inMsg: "spec.secretRef",
			check: checkCredentialsHidden, noCloudEvent: true,
		},
		{
			name: "credentials-in-oci-url", kind: ociKind,
			input: func(t *testing.T, name string) *meta.Artifact {
				createOCIRepository(t, name, "oci://user:"+urlCredential(name)+"@registry.example/"+name)
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.URLInvalidReason, stalled: true, inMsg: "spec.secretRef",
			check: checkCredentialsHidden, noCloudEvent: true,
		},

		// Git trees.
		{
			name: "git-tree-dotdot", kind: kind,
			input: func(t *testing.T, name string) *meta.Artifact {
				repo, c := newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
				createSource(t, name, env.Git.RepoURL(name), branch)
				prev := waitArtifact(t, name, revision(c)).Status.Artifact
				pushTree(t, repo, treeEntry{name: "..", tree: []treeEntry{{name: "evil", blob: "x"}}}, treeEntry{name: "README.md", blob: "# hostile\n"})
				requestReconcile(t, name)
				return prev
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.GitOperationFailedReason, inMsg: "invalid path in the tree: '..'",
		},
		{
			name: "git-tree-dotgit", kind: kind,
			input: func(t *testing.T, name string) *meta.Artifact {
				repo, err := env.NewRepo(name, branch)
				if err != nil {
					t.Fatal(err)
				}
				pushTree(t, repo, treeEntry{name: ".GIT", tree: []treeEntry{{name: "config", blob: "[core]\n\tfsmonitor = evil\n"}}})
				createSource(t, name, env.Git.RepoURL(name), branch)
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.GitOperationFailedReason, inMsg: "invalid path in the tree: '.GIT'",
		},
		{
			// Links out of the tree are left out, never followed; links
			// inside it become copies.
			name: "git-links-out", kind: kind, ready: true,
			input: func(t *testing.T, name string) *meta.Artifact {
				repo, err := env.NewRepo(name, branch)
				if err != nil {
					t.Fatal(err)
				}
				if err := repo.Write(map[string]string{"deploy/app.yaml": "kind: App\n", "logo.png": "png"}); err != nil {
					t.Fatal(err)
				}
				secret := filepath.Join(t.TempDir(), "secret")
				if err := os.WriteFile(secret, []byte("deploy/\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				for link, target := range map[string]string{
					"passwd":           "/etc/passwd",
					"etc":              "/etc",
					"up":               "../../../../../../../../..",
					".sourceignore":    secret, // read, it would drop deploy/ and keep logo.png
					"deploy/copy.yaml": "app.yaml",
				} {
					if err := os.Symlink(target, filepath.Join(repo.Dir, filepath.FromSlash(link))); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := repo.Commit("links everywhere"); err != nil {
					t.Fatal(err)
				}
				createSource(t, name, env.Git.RepoURL(name), branch)
				return nil
			},
			check: func(t *testing.T, obj fluxSource) {
				want := map[string]string{"deploy/app.yaml": "kind: App\n", "deploy/copy.yaml": "kind: App\n"}
				if d := diffTrees(untarArtifact(t, download(t, obj.GetArtifact().URL)), want); d != "" {
					t.Errorf("artifact of a repository with symlinks: %s", d)
				}
			},
		},
		{
			// A file over the fetcher's -max-file-size: a new commit can
			// fix it, so the source is not stalled.
			name: "git-huge-file", kind: kind,
			input: func(t *testing.T, name string) *meta.Artifact {
				repo, c := newRepo(t, name, map[string]string{"deploy/app.yaml": "kind: App\n"})
				createSource(t, name, env.Git.RepoURL(name), branch)
				prev := waitArtifact(t, name, revision(c)).Status.Artifact
				commit(t, repo, map[string]string{"deploy/huge.yaml": strings.Repeat("x", e2eMaxFileSize+1)}, "a huge file")
				requestReconcile(t, name)
				return prev
			},
			cond: sourcev1.StorageOperationFailedCondition, reason: sourcev1.ArchiveOperationFailedReason,
			inMsg: "file too large: deploy/huge.yaml",
		},

		// Secrets.
		{
			name: "git-secret-missing", kind: kind,
			input: func(t *testing.T, name string) *meta.Artifact {
				newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
				createSource(t, name, env.Git.RepoURL(name), branch, withSecret(name+"-absent"))
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.AuthenticationFailedReason,
			inMsg: `secrets "git-secret-missing-absent" not found`,
		},
		{
			name: "git-basic-auth-no-username", kind: kind,
			input: func(t *testing.T, name string) *meta.Artifact {
				newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
				createSecret(t, name, map[string]string{"password": "s3cr3t-without-user"})
				createSource(t, name, env.Git.RepoURL(name), branch, withSecret(name))
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.AuthenticationFailedReason, stalled: true,
			inMsg: "invalid 'http' auth option: 'password' requires 'username' to be set",
		},
		{
			name: "git-ssh-no-identity", kind: kind,
			input: func(t *testing.T, name string) *meta.Artifact {
				createSecret(t, name, map[string]string{"known_hosts": "example.com ssh-ed25519 AAAA\n"})
				createSource(t, name, "ssh://git@example.com/repo.git", branch, withSecret(name))
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.AuthenticationFailedReason, stalled: true,
			inMsg: "invalid 'ssh' auth option: 'identity' is required",
		},
		{
			name: "git-ca-not-pem", kind: kind,
			input: func(t *testing.T, name string) *meta.Artifact {
				createSecret(t, name, map[string]string{"ca.crt": "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"})
				createSource(t, name, "https://"+closed+"/repo.git", branch, withSecret(name))
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.AuthenticationFailedReason, stalled: true,
			inMsg: "failed to parse CA certificate",
		},
		{
			name: "git-proxy-no-address", kind: kind,
			input: func(t *testing.T, name string) *meta.Artifact {
				newRepo(t, name, map[string]string{"README.md": "# " + name + "\n"})
				createSecret(t, name, map[string]string{"username": "flux"})
				createSource(t, name, env.Git.RepoURL(name), branch, withProxySecret(name))
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.AuthenticationFailedReason, stalled: true,
			inMsg: "failed to configure proxy options: secret 'default/git-proxy-no-address': key 'address' not found",
		},
		{
			name: "git-github-app-key-not-pem", kind: kind,
			input: func(t *testing.T, name string) *meta.Artifact {
				createSecret(t, name, map[string]string{"githubAppID": "4242", "githubAppInstallationID": "77",
					"githubAppPrivateKey": "s3cr3t-not-a-key"})
				createSource(t, name, "https://"+closed+"/acme/repo.git", branch, withSecret(name), func(o *sourcev1.GitRepository) {
					o.Spec.Provider = sourcev1.GitProviderGitHub
				})
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.AuthenticationFailedReason, stalled: true,
			inMsg: "could not parse private key: invalid key: Key must be a PEM encoded PKCS1 or PKCS8 key",
		},
		{
			name: "git-github-app-no-private-key", kind: kind,
			input: func(t *testing.T, name string) *meta.Artifact {
				createSecret(t, name, map[string]string{"githubAppID": "4242", "githubAppInstallationID": "77"})
				createSource(t, name, "https://"+closed+"/acme/repo.git", branch, withSecret(name), func(o *sourcev1.GitRepository) {
					o.Spec.Provider = sourcev1.GitProviderGitHub
				})
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.AuthenticationFailedReason, stalled: true,
			inMsg: "secret 'default/git-github-app-no-private-key': key 'githubAppPrivateKey' not found",
		},
		{
			name: "bucket-secret-no-secretkey", kind: sourcev1.BucketKind,
			input: func(t *testing.T, name string) *meta.Artifact {
				createSecret(t, name, map[string]string{"accesskey": s3.AccessKey})
				createBucket(t, name, s3.Endpoint, "hostile", func(b *sourcev1.Bucket) {
					b.Spec.SecretRef = &meta.LocalObjectReference{Name: name}
				})
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.AuthenticationFailedReason, stalled: true,
			inMsg: "secretkey",
		},

		// Specs the API server accepts that cannot work.
		{
			name: "git-url-no-host", kind: kind,
			input: func(t *testing.T, name string) *meta.Artifact {
				createSource(t, name, "https:///repo.git", branch)
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.URLInvalidReason, stalled: true, inMsg: "no host",
		},
		{
			name: "git-provider-aws", kind: kind,
			input: func(t *testing.T, name string) *meta.Artifact {
				createSource(t, name, "https://git-codecommit.us-east-1.amazonaws.com/v1/repos/repo", branch, func(o *sourcev1.GitRepository) {
					o.Spec.Provider = sourcev1.GitProviderAWS
				})
				return nil
			},
			// The fetcher of the tests has no AWS web identity (IRSA):
			// final for this attempt, tried again at the next interval.
			cond: sourcev1.FetchFailedCondition, reason: "AuthenticationFailed", stalled: false,
			inMsg: "no AWS web identity",
		},
		{
			name: "git-provider-github-no-secret", kind: kind,
			input: func(t *testing.T, name string) *meta.Artifact {
				createSource(t, name, "https://"+closed+"/acme/repo.git", branch, func(o *sourcev1.GitRepository) {
					o.Spec.Provider = sourcev1.GitProviderGitHub
				})
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.InvalidProviderConfigurationReason, stalled: true,
			inMsg: "secretRef with github app data must be specified when provider is set to github",
		},
		{
			name: "helmrepo-oci-scheme", kind: sourcev1.HelmRepositoryKind,
			input: func(t *testing.T, name string) *meta.Artifact {
				createHelmRepository(t, name, "oci://"+reg.Host+"/charts")
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.URLInvalidReason, stalled: true,
			inMsg: "'oci' URL scheme cannot be used with 'default' HelmRepository type",
		},
		{
			name: "oci-provider-aws", kind: ociKind,
			input: func(t *testing.T, name string) *meta.Artifact {
				createOCIRepository(t, name, reg.URL("semver"), func(o *sourcev1.OCIRepository) { o.Spec.Provider = sourcev1.AmazonOCIProvider })
				return nil
			},
			// The test registry is not an ECR host: Flux's message, stalled.
			cond: sourcev1.FetchFailedCondition, reason: "AuthenticationFailed", stalled: true,
			inMsg: "invalid AWS registry",
		},

		// Specs the API server refuses (the CRDs' validation).
		{
			name: "crd-git-url-scheme", kind: kind, inMsg: "spec.url",
			refused: func(t *testing.T, name string) error {
				return env.Client.Create(t.Context(), &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
					Spec: sourcev1.GitRepositorySpec{URL: "file:///etc", Interval: metav1.Duration{Duration: time.Minute}}})
			},
		},
		{
			name: "crd-negative-interval", kind: kind, inMsg: "spec.interval",
			refused: func(t *testing.T, name string) error {
				return env.Client.Create(t.Context(), &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
					Spec: sourcev1.GitRepositorySpec{URL: env.Git.RepoURL(name), Interval: metav1.Duration{Duration: -time.Minute}}})
			},
		},
		{
			name: "crd-bucket-provider", kind: sourcev1.BucketKind, inMsg: "spec.provider",
			refused: func(t *testing.T, name string) error {
				return env.Client.Create(t.Context(), &sourcev1.Bucket{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
					Spec: sourcev1.BucketSpec{Provider: "dropbox", BucketName: "b", Endpoint: s3.Endpoint, Interval: metav1.Duration{Duration: time.Minute}}})
			},
		},
		{
			name: "crd-oci-url-scheme", kind: ociKind, inMsg: "spec.url",
			refused: func(t *testing.T, name string) error {
				return env.Client.Create(t.Context(), &sourcev1.OCIRepository{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
					Spec: sourcev1.OCIRepositorySpec{URL: "https://" + reg.Host + "/app", Interval: metav1.Duration{Duration: time.Minute}}})
			},
		},
		{
			name: "crd-chart-source-kind", kind: sourcev1.HelmChartKind, inMsg: "spec.sourceRef.kind",
			refused: func(t *testing.T, name string) error {
				return env.Client.Create(t.Context(), &sourcev1.HelmChart{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
					Spec: sourcev1.HelmChartSpec{Chart: "podinfo", Interval: metav1.Duration{Duration: time.Minute},
						SourceRef: sourcev1.LocalHelmChartSourceReference{Kind: "ConfigMap", Name: "charts"}}})
			},
		},

		// Bucket keys. MinIO refuses a key with a '..' element, and
		// stores "/etc/evil" as "etc/evil": such keys reach no fetcher
		// from MinIO (the fetcher's unit tests give it the listings of
		// servers that keep them, which fail with BucketOperationFailed).
		{
			name: "bucket-key-dotdot", kind: sourcev1.BucketKind, inMsg: `Resource name contains bad components such as ".."`,
			refused: func(t *testing.T, name string) error {
				_, err := s3.Client.PutObject(t.Context(), "hostile", "../"+name, strings.NewReader("x"), 1, minio.PutObjectOptions{})
				return err
			},
		},
		{
			name: "bucket-key-absolute", kind: sourcev1.BucketKind, ready: true,
			input: func(t *testing.T, name string) *meta.Artifact {
				s3.MakeBucket(t, name)
				putObject(t, s3, name, "/etc/evil", "x")
				createBucket(t, name, s3.Endpoint, name, func(b *sourcev1.Bucket) {
					b.Spec.SecretRef = &meta.LocalObjectReference{Name: "badinput-s3"}
				})
				return nil
			},
			check: func(t *testing.T, obj fluxSource) {
				if d := diffTrees(untarArtifact(t, download(t, obj.GetArtifact().URL)), map[string]string{"etc/evil": "x"}); d != "" {
					t.Errorf("artifact of a bucket with key /etc/evil: %s", d)
				}
			},
		},
		{
			name: "bucket-missing", kind: sourcev1.BucketKind, input: bucketInput(s3.Endpoint, "does-not-exist"),
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.BucketOperationFailedReason, inMsg: "bucket 'does-not-exist' not found",
		},
		{
			name: "bucket-endpoint-closed", kind: sourcev1.BucketKind, input: bucketInput(closed, "hostile"),
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.BucketOperationFailedReason, inMsg: "'hostile'", check: messageNames(closed),
		},
		{
			// A credential configuration that is no service account key
			// (it could make the fetcher read its own files) is refused.
			name: "bucket-provider-gcp-external-account", kind: sourcev1.BucketKind,
			input: func(t *testing.T, name string) *meta.Artifact {
				createSecret(t, name, map[string]string{"serviceaccount": `{"type":"external_account","credential_source":{"file":"/var/run/secrets/kubernetes.io/serviceaccount/token"}}`})
				createBucket(t, name, s3.Endpoint, "hostile", func(b *sourcev1.Bucket) {
					b.Spec.Provider = sourcev1.BucketProviderGoogle
					b.Spec.SecretRef = &meta.LocalObjectReference{Name: name}
				})
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.AuthenticationFailedReason, stalled: true,
			inMsg: "'serviceaccount' is not a service account key: type 'external_account', want 'service_account'",
		},
		{
			name: "bucket-huge-object", kind: sourcev1.BucketKind,
			input: func(t *testing.T, name string) *meta.Artifact {
				bucket := name
				s3.MakeBucket(t, bucket)
				putObject(t, s3, bucket, "app.yaml", "kind: App\n")
				createBucket(t, name, s3.Endpoint, bucket, func(b *sourcev1.Bucket) {
					b.Spec.SecretRef = &meta.LocalObjectReference{Name: "badinput-s3"}
				})
				prev := waitBucketArtifact(t, name, listingRevision(t, s3, bucket, "", nil)).Status.Artifact
				putObject(t, s3, bucket, "huge.yaml", strings.Repeat("x", e2eMaxFileSize+1))
				requestBucketReconcile(t, name)
				return prev
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.BucketOperationFailedReason, inMsg: "huge.yaml",
		},

		// Helm repository indexes.
		{
			// "Billion laughs": nine levels of aliases, each ten of the
			// one before.
			name: "helmrepo-alias-bomb", kind: sourcev1.HelmRepositoryKind,
			input: func(t *testing.T, name string) *meta.Artifact {
				srv := &chartrepo.Server{Dir: t.TempDir()}
				if err := srv.Start("127.0.0.1:0"); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = srv.Stop() })
				if err := srv.Add(chartrepo.Chart{Name: "podinfo", Version: "6.0.0"}); err != nil {
					t.Fatal(err)
				}
				createHelmRepository(t, name, srv.URL())
				prev := waitHelmRepository(t, name, sha256Digest(srv.Index())).Status.Artifact
				srv.SetIndex(aliasBomb())
				requestReconcileOf(t, getObject(t, name, &sourcev1.HelmRepository{}))
				return prev
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.IndexationFailedReason,
			inMsg: "YAML aliases are not allowed in a Helm repository index",
		},
		{
			name: "helmrepo-not-yaml", kind: sourcev1.HelmRepositoryKind,
			input: func(t *testing.T, name string) *meta.Artifact {
				srv := &chartrepo.Server{Dir: t.TempDir()}
				if err := srv.Start("127.0.0.1:0"); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = srv.Stop() })
				srv.SetIndex([]byte("<html><body>maintenance</body></html>\n"))
				createHelmRepository(t, name, srv.URL())
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.IndexationFailedReason,
			inMsg: "failed to load Helm repository from index YAML",
		},
		{
			name: "helmrepo-index-too-large", kind: sourcev1.HelmRepositoryKind,
			input: func(t *testing.T, name string) *meta.Artifact {
				srv := &chartrepo.Server{Dir: t.TempDir()}
				if err := srv.Start("127.0.0.1:0"); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = srv.Stop() })
				index := "apiVersion: v1\nentries: {}\n"
				srv.SetIndex([]byte(index + "#" + strings.Repeat("x", e2eHelmIndexMaxSize-len(index)) + "\n"))
				createHelmRepository(t, name, srv.URL())
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: meta.FailedReason,
			inMsg: "exceeds the maximum size of 262.1kB (-helm-index-max-size)",
		},

		// Chart archives.
		{
			name: "chart-dotdot", kind: sourcev1.HelmChartKind,
			input: func(t *testing.T, name string) *meta.Artifact {
				createHelmChart(t, name, "dotdot")
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: "ChartPullError", inMsg: `unsafe path in archive: "dotdot/../../evil"`,
		},
		{
			name: "chart-absolute", kind: sourcev1.HelmChartKind,
			input: func(t *testing.T, name string) *meta.Artifact {
				createHelmChart(t, name, "absolute")
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: "ChartPullError", inMsg: `unsafe path in archive: "/etc/evil"`,
		},
		{
			name: "chart-gzip-bomb", kind: sourcev1.HelmChartKind,
			input: func(t *testing.T, name string) *meta.Artifact {
				createHelmChart(t, name, "bomb")
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: "ChartPullError", inMsg: "larger than the maximum",
		},

		// OCI layers.
		{
			name: "oci-dotdot", kind: ociKind, input: ociInput(reg.URL("dotdot"), "v1"),
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.OCILayerOperationFailedReason, inMsg: `invalid name error "../../evil"`,
		},
		{
			name: "oci-absolute", kind: ociKind, input: ociInput(reg.URL("absolute"), "v1"),
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.OCILayerOperationFailedReason, inMsg: `invalid name error "/etc/evil"`,
		},
		{
			name: "oci-symlink-out", kind: ociKind, input: ociInput(reg.URL("symlink"), "v1"),
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.OCILayerOperationFailedReason, inMsg: "links outside the artifact",
		},
		{
			// Zeros compress to almost nothing: a small layer, a file over
			// the fetcher's -max-file-size once extracted.
			name: "oci-bomb", kind: ociKind, input: ociInput(reg.URL("bomb"), "v1"),
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.OCILayerOperationFailedReason,
			inMsg: fmt.Sprintf("file 'zeros' is %d bytes, over the limit of %d", 8*e2eMaxFileSize, e2eMaxFileSize),
		},
		{
			name: "oci-wrong-media-type", kind: ociKind, input: ociInput(reg.URL("plain-tar"), "v1"),
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.OCILayerOperationFailedReason,
			inMsg: "layer media type 'application/vnd.oci.image.layer.v1.tar' is not a tar+gzip",
		},
		{
			name: "oci-digest-mismatch", kind: ociKind, input: ociInput(reg.URL("corrupt"), "v1"),
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.OCILayerOperationFailedReason, inMsg: "error verifying sha256 checksum",
		},
		{
			name: "oci-semver-nothing", kind: ociKind,
			input: func(t *testing.T, name string) *meta.Artifact {
				createOCIRepository(t, name, reg.URL("semver"), func(o *sourcev1.OCIRepository) {
					o.Spec.Reference = &sourcev1.OCIRepositoryRef{SemVer: ">=2.0.0"}
				})
				return nil
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.ReadOperationFailedReason, inMsg: "no match found for semver: >=2.0.0",
		},
		{
			name: "oci-unreachable", kind: ociKind, input: ociInput("oci://"+closed+"/app", ""),
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.OCIPullFailedReason, inMsg: closed,
		},
		{
			// A bad push over a Ready artifact.
			name: "oci-bad-push", kind: ociKind,
			input: func(t *testing.T, name string) *meta.Artifact {
				good := reg.Push(t, name, "latest", registry.FluxArtifact(t, map[string]string{"app.yaml": "good\n"}, "", ""))
				createOCIRepository(t, name, reg.URL(name))
				prev := waitOCIArtifact(t, name, "latest@"+good.String()).Status.Artifact
				reg.Push(t, name, "latest", registry.Artifact{Layers: []registry.Layer{{Data: registry.TarGz(t,
					registry.Entry{Name: "a/../../evil", Body: "x"})}}})
				requestOCIReconcile(t, name)
				return prev
			},
			cond: sourcev1.FetchFailedCondition, reason: sourcev1.OCILayerOperationFailedReason, inMsg: `invalid name error "a/../../evil"`,
		},

		// The bus: spoofed CloudEvents are refused by NATS, malformed
		// jobs dropped by the fetcher.
		{
			name: "bus-subscriber-publishes-job", kind: "NATS", inMsg: "Permissions Violation for Publish",
			refused: func(t *testing.T, name string) error {
				return publishAs(t, events.SubscriberIdentity, events.PublishSubjectPrefix+".gitrepository", spoofedEvent(t, name))
			},
		},
		{
			name: "bus-subscriber-publishes-event", kind: "NATS", inMsg: "Permissions Violation for Publish",
			refused: func(t *testing.T, name string) error {
				return publishAs(t, events.SubscriberIdentity, events.EventSubject(kind, namespace, name), spoofedEvent(t, name))
			},
		},
		{
			name: "bus-no-identity", kind: "NATS", inMsg: "Authorization Violation",
			refused: func(t *testing.T, name string) error {
				return publishAs(t, "", events.EventSubject(kind, namespace, name), spoofedEvent(t, name))
			},
		},
		{
			// A plug-in kind's fetcher (its NATS identity) pointing its
			// consumer at the built-in kinds' jobs: NATS refuses the
			// create for its subject, before JetStream would look at
			// the filter.
			name: "bus-plugin-consumes-gitrepository-jobs", kind: "NATS",
			inMsg: `Permissions Violation for Publish to "$JS.API.CONSUMER.CREATE.` + events.FetchStream,
			refused: func(t *testing.T, _ string) error {
				return consumeAs(t, events.PluginIdentity("HTTPSource"), events.PluginConsumer("HTTPSource"), events.FetchSubject(kind))
			},
		},
		{
			name: "bus-malformed-job", kind: "NATS",
			dropped: dropMalformedJobs,
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			switch {
			case tt.refused != nil:
				checkRefused(t, tt)
			case tt.dropped != nil:
				tt.dropped(t, tt.name)
			case tt.ready:
				checkLeftOut(t, tt)
			default:
				checkBadInput(t, tt, tt.input(t, tt.name))
			}
		})
	}

	// Whatever they were handed, the services are the processes they
	// were before the table.
	t.Cleanup(func() {
		for _, s := range env.Services() {
			if !s.Running() || s.Pid() != pids[s.Name] {
				t.Errorf("%s: running %v, pid %d (was %d), exit %v", s.Name, s.Running(), s.Pid(), pids[s.Name], s.ExitErr())
			}
		}
	})
}

// checkBadInput checks what a user sees of a source given bad input: the
// row's condition True with its reason and a message naming what is wrong,
// Ready=False with the same reason and message, Stalled as the row says,
// a Warning Event, a failed CloudEvent, and the artifact it had before
// (previous, nil when none) kept in status and served.
func checkBadInput(t *testing.T, tt badInput, previous *meta.Artifact) {
	t.Helper()
	what := tt.kind + " " + tt.name
	get := func() fluxSource { return getSource(t, tt.kind, tt.name) }
	obj := waitConditionOf(t, what, get, tt.cond, metav1.ConditionTrue, tt.reason)
	c := conditionOf(t, obj, tt.cond)
	t.Logf("%s=True %s: %s", tt.cond, c.Reason, c.Message)
	if !strings.Contains(c.Message, tt.inMsg) {
		t.Errorf("%s message %q does not say %q", tt.cond, c.Message, tt.inMsg)
	}
	obj = waitConditionOf(t, what, get, meta.ReadyCondition, metav1.ConditionFalse, tt.reason)
	if ready := conditionOf(t, obj, meta.ReadyCondition); ready.Message != c.Message {
		t.Errorf("Ready message %q, want the %s message %q", ready.Message, tt.cond, c.Message)
	}
	if stalled := apimeta.IsStatusConditionTrue(obj.GetConditions(), meta.StalledCondition); stalled != tt.stalled {
		t.Errorf("Stalled=%v, want %v: conditions %+v", stalled, tt.stalled, obj.GetConditions())
	}
	event := tt.event
	if event == "" {
		event = tt.reason
	}
	waitKindEvent(t, tt.kind, tt.name, corev1.EventTypeWarning, event, func(msg string) bool { return strings.Contains(msg, tt.inMsg) })
	if !tt.noCloudEvent {
		e := waitCloudEvent(t, recorder, tt.kind, tt.name, events.TypeArtifactFailed, nil)
		if f := e.outcome().Failure; f == nil || f.Reason != tt.reason {
			t.Errorf("failed CloudEvent carries failure %+v, want reason %s", f, tt.reason)
		}
	}

	if tt.check != nil {
		tt.check(t, obj)
	}
	a := obj.GetArtifact()
	if previous == nil {
		if a != nil {
			t.Errorf("a source that never stored an artifact has %+v", a)
		}
		return
	}
	if a == nil || a.Digest != previous.Digest || a.Revision != previous.Revision || a.URL != previous.URL {
		t.Fatalf("artifact after the failure %+v, want the previous one %+v", a, previous)
	}
	if got := sha256Digest(download(t, a.URL)); got != a.Digest {
		t.Errorf("previous artifact downloads with digest %s, want %s", got, a.Digest)
	}
}

// checkLeftOut checks a source whose hostile parts are left out: Ready,
// a NewArtifact Event, and what the row's check says of the artifact.
func checkLeftOut(t *testing.T, tt badInput) {
	t.Helper()
	tt.input(t, tt.name)
	obj := waitConditionOf(t, tt.kind+" "+tt.name, func() fluxSource { return getSource(t, tt.kind, tt.name) },
		meta.ReadyCondition, metav1.ConditionTrue, meta.SucceededReason)
	if obj.GetArtifact() == nil {
		t.Fatalf("Ready without an artifact")
	}
	waitKindEvent(t, tt.kind, tt.name, corev1.EventTypeNormal, "NewArtifact", nil)
	tt.check(t, obj)
}

// checkRefused checks that the row's attempt fails with an error saying
// tt.inMsg, and, for a resource, that nothing was created.
func checkRefused(t *testing.T, tt badInput) {
	t.Helper()
	err := tt.refused(t, tt.name)
	if err == nil {
		t.Fatalf("%s accepted, want it refused", tt.name)
	}
	t.Logf("refused: %v", err)
	if !strings.Contains(err.Error(), tt.inMsg) {
		t.Errorf("refusal %q does not say %q", err, tt.inMsg)
	}
	if tt.kind == "NATS" {
		subject := events.EventSubject(kind, namespace, tt.name)
		consistently(t, "no event reaches a subscriber", 2*time.Second, func() error {
			if n := len(recorder.forSubject(subject)); n > 0 {
				return fmt.Errorf("%d events on %s", n, subject)
			}
			return nil
		})
	}
}

// messageNames is a row's check that the failure's message names s.
func messageNames(s string) func(t *testing.T, obj fluxSource) {
	return func(t *testing.T, obj fluxSource) {
		if c := conditionOf(t, obj, meta.ReadyCondition); !strings.Contains(c.Message, s) {
			t.Errorf("Ready message %q does not name %q", c.Message, s)
		}
	}
}

// checkCredentialsHidden checks a source whose URL carries credentials
// (urlCredential): no condition repeats them, and the generation is
// observed.
func checkCredentialsHidden(t *testing.T, obj fluxSource) {
	token := urlCredential(obj.GetName())
	for _, typ := range []string{meta.StalledCondition, meta.ReadyCondition, sourcev1.FetchFailedCondition} {
		if c := conditionOf(t, obj, typ); strings.Contains(c.Message, token) {
			t.Errorf("%s message %q repeats the credentials", typ, c.Message)
		}
	}
	if obj.GetGeneration() != observedGeneration(obj) {
		t.Errorf("observedGeneration %d, generation %d: want the generation observed", observedGeneration(obj), obj.GetGeneration())
	}
}

// checkFetchFailed checks the conditions, the Warning Event and the
// CloudEvent of a failed clone whose message must contain inMsg.
func checkFetchFailed(t *testing.T, obj *sourcev1.GitRepository, inMsg string) {
	t.Helper()
	checkBadInput(t, badInput{name: obj.Name, kind: kind, cond: sourcev1.FetchFailedCondition, reason: sourcev1.GitOperationFailedReason,
		inMsg: "failed to checkout and determine revision: ", check: messageNames(inMsg)}, obj.Status.Artifact)
}

// newSource returns an empty object of the source kind.
func newSource(t *testing.T, kind string) fluxSource {
	t.Helper()
	switch kind {
	case sourcev1.GitRepositoryKind:
		return &sourcev1.GitRepository{}
	case sourcev1.BucketKind:
		return &sourcev1.Bucket{}
	case sourcev1.HelmRepositoryKind:
		return &sourcev1.HelmRepository{}
	case sourcev1.HelmChartKind:
		return &sourcev1.HelmChart{}
	case sourcev1.OCIRepositoryKind:
		return &sourcev1.OCIRepository{}
	}
	t.Fatalf("no source kind %s", kind)
	return nil
}

// getSource returns the source kind/name of the test namespace.
func getSource(t *testing.T, kind, name string) fluxSource {
	t.Helper()
	return getObject(t, name, newSource(t, kind))
}

// ociInput is a row's input: an OCIRepository of url at tag (the latest
// tag when empty).
func ociInput(url, tag string) func(t *testing.T, name string) *meta.Artifact {
	return func(t *testing.T, name string) *meta.Artifact {
		createOCIRepository(t, name, url, func(o *sourcev1.OCIRepository) {
			if tag != "" {
				o.Spec.Reference = &sourcev1.OCIRepositoryRef{Tag: tag}
			}
		})
		return nil
	}
}

// bucketInput is a row's input: a Bucket of bucket at endpoint, with the
// MinIO server's keys.
func bucketInput(endpoint, bucket string) func(t *testing.T, name string) *meta.Artifact {
	return func(t *testing.T, name string) *meta.Artifact {
		createBucket(t, name, endpoint, bucket, func(b *sourcev1.Bucket) {
			b.Spec.SecretRef = &meta.LocalObjectReference{Name: "badinput-s3"}
		})
		return nil
	}
}

// badRegistry starts a registry holding the OCI rows' hostile artifacts:
// climbing and absolute paths, a symbolic link out of the tree, a
// decompression bomb, a layer that is no tar+gzip, a blob that does not
// match its digest, and a semver tag.
func badRegistry(t *testing.T) *registry.Server {
	t.Helper()
	reg := registry.New(t, registry.Options{})
	layer := func(e ...registry.Entry) registry.Artifact {
		return registry.Artifact{Layers: []registry.Layer{{Data: registry.TarGz(t, e...)}}}
	}
	reg.Push(t, "dotdot", "v1", layer(registry.Entry{Name: "../../evil", Body: "x"}))
	reg.Push(t, "symlink", "v1", layer(registry.Entry{Name: "link", Type: tar.TypeSymlink, Linkname: "/etc/passwd"}))
	reg.Push(t, "absolute", "v1", layer(registry.Entry{Name: "/etc/evil", Body: "x"}))
	reg.Push(t, "bomb", "v1", layer(registry.Entry{Name: "zeros", Size: 8 * e2eMaxFileSize}))
	reg.Push(t, "plain-tar", "v1", registry.Artifact{Layers: []registry.Layer{{MediaType: "application/vnd.oci.image.layer.v1.tar", Data: []byte("x")}}})
	// The registry serves other bytes than the manifest's digest names.
	original := registry.TarGz(t, registry.Files(map[string]string{"a": "original"})...)
	reg.Push(t, "corrupt", "v1", registry.Artifact{Layers: []registry.Layer{{Data: original}}})
	tampered := registry.TarGz(t, registry.Files(map[string]string{"a": "tampered"})...)
	if len(tampered) != len(original) {
		t.Fatalf("tampered layer is %d bytes, original %d: make them the same length", len(tampered), len(original))
	}
	if err := os.WriteFile(reg.BlobPath(gcrv1.Hash{Algorithm: "sha256", Hex: strings.TrimPrefix(sha256Digest(original), "sha256:")}), tampered, 0o644); err != nil {
		t.Fatal(err)
	}
	reg.Push(t, "semver", "1.0.0", registry.FluxArtifact(t, map[string]string{"a": "b"}, "", ""))
	return reg
}

// badChartRepository serves a chart repository whose index lists charts
// dotdot, absolute and bomb 1.0.0, and makes the HelmRepository
// "bad-charts" of it, Ready. The archives served are hostile: an entry
// climbing out of the chart, an absolute one, a decompression bomb.
func badChartRepository(t *testing.T) {
	t.Helper()
	srv := &chartrepo.Server{Dir: t.TempDir()}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	hostile := map[string]registry.Entry{
		"dotdot":   {Name: "dotdot/../../evil", Body: "x"},
		"absolute": {Name: "/etc/evil", Body: "x"},
		"bomb":     {Name: "bomb/templates/zeros.yaml", Size: 64 << 20},
	}
	for chart := range hostile {
		if err := srv.Add(chartrepo.Chart{Name: chart, Version: "1.0.0"}); err != nil {
			t.Fatal(err)
		}
	}
	// The index stays as made from the good archives; the archives served
	// change under it.
	for chart, e := range hostile {
		data := registry.TarGz(t, registry.Entry{Name: chart + "/Chart.yaml", Body: "apiVersion: v2\nname: " + chart + "\nversion: 1.0.0\n"}, e)
		if err := os.WriteFile(filepath.Join(srv.Dir, chart+"-1.0.0.tgz"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	createHelmRepository(t, "bad-charts", srv.URL())
	waitHelmRepository(t, "bad-charts", sha256Digest(srv.Index()))
}

// createHelmRepository creates the HelmRepository name of url, deleted
// when the test ends.
func createHelmRepository(t *testing.T, name, url string) {
	t.Helper()
	createObject(t, &sourcev1.HelmRepository{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec:       sourcev1.HelmRepositorySpec{URL: url, Interval: metav1.Duration{Duration: 5 * time.Minute}},
	})
}

// createHelmChart creates the HelmChart name of chart 1.0.0 from the
// HelmRepository bad-charts (badChartRepository), deleted when the test
// ends.
func createHelmChart(t *testing.T, name, chart string) {
	t.Helper()
	createObject(t, &sourcev1.HelmChart{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: sourcev1.HelmChartSpec{Chart: chart, Version: "1.0.0", Interval: metav1.Duration{Duration: 5 * time.Minute},
			SourceRef: sourcev1.LocalHelmChartSourceReference{Kind: sourcev1.HelmRepositoryKind, Name: "bad-charts"}},
	})
}

// aliasBomb is a Helm repository index that is a "billion laughs": each
// alias expands to ten of the one before, 10^9 strings in all.
func aliasBomb() []byte {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nlaughs:\n  a0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n")
	for i := 1; i < 9; i++ {
		fmt.Fprintf(&b, "  a%d: &a%d [", i, i)
		for j := range 10 {
			if j > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, "*a%d", i-1)
		}
		b.WriteString("]\n")
	}
	b.WriteString("entries:\n  bomb:\n  - name: bomb\n    version: 1.0.0\n    urls: [bomb-1.0.0.tgz]\n    laughs: *a8\n")
	return []byte(b.String())
}

// treeEntry is an entry of a git tree written as is, whatever its name:
// a blob, or a tree of entries.
type treeEntry struct {
	name string
	blob string
	tree []treeEntry
}

// pushTree commits the tree of entries (names git itself would refuse
// included) on top of the repository's branch and pushes it, as a hostile
// client with its own git can.
func pushTree(t *testing.T, repo *gitserver.Repo, entries ...treeEntry) {
	t.Helper()
	args := []string{"commit-tree", writeTree(t, repo, entries), "-m", "hostile tree"}
	if head, err := repo.Output("rev-parse", "--verify", "--quiet", "HEAD"); err == nil && head != "" {
		args = append(args, "-p", head)
	}
	c, err := repo.Output(args...)
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.Git("push", "--quiet", "--force", "origin", c+":refs/heads/"+branch); err != nil {
		t.Fatal(err)
	}
}

// writeTree writes entries as a tree object, unchecked, and returns its id.
func writeTree(t *testing.T, repo *gitserver.Repo, entries []treeEntry) string {
	t.Helper()
	var raw bytes.Buffer
	for _, e := range entries {
		mode, id := "100644", ""
		if e.tree != nil {
			mode, id = "40000", writeTree(t, repo, e.tree)
		} else {
			id = hashObject(t, repo, "blob", []byte(e.blob))
		}
		bin, err := hex.DecodeString(id)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&raw, "%s %s\x00", mode, e.name)
		raw.Write(bin)
	}
	return hashObject(t, repo, "tree", raw.Bytes())
}

// hashObject writes an object of type typ with content into the
// repository, without git's checks, and returns its id.
func hashObject(t *testing.T, repo *gitserver.Repo, typ string, content []byte) string {
	t.Helper()
	cmd := exec.Command("git", "hash-object", "--literally", "-w", "-t", typ, "--stdin")
	cmd.Dir = repo.Dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	cmd.Stdin = bytes.NewReader(content)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git hash-object: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// spoofedEvent is a well-formed CloudEvent announcing an artifact for
// the GitRepository name that no service stored.
func spoofedEvent(t *testing.T, name string) []byte {
	t.Helper()
	job := events.Job{ID: "spoofed-" + name, RequestedAt: time.Now().UTC(),
		Object: events.ObjectRef{Kind: kind, Namespace: namespace, Name: name}}
	b, err := events.Encode("e2e", events.TypeArtifactStored, "spoofed-"+name, "gitrepository/default/"+name,
		&events.Outcome{Job: job, Revision: "evil@sha1:" + strings.Repeat("e", 40)})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// publishAs connects to the bus as identity (anonymously when empty),
// publishes data on subject and returns the error NATS answers with:
// the connection refused, or the publish reported as a permissions
// violation.
func publishAs(t *testing.T, identity, subject string, data []byte) error {
	t.Helper()
	refused := make(chan error, 1)
	opts := []nats.Option{nats.Name("headwater-e2e-" + identity), nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case refused <- err:
			default:
			}
		})}
	if identity != "" {
		auth, err := env.NATSOption(identity)
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, auth)
	}
	nc, err := nats.Connect(env.NATSURL, opts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := nc.Publish(subject, data); err != nil {
		return err
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	select {
	case err := <-refused:
		return err
	case <-time.After(timeout):
		return nil
	}
}

// consumeAs connects to the Env's NATS as identity and creates (or
// updates) the durable consumer of the fetch stream with filter, and
// returns what refused it: the permissions violation NATS reports, or
// the create's error; nil when it was created.
func consumeAs(t *testing.T, identity, durable, filter string) error {
	t.Helper()
	refused := make(chan error, 1)
	auth, err := env.NATSOption(identity)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(env.NATSURL, auth, nats.Name("headwater-e2e-"+identity), nats.NoReconnect(),
		nats.CustomInboxPrefix(events.InboxPrefix(identity)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case refused <- err:
			default:
			}
		}))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, cerr := js.CreateOrUpdateConsumer(ctx, events.FetchStream, jetstream.ConsumerConfig{
		Durable: durable, FilterSubject: filter, AckPolicy: jetstream.AckExplicitPolicy})
	select {
	case err := <-refused:
		return err
	default:
	}
	if cerr == nil {
		return nil
	}
	// The violation may be reported after the request timed out.
	select {
	case err := <-refused:
		return err
	case <-time.After(time.Second):
		return cerr
	}
}

// dropMalformedJobs publishes, with the watcher's identity (the only one
// that may publish fetch jobs), messages that are no fetch jobs on the
// fetch stream: the fetcher terminates each one (counted as rejected, not
// redelivered) and stays up.
func dropMalformedJobs(t *testing.T, name string) {
	fetcher := env.Service(harness.Fetcher)
	pid := fetcher.Pid()
	auth, err := env.NATSOption(events.WatcherIdentity)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(env.NATSURL, auth, nats.CustomInboxPrefix(events.InboxPrefix(events.WatcherIdentity)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	valid := func(eventType string, data any) []byte {
		b, err := events.Encode("e2e", eventType, name+"-"+eventType, "gitrepository/default/"+name, data)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	bodies := [][]byte{
		[]byte("not json at all"),
		[]byte(`{"specversion":"1.0"}`),
		[]byte(`{"specversion":"1.0","id":"x","source":"e2e","type":"io.example.unknown.v1","datacontenttype":"application/json","data":{}}`),
		// A known type whose job names no object.
		valid(events.TypeFetchRequested, events.FetchRequested{Job: events.Job{ID: name}}),
	}
	rejected := func() float64 {
		n, err := metricSum(fetcher.TelemetryAddr, "headwater_jobs_total", `result="rejected"`)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := rejected()
	subject := events.FetchSubject(kind)
	for _, b := range bodies {
		ctx, cancel := context.WithTimeout(t.Context(), timeout)
		_, err := js.Publish(ctx, subject, b)
		cancel()
		if err != nil {
			t.Fatalf("publish on %s: %v", subject, err)
		}
	}
	eventually(t, "the fetcher rejects every malformed job", func() error {
		if n := rejected() - before; n < float64(len(bodies)) {
			return fmt.Errorf("%v of %d rejected", n, len(bodies))
		}
		return nil
	})
	if !fetcher.Running() || fetcher.Pid() != pid {
		t.Fatalf("fetcher crashed on a malformed job (running %v, exit %v)", fetcher.Running(), fetcher.ExitErr())
	}
	if !strings.Contains(logs(t, fetcher), "rejecting message") {
		t.Errorf("the fetcher logged no rejection")
	}
}

// silentListener accepts TCP connections on 127.0.0.1 and never answers,
// until the test ends; it returns its address.
func silentListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				for _, c := range conns {
					_ = c.Close()
				}
				return
			}
			conns = append(conns, c) // held open, never read or written
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
	})
	return l.Addr().String()
}

// observedGeneration is the status.observedGeneration of a source.
func observedGeneration(obj fluxSource) int64 {
	switch o := obj.(type) {
	case *sourcev1.GitRepository:
		return o.Status.ObservedGeneration
	case *sourcev1.OCIRepository:
		return o.Status.ObservedGeneration
	case *sourcev1.Bucket:
		return o.Status.ObservedGeneration
	case *sourcev1.HelmRepository:
		return o.Status.ObservedGeneration
	case *sourcev1.HelmChart:
		return o.Status.ObservedGeneration
	}
	panic(fmt.Sprintf("observedGeneration: %T", obj))
}
