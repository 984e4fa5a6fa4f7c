package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/ledger"
	"github.com/hapilot/hapilot/agent/loop"
	"github.com/hapilot/hapilot/cmd/hapilot/config"
	"github.com/hapilot/hapilot/cmd/hapilot/ctl"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/netx"
	"github.com/rs/zerolog"
)

const stopUsage = `usage: hapilot stop [--config FILE] [--keep] [--binary PATH] [--wait D]

Stops every running agent of this binary (started by systemd or by hand),
after undoing what each changed: each is asked over its control socket to
restore its servers (an agent with none is stopped first, then restored
from its state file), then stopped with SIGTERM; what its state file still
holds afterwards is restored too, and so is what the state file named in
--config holds. When a server cannot be brought back, the agent that holds
it keeps running, and hapilot stop exits 1 naming each server left changed
and the commands that undo it. The Debian package's prerm runs it before
removal, so that no drain outlives its agent unowned.

flags:
`

// agentProc is one running `hapilot run` of the binary being stopped,
// as /proc shows it: what it was started with, where.
type agentProc struct {
	PID  int
	Args []string // after "run"
	Cwd  string
	Env  map[string]string
	// From its arguments and environment; Err when they no longer parse
	// (its --config file changed since it started).
	Config  *config.Config
	Err     error
	Control string // its control socket's path, "" when off
	State   string // its state file, "" when off
}

// String names the agent for the operator.
func (a agentProc) String() string {
	return fmt.Sprintf("agent pid %d", a.PID)
}

// findAgents lists the processes under procRoot (/proc) that run binary
// with `run`: those the removal of binary would leave running from a
// deleted file. self is left out.
func findAgents(procRoot, binary string, self int) ([]agentProc, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var out []agentProc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		dir := filepath.Join(procRoot, e.Name())
		exe, err := os.Readlink(filepath.Join(dir, "exe"))
		if err != nil || strings.TrimSuffix(exe, " (deleted)") != binary {
			continue // gone, a kernel thread, or another binary
		}
		raw, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if len(argv) < 2 || argv[1] != "run" {
			continue // hapilot ctl, check, another stop
		}
		a := agentProc{PID: pid, Args: argv[2:], Env: map[string]string{}}
		a.Cwd, _ = os.Readlink(filepath.Join(dir, "cwd"))
		if env, err := os.ReadFile(filepath.Join(dir, "environ")); err == nil {
			for _, kv := range strings.Split(string(env), "\x00") {
				if k, v, ok := strings.Cut(kv, "="); ok {
					a.Env[k] = v
				}
			}
		}
		a.settle()
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out, nil
}

// settle reads the agent's settings as it did at its start: its
// arguments, its --config file, its environment, relative paths from its
// working directory.
func (a *agentProc) settle() {
	args := make([]string, len(a.Args))
	copy(args, a.Args)
	for i, s := range args {
		switch {
		case (s == "--config" || s == "-config") && i+1 < len(args):
			args[i+1] = a.abs(args[i+1])
		case strings.HasPrefix(s, "--config=") || strings.HasPrefix(s, "-config="):
			k, v, _ := strings.Cut(s, "=")
			args[i] = k + "=" + a.abs(v)
		}
	}
	c, err := parse("run", args, io.Discard)
	if err != nil {
		a.Err = fmt.Errorf("its settings no longer parse: %w", err)
		return
	}
	a.Config = c
	if sa, err := netx.ParseAddress("control-socket", c.ControlSocket, netx.Unix); err == nil && !sa.Off() {
		a.Control = sa.Addr // absolute: the flag refuses a relative path
	}
	// An environment this process may not read (another user's, not as
	// root) leaves an auto state file unknown: the control socket may
	// still do, and askRestore says when nothing can.
	if state, err := c.StateFileIn(func(k string) string { return a.Env[k] }); err == nil && state != "" {
		a.State = a.abs(state)
	}
}

func (a *agentProc) abs(p string) string {
	if p == "" || filepath.IsAbs(p) || a.Cwd == "" {
		return p
	}
	return filepath.Join(a.Cwd, p)
}

