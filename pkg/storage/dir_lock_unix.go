//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package storage

import (
	"context"
	"errors"
	"os"
	"syscall"
	"time"
)

// lockFile takes an exclusive flock on f, polling without blocking so
// that the wait ends with ctx. The lock is dropped when f is closed, or
// when the process dies. On NFS the client turns it into a lock held on
// the server (released when a lost client's lease ends), which needs f
// open for writing.
func lockFile(ctx context.Context, f *os.File) error {
	delay := time.Millisecond
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, 50*time.Millisecond)
	}
}
