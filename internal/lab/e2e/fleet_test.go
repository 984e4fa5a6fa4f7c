//go:build e2e && fleet

package e2e

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/labtest"
	"github.com/hapilot/hapilot/internal/lab/nodes"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
	"github.com/hapilot/hapilot/internal/lab/scenario"
)

// The study's fleet of 9, every third server failing 5% of requests.
var paper9 = paperFleet(0, 0, 0.05, 0, 0, 0.05, 0, 0, 0.05)

func faulty9() map[string]bool { return scenario.Faulty(paper9, 0.01) }

// startCluster starts a cluster for t, stopped (with its agents' logs
// printed on failure) at the end.
func startCluster(t *testing.T, s nodes.Setup) *nodes.Cluster {
	t.Helper()
	labtest.RequireHAProxy(t)
	s.Dir, s.AgentBinary = t.TempDir(), agentBinary
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := nodes.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Stop()
		if t.Failed() {
			for _, n := range c.Nodes {
				t.Logf("%s agent log (tail):\n%s", n.Name, tail(n.AgentLog(), 6000))
			}
		}
	})
	return c
}

// isolation is when every faulty server was first seen drained on that
// node, from the load's start; +Inf when one never was.
func isolation(o *scenario.Outcome, faulty map[string]bool) float64 {
	worst := 0.0
	for s := range faulty {
		at, ok := o.DrainedAt[s]
		if !ok {
			return math.Inf(1)
		}
		worst = math.Max(worst, at.Seconds())
	}
	return worst
}

type clusterRun struct {
	name      string
	outs      []*scenario.Outcome
	load      *fleet.Result
	isolation float64 // the slowest node's
}

// runCluster starts a cluster, sends rate req/s split over its nodes for
// d, and returns what every node's HAProxy did.
func runCluster(t *testing.T, name string, s nodes.Setup, rate float64, d time.Duration) clusterRun {
	c := startCluster(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	watchCtx, stop := context.WithCancel(ctx)
	start := time.Now()
	outs, wait := c.Watch(watchCtx, start)
	load := c.Load(ctx, rate, d)
	stop()
	wait()
	r := clusterRun{name: name, outs: outs, load: load}
	for _, o := range outs {
		r.isolation = math.Max(r.isolation, isolation(o, faulty9()))
	}
	t.Logf("%s: %d nodes, %d requests, %d 5xx; isolated on every node at %.1f s; drained per node:", name, len(outs), load.Scheduled, load.Err5xx, r.isolation)
	for _, o := range outs {
		t.Logf("  %s: drained %v flips %v", o.Policy, sortedDurations(o.DrainedAt), o.Flips)
	}
	return r
}

func sortedDurations(m map[string]time.Duration) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s@%.1fs", k, m[k].Seconds()))
	}
	return strings.Join(parts, " ")
}

// Pooled detection: 3 HAProxy nodes and 3 agents in front of the same 9
// servers, 300 req/s split across them. In fleet mode the slowest node
// isolates the faulty servers within 1.5x of one node taking the whole
// load, and well before the same 3 agents without the fleet; every node
// drains every faulty server and no healthy one.
func TestFleetPooledDetection(t *testing.T) {
	const rate, d = 300, 45 * time.Second
	setups := map[string]nodes.Setup{
		"one-node-whole-load": {Servers: paper9, Nodes: 1},
		"3-nodes-fleet-off":   {Servers: paper9, Nodes: 3},
		"3-nodes-fleet-on":    {Servers: paper9, Nodes: 3, Fleet: true},
	}
	runs := map[string]clusterRun{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, s := range setups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(name, func(t *testing.T) {
				r := runCluster(t, name, s, rate, d)
				mu.Lock()
				runs[name] = r
				mu.Unlock()
			})
		}()
	}
	wg.Wait()
	if len(runs) != 3 {
		t.Fatal("a run failed")
	}
	single, off, on := runs["one-node-whole-load"], runs["3-nodes-fleet-off"], runs["3-nodes-fleet-on"]
	t.Logf("time to isolation on every node: one node %.1f s, fleet off %.1f s, fleet on %.1f s; client 5xx %d, %d, %d",
		single.isolation, off.isolation, on.isolation, single.load.Err5xx, off.load.Err5xx, on.load.Err5xx)
	if math.IsInf(single.isolation, 1) || math.IsInf(on.isolation, 1) {
		t.Fatalf("not isolated: one node %.1f s, fleet on %.1f s", single.isolation, on.isolation)
	}
	if on.isolation > 1.5*single.isolation {
		t.Errorf("fleet on isolated in %.1f s, over 1.5x one node's %.1f s", on.isolation, single.isolation)
	}
	if off := math.Min(off.isolation, d.Seconds()); on.isolation > 0.6*off {
		t.Errorf("fleet on isolated in %.1f s, not well below fleet off's %.1f s", on.isolation, off)
	}
	for _, o := range on.outs {
		for s := range o.DrainedAt {
			if !faulty9()[s] {
				t.Errorf("fleet on, %s: healthy %s drained", o.Policy, s)
			}
		}
		for s, n := range o.Flips {
			if n > 1 {
				t.Errorf("fleet on, %s: %s flipped %d times", o.Policy, s, n)
			}
		}
	}
}

