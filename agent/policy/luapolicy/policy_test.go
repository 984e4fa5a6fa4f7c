package luapolicy

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/rs/zerolog"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

func policyFrom(t *testing.T, src string) (*Policy, error) {
	t.Helper()
	p, err := newPolicy("test.lua", src, zerolog.Nop())
	if p != nil {
		t.Cleanup(p.Close)
	}
	return p, err
}

// stepContext is a step's context: the deadline the loop would set.
func stepContext(t *testing.T, budget time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	t.Cleanup(cancel)
	return ctx
}

func oneBackend(servers ...agent.ServerView) agent.Observation {
	return agent.Observation{Time: time.Unix(1000, 0), Backends: []agent.BackendView{{Name: "app", Servers: servers}}}
}

func srv(name string, req, e5 uint64) agent.ServerView {
	return agent.ServerView{Backend: "app", Server: name, Owner: agent.OwnerNone,
		State:  haproxy.ServerState{Backend: "app", Server: name, OpState: haproxy.OpRunning, Weight: 8, Initial: 8},
		Window: window.Stats{Requests: req, Err5xx: e5, P95Ms: 12}}
}

func TestSandbox(t *testing.T) {
	tests := []struct {
		name, src, loadErr, decideErr string
	}{
		{"no decide", `x = 1`, "no function decide", ""},
		{"syntax error", `function decide(obs`, "test.lua", ""},
		{"os is gone", `function decide(obs) os.execute("true") end`, "", "non-"},
		{"io is gone", `function decide(obs) io.open("/etc/passwd") end`, "", "non-"},
		{"require is gone", `function decide(obs) require("x") end`, "", "non-"},
		{"load is gone", `function decide(obs) load("return 1")() end`, "", "non-"},
		{"dofile is gone", `function decide(obs) dofile("/etc/passwd") end`, "", "non-"},
		{"runaway loop", `function decide(obs) while true do end end`, "", "deadline"},
		{"runaway at load", `while true do end`, "test.lua", ""},
		{"error()", `function decide(obs) error("boom") end`, "", "boom"},
		{"returns a string", `function decide(obs) return "drain srv1" end`, "", "string"},
		{"unknown action", `function decide(obs) return {{action="reboot", backend="app", server="s1"}} end`, "", "unknown action"},
		{"bad name", `function decide(obs) return {{action="drain", backend="app", server="s1;shutdown"}} end`, "", "server"},
		{"weight out of range", `function decide(obs) return {{action="set_weight", backend="app", server="s1", weight=300}} end`, "", "weight"},
		{"fractional weight", `function decide(obs) return {{action="set_weight", backend="app", server="s1", weight=1.5}} end`, "", "weight"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policyFrom(t, tc.src)
			if tc.loadErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.loadErr) {
					t.Fatalf("load: %v, want %q", err, tc.loadErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			plan, err := p.Decide(stepContext(t, 200*time.Millisecond), oneBackend(srv("s1", 100, 0)))
			if err == nil || !strings.Contains(err.Error(), tc.decideErr) || plan != nil {
				t.Fatalf("decide: %v %v, want %q", plan, err, tc.decideErr)
			}
			if time.Since(start) > 2*time.Second {
				t.Fatalf("decide took %v", time.Since(start))
			}
		})
	}
}

func TestStatePersistsAndPrintIsLogged(t *testing.T) {
	p, err := policyFrom(t, `n = 0
function decide(obs)
  n = n + 1
  print("step", n)
  if n == 2 then return {{action="drain", backend="app", server=obs.backends[1].servers[1].name, reason="second"}} end
  return {}
end`)
	if err != nil {
		t.Fatal(err)
	}
	obs := oneBackend(srv("s1", 100, 0), srv("s2", 100, 0))
	if plan, err := p.Decide(context.Background(), obs); err != nil || len(plan) != 0 {
		t.Fatalf("first: %v %v", plan, err)
	}
	plan, err := p.Decide(context.Background(), obs)
	if err != nil || len(plan) != 1 || plan[0].Server != "s1" || plan[0].Reason != "lua: second" {
		t.Fatalf("second: %+v %v", plan, err)
	}
}

