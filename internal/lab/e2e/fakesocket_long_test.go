//go:build e2e && faults

package e2e

// Issue 41's check of the real agent at scale: `hapilot run`, on the
// counters path, in front of a fake runtime socket (internal/lab/
// fakesocket) that simulates 10 backends of 9 servers, the servers
// differing by σ 0.3 around a 0.2% median. No real HAProxy and backends
// could carry 90 servers at 300 req/s each for ten minutes on a CI
// machine; the counters path reads only what `show stat` prints, which
// the fake prints in HAProxy 2.6's columns (checked against a live one in
// its own tests).

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/fakesocket"
)

// fakeFleetRun is one agent in front of one fake socket.
type fakeFleetRun struct {
	policy   string
	args     []string
	fleet    fakesocket.Config
	duration time.Duration
}

// fakeFleetResult is what the fake saw of the agent.
type fakeFleetResult struct {
	commands []fakesocket.Command
	truths   []fakesocket.Truth
	agentLog string
	started  time.Time
}

// runFakeFleet starts the fake and `hapilot run` with its own control
// socket, state file and audit log, lets it run for r.duration, checks
// it is still running, and stops it.
func runFakeFleet(t *testing.T, r fakeFleetRun) fakeFleetResult {
	t.Helper()
	dir := t.TempDir()
	fake, err := fakesocket.Start(filepath.Join(dir, "admin.sock"), r.fleet)
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	logPath := filepath.Join(dir, "agent.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	args := append([]string{"run", "--log-format", "json", "--mode", "enforce", "--interval", "1s",
		"--haproxy-socket", "unix:" + fake.Path(), "--spoe-listen", "off", "--status-listen", "off",
		"--control-socket", "unix:" + filepath.Join(dir, "ctl.sock"), "--state-file", filepath.Join(dir, "state.json"),
		"--audit-log", filepath.Join(dir, "audit.jsonl")}, r.args...)
	cmd := exec.Command(agentBinary, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	readLog := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	select {
	case err := <-exited:
		t.Fatalf("%s: agent exited at once: %v\n%s", r.policy, err, readLog())
	case <-time.After(r.duration):
	}
	select {
	case err := <-exited:
		t.Fatalf("%s: agent exited during the run: %v\n%s", r.policy, err, tail(readLog(), 4000))
	default:
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-exited
		t.Errorf("%s: agent still running 30 s after SIGTERM", r.policy)
	}
	res := fakeFleetResult{commands: fake.Commands(), truths: fake.Truths(), agentLog: readLog(), started: fake.Started()}
	if !strings.Contains(res.agentLog, "hapilot running") {
		t.Errorf("%s: the agent never logged \"hapilot running\":\n%s", r.policy, tail(res.agentLog, 4000))
	}
	return res
}

// touched maps each server a command changed to those commands.
func (res fakeFleetResult) touched() map[string][]string {
	out := map[string][]string{}
	for _, c := range res.commands {
		f := strings.Fields(c.Text)
		if len(f) >= 3 && f[0] == "set" && (f[1] == "server" || f[1] == "weight") {
			out[f[2]] = append(out[f[2]], c.Text)
		}
	}
	return out
}

// summary is one line for the log: the agent's reads, its commands and
// the fleet's traffic.
func (res fakeFleetResult) summary(name string, d time.Duration) string {
	kinds := map[string]int{}
	for _, c := range res.commands {
		f := strings.Fields(c.Text)
		k := c.Text
		if len(f) >= 2 && f[0] == "set" {
			k = strings.Join(f[:2], " ")
			if f[1] == "server" && len(f) == 5 {
				k += " state " + f[4]
			}
		}
		kinds[k]++
	}
	var req, fails int64
	var rates []float64
	for _, tr := range res.truths {
		req, fails = req+tr.Requests, fails+tr.Fails
		if !tr.Faulty {
			rates = append(rates, tr.HealthyRate)
		}
	}
	slices.Sort(rates)
	keys := make([]string, 0, len(kinds))
	for k := range kinds {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var cmds []string
	for _, k := range keys {
		cmds = append(cmds, fmt.Sprintf("%s: %d", k, kinds[k]))
	}
	return fmt.Sprintf("%s: %v, %d servers, %d requests, %d 5xx; healthy rates %.3f%%..%.3f%% (median %.3f%%); commands {%s}",
		name, d, len(res.truths), req, fails, 100*rates[0], 100*rates[len(rates)-1], 100*rates[len(rates)/2], strings.Join(cmds, ", "))
}

func fmtSeconds(xs []float64) string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = strconv.FormatFloat(x, 'f', 1, 64)
	}
	return "[" + strings.Join(out, " ") + "]"
}

