package storage_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/testsupport/miniotest"
)

// conformanceCases are the behaviours every Storage shares; each runs on a
// fresh, empty storage.
var conformanceCases = []struct {
	name string
	run  func(t *testing.T, ctx context.Context, s storage.Storage)
}{
	{"put then stat", func(t *testing.T, ctx context.Context, s storage.Storage) {
		put := mustPut(t, ctx, s, "gitrepository/ns/app/abc.tar.gz", "hello world")
		if put.Key != "gitrepository/ns/app/abc.tar.gz" || put.Size != 11 {
			t.Fatalf("Put info = %+v, want the key and size 11", put)
		}
		st, err := s.Stat(ctx, "gitrepository/ns/app/abc.tar.gz")
		if err != nil {
			t.Fatal(err)
		}
		// Put's ModTime may be the writer's clock (S3), not the store's.
		if st.Key != put.Key || st.Size != put.Size || st.ETag != put.ETag || st.ModTime.Sub(put.ModTime).Abs() > time.Minute {
			t.Fatalf("Stat = %+v, want Put's %+v", st, put)
		}
		if len(st.ETag) < 3 || !strings.HasPrefix(st.ETag, `"`) || !strings.HasSuffix(st.ETag, `"`) {
			t.Fatalf("ETag %s is not a quoted HTTP entity tag", st.ETag)
		}
		if age := time.Since(st.ModTime); age < -time.Hour || age > time.Hour {
			t.Fatalf("ModTime %s is not about now", st.ModTime)
		}
	}},
	{"empty object", func(t *testing.T, ctx context.Context, s storage.Storage) {
		if info := mustPut(t, ctx, s, "k/empty", ""); info.Size != 0 {
			t.Fatalf("size %d, want 0", info.Size)
		}
		if got := mustRead(t, ctx, s, "k/empty"); got != "" {
			t.Fatalf("content %q, want empty", got)
		}
	}},
	{"open reads and seeks", func(t *testing.T, ctx context.Context, s storage.Storage) {
		const content = "0123456789abcdefghij"
		put := mustPut(t, ctx, s, "k/obj", content)
		obj, err := s.Open(ctx, "k/obj")
		if err != nil {
			t.Fatal(err)
		}
		defer obj.Close()
		if info := obj.Info(); info.Key != "k/obj" || info.Size != int64(len(content)) || info.ETag != put.ETag {
			t.Fatalf("Info = %+v, want key, size %d, ETag %s", info, len(content), put.ETag)
		}
		head := make([]byte, 4)
		if _, err := io.ReadFull(obj, head); err != nil || string(head) != "0123" {
			t.Fatalf("first read %q, %v", head, err)
		}
		steps := []struct {
			offset int64
			whence int
			pos    int64
			rest   string
		}{
			{10, io.SeekStart, 10, "abcdefghij"},
			{-3, io.SeekEnd, 17, "hij"},
			{0, io.SeekEnd, 20, ""},
			{2, io.SeekStart, 2, "23456789abcdefghij"},
		}
		for _, st := range steps {
			pos, err := obj.Seek(st.offset, st.whence)
			if err != nil || pos != st.pos {
				t.Fatalf("Seek(%d, %d) = %d, %v; want %d", st.offset, st.whence, pos, err, st.pos)
			}
			rest, err := io.ReadAll(obj)
			if err != nil || string(rest) != st.rest {
				t.Fatalf("after Seek(%d, %d) read %q, %v; want %q", st.offset, st.whence, rest, err, st.rest)
			}
		}
	}},
	{"range request", func(t *testing.T, ctx context.Context, s storage.Storage) {
		mustPut(t, ctx, s, "k/obj", "0123456789abcdefghij")
		obj, err := s.Open(ctx, "k/obj")
		if err != nil {
			t.Fatal(err)
		}
		defer obj.Close()
		// What the artifact-server does with an Object.
		req := httptest.NewRequest(http.MethodGet, "/k/obj", nil)
		req.Header.Set("Range", "bytes=5-9")
		rec := httptest.NewRecorder()
		rec.Header().Set("ETag", obj.Info().ETag)
		http.ServeContent(rec, req, "obj", obj.Info().ModTime, obj)
		if rec.Code != http.StatusPartialContent || rec.Body.String() != "56789" {
			t.Fatalf("range response %d %q, want 206 %q", rec.Code, rec.Body.String(), "56789")
		}
		if got := rec.Header().Get("Content-Range"); got != "bytes 5-9/20" {
			t.Fatalf("Content-Range %q", got)
		}
	}},
	{"overwrite", func(t *testing.T, ctx context.Context, s storage.Storage) {
		first := mustPut(t, ctx, s, "k/obj", "first")
		second := mustPut(t, ctx, s, "k/obj", "second version")
		if got := mustRead(t, ctx, s, "k/obj"); got != "second version" {
			t.Fatalf("content %q after overwrite", got)
		}
		if first.ETag == second.ETag {
			t.Fatalf("ETag %s did not change with the content", first.ETag)
		}
	}},
	{"failed put keeps the old object", func(t *testing.T, ctx context.Context, s storage.Storage) {
		mustPut(t, ctx, s, "k/obj", "good")
		// Larger than a single S3 PUT, so the multipart upload is aborted.
		broken := io.MultiReader(bytes.NewReader(make([]byte, 3<<20)), errReader{errors.New("source broke")})
		if _, err := s.Put(ctx, "k/obj", broken); err == nil {
			t.Fatal("Put from a failing reader succeeded")
		}
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := s.Put(cancelled, "k/obj", strings.NewReader("late")); err == nil {
			t.Fatal("Put with a cancelled context succeeded")
		}
		if got := mustRead(t, ctx, s, "k/obj"); got != "good" {
			t.Fatalf("content %q, want the old object", got)
		}
		if keys := listKeys(t, ctx, s, "k"); strings.Join(keys, ",") != "k/obj" {
			t.Fatalf("List = %v, want only k/obj", keys)
		}
	}},
	{"delete", func(t *testing.T, ctx context.Context, s storage.Storage) {
		mustPut(t, ctx, s, "k/obj", "x")
		for i := range 2 { // the second deletes a missing key
			if err := s.Delete(ctx, "k/obj"); err != nil {
				t.Fatalf("Delete #%d: %v", i+1, err)
			}
		}
		if _, err := s.Stat(ctx, "k/obj"); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("Stat after Delete: %v, want ErrNotFound", err)
		}
		if err := s.Delete(ctx, "never/was"); err != nil {
			t.Fatalf("Delete of a missing key: %v", err)
		}
	}},
	{"not found", func(t *testing.T, ctx context.Context, s storage.Storage) {
		mustPut(t, ctx, s, "a/b/c", "x")
		for _, key := range []string{"missing", "a/missing", "a/b", "a"} { // a and a/b are only directories
			if _, err := s.Stat(ctx, key); !errors.Is(err, storage.ErrNotFound) {
				t.Errorf("Stat(%q) = %v, want ErrNotFound", key, err)
			}
			if obj, err := s.Open(ctx, key); !errors.Is(err, storage.ErrNotFound) {
				if err == nil {
					obj.Close()
				}
				t.Errorf("Open(%q) = %v, want ErrNotFound", key, err)
			}
			if err := storage.Verify(ctx, s, key, digest.FromString("x").String()); !errors.Is(err, storage.ErrNotFound) {
				t.Errorf("Verify(%q) = %v, want ErrNotFound", key, err)
			}
		}
		if infos, err := s.List(ctx, "missing"); err != nil || len(infos) != 0 {
			t.Errorf("List(missing) = %v, %v; want nothing", infos, err)
		}
	}},
	{"list", func(t *testing.T, ctx context.Context, s storage.Storage) {
		for key, content := range map[string]string{
			"dir/b.tar.gz":     "bb",
			"dir/a.tar.gz":     "a",
			"dir/.hidden":      "h",
			"dir/sub/c.tar.gz": "c",
			"dirx/y":           "y",
			"other/x":          "x",
		} {
			mustPut(t, ctx, s, key, content)
		}
		if err := s.SetLatest(ctx, "dir/"+storage.LatestName, "dir/b.tar.gz", time.Now()); err != nil {
			t.Fatal(err)
		}
		infos, err := s.List(ctx, "dir")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, in := range infos {
			got = append(got, fmt.Sprintf("%s:%d", in.Key, in.Size))
			if in.ETag == "" || in.ModTime.IsZero() {
				t.Errorf("List entry %+v lacks ETag or ModTime", in)
			}
		}
		if want := "dir/a.tar.gz:1,dir/b.tar.gz:2"; strings.Join(got, ",") != want {
			t.Fatalf("List(dir) = %v, want %s", got, want)
		}
		if keys := listKeys(t, ctx, s, "dir/sub"); strings.Join(keys, ",") != "dir/sub/c.tar.gz" {
			t.Fatalf("List(dir/sub) = %v", keys)
		}
	}},
	{"set latest", func(t *testing.T, ctx context.Context, s storage.Storage) {
		latest := storage.ArtifactKey("GitRepository", "ns", "app", storage.LatestName)
		for _, rev := range []string{"one", "two"} {
			target := storage.ArtifactKey("GitRepository", "ns", "app", rev+".tar.gz")
			mustPut(t, ctx, s, target, "content "+rev)
			if err := s.SetLatest(ctx, latest, target, time.Now()); err != nil {
				t.Fatal(err)
			}
			if got := mustRead(t, ctx, s, latest); got != "content "+rev {
				t.Fatalf("Open(latest) = %q, want %q", got, "content "+rev)
			}
			st, err := s.Stat(ctx, latest)
			if err != nil || st.Size != int64(len("content "+rev)) {
				t.Fatalf("Stat(latest) = %+v, %v", st, err)
			}
			if err := storage.Verify(ctx, s, latest, digest.FromString("content "+rev).String()); err != nil {
				t.Fatalf("Verify(latest): %v", err)
			}
		}
		if err := s.SetLatest(ctx, latest, "gitrepository/ns/other/one.tar.gz", time.Now()); !errors.Is(err, storage.ErrInvalidKey) {
			t.Fatalf("SetLatest to another directory: %v, want ErrInvalidKey", err)
		}
	}},
	{"latest follows job order", func(t *testing.T, ctx context.Context, s storage.Storage) {
		dir := storage.SourceDir("GitRepository", "ns", "app")
		latest := dir + "/" + storage.LatestName
		requested := time.Date(2026, 12, 4, 23, 0, 0, 0, time.UTC)
		at := func(rev string) time.Time { // one < two < three, a nanosecond apart
			return requested.Add(time.Duration(strings.Index("one two three", rev)))
		}
		for _, rev := range []string{"one", "two", "three"} {
			mustPut(t, ctx, s, dir+"/"+rev+".tar.gz", "content "+rev)
		}
		set := func(rev string) error { return s.SetLatest(ctx, latest, dir+"/"+rev+".tar.gz", at(rev)) }
		for _, step := range []struct {
			rev        string
			superseded bool
			want       string
		}{
			{"two", false, "two"},
			// A job requested before the one that set the pointer, and
			// finished after it (a packager cut off from the bus).
			{"one", true, "two"},
			// The job redelivered: requested at the same time.
			{"two", false, "two"},
			{"three", false, "three"},
			{"one", true, "three"},
			{"two", true, "three"},
		} {
			err := set(step.rev)
			if step.superseded != errors.Is(err, storage.ErrSuperseded) || (!step.superseded && err != nil) {
				t.Fatalf("SetLatest(%s) = %v, want superseded %v", step.rev, err, step.superseded)
			}
			if got := mustRead(t, ctx, s, latest); got != "content "+step.want {
				t.Fatalf("after SetLatest(%s): latest = %q, want %q", step.rev, got, "content "+step.want)
			}
			if got, err := s.LatestTarget(ctx, latest); err != nil || got != dir+"/"+step.want+".tar.gz" {
				t.Fatalf("after SetLatest(%s): LatestTarget = %q, %v; want %s", step.rev, got, err, dir+"/"+step.want+".tar.gz")
			}
		}
		// The record is no artifact, and goes with the pointer: a source
		// deleted and made again starts with no order.
		if keys := listKeys(t, ctx, s, dir); strings.Join(keys, ",") != dir+"/one.tar.gz,"+dir+"/three.tar.gz,"+dir+"/two.tar.gz" {
			t.Fatalf("List = %v, want the artifacts alone", keys)
		}
		if err := s.Delete(ctx, latest); err != nil {
			t.Fatal(err)
		}
		if got, err := s.LatestTarget(ctx, latest); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("LatestTarget of a deleted pointer = %q, %v; want ErrNotFound", got, err)
		}
		if err := set("one"); err != nil {
			t.Fatalf("SetLatest after the pointer was deleted: %v", err)
		}
		if got := mustRead(t, ctx, s, latest); got != "content one" {
			t.Fatalf("latest = %q, want content one", got)
		}
	}},
	{"delete latest follows job order", func(t *testing.T, ctx context.Context, s storage.Storage) {
		dir := storage.SourceDir("ArtifactGenerator", "ns", "out")
		latest := dir + "/" + storage.LatestName
		at := func(n int) time.Time { return time.Date(2026, 12, 4, 23, 0, n, 0, time.UTC) }
		for _, rev := range []string{"one", "two"} {
			mustPut(t, ctx, s, dir+"/"+rev+".tar.gz", "content "+rev)
		}
		if err := s.SetLatest(ctx, latest, dir+"/two.tar.gz", at(2)); err != nil {
			t.Fatal(err)
		}
		// An older job that no longer had this output, finished late.
		if err := s.DeleteLatest(ctx, latest, at(1)); !errors.Is(err, storage.ErrSuperseded) {
			t.Fatalf("DeleteLatest of an older job = %v, want ErrSuperseded", err)
		}
		if got := mustRead(t, ctx, s, latest); got != "content two" {
			t.Fatalf("latest = %q after a refused delete, want content two", got)
		}
		if err := s.DeleteLatest(ctx, latest, at(3)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Stat(ctx, latest); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("Stat of a deleted pointer = %v, want ErrNotFound", err)
		}
		if _, err := s.LatestTarget(ctx, latest); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("LatestTarget of a deleted pointer = %v, want ErrNotFound", err)
		}
		// The removal is ordered too: a job older than it does not set
		// the pointer again; a newer one does.
		if err := s.SetLatest(ctx, latest, dir+"/one.tar.gz", at(2)); !errors.Is(err, storage.ErrSuperseded) {
			t.Fatalf("SetLatest older than the removal = %v, want ErrSuperseded", err)
		}
		if err := s.DeleteLatest(ctx, latest, at(3)); err != nil {
			t.Fatalf("DeleteLatest of a removed pointer, again: %v", err)
		}
		if err := s.SetLatest(ctx, latest, dir+"/one.tar.gz", at(4)); err != nil {
			t.Fatal(err)
		}
		if got := mustRead(t, ctx, s, latest); got != "content one" {
			t.Fatalf("latest = %q, want content one", got)
		}
	}},
	{"copy", func(t *testing.T, ctx context.Context, s storage.Storage) {
		src := mustPut(t, ctx, s, ".cache/abc.tar.gz", "shared content")
		dst := "gitrepository/ns/other/abc.tar.gz"
		mustPut(t, ctx, s, dst, "old content of the destination")
		info, err := s.Copy(ctx, src.Key, dst)
		if err != nil {
			t.Fatal(err)
		}
		if info.Key != dst || info.Size != src.Size || info.ETag == "" || info.ModTime.IsZero() {
			t.Fatalf("Copy info = %+v, want key %s and size %d", info, dst, src.Size)
		}
		if st, err := s.Stat(ctx, dst); err != nil || st != info {
			t.Fatalf("Stat(dst) = %+v, %v; want Copy's %+v", st, err, info)
		}
		if err := storage.Verify(ctx, s, dst, digest.FromString("shared content").String()); err != nil {
			t.Fatalf("Verify(dst): %v", err)
		}
		// The two are independent: replacing or deleting one leaves the other.
		mustPut(t, ctx, s, src.Key, "replaced source")
		if got := mustRead(t, ctx, s, dst); got != "shared content" {
			t.Fatalf("dst = %q after the source was replaced", got)
		}
		if err := s.Delete(ctx, dst); err != nil {
			t.Fatal(err)
		}
		if got := mustRead(t, ctx, s, src.Key); got != "replaced source" {
			t.Fatalf("src = %q after the copy was deleted", got)
		}
		if keys := listKeys(t, ctx, s, "gitrepository/ns/other"); len(keys) != 0 {
			t.Fatalf("List after deleting the copy = %v, want nothing (no temporary files)", keys)
		}
		// A copy onto itself changes nothing.
		if info, err := s.Copy(ctx, src.Key, src.Key); err != nil || info.Size != int64(len("replaced source")) {
			t.Fatalf("Copy onto itself = %+v, %v", info, err)
		}
	}},
	{"copy matching", func(t *testing.T, ctx context.Context, s storage.Storage) {
		src := mustPut(t, ctx, s, ".cache/abc.tar.gz", "shared content")
		dst := "gitrepository/ns/other/abc.tar.gz"
		info, err := s.CopyMatching(ctx, src, dst)
		if err != nil {
			t.Fatal(err)
		}
		if st, err := s.Stat(ctx, dst); err != nil || st != info || info.Size != src.Size {
			t.Fatalf("Stat(dst) = %+v, %v; want CopyMatching's %+v of size %d", st, err, info, src.Size)
		}
		// Once src's key holds another object, the old description copies
		// nothing and dst keeps what it had.
		mustPut(t, ctx, s, src.Key, "replaced source, longer")
		if _, err := s.CopyMatching(ctx, src, dst); !errors.Is(err, storage.ErrChanged) {
			t.Fatalf("CopyMatching of a replaced source = %v, want ErrChanged", err)
		}
		if got := mustRead(t, ctx, s, dst); got != "shared content" {
			t.Fatalf("dst = %q after a refused copy", got)
		}
		if keys := listKeys(t, ctx, s, "gitrepository/ns/other"); len(keys) != 1 {
			t.Fatalf("List after a refused copy = %v, want dst alone (no temporary files)", keys)
		}
		if err := s.Delete(ctx, src.Key); err != nil {
			t.Fatal(err)
		}
		if _, err := s.CopyMatching(ctx, src, dst); !errors.Is(err, storage.ErrNotFound) && !errors.Is(err, storage.ErrChanged) {
			t.Fatalf("CopyMatching of a deleted source = %v, want ErrNotFound or ErrChanged", err)
		}
	}},
	{"copy of a latest pointer", func(t *testing.T, ctx context.Context, s storage.Storage) {
		target := mustPut(t, ctx, s, "gitrepository/ns/app/one.tar.gz", "content one")
		latest := "gitrepository/ns/app/" + storage.LatestName
		if err := s.SetLatest(ctx, latest, target.Key, time.Now()); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Copy(ctx, latest, "elsewhere/copy.tar.gz"); err != nil {
			t.Fatal(err)
		}
		if got := mustRead(t, ctx, s, "elsewhere/copy.tar.gz"); got != "content one" {
			t.Fatalf("copy of the pointer = %q, want its target's content", got)
		}
	}},
	{"copy of a missing object", func(t *testing.T, ctx context.Context, s storage.Storage) {
		mustPut(t, ctx, s, "a/b/c", "x")
		for _, src := range []string{"missing", "a/missing", "a/b"} {
			if _, err := s.Copy(ctx, src, "d/e"); !errors.Is(err, storage.ErrNotFound) {
				t.Errorf("Copy(%q) = %v, want ErrNotFound", src, err)
			}
		}
		if _, err := s.Stat(ctx, "d/e"); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("a failed Copy left its destination: %v", err)
		}
	}},
	{"concurrent copies", func(t *testing.T, ctx context.Context, s storage.Storage) {
		mustPut(t, ctx, s, ".cache/k.tar.gz", "cached")
		const copies = 8
		var wg sync.WaitGroup
		errs := make([]error, copies)
		for i := range copies {
			// Half into one key (racing each other), half into their own.
			dst := fmt.Sprintf("kind/ns/src-%d/a.tar.gz", i)
			if i%2 == 0 {
				dst = "kind/ns/shared/a.tar.gz"
			}
			wg.Go(func() { _, errs[i] = s.Copy(ctx, ".cache/k.tar.gz", dst) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("copy %d: %v", i, err)
			}
		}
		for _, key := range []string{"kind/ns/shared/a.tar.gz", "kind/ns/src-1/a.tar.gz", "kind/ns/src-7/a.tar.gz"} {
			if got := mustRead(t, ctx, s, key); got != "cached" {
				t.Fatalf("%s = %q", key, got)
			}
		}
		if keys := listKeys(t, ctx, s, "kind/ns/shared"); strings.Join(keys, ",") != "kind/ns/shared/a.tar.gz" {
			t.Fatalf("List = %v, want only the copy", keys)
		}
	}},
	{"invalid keys", func(t *testing.T, ctx context.Context, s storage.Storage) {
		for _, key := range []string{"", "/abs", "../up", "a/../b", "a/./b", "./a", "a//b", "a/", `a\b`, "a\x00b", ".."} {
			checks := map[string]error{}
			_, checks["Put"] = s.Put(ctx, key, strings.NewReader("x"))
			_, checks["Stat"] = s.Stat(ctx, key)
			obj, openErr := s.Open(ctx, key)
			if openErr == nil {
				obj.Close()
			}
			checks["Open"] = openErr
			checks["Delete"] = s.Delete(ctx, key)
			_, checks["List"] = s.List(ctx, key)
			checks["SetLatest"] = s.SetLatest(ctx, key, "a/b", time.Now())
			_, checks["Copy from"] = s.Copy(ctx, key, "a/b")
			_, checks["Copy to"] = s.Copy(ctx, "a/b", key)
			for op, err := range checks {
				if !errors.Is(err, storage.ErrInvalidKey) {
					t.Errorf("%s(%q) = %v, want ErrInvalidKey", op, key, err)
				}
			}
		}
	}},
	{"concurrent puts of one key", func(t *testing.T, ctx context.Context, s storage.Storage) {
		// Each writer's content is larger than a single S3 PUT and
		// distinct, so any interleaving of two would show.
		const writers = 6
		digests := map[string]bool{}
		contents := make([][]byte, writers)
		for i := range contents {
			contents[i] = bytes.Repeat([]byte{byte('a' + i)}, 2<<20+i)
			digests[digest.FromBytes(contents[i]).String()] = true
		}
		var wg sync.WaitGroup
		errs := make([]error, writers)
		for i := range writers {
			wg.Go(func() { _, errs[i] = s.Put(ctx, "k/shared", bytes.NewReader(contents[i])) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("writer %d: %v", i, err)
			}
		}
		obj, err := s.Open(ctx, "k/shared")
		if err != nil {
			t.Fatal(err)
		}
		defer obj.Close()
		h := sha256.New()
		n, err := io.Copy(h, obj)
		if err != nil {
			t.Fatal(err)
		}
		if got := digest.NewDigestFromBytes(digest.SHA256, h.Sum(nil)).String(); !digests[got] {
			t.Fatalf("stored object (%d bytes, %s) is none of the writers' contents", n, got)
		}
		if keys := listKeys(t, ctx, s, "k"); strings.Join(keys, ",") != "k/shared" {
			t.Fatalf("List = %v, want only k/shared", keys)
		}
	}},
}

// TestConformance runs the same cases against every Storage implementation.
func TestConformance(t *testing.T) {
	srv := miniotest.New(t)
	srv.MakeBucket(t, "artifacts")
	backends := []struct {
		name string
		open func(t *testing.T, caseName string) storage.Storage
	}{
		{"dir", func(t *testing.T, _ string) storage.Storage {
			d, err := storage.NewDir(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Close() })
			return d
		}},
		{"s3", func(t *testing.T, caseName string) storage.Storage {
			// One bucket; each case under its own prefix.
			s, err := storage.NewS3(srv.Client, "artifacts", "/conformance/"+strings.ReplaceAll(caseName, " ", "-")+"/")
			if err != nil {
				t.Fatal(err)
			}
			return s
		}},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			for _, tc := range conformanceCases {
				t.Run(tc.name, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					tc.run(t, ctx, b.open(t, tc.name))
				})
			}
		})
	}
}

func mustPut(t *testing.T, ctx context.Context, s storage.Storage, key, content string) storage.Info {
	t.Helper()
	info, err := s.Put(ctx, key, strings.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func mustRead(t *testing.T, ctx context.Context, s storage.Storage, key string) string {
	t.Helper()
	obj, err := s.Open(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer obj.Close()
	b, err := io.ReadAll(obj)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func listKeys(t *testing.T, ctx context.Context, s storage.Storage, dir string) []string {
	t.Helper()
	infos, err := s.List(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, in := range infos {
		keys = append(keys, in.Key)
	}
	return keys
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
