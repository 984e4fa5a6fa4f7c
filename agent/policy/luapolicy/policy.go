// Package luapolicy is the policy an operator writes: decide(obs) in a
// Lua script, run in a gopher-lua sandbox under a deadline. (The
// HAProxy-side Lua companion that sends telemetry is in lua/.)
package luapolicy

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/rs/zerolog"
	glua "github.com/yuin/gopher-lua"
)

// Policy runs a user's decide(obs) written in Lua (`--policy lua
// --policy-file FILE`). The script runs in a sandbox: no os, io, package,
// debug, require, load, loadstring, dofile or loadfile; each call ends at
// the step's deadline, the context the loop gives Decide; an error, a
// timeout or a malformed answer means no action, logged. Its globals persist between steps, so a script can keep
// its own memory, within MaxKept values. The guardrails apply to what it
// returns, as always.
//
// The deadline stops Lua instructions, not a Go built-in in the middle of
// its work (a pattern match can take exponential time), so each call runs
// in a goroutine of its own that the step can abandon. A call abandoned,
// or a script that keeps too much, breaks the policy: it makes no more
// calls, every step says why, and the guardrails' floor of "no action"
// holds until the agent is restarted with a fixed script.
type Policy struct {
	File string
	Log  zerolog.Logger

	mu     sync.Mutex // held by the call running the script
	L      *glua.LState
	needs  agent.Needs
	broken atomic.Pointer[error] // set for good once a call is abandoned or keeps too much
}

func (p *Policy) breaks(err error) error {
	p.broken.CompareAndSwap(nil, &err)
	p.Log.Error().Err(err).Msg("lua policy broken")
	return *p.broken.Load()
}

// Limits on what a script may build.
const (
	// MaxString bounds a string string.rep, string.format or a
	// concatenation may make; MaxSubject the subject of a pattern match.
	MaxString  = 1 << 20
	MaxSubject = 1 << 12
	// MaxKept bounds the values reachable from the script's globals
	// after a call: memory it keeps from step to step.
	MaxKept = 1 << 17
)

// sandboxed are the base-library functions a policy may not reach.
var sandboxed = []string{"dofile", "loadfile", "load", "loadstring", "require", "module", "setfenv", "getfenv", "collectgarbage", "newproxy", "_printregs"}

// LoadTimeout bounds the script's first run, which defines decide.
const LoadTimeout = time.Second

// NewPolicy loads and runs the script once; it must define decide(obs).
// The policy's hooks are its needs (a global `needs` table) and Close.
func NewPolicy(file string, log zerolog.Logger) (agent.Policy, error) {
	p, err := Load(file, log)
	if err != nil {
		return agent.Policy{}, err
	}
	return agent.Policy{Decider: p, Needs: p.needs, Close: p.Close}, nil
}

// Load reads and runs the script once.
func Load(file string, log zerolog.Logger) (*Policy, error) {
	src, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("lua policy: %w", err)
	}
	return newPolicy(file, string(src), log)
}

func newPolicy(name, src string, log zerolog.Logger) (*Policy, error) {
	L := glua.NewState(glua.Options{SkipOpenLibs: true, CallStackSize: 256, RegistrySize: 1 << 16})
	for _, lib := range []struct {
		name string
		fn   glua.LGFunction
	}{{glua.BaseLibName, glua.OpenBase}, {glua.TabLibName, glua.OpenTable}, {glua.StringLibName, glua.OpenString}, {glua.MathLibName, glua.OpenMath}} {
		L.Push(L.NewFunction(lib.fn))
		L.Push(glua.LString(lib.name))
		L.Call(1, 0)
	}
	for _, f := range sandboxed {
		L.SetGlobal(f, glua.LNil)
	}
	boundStrings(L)
	p := &Policy{File: name, Log: log, L: L}
	L.SetGlobal("print", L.NewFunction(func(L *glua.LState) int {
		var parts []any
		for i := 1; i <= L.GetTop(); i++ {
			parts = append(parts, L.Get(i).String())
		}
		p.Log.Info().Str("policy", name).Msg(fmt.Sprint(parts...))
		return 0
	}))
	ctx, cancel := context.WithTimeout(context.Background(), LoadTimeout)
	defer cancel()
	L.SetContext(ctx)
	if err := L.DoString(src); err != nil {
		L.Close()
		return nil, fmt.Errorf("lua policy %s: %w", name, err)
	}
	if _, ok := L.GetGlobal("decide").(*glua.LFunction); !ok {
		L.Close()
		return nil, fmt.Errorf("lua policy %s: no function decide(obs)", name)
	}
	if err := p.readNeeds(); err != nil {
		L.Close()
		return nil, fmt.Errorf("lua policy %s: %w", name, err)
	}
	return p, nil
}

