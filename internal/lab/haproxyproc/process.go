// Package haproxyproc runs a real HAProxy for tests, the demo and the
// benchmark: a config on disk, the process in the foreground, readiness
// polled on its runtime socket, and its output kept for when something
// fails.
package haproxyproc

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/logbuf"
)

// Binary is the haproxy executable: $HAPROXY_BIN, else "haproxy" on PATH.
func Binary() string {
	if b := os.Getenv("HAPROXY_BIN"); b != "" {
		return b
	}
	return "haproxy"
}

// Process is one running HAProxy.
type Process struct {
	Dir, Config, Socket string

	cmd  *exec.Cmd
	out  *logbuf.Buffer
	done chan error
	cpus string // taskset's CPU list; "" unpinned
	// masterWorker runs HAProxy as Debian's unit does (-Ws): a master
	// process that forks the worker, and reloads on SIGUSR2 by forking a
	// new one.
	masterWorker bool
}

// Start writes config to dir/haproxy.cfg, checks it, starts HAProxy and
// waits until the runtime socket at socket answers.
func Start(ctx context.Context, dir, config, socket string) (*Process, error) {
	return StartOn(ctx, dir, config, socket, "")
}

// StartOn is Start with HAProxy pinned to cpus (taskset's list, "3" or
// "2-3"); "" leaves it where the scheduler puts it.
func StartOn(ctx context.Context, dir, config, socket, cpus string) (*Process, error) {
	return start(ctx, &Process{Dir: dir, Config: filepath.Join(dir, "haproxy.cfg"), Socket: socket, out: &logbuf.Buffer{}, cpus: cpus}, config)
}

// StartMasterWorker is Start in master-worker mode, as Debian's systemd
// unit runs HAProxy (haproxy -Ws): the runtime socket reaches the worker,
// and Reload is the unit's `systemctl reload`, SIGUSR2 to the master.
func StartMasterWorker(ctx context.Context, dir, config, socket string) (*Process, error) {
	return start(ctx, &Process{Dir: dir, Config: filepath.Join(dir, "haproxy.cfg"), Socket: socket, out: &logbuf.Buffer{}, masterWorker: true}, config)
}

func start(ctx context.Context, p *Process, config string) (*Process, error) {
	if err := os.WriteFile(p.Config, []byte(config), 0o644); err != nil {
		return nil, err
	}
	if out, err := exec.CommandContext(ctx, Binary(), "-c", "-q", "-f", p.Config).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("haproxy -c: %v\n%s", err, out)
	}
	if err := p.start(); err != nil {
		return nil, err
	}
	if err := p.waitReady(ctx); err != nil {
		p.Stop()
		return nil, fmt.Errorf("%w\n%s", err, p.Log())
	}
	return p, nil
}

func (p *Process) start(extra ...string) error {
	mode := "-db"
	if p.masterWorker {
		mode = "-Ws" // foreground too, and the master forks the worker
	}
	args := append([]string{mode, "-f", p.Config}, extra...)
	p.cmd = exec.Command(Binary(), args...)
	if p.cpus != "" {
		// taskset execs HAProxy in its own process: the pid stays HAProxy's.
		p.cmd = exec.Command("taskset", append([]string{"-c", p.cpus, Binary()}, args...)...)
	}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("start haproxy: %w", err)
	}
	p.done = make(chan error, 1)
	go func(cmd *exec.Cmd, done chan error) { done <- cmd.Wait() }(p.cmd, p.done)
	return nil
}

