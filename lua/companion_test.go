package lua

import (
	"fmt"
	"strings"
	"testing"

	glua "github.com/yuin/gopher-lua"
)

// fakeCore runs hapilot.lua in gopher-lua against a stand-in for HAProxy's
// `core`: register_action and register_task keep the functions,
// core.msleep yields the task's coroutine (so the test drives time), and
// core.tcp() returns a socket whose peer is the test.
type fakeCore struct {
	t        *testing.T
	L        *glua.LState
	action   *glua.LFunction
	task     *glua.LState // the task's coroutine
	taskFn   *glua.LFunction
	sleeps   []int
	agentUp  bool
	batches  []string
	connects int
}

func newFakeCore(t *testing.T, env map[string]string) *fakeCore {
	for k, v := range env {
		t.Setenv(k, v)
	}
	L := glua.NewState()
	t.Cleanup(L.Close)
	f := &fakeCore{t: t, L: L, agentUp: true}
	core := L.NewTable()
	L.SetField(core, "register_action", L.NewFunction(func(L *glua.LState) int {
		if L.CheckString(1) != "hapilot-record" {
			t.Errorf("action name %q", L.CheckString(1))
		}
		f.action = L.CheckFunction(3)
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
	if f.action == nil || f.taskFn == nil {
		t.Fatal("hapilot.lua registered no action or no task")
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
		if host, port := L.CheckString(2), L.CheckInt(3); host != "127.0.0.1" || port != 4242 {
			f.t.Errorf("connect to %s:%d", host, port)
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

// respond runs the http-res action for one response, with the line
// HAProxy's set-var-fmt(txn.hapilot) "%b %s %ST %Tr" would have built.
func (f *fakeCore) respond(backend, server string, status int, tr string) {
	L := f.L
	if server == "" {
		server = "<NOSRV>"
	}
	if tr == "" {
		tr = "-1"
	}
	line := fmt.Sprintf("%s %s %d %s", backend, server, status, tr)
	txn := L.NewTable()
	L.SetField(txn, "get_var", L.NewFunction(func(L *glua.LState) int {
		if L.CheckString(2) != "txn.hapilot" {
			L.Push(glua.LNil)
		} else {
			L.Push(glua.LString(line))
		}
		return 1
	}))
	if err := L.CallByParam(glua.P{Fn: f.action, NRet: 0, Protect: true}, txn); err != nil {
		f.t.Fatalf("action: %v", err)
	}
}

// tick lets the task run until its next sleep.
func (f *fakeCore) tick() {
	if _, err, _ := f.L.Resume(f.task, f.taskFn); err != nil {
		f.t.Fatalf("task: %v", err)
	}
}

func (f *fakeCore) stat(name string) int {
	return int(glua.LVAsNumber(f.L.GetField(f.L.GetGlobal("hapilot_stats"), name)))
}

var env = map[string]string{"HAPILOT_LUA_AGENT": "127.0.0.1:4242", "HAPILOT_LUA_FLUSH_MS": "100", "HAPILOT_LUA_MAX": "5"}

func TestFlushSendsOneBatch(t *testing.T) {
	f := newFakeCore(t, env)
	f.tick() // the task starts and sleeps
	f.respond("app", "srv1", 200, "12")
	f.respond("app", "srv3", 500, "9")
	f.respond("app", "", 503, "")     // HAProxy answered itself: sent; the agent counts it apart
	f.respond("app", "srv2", 200, "") // no %Tr: -1
	f.tick()
	if len(f.batches) != 1 || f.batches[0] != "app srv1 200 12\napp srv3 500 9\napp <NOSRV> 503 -1\napp srv2 200 -1\n" {
		t.Fatalf("batches %q", f.batches)
	}
	f.tick() // nothing buffered: no connection
	if f.connects != 1 || f.stat("sent") != 4 {
		t.Fatalf("connects %d, sent %d", f.connects, f.stat("sent"))
	}
	if f.sleeps[0] != 100 || f.sleeps[len(f.sleeps)-1] != 100 {
		t.Fatalf("sleeps %v", f.sleeps)
	}
}

func TestBufferIsBounded(t *testing.T) {
	f := newFakeCore(t, env)
	f.tick()
	for i := 0; i < 8; i++ {
		f.respond("app", "srv1", 200, "1")
	}
	if f.stat("dropped_full") != 3 || f.stat("recorded") != 5 {
		t.Fatalf("dropped %d, recorded %d", f.stat("dropped_full"), f.stat("recorded"))
	}
	f.tick()
	if len(f.batches) != 1 || strings.Count(f.batches[0], "\n") != 5 {
		t.Fatalf("batches %q", f.batches)
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
	if len(f.batches) != 1 || f.batches[0] != "app srv2 500 4\n" || f.sleeps[len(f.sleeps)-1] != 100 {
		t.Fatalf("after reconnect: batches %q, sleeps %v", f.batches, f.sleeps)
	}
}
