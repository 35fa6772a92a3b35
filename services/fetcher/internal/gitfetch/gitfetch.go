// Package gitfetch fetches GitRepository sources over HTTP(S) and SSH with
// go-git, with the credentials and proxy of the Secrets the spec names:
// it resolves spec.ref to a commit with Flux's precedence by listing the
// remote's references (no clone), and downloads a commit's tree with the
// smallest fetch that holds it (depth 1 for a branch, tag or name; the
// branch's history for a commit). Revisions, reasons and messages are
// Flux's.
package gitfetch

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/storage"
	"github.com/go-git/go-git/v5/storage/filesystem"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/hostlimit"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/ignore"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/providertoken"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/secrets"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/workloadidentity"
)

// Kind is the source kind this package fetches.
const Kind = sourcev1.GitRepositoryKind

// targetRef is where a download keeps the fetched reference.
const targetRef = "refs/headwater/target"

// checkoutPrefix starts the message of every clone and checkout failure,
// as in Flux.
const checkoutPrefix = "failed to checkout and determine revision: "

const (
	// largeObjectThreshold is the size above which a download streams an
	// object from its packfile instead of reading it whole into memory, so
	// checking out large files takes little memory.
	largeObjectThreshold = 256 << 10
	// objectCacheSize bounds the decoded objects a download keeps in
	// memory (go-git's default is 96 MiB per repository).
	objectCacheSize = 16 * cache.MiByte
)

// Source fetches GitRepository sources.
type Source struct {
	// Secrets reads the Secrets named by spec.secretRef; nil means none
	// can be read.
	Secrets secrets.Reader
	// RefCache shares reference listings between fetches; nil shares
	// none.
	RefCache *RefCache
	// Tokens keeps the access tokens of providers github and azure until
	// shortly before they expire; nil mints one for every fetch.
	Tokens *providertoken.Cache
	// TokenRootCAs, when set, are the certificate authorities trusted by
	// the token endpoints' TLS instead of the system's (a GitHub App
	// Secret's ca.crt is trusted as well). Tests set it.
	TokenRootCAs *x509.CertPool
	// Limiter, when set, limits the token endpoints' requests (a GitHub
	// App's installation token, Entra ID's) as it limits the clones' (see
	// LimitHTTP): the same hosts, the same holds.
	Limiter *hostlimit.Limiter
	// Getenv looks up the workload identity's environment (providers
	// azure and aws); nil reads the process's.
	Getenv func(string) (string, bool)
	// Accounts give provider azure the identity of a source's
	// ServiceAccount (spec.serviceAccountName, or the default one) under
	// the ObjectLevelWorkloadIdentity gate; nil: the gate is off.
	Accounts *workloadidentity.Accounts
	// Aliases map a Git host (host:port) to the AWS CodeCommit host it
	// stands for, for provider aws's URL check, region and signature.
	// Only tests set it (there is no flag): a loopback server cannot be
	// named like CodeCommit.
	Aliases map[string]string
}

var (
	_ source.Source    = (*Source)(nil)
	_ source.Shareable = (*resolved)(nil)
)

// Timeout is spec.timeout, 60s when unset.
func (s *Source) Timeout(req *events.FetchRequested) time.Duration {
	if spec := req.GitRepository; spec != nil {
		return source.TimeoutOf(spec.Timeout)
	}
	return source.DefaultTimeout
}

