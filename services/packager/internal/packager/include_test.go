package packager

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/headwater-gitops/headwater/pkg/archive"
	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

const appDir = "gitrepository/default/app"

// files is a source tree: slash path -> content; content starting with
// "#!" makes an executable.
type files map[string]string

// writeFiles writes fs under a new directory and returns it.
func writeFiles(t *testing.T, fs files) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range fs {
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(content, "#!") {
			mode = 0o755
		}
		if err := os.WriteFile(full, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// replace returns base with everything at or below dir removed and add
// added.
func replace(base files, dir string, add files) files {
	out := files{}
	for p, c := range base {
		if dir != "" && (p == dir || strings.HasPrefix(p, dir+"/")) {
			continue
		}
		out[p] = c
	}
	for p, c := range add {
		out[p] = c
	}
	return out
}

// prefixed returns fs below dir (those under from only, renamed).
func prefixed(fs files, from, to string) files {
	out := files{}
	for p, c := range fs {
		rel := p
		if from != "" {
			if !strings.HasPrefix(p, from+"/") {
				continue
			}
			rel = strings.TrimPrefix(p, from+"/")
		}
		out[to+"/"+rel] = c
	}
	return out
}

// canonicalDigest is the digest of the artifact of tree fs: what packaging
// the tree with the included files copied in would give.
func canonicalDigest(t *testing.T, fs files) string {
	t.Helper()
	res, err := archive.Canonicalize(io.Discard, bytes.NewReader(stagingTar(t, writeFiles(t, fs))), archive.CanonicalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return res.Digest.String()
}

var (
	appTree = files{
		"README.md":       "# app\n",
		"deploy/app.yaml": "kind: Deployment\n",
		"deploy/old.yaml": "kind: ConfigMap # replaced\n",
		"lib.txt":         "a file beside where lib goes\n",
	}
	libTree = files{
		"kustomization.yaml":  "resources: [base]\n",
		"base/svc.yaml":       "kind: Service\n",
		"base/nested/cm.yaml": "kind: ConfigMap\n",
		"run.sh":              "#!/bin/sh\necho lib\n",
	}
)

// packagedWith packages tree as source app's artifact name, with incs.
func (h *harness) packagedWith(id, name string, tree files, incs []events.Include) *events.Outcome {
	h.t.Helper()
	f := fetched(id, "app", name)
	f.Includes = incs
	return h.packaged(f, stagingTar(h.t, writeFiles(h.t, tree)))
}

// lib packages libTree as the artifact name of source lib and returns it.
func (h *harness) lib(id, name string, tree files) meta.Artifact {
	h.t.Helper()
	a := h.packaged(fetched(id, "lib", name), stagingTar(h.t, writeFiles(h.t, tree))).Artifact
	return *a
}

func TestIncludes(t *testing.T) {
	h := newHarness(t, harnessOptions{opts: defaultOptions()})
	lib := h.lib("job-lib", "lib1.tar.gz", libTree)
	incl := func(from, to string) events.Include {
		return events.Include{Name: "lib", Artifact: lib, FromPath: from, ToPath: to}
	}

	tests := []struct {
		name string
		incs []events.Include
		want files
	}{{
		name: "the whole artifact at toPath",
		incs: []events.Include{incl("", "lib")},
		want: replace(appTree, "lib", prefixed(libTree, "", "lib")),
	}, {
		name: "a fromPath subdirectory at a nested toPath",
		incs: []events.Include{incl("base", "vendor/lib/base")},
		want: replace(appTree, "vendor/lib/base", prefixed(libTree, "base", "vendor/lib/base")),
	}, {
		name: "a deeper fromPath",
		incs: []events.Include{incl("base/nested", "x/y/z")},
		want: replace(appTree, "x/y/z", prefixed(libTree, "base/nested", "x/y/z")),
	}, {
		name: "replacing a directory of the including source",
		incs: []events.Include{incl("base", "deploy")},
		want: replace(appTree, "deploy", prefixed(libTree, "base", "deploy")),
	}, {
		name: "replacing a file of the including source",
		incs: []events.Include{incl("base", "lib.txt")},
		want: replace(appTree, "lib.txt", prefixed(libTree, "base", "lib.txt")),
	}, {
		name: "two includes",
		incs: []events.Include{incl("", "lib"), incl("base", "deploy")},
		want: replace(replace(appTree, "lib", prefixed(libTree, "", "lib")), "deploy", prefixed(libTree, "base", "deploy")),
	}}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := []string{"a", "b", "c", "d", "e", "f"}[i] + ".tar.gz"
			out := h.packagedWith("job-"+name, name, appTree, tc.incs)
			if want := canonicalDigest(t, tc.want); out.Artifact.Digest != want {
				t.Errorf("artifact digest %s, want %s, that of the tree with the include copied in", out.Artifact.Digest, want)
			}
			got := files{}
			for _, e := range h.untar(appDir + "/" + name) {
				if !strings.HasSuffix(e.hdr.Name, "/") {
					got[e.hdr.Name] = e.content
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("artifact files %v\nwant %v", got, tc.want)
			}
			want := make([]*meta.Artifact, len(tc.incs))
			for i := range tc.incs {
				want[i] = &tc.incs[i].Artifact
			}
			if !reflect.DeepEqual(out.IncludedArtifacts, want) {
				t.Errorf("included artifacts %+v, want %+v", out.IncludedArtifacts, want)
			}
		})
	}
}

func TestIncludesAreDeterministic(t *testing.T) {
	h := newHarness(t, harnessOptions{opts: defaultOptions()})
	lib := h.lib("job-lib", "lib1.tar.gz", libTree)
	incs := []events.Include{
		{Name: "lib", Artifact: lib, FromPath: "base", ToPath: "deploy"},
		{Name: "lib", Artifact: lib, ToPath: "vendor/lib"},
	}
	first := h.packagedWith("job-1", "one.tar.gz", appTree, incs)
	second := h.packagedWith("job-2", "two.tar.gz", appTree, incs)
	if first.Artifact.Digest != second.Artifact.Digest ||
		h.sha256File(appDir+"/one.tar.gz") != h.sha256File(appDir+"/two.tar.gz") {
		t.Errorf("same content and includes, different artifacts: %s and %s", first.Artifact.Digest, second.Artifact.Digest)
	}
	// A new artifact of the included source gives a new artifact.
	changed := replace(libTree, "base/svc.yaml", files{"base/svc.yaml": "kind: Service # v2\n"})
	lib2 := h.lib("job-lib2", "lib2.tar.gz", changed)
	incs[0].Artifact, incs[1].Artifact = lib2, lib2
	third := h.packagedWith("job-3", "three.tar.gz", appTree, incs)
	want := replace(replace(appTree, "deploy", prefixed(changed, "base", "deploy")), "vendor/lib", prefixed(changed, "", "vendor/lib"))
	if third.Artifact.Digest == first.Artifact.Digest || third.Artifact.Digest != canonicalDigest(t, want) {
		t.Errorf("after the include changed: digest %s, want %s (was %s)", third.Artifact.Digest, canonicalDigest(t, want), first.Artifact.Digest)
	}
}

func TestIncludeFailures(t *testing.T) {
	h := newHarness(t, harnessOptions{opts: defaultOptions()})
	lib := h.lib("job-lib", "lib1.tar.gz", libTree)
	other := h.lib("job-lib2", "lib2.tar.gz", files{"other.yaml": "other\n"})
	// lib2.tar.gz claiming lib1's digest: a valid artifact, not the one
	// the include names.
	swapped := other
	swapped.Digest = lib.Digest
	// An artifact that is not a tar.gz, with its true digest.
	ctx := context.Background()
	garbage := []byte(strings.Repeat("not a tar.gz ", 100))
	if _, err := h.store.Put(ctx, "gitrepository/default/lib/garbage.tar.gz", bytes.NewReader(garbage)); err != nil {
		t.Fatal(err)
	}
	garbageArtifact := meta.Artifact{Path: "gitrepository/default/lib/garbage.tar.gz", Digest: sha256Of(garbage)}
	missing := lib
	missing.Path = "gitrepository/default/lib/gone.tar.gz"

	prev := h.packagedWith("job-good", "app.tar.gz", appTree, nil).Artifact

	incl := func(a meta.Artifact, from, to string) []events.Include {
		return []events.Include{{Name: "lib", Artifact: a, FromPath: from, ToPath: to}}
	}
	tests := []struct {
		name      string
		incs      []events.Include
		condition string
		reason    string
		stalled   bool
		message   string
	}{
		{"missing included artifact", incl(missing, "", "lib"), sourcev1.IncludeUnavailableCondition, "NoArtifact", false,
			"no artifact available for include 'lib': artifact 'gitrepository/default/lib/gone.tar.gz' is missing from storage"},
		{"included artifact with another digest", incl(swapped, "", "lib"), sourcev1.IncludeUnavailableCondition, "NoArtifact", false,
			"no artifact available for include 'lib': failed to verify integrity of artifact: computed digest doesn't match '" + lib.Digest + "'"},
		{"included artifact that is not a tar.gz", incl(garbageArtifact, "", "lib"), sourcev1.IncludeUnavailableCondition, "NoArtifact", false,
			"no artifact available for include 'lib': artifact 'gitrepository/default/lib/garbage.tar.gz' cannot be read: gzip:"},
		{"toPath climbing out", incl(lib, "", "../escape"), sourcev1.IncludeUnavailableCondition, "IllegalPath", true,
			"path calculation for include 'lib' failed: paths must be relative and stay inside the artifact"},
		{"toPath climbing out from inside", incl(lib, "", "a/../../escape"), sourcev1.IncludeUnavailableCondition, "IllegalPath", true,
			"path calculation for include 'lib' failed: paths must be relative"},
		{"absolute toPath", incl(lib, "", "/etc"), sourcev1.IncludeUnavailableCondition, "IllegalPath", true,
			"path calculation for include 'lib' failed: paths must be relative"},
		{"empty toPath", incl(lib, "", ""), sourcev1.IncludeUnavailableCondition, "IllegalPath", true,
			`path calculation for include 'lib' failed: toPath "" would replace the whole artifact`},
		{"fromPath climbing out", incl(lib, "../../app", "lib"), sourcev1.IncludeUnavailableCondition, "IllegalPath", true,
			"path calculation for include 'lib' failed: paths must be relative"},
		{"artifact of another source", []events.Include{{Name: "lib", Artifact: meta.Artifact{Path: appDir + "/app.tar.gz", Digest: prev.Digest}, ToPath: "lib"}},
			sourcev1.IncludeUnavailableCondition, "IllegalPath", true,
			`path calculation for include 'lib' failed: artifact path "gitrepository/default/app/app.tar.gz" is not an artifact of GitRepository 'default/lib'`},
		{"fromPath not in the artifact", incl(lib, "nope", "lib"), sourcev1.StorageOperationFailedCondition, "CopyFailure", false,
			"failed to copy 'lib' include from nope to lib: fromPath 'nope' does not exist in the artifact"},
		{"a file where a directory is needed", incl(lib, "base", "lib.txt/base"), sourcev1.StorageOperationFailedCondition, "CopyFailure", false,
			`failed to copy 'lib' include from base to lib.txt/base: path conflict: "lib.txt" is both a file and a directory`},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := "job-bad-" + string(rune('a'+i))
			f := fetched(id, "app", "app.tar.gz")
			f.Includes = tc.incs
			h.stage(f, stagingTar(t, writeFiles(t, appTree)))
			h.send(events.TypeFetched, f.Job, f)
			out := h.nextOutcome(events.TypePackageFailed, id)
			fl := out.Failure
			if fl == nil || fl.Condition != tc.condition || fl.Reason != tc.reason || fl.Stalled != tc.stalled {
				t.Fatalf("failure = %+v, want %s/%s stalled=%v", fl, tc.condition, tc.reason, tc.stalled)
			}
			if !strings.HasPrefix(fl.Message, tc.message) {
				t.Errorf("message = %q, want it to start with %q", fl.Message, tc.message)
			}
			if out.Artifact != nil || out.IncludedArtifacts != nil {
				t.Errorf("failed outcome has artifact %+v, included %+v", out.Artifact, out.IncludedArtifacts)
			}
			// Never a partial artifact: the previous one is untouched and
			// still the latest, nothing else is written.
			if got := h.sha256File(appDir + "/app.tar.gz"); got != prev.Digest {
				t.Errorf("previous artifact changed: digest %s, was %s", got, prev.Digest)
			}
			if err := storage.Verify(ctx, h.store, appDir+"/"+storage.LatestName, prev.Digest); err != nil {
				t.Errorf("latest: %v", err)
			}
			if got, want := dirNames(t, h.file(appDir)), []string{"app.tar.gz", "latest.tar.gz"}; !slices.Equal(got, want) {
				t.Errorf("source dir holds %q, want %q", got, want)
			}
			if _, err := os.Stat(filepath.Join(h.store.Path(), "escape")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("escaping file written: %v", err)
			}
			h.stagingGone(f)
		})
	}
}

