//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package storage

import (
	"context"
	"os"
)

// lockFile locks nothing here: SetLatest is serialised within the process
// only, so replicas must not share a Dir on this platform.
func lockFile(context.Context, *os.File) error { return nil }
