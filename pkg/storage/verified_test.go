package storage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

// opensCounted counts the objects opened (read through) in a Storage.
type opensCounted struct {
	Storage
	opens atomic.Int64
}

func (s *opensCounted) Open(ctx context.Context, key string) (Object, error) {
	s.opens.Add(1)
	return s.Storage.Open(ctx, key)
}

// verifiedFixture is directory storage holding one object, counted.
func verifiedFixture(t *testing.T, content string) (*Dir, *opensCounted, string, string) {
	t.Helper()
	d, err := NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const key = "widget/ns/w/a.tar.gz"
	if _, err := d.Put(context.Background(), key, strings.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	return d, &opensCounted{Storage: d}, key, digest.SHA256.FromString(content).String()
}

// TestVerifiedReadsAnUnchangedObjectOnce checks an intact object again and
// again: it is read the first time only, while storage describes it the
// same way and the interval lasts; then once more when the interval has
// passed, which finds damage that kept its size and modification time.
func TestVerifiedReadsAnUnchangedObjectOnce(t *testing.T) {
	d, s, key, want := verifiedFixture(t, "artifact bytes")
	ctx := context.Background()
	now := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	v := &Verified{Interval: time.Hour, Now: func() time.Time { return now }}
	for i := range 3 {
		if err := v.Verify(ctx, s, key, want); err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
	}
	if n := s.opens.Load(); n != 1 {
		t.Fatalf("the object was read %d times in three checks, want 1", n)
	}

	// Bit rot: the same size and modification time, other bytes.
	file := filepath.Join(d.Path(), filepath.FromSlash(key))
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("artifact byteZ"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(file, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(ctx, s, key, want); err != nil {
		t.Fatalf("within the interval: %v, want the remembered verification", err)
	}
	now = now.Add(time.Hour)
	var mismatch *DigestMismatchError
	if err := v.Verify(ctx, s, key, want); !errors.As(err, &mismatch) {
		t.Fatalf("after the interval: %v, want a digest mismatch", err)
	}
	// A failed check is not remembered: the next one reads again.
	opens := s.opens.Load()
	if err := v.Verify(ctx, s, key, want); !errors.As(err, &mismatch) {
		t.Fatalf("again: %v, want a digest mismatch", err)
	}
	if n := s.opens.Load(); n != opens+1 {
		t.Errorf("a corrupt object was read %d times in one check, want 1", n-opens)
	}
}

// TestVerifiedCatchesAReplacedObject replaces a verified object by one of
// another size, then deletes it: each is caught at the next check.
func TestVerifiedCatchesAReplacedObject(t *testing.T) {
	d, s, key, want := verifiedFixture(t, "artifact bytes")
	ctx := context.Background()
	v := &Verified{Interval: time.Hour}
	if err := v.Verify(ctx, s, key, want); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Put(ctx, key, strings.NewReader("truncated")); err != nil {
		t.Fatal(err)
	}
	var mismatch *DigestMismatchError
	if err := v.Verify(ctx, s, key, want); !errors.As(err, &mismatch) {
		t.Fatalf("replaced: %v, want a digest mismatch", err)
	}
	if err := d.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(ctx, s, key, want); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted: %v, want ErrNotFound", err)
	}
}

// TestVerifiedOff: a nil Verified and a zero Interval read the object at
// every check, as the package's Verify does.
func TestVerifiedOff(t *testing.T) {
	for name, v := range map[string]*Verified{"nil": nil, "zero interval": {}} {
		t.Run(name, func(t *testing.T) {
			_, s, key, want := verifiedFixture(t, "artifact bytes")
			for range 3 {
				if err := v.Verify(context.Background(), s, key, want); err != nil {
					t.Fatal(err)
				}
			}
			if n := s.opens.Load(); n != 3 {
				t.Errorf("the object was read %d times in three checks, want 3", n)
			}
		})
	}
}

// TestVerifiedIsBounded remembers more objects than the bound: the oldest
// past the interval go first, then any; the newest is kept.
func TestVerifiedIsBounded(t *testing.T) {
	now := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	v := &Verified{Interval: time.Hour, Now: func() time.Time { return now }}
	info := Info{Size: 1, ETag: "e"}
	for i := range maxVerified + 10 {
		v.remember(fmt.Sprintf("k%d", i), "d", info)
	}
	if n := len(v.entries); n > maxVerified {
		t.Fatalf("%d entries remembered, want at most %d", n, maxVerified)
	}
	last := fmt.Sprintf("k%d", maxVerified+9)
	if !v.fresh(last, "d", info) {
		t.Errorf("the newest entry was forgotten")
	}
	now = now.Add(2 * time.Hour)
	v.remember("new", "d", info)
	if n := len(v.entries); n != 1 {
		t.Errorf("%d entries after the interval passed for all but one, want 1", n)
	}
}
