package packager

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"

	"github.com/headwater-gitops/headwater/pkg/events"
	"github.com/headwater-gitops/headwater/pkg/storage"
)

// storeSource stores a source artifact (a tar.gz of files) at key.
func (h *harness) storeSource(key string, files map[string]string) meta.Artifact {
	h.t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(files[n]))}); err != nil {
			h.t.Fatal(err)
		}
		if _, err := tw.Write([]byte(files[n])); err != nil {
			h.t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		h.t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.store.Put(context.Background(), key, &buf); err != nil {
		h.t.Fatal(err)
	}
	return meta.Artifact{Path: key, Revision: "main@sha1:" + strings.Repeat("1", 40), Digest: "sha256:x"}
}

func generatorJob(id string) events.Job {
	return events.Job{ID: id, RequestedAt: time.Now().UTC(),
		Object: events.ObjectRef{Kind: events.ArtifactGeneratorKind, Namespace: "apps", Name: "split", UID: "uid-split", Generation: 1}}
}

func perApp(apps ...string) []swv1beta1.OutputArtifact {
	var out []swv1beta1.OutputArtifact
	for _, a := range apps {
		out = append(out, swv1beta1.OutputArtifact{Name: "app-" + a, OriginRevision: "@repo",
			Copy: []swv1beta1.CopyOperation{{From: "@repo/apps/" + a + "/**", To: "@artifact/"}}})
	}
	return out
}

// TestGenerate splits a monorepo artifact into one output per app; a
// second job after a change to one app stores only that app's output
// anew; an app dropped from the spec has its stored files removed.
func TestGenerate(t *testing.T) {
	h := newHarness(t, harnessOptions{opts: defaultOptions()})
	files := map[string]string{"apps/a/deploy.yaml": "a1", "apps/b/deploy.yaml": "b1", "apps/c/deploy.yaml": "c1"}
	src := h.storeSource("gitrepository/apps/mono/1.tar.gz", files)

	j1 := generatorJob("gen-1")
	h.send(events.TypeGenerateRequested, j1, &events.GenerateRequested{Job: j1, Artifacts: perApp("a", "b", "c"),
		Sources: []events.GeneratorSource{{Alias: "repo", Kind: "GitRepository", Namespace: "apps", Name: "mono", Artifact: src}}})
	out1 := h.nextOutcome(events.TypePackaged, "gen-1")
	if len(out1.Outputs) != 3 {
		t.Fatalf("outputs = %+v", out1.Outputs)
	}
	for i, o := range out1.Outputs {
		a := o.Artifact
		hash := strings.TrimPrefix(a.Revision, "latest@sha256:")
		if !o.Changed || len(hash) != 64 || a.Path != fmt.Sprintf("externalartifact/apps/%s/%s.tar.gz", o.Name, hash) ||
			a.Digest != h.sha256File(a.Path) || a.Metadata[swv1beta1.ArtifactOriginRevisionAnnotation] != src.Revision {
			t.Errorf("output %d = %+v", i, o)
		}
		if got := h.untar(a.Path); len(got) != 1 || got[0].hdr.Name != "deploy.yaml" {
			t.Errorf("output %s holds %+v", o.Name, got)
		}
	}

	// b changes; c is dropped from the spec.
	files["apps/b/deploy.yaml"] = "b2"
	src2 := h.storeSource("gitrepository/apps/mono/2.tar.gz", files)
	j2 := generatorJob("gen-2")
	h.send(events.TypeGenerateRequested, j2, &events.GenerateRequested{Job: j2, Artifacts: perApp("a", "b"), Previous: out1.Outputs,
		Sources: []events.GeneratorSource{{Alias: "repo", Kind: "GitRepository", Namespace: "apps", Name: "mono", Artifact: src2}}})
	out2 := h.nextOutcome(events.TypePackaged, "gen-2")
	if len(out2.Outputs) != 2 {
		t.Fatalf("outputs = %+v", out2.Outputs)
	}
	if a := out2.Outputs[0]; a.Changed || a.Artifact.Path != out1.Outputs[0].Artifact.Path || a.Artifact.Revision != out1.Outputs[0].Artifact.Revision {
		t.Errorf("unchanged app a = %+v", a)
	}
	if b := out2.Outputs[1]; !b.Changed || b.Artifact.Revision == out1.Outputs[1].Artifact.Revision {
		t.Errorf("changed app b = %+v", b)
	}
	if _, err := os.Lstat(h.file("externalartifact/apps/app-c")); err == nil {
		if names := dirNames(t, h.file("externalartifact/apps/app-c")); len(names) != 0 {
			t.Errorf("dropped output still holds %q", names)
		}
	}
	if got := h.metric("headwater_generated_artifacts_total", map[string]string{"result": "unchanged"}); got != 1 {
		t.Errorf("unchanged outputs = %v, want 1", got)
	}
}

