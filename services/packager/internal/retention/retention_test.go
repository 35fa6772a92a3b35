package retention

import (
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/headwater-gitops/headwater/pkg/storage"
	"github.com/headwater-gitops/headwater/testsupport/miniotest"
)

var now = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// objs describes artifacts by name and age.
func objs(ages map[string]time.Duration) []storage.Info {
	var out []storage.Info
	for name, age := range ages {
		out = append(out, storage.Info{Key: "d/" + name, ModTime: now.Add(-age), ETag: name})
	}
	slices.SortFunc(out, func(a, b storage.Info) int { return strings.Compare(a.Key, b.Key) })
	return out
}

func keys(in []storage.Info) []string {
	var out []string
	for _, o := range in {
		out = append(out, strings.TrimPrefix(o.Key, "d/"))
	}
	return out
}

func TestSelect(t *testing.T) {
	tests := []struct {
		name   string
		ages   map[string]time.Duration
		policy Policy
		keep   []string
		want   []string // deleted, newest first
	}{
		{
			name:   "nothing stored",
			policy: Policy{Records: 2, TTL: time.Minute},
		},
		{
			name:   "no more than the records",
			ages:   map[string]time.Duration{"a": time.Hour, "b": 2 * time.Hour},
			policy: Policy{Records: 2, TTL: time.Minute},
		},
		{
			name:   "oldest beyond the records go",
			ages:   map[string]time.Duration{"a": time.Hour, "b": 2 * time.Hour, "c": 3 * time.Hour, "d": 4 * time.Hour},
			policy: Policy{Records: 2, TTL: time.Minute},
			want:   []string{"c", "d"},
		},
		{
			name:   "younger than the TTL stay beyond the records",
			ages:   map[string]time.Duration{"a": 0, "b": 10 * time.Second, "c": 50 * time.Second, "d": 2 * time.Minute},
			policy: Policy{Records: 1, TTL: time.Minute},
			want:   []string{"d"},
		},
		{
			name:   "exactly the TTL old goes",
			ages:   map[string]time.Duration{"a": 0, "b": time.Minute},
			policy: Policy{Records: 1, TTL: time.Minute},
			want:   []string{"b"},
		},
		{
			name:   "old artifacts within the records stay whatever their age",
			ages:   map[string]time.Duration{"a": 100 * time.Hour, "b": 200 * time.Hour},
			policy: Policy{Records: 2, TTL: time.Minute},
		},
		{
			name:   "kept ones stay beyond the records and the TTL",
			ages:   map[string]time.Duration{"a": 0, "b": time.Hour, "c": 2 * time.Hour, "d": 3 * time.Hour},
			policy: Policy{Records: 1, TTL: time.Minute},
			keep:   []string{"c"},
			want:   []string{"b", "d"},
		},
		{
			name:   "zero records keeps only the young and the kept",
			ages:   map[string]time.Duration{"a": 0, "b": time.Hour, "c": 2 * time.Hour},
			policy: Policy{Records: 0, TTL: time.Minute},
			keep:   []string{"b"},
			want:   []string{"c"},
		},
		{
			name:   "zero TTL deletes all beyond the records",
			ages:   map[string]time.Duration{"a": 0, "b": time.Nanosecond, "c": time.Second},
			policy: Policy{Records: 1},
			want:   []string{"b", "c"},
		},
		{
			name:   "equal times break ties by name, the greater newer",
			ages:   map[string]time.Duration{"a": time.Hour, "b": time.Hour, "c": time.Hour},
			policy: Policy{Records: 1, TTL: time.Minute},
			want:   []string{"b", "a"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keep := func(o storage.Info) bool { return slices.Contains(tt.keep, strings.TrimPrefix(o.Key, "d/")) }
			got := keys(Select(objs(tt.ages), tt.policy, now, keep))
			if !slices.Equal(got, tt.want) {
				t.Errorf("deleted %q, want %q", got, tt.want)
			}
		})
	}
}

