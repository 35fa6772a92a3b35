package workdir

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestOpen checks that a process's run directory survives another
// process's start while it lives, and that one left by a dead process
// (unlocked, with a job's scratch data in it) is removed by the next start.
func TestOpen(t *testing.T) {
	root := filepath.Join(t.TempDir(), "headwater-fetcher")
	live, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(live.Removed) != 0 {
		t.Errorf("first Open removed %v", live.Removed)
	}
	dead := filepath.Join(root, runPrefix+"dead")
	if err := os.MkdirAll(filepath.Join(dead, "fetch-1", "repo"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dead, "fetch-1", "repo", "README.md"), []byte("left behind"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(root, "not-a-run")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}

	next, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(next.Removed, []string{dead}) {
		t.Errorf("second Open removed %v, want %v", next.Removed, []string{dead})
	}
	for p, want := range map[string]bool{dead: false, live.Path: true, next.Path: true, other: true} {
		if _, err := os.Stat(p); (err == nil) != want {
			t.Errorf("%s exists: %v, want %v", p, err == nil, want)
		}
	}
	if next.Path == live.Path {
		t.Fatalf("both processes got %s", live.Path)
	}

	for _, d := range []*Dir{live, next} {
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(d.Path); !os.IsNotExist(err) {
			t.Errorf("%s still exists after Close: %v", d.Path, err)
		}
	}
}
