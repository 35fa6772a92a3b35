//go:build unix

package statedir

import (
	"os"
	"syscall"
)

// lock takes an exclusive advisory lock on f without waiting; the kernel
// releases it when the process exits, however it exits.
func lock(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}
