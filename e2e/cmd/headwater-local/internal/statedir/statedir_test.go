package statedir

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestPrepareClearsAndLocks(t *testing.T) {
	dir := filepath.Join(t.TempDir(), ".run")
	if err := os.MkdirAll(filepath.Join(dir, "storage", "gitrepository"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kubeconfig"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}

	release, err := Prepare(dir)
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != lockName {
		t.Errorf("after Prepare the directory holds %v, want only %s", entries, lockName)
	}

	if _, err := Prepare(dir); !errors.Is(err, ErrInUse) {
		t.Errorf("second Prepare while locked: got %v, want ErrInUse", err)
	}
	release()
	release2, err := Prepare(dir)
	if err != nil {
		t.Fatalf("Prepare after release: %v", err)
	}
	release2()
}