func TestCollect(t *testing.T) {
	const dir = "gitrepository/default/podinfo"
	tests := []struct {
		name    string
		ages    map[string]time.Duration
		latest  string
		current string
		policy  Policy
		want    []string // left in the directory
	}{
		{
			name:    "keeps the newest, the current and the latest target",
			ages:    map[string]time.Duration{"new": 0, "a": time.Hour, "b": 2 * time.Hour, "c": 3 * time.Hour, "d": 4 * time.Hour},
			latest:  "c",
			current: "b",
			policy:  Policy{Records: 2, TTL: time.Minute},
			want:    []string{"a", "b", "c", "latest.tar.gz", "new"},
		},
		{
			name:    "without a latest pointer",
			ages:    map[string]time.Duration{"new": 0, "a": time.Hour, "b": 2 * time.Hour},
			current: "new",
			policy:  Policy{Records: 1, TTL: time.Minute},
			want:    []string{"new"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			s, err := storage.NewDir(root)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			for name, age := range tt.ages {
				key := dir + "/" + name
				if _, err := s.Put(ctx, key, strings.NewReader(name)); err != nil {
					t.Fatal(err)
				}
				mt := time.Now().Add(-age)
				if err := os.Chtimes(filepath.Join(root, filepath.FromSlash(key)), mt, mt); err != nil {
					t.Fatal(err)
				}
			}
			if tt.latest != "" {
				if err := s.SetLatest(ctx, dir+"/"+storage.LatestName, dir+"/"+tt.latest, time.Now()); err != nil {
					t.Fatal(err)
				}
			}
			deleted, err := Collect(ctx, s, dir, dir+"/"+tt.current, tt.policy, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			entries, err := os.ReadDir(filepath.Join(root, filepath.FromSlash(dir)))
			if err != nil {
				t.Fatal(err)
			}
			var left []string
			for _, e := range entries {
				left = append(left, e.Name())
			}
			if !slices.Equal(left, tt.want) {
				t.Errorf("left %q, want %q", left, tt.want)
			}
			if len(deleted)+len(left) != len(tt.ages)+btoi(tt.latest != "") {
				t.Errorf("deleted %q, left %q: they do not add up", deleted, left)
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestCollectKeepsLatestTargetOnS3 collects a source on MinIO whose
// artifacts were uploaded in parts (over 1 MiB), as a late job leaves it:
// the pointer at the artifact the status names, which is neither the one
// just stored (current) nor, with no records kept and no grace period,
// kept by count or age. The pointer is a copy whose ETag is not its
// target's, so retention recognising the target by ETag deleted it; by the
// name its order record gives, it stays.
func TestCollectKeepsLatestTargetOnS3(t *testing.T) {
	s := minioStorage(t)
	ctx := context.Background()
	const dir = "gitrepository/default/podinfo"
	rnd := rand.NewChaCha8([32]byte{})
	for _, name := range []string{"status.tar.gz", "late.tar.gz", "old.tar.gz"} {
		if _, err := s.Put(ctx, dir+"/"+name, io.LimitReader(rnd, 2<<20)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetLatest(ctx, dir+"/"+storage.LatestName, dir+"/status.tar.gz", time.Now()); err != nil {
		t.Fatal(err)
	}
	deleted, err := Collect(ctx, s, dir, dir+"/late.tar.gz", Policy{}, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(deleted, []string{dir + "/old.tar.gz"}) {
		t.Errorf("deleted %q, want only %s/old.tar.gz", deleted, dir)
	}
	if _, err := s.Stat(ctx, dir+"/status.tar.gz"); err != nil {
		t.Errorf("the latest pointer's target: %v", err)
	}
}

// TestCollectKeepsLegacyLatestTargetOnS3 collects a source whose pointer
// was set before order records were kept (a copy, no record): its target
// is recognised by ETag, as before.
func TestCollectKeepsLegacyLatestTargetOnS3(t *testing.T) {
	s := minioStorage(t)
	ctx := context.Background()
	const dir = "gitrepository/default/podinfo"
	for _, name := range []string{"target.tar.gz", "current.tar.gz", "old.tar.gz"} {
		if _, err := s.Put(ctx, dir+"/"+name, strings.NewReader(name)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Copy(ctx, dir+"/target.tar.gz", dir+"/"+storage.LatestName); err != nil {
		t.Fatal(err)
	}
	deleted, err := Collect(ctx, s, dir, dir+"/current.tar.gz", Policy{}, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(deleted, []string{dir + "/old.tar.gz"}) {
		t.Errorf("deleted %q, want only %s/old.tar.gz", deleted, dir)
	}
}

// minioStorage is S3 storage on a bucket of a MinIO server of its own.
func minioStorage(t *testing.T) *storage.S3 {
	t.Helper()
	srv := miniotest.New(t)
	srv.MakeBucket(t, "artifacts")
	s, err := storage.NewS3(srv.Client, "artifacts", "")
	if err != nil {
		t.Fatal(err)
	}
	return s
}
