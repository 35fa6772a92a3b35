//go:build !unix

package workdir

import (
	"errors"
	"os"
)

// lockNow cannot lock without flock: every run directory looks held, so
// none is removed.
func lockNow(*os.File) error { return errors.ErrUnsupported }

// lockWait does nothing without flock.
func lockWait(*os.File) error { return nil }
