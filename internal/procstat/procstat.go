// Package procstat reads a process's CPU time and resident memory from
// /proc, for the benchmark harness and the tests that report them.
package procstat

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// clockTicks is USER_HZ, the unit of utime/stime in /proc/PID/stat; it is
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// CPUSeconds returns the user+system CPU time pid has used so far, every
// thread's, those that ended included. It reads the kernel's CPU clock of the
// process (clock_gettime, nanoseconds) and falls back to /proc/PID/stat, which
// counts whole 10 ms ticks: too coarse for a benchmark sample of a second in
// which a daemon uses a few milliseconds.
func CPUSeconds(pid int) (float64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(processCPUClock(pid), &ts); err == nil {
		return float64(ts.Nano()) / 1e9, nil
	}
	return statCPUSeconds(pid)
}

// processCPUClock is the clock ID of pid's CPU clock, the kernel's
// MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED), what clock_getcpuclockid(3)
// returns.
func processCPUClock(pid int) int32 {
	const cpuClockSched = 2
	return int32(^pid<<3 | cpuClockSched)
}

// statCPUSeconds reads utime+stime from /proc/PID/stat.
func statCPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read stat of %d: %w", pid, err)
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse stat of %d: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime is field 14, stime 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("parse stat of %d: %d fields", pid, len(f))
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("parse stat of %d: %w", pid, err)
	}
	return float64(u+s) / clockTicks, nil
}

// RSSBytes returns the resident set size of pid.
func RSSBytes(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("open status of %d: %w", pid, err)
	}
	defer f.Close()
	return ParseVmRSS(f)
}

// ParseVmRSS reads the VmRSS line of a /proc/PID/status file, in bytes.
func ParseVmRSS(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			fs := strings.Fields(rest)
			if len(fs) != 2 || fs[1] != "kB" {
				return 0, fmt.Errorf("parse VmRSS %q", line)
			}
			kb, err := strconv.ParseInt(fs[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse VmRSS: %w", err)
			}
			return kb * 1024, nil
		}
	}
	return 0, errors.New("no VmRSS line")
}

// ContextSwitches returns the voluntary and involuntary context switches of
// every thread of pid so far (each thread's /proc/PID/task/TID/status): a
// voluntary switch is a thread going to sleep, so their count tells how often
// a process blocked and had to be woken.
func ContextSwitches(pid int) (voluntary, involuntary int64, err error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("list threads of %d: %w", pid, err)
	}
	for _, t := range tasks {
		f, err := os.Open(fmt.Sprintf("/proc/%d/task/%s/status", pid, t.Name()))
		if err != nil {
			continue // the thread ended
		}
		v, iv := parseSwitches(f)
		_ = f.Close()
		voluntary += v
		involuntary += iv
	}
	return voluntary, involuntary, nil
}

func parseSwitches(r io.Reader) (voluntary, involuntary int64) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "voluntary_ctxt_switches":
			voluntary = n
		case "nonvoluntary_ctxt_switches":
			involuntary = n
		}
	}
	return voluntary, involuntary
}
