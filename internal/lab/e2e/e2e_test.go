//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/labtest"
	"github.com/hapilot/hapilot/internal/lab/scenario"
	"github.com/negasus/haproxy-spoe-go/frame"
	"github.com/rs/zerolog"
)

// agentBinary is `hapilot` (the agent), benchBinary `hapilot-bench` (the
// lab), both built once for the package.
var agentBinary, benchBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hapilot-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentBinary, benchBinary = filepath.Join(dir, "hapilot"), filepath.Join(dir, "hapilot-bench")
	for bin, pkg := range map[string]string{agentBinary: "./cmd/hapilot", benchBinary: "./cmd/hapilot-bench"} {
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Dir = "../../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", pkg, err, out)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// paperFleet is the study's fleet: ~9 ms answers plus up to 4 ms jitter.
func paperFleet(rates ...float64) []fleet.BackendConfig {
	out := make([]fleet.BackendConfig, len(rates))
	for i, r := range rates {
		out[i] = fleet.BackendConfig{ErrorRate: r, Latency: 9 * time.Millisecond, Jitter: 4 * time.Millisecond, Capacity: 64, Seed: uint64(100 + i)}
	}
	return out
}

// sideBySide runs each scenario as a subtest of t, all at once, and
// returns the outcomes of those that ran, with each one's audit log, read
// before its subtest's directory is removed.
func sideBySide(t *testing.T, runs map[string]scenario.Scenario) (map[string]*scenario.Outcome, map[string][]byte) {
	t.Helper()
	outs, audits := map[string]*scenario.Outcome{}, map[string][]byte{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, s := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(name, func(t *testing.T) {
				out := run(t, s)
				audit, _ := os.ReadFile(out.AuditLog)
				mu.Lock()
				outs[name], audits[name] = out, audit
				mu.Unlock()
			})
		}()
	}
	wg.Wait()
	return outs, audits
}

func run(t *testing.T, s scenario.Scenario) *scenario.Outcome {
	t.Helper()
	labtest.RequireHAProxy(t)
	s.Dir = t.TempDir()
	if s.Interval == 0 {
		s.Interval = time.Second
	}
	s.Log = zerolog.Nop()
	ctx, cancel := context.WithTimeout(context.Background(), s.Duration+2*time.Minute)
	defer cancel()
	out, err := s.Run(ctx)
	if err != nil {
		t.Fatalf("scenario (%s): %v", s.Policy, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s: haproxy output:\n%s", s.Policy, out.HAProxy.Log())
			if l := out.AgentLog(); l != "" {
				t.Logf("%s: agent output:\n%s", s.Policy, l)
			}
			if b, err := os.ReadFile(out.AuditLog); err == nil {
				t.Logf("%s: last audit lines:\n%s", s.Policy, tail(string(b), 4000))
			}
		}
	})
	name := s.Name
	if name == "" {
		name = s.Policy
	}
	if name == "" {
		name = "plain"
	}
	t.Logf("%s: %d requests, %d 5xx, %d failed, p50 %v p99 %v, drained at %v, flips %v",
		name, out.Load.Scheduled, out.Load.Err5xx, out.Load.Failed, out.Load.Quantile(.5), out.Load.Quantile(.99), out.DrainedAt, out.Flips)
	return out
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func finalState(out *scenario.Outcome, server string) haproxy.ServerState {
	for _, st := range out.Final {
		if st.Backend == fleet.BackendName && st.Server == server {
			return st
		}
	}
	return haproxy.ServerState{}
}

