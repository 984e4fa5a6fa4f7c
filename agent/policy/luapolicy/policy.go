// Package luapolicy is the policy an operator writes: decide(obs) in a
// Lua script, run in a gopher-lua sandbox under a deadline. (The
// HAProxy-side Lua companion that sends telemetry is in lua/.)
package luapolicy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/rs/zerolog"
)

// Policy runs a user's decide(obs) written in Lua (`--policy lua
// --policy-file FILE`). The script runs in a gopher-lua sandbox: no os,
// io, package, debug, require, load, loadstring, dofile or loadfile; each
// call ends at the step's deadline, the context the loop gives Decide; an
// error, a timeout or a malformed answer means no action, logged. Its
// globals persist between steps, so a script can keep its own memory,
// within MaxKept values. The guardrails apply to what it returns, as
// always.
//
// The sandbox lives in a worker process of its own (see worker.go), whose
// memory the kernel bounds at MaxMemory: a script that grows past it, a
// call that does not stop at the deadline (a Go built-in in the middle of
// a pattern match of exponential cost), a panic in the VM, all end in the
// worker, which is then killed. Such a call, or a script that keeps too
// much, breaks the policy: it makes no more calls, every step says why,
// and the guardrails' floor of "no action" holds until the agent is
// restarted with a fixed script.
type Policy struct {
	File string
	Log  zerolog.Logger

	// w and needs are set by NewPolicy and never changed.
	w     *worker
	needs agent.Needs

	// mu is held by Decide for its whole call to w: the worker answers
	// one call at a time, and a step that finds it held says so instead
	// of waiting.
	mu     sync.Mutex
	broken atomic.Pointer[error] // set for good once a call is abandoned or keeps too much
}

func (p *Policy) breaks(err error) error {
	if p.broken.CompareAndSwap(nil, &err) {
		p.Log.Error().Err(err).Msg("lua policy broken")
		p.w.stop()
	}
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

// LoadTimeout bounds the script's first run, which defines decide.
const LoadTimeout = time.Second

// startTimeout bounds a worker's start, before its script runs: a process
// to start and a runtime to set up on a loaded host.
const startTimeout = 10 * time.Second

// answerGrace is how long past the step's deadline the worker may take
// to answer: a call that stopped at the deadline on its own still has to
// say so.
const answerGrace = 100 * time.Millisecond

// NewPolicy loads and runs the script once; it must define decide(obs).
// The policy's hooks are its needs (a global `needs` table) and Close.
func NewPolicy(file string, log zerolog.Logger) (agent.Policy, error) {
	p, err := Load(file, log)
	if err != nil {
		return agent.Policy{}, err
	}
	return agent.Policy{Decider: p, Needs: p.needs, Close: p.Close}, nil
}

// Load reads the script, starts its worker and runs the script once.
func Load(file string, log zerolog.Logger) (*Policy, error) {
	src, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("lua policy: %w", err)
	}
	return newPolicy(file, string(src), log)
}

func newPolicy(name, src string, log zerolog.Logger) (*Policy, error) {
	w, err := startWorker()
	if err != nil {
		return nil, fmt.Errorf("lua policy %s: %w", name, err)
	}
	p := &Policy{File: name, Log: log, w: w}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout+LoadTimeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	rep, err := w.call(ctx, request{Load: &loadRequest{Name: name, Src: src}}, deadline, 0, p.logLine)
	switch {
	case errors.Is(err, errTimeout):
		err = fmt.Errorf("its worker did not load it within %v", startTimeout+LoadTimeout)
	case err == nil && rep.Error != "":
		w.stop()
		return nil, errors.New(rep.Error) // the worker names the script
	}
	if err != nil {
		w.stop()
		return nil, fmt.Errorf("lua policy %s: %w", name, err)
	}
	p.needs.DrainsPer = rep.DrainsPer
	return p, nil
}

// logLine logs one of the script's print lines.
func (p *Policy) logLine(s string) { p.Log.Info().Str("policy", p.File).Msg(s) }

func (p *Policy) Name() string { return "lua" }

// Close stops the worker. A call in flight ends with an error at once.
func (p *Policy) Close() { p.w.stop() }

// Decide calls decide(obs) until ctx's deadline, the step's. A worker
// that has not answered answerGrace after it is killed (see Policy).
func (p *Policy) Decide(ctx context.Context, obs agent.Observation) (agent.Plan, error) {
	if !p.mu.TryLock() {
		return nil, fmt.Errorf("lua policy %s: an earlier call is still running", p.File)
	}
	defer p.mu.Unlock()
	if b := p.broken.Load(); b != nil {
		return nil, *b
	}
	budget, wait := "its", time.Time{}
	req := &decideRequest{Obs: viewOf(obs)}
	if d, ok := ctx.Deadline(); ok {
		left := time.Until(d)
		if left <= 0 {
			return nil, fmt.Errorf("lua policy %s: no time left in the step", p.File)
		}
		budget, wait = fmt.Sprintf("the step's %v", left.Round(time.Millisecond)), d.Add(answerGrace)
		req.BudgetMs = max(left.Milliseconds(), 1)
	}
	rep, err := p.w.call(ctx, request{Decide: req}, wait, answerGrace, p.logLine)
	switch {
	case errors.Is(err, errTimeout):
		return nil, p.breaks(fmt.Errorf("lua policy %s: a call did not stop at %s deadline (a built-in still running): its worker was killed, no more calls until the agent restarts", p.File, budget))
	case err != nil:
		return nil, p.breaks(fmt.Errorf("lua policy %s: %w: no more calls until the agent restarts", p.File, err))
	case rep.Broken:
		return nil, p.breaks(fmt.Errorf("lua policy %s: %s: broken, no more calls until the agent restarts", p.File, rep.Error))
	}
	if rep.DroppedLogs > 0 {
		p.Log.Warn().Str("policy", p.File).Int("dropped", rep.DroppedLogs).Msgf("lua policy printed over %d lines in one call; the rest were dropped", MaxPrints)
	}
	if rep.Error != "" {
		return nil, fmt.Errorf("lua policy %s: %s", p.File, rep.Error)
	}
	return planFrom(rep.Actions)
}

// planFrom checks decide's answer, action by action, the way every
// reply parser does (agent.ParseAction: verbs, names, weights, and the
// reason cut to agent.MaxReason).
func planFrom(actions []rawAction) (agent.Plan, error) {
	if len(actions) > MaxActions {
		return nil, fmt.Errorf("decide returned %d actions, at most %d", len(actions), MaxActions)
	}
	var plan agent.Plan
	for i, r := range actions {
		a, ok, err := agent.ParseAction(r.Verb, r.Backend, r.Server, r.Weight, "lua", r.Reason)
		if err != nil {
			return nil, fmt.Errorf("action %d: %w", i+1, err)
		}
		if ok {
			plan = append(plan, a)
		}
	}
	return plan, nil
}
