package luapolicy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hapilot/hapilot/agent"
	glua "github.com/yuin/gopher-lua"
)

// vm is the script's sandboxed Lua state, in the worker process. Nothing
// it does reaches past the worker: the agent reads only its replies.
type vm struct {
	name string
	L    *glua.LState
	// print sends one of the script's print lines to the agent.
	print func(string)
}

// sandboxed are the base-library functions a policy may not reach.
var sandboxed = []string{"dofile", "loadfile", "load", "loadstring", "require", "module", "setfenv", "getfenv", "collectgarbage", "newproxy", "_printregs"}

// errBroken marks what breaks the policy for good.
var errBroken = errors.New("broken")

// newVM loads src and runs it once (LoadTimeout); it must define
// decide(obs). It returns the script's needs.drains_per.
func newVM(name, src string, print func(string)) (*vm, int, error) {
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
	v := &vm{name: name, L: L, print: print}
	L.SetGlobal("print", L.NewFunction(func(L *glua.LState) int {
		var b strings.Builder
		for i := 1; i <= L.GetTop() && b.Len() <= MaxMessage; i++ {
			if i > 1 {
				b.WriteByte(' ')
			}
			b.WriteString(L.Get(i).String())
		}
		v.print(cut(b.String(), MaxMessage))
		return 0
	}))
	ctx, cancel := context.WithTimeout(context.Background(), LoadTimeout)
	defer cancel()
	L.SetContext(ctx)
	defer L.RemoveContext()
	if err := L.DoString(src); err != nil {
		L.Close()
		return nil, 0, fmt.Errorf("lua policy %s: %w", name, err)
	}
	// Raw reads of the globals: a metatable the script put on _G runs no
	// code of its own outside a protected call.
	if _, ok := L.G.Global.RawGetString("decide").(*glua.LFunction); !ok {
		L.Close()
		return nil, 0, fmt.Errorf("lua policy %s: no function decide(obs)", name)
	}
	drainsPer, err := v.readNeeds()
	if err != nil {
		L.Close()
		return nil, 0, fmt.Errorf("lua policy %s: %w", name, err)
	}
	return v, drainsPer, nil
}

// readNeeds reads the script's optional global `needs = {drains_per = N}`:
// a backend of N servers may then lose up to N/drains_per servers a step,
// as the rules do with 3. Without it, one drain a step.
func (v *vm) readNeeds() (int, error) {
	switch t := v.L.G.Global.RawGetString("needs").(type) {
	case *glua.LNilType:
		return 0, nil
	case *glua.LTable:
		switch n := t.RawGetString("drains_per").(type) {
		case *glua.LNilType:
			return 0, nil
		case glua.LNumber:
			if n < 1 || n > 1000 || n != glua.LNumber(int(n)) {
				return 0, fmt.Errorf("needs.drains_per %v: want an integer from 1 to 1000", n)
			}
			return int(n), nil
		default:
			return 0, fmt.Errorf("needs.drains_per is a %s, want a number", n.Type())
		}
	default:
		return 0, fmt.Errorf("needs is a %s, want a table", t.Type())
	}
}

// decide calls decide(obs) within budget (0: none). Every call into the
// VM is a protected one: the function is read raw from the globals, and
// any error, the script's or a metamethod's, comes back as an error.
func (v *vm) decide(budget time.Duration, obs obsView) ([]rawAction, error) {
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if budget > 0 {
		ctx, cancel = context.WithTimeout(ctx, budget)
	}
	defer cancel()
	L := v.L
	L.SetContext(ctx)
	defer L.RemoveContext()
	fn := L.G.Global.RawGetString("decide")
	if _, ok := fn.(*glua.LFunction); !ok {
		return nil, fmt.Errorf("decide is a %s now, not a function", fn.Type())
	}
	err := L.CallByParam(glua.P{Fn: fn, NRet: 1, Protect: true}, observationTable(L, obs))
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("over the step's %v deadline: %w", budget.Round(time.Millisecond), err)
		}
		return nil, err
	}
	ret := L.Get(-1)
	L.Pop(1)
	if n := kept(L.G.Global, MaxKept); n > MaxKept {
		return nil, fmt.Errorf("%w: its globals hold over %d values", errBroken, MaxKept)
	}
	return actionsFrom(ret)
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

func observationTable(L *glua.LState, obs obsView) *glua.LTable {
	t := L.NewTable()
	t.RawSetString("time", glua.LNumber(obs.Time))
	t.RawSetString("cycle", glua.LNumber(obs.Cycle))
	backends := L.NewTable()
	for _, b := range obs.Backends {
		bt := L.NewTable()
		bt.RawSetString("name", glua.LString(b.Name))
		bt.RawSetString("serving", glua.LNumber(b.Serving))
		servers := L.NewTable()
		for _, s := range b.Servers {
			st := L.NewTable()
			for k, v := range map[string]glua.LValue{
				"name": glua.LString(s.Name), "state": glua.LString(s.State), "owner": glua.LString(s.Owner),
				"serving": glua.LBool(s.Serving), "weight": glua.LNumber(s.Weight), "initial_weight": glua.LNumber(s.InitialWeight),
				"requests": glua.LNumber(s.Requests), "err_5xx": glua.LNumber(s.Err5xx), "err_4xx": glua.LNumber(s.Err4xx),
				"error_rate": glua.LNumber(s.ErrorRate), "p50_ms": glua.LNumber(s.P50Ms), "p95_ms": glua.LNumber(s.P95Ms),
				"p99_ms": glua.LNumber(s.P99Ms), "recent_requests": glua.LNumber(s.RecentRequests), "recent_err_5xx": glua.LNumber(s.RecentErr5xx),
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

// MaxActions bounds decide's list.
const MaxActions = 16

// actionsFrom reads decide's answer: nil or a list of
// {action=, backend=, server=, weight=, reason=} tables, every string cut
// so that a reply stays small; the agent checks each action.
func actionsFrom(v glua.LValue) ([]rawAction, error) {
	if v == glua.LNil {
		return nil, nil
	}
	list, ok := v.(*glua.LTable)
	if !ok {
		return nil, fmt.Errorf("decide returned a %s, want a list of actions", v.Type())
	}
	n := list.Len()
	if n > MaxActions {
		return nil, fmt.Errorf("decide returned %d actions, at most %d", n, MaxActions)
	}
	out := make([]rawAction, 0, n)
	for i := 1; i <= n; i++ {
		t, ok := list.RawGetInt(i).(*glua.LTable)
		if !ok {
			return nil, fmt.Errorf("action %d is not a table", i)
		}
		// The agent refuses a name past 255 bytes all the same, and cuts a
		// reason to agent.MaxReason, as every policy's: cutting here only
		// keeps the reply small.
		str := func(k string, n int) string { s, _ := t.RawGetString(k).(glua.LString); return cut(string(s), n) }
		a := rawAction{Verb: str("action", 32), Backend: str("backend", 256), Server: str("server", 256), Reason: str("reason", agent.MaxReason)}
		if w, ok := t.RawGetString("weight").(glua.LNumber); ok && w == glua.LNumber(int(w)) {
			a.Weight = new(int(w))
		}
		out = append(out, a)
	}
	return out, nil
}

// cut shortens s to at most n bytes of valid UTF-8, marking the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "..."
}