// remaining is one server an agent's change still holds.
type remaining struct {
	Server  agent.Key
	Change  agent.Change
	Who     string   // the agent, or the state file
	Control string   // the agent's control socket, while it runs
	State   string   // its state file
	Sockets []string // HAProxy's admin sockets
}

// stopper carries out `hapilot stop`.
type stopper struct {
	out     io.Writer
	log     zerolog.Logger
	keep    bool
	wait    time.Duration
	hold    time.Duration
	left    []remaining
	failed  []string
	handled map[string]bool // state files already read
}

func cmdStop(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hapilot stop", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, stopUsage); fs.PrintDefaults() }
	binary := fs.String("binary", "", "stop the agents that run this `file` (default: this hapilot's own)")
	file := fs.String("config", "", "a settings `file` whose state file is restored too, agent or not (the package's /etc/hapilot/hapilot.conf)")
	keep := fs.Bool("keep", false, "undo nothing: stop the agents (each as its --on-exit says) and list what remains changed, with HAProxy's commands to undo it")
	wait := fs.Duration("wait", 30*time.Second, "how long an agent may take to exit after SIGTERM")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if *binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("this binary's path: %w", err)
		}
		*binary = exe
	}
	if p, err := filepath.EvalSymlinks(*binary); err == nil {
		*binary = p
	}
	agents, err := findAgents("/proc", *binary, os.Getpid())
	if err != nil {
		return err
	}
	s := &stopper{out: stdout, log: zerolog.New(stderr).Level(zerolog.WarnLevel).With().Timestamp().Logger(), keep: *keep, wait: *wait,
		hold: agent.DefaultOperatorHold, handled: map[string]bool{}}
	var packaged *config.Config
	if *file != "" {
		if packaged, err = parse("stop", []string{"--config", *file}, stderr); err != nil {
			return err
		}
	}
	return s.run(ctx, agents, packaged)
}

func (s *stopper) say(format string, a ...any) {
	fmt.Fprintf(s.out, "hapilot stop: "+format+"\n", a...)
}

// run undoes, then stops, then checks: an agent is stopped only once
// every agent's undo worked, so that a failure leaves each one running
// and owning its changes.
func (s *stopper) run(ctx context.Context, agents []agentProc, packaged *config.Config) error {
	if len(agents) == 0 {
		s.say("no agent of this binary is running")
	}
	for _, a := range agents {
		s.say("%s: hapilot run %s", a, strings.Join(a.Args, " "))
	}
	var stop []agentProc
	for _, a := range agents {
		if a.Err != nil {
			s.failed = append(s.failed, fmt.Sprintf("%s: %v; stop it yourself, then `hapilot restore` with its settings", a, a.Err))
			continue
		}
		if s.keep {
			stop = append(stop, a)
			continue
		}
		if s.askRestore(ctx, a) {
			stop = append(stop, a)
		}
	}
	if len(s.failed) > 0 {
		return s.report()
	}
	for _, a := range stop {
		if err := s.stopAgent(a); err != nil {
			s.failed = append(s.failed, err.Error())
			continue
		}
		if a.State != "" {
			s.fromState(ctx, a.String(), a.State, a.Config)
		}
	}
	if packaged != nil {
		file, err := packaged.StateFileIn(os.Getenv)
		switch {
		case err != nil:
			s.failed = append(s.failed, fmt.Sprintf("--config's state file: %v", err))
		case file != "":
			s.fromState(ctx, "state file "+file, file, packaged)
		}
	}
	return s.report()
}