// Resolve validates the spec, reads its Secret and resolves spec.ref to a
// commit. A commit given in the spec is resolved without asking the remote.
func (s *Source) Resolve(ctx context.Context, req *events.FetchRequested) (source.Resolved, error) {
	spec := req.GitRepository
	if spec == nil {
		return nil, source.MissingSpec(req, "GitRepository spec")
	}
	u, err := url.Parse(spec.URL)
	if err != nil {
		return nil, source.StalledError(sourcev1.URLInvalidReason, "failed to parse url '%s': %w", spec.URL, err)
	}
	switch u.Scheme {
	case "http", "https", "ssh":
	default:
		return nil, source.StalledError(sourcev1.URLInvalidReason,
			"failed to parse url '%s': unsupported scheme '%s': http, https and ssh are supported", spec.URL, u.Scheme)
	}
	if u.Host == "" {
		return nil, source.StalledError(sourcev1.URLInvalidReason, "failed to parse url '%s': no host", spec.URL)
	}
	switch p := spec.Provider; p {
	case "", sourcev1.GitProviderGeneric, sourcev1.GitProviderGitHub, sourcev1.GitProviderAzure, sourcev1.GitProviderAWS:
	default:
		return nil, source.StalledError(source.UnsupportedProviderReason,
			"git provider '%s' is not supported: use 'generic', 'github', 'azure' or 'aws'", p)
	}
	r, err := newRef(spec.Reference)
	if err != nil {
		return nil, err
	}
	creds, err := s.authenticate(ctx, req, u)
	if err != nil {
		return nil, err
	}
	res := &resolved{url: spec.URL, http: u.Scheme != "ssh", ref: r, creds: creds, ignore: spec.Ignore, hadArtifact: req.Previous != nil,
		submodules: spec.RecurseSubmodules, sparse: sparseDirs(spec.SparseCheckout), refCache: s.RefCache}
	if req.Job.ReconcileToken != "" || req.Fresh {
		// A reconcile requested (say, after a push), or a webhook's job,
		// must see the remote as it is now, not a listing from before
		// the request.
		res.freshAfter = req.Job.RequestedAt
	}
	res.verify = s.verification(req)
	if err := res.resolve(ctx); err != nil {
		return nil, err
	}
	return res, nil
}

// resolved is a spec.ref resolved to a commit.
type resolved struct {
	url string
	// http is true for an http or https URL (stateless upload-pack).
	http        bool
	ref         *ref
	creds       *credentials
	ignore      *string
	hadArtifact bool
	// submodules is spec.recurseSubmodules; sparse the directories of
	// spec.sparseCheckout as go-git takes them (nil for all).
	submodules bool
	sparse     []string

	// verify is spec.verify, nil when it asks for nothing.
	verify *verification

	// refCache shares listings.
	refCache *RefCache
	// listed is true once the remote answered a listing with this
	// source's credentials; adv is that listing, refs its references by
	// name.
	listed bool
	adv    *advertised
	refs   *listed
	// freshAfter, when set, is the time a shared listing must have started
	// at or after: when the user asked for the reconcile.
	freshAfter time.Time

	// reference is the full name of the reference to fetch ("" for all
	// branches), commit the commit it resolved to.
	reference string
	commit    string

	// storage holds the downloaded objects' open packfiles until Close.
	storage io.Closer
}

// Close releases what Download keeps open for reading the content; the
// fetcher calls it when the job ends.
func (r *resolved) Close() error {
	if r.storage == nil {
		return nil
	}
	return r.storage.Close()
}

// Revision is the resolved revision in Flux's format.
func (r *resolved) Revision() string {
	return Revision(r.revisionRef(), r.commit, r.ref.absolute())
}

// revisionRef is the reference revisions are formatted with.
func (r *resolved) revisionRef() string {
	if r.ref.name != "" {
		return r.ref.name
	}
	return r.reference
}

// resolve finds the commit, listing the remote unless the spec names it.
func (r *resolved) resolve(ctx context.Context) error {
	switch r.ref.kind {
	case refCommit:
		r.commit = r.ref.commit
		switch {
		case r.ref.name != "":
			r.reference = r.ref.name
		case r.ref.branch != "":
			r.reference = plumbing.NewBranchReferenceName(r.ref.branch).String()
		}
		return nil
	case refName:
		r.reference = r.ref.name
	case refTag:
		r.reference = plumbing.NewTagReferenceName(r.ref.tag).String()
	case refBranch:
		r.reference = plumbing.NewBranchReferenceName(r.ref.branch).String()
	}
	l, err := r.list(ctx)
	if err != nil {
		return err
	}
	if r.ref.kind == refSemVer {
		tag, ok := l.highestTag(r.ref.semver)
		if !ok {
			return source.Failed(sourcev1.GitOperationFailedReason, checkoutPrefix+"no match found for semver: %s", r.ref.expr)
		}
		r.reference = plumbing.NewTagReferenceName(tag).String()
	}
	commit, ok := l.commit(r.reference)
	if !ok {
		if r.ref.kind == refName {
			return source.Failed(sourcev1.GitOperationFailedReason,
				checkoutPrefix+"unable to resolve ref '%s' to a specific commit", r.reference)
		}
		return source.Failed(sourcev1.GitOperationFailedReason, checkoutPrefix+"unable to clone '%s': %w", r.url, notFound(r.reference))
	}
	r.commit = commit
	return nil
}

