package storage

import (
	"context"
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
