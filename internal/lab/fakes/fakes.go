// Package fakes holds the recording fakes the agent's tests share: a
// runtime socket that keeps server states in memory and records every
// command, a clock driven by hand, and windows that return set figures.
// They implement the agent's interfaces without importing the agent, so
// its own tests can use them.
package fakes

import (
	"context"
	"sync"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/window"
)

// Runtime keeps server states in memory and records every command, as
// the runtime socket would see it.
type Runtime struct {
	mu       sync.Mutex
	addr     string
	states   []haproxy.ServerState
	commands []string
	pid      int // changes on a simulated reload

	// Fail is returned by every call while set; FailSet by set commands
	// only. MaxConn is every server's slim in show stat (0: none).
	Fail, FailSet error
	MaxConn       int
}

// NewRuntime returns a runtime with one backend "app" whose servers have
// weight 10.
func NewRuntime(servers ...string) *Runtime {
	f := &Runtime{addr: "fake"}
	for _, s := range servers {
		f.states = append(f.states, haproxy.ServerState{Backend: "app", Server: s, OpState: haproxy.OpRunning, Weight: 10, Initial: 10})
	}
	return f
}

// WithStates returns a runtime holding states, named addr.
func WithStates(addr string, states []haproxy.ServerState) *Runtime {
	return &Runtime{addr: addr, states: append([]haproxy.ServerState(nil), states...)}
}

func (f *Runtime) Addr() string { return f.addr }

// SetAddr names the socket, to tell several apart.
func (f *Runtime) SetAddr(a string) { f.addr = a }

func (f *Runtime) ShowInfo(context.Context) (haproxy.Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Fail != nil {
		return haproxy.Info{}, f.Fail
	}
	return haproxy.Info{Pid: 100 + f.pid, StartTime: 1000}, nil
}

func (f *Runtime) ServerStats(context.Context) ([]haproxy.ServerStat, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Fail != nil {
		return nil, f.Fail
	}
	var rows []haproxy.ServerStat
	if len(f.states) > 0 {
		// made at its size: grown row by row, the fake's own appends were
		// a tenth of soak cost's step at 10,000 servers
		rows = make([]haproxy.ServerStat, 0, len(f.states))
	}
	for _, s := range f.states {
		rows = append(rows, haproxy.ServerStat{Backend: s.Backend, Server: s.Server, MaxConn: f.MaxConn})
	}
	return rows, nil
}

// Reload simulates an HAProxy reload: a new process, every server back
// at its configured state.
func (f *Runtime) Reload() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pid++
	for i := range f.states {
		f.states[i].AdminState = 0
		f.states[i].Weight = f.states[i].Initial
	}
}

func (f *Runtime) ShowServersState(context.Context) ([]haproxy.ServerState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Fail != nil {
		return nil, f.Fail
	}
	return append([]haproxy.ServerState(nil), f.states...), nil
}

func (f *Runtime) find(b, s string) (*haproxy.ServerState, error) {
	for i := range f.states {
		if f.states[i].Backend == b && f.states[i].Server == s {
			return &f.states[i], nil
		}
	}
	return nil, &haproxy.CommandError{Command: "x", Reply: "No such server."}
}

// record notes a command as HAProxy would receive it, and says whether
// it fails.
func (f *Runtime) record(cmd string, err error) error {
	if err != nil {
		return err
	}
	f.commands = append(f.commands, cmd)
	if f.Fail != nil {
		return f.Fail
	}
	return f.FailSet
}

func (f *Runtime) SetServerState(_ context.Context, b, s string, st haproxy.AdminState) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(haproxy.SetStateCommand(b, s, st)); err != nil {
		return err
	}
	srv, err := f.find(b, s)
	if err != nil {
		return err
	}
	switch st {
	case haproxy.StateReady:
		srv.AdminState = 0
	case haproxy.StateDrain:
		srv.AdminState = haproxy.AdminForcedDrain
	case haproxy.StateMaint:
		srv.AdminState = haproxy.AdminForcedMaint
	}
	return nil
}

func (f *Runtime) SetWeight(_ context.Context, b, s string, w int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(haproxy.SetWeightCommand(b, s, w)); err != nil {
		return err
	}
	srv, err := f.find(b, s)
	if err != nil {
		return err
	}
	srv.Weight = w
	return nil
}

// Set changes server's state in backend "app" by hand, as an operator
// would.
func (f *Runtime) Set(server string, fn func(*haproxy.ServerState)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, err := f.find("app", server); err == nil {
		fn(s)
	}
}

// State returns server's state in backend "app".
func (f *Runtime) State(server string) haproxy.ServerState {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, _ := f.find("app", server)
	if s == nil {
		return haproxy.ServerState{}
	}
	return *s
}

// TakeCommands returns the commands sent since the last call.
func (f *Runtime) TakeCommands() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.commands
	f.commands = nil
	return c
}

// Windows returns the same figures for any span.
type Windows struct {
	mu    sync.Mutex
	stats []window.Stats
}

// NewWindows returns windows holding stats.
func NewWindows(stats ...window.Stats) *Windows { return &Windows{stats: stats} }

func (w *Windows) Snapshot(time.Duration) []window.Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]window.Stats(nil), w.stats...)
}

// Clock advances only when told, or when the loop sleeps.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock standing at t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// SleepUntil jumps to t.
func (c *Clock) SleepUntil(ctx context.Context, t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.t) {
		c.t = t
	}
	return ctx.Err()
}

// Add puts one more server in the runtime's table.
func (f *Runtime) Add(s haproxy.ServerState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.states = append(f.states, s)
}