// The agent (a `hapilot run` process) is killed in the middle of the load:
// no client request fails because of it and HAProxy keeps its throughput.
func TestAgentKilledMidLoad(t *testing.T) {
	t.Parallel()
	out := run(t, scenario.Scenario{Servers: paperFleet(0, 0, 0, 0), Rate: 300, Duration: 30 * time.Second,
		Policy: "rules", AgentBinary: agentBinary, KillAgentAt: 10 * time.Second, SPOETime: true})
	if out.Load.Failed != 0 || out.Load.Err5xx != 0 {
		t.Fatalf("%d failed and %d 5xx requests (healthy fleet)", out.Load.Failed, out.Load.Err5xx)
	}
	if out.Load.Completed != out.Load.Scheduled {
		t.Fatalf("%d of %d requests completed", out.Load.Completed, out.Load.Scheduled)
	}
	// Every second after the kill carried the full rate.
	for i, s := range out.Load.PerSecond[:30] {
		if s.Requests < 290 {
			t.Errorf("second %d: %d requests", i, s.Requests)
		}
	}
	// A dead agent must not hold traffic. That is read from HAProxy's own
	// clock: the engine's set-total-time, on each answer the SPOE was
	// consulted on (fleet.SPOETimeHeader). The client's per-second p99
	// cannot tell it apart from the machine: with seven scenarios on 2
	// cores in CI, stalls put 4 seconds after the kill at p99 500 ms or
	// more (worst 2401 ms, HAProxy 3.0) though nothing waited on the agent.
	consulted := 0
	for _, s := range out.Load.PerSecond[2:10] {
		consulted += s.SPOE
	}
	if consulted < 8*250 {
		t.Fatalf("HAProxy timed the SPOE on %d answers in seconds 2-9 (of about 2400): the measure is off", consulted)
	}
	// Unguarded, every answer after the kill would wait for the SPOE
	// (`timeout processing`, 20 ms, in 2.6); guarded, the health check
	// marks the agent down within `inter 500ms` and the SPOE is not
	// consulted at all. Half the processing timeout counts as held; a
	// handful of answers between the kill and the check may be.
	held := out.Load.SPOEHeld(11, 10*time.Millisecond)
	after, stillConsulted := 0, 0
	var p99 []float64
	for _, s := range out.Load.PerSecond[11:30] {
		after += s.Requests
		stillConsulted += s.SPOE
		p99 = append(p99, s.P99Ms)
	}
	slices.Sort(p99)
	t.Logf("run p99 %v; after the kill: SPOE consulted on %d of %d answers, %d held 10 ms or more; per-second p99 median %.1f ms, worst %.1f ms",
		out.Load.Quantile(0.99), stillConsulted, after, held, p99[len(p99)/2], p99[len(p99)-1])
	if held > after/100 {
		t.Errorf("%d of %d answers after the kill waited 10 ms or more on the dead agent", held, after)
	}
	if stillConsulted > after/100 {
		t.Errorf("the SPOE was still consulted on %d of %d answers after the kill: the send rule's guard is off", stillConsulted, after)
	}
	if med := p99[len(p99)/2]; med > 100 {
		t.Errorf("the median second after the kill has p99 %.1f ms, over 100 ms", med)
	}
}

// A server put in maint (and one in drain) by hand is never touched by
// the agent, though the maint one fails 5%; a faulty server free to act
// on is still drained.
func TestOperatorStateNeverTouched(t *testing.T) {
	t.Parallel()
	out := run(t, scenario.Scenario{Servers: paperFleet(0, 0, 0.05, 0, 0, 0.05), Rate: 300, Duration: 40 * time.Second, Policy: "rules",
		Prepare: func(ctx context.Context, rt *haproxy.Client) error {
			if err := rt.SetServerState(ctx, fleet.BackendName, "srv3", haproxy.StateMaint); err != nil {
				return err
			}
			return rt.SetServerState(ctx, fleet.BackendName, "srv2", haproxy.StateDrain)
		},
	})
	if st := finalState(out, "srv3"); st.AdminState != haproxy.AdminForcedMaint {
		t.Errorf("srv3 (operator's maint) is now %+v", st)
	}
	if st := finalState(out, "srv2"); st.AdminState != haproxy.AdminForcedDrain {
		t.Errorf("srv2 (operator's drain) is now %+v", st)
	}
	if out.Flips["srv3"] != 0 || out.Flips["srv2"] != 0 {
		t.Errorf("operator's servers flipped: %v", out.Flips)
	}
	if _, ok := out.DrainedAt["srv6"]; !ok {
		t.Errorf("srv6 (faulty) not drained: %v", out.DrainedAt)
	}
	b, err := os.ReadFile(out.AuditLog)
	if err != nil || len(b) == 0 {
		t.Fatalf("audit log: %v", err)
	}
}

