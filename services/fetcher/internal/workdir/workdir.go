// Package workdir gives a fetcher process a scratch directory of its own
// and removes the ones processes that died left behind.
//
// A fetcher clones, downloads and extracts into temporary directories it
// removes when a job ends; a process killed mid-job (SIGKILL, the OOM
// killer, a node losing power) cannot, and its directories would stay in
// the pod's emptyDir, which survives the container's restart, until the
// disk is full. So every process works in a run directory it holds an
// advisory lock on (the kernel drops it when the process dies, however it
// dies), and at start-up removes every run directory whose lock it can
// take: no live process holds those.
package workdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// runPrefix starts the name of every run directory.
const runPrefix = "run-"

// Dir is a process's run directory under a work directory.
type Dir struct {
	// Path is the run directory.
	Path string
	// Removed are the run directories of dead processes Open removed.
	Removed []string

	held *os.File // the run directory, locked while the process lives
}

// Open creates a run directory for this process under root (created if
// missing), locks it, and removes every other run directory under root
// that no live process holds. Creating and sweeping happen under a lock
// on root, so two processes starting at once never take each other's
// fresh directory for a dead one's.
func Open(root string) (_ *Dir, err error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("work directory: %w", err)
	}
	guard, err := os.OpenFile(filepath.Join(root, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("work directory: %w", err)
	}
	defer guard.Close() // closing releases the lock
	if err := lockWait(guard); err != nil {
		return nil, fmt.Errorf("work directory %s: lock: %w", root, err)
	}

	d := &Dir{}
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("work directory: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), runPrefix) {
			continue
		}
		p := filepath.Join(root, e.Name())
		dead, err := unheld(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !dead {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", p, err))
			continue
		}
		d.Removed = append(d.Removed, p)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("work directory %s: %w", root, err)
	}

	if d.Path, err = os.MkdirTemp(root, runPrefix); err != nil {
		return nil, fmt.Errorf("work directory: %w", err)
	}
	if d.held, err = os.Open(d.Path); err != nil {
		return nil, fmt.Errorf("work directory: %w", err)
	}
	if err := lockNow(d.held); err != nil && !errors.Is(err, errors.ErrUnsupported) {
		_ = d.held.Close()
		return nil, fmt.Errorf("work directory %s: lock: %w", d.Path, err)
	}
	return d, nil
}

// unheld reports whether no process holds the run directory p, leaving it
// unlocked either way.
func unheld(p string) (bool, error) {
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("open %s: %w", p, err)
	}
	defer f.Close() // closing releases a lock taken here
	return lockNow(f) == nil, nil
}

// Close removes the run directory and releases it.
func (d *Dir) Close() error {
	err := os.RemoveAll(d.Path)
	if cerr := d.held.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("work directory: %w", err)
	}
	return nil
}
