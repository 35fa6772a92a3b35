package contentcache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/headwater-gitops/headwater/pkg/storage"
)

// key returns a content key made from s.
func key(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func newStore(t *testing.T) *storage.Dir {
	t.Helper()
	s, err := storage.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func put(t *testing.T, s *storage.Dir, k, content string) {
	t.Helper()
	if _, err := s.Put(context.Background(), k, strings.NewReader(content)); err != nil {
		t.Fatal(err)
	}
}

func exists(s *storage.Dir, k string) bool {
	_, err := s.Stat(context.Background(), k)
	return err == nil
}

func TestRecord(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	from, err := s.Put(ctx, "gitrepository/default/app/abc.tar.gz", strings.NewReader("tarball"))
	if err != nil {
		t.Fatal(err)
	}
	k := key("app")
	idx := Index{Key: k, Digest: "sha256:00", Algorithm: "sha256", Size: 7, Revision: "main@sha1:abc",
		ArtifactName: "abc.tar.gz", EventMessage: "stored artifact for commit 'x'"}
	if err := Record(ctx, s, from, idx); err != nil {
		t.Fatal(err)
	}
	obj, err := s.Open(ctx, IndexKey(k))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(obj)
	obj.Close()
	if err != nil {
		t.Fatal(err)
	}
	// The format the fetcher reads (its package contentcache).
	want := `{"key":"` + k + `","artifact":".cache/` + k + `.tar.gz","digest":"sha256:00","algorithm":"sha256","size":7,` +
		`"revision":"main@sha1:abc","artifactName":"abc.tar.gz","eventMessage":"stored artifact for commit 'x'"}`
	if string(body) != want {
		t.Errorf("index = %s\nwant    %s", body, want)
	}
	var got Index
	if err := json.Unmarshal(body, &got); err != nil || got.Artifact != ArtifactKey(k) {
		t.Errorf("index decodes to %+v, %v", got, err)
	}
	if err := storage.Verify(ctx, s, ArtifactKey(k), "sha256:"+hex.EncodeToString(sha256sum("tarball"))); err != nil {
		t.Errorf("cached artifact: %v", err)
	}

	// An artifact replaced since it was described is not copied.
	if _, err := s.Put(ctx, from.Key, strings.NewReader("tarball")); err != nil {
		t.Fatal(err)
	}
	if err := Record(ctx, s, from, idx); !errors.Is(err, storage.ErrChanged) {
		t.Errorf("Record of a replaced artifact: %v, want ErrChanged", err)
	}
	if from, err = s.Stat(ctx, from.Key); err != nil {
		t.Fatal(err)
	}

	// A size that does not match is an error.
	idx.Size = 8
	if err := Record(ctx, s, from, idx); err == nil {
		t.Error("Record accepted a size that does not match")
	}
	for _, bad := range []string{"", "../x", strings.Repeat("A", 64), strings.Repeat("a", 63)} {
		idx.Key = bad
		if err := Record(ctx, s, from, idx); err == nil {
			t.Errorf("Record accepted key %q", bad)
		}
	}
	if err := Forget(ctx, s, k); err != nil {
		t.Fatal(err)
	}
	if exists(s, IndexKey(k)) || exists(s, ArtifactKey(k)) {
		t.Error("Forget left the entry")
	}
	if !exists(s, "gitrepository/default/app/abc.tar.gz") {
		t.Error("Forget removed the source's artifact")
	}
}

func sha256sum(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

func TestKeyOfArtifact(t *testing.T) {
	k := key("x")
	for in, want := range map[string]bool{
		ArtifactKey(k):                             true,
		IndexKey(k):                                false,
		".cache/" + k:                              false,
		".staging/" + k + ".tar.gz":                false,
		"gitrepository/default/app/abc.tar.gz":     false,
		".cache/" + strings.ToUpper(k) + ".tar.gz": false,
		".cache/sub/" + k + ".tar.gz":              false,
	} {
		got, ok := KeyOfArtifact(in)
		if ok != want || (ok && got != k) {
			t.Errorf("KeyOfArtifact(%q) = %q, %v; want %v", in, got, ok, want)
		}
	}
}