func TestIncludeReadErrorsAreRetried(t *testing.T) {
	var flaky *flakyReads
	wrap := func(s storage.Storage) storage.Storage {
		flaky = &flakyReads{Storage: s, prefix: "gitrepository/default/lib/"}
		return flaky
	}
	h := newHarness(t, harnessOptions{opts: defaultOptions(), wrap: wrap})
	lib := h.lib("job-lib", "lib1.tar.gz", libTree)
	flaky.failures.Store(1)

	// The broken read is a transient failure: reported, then retried.
	f := fetched("job-app", "app", "app.tar.gz")
	f.Includes = []events.Include{{Name: "lib", Artifact: lib, ToPath: "lib"}}
	h.stage(f, stagingTar(t, writeFiles(t, appTree)))
	h.send(events.TypeFetched, f.Job, f)
	failed := h.nextOutcome(events.TypePackageFailed, "job-app").Failure
	if failed == nil || failed.Stalled || failed.Reason != sourcev1.ArchiveOperationFailedReason ||
		!strings.Contains(failed.Message, "read artifact of include 'lib': connection reset by peer") {
		t.Errorf("failure = %+v, want the include's read error", failed)
	}
	out := h.nextOutcome(events.TypePackaged, "job-app")
	if want := canonicalDigest(t, replace(appTree, "lib", prefixed(libTree, "", "lib"))); out.Artifact.Digest != want {
		t.Errorf("digest %s, want %s", out.Artifact.Digest, want)
	}
	if n := h.metric("headwater_jobs_total", map[string]string{"type": events.TypeFetched, "result": "retry"}); n != 1 {
		t.Errorf("%v failed attempts, want 1 (the broken read, retried)", n)
	}
}

// flakyReads is a storage whose reads of keys under prefix break halfway
// while failures is positive.
type flakyReads struct {
	storage.Storage
	prefix   string
	failures atomic.Int32
}

func (s *flakyReads) Open(ctx context.Context, key string) (storage.Object, error) {
	obj, err := s.Storage.Open(ctx, key)
	if err != nil || !strings.HasPrefix(key, s.prefix) || s.failures.Add(-1) < 0 {
		return obj, err
	}
	return &brokenObject{Object: obj, left: obj.Info().Size / 2}, nil
}

type brokenObject struct {
	storage.Object
	left int64
}

func (o *brokenObject) Read(p []byte) (int, error) {
	if o.left <= 0 {
		return 0, errors.New("connection reset by peer")
	}
	if int64(len(p)) > o.left {
		p = p[:o.left]
	}
	n, err := o.Object.Read(p)
	o.left -= int64(n)
	return n, err
}

func sha256Of(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}