// askRestore asks a running agent to restore every server it changed,
// over its control socket. It reports whether the agent may be stopped
// now: its servers are back, or it has no socket but can be restored
// once stopped (its state file, or its own --on-exit restore).
func (s *stopper) askRestore(ctx context.Context, a agentProc) bool {
	if a.Control != "" {
		cctx, cancel := context.WithTimeout(ctx, ctl.Timeout)
		ans, err := ctl.Do(cctx, a.Control, ctl.Request{Command: ctl.Restore})
		cancel()
		if err == nil && ans.OK {
			var rs []loop.Released
			_ = json.Unmarshal(ans.Result, &rs)
			s.say("%s: asked over %s to restore: %s", a, a.Control, released(rs))
			return true
		}
		if err == nil {
			s.say("%s: its restore failed: %s", a, ans.Error)
			s.agentLeft(ctx, a)
			s.failed = append(s.failed, fmt.Sprintf("%s could not bring back its servers; it keeps running and holding them", a))
			return false
		}
		s.say("%s: not answering on %s (%v)", a, a.Control, err)
	}
	switch {
	case a.State != "":
		s.say("%s: to be restored from its state file %s once stopped", a, a.State)
		return true
	case a.Config.OnExit == config.OnExitRestore:
		s.say("%s: no control socket or state file; its --on-exit restore undoes its changes as it stops", a)
		return true
	}
	s.failed = append(s.failed, fmt.Sprintf("%s answers on no control socket and keeps no state file, so nothing here can undo its changes: "+
		"stop it yourself (with --on-exit restore it undoes them as it stops)", a))
	return false
}

// agentLeft records what a running agent still holds, from `ctl list`.
func (s *stopper) agentLeft(ctx context.Context, a agentProc) {
	cctx, cancel := context.WithTimeout(ctx, ctl.Timeout)
	defer cancel()
	ans, err := ctl.Do(cctx, a.Control, ctl.Request{Command: ctl.List})
	var hs []loop.Holding
	if err == nil && ans.OK {
		err = json.Unmarshal(ans.Result, &hs)
	}
	if err != nil {
		s.failed = append(s.failed, fmt.Sprintf("%s: what it holds is unknown: %v", a, err))
		return
	}
	for _, h := range hs {
		s.left = append(s.left, remaining{Server: h.Server, Change: h.Change, Who: a.String(), Control: a.Control, State: a.State, Sockets: a.Config.HAProxySockets})
	}
}

// stopAgent sends SIGTERM and waits for the process to be gone.
func (s *stopper) stopAgent(a agentProc) error {
	if err := syscall.Kill(a.PID, syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			s.say("%s: already gone", a)
			return nil
		}
		return fmt.Errorf("%s: SIGTERM: %w", a, err)
	}
	deadline := time.Now().Add(s.wait)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(a.PID, 0); errors.Is(err, syscall.ESRCH) {
			s.say("%s: stopped", a)
			return nil
		}
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", a.PID)); err == nil && isZombie(string(st)) {
			s.say("%s: stopped", a)
			return nil
		}
		time.Sleep(50 * time.Millisecond) // polling a pid: no event to wait on for a process that is not our child
	}
	return fmt.Errorf("%s: still running %v after SIGTERM", a, s.wait)
}

// isZombie reads /proc/PID/stat's state field: an exited child whose
// parent has not reaped it yet.
func isZombie(stat string) bool {
	i := strings.LastIndexByte(stat, ')')
	return i >= 0 && len(stat) > i+2 && stat[i+2] == 'Z'
}

