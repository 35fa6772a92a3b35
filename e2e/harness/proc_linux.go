package harness

import (
	"os/exec"
	"syscall"
)

// sysProcAttr puts a service in its own process group, so a Ctrl-C in the
// terminal reaches only the runner, which stops the services in order; and
// has the kernel kill the service if the runner dies without stopping it
// (a test binary that panics or times out), so no process is left behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup kills the process group the service leads, so nothing it
// started survives it.
func killGroup(cmd *exec.Cmd) {
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
		_ = cmd.Process.Kill()
	}
}