// A malformed SPOE frame and a message with mistyped arguments do not
// disturb the agent: both are counted, the live traffic keeps being
// recorded and the faulty server is still drained.
func TestMalformedSPOEDoesNotDisturbAgent(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var before, after uint64
	var sendErr error
	out := run(t, scenario.Scenario{Servers: paperFleet(0, 0, 0.05), Rate: 200, Duration: 30 * time.Second, Policy: "rules",
		At: map[time.Duration]func(*scenario.Env){
			5 * time.Second: func(env *scenario.Env) {
				mu.Lock()
				defer mu.Unlock()
				before = env.Daemon.SPOE.Counters.Events.Load()
				sendErr = sendMalformed(env.AgentAddr)
			},
			10 * time.Second: func(env *scenario.Env) {
				mu.Lock()
				defer mu.Unlock()
				after = env.Daemon.SPOE.Counters.Events.Load()
			},
		}})
	mu.Lock()
	defer mu.Unlock()
	if sendErr != nil {
		t.Fatal(sendErr)
	}
	if out.Ingest < 2 {
		t.Errorf("ingest errors %d, want the mistyped message and the bad frame counted", out.Ingest)
	}
	if after <= before {
		t.Errorf("events stopped after the malformed input: %d then %d", before, after)
	}
	if _, ok := out.DrainedAt["srv3"]; !ok || len(out.DrainedAt) != 1 {
		t.Errorf("drained %v, want srv3 only", out.DrainedAt)
	}
}

// sendMalformed opens its own SPOP connection to the agent, sends a
// NOTIFY whose message has a mistyped status, then a frame whose length
// runs past its content.
func sendMalformed(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	hello := frame.AcquireFrame()
	hello.Type = frame.TypeHaproxyHello
	hello.KV.Add("supported-versions", "2.0")
	hello.KV.Add("max-frame-size", uint32(16380))
	hello.KV.Add("capabilities", "pipelining")
	if _, err := hello.Encode(c); err != nil {
		return err
	}
	r := bufio.NewReader(c)
	if err := skipFrame(r); err != nil {
		return fmt.Errorf("agent hello: %w", err)
	}
	// hapilot-response with a status that is not a number.
	msg := []byte{16}
	msg = append(msg, "hapilot-response"...)
	msg = append(msg, 4)
	for _, kv := range [][2]string{{"backend", "app"}, {"server", "srv1"}, {"status", "OK"}, {"tr", "5"}} {
		msg = append(msg, byte(len(kv[0])))
		msg = append(msg, kv[0]...)
		msg = append(msg, 8, byte(len(kv[1])))
		msg = append(msg, kv[1]...)
	}
	notify := append([]byte{0, 0, 0, 0, byte(frame.TypeNotify), 0, 0, 0, 1, 1, 1}, msg...)
	binary.BigEndian.PutUint32(notify, uint32(len(notify)-4))
	if _, err := c.Write(notify); err != nil {
		return err
	}
	if err := skipFrame(r); err != nil {
		return fmt.Errorf("ack of the mistyped message: %w", err)
	}
	// A NOTIFY whose message name claims more bytes than the frame holds.
	bad := []byte{0, 0, 0, 9, byte(frame.TypeNotify), 0, 0, 0, 1, 2, 1, 0x30, 'x'}
	if _, err := c.Write(bad); err != nil {
		return err
	}
	return skipFrame(r)
}

func skipFrame(r *bufio.Reader) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	_, err := r.Discard(int(binary.BigEndian.Uint32(hdr[:])))
	return err
}

// An operator's undo stands, against a real HAProxy: the agent drains the
// faulty srv3, the operator readies it (`set server app/srv3 state
// ready`), and the agent leaves it alone for the rest of the run. Before,
// it drained srv3 again in the same step, and every step after.
func TestOperatorUndoStands(t *testing.T) {
	t.Parallel()
	var undoErr error
	undoAt := coldDrain // once the drain is in
	out := run(t, scenario.Scenario{Servers: paperFleet(0, 0, 0.05, 0), Rate: 200, Duration: undoAt + 20*time.Second, Policy: "rules",
		At: map[time.Duration]func(*scenario.Env){
			undoAt: func(env *scenario.Env) {
				rt, err := haproxy.New(env.HAProxy.Socket)
				if err == nil {
					err = rt.SetServerState(context.Background(), fleet.BackendName, "srv3", haproxy.StateReady)
				}
				undoErr = err
			},
		}})
	if undoErr != nil {
		t.Fatalf("the operator's ready: %v", undoErr)
	}
	if at, ok := out.DrainedAt["srv3"]; !ok || at > undoAt {
		t.Fatalf("srv3 was not drained before the undo: %v (%v)", at, ok)
	}
	if st := finalState(out, "srv3"); st.AdminState != 0 || out.Flips["srv3"] != 2 {
		t.Fatalf("srv3 after the operator's ready: %+v, flips %d (timeline %v)", st, out.Flips["srv3"], out.Timeline["srv3"])
	}
}
