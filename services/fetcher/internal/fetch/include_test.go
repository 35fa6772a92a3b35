package fetch

import (
	"reflect"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"

	"github.com/headwater-gitops/headwater/pkg/events"
)

// TestIncludesPassThrough checks that the includes the watcher resolved
// reach the packager unchanged, and that a forced request (the watcher
// forces one when an included artifact changed) is fetched although the
// revision is the stored artifact's.
func TestIncludesPassThrough(t *testing.T) {
	e := newEnv(t, 5)
	size := int64(42)
	incs := []events.Include{
		{Name: "lib", Artifact: meta.Artifact{Path: "gitrepository/default/lib/abc.tar.gz", Revision: "main@sha1:abc",
			Digest: "sha256:0000000000000000000000000000000000000000000000000000000000000000", Size: &size}, ToPath: "lib"},
		{Name: "other", Artifact: meta.Artifact{Path: "gitrepository/default/other/def.tar.gz", Revision: "main@sha1:def",
			Digest: "sha256:1111111111111111111111111111111111111111111111111111111111111111"}, FromPath: "deploy", ToPath: "vendor/other"},
	}
	prev := e.artifact(t, "artifact bytes", "artifact bytes")
	e.request(t, "job-1", func(r *events.FetchRequested) {
		r.Previous = prev
		r.Force = true
		r.Includes = incs
	})
	f := e.fetched(t)
	if !reflect.DeepEqual(f.Includes, incs) {
		t.Errorf("fetched includes = %+v, want the request's %+v", f.Includes, incs)
	}
	if f.Revision != prev.Revision {
		t.Errorf("revision = %q, want %q", f.Revision, prev.Revision)
	}
}