// fromState restores what a state file still holds, once its agent is
// stopped; with --keep it only lists it.
func (s *stopper) fromState(ctx context.Context, who, file string, c *config.Config) {
	if s.handled[file] {
		return
	}
	s.handled[file] = true
	if _, err := os.Stat(file); errors.Is(err, os.ErrNotExist) {
		s.say("%s: no state file at %s: nothing recorded", who, file)
		return
	}
	ledger, err := ledger.Open(file, s.log)
	if err != nil {
		s.failed = append(s.failed, fmt.Sprintf("%s: %v", who, err))
		return
	}
	held := ledger.Changes()
	if len(held) == 0 {
		s.say("%s: the state file %s holds no change", who, file)
		return
	}
	add := func(k agent.Key, ch agent.Change) {
		s.left = append(s.left, remaining{Server: k, Change: ch, Who: who, State: file, Sockets: c.HAProxySockets})
	}
	if s.keep {
		for k, ch := range held {
			add(k, ch)
		}
		return
	}
	var runtimes []agent.Runtime
	for _, p := range c.HAProxySockets {
		cl, err := haproxy.New(p)
		if err != nil {
			s.failed = append(s.failed, fmt.Sprintf("%s: %v", who, err))
			return
		}
		runtimes = append(runtimes, cl)
	}
	hold := c.Loop.OperatorHold
	if hold <= 0 {
		hold = s.hold
	}
	rctx, cancel := context.WithTimeout(ctx, ctl.Timeout)
	defer cancel()
	rs, err := loop.RestoreFromState(rctx, file, runtimes, hold, time.Now(), s.log)
	s.say("%s: restored from %s: %s", who, file, released(rs))
	if err != nil {
		s.failed = append(s.failed, fmt.Sprintf("%s: %v", who, err))
		for _, r := range rs {
			if r.Error != "" && strings.HasPrefix(r.Error, "no HAProxy took") {
				add(r.Server, r.Was)
			}
		}
	}
}

// released says what a restore brought back, and what it left and why.
func released(rs []loop.Released) string {
	if len(rs) == 0 {
		return "nothing to bring back"
	}
	var back, other []string
	for _, r := range rs {
		if r.Error == "" {
			back = append(back, r.Server.String())
		} else {
			other = append(other, r.Server.String()+": "+r.Error)
		}
	}
	msg := fmt.Sprintf("%d server(s) brought back", len(back))
	if len(back) > 0 {
		msg += ": " + strings.Join(back, ", ")
	}
	if len(other) > 0 {
		msg += "; " + strings.Join(other, "; ")
	}
	return msg
}

// report prints every server left changed and the commands that undo
// it, with hapilot and without (the keep case removes the binary), and
// fails when an undo failed.
func (s *stopper) report() error {
	sort.Slice(s.left, func(i, j int) bool { return s.left[i].Server.String() < s.left[j].Server.String() })
	if len(s.left) == 0 && len(s.failed) == 0 {
		s.say("no server the agent changed remains changed")
		return nil
	}
	if len(s.left) > 0 {
		s.say("%d server(s) remain as the agent left them:", len(s.left))
		for _, r := range s.left {
			fmt.Fprintf(s.out, "  %s  %s since %s  (%s)\n", r.Server, r.Change.Phase, r.Change.At.UTC().Format(time.RFC3339), r.Who)
		}
		s.say("to undo them:")
		undo := map[string]bool{}
		for _, r := range s.left {
			var line string
			switch {
			case s.keep:
			case r.Control != "":
				line = "  hapilot ctl --socket unix:" + r.Control + " restore     (the agent running)"
			case r.State != "":
				line = "  hapilot restore --state-file " + r.State + " --haproxy-socket " + strings.Join(r.Sockets, ",") + "     (the agent stopped)"
			}
			if line != "" && !undo[line] {
				undo[line] = true
				fmt.Fprintln(s.out, line)
			}
		}
		for _, r := range s.left {
			for _, sock := range r.Sockets {
				for _, cmd := range undoCommands(r.Server, r.Change) {
					fmt.Fprintf(s.out, "  echo '%s' | socat stdio %s\n", cmd, sock)
				}
			}
		}
	}
	if len(s.failed) == 0 {
		return nil
	}
	return errors.New(strings.Join(s.failed, "; "))
}

// undoCommands are HAProxy's own runtime commands that undo a change,
// for when no hapilot binary is left: ready for a drain, the configured
// weight (100% of it) for a cut.
func undoCommands(k agent.Key, c agent.Change) []string {
	var out []string
	if c.Phase == agent.PhaseDrained {
		if cmd, err := haproxy.SetStateCommand(k.Backend, k.Server, haproxy.StateReady); err == nil {
			out = append(out, cmd)
		}
	}
	if c.Weight > 0 || c.Phase != agent.PhaseDrained {
		out = append(out, fmt.Sprintf("set weight %s/%s 100%%", k.Backend, k.Server))
	}
	return out
}
