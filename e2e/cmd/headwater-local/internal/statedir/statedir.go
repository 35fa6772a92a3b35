// Package statedir prepares the directory `make run` keeps its state in:
// it makes sure only one runner uses it, and clears what a previous run left.
package statedir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// lockName is the lock file inside the state directory; it survives clearing.
const lockName = ".lock"

// ErrInUse is returned when another runner holds the state directory.
var ErrInUse = errors.New("state directory in use")

// Prepare creates dir if needed, locks it for this process and removes
// everything a previous run left in it. Call release when done; the state
// itself is left in place for inspection.
func Prepare(dir string) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("state directory lock: %w", err)
	}
	if err := lock(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("%w: %s: another headwater-local is running (%w)", ErrInUse, dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("state directory: %w", err)
	}
	for _, e := range entries {
		if e.Name() == lockName {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("clear state directory: %w", err)
		}
	}
	return func() { _ = f.Close() }, nil
}