// list asks the remote for its references, or takes a listing the ref
// cache shares.
func (r *resolved) list(ctx context.Context) (*listed, error) {
	adv, err := r.refCache.list(ctx, r.url+"\x00"+r.creds.fingerprint, r.freshAfter, r.advertise)
	if err != nil {
		// Flux words it as a clone, or as a list when it had an artifact
		// to compare with.
		format := checkoutPrefix + "unable to clone '%s': %w"
		if r.hadArtifact {
			format = checkoutPrefix + "unable to list remote for '%s': %w"
		}
		return nil, gitError(err, format, r.url)
	}
	r.listed, r.adv, r.refs = true, adv, newListed(adv.refs)
	return r.refs, nil
}

// ContentIdentity is what, besides the revision, determines the
// downloaded content: the URL without credentials and the
// content-affecting spec. Verified sources share nothing (their
// signatures are checked on what they download themselves); sources with
// submodules share only with sources authenticating with the same Secret,
// since a submodule may need access the parent's listing does not prove.
func (r *resolved) ContentIdentity() ([]string, bool) {
	if r.verify != nil {
		return nil, false
	}
	u, err := url.Parse(r.url)
	if err != nil {
		return nil, false
	}
	u.User = nil
	ignore := "-"
	if r.ignore != nil {
		ignore = "+" + *r.ignore
	}
	sparse := "-"
	if r.sparse != nil {
		sparse = "+" + strings.Join(slices.Sorted(slices.Values(r.sparse)), "\x00")
	}
	submodules := "-"
	if r.submodules {
		// Submodules may be on other servers: the content is shared only
		// with sources holding the same credentials (by content, so a
		// rotated key is a new identity).
		submodules = "+" + r.creds.fingerprint
	}
	return []string{u.String(), ignore, sparse, submodules}, true
}

// ProveAccess lists the remote with this source's credentials unless
// resolving did already (a spec naming a commit does not ask the remote).
func (r *resolved) ProveAccess(ctx context.Context) error {
	if r.listed {
		return nil
	}
	_, err := r.list(ctx)
	return err
}