// TestGenerateFailures: a spec that escapes its tree stalls, a missing
// file fails, a source artifact no longer stored fails; each is reported
// as PackageFailed with the Ready reason, and nothing is stored.
func TestGenerateFailures(t *testing.T) {
	h := newHarness(t, harnessOptions{opts: defaultOptions()})
	src := h.storeSource("gitrepository/apps/mono/1.tar.gz", map[string]string{"apps/a/deploy.yaml": "a"})
	sources := []events.GeneratorSource{{Alias: "repo", Kind: "GitRepository", Namespace: "apps", Name: "mono", Artifact: src}}
	tests := []struct {
		name    string
		req     events.GenerateRequested
		reason  string
		stalled bool
	}{
		{"escaping glob", events.GenerateRequested{Sources: sources, Artifacts: []swv1beta1.OutputArtifact{{Name: "x",
			Copy: []swv1beta1.CopyOperation{{From: "@repo/../../etc/**", To: "@artifact/"}}}}}, swv1beta1.ValidationFailedReason, true},
		{"two outputs of one name", events.GenerateRequested{Sources: sources, Artifacts: append(perApp("a"), perApp("a")...)},
			swv1beta1.ValidationFailedReason, true},
		{"missing file", events.GenerateRequested{Sources: sources, Artifacts: []swv1beta1.OutputArtifact{{Name: "x",
			Copy: []swv1beta1.CopyOperation{{From: "@repo/apps/z/deploy.yaml", To: "@artifact/"}}}}}, meta.BuildFailedReason, false},
		{"source gone", events.GenerateRequested{Artifacts: perApp("a"), Sources: []events.GeneratorSource{{Alias: "repo",
			Kind: "GitRepository", Namespace: "apps", Name: "mono", Artifact: meta.Artifact{Path: "gitrepository/apps/mono/gone.tar.gz"}}}},
			swv1beta1.SourceFetchFailedReason, false},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			j := generatorJob(fmt.Sprintf("bad-%d", i))
			tc.req.Job = j
			h.send(events.TypeGenerateRequested, j, &tc.req)
			out := h.nextOutcome(events.TypePackageFailed, j.ID)
			if out.Failure == nil || out.Failure.Reason != tc.reason || out.Failure.Stalled != tc.stalled || out.Failure.Condition != meta.ReadyCondition {
				t.Errorf("failure = %+v", out.Failure)
			}
		})
	}
	if _, err := h.store.List(context.Background(), "externalartifact/apps/x"); err != nil && !errors.Is(err, storage.ErrNotFound) {
		t.Fatal(err)
	} else if objs, _ := h.store.List(context.Background(), "externalartifact/apps/x"); len(objs) != 0 {
		t.Errorf("a failed job stored %v", objs)
	}
}

