package storage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDirPutRacesDelete puts into a directory while another goroutine
// deletes the only other object in it, which prunes the directory when it
// becomes empty. Every Put must still succeed.
func TestDirPutRacesDelete(t *testing.T) {
	d, err := NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const rounds = 300
	var wg sync.WaitGroup
	errs := make(chan error, 3*rounds)
	for range rounds {
		if _, err := d.Put(ctx, ".staging/old.tar", strings.NewReader("old")); err != nil {
			t.Fatal(err)
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			errs <- d.Delete(ctx, ".staging/old.tar")
		}()
		go func() {
			defer wg.Done()
			_, err := d.Put(ctx, ".staging/new.tar", strings.NewReader("new"))
			errs <- err
			if err == nil {
				errs <- d.Delete(ctx, ".staging/new.tar")
			}
		}()
		wg.Wait()
	}
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent put/delete: %v", err)
		}
	}
}

// TestDirCopyLinks checks that a copy in a directory is a hard link: the
// same file under two names, no bytes copied.
func TestDirCopyLinks(t *testing.T) {
	d, err := NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := d.Put(ctx, ".cache/k.tar.gz", strings.NewReader("content")); err != nil {
		t.Fatal(err)
	}
	info, err := d.Copy(ctx, ".cache/k.tar.gz", "gitrepository/ns/app/k.tar.gz")
	if err != nil {
		t.Fatal(err)
	}
	src, err := d.root.Stat(".cache/k.tar.gz")
	if err != nil {
		t.Fatal(err)
	}
	dst, err := d.root.Stat("gitrepository/ns/app/k.tar.gz")
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(src, dst) {
		t.Fatal("the copy is not a hard link to the source")
	}
	if info.ETag != `"`+fmt.Sprintf("%x-%x", src.ModTime().UnixNano(), src.Size())+`"` {
		t.Errorf("copy ETag %s, want the source file's", info.ETag)
	}
}

// TestDirSweepTemporary leaves the temporary files of writes a killed
// process abandoned (a Put, a Copy and a SetLatest that never renamed
// theirs into place) beside live objects: SweepTemporary removes those
// last written before the cutoff, and nothing else.
func TestDirSweepTemporary(t *testing.T) {
	d, err := NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, k := range []string{"gitrepository/default/a/1.tar.gz", ".cache/k.tar.gz", ".staging/j.tar"} {
		if _, err := d.Put(ctx, k, strings.NewReader(k)); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.SetLatest(ctx, "gitrepository/default/a/latest.tar.gz", "gitrepository/default/a/1.tar.gz", time.Now()); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	abandon := func(key string, age time.Time) string {
		tmp := tempKey(key)
		if err := os.WriteFile(filepath.Join(d.Path(), filepath.FromSlash(tmp)), []byte("partial"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(filepath.Join(d.Path(), filepath.FromSlash(tmp)), age, age); err != nil {
			t.Fatal(err)
		}
		return tmp
	}
	abandoned := []string{
		abandon("gitrepository/default/a/2.tar.gz", old),
		abandon(".cache/k2.tar.gz", old),
		abandon("gitrepository/default/a/latest.tar.gz", old),
	}
	writing := abandon("gitrepository/default/a/3.tar.gz", time.Now())
	// A user's dot file that merely looks alike is no temporary file.
	lookalike := "gitrepository/default/a/.notes.tmp-x"
	if err := os.WriteFile(filepath.Join(d.Path(), filepath.FromSlash(lookalike)), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(filepath.Join(d.Path(), filepath.FromSlash(lookalike)), old, old); err != nil {
		t.Fatal(err)
	}

	removed, err := d.SweepTemporary(ctx, time.Now().Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	slices.Sort(abandoned)
	if !slices.Equal(removed, abandoned) {
		t.Errorf("removed %v\nwant    %v", removed, abandoned)
	}
	for _, k := range append(abandoned, writing, lookalike, "gitrepository/default/a/1.tar.gz", "gitrepository/default/a/latest.tar.gz", ".cache/k.tar.gz", ".staging/j.tar") {
		_, err := os.Lstat(filepath.Join(d.Path(), filepath.FromSlash(k)))
		if want := !slices.Contains(abandoned, k); (err == nil) != want {
			t.Errorf("%s exists: %v, want %v", k, err == nil, want)
		}
	}
}

// TestDirKeepsStagingDir deletes the last staged file and an artifact: the
// artifact's emptied directories go, the staging directory stays for the
// next job, and what a Put returns describes what it stored.
func TestDirKeepsStagingDir(t *testing.T) {
	root := t.TempDir()
	d, err := NewDir(root)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	for _, key := range []string{StagingKey("job"), "gitrepository/ns/app/a.tar.gz"} {
		got, err := d.Put(ctx, key, strings.NewReader("content"))
		if err != nil {
			t.Fatal(err)
		}
		want, err := d.Stat(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if got != want || got.Size != int64(len("content")) {
			t.Errorf("put %s returned %+v, stat says %+v", key, got, want)
		}
		if err := d.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, StagingDir)); err != nil || !fi.IsDir() {
		t.Errorf("staging directory after its last file was deleted: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "gitrepository")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("an artifact's emptied directories stayed: %v", err)
	}
}

// TestDirDeleteLatestLeavesNothing deletes a source's artifact and latest
// pointer: the pointer's order record goes too, and with it every
// directory the source had, in its own tree and under OrderDir.
func TestDirDeleteLatestLeavesNothing(t *testing.T) {
	d, err := NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key, latest := "gitrepository/default/a/1.tar.gz", "gitrepository/default/a/"+LatestName
	if _, err := d.Put(ctx, key, strings.NewReader("one")); err != nil {
		t.Fatal(err)
	}
	if err := d.SetLatest(ctx, latest, key, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d.Path(), filepath.FromSlash(orderKey(latest)))); err != nil {
		t.Fatalf("order record: %v", err)
	}
	for _, k := range []string{latest, key} {
		if err := d.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := os.ReadDir(d.Path())
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Fatalf("storage holds %v after the source's deletion, want nothing", entries)
	}
}