// Download fetches the commit into dir (a repository's objects only, or a
// whole one in dir/git with submodules). A plain tree (plainTree) is the
// content as it is in the packfile; any other is checked out in dir/tree,
// its submodules updated and its symbolic links resolved.
func (r *resolved) Download(ctx context.Context, dir string) (*source.Content, error) {
	gitDir, tree := filepath.Join(dir, "git"), filepath.Join(dir, "tree")
	var storer storage.Storer
	if r.submodules {
		// A submodule's objects go where its repository's do: on disk.
		storer = filesystem.NewStorageWithOptions(osfs.New(gitDir), cache.NewObjectLRU(objectCacheSize),
			filesystem.Options{LargeObjectThreshold: largeObjectThreshold})
	} else {
		// The packfile goes to dir/objects/pack, beside any work tree.
		st, err := newPackStorage(dir)
		if err != nil {
			return nil, source.Failed(sourcev1.DirCreationFailedReason, "failed to create temporary working directory: %w", err)
		}
		// The content is read from the packfile until the job ends.
		r.storage = st
		storer = st
	}
	// A bound work tree resolves symbolic links inside it, so no checkout
	// (of the repository or its submodules) writes outside it.
	repo, err := git.Init(storer, osfs.New(tree, osfs.WithBoundOS()))
	if err != nil {
		return nil, source.Failed(sourcev1.GitOperationFailedReason, checkoutPrefix+"unable to init repository: %w", err)
	}
	if _, err := repo.CreateRemote(&config.RemoteConfig{Name: git.DefaultRemoteName, URLs: []string{r.url}}); err != nil {
		return nil, source.Failed(sourcev1.GitOperationFailedReason, checkoutPrefix+"unable to configure remote: %w", err)
	}
	opts := &git.FetchOptions{
		RemoteName:   git.DefaultRemoteName,
		Auth:         r.creds.method,
		CABundle:     r.creds.ca,
		ClientCert:   r.creds.cert,
		ClientKey:    r.creds.key,
		ProxyOptions: r.creds.proxyFor(ctx),
		Tags:         git.NoTags,
	}
	src := r.reference
	if base, ok := strings.CutSuffix(src, tagDereferenceSuffix); ok {
		src = base
	}
	if r.ref.kind == refCommit {
		// The commit may be anywhere in the history: fetch all of it.
		if src == "" {
			opts.RefSpecs = []config.RefSpec{"+refs/heads/*:refs/remotes/origin/*"}
		} else {
			opts.RefSpecs = []config.RefSpec{config.RefSpec("+" + src + ":" + targetRef)}
		}
	} else {
		opts.RefSpecs = []config.RefSpec{config.RefSpec("+" + src + ":" + targetRef)}
		opts.Depth = 1
	}
	if err := r.fetch(ctx, repo, storer, opts); err != nil {
		return nil, gitError(err, checkoutPrefix+"unable to clone '%s': %w", r.url)
	}

	commit, err := r.fetchedCommit(repo)
	if err != nil {
		return nil, err
	}
	verified, err := r.verifySignatures(ctx, repo, commit)
	if err != nil {
		return nil, err
	}
	hash := commit.Hash.String()
	content := &source.Content{
		Revision:     Revision(r.revisionRef(), hash, r.ref.absolute()),
		ArtifactName: hash + ".tar.gz",
		EventMessage: fmt.Sprintf("stored artifact for commit '%s'", ShortMessage(commit.Message)),
		Verification: verified,
	}
	// A tree entry that could climb out of the work tree or write into its
	// .git fails clearly, before any checkout; the same commit fails
	// again, a new one may not.
	if err := checkTreeNames(repo.Storer, commit); err != nil {
		return nil, source.FailedWith(failure.Final, sourcev1.GitOperationFailedReason,
			checkoutPrefix+"unable to checkout commit '%s': %w", commit.Hash, err)
	}
	// Most trees need nothing a checkout does: they are archived straight
	// from the packfile, without writing or walking a work tree.
	if !r.submodules && len(r.sparse) == 0 {
		fsys, plain, err := plainTree(repo.Storer, commit)
		if err != nil {
			return nil, source.Failed(sourcev1.GitOperationFailedReason, checkoutPrefix+"unable to read commit '%s': %w", commit.Hash, err)
		}
		if plain {
			filter, err := ignore.LoadFS(fsys, r.ignore)
			if err != nil {
				return nil, source.Failed("SourceIgnoreError", "%w", err)
			}
			content.FS, content.Exclude = fsys, excludeGitDir(filter.Exclude)
			return content, nil
		}
	}
	if err := os.MkdirAll(tree, 0o755); err != nil {
		return nil, source.Failed(sourcev1.DirCreationFailedReason, "failed to create temporary working directory: %w", err)
	}
	wt, err := repo.Worktree()
	if err != nil {
		return nil, source.Failed(sourcev1.GitOperationFailedReason, checkoutPrefix+"unable to open repo worktree: %w", err)
	}
	if err := wt.Checkout(&git.CheckoutOptions{Hash: commit.Hash, Force: true, SparseCheckoutDirectories: r.sparse}); err != nil {
		return nil, source.Failed(sourcev1.GitOperationFailedReason, checkoutPrefix+"unable to checkout commit '%s': %w", commit.Hash, err)
	}
	if r.submodules {
		owner, err := transport.NewEndpoint(r.url)
		if err != nil {
			return nil, source.StalledError(sourcev1.URLInvalidReason, "failed to parse url '%s': %w", r.url, err)
		}
		if err := updateSubmodules(ctx, repo, opts, owner, submoduleDepth); err != nil {
			return nil, err
		}
	}
	// go-git links a work tree to a separate object store with a .git file.
	if err := os.Remove(filepath.Join(tree, git.GitDirName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, source.Failed(sourcev1.GitOperationFailedReason, checkoutPrefix+"unable to unlink work tree: %w", err)
	}
	if err := resolveSymlinks(ctx, tree); err != nil {
		// Links that copy too much do so again: no retry helps.
		h := failure.Transient
		if errors.Is(err, ErrLinksTooLarge) {
			h = failure.Final
		}
		return nil, &failure.Error{Handling: h, Condition: sourcev1.StorageOperationFailedCondition, Reason: sourcev1.ArchiveOperationFailedReason,
			Err: fmt.Errorf("failed to resolve symlinks in repository: %w", err)}
	}
	filter, err := ignore.Load(tree, r.ignore)
	if err != nil {
		return nil, source.Failed("SourceIgnoreError", "%w", err)
	}
	content.Root, content.Exclude = tree, excludeGitDir(filter.Exclude)
	return content, nil
}

// fetch downloads what opts ask for into the repository. A reference
// resolved from a listing over HTTP is fetched in one request (see
// fetchListed); should that fail, go-git's fetch tries again from the
// start, advertisement included (the remote may have moved the reference
// away from the listed commit).
func (r *resolved) fetch(ctx context.Context, repo *git.Repository, st storage.Storer, opts *git.FetchOptions) error {
	if r.ref.kind != refCommit && !r.submodules && r.adv != nil && r.http {
		err := r.fetchListed(ctx, st)
		if err == nil || ctx.Err() != nil {
			return err
		}
	}
	if err := repo.FetchContext(ctx, opts); err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
		return err
	}
	return nil
}

