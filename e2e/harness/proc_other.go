//go:build !linux

package harness

import (
	"os/exec"
	"syscall"
)

// sysProcAttr returns no special attributes outside Linux.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// killGroup kills the service process.
func killGroup(cmd *exec.Cmd) { _ = cmd.Process.Kill() }