// TestExamplePolicies: testdata/policies/<policy>/<case>.json holds an
// observation, <case>.golden the plan examples/policies/<policy>.lua
// returns for it.
func TestExamplePolicies(t *testing.T) {
	dirs, err := filepath.Glob("testdata/policies/*")
	if err != nil || len(dirs) < 2 {
		t.Fatalf("golden dirs %v %v", dirs, err)
	}
	for _, dir := range dirs {
		name := filepath.Base(dir)
		p, err := Load(filepath.Join("..", "..", "..", "examples", "policies", name+".lua"), zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		cases, _ := filepath.Glob(filepath.Join(dir, "*.json"))
		for _, c := range cases {
			t.Run(name+"/"+filepath.Base(c), func(t *testing.T) {
				raw, err := os.ReadFile(c)
				if err != nil {
					t.Fatal(err)
				}
				var obs agent.Observation
				if err := json.Unmarshal(raw, &obs); err != nil {
					t.Fatal(err)
				}
				plan, err := p.Decide(context.Background(), obs)
				if err != nil {
					t.Fatal(err)
				}
				got, _ := json.MarshalIndent(plan, "", "  ")
				got = append(got, '\n')
				golden := strings.TrimSuffix(c, ".json") + ".golden"
				if *update {
					os.WriteFile(golden, got, 0o644)
				}
				want, err := os.ReadFile(golden)
				if err != nil || string(got) != string(want) {
					t.Fatalf("plan:\n%s\nwant:\n%s (%v)", got, want, err)
				}
			})
		}
		p.Close()
	}
}

func TestNeeds(t *testing.T) {
	for _, tc := range []struct {
		src     string
		want    int
		wantErr string
	}{
		{"function decide(obs) end", 0, ""},
		{"needs = {drains_per = 3}\nfunction decide(obs) end", 3, ""},
		{"needs = {}\nfunction decide(obs) end", 0, ""},
		{"needs = 3\nfunction decide(obs) end", 0, "needs is a number"},
		{"needs = {drains_per = 0}\nfunction decide(obs) end", 0, "drains_per 0"},
		{"needs = {drains_per = 2.5}\nfunction decide(obs) end", 0, "drains_per 2.5"},
		{"needs = {drains_per = 'x'}\nfunction decide(obs) end", 0, "is a string"},
	} {
		p, err := newPolicy("t.lua", tc.src, zerolog.Nop())
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: error %v, want %q", tc.src, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tc.src, err)
		}
		if got := p.needs.DrainsPer; got != tc.want {
			t.Errorf("%q: drains_per %d, want %d", tc.src, got, tc.want)
		}
		p.Close()
	}
}

