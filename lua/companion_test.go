package lua

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	glua "github.com/yuin/gopher-lua"
)

// fakeCore runs hapilot.lua in gopher-lua against a stand-in for HAProxy's
// `core`: register_converters and register_task keep the functions,
// core.msleep yields the task's coroutine (so the test drives time), and
// core.tcp() returns a socket whose peer is the test.
type fakeCore struct {
	t        *testing.T
	L        *glua.LState
	convert  *glua.LFunction
	task     *glua.LState // the task's coroutine
	taskFn   *glua.LFunction
	sleeps   []int
	agentUp  bool
	batches  []string
	connects int
	// want is the address connect must get: "host:port" or a whole one.
	want string
}

func newFakeCore(t *testing.T, env map[string]string) *fakeCore {
	for k, v := range env {
		t.Setenv(k, v)
	}
	L := glua.NewState()
	t.Cleanup(L.Close)
	f := &fakeCore{t: t, L: L, agentUp: true, want: "127.0.0.1:4242"}
	if a := env["HAPILOT_LUA_AGENT"]; a != "" {
		f.want = a
	}
	core := L.NewTable()
	L.SetField(core, "register_converters", L.NewFunction(func(L *glua.LState) int {
		if L.CheckString(1) != "hapilot_record" {
			t.Errorf("converter name %q", L.CheckString(1))
		}
		f.convert = L.CheckFunction(2)
		return 0
	}))
	L.SetField(core, "register_task", L.NewFunction(func(L *glua.LState) int {
		f.taskFn = L.CheckFunction(1)
		return 0
	}))
	L.SetField(core, "msleep", L.NewFunction(func(L *glua.LState) int {
		f.sleeps = append(f.sleeps, L.CheckInt(1))
		return L.Yield()
	}))
	L.SetField(core, "tcp", L.NewFunction(func(L *glua.LState) int {
		L.Push(f.socket(L))
		return 1
	}))
	L.SetGlobal("core", core)
	if err := L.DoString(Companion); err != nil {
		t.Fatalf("load hapilot.lua: %v", err)
	}
	if f.convert == nil || f.taskFn == nil {
		t.Fatal("hapilot.lua registered no converter or no task")
	}
	f.task, _ = L.NewThread()
	return f
}

func (f *fakeCore) socket(L *glua.LState) *glua.LTable {
	s := L.NewTable()
	connected := false
	L.SetField(s, "settimeout", L.NewFunction(func(L *glua.LState) int { return 0 }))
	L.SetField(s, "connect", L.NewFunction(func(L *glua.LState) int {
		f.connects++
		got := L.CheckString(2)
		if L.GetTop() >= 3 {
			got = fmt.Sprintf("%s:%d", got, L.CheckInt(3))
		}
		if got != f.want {
			f.t.Errorf("connect to %s, want %s", got, f.want)
		}
		if !f.agentUp {
			L.Push(glua.LNil)
			L.Push(glua.LString("connection refused"))
			return 2
		}
		connected = true
		L.Push(glua.LNumber(1))
		return 1
	}))
	L.SetField(s, "send", L.NewFunction(func(L *glua.LState) int {
		if !connected {
			L.Push(glua.LNil)
			return 1
		}
		data := L.CheckString(2)
		f.batches = append(f.batches, data)
		L.Push(glua.LNumber(len(data)))
		return 1
	}))
	L.SetField(s, "close", L.NewFunction(func(L *glua.LState) int { return 0 }))
	return s
}

// respond runs the converter for one response, on the line HAProxy's
// set-var-fmt(txn.hapilot) "%b %s %ST %Tr" would have built, and returns
// what the converter returned (1 counted, 0 table full).
func (f *fakeCore) respond(backend, server string, status int, tr string) int {
	L := f.L
	if server == "" {
		server = "<NOSRV>"
	}
	if tr == "" {
		tr = "-1"
	}
	line := fmt.Sprintf("%s %s %d %s", backend, server, status, tr)
	if err := L.CallByParam(glua.P{Fn: f.convert, NRet: 1, Protect: true}, glua.LString(line)); err != nil {
		f.t.Fatalf("converter: %v", err)
	}
	ret := L.Get(-1)
	L.Pop(1)
	n, ok := ret.(glua.LNumber)
	if !ok {
		f.t.Fatalf("converter returned %s, want a number", ret.Type())
	}
	return int(n)
}

// tick lets the task run until its next sleep.
func (f *fakeCore) tick() {
	if _, err, _ := f.L.Resume(f.task, f.taskFn); err != nil {
		f.t.Fatalf("task: %v", err)
	}
}

func (f *fakeCore) stat(name string) int {
	L := f.L
	if err := L.CallByParam(glua.P{Fn: L.GetGlobal("hapilot_stats"), NRet: 1, Protect: true}); err != nil {
		f.t.Fatalf("hapilot_stats: %v", err)
	}
	stats := L.Get(-1)
	L.Pop(1)
	return int(glua.LVAsNumber(L.GetField(stats, name)))
}

