package harness

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/quictun/quictun/internal/procstat"
)

// Proc is a long-running process started inside a namespace.
type Proc struct {
	Name string
	ns   string
	bin  string
	args []string
	env  []string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	log  *os.File
}

// nsCommand is bin with args run inside namespace ns (via `ip netns exec`,
// which execs, so the PID is the binary's), or in this namespace when ns is "".
func nsCommand(ns, bin string, args ...string) (name string, full []string) {
	if ns == "" {
		return bin, args
	}
	return "ip", append([]string{"netns", "exec", ns, bin}, args...)
}

// StartProc starts bin with args inside namespace ns ("": this one), logging
// to logPath. env, if not nil, is added to the inherited environment.
func StartProc(name, ns, logPath, bin string, args ...string) (*Proc, error) {
	return startProcEnv(name, ns, logPath, nil, bin, args...)
}

func startProcEnv(name, ns, logPath string, env []string, bin string, args ...string) (*Proc, error) {
	// Appended to: a restarted daemon (each loss sample starts its
	// variant afresh) keeps the logs of the runs before it, so that a
	// daemon that died in one sample leaves its last words.
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create log %s: %w", logPath, err)
	}
	prog, full := nsCommand(ns, bin, args...)
	cmd := exec.Command(prog, full...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	fmt.Fprintf(lf, "# %s %s %s\n", strings.Join(env, " "), prog, strings.Join(full, " "))
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, ns: ns, bin: bin, args: args, env: env, cmd: cmd, done: make(chan struct{}), log: lf}
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
	return startProcEnv(p.Name, p.ns, logPath, p.env, p.bin, p.args...)
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
				if v, err := procstat.RSSBytes(pid); err == nil && v > s.peak[pid] {
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
	prog, full := nsCommand(ns, bin, args...)
	cmd := exec.CommandContext(ctx, prog, full...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = logw
	fmt.Fprintf(logw, "# %s %s\n", prog, strings.Join(full, " "))
	err := cmd.Run()
	return stdout.Bytes(), err
}
