package process

import "syscall"

// sysProcAttr kills the server when the test process dies without cleaning
// up (a panic or a test timeout), so no MinIO outlives its test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
