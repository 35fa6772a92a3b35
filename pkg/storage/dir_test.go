package storage

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
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
