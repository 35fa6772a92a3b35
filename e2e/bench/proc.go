package bench

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of the CPU times in /proc/<pid>/stat (USER_HZ,
// which is 100 on every Linux architecture Go supports).
const clockTick = 10 * time.Millisecond

// cpuTimes are the CPU times of a process.
type cpuTimes struct {
	// own is user plus system time of the process itself.
	own time.Duration
	// children is the same for the children it has waited for (the git
	// server's http-backend processes, a service's git).
	children time.Duration
}

// total is the process's CPU time with its waited-for children's.
func (c cpuTimes) total() time.Duration { return c.own + c.children }

// procCPU returns the CPU times of a process.
func procCPU(pid int) (cpuTimes, error) {
	fields, err := statFields(pid)
	if err != nil {
		return cpuTimes{}, err
	}
	// Fields after the command, counted from 0 = state (field 3 in
	// proc(5)): utime is 11, stime 12, cutime 13, cstime 14.
	if len(fields) < 15 {
		return cpuTimes{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields))
	}
	var ticks [4]int64
	for i, f := range fields[11:15] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return cpuTimes{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks[i] = n
	}
	return cpuTimes{
		own:      time.Duration(ticks[0]+ticks[1]) * clockTick,
		children: time.Duration(ticks[2]+ticks[3]) * clockTick,
	}, nil
}

// statFields returns the fields of /proc/<pid>/stat that follow the
// command name (which may itself hold spaces and parentheses).
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, fmt.Errorf("process %d: %w", pid, err)
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	return strings.Fields(string(b[i+1:])), nil
}

// procStatus returns the named fields of /proc/<pid>/status in bytes
// (VmHWM, VmRSS: the kernel writes them in kB).
func procStatus(pid int, names ...string) (map[string]uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, fmt.Errorf("process %d: %w", pid, err)
	}
	out := make(map[string]uint64, len(names))
	for line := range strings.Lines(string(b)) {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		for _, want := range names {
			if name != want {
				continue
			}
			f := strings.Fields(rest)
			if len(f) == 0 {
				return nil, fmt.Errorf("/proc/%d/status: empty %s", pid, name)
			}
			kb, err := strconv.ParseUint(f[0], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("/proc/%d/status %s: %w", pid, name, err)
			}
			out[name] = kb * 1024
		}
	}
	for _, want := range names {
		if _, ok := out[want]; !ok {
			return nil, fmt.Errorf("/proc/%d/status: no %s", pid, want)
		}
	}
	return out, nil
}

// machineCPU returns the CPU time the whole machine has been busy (every
// state of the first line of /proc/stat but idle and iowait) and the number
// of CPUs.
func machineCPU() (busy time.Duration, cpus int, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, fmt.Errorf("machine CPU: %w", err)
	}
	var total int64
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		switch {
		case len(f) > 4 && f[0] == "cpu":
			// user nice system idle iowait irq softirq steal guest guest_nice;
			// guest time is already counted in user.
			for i, v := range f[1:] {
				if i == 3 || i == 4 || i >= 8 {
					continue
				}
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, 0, fmt.Errorf("machine CPU: %w", err)
				}
				total += n
			}
		case len(f) > 0 && strings.HasPrefix(f[0], "cpu"):
			cpus++
		}
	}
	if cpus == 0 {
		return 0, 0, errors.New("machine CPU: no cpu line in /proc/stat")
	}
	return time.Duration(total) * clockTick, cpus, nil
}

// peakRSS returns the process's resident-set high-water mark (VmHWM).
func peakRSS(pid int) (uint64, error) {
	m, err := procStatus(pid, "VmHWM")
	if err != nil {
		return 0, err
	}
	return m["VmHWM"], nil
}

// resetPeakRSS sets the process's VmHWM back to its current RSS, so the
// next reading is the peak of what follows (proc(5), clear_refs value 5).
func resetPeakRSS(pid int) error {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		return fmt.Errorf("reset peak RSS of %d: %w", pid, err)
	}
	return nil
}

// childrenByName returns the pids of this process's children whose command
// (comm) is one of names: the kube-apiserver and etcd envtest started.
func childrenByName(names ...string) (map[string]int, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	found := map[string]int{}
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(d, "comm"))
		if err != nil {
			continue // exited meanwhile
		}
		name := strings.TrimSpace(string(comm))
		want := false
		for _, n := range names {
			want = want || n == name
		}
		if !want {
			continue
		}
		fields, err := statFields(pid)
		if err != nil || len(fields) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid == self {
			found[name] = pid
		}
	}
	var missing []string
	for _, n := range names {
		if _, ok := found[n]; !ok {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return found, errors.New("no child process named " + strings.Join(missing, ", "))
	}
	return found, nil
}