// lines is a batch's lines, sorted: the companion sends them in table
// order, which Lua does not define.
func lines(batch string) []string {
	if !strings.HasSuffix(batch, "\n") {
		return []string{"no final newline: " + batch}
	}
	ls := strings.Split(strings.TrimSuffix(batch, "\n"), "\n")
	slices.Sort(ls)
	return ls
}

var env = map[string]string{"HAPILOT_LUA_AGENT": "127.0.0.1:4242", "HAPILOT_LUA_FLUSH_MS": "100", "HAPILOT_LUA_MAX": "5"}

func TestFlushSendsOneBatch(t *testing.T) {
	f := newFakeCore(t, env)
	f.tick() // the task starts and sleeps
	f.respond("app", "srv1", 200, "12")
	f.respond("app", "srv3", 500, "9")
	f.respond("app", "srv1", 200, "12") // identical: counted in one line
	f.respond("app", "", 503, "")       // HAProxy answered itself: sent; the agent counts it apart
	f.respond("app", "srv2", 200, "")   // no %Tr: -1
	f.tick()
	want := []string{"app <NOSRV> 503 -1 1", "app srv1 200 12 2", "app srv2 200 -1 1", "app srv3 500 9 1"}
	if len(f.batches) != 1 || !slices.Equal(lines(f.batches[0]), want) {
		t.Fatalf("batches %q, want one with %q", f.batches, want)
	}
	f.tick() // nothing buffered: no connection
	if f.connects != 1 || f.stat("sent") != 5 || f.stat("recorded") != 5 || f.stat("buffered") != 0 {
		t.Fatalf("connects %d, sent %d, recorded %d, buffered %d", f.connects, f.stat("sent"), f.stat("recorded"), f.stat("buffered"))
	}
	if f.sleeps[0] != 100 || f.sleeps[len(f.sleeps)-1] != 100 {
		t.Fatalf("sleeps %v", f.sleeps)
	}
}

// The table holds at most HAPILOT_LUA_MAX distinct lines: when it is
// full, a new line is dropped and counted, a line already in it still
// counts.
func TestTableIsBounded(t *testing.T) {
	f := newFakeCore(t, env)
	f.tick()
	for i := 0; i < 8; i++ {
		want := 1
		if i >= 5 {
			want = 0
		}
		if got := f.respond("app", "srv1", 200, fmt.Sprint(i)); got != want {
			t.Fatalf("response %d: converter returned %d, want %d", i, got, want)
		}
	}
	if got := f.respond("app", "srv1", 200, "0"); got != 1 {
		t.Fatalf("a line already counted, table full: converter returned %d, want 1", got)
	}
	if f.stat("dropped_full") != 3 || f.stat("recorded") != 6 {
		t.Fatalf("dropped %d, recorded %d", f.stat("dropped_full"), f.stat("recorded"))
	}
	f.tick()
	want := []string{"app srv1 200 0 2", "app srv1 200 1 1", "app srv1 200 2 1", "app srv1 200 3 1", "app srv1 200 4 1"}
	if len(f.batches) != 1 || !slices.Equal(lines(f.batches[0]), want) {
		t.Fatalf("batches %q, want one with %q", f.batches, want)
	}
	if got := f.respond("app", "srv1", 200, "7"); got != 1 { // room again after the flush
		t.Fatalf("after the flush: converter returned %d, want 1", got)
	}
}

// Agent down: batches are dropped and counted, the task backs off; when
// the agent is back, flushing resumes at the normal pace.
func TestAgentDownBackoffAndReconnect(t *testing.T) {
	f := newFakeCore(t, env)
	f.tick()
	f.agentUp = false
	for i := 0; i < 3; i++ {
		f.respond("app", "srv1", 200, "1")
		f.tick()
	}
	if f.stat("dropped_down") != 3 || f.stat("failed_flushes") != 3 || len(f.batches) != 0 {
		t.Fatalf("dropped %d, failed %d, batches %d", f.stat("dropped_down"), f.stat("failed_flushes"), len(f.batches))
	}
	// Sleeps grow: 100, then 100+100, 100+300, 100+700.
	if got := f.sleeps; len(got) != 4 || got[1] != 200 || got[2] != 400 || got[3] != 800 {
		t.Fatalf("sleeps %v", got)
	}
	f.agentUp = true
	f.respond("app", "srv2", 500, "4")
	f.tick()
	f.tick()
	if len(f.batches) != 1 || f.batches[0] != "app srv2 500 4 1\n" || f.sleeps[len(f.sleeps)-1] != 100 {
		t.Fatalf("after reconnect: batches %q, sleeps %v", f.batches, f.sleeps)
	}
}

// HAPILOT_LUA_AGENT may name a unix socket, passed whole to connect().
func TestUnixSocketAgent(t *testing.T) {
	f := newFakeCore(t, map[string]string{"HAPILOT_LUA_AGENT": "unix@/run/hapilot/lua.sock", "HAPILOT_LUA_FLUSH_MS": "100", "HAPILOT_LUA_MAX": "5"})
	f.tick()
	f.respond("app", "srv1", 200, "12")
	f.tick()
	if f.connects != 1 || len(f.batches) != 1 {
		t.Fatalf("connects %d, batches %q", f.connects, f.batches)
	}
}