// A built-in that runs past the deadline (a pattern match of exponential
// cost) is abandoned: its worker is killed, the step gets an error at
// once, and the policy makes no more calls. Before, the loop hung until
// the match ended; then the abandoned call went on burning a CPU in the
// agent; now the worker, and the match with it, is gone.
func TestRunawayBuiltinIsAbandoned(t *testing.T) {
	src := `function decide(obs) string.find(("a"):rep(200), ".-.-.-b") return {} end`
	p, err := newPolicy("t.lua", src, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	began := time.Now()
	if _, err := p.Decide(stepContext(t, 100*time.Millisecond), agent.Observation{}); err == nil || !strings.Contains(err.Error(), "its worker was killed") {
		t.Fatalf("err %v", err)
	}
	if _, err := p.Decide(stepContext(t, 100*time.Millisecond), agent.Observation{}); err == nil {
		t.Fatal("a broken policy was called again")
	}
	if d := time.Since(began); d > time.Second {
		t.Fatalf("the steps waited %v for the runaway call", d)
	}
	if err := syscall.Kill(p.w.cmd.Process.Pid, 0); err == nil {
		t.Fatal("the worker running the match is still alive")
	}
}

// Strings are bounded, the register dump is gone, and a script that keeps
// too much breaks.
func TestSandboxLimits(t *testing.T) {
	for _, tc := range []struct {
		name, src, want string
	}{
		{"huge rep", `function decide(obs) local s = string.rep("x", 8 * 1024 * 1024 * 1024) return {} end`, "string.rep: a result over"},
		{"huge rep as a method", `function decide(obs) local s = ("xy"):rep(1024 * 1024) return {} end`, "string.rep: a result over"},
		{"long subject", `function decide(obs) string.match(("a"):rep(5000), "b") return {} end`, "a subject over"},
		{"register dump", `function decide(obs) _printregs() return {} end`, "attempt to call a non-function"},
		{"keeps too much", `kept = {} function decide(obs) for i = 1, 200000 do kept[i] = i end return {} end`, "globals hold over"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := newPolicy("t.lua", tc.src, zerolog.Nop())
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if _, err := p.Decide(stepContext(t, 10*time.Second), agent.Observation{}); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	// Within the limits, all works.
	p, err := newPolicy("t.lua", `n = 0 function decide(obs) n = n + 1 local s = ("ab"):rep(10) if s:find("ba") then return {} end end`, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := 0; i < 3; i++ {
		if _, err := p.Decide(context.Background(), agent.Observation{}); err != nil {
			t.Fatal(err)
		}
	}
}

// A script cannot crash the agent. Here decide puts a metatable on _G
// whose __index raises, then removes itself: the next step's lookup of
// decide ran that __index outside any protected call, and the panic took
// the agent down (exit code 2). Every call into the VM is protected now,
// and the lookup is a raw one: the step gets an error, the agent goes on.
func TestScriptCannotCrashTheAgent(t *testing.T) {
	tests := []struct {
		name, src, want string
	}{
		{"decide removes itself behind a raising __index", `function decide(obs)
  setmetatable(_G, {__index = function(t, k) error("no global " .. k) end})
  decide = nil
  return {}
end`, "decide is a nil now"},
		{"a raising __index on every global, decide kept", `function decide(obs)
  setmetatable(_G, {__index = function(t, k) error("no global " .. k) end, __newindex = function() error("read-only") end})
  return {}
end`, ""},
		{"decide replaced by a table", `function decide(obs) decide = {} return {} end`, "decide is a table now"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policyFrom(t, tc.src)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Decide(stepContext(t, 2*time.Second), oneBackend(srv("s1", 100, 0))); err != nil {
				t.Fatalf("first call: %v", err)
			}
			for i := 0; i < 2; i++ {
				_, err := p.Decide(stepContext(t, 2*time.Second), oneBackend(srv("s1", 100, 0)))
				if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
					t.Fatalf("call %d: %v, want %q", i+2, err, tc.want)
				}
			}
		})
	}
}

// peakRSS is this process's peak resident set (VmHWM), in bytes.
func peakRSS(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status")
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb uint64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// A script's memory is bounded, and not the agent's: a string doubled 29
// times (512 MiB), a table filled until the deadline, or one kept in an
// upvalue and grown every step (out of MaxKept's sight, which counts only
// the globals) ends in the worker, at MaxMemory, and the policy breaks.
// Before, they ran in the agent: the test process's peak RSS rose by
// 2,438 MiB for the string alone.
func TestScriptMemoryIsBounded(t *testing.T) {
	tests := []struct {
		name, src string
		budget    time.Duration
	}{
		{"a string doubled 29 times", `function decide(obs) local s = "x" for i = 1, 29 do s = s .. s end return {} end`, 20 * time.Second},
		// Entries of 64 KiB each, so that the bound comes long before the
		// deadline even under the race detector on a loaded machine.
		{"a table filled until the deadline", `function decide(obs) local t, i = {}, 0 while true do i = i + 1 t[i] = ("x"):rep(65536) .. i end end`, 20 * time.Second},
		{"a table kept in an upvalue, a step at a time", `local kept = {}
function decide(obs) for i = 1, 1000 do kept[#kept + 1] = ("x"):rep(65536) .. i end return {} end`, 20 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each in its own worker; this process only waits
			p, err := policyFrom(t, tc.src)
			if err != nil {
				t.Fatal(err)
			}
			before := peakRSS(t)
			began := time.Now()
			var last error
			for i := 0; i < 20 && last == nil; i++ {
				_, last = p.Decide(stepContext(t, tc.budget), oneBackend(srv("s1", 100, 0)))
			}
			took := time.Since(began)
			grew := int64(peakRSS(t)) - int64(before)
			t.Logf("%v after %v; this process's peak RSS grew %d MiB", last, took.Round(time.Millisecond), grew>>20)
			if last == nil || !strings.Contains(last.Error(), "memory bound") {
				t.Fatalf("err %v, want the worker's memory bound", last)
			}
			if grew > 128<<20 {
				t.Fatalf("this process's peak RSS grew %d MiB: the script's memory was the agent's", grew>>20)
			}
			if _, err := p.Decide(stepContext(t, time.Second), oneBackend(srv("s1", 100, 0))); err == nil || !strings.Contains(err.Error(), "memory bound") {
				t.Fatalf("after the bound: %v, want the policy broken", err)
			}
		})
	}
}

// What a script says is bounded: its reasons (agent.MaxReason, as every
// policy's), its errors (MaxMessage) and its print lines (MaxPrints a
// call, each MaxMessage). Before, a 1 MiB error went into every step's
// audit record and log, and a print loop wrote as much as it could until
// the deadline.
func TestScriptOutputIsBounded(t *testing.T) {
	var logs strings.Builder
	log := zerolog.New(&logs)
	tests := []struct {
		name, src string
		check     func(t *testing.T, plan agent.Plan, err error)
	}{
		{"a 1 MiB reason", `function decide(obs) return {{action="drain", backend="app", server="s1", reason=string.rep("r", 1048576)}} end`,
			func(t *testing.T, plan agent.Plan, err error) {
				if err != nil || len(plan) != 1 || len(plan[0].Reason) > len("lua: ")+agent.MaxReason+len("...") {
					t.Fatalf("%d actions, reason of %d bytes, %v", len(plan), len(plan[0].Reason), err)
				}
			}},
		{"a 1 MiB error", `function decide(obs) error(string.rep("e", 1048576)) end`,
			func(t *testing.T, plan agent.Plan, err error) {
				if err == nil || len(err.Error()) > MaxMessage+200 {
					t.Fatalf("error of %d bytes", len(err.Error()))
				}
			}},
		{"2,000 prints of 5,000 bytes", `function decide(obs) for i = 1, 2000 do print(string.rep("p", 5000)) end return {} end`,
			func(t *testing.T, plan agent.Plan, err error) {
				if err != nil {
					t.Fatal(err)
				}
				lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
				if len(lines) > MaxPrints+1 {
					t.Fatalf("%d log lines, want at most %d prints and one warning", len(lines), MaxPrints)
				}
				for _, l := range lines {
					if len(l) > MaxMessage+300 {
						t.Fatalf("a log line of %d bytes", len(l))
					}
				}
				if !strings.Contains(lines[len(lines)-1], `"dropped":1900`) {
					t.Fatalf("last line %s, want the dropped lines counted", lines[len(lines)-1])
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logs.Reset()
			p, err := newPolicy("t.lua", tc.src, log)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			plan, err := p.Decide(stepContext(t, 10*time.Second), oneBackend(srv("s1", 100, 0)))
			tc.check(t, plan, err)
		})
	}
}

// Close stops the worker: no process outlives the policy.
func TestCloseStopsTheWorker(t *testing.T) {
	p, err := policyFrom(t, `function decide(obs) return {} end`)
	if err != nil {
		t.Fatal(err)
	}
	pid := p.w.cmd.Process.Pid
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("worker %d not running: %v", pid, err)
	}
	p.Close()
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("worker %d still running after Close", pid)
	}
	if _, err := p.Decide(stepContext(t, time.Second), oneBackend(srv("s1", 100, 0))); err == nil {
		t.Fatal("a closed policy answered")
	}
}