// fetchedCommit returns the commit to check out: the spec's commit, or the
// (peeled) tip of the fetched reference, which may be newer than the
// listed one if the remote moved in between.
func (r *resolved) fetchedCommit(repo *git.Repository) (*object.Commit, error) {
	if r.ref.kind == refCommit {
		c, err := repo.CommitObject(plumbing.NewHash(r.commit))
		if err != nil {
			return nil, source.Failed(sourcev1.GitOperationFailedReason,
				checkoutPrefix+"unable to resolve commit object for '%s': %w", r.commit, err)
		}
		return c, nil
	}
	tip, err := repo.Reference(targetRef, true)
	if err != nil {
		return nil, source.Failed(sourcev1.GitOperationFailedReason,
			checkoutPrefix+"unable to clone '%s': %w", r.url, notFound(r.reference))
	}
	hash := tip.Hash()
	if tag, err := repo.TagObject(hash); err == nil {
		c, err := tag.Commit()
		if err != nil {
			return nil, source.Failed(sourcev1.GitOperationFailedReason,
				checkoutPrefix+"unable to resolve commit object for tag '%s': %w", r.reference, err)
		}
		return c, nil
	}
	c, err := repo.CommitObject(hash)
	if err != nil {
		return nil, source.Failed(sourcev1.GitOperationFailedReason,
			checkoutPrefix+"unable to resolve commit object for HEAD '%s': %w", hash, err)
	}
	return c, nil
}

// gitError classifies a go-git error: 401 and 403 are authentication
// failures, an empty repository is Flux's EmptyGitRepository, the rest are
// transient Git operation failures.
func gitError(err error, format string, u string) error {
	switch {
	case errors.Is(err, transport.ErrEmptyRemoteRepository):
		return source.Failed(source.EmptyGitRepositoryReason, "git repository is empty")
	case isAuthFailure(err):
		return source.Failed(sourcev1.AuthenticationFailedReason, format, u, err)
	default:
		return source.Failed(sourcev1.GitOperationFailedReason, format, u, err)
	}
}

// excludeGitDir leaves every .git entry out, whatever the rules: the links
// go-git writes into the work tree and its submodules are not content (and
// git never tracks a .git path).
func excludeGitDir(exclude func(string, bool) bool) func(string, bool) bool {
	return func(rel string, isDir bool) bool {
		return path.Base(rel) == git.GitDirName || exclude(rel, isDir)
	}
}