// requireNFT skips where nftables is missing, unless HAProxy is required
// (make and CI), where it fails: a cut must be testable there.
func requireNFT(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil || os.Geteuid() != 0 {
		msg := fmt.Sprintf("cutting an agent off needs nft (apt-get install -y nftables) and root: %v, euid %d", err, os.Geteuid())
		if os.Getenv("HAPILOT_REQUIRE_HAPROXY") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// waitStatus polls node's /status until ok holds, and returns the status
// and how many of its steps ran since since (a cycle number).
func waitStatus(t *testing.T, n *nodes.Node, within time.Duration, ok func(nodes.Status) bool) (nodes.Status, bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		st, err := n.Status(context.Background())
		if err == nil && ok(st) {
			return st, true
		}
		if time.Now().After(deadline) {
			return st, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A detector that has not stepped on a backend judges it from a cold
// start: a follower's does not step while it follows, so the agent that
// takes over after a kill, and the one that decides alone after a cut,
// find a fault that begins then as the rules do from a cold start at
// their rate. These bounds are the cold-start figures of the sequential
// test at those rates, the 99th percentile of 300 simulated seeds (a 5%
// server among error-free peers), plus 10 s for the real loop on a busy
// machine:
//   - after the kill, the pooled 33 req/s a server: 32 s;
//   - after the cut, this node's third of the traffic, 12.5 req/s a
//     server once srv3 is out: 66 s.
const (
	takeoverDrain = 42 * time.Second
	aloneDrain    = 76 * time.Second
)

// The fleet under faults, one cluster of 3, one backend of 9, 300 req/s:
//   - the deciding agent is killed: another takes over within 2 steps, and
//     decides (a fault that starts then is drained on the nodes with an
//     agent); restarted, it follows the fleet's word at once;
//   - one agent is cut off from its peers: it decides alone within 2
//     steps, on its own evidence (a fault that starts then is drained
//     there too), and its peers go on without it;
//   - when it is let back, it rejoins; no server flips twice, no healthy
//     server is drained, anywhere.
func TestFleetSurvivesKillCutAndRejoin(t *testing.T) {
	requireNFT(t)
	servers := paperFleet(0, 0, 0, 0, 0, 0, 0, 0, 0)
	c := startCluster(t, nodes.Setup{Servers: servers, Nodes: 3, Fleet: true})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	watchCtx, stopWatch := context.WithCancel(ctx)
	start := time.Now()
	outs, wait := c.Watch(watchCtx, start)
	loadDone := make(chan *fleet.Result, 1)
	// The load runs until the test ends (cancel, below).
	go func() { loadDone <- c.Load(ctx, 300, 5*time.Minute) }()
	byName := map[string]*nodes.Node{}
	for _, n := range c.Nodes {
		byName[n.Name] = n
	}

	// 1. Who decides: every node names the same one.
	st, ok := waitStatus(t, c.Nodes[0], 10*time.Second, func(st nodes.Status) bool {
		d, _ := st.Decider(fleet.BackendName)
		return d != "" && st.Fleet != nil && len(st.Fleet.Members) == 3 && !st.Fleet.Alone
	})
	if !ok {
		t.Fatalf("node1 never saw a fleet of 3 with a decider: %+v", st.Fleet)
	}
	decider, _ := st.Decider(fleet.BackendName)
	for _, n := range c.Nodes {
		if _, ok := waitStatus(t, n, 5*time.Second, func(st nodes.Status) bool { d, _ := st.Decider(fleet.BackendName); return d == decider }); !ok {
			t.Fatalf("%s does not name %s as the decider", n.Name, decider)
		}
	}
	var survivors []*nodes.Node
	for _, n := range c.Nodes {
		if n.Name != decider {
			survivors = append(survivors, n)
		}
	}
	t.Logf("decider of %s: %s", fleet.BackendName, decider)

	// 2. Kill it: a survivor takes over within 2 steps of each survivor.
	cycles := map[string]uint64{}
	for _, n := range survivors {
		st, err := n.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cycles[n.Name] = st.Cycle
	}
	killedAt := time.Since(start)
	byName[decider].Kill(syscall.SIGKILL)
	var next string
	for _, n := range survivors {
		st, ok := waitStatus(t, n, 10*time.Second, func(st nodes.Status) bool {
			d, _ := st.Decider(fleet.BackendName)
			return d != "" && d != decider
		})
		if !ok {
			t.Fatalf("%s: no takeover 10 s after the decider was killed", n.Name)
		}
		d, _ := st.Decider(fleet.BackendName)
		steps := st.Cycle - cycles[n.Name]
		t.Logf("%s: %s decides, %d steps after the kill", n.Name, d, steps)
		if steps > 2 {
			t.Errorf("%s: takeover after %d steps, want at most 2", n.Name, steps)
		}
		if next == "" {
			next = d
		} else if d != next {
			t.Errorf("survivors disagree on the new decider: %s and %s", next, d)
		}
	}

	// 3. A fault under the new decider: drained on both survivors.
	c.Backends[2].SetErrorRate(0.05) // srv3
	faultAt := time.Since(start)
	for _, n := range survivors {
		if !waitDrained(ctx, n, "srv3", takeoverDrain-time.Since(start)+faultAt) {
			t.Errorf("%s: srv3 not drained %v after its fault began", n.Name, takeoverDrain)
		}
	}

	// 4. The killed agent restarts: it follows the decider's word (srv3
	// drained on its node too) without deciding itself while it warms up.
	if err := byName[decider].StartAgent(); err != nil {
		t.Fatal(err)
	}
	restartedAt := time.Now()
	if !waitDrained(ctx, byName[decider], "srv3", 15*time.Second) {
		t.Errorf("restarted %s: srv3 not drained from the fleet's word", decider)
	} else {
		t.Logf("restarted %s: caught up (srv3 drained) %.1f s after its start", decider, time.Since(restartedAt).Seconds())
	}
	if st, ok := waitStatus(t, byName[decider], 5*time.Second, func(st nodes.Status) bool { _, role := st.Decider(fleet.BackendName); return role != "" }); ok {
		if d, role := st.Decider(fleet.BackendName); d == decider {
			t.Errorf("restarted %s decides at once (%s), before its warm-up", decider, role)
		}
	}

	// 5. Cut one agent off: it decides alone within 2 steps.
	cut := survivors[0]
	before, err := cut.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := cut.Cut(); err != nil {
		t.Fatal(err)
	}
	cutAt := time.Since(start)
	st, ok = waitStatus(t, cut, 10*time.Second, func(st nodes.Status) bool { _, role := st.Decider(fleet.BackendName); return role == "alone" })
	if !ok {
		t.Fatalf("%s cut off: never decided alone", cut.Name)
	}
	if steps := st.Cycle - before.Cycle; steps > 2 {
		t.Errorf("%s cut off: alone after %d steps, want at most 2", cut.Name, steps)
	} else {
		t.Logf("%s cut off: deciding alone %d steps after the cut", cut.Name, steps)
	}
	for _, n := range c.Nodes {
		if n == cut {
			continue
		}
		if _, ok := waitStatus(t, n, 5*time.Second, func(st nodes.Status) bool {
			for _, m := range st.Fleet.Members {
				if m.Name == cut.Name {
					return !m.InPicture
				}
			}
			return true
		}); !ok {
			t.Errorf("%s still counts the cut %s in", n.Name, cut.Name)
		}
	}
	// A fault during the cut: the cut agent drains it on its own evidence.
	c.Backends[5].SetErrorRate(0.05) // srv6
	if !waitDrained(ctx, cut, "srv6", aloneDrain) {
		t.Errorf("%s cut off: srv6 not drained on local evidence in %v", cut.Name, aloneDrain)
	}

	// 6. Let it back: it rejoins, and nothing flaps.
	if err := cut.Heal(); err != nil {
		t.Fatal(err)
	}
	healedAt := time.Since(start)
	if _, ok := waitStatus(t, cut, 15*time.Second, func(st nodes.Status) bool { return st.Fleet != nil && !st.Fleet.Alone }); !ok {
		t.Errorf("%s never rejoined after the cut was lifted", cut.Name)
	}
	for _, n := range c.Nodes {
		if !waitDrained(ctx, n, "srv6", 20*time.Second) {
			t.Errorf("%s: srv6 not drained after the rejoin", n.Name)
		}
	}
	time.Sleep(5 * time.Second) // the window after the rejoin in which a flap would show
	cancel()
	<-loadDone
	stopWatch()
	wait()
	t.Logf("killed at %.1f s, fault at %.1f s, cut at %.1f s, healed at %.1f s", killedAt.Seconds(), faultAt.Seconds(), cutAt.Seconds(), healedAt.Seconds())
	for _, o := range outs {
		t.Logf("%s: drained %v, flips %v", o.Policy, sortedDurations(o.DrainedAt), o.Flips)
		for s, n := range o.Flips {
			if s != "srv3" && s != "srv6" {
				t.Errorf("%s: healthy %s changed drain state %d times", o.Policy, s, n)
			} else if n > 1 {
				t.Errorf("%s: %s flapped (%d changes of drain state)", o.Policy, s, n)
			}
		}
	}
}

// waitDrained waits until n's HAProxy shows server drained.
func waitDrained(ctx context.Context, n *nodes.Node, server string, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		states, err := n.Runtime.ShowServersState(ctx)
		if err == nil {
			for _, s := range states {
				if s.Backend == fleet.BackendName && s.Server == server && s.Drain() {
					return true
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// The LLM policy in a fleet of 3: one model call per backend per step
// for the whole fleet, not one per node. The model is the Ollama
// stand-in (an emulation: this checks plumbing, not judgment), asked
// every step (--llm-gate always).
func TestFleetAsksTheModelOncePerStep(t *testing.T) {
	model := ollamafake.New(map[string]string{"capable": "sha256:c"}, ollamafake.Capable)
	defer model.Close()
	c := startCluster(t, nodes.Setup{Servers: paperFleet(0, 0, 0.05, 0, 0, 0, 0, 0, 0), Nodes: 3, Fleet: true,
		AgentArgs: []string{"--policy", "llm", "--model", "capable", "--ollama-host", model.URL, "--skip-calibration", "--llm-gate", "always"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Calls about the backend app (its servers in the prompt); the lab's
	// HAProxy has a second backend, its SPOE agents, which may have a
	// decider of its own.
	asked := func() int {
		n := 0
		for _, r := range model.Requests() {
			for _, m := range r.Messages {
				if m.Role == "user" && strings.Contains(m.Content, "srv9") {
					n++
					break
				}
			}
		}
		return n
	}
	loadDone := make(chan *fleet.Result, 1)
	go func() { loadDone <- c.Load(ctx, 300, 40*time.Second) }()
	// The fleet forms and the model answers before the count starts.
	for _, n := range c.Nodes {
		if _, ok := waitStatus(t, n, 20*time.Second, func(st nodes.Status) bool {
			return st.Fleet != nil && !st.Fleet.Alone && len(st.Fleet.Members) == 3
		}); !ok {
			t.Fatalf("%s never saw a fleet of 3", n.Name)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); asked() == 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the model was never asked in 30 s")
		}
	}
	steps := func() (sum uint64) {
		for _, n := range c.Nodes {
			st, err := n.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			sum += st.Cycle
		}
		return sum
	}
	calls0, steps0, t0 := asked(), steps(), time.Now()
	time.Sleep(20 * time.Second) // the window the calls are counted over
	calls, allSteps, took := asked()-calls0, steps()-steps0, time.Since(t0)
	perStep := float64(calls) / took.Seconds() // the interval is 1 s
	t.Logf("%d model calls about %s in %.1f s, %d steps over 3 nodes: %.2f calls per step of the fleet", calls, fleet.BackendName, took.Seconds(), allSteps, perStep)
	if calls == 0 {
		t.Fatal("the model was never asked")
	}
	if perStep > 1.2 {
		t.Errorf("%.2f model calls per step for one backend, want about 1 (3 would be one per node)", perStep)
	}
	<-loadDone
	for _, n := range c.Nodes {
		if !waitDrained(ctx, n, "srv3", 5*time.Second) {
			t.Errorf("%s: srv3 not drained on the model's word", n.Name)
		}
	}
}
