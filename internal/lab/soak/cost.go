package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"syscall"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/guard"
	"github.com/hapilot/hapilot/agent/loop"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fakes"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/rs/zerolog"
)

// CostResult is what the agent's loop costs at one size: the real loop
// (loop.Loop with the rules policy, the guardrails, a window store fed
// each simulated second, a recording fake runtime socket) on an injected
// clock.
type CostResult struct {
	Servers  int `json:"servers"`
	Backends int `json:"backends"`
	// StepCPUms is the CPU of one scheduled step (observe, decide, vet,
	// audit); IntervalCPUms that of one 10 s interval as Run drives it,
	// its step and its nine evidence checks; CheckCPUms one check's share
	// of the difference.
	StepCPUms     float64 `json:"step_cpu_ms"`
	IntervalCPUms float64 `json:"interval_cpu_ms"`
	CheckCPUms    float64 `json:"check_cpu_ms"`
	// HeapMB is the live heap after a collection at the end: the window
	// store, the loop's state and the policy's.
	HeapMB float64 `json:"heap_mb"`
	// AuditBytesPerDay is what --audit-steps (off by default) adds to the
	// audit log: one step's snapshot of every server, healthy fleet (no
	// action, so the event log itself gets nothing), times the 8,640 steps
	// of a day at the 10 s interval. The CPU figures are without it.
	AuditBytesPerDay float64 `json:"audit_bytes_per_day"`
}

// cpuNow is the process's user+system CPU time.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// countingWriter counts the audit log's bytes.
type countingWriter struct{ n int64 }

func (w *countingWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

// trafficClock is the loop's clock: each time the loop sleeps, the
// seconds it sleeps over bring their traffic into the window store
// first; the CPU that costs is kept apart from the loop's.
type trafficClock struct {
	*fakes.Clock
	feed    func(sec int64)
	fed     int64 // the last second fed
	feedCPU time.Duration
	stop    time.Time
	cancel  context.CancelFunc
}

func (c *trafficClock) SleepUntil(ctx context.Context, t time.Time) error {
	began := cpuNow()
	for sec := c.fed + 1; sec <= t.Unix(); sec++ {
		c.feed(sec)
		c.fed = sec
	}
	c.feedCPU += cpuNow() - began
	if !t.Before(c.stop) {
		c.cancel()
	}
	return c.Clock.SleepUntil(ctx, t)
}

// rig is the loop at one size with its traffic.
type rig struct {
	clk   *fakes.Clock
	store *window.Store
	loop  *loop.Loop
	audit *countingWriter
	feed  func(sec int64)
	sec   int64
	start int64 // the clock's first second
}

func newRig(servers, backends int, rate float64) (*rig, error) {
	return newRigWith(servers, backends, rate, func(int, int64) float64 { return 0.002 })
}

// newRigWith is newRig with each server's 5xx rate by server index and
// second since the rig's start.
func newRigWith(servers, backends int, rate float64, errRate func(i int, sec int64) float64) (*rig, error) {
	if backends < 1 || servers < 2*backends {
		return nil, fmt.Errorf("cost: %d servers over %d backends: want at least 2 a backend", servers, backends)
	}
	// The clock starts now and runs ahead of the wall clock: the loop's
	// step and policy deadlines, taken on it, stay in the future (a clock
	// in the past would expire every context and skip every decision).
	start := time.Now().Truncate(time.Second)
	r := &rig{clk: fakes.NewClock(start), audit: &countingWriter{}, sec: start.Unix(), start: start.Unix()}
	r.store = window.New(60*time.Second, servers+16, r.clk.Now)
	type series struct{ b, s []byte }
	var states []haproxy.ServerState
	var names []series
	for i := range servers {
		b, s := fmt.Sprintf("be%d", i%backends), fmt.Sprintf("srv%d", i/backends)
		states = append(states, haproxy.ServerState{Backend: b, Server: s, OpState: haproxy.OpRunning, Weight: 1, Initial: 1})
		names = append(names, series{[]byte(b), []byte(s)})
	}
	rng := rand.New(rand.NewPCG(1, 2))
	r.feed = func(sec int64) {
		for i, n := range names {
			req := poisson(rng, rate)
			x := binomial(rng, req, errRate(i, sec-r.start))
			if req > x {
				r.store.RecordAt(sec, window.Event{Backend: n.b, Server: n.s, Status: 200, ResponseMs: 10, Count: int(req - x)})
			}
			if x > 0 {
				r.store.RecordAt(sec, window.Event{Backend: n.b, Server: n.s, Status: 500, ResponseMs: 10, Count: int(x)})
			}
		}
	}
	r.loop = &loop.Loop{Clock: r.clk, Settings: agent.DefaultSettings(), Policy: rules.NewPolicy(rules.DefaultConfig()),
		Guard: guard.DefaultGuardrails(), Runtimes: []agent.Runtime{fakes.WithStates("fake", states)}, Windows: r.store,
		Audit: r.audit, Log: zerolog.Nop()}
	// Fill the windows; the first step sets the sequential test's marks.
	r.advance(70)
	r.loop.Step(context.Background())
	return r, nil
}

// advance brings secs seconds of traffic.
func (r *rig) advance(secs int) {
	for range secs {
		r.sec++
		r.feed(r.sec)
		r.clk.Advance(time.Second)
	}
}

// Cost measures the loop at servers split evenly over backends, each
// server at rate req/s with 0.2% 5xx: steps scheduled steps by hand,
// then intervals intervals of Run.
func Cost(servers, backends int, rate float64, steps, intervals int) (CostResult, error) {
	r, err := newRig(servers, backends, rate)
	if err != nil {
		return CostResult{}, err
	}
	ctx := context.Background()
	// The steps are timed at the agent's defaults, without the step
	// snapshots of --audit-steps; one more step, untimed, writes one to
	// size that log.
	r.loop.Audit = nil
	var stepCPU time.Duration
	for range steps {
		r.advance(10)
		began := cpuNow()
		r.loop.Step(ctx)
		stepCPU += cpuNow() - began
	}
	r.loop.Audit = r.audit
	auditBefore := r.audit.n
	r.advance(10)
	r.loop.Step(ctx)
	auditPerStep := float64(r.audit.n - auditBefore)
	r.loop.Audit = nil
	// Then Run, steps and evidence checks as the agent runs them.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tc := &trafficClock{Clock: r.clk, feed: r.feed, fed: r.sec, stop: r.clk.Now().Add(time.Duration(intervals) * 10 * time.Second), cancel: cancel}
	r.loop.Clock = tc
	began := cpuNow()
	if err := r.loop.Run(rctx); err != nil {
		return CostResult{}, fmt.Errorf("cost: run: %w", err)
	}
	runCPU := cpuNow() - began - tc.feedCPU
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	runtime.KeepAlive(r) // the store and the loop are the memory measured
	res := CostResult{Servers: servers, Backends: backends,
		StepCPUms:        float64(stepCPU) / float64(steps) / 1e6,
		IntervalCPUms:    float64(runCPU) / float64(intervals) / 1e6,
		HeapMB:           float64(ms.HeapInuse) / (1 << 20),
		AuditBytesPerDay: auditPerStep * 8640}
	res.CheckCPUms = max(0, (res.IntervalCPUms-res.StepCPUms)/9)
	return res, nil
}
