package gitfetch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/go-git/go-billy/v5/util"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/format/index"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/transport"

	"github.com/headwater-gitops/headwater/pkg/failure"
	"github.com/headwater-gitops/headwater/services/fetcher/internal/source"
)

// submoduleDepth is how deep submodules of submodules are followed, as with
// Flux (go-git's default recursion depth).
const submoduleDepth = int(git.DefaultSubmoduleRecursionDepth)

// gitmodulesFile declares a tree's submodules.
const gitmodulesFile = ".gitmodules"

// submoduleProtocols are the transports a submodule may be fetched with.
// Local paths and file:// URLs are refused: a repository must not make the
// fetcher read repositories on its own disk.
var submoduleProtocols = map[string]bool{"http": true, "https": true, "ssh": true}

// updateSubmodules checks out, at the commits the parent records, the
// submodules of repo's checked-out tree, and theirs in turn down to depth
// levels (spec.recurseSubmodules). Relative submodule URLs ("../lib.git")
// resolve against the parent's remote.
//
// Each submodule is fetched with base, the source's fetch options (CA bundle,
// proxy), but with base's credentials and client certificate only when it is
// served by the same protocol, host and port as owner, the source's URL: a
// .gitmodules file cannot send the source's credentials to another server.
// (Flux hands them to every submodule.) Submodules outside a sparse checkout
// are left out.
func updateSubmodules(ctx context.Context, repo *git.Repository, base *git.FetchOptions, owner *transport.Endpoint, depth int) error {
	if depth <= 0 {
		return nil
	}
	wt, err := repo.Worktree()
	if err != nil {
		return source.Failed(sourcev1.GitOperationFailedReason, checkoutPrefix+"unable to open repo worktree: %w", err)
	}
	if err := checkoutGitmodules(repo, wt); err != nil {
		return source.Failed(sourcev1.GitOperationFailedReason, checkoutPrefix+"unable to read submodules: %w", err)
	}
	subs, err := wt.Submodules()
	if err != nil {
		return &failure.Error{Condition: sourcev1.FetchFailedCondition, Reason: sourcev1.GitOperationFailedReason, Handling: failure.Final,
			Err: fmt.Errorf(checkoutPrefix+"unable to read submodules: %w", err)}
	}
	if len(subs) == 0 {
		return nil
	}
	idx, err := repo.Storer.Index()
	if err != nil {
		return source.Failed(sourcev1.GitOperationFailedReason, checkoutPrefix+"unable to read index: %w", err)
	}
	for _, sub := range subs {
		e, err := idx.Entry(sub.Config().Path)
		switch {
		case errors.Is(err, index.ErrEntryNotFound):
			// Declared in .gitmodules but not in the tree: git skips it too.
			continue
		case err != nil:
			return source.Failed(sourcev1.GitOperationFailedReason, checkoutPrefix+"unable to read index: %w", err)
		case e.Mode != filemode.Submodule || e.SkipWorktree:
			continue
		}
		if err := updateSubmodule(ctx, sub, e.Hash, base, owner, depth); err != nil {
			return err
		}
	}
	return nil
}

// checkoutGitmodules writes the .gitmodules file of HEAD's tree into the
// work tree when a sparse checkout left it out: go-git reads the submodules
// from the work tree, and the submodules inside the sparse directories are
// wanted. (The archive leaves .gitmodules out whatever the ignore rules.)
func checkoutGitmodules(repo *git.Repository, wt *git.Worktree) error {
	if _, err := wt.Filesystem.Lstat(gitmodulesFile); err == nil || !errors.Is(err, os.ErrNotExist) {
		return err
	}
	head, err := repo.Head()
	if err != nil {
		return err
	}
	commit, err := repo.CommitObject(head.Hash())
	if err != nil {
		return err
	}
	f, err := commit.File(gitmodulesFile)
	switch {
	case errors.Is(err, object.ErrFileNotFound):
		return nil
	case err != nil:
		return err
	case f.Mode != filemode.Regular:
		return nil // go-git refuses a linked .gitmodules anyway
	}
	content, err := f.Contents()
	if err != nil {
		return err
	}
	return util.WriteFile(wt.Filesystem, gitmodulesFile, []byte(content), 0o644)
}

