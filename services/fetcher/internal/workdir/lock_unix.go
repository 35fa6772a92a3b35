//go:build unix

package workdir

import (
	"os"
	"syscall"
)

// lockNow takes an exclusive advisory lock on f without waiting; the
// kernel releases it when f is closed or the process exits, however it
// exits.
func lockNow(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}

// lockWait takes an exclusive advisory lock on f, waiting for it.
func lockWait(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
}
