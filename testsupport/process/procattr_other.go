//go:build !linux

package process

import "syscall"

// sysProcAttr has nothing to add outside Linux, which alone has Pdeathsig.
func sysProcAttr() *syscall.SysProcAttr { return nil }
