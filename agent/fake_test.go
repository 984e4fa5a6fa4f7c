package agent

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/window"
)

// fakeRuntime keeps server states in memory and records every command, as
// the runtime socket would see it.
type fakeRuntime struct {
	mu       sync.Mutex
	addr     string
	states   []haproxy.ServerState
	commands []string
	fail     error // returned by every call while set
	pid      int   // changes on a simulated reload
	failSet  error // returned by set commands only
	maxconn  int   // every server's slim in show stat; 0 none
}

func newFakeRuntime(servers ...string) *fakeRuntime {
	f := &fakeRuntime{addr: "fake"}
	for _, s := range servers {
		f.states = append(f.states, haproxy.ServerState{Backend: "app", Server: s, OpState: haproxy.OpRunning, Weight: 10, Initial: 10})
	}
	return f
}

func (f *fakeRuntime) Addr() string { return f.addr }

func (f *fakeRuntime) ShowInfo(context.Context) (haproxy.Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return haproxy.Info{}, f.fail
	}
	return haproxy.Info{Pid: 100 + f.pid, StartTime: 1000}, nil
}

func (f *fakeRuntime) ShowStat(context.Context) ([]haproxy.StatRow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return nil, f.fail
	}
	var rows []haproxy.StatRow
	for _, s := range f.states {
		slim := ""
		if f.maxconn > 0 {
			slim = fmt.Sprint(f.maxconn)
		}
		rows = append(rows, haproxy.StatRow{"pxname": s.Backend, "svname": s.Server, "slim": slim})
	}
	return rows, nil
}

// reload simulates an HAProxy reload: a new process, every server back at
// its configured state.
func (f *fakeRuntime) reload() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pid++
	for i := range f.states {
		f.states[i].AdminState = 0
		f.states[i].Weight = f.states[i].Initial
	}
}

func (f *fakeRuntime) ShowServersState(context.Context) ([]haproxy.ServerState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return nil, f.fail
	}
	return append([]haproxy.ServerState(nil), f.states...), nil
}

func (f *fakeRuntime) find(b, s string) (*haproxy.ServerState, error) {
	for i := range f.states {
		if f.states[i].Backend == b && f.states[i].Server == s {
			return &f.states[i], nil
		}
	}
	return nil, &haproxy.CommandError{Command: "x", Reply: "No such server."}
}

func (f *fakeRuntime) SetServerState(_ context.Context, b, s string, st haproxy.AdminState) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.commands = append(f.commands, fmt.Sprintf("set server %s/%s state %s", b, s, st))
	if f.fail != nil {
		return f.fail
	}
	if f.failSet != nil {
		return f.failSet
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

func (f *fakeRuntime) SetWeight(_ context.Context, b, s string, w int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.commands = append(f.commands, fmt.Sprintf("set weight %s/%s %d", b, s, w))
	if f.fail != nil {
		return f.fail
	}
	if f.failSet != nil {
		return f.failSet
	}
	srv, err := f.find(b, s)
	if err != nil {
		return err
	}
	srv.Weight = w
	return nil
}

func (f *fakeRuntime) set(server string, fn func(*haproxy.ServerState)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, _ := f.find("app", server)
	fn(s)
}

func (f *fakeRuntime) takeCommands() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.commands
	f.commands = nil
	return c
}

type fakeWindows struct{ stats []window.Stats }

func (w *fakeWindows) Snapshot(time.Duration) []window.Stats { return w.stats }

// fakeClock advances only when told, or when the loop sleeps.
type fakeClock struct {
	mu    sync.Mutex
	t     time.Time
	slept []time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func (c *fakeClock) SleepUntil(ctx context.Context, t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slept = append(c.slept, t)
	if t.After(c.t) {
		c.t = t
	}
	return ctx.Err()
}

// scripted returns the plans it is given, one per step.
type scripted struct {
	plans  []Plan
	calls  int
	err    error
	onCall func()
}

func (s *scripted) Name() string { return "scripted" }

func (s *scripted) Decide(context.Context, Observation) (Plan, error) {
	s.calls++
	if s.onCall != nil {
		s.onCall()
	}
	if s.err != nil {
		return nil, s.err
	}
	if len(s.plans) == 0 {
		return nil, nil
	}
	p := s.plans[0]
	s.plans = s.plans[1:]
	return p, nil
}
