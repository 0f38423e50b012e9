package harness

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime/stime in /proc/PID/stat; it is
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// Proc is a long-running process started inside a namespace.
type Proc struct {
	Name string
	ns   string
	bin  string
	args []string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	log  *os.File
}

// StartProc starts bin with args inside namespace ns (via `ip netns exec`,
// which execs, so the PID is the binary's), logging to logPath.
func StartProc(name, ns, logPath, bin string, args ...string) (*Proc, error) {
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create log %s: %w", logPath, err)
	}
	full := append([]string{"netns", "exec", ns, bin}, args...)
	cmd := exec.Command("ip", full...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	fmt.Fprintf(lf, "# ip %s\n", strings.Join(full, " "))
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, ns: ns, bin: bin, args: args, cmd: cmd, done: make(chan struct{}), log: lf}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Restart stops p (see Stop) and starts the same command again, logging to
// logPath; it returns the new process.
func (p *Proc) Restart(grace time.Duration, logPath string) (*Proc, error) {
	p.Stop(grace)
	return StartProc(p.Name, p.ns, logPath, p.bin, p.args...)
}

// PID returns the process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Exited tells whether the process has ended, and how.
func (p *Proc) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM to the process group, then SIGKILL after grace.
func (p *Proc) Stop(grace time.Duration) {
	defer p.log.Close()
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.done
}

// CPUSeconds returns user+system CPU time of pid so far.
func CPUSeconds(pid int) (float64, error) {
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
	return parseVmRSS(f)
}

func parseVmRSS(r io.Reader) (int64, error) {
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

// rssSampler records the peak RSS of a set of processes while it runs.
type rssSampler struct {
	once sync.Once
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	peak map[int]int64
}

func sampleRSS(pids []int, every time.Duration) *rssSampler {
	s := &rssSampler{stop: make(chan struct{}), peak: map[int]int64{}}
	s.wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			s.mu.Lock()
			for _, pid := range pids {
				if v, err := RSSBytes(pid); err == nil && v > s.peak[pid] {
					s.peak[pid] = v
				}
			}
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	})
	return s
}

// Stop ends the sampling (idempotent) and returns the peaks.
func (s *rssSampler) Stop() map[int]int64 {
	s.once.Do(func() { close(s.stop) })
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}

// runInNS runs a short-lived command inside ns and returns its stdout.
// Its stderr goes to logw. ctx bounds it.
func runInNS(ctx context.Context, ns string, logw io.Writer, bin string, args ...string) ([]byte, error) {
	full := append([]string{"netns", "exec", ns, bin}, args...)
	cmd := exec.CommandContext(ctx, "ip", full...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = logw
	fmt.Fprintf(logw, "# ip %s\n", strings.Join(full, " "))
	err := cmd.Run()
	return stdout.Bytes(), err
}