func envOr[T any](t *testing.T, name string, def T, parse func(string) (T, error)) T {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	x, err := parse(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return x
}

// TestRealAgentFakeFleetNoFalseDrain is issue 41's line: the real agent,
// on the counters path in front of a fake runtime socket with 10
// backends of 9 servers at 300 req/s differing by σ 0.3, drains no
// healthy server in 10 minutes, with --policy rules and with --policy llm
// whose model is unreachable (a closed port: the rules act meanwhile).
// The two agents run side by side, each with its own fake of the same
// fleet and seed. A positive control runs beside them: the same fleet
// with one server per backend failing 5% from 15 s, for 75 s, where each
// agent must drain exactly the ten faulty servers, so that a harness
// whose agent reads nothing cannot pass. HAPILOT_FAKESOCK_DURATION (10m),
// HAPILOT_FAKESOCK_SEED (41) and HAPILOT_FAKESOCK_RATE (300, each
// server's requests per second) change the long runs.
func TestRealAgentFakeFleetNoFalseDrain(t *testing.T) {
	dur := envOr(t, "HAPILOT_FAKESOCK_DURATION", 10*time.Minute, time.ParseDuration)
	seed := envOr(t, "HAPILOT_FAKESOCK_SEED", uint64(41), func(s string) (uint64, error) { return strconv.ParseUint(s, 10, 64) })
	rate := envOr(t, "HAPILOT_FAKESOCK_RATE", 300.0, func(s string) (float64, error) { return strconv.ParseFloat(s, 64) })

	// The model's address: a port that was free a moment ago, closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	model := "http://" + ln.Addr().String()
	ln.Close()
	policies := map[string][]string{
		"rules": {"--policy", "rules"},
		"llm":   {"--policy", "llm", "--model", "unreachable", "--llm-url", model, "--skip-calibration"},
	}
	fleet := fakesocket.Config{Backends: 10, Servers: 9, Rate: rate, Median: 0.002, Sigma: 0.3, Seed: seed}
	control := fleet
	control.Rate, control.Fault = 300, &fakesocket.Fault{Rate: 0.05, From: 15 * time.Second}

	var wg sync.WaitGroup
	for policy, args := range policies {
		for _, kind := range []string{"healthy", "control"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t.Run(policy+"-"+kind, func(t *testing.T) {
					r := fakeFleetRun{policy: policy, args: args, fleet: fleet, duration: dur}
					if kind == "control" {
						r.fleet, r.duration = control, 75*time.Second
					}
					res := runFakeFleet(t, r)
					t.Log(res.summary(policy+" "+kind, r.duration))
					faulty := map[string]bool{}
					for _, tr := range res.truths {
						if tr.Faulty {
							faulty[tr.Backend+"/"+tr.Server] = true
						}
					}
					touched := res.touched()
					var healthyHit, faultyDrained []string
					for srv, cmds := range touched {
						if !faulty[srv] {
							healthyHit = append(healthyHit, fmt.Sprintf("%s (%s)", srv, strings.Join(cmds, "; ")))
						} else if slices.ContainsFunc(cmds, func(c string) bool {
							return strings.HasSuffix(c, " state drain") || strings.HasSuffix(c, " state maint")
						}) {
							faultyDrained = append(faultyDrained, srv)
						}
					}
					slices.Sort(healthyHit)
					slices.Sort(faultyDrained)
					// Each faulty server's first drain, in seconds after
					// its fault began.
					var after []float64
					seen := map[string]bool{}
					for _, c := range res.commands {
						f := strings.Fields(c.Text)
						if len(f) == 5 && f[1] == "server" && f[4] == "drain" && faulty[f[2]] && !seen[f[2]] {
							seen[f[2]] = true
							after = append(after, c.At.Sub(res.started.Add(r.fleet.Fault.From)).Seconds())
						}
					}
					slices.Sort(after)
					t.Logf("%s %s: healthy servers acted on: %d; faulty servers drained: %d of %d, at %s s after the fault began",
						policy, kind, len(healthyHit), len(faultyDrained), len(faulty), fmtSeconds(after))
					for _, h := range healthyHit {
						t.Errorf("%s %s: healthy server acted on: %s", policy, kind, h)
					}
					if len(faultyDrained) != len(faulty) {
						t.Errorf("%s %s: drained %v of the faulty %v", policy, kind, faultyDrained, faulty)
					}
					// The agent read the counters all along: a poll every
					// 500 ms, a quarter of them at least on a busy machine.
					polls := 0
					for _, c := range res.commands {
						if c.Text == "show stat" {
							polls++
						}
					}
					if want := int(r.duration / (4 * 500 * time.Millisecond)); polls < want {
						t.Errorf("%s %s: %d show stat reads in %v, want %d at least", policy, kind, polls, r.duration, want)
					}
					// The model was never reached: the rules acted alone.
					if policy == "llm" && !strings.Contains(res.agentLog, "the rules act meanwhile") {
						t.Errorf("llm %s: the agent never logged the model as unusable (%s)", kind, model)
					}
					if t.Failed() {
						t.Logf("%s %s: agent log's end:\n%s", policy, kind, tail(res.agentLog, 6000))
					}
				})
			}()
		}
	}
	wg.Wait()
}