func (p *Process) waitReady(ctx context.Context) error {
	c, err := haproxy.New(p.Socket)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.Run(cctx, "show info")
		cancel()
		if err == nil {
			return nil
		}
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("haproxy exited before it was ready: %v", err)
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("haproxy not ready on %s: %v", p.Socket, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Pid is the running process's id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Restart stops HAProxy and starts it again from the same config: a full
// restart that loses every runtime change.
func (p *Process) Restart(ctx context.Context) error {
	p.Stop()
	if err := p.start(); err != nil {
		return err
	}
	return p.waitReady(ctx)
}

// Reload starts a new HAProxy from the same config with -sf: the new
// process takes the listeners and the socket, the old one finishes its
// connections and exits. Runtime changes are lost, as in production.
func (p *Process) Reload(ctx context.Context) error {
	if p.masterWorker {
		return p.reloadMaster(ctx)
	}
	old, oldDone := p.cmd, p.done
	if err := p.start("-sf", fmt.Sprint(old.Process.Pid)); err != nil {
		return err
	}
	go func() {
		select {
		case err := <-oldDone:
			oldDone <- err
		case <-time.After(10 * time.Second):
			_ = old.Process.Kill()
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	c, err := haproxy.New(p.Socket)
	if err != nil {
		return err
	}
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		info, err := c.ShowInfo(cctx)
		cancel()
		if err == nil && info.Pid == p.cmd.Process.Pid {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("reloaded haproxy not answering on %s: %v", p.Socket, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// reloadMaster is `systemctl reload haproxy` under Debian's unit: SIGUSR2
// to the master, which forks a new worker from the same config; it
// returns once the socket answers from the new worker.
func (p *Process) reloadMaster(ctx context.Context) error {
	c, err := haproxy.New(p.Socket)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	before, err := c.ShowInfo(cctx)
	cancel()
	if err != nil {
		return fmt.Errorf("before the reload: %w", err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGUSR2); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		info, err := c.ShowInfo(cctx)
		cancel()
		if err == nil && info.Pid != before.Pid {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no new worker answering on %s: %v", p.Socket, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop ends HAProxy (SIGTERM, then SIGKILL after 5 s).
func (p *Process) Stop() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		p.done <- <-p.done
	}
}

// Log is what HAProxy printed.
func (p *Process) Log() string { return p.out.String() }

// FreePorts returns n distinct TCP ports on 127.0.0.1 that were free a
// moment ago and that no other caller in this process was given.
//
// They are drawn from below the kernel's ephemeral range when there is
// room there: a port from inside it can be taken, between this check and
// the bind of whoever uses it, by any outgoing connection (the load's,
// HAProxy's to its servers), and was: a test failed with "address already
// in use" on a port FreePorts had just handed out.
func FreePorts(n int) ([]int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	lo, hi := quietPorts()
	if len(handedOut) > (hi-lo)/2 { // a long sweep: ports handed out long ago are long bound or closed
		clear(handedOut)
	}
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries == 1000 {
			return nil, fmt.Errorf("free ports: found %d of %d in %d-%d", len(ports), n, lo, hi)
		}
		port := lo + rand.IntN(hi-lo)
		if handedOut[port] {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // in use
		}
		ln.Close()
		handedOut[port] = true
		ports = append(ports, port)
	}
	return ports, nil
}

var (
	portsMu   sync.Mutex
	handedOut = map[int]bool{}
)

// quietPorts is the range FreePorts draws from: the 10000 ports below the
// ephemeral range, or, when the ephemeral range starts too low to leave
// them, the 10000 above it.
func quietPorts() (lo, hi int) {
	ephLo, ephHi := 32768, 60999 // Linux's default
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		fmt.Sscan(string(b), &ephLo, &ephHi)
	}
	if ephLo >= 11024 {
		return ephLo - 10000, ephLo
	}
	if ephHi <= 65535-10000 {
		return ephHi + 1, ephHi + 10001
	}
	return 1024, 65536 // no quiet range: any port, as the kernel would
}

// CPU is HAProxy's user and system CPU time so far, read from
// /proc/PID/stat (fields 14 and 15, in clock ticks of 1/100 s: Linux's
// USER_HZ on every architecture Debian ships); 0 when it cannot be read.
func (p *Process) CPU() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid()))
	if err != nil {
		return 0
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count fields from the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3
	if len(f) < 13 {
		return 0
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(utime+stime) * (time.Second / 100)
}