// readNeeds reads the script's optional global `needs = {drains_per = N}`:
// a backend of N servers may then lose up to N/drains_per servers a step,
// as the rules do with 3. Without it, one drain a step.
func (p *Policy) readNeeds() error {
	switch t := p.L.GetGlobal("needs").(type) {
	case *glua.LNilType:
		return nil
	case *glua.LTable:
		switch v := t.RawGetString("drains_per").(type) {
		case *glua.LNilType:
		case glua.LNumber:
			if v < 1 || v > 1000 || v != glua.LNumber(int(v)) {
				return fmt.Errorf("needs.drains_per %v: want an integer from 1 to 1000", v)
			}
			p.needs.DrainsPer = int(v)
		default:
			return fmt.Errorf("needs.drains_per is a %s, want a number", v.Type())
		}
		return nil
	default:
		return fmt.Errorf("needs is a %s, want a table", t.Type())
	}
}

func (p *Policy) Name() string { return "lua" }

// Close releases the Lua state, unless a call abandoned at its deadline
// still holds it: the process is ending, and waiting for it would make
// SIGTERM wait.
func (p *Policy) Close() {
	if p.mu.TryLock() {
		defer p.mu.Unlock()
		p.L.Close()
	}
}

// Decide calls decide(obs) until ctx's deadline, the step's, in a
// goroutine the step abandons when the deadline passes (see Policy).
func (p *Policy) Decide(ctx context.Context, obs agent.Observation) (agent.Plan, error) {
	if !p.mu.TryLock() {
		return nil, fmt.Errorf("lua policy %s: an earlier call is still running", p.File)
	}
	if b := p.broken.Load(); b != nil {
		p.mu.Unlock()
		return nil, *b
	}
	budget := "its"
	if d, ok := ctx.Deadline(); ok {
		budget = fmt.Sprintf("the step's %v", time.Until(d).Round(time.Millisecond))
	}
	ctx, cancel := context.WithCancel(ctx)
	type result struct {
		plan agent.Plan
		err  error
	}
	done := make(chan result, 1)
	go func() {
		plan, err := p.call(ctx, obs, budget)
		cancel()
		// Held until the call really ends, and released before the
		// result is sent: the next step's TryLock must not race this
		// goroutine's return.
		p.mu.Unlock()
		done <- result{plan, err}
	}()
	select {
	case r := <-done:
		return r.plan, r.err
	case <-ctx.Done():
		select {
		case r := <-done: // it stopped at the deadline on its own
			return r.plan, r.err
		case <-time.After(50 * time.Millisecond):
		}
		return nil, p.breaks(fmt.Errorf("lua policy %s: a call did not stop at %s deadline (a built-in still running): abandoned, no more calls until the agent restarts", p.File, budget))
	}
}

// call runs decide(obs); it holds p.mu.
func (p *Policy) call(ctx context.Context, obs agent.Observation, budget string) (agent.Plan, error) {
	L := p.L
	L.SetContext(ctx)
	defer L.RemoveContext()
	err := L.CallByParam(glua.P{Fn: L.GetGlobal("decide"), NRet: 1, Protect: true}, observationTable(L, obs))
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("lua policy %s: over %s deadline: %w", p.File, budget, err)
		}
		return nil, fmt.Errorf("lua policy %s: %w", p.File, err)
	}
	ret := L.Get(-1)
	L.Pop(1)
	if n := kept(L.G.Global, MaxKept); n > MaxKept {
		return nil, p.breaks(fmt.Errorf("lua policy %s: its globals hold over %d values: broken, no more calls until the agent restarts", p.File, MaxKept))
	}
	return planFrom(ret)
}

// kept counts the values reachable from t, stopping past limit.
func kept(t *glua.LTable, limit int) int {
	n := 0
	seen := map[*glua.LTable]bool{}
	var walk func(*glua.LTable)
	walk = func(t *glua.LTable) {
		if seen[t] || n > limit {
			return
		}
		seen[t] = true
		t.ForEach(func(k, v glua.LValue) {
			n++
			if s, ok := v.(glua.LString); ok {
				n += len(s) / 1024 // a kilobyte of string weighs as a value
			}
			if sub, ok := v.(*glua.LTable); ok && n <= limit {
				walk(sub)
			}
		})
	}
	walk(t)
	return n
}

