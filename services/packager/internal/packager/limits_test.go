package packager

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	swv1beta1 "github.com/fluxcd/source-watcher/api/v2/v1beta1"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// zerosTarball is a gzip-compressed tarball of one file of n zeros.
func zerosTarball(t *testing.T, name string, n int) string {
	t.Helper()
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(n)}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// TestGenerateUnpackLimits: a source tree over -max-unpack-size, and a
// gzip bomb an output extracts, fail the job with a message naming the
// limit, store nothing, and leave nothing in the work directory.
func TestGenerateUnpackLimits(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	opts := defaultOptions()
	opts.MaxUnpackSize = 64 << 10
	h := newHarness(t, harnessOptions{opts: opts})
	big := h.storeSource("gitrepository/apps/big/1.tar.gz", map[string]string{"apps/a/big.yaml": strings.Repeat("x", 65<<10)})
	bomb := h.storeSource("gitrepository/apps/bomb/1.tar.gz", map[string]string{
		"apps/a/bomb.tgz": zerosTarball(t, "zeros", 1<<20), "apps/a/ok.yaml": "ok"})
	tests := []struct {
		name   string
		source meta.Artifact
		copy   swv1beta1.CopyOperation
		reason string
	}{
		{"source over the limit", big, swv1beta1.CopyOperation{From: "@repo/apps/a/**", To: "@artifact/"}, swv1beta1.SourceFetchFailedReason},
		{"extracted bomb", bomb, swv1beta1.CopyOperation{From: "@repo/apps/a/bomb.tgz", To: "@artifact/", Strategy: swv1beta1.ExtractStrategy},
			meta.BuildFailedReason},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			j := generatorJob("limit-" + string(rune('a'+i)))
			req := &events.GenerateRequested{Job: j,
				Sources:   []events.GeneratorSource{{Alias: "repo", Kind: "GitRepository", Namespace: "apps", Name: "x", Artifact: tc.source}},
				Artifacts: []swv1beta1.OutputArtifact{{Name: "out", Copy: []swv1beta1.CopyOperation{tc.copy}}}}
			h.send(events.TypeGenerateRequested, j, req)
			out := h.nextOutcome(events.TypePackageFailed, j.ID)
			if out.Failure == nil || out.Failure.Reason != tc.reason || out.Failure.Stalled ||
				!strings.Contains(out.Failure.Message, "extracted size exceeds the limit of 64 KiB") {
				t.Errorf("failure = %+v, want %s naming the 64 KiB limit", out.Failure, tc.reason)
			}
			if left, err := os.ReadDir(tmp); err != nil || len(left) != 0 {
				t.Errorf("work directory left over: %v %v", left, err)
			}
		})
	}
	if objs, _ := h.store.List(t.Context(), "externalartifact/apps/out"); len(objs) != 0 {
		t.Errorf("a failed job stored %v", objs)
	}
}

// TestGenerateNoCrossNamespaceRefs: with the lockdown on, a job whose
// generator (namespace apps) names a source of another namespace is
// refused, AccessDenied, before anything is read or stored.
func TestGenerateNoCrossNamespaceRefs(t *testing.T) {
	opts := defaultOptions()
	opts.NoCrossNamespaceRefs = true
	h := newHarness(t, harnessOptions{opts: opts})
	victim := h.storeSource("gitrepository/tenant-b/secret/1.tar.gz", map[string]string{"apps/a/secret.yaml": "b's"})
	own := h.storeSource("gitrepository/apps/mono/1.tar.gz", map[string]string{"apps/a/deploy.yaml": "a"})

	j := generatorJob("thief")
	h.send(events.TypeGenerateRequested, j, &events.GenerateRequested{Job: j, Artifacts: perApp("a"),
		Sources: []events.GeneratorSource{{Alias: "repo", Kind: "GitRepository", Namespace: "tenant-b", Name: "secret", Artifact: victim}}})
	out := h.nextOutcome(events.TypePackageFailed, j.ID)
	want := "cross-namespace reference to source GitRepository/tenant-b/secret is not allowed"
	if out.Failure == nil || out.Failure.Reason != swv1beta1.AccessDeniedReason || !out.Failure.Stalled || out.Failure.Message != want {
		t.Errorf("failure = %+v, want stalled AccessDenied %q", out.Failure, want)
	}
	if objs, _ := h.store.List(t.Context(), "externalartifact/apps/app-a"); len(objs) != 0 {
		t.Errorf("a refused job stored %v", objs)
	}

	// The generator's own namespace is served.
	j = generatorJob("own")
	h.send(events.TypeGenerateRequested, j, &events.GenerateRequested{Job: j, Artifacts: perApp("a"),
		Sources: []events.GeneratorSource{{Alias: "repo", Kind: "GitRepository", Namespace: "apps", Name: "mono", Artifact: own}}})
	if out := h.nextOutcome(events.TypePackaged, j.ID); len(out.Outputs) != 1 {
		t.Errorf("outputs %+v, want one", out.Outputs)
	}
}

// TestGenerateCopyLimit: a generator copying its tree hundreds of times
// into two outputs goes over -max-unpack-size in what its copies write
// together (each copy is within it): the job fails BuildFailed naming
// the limit and the flag, stores nothing, and leaves nothing in the work
// directory.
func TestGenerateCopyLimit(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	opts := defaultOptions()
	opts.MaxUnpackSize = 64 << 10
	h := newHarness(t, harnessOptions{opts: opts})
	src := h.storeSource("gitrepository/apps/tree/1.tar.gz", map[string]string{
		"apps/a/one.yaml": strings.Repeat("x", 4<<10), "apps/a/two.yaml": strings.Repeat("y", 4<<10)})
	var copies []swv1beta1.CopyOperation
	for i := range 500 {
		copies = append(copies, swv1beta1.CopyOperation{From: "@repo/apps/**", To: "@artifact/" + strconv.Itoa(i) + "/"})
	}
	j := generatorJob("copies")
	h.send(events.TypeGenerateRequested, j, &events.GenerateRequested{Job: j,
		Sources: []events.GeneratorSource{{Alias: "repo", Kind: "GitRepository", Namespace: "apps", Name: "tree", Artifact: src}},
		Artifacts: []swv1beta1.OutputArtifact{
			{Name: "first", Copy: copies[:4]}, // 32 KiB: within the limit alone
			{Name: "second", Copy: copies}}})
	out := h.nextOutcome(events.TypePackageFailed, j.ID)
	want := `artifact "second" copy[4] from "@repo/apps/**": write 4/a/one.yaml: artifact build failed: limit exceeded: ` +
		"copied size exceeds the limit of 64 KiB (-max-unpack-size)"
	if out.Failure == nil || out.Failure.Reason != meta.BuildFailedReason || out.Failure.Stalled || out.Failure.Message != want {
		t.Errorf("failure = %+v, want BuildFailed %q", out.Failure, want)
	}
	if left, err := os.ReadDir(tmp); err != nil || len(left) != 0 {
		t.Errorf("work directory left over: %v %v", left, err)
	}
	if objs, _ := h.store.List(t.Context(), "externalartifact/apps/second"); len(objs) != 0 {
		t.Errorf("a failed job stored %v", objs)
	}
}
