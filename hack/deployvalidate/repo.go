package deployvalidate

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// Services are Headwater's services: each is built from services/<name> and
// runs in a container of the same name.
var Services = []string{"watcher", "fetcher", "packager", "artifact-server"}

// OptionalServices are built and run like Services, but deployed by a
// component of their own: the webhook receiver (components/receivers, the
// compose profile "receivers") and the dispatcher (components/dispatcher).
var OptionalServices = []string{"receiver", "dispatcher"}

// IsService reports whether name is one of Services or OptionalServices.
func IsService(name string) bool {
	for _, s := range slices.Concat(Services, OptionalServices) {
		if s == name {
			return true
		}
	}
	return false
}

// RepoRoot returns the repository root: the nearest directory at or above
// dir that holds go.work.
func RepoRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("repository root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("repository root: %w", err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repository root: no go.work above the working directory")
		}
		dir = parent
	}
}