// boundStrings replaces the string functions that can make huge strings
// or run for ages with bounded ones.
func boundStrings(L *glua.LState) {
	str, ok := L.GetGlobal("string").(*glua.LTable)
	if !ok {
		return
	}
	orig := map[string]glua.LValue{}
	for _, name := range []string{"rep", "find", "match", "gmatch", "gsub", "format"} {
		orig[name] = str.RawGetString(name)
	}
	call := func(L *glua.LState, name string) int {
		fn := orig[name]
		top := L.GetTop()
		L.Push(fn)
		for i := 1; i <= top; i++ {
			L.Push(L.Get(i))
		}
		L.Call(top, glua.MultRet)
		return L.GetTop() - top
	}
	str.RawSetString("rep", L.NewFunction(func(L *glua.LState) int {
		s, n := L.CheckString(1), L.CheckInt(2)
		if n > 0 && len(s) > 0 && n > MaxString/len(s) {
			L.RaiseError("string.rep: a result over %d bytes", MaxString)
		}
		return call(L, "rep")
	}))
	for _, name := range []string{"find", "match", "gmatch", "gsub"} {
		str.RawSetString(name, L.NewFunction(func(L *glua.LState) int {
			if s := L.CheckString(1); len(s) > MaxSubject {
				L.RaiseError("string.%s: a subject over %d bytes", name, MaxSubject)
			}
			return call(L, name)
		}))
	}
	str.RawSetString("format", L.NewFunction(func(L *glua.LState) int {
		n := call(L, "format")
		if s, ok := L.Get(-1).(glua.LString); ok && len(s) > MaxString {
			L.RaiseError("string.format: a result over %d bytes", MaxString)
		}
		return n
	}))
}

func observationTable(L *glua.LState, obs agent.Observation) *glua.LTable {
	t := L.NewTable()
	t.RawSetString("time", glua.LNumber(obs.Time.Unix()))
	t.RawSetString("cycle", glua.LNumber(obs.Cycle))
	backends := L.NewTable()
	for _, b := range obs.Backends {
		bt := L.NewTable()
		bt.RawSetString("name", glua.LString(b.Name))
		bt.RawSetString("serving", glua.LNumber(b.ServingCount()))
		servers := L.NewTable()
		for _, s := range b.Servers {
			st := L.NewTable()
			for k, v := range map[string]glua.LValue{
				"name": glua.LString(s.Server), "state": glua.LString(s.State.Label()), "owner": glua.LString(string(s.Owner)),
				"serving": glua.LBool(s.Serving()), "weight": glua.LNumber(s.State.Weight), "initial_weight": glua.LNumber(s.State.Initial),
				"requests": glua.LNumber(s.Window.Requests), "err_5xx": glua.LNumber(s.Window.Err5xx), "err_4xx": glua.LNumber(s.Window.Err4xx),
				"error_rate": glua.LNumber(s.Window.ErrorRate()), "p50_ms": glua.LNumber(s.Window.P50Ms), "p95_ms": glua.LNumber(s.Window.P95Ms),
				"p99_ms": glua.LNumber(s.Window.P99Ms), "recent_requests": glua.LNumber(s.Recent.Requests), "recent_err_5xx": glua.LNumber(s.Recent.Err5xx),
			} {
				st.RawSetString(k, v)
			}
			servers.Append(st)
		}
		bt.RawSetString("servers", servers)
		backends.Append(bt)
	}
	t.RawSetString("backends", backends)
	return t
}

// planFrom validates decide's answer: nil or a list of
// {action=, backend=, server=, weight=, reason=} tables.
func planFrom(v glua.LValue) (agent.Plan, error) {
	if v == glua.LNil {
		return nil, nil
	}
	list, ok := v.(*glua.LTable)
	if !ok {
		return nil, fmt.Errorf("decide returned a %s, want a list of actions", v.Type())
	}
	var plan agent.Plan
	n := list.Len()
	if n > 16 {
		return nil, fmt.Errorf("decide returned %d actions, at most 16", n)
	}
	for i := 1; i <= n; i++ {
		t, ok := list.RawGetInt(i).(*glua.LTable)
		if !ok {
			return nil, fmt.Errorf("action %d is not a table", i)
		}
		str := func(k string) string { s, _ := t.RawGetString(k).(glua.LString); return string(s) }
		var weight *int
		if w, ok := t.RawGetString("weight").(glua.LNumber); ok && w == glua.LNumber(int(w)) {
			weight = new(int(w))
		}
		a, ok, err := agent.ParseAction(str("action"), str("backend"), str("server"), weight, "lua", str("reason"))
		if err != nil {
			return nil, fmt.Errorf("action %d: %w", i, err)
		}
		if ok {
			plan = append(plan, a)
		}
	}
	return plan, nil
}