// TestGeneratePathPattern expands the templates once per matching
// directory (names lowercased, paths as written, captures as labels); a
// directory gone from the source loses its output's stored files; a
// pattern that then matches nothing fails the job with BuildFailed,
// naming the pattern and what to fix, and leaves every stored output in
// place; a name another producer has is refused.
func TestGeneratePathPattern(t *testing.T) {
	h := newHarness(t, harnessOptions{opts: defaultOptions()})
	files := map[string]string{"apps/Auth/envs/dev/a.yaml": "auth-dev", "apps/Auth/envs/prod/a.yaml": "auth-prod",
		"apps/pay/envs/dev/p.yaml": "pay-dev", "apps/pay/README.md": "no env", "docs/x.md": "x"}
	src := h.storeSource("gitrepository/apps/mono/1.tar.gz", files)
	templates := []swv1beta1.OutputArtifact{{Name: "{app}-{env}", OriginRevision: "@repo",
		Copy: []swv1beta1.CopyOperation{{From: "@repo/apps/{app}/envs/{env}/**", To: "@artifact/{env}/"}}}}
	sources := func(a meta.Artifact) []events.GeneratorSource {
		return []events.GeneratorSource{{Alias: "repo", Kind: "GitRepository", Namespace: "apps", Name: "mono", Artifact: a}}
	}

	j1 := generatorJob("pattern-1")
	h.send(events.TypeGenerateRequested, j1, &events.GenerateRequested{Job: j1, PathPattern: "@repo/apps/{app}/envs/{env}",
		Artifacts: templates, Sources: sources(src)})
	out1 := h.nextOutcome(events.TypePackaged, j1.ID)
	want := []struct{ name, app, env, file string }{
		{"auth-dev", "auth", "dev", "dev/a.yaml"}, {"auth-prod", "auth", "prod", "prod/a.yaml"}, {"pay-dev", "pay", "dev", "dev/p.yaml"}}
	if len(out1.Outputs) != len(want) {
		t.Fatalf("outputs = %+v", out1.Outputs)
	}
	for i, w := range want {
		o := out1.Outputs[i]
		if o.Name != w.name || !o.Changed || o.Labels["app"] != w.app || o.Labels["env"] != w.env || len(o.Labels) != 2 {
			t.Errorf("output %d = %+v, want %s with app=%s env=%s", i, o, w.name, w.app, w.env)
		}
		var got []string
		for _, e := range h.untar(o.Artifact.Path) {
			if e.hdr.Typeflag == tar.TypeReg {
				got = append(got, e.hdr.Name)
			}
		}
		if len(got) != 1 || got[0] != w.file || !strings.HasPrefix(o.Artifact.Path, "externalartifact/apps/"+w.name+"/") {
			t.Errorf("output %s at %s holds %+v, want %s", o.Name, o.Artifact.Path, got, w.file)
		}
	}

	// The prod environment of Auth is removed from the source.
	delete(files, "apps/Auth/envs/prod/a.yaml")
	src2 := h.storeSource("gitrepository/apps/mono/2.tar.gz", files)
	j2 := generatorJob("pattern-2")
	h.send(events.TypeGenerateRequested, j2, &events.GenerateRequested{Job: j2, PathPattern: "@repo/apps/{app}/envs/{env}",
		Artifacts: templates, Sources: sources(src2), Previous: out1.Outputs})
	out2 := h.nextOutcome(events.TypePackaged, j2.ID)
	if len(out2.Outputs) != 2 || out2.Outputs[0].Changed || out2.Outputs[1].Changed {
		t.Fatalf("outputs = %+v, want auth-dev and pay-dev unchanged", out2.Outputs)
	}
	if objs, _ := h.store.List(context.Background(), "externalartifact/apps/auth-prod"); len(objs) != 0 {
		t.Errorf("a directory gone from the source left its output stored: %v", objs)
	}

	// A pattern that matches nothing: nothing is stored or removed.
	j4 := generatorJob("pattern-4")
	h.send(events.TypeGenerateRequested, j4, &events.GenerateRequested{Job: j4, PathPattern: "@repo/services/{app}",
		Artifacts: []swv1beta1.OutputArtifact{{Name: "{app}", Copy: []swv1beta1.CopyOperation{{From: "@repo/services/{app}/**", To: "@artifact/"}}}},
		Sources:   sources(src2), Previous: out2.Outputs})
	out4 := h.nextOutcome(events.TypePackageFailed, j4.ID)
	if f := out4.Failure; f == nil || f.Reason != meta.BuildFailedReason || f.Stalled ||
		!strings.Contains(f.Message, `pathPattern "@repo/services/{app}" matches no directory in source "repo"`) ||
		!strings.Contains(f.Message, "correct spec.pathPattern") {
		t.Errorf("no match: failure = %+v", f)
	}
	for _, o := range out2.Outputs {
		if _, err := h.store.Stat(context.Background(), o.Artifact.Path); err != nil {
			t.Errorf("a failed job removed %s: %v", o.Artifact.Path, err)
		}
	}

	// An output named as another producer's ExternalArtifact.
	j5 := generatorJob("pattern-5")
	h.send(events.TypeGenerateRequested, j5, &events.GenerateRequested{Job: j5, PathPattern: "@repo/apps/{app}/envs/{env}",
		Artifacts: templates, Sources: sources(src2), Previous: out2.Outputs, Foreign: []string{"pay-dev"}})
	out5 := h.nextOutcome(events.TypePackageFailed, j5.ID)
	if f := out5.Failure; f == nil || f.Reason != swv1beta1.ValidationFailedReason || !f.Stalled || !strings.Contains(f.Message, "another producer") {
		t.Errorf("foreign name: failure = %+v", f)
	}
}