// updateSubmodule fetches one submodule, checks out hash and recurses.
func updateSubmodule(ctx context.Context, sub *git.Submodule, hash plumbing.Hash, base *git.FetchOptions,
	owner *transport.Endpoint, depth int) error {
	path := sub.Config().Path
	fail := func(handling failure.Handling, format string, args ...any) error {
		return &failure.Error{Condition: sourcev1.FetchFailedCondition, Reason: sourcev1.GitOperationFailedReason, Handling: handling,
			Err: fmt.Errorf(checkoutPrefix+"unable to update submodule '%s': "+format, append([]any{path}, args...)...)}
	}
	if err := sub.Init(); err != nil && !errors.Is(err, git.ErrSubmoduleAlreadyInitialized) {
		return fail(failure.Final, "%w", err)
	}
	repo, err := sub.Repository()
	if err != nil {
		return fail(failure.Final, "%w", err)
	}
	remote, err := repo.Remote(git.DefaultRemoteName)
	if err != nil || len(remote.Config().URLs) == 0 {
		return fail(failure.Final, "no URL")
	}
	u := remote.Config().URLs[0]
	ep, err := transport.NewEndpoint(u)
	if err != nil {
		return fail(failure.Final, "invalid URL '%s': %w", u, err)
	}
	if !submoduleProtocols[ep.Protocol] {
		return fail(failure.Final, "URL '%s' is not allowed: submodules are fetched over http, https or ssh only", u)
	}

	// The source's transport settings, for the submodule's remote.
	opts := *base
	opts.RemoteName = git.DefaultRemoteName
	opts.RemoteURL = ""
	opts.RefSpecs = nil // every branch, the remote's default
	opts.Depth = 0
	opts.Tags = git.NoTags
	if !sameServer(ep, owner) {
		opts.Auth = nil
		opts.ClientCert, opts.ClientKey = nil, nil
	}
	if err := repo.FetchContext(ctx, &opts); err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
		return gitError(err, checkoutPrefix+"unable to clone submodule '"+escapePercent(path)+"' from '%s': %w", u)
	}
	if _, err := repo.CommitObject(hash); err != nil {
		// Not on any branch: ask for the commit itself, which servers
		// allowing reachable commits in wants answer.
		opts.RefSpecs = []config.RefSpec{config.RefSpec("+" + hash.String() + ":" + hash.String())}
		err := repo.FetchContext(ctx, &opts)
		if err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) && !errors.Is(err, git.ErrExactSHA1NotSupported) {
			return gitError(err, checkoutPrefix+"unable to clone submodule '"+escapePercent(path)+"' from '%s': %w", u)
		}
		if _, err := repo.CommitObject(hash); err != nil {
			return fail(failure.Transient, "commit '%s' not found in '%s'", hash, u)
		}
	}
	wt, err := repo.Worktree()
	if err != nil {
		return fail(failure.Transient, "%w", err)
	}
	if err := wt.Checkout(&git.CheckoutOptions{Hash: hash, Force: true}); err != nil {
		return fail(failure.Final, "unable to checkout commit '%s': %w", hash, err)
	}
	return updateSubmodules(ctx, repo, base, owner, depth-1)
}

// sameServer reports whether a and b are served by the same protocol, host
// and port.
func sameServer(a, b *transport.Endpoint) bool {
	if a == nil || b == nil {
		return false
	}
	return a.Protocol == b.Protocol && strings.EqualFold(a.Host, b.Host) && port(a) == port(b)
}

// port is an endpoint's port, with the protocol's default for none.
func port(e *transport.Endpoint) int {
	if e.Port != 0 {
		return e.Port
	}
	switch e.Protocol {
	case "http":
		return 80
	case "https":
		return 443
	case "ssh":
		return 22
	}
	return 0
}

func escapePercent(s string) string { return strings.ReplaceAll(s, "%", "%%") }
