package loop

import (
	"context"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
)

// forgetter is a Windows that can drop a series' history.
type forgetter interface {
	Forget(backend, server string)
}

// retainer is a Windows that can drop the series of servers HAProxy does
// not report (window.Store.Retain).
type retainer interface {
	Retain(keep func(backend, server string) bool) int
}

// command is one runtime command, as text for the audit and as the call
// that sends it.
type command struct {
	text string
	send func(ctx context.Context, rt agent.Runtime) error
}

// restoreCommands are the commands that bring a server at state s back
// to its configured state: ready when it is drained or in maintenance,
// and its configured weight when it is at another (a cut, a canary
// weight recovery staged). Every undo sends exactly these, so that no
// path leaves what another would have brought back: --on-exit restore
// (Control.Undo), `ctl release` and `ctl restore` (Loop.release), `hapilot
// restore` (RestoreFromState), and recovery's undo of a weight cut.
func restoreCommands(s haproxy.ServerState) ([]command, error) {
	var cmds []command
	if s.Drain() || s.Maint() {
		text, err := haproxy.SetStateCommand(s.Backend, s.Server, haproxy.StateReady)
		if err != nil {
			return nil, err
		}
		cmds = append(cmds, command{text, func(ctx context.Context, rt agent.Runtime) error {
			return rt.SetServerState(ctx, s.Backend, s.Server, haproxy.StateReady)
		}})
	}
	if s.Weight != s.Initial {
		text, err := haproxy.SetWeightCommand(s.Backend, s.Server, s.Initial)
		if err != nil {
			return nil, err
		}
		cmds = append(cmds, command{text, func(ctx context.Context, rt agent.Runtime) error {
			return rt.SetWeight(ctx, s.Backend, s.Server, s.Initial)
		}})
	}
	return cmds, nil
}

// restores reports whether a is an undo, which brings its server back to
// its configured state (restoreCommands): --on-exit restore's, or a ready
// of a server the agent only reweighted. A ready of a drained server by
// recovery is its re-admission instead: ready at the weight it staged.
func restores(a agent.Action, v *agent.ServerView) bool {
	return a.Kind == agent.Ready && v != nil && (a.Origin == agent.OriginRestore || v.Changed != nil && v.Changed.Phase != agent.PhaseDrained)
}

// commandsFor turns a vetted action on server v into its runtime
// commands; the text comes from haproxy/, which builds every command.
func commandsFor(a agent.Action, v *agent.ServerView, maint bool) ([]command, error) {
	if restores(a, v) {
		return restoreCommands(v.State)
	}
	switch a.Kind {
	case agent.Drain, agent.Ready:
		st := haproxy.StateDrain
		switch {
		case a.Kind == agent.Ready:
			st = haproxy.StateReady
		case maint:
			st = haproxy.StateMaint
		}
		text, err := haproxy.SetStateCommand(a.Backend, a.Server, st)
		return []command{{text, func(ctx context.Context, rt agent.Runtime) error {
			return rt.SetServerState(ctx, a.Backend, a.Server, st)
		}}}, err
	default:
		w := a.Weight
		text, err := haproxy.SetWeightCommand(a.Backend, a.Server, w)
		return []command{{text, func(ctx context.Context, rt agent.Runtime) error { return rt.SetWeight(ctx, a.Backend, a.Server, w) }}}, err
	}
}

// sendAll sends cmds to every runtime in order; took counts the runtimes
// that took all of them.
func sendAll(ctx context.Context, runtimes []agent.Runtime, cmds []command) (results []agent.CommandResult, took int) {
	results = make([]agent.CommandResult, 0, len(runtimes)*len(cmds))
	for _, rt := range runtimes {
		all := true
		for _, c := range cmds {
			r := agent.CommandResult{Socket: rt.Addr(), Command: c.text}
			if err := c.send(ctx, rt); err != nil {
				r.Error, all = err.Error(), false
			}
			results = append(results, r)
		}
		if all {
			took++
		}
	}
	return results, took
}

// apply sends one vetted action to every HAProxy, and records it in the
// ledger when at least one took it.
func (l *Loop) apply(ctx context.Context, obs *agent.Observation, a agent.Action) []agent.CommandResult {
	b, v := obs.Find(a.Backend, a.Server)
	maint := l.maintFor(a, v)
	cmds, err := commandsFor(a, v, maint)
	if err != nil {
		return []agent.CommandResult{{Command: a.ID().String(), Error: err.Error()}}
	}
	results, took := sendAll(ctx, l.Runtimes, cmds)
	if took > 0 {
		l.record(b, v, a, maint)
	}
	return results
}

// maintFor says whether a drain of v goes out as maint: its backend's
// action, or, for a change a reload lost, the action it was made with.
func (l *Loop) maintFor(a agent.Action, v *agent.ServerView) bool {
	if a.Origin == agent.OriginReapply && v != nil && v.Changed != nil {
		return v.Changed.Maint
	}
	return a.Kind == agent.Drain && l.Guard.Scope.For(a.Backend).Maint()
}

// record is the ledger transition an applied action makes.
func (l *Loop) record(b *agent.BackendView, v *agent.ServerView, a agent.Action, maint bool) {
	k, now, ledger := a.Key(), l.Clock.Now(), l.theLedger()
	switch {
	case a.Origin == agent.OriginReapply:
		ledger.Adopt(k)
	case a.Kind == agent.Drain:
		p99, _ := b.RecentP99()
		ledger.Drain(k, now, a.Reason, max(v.Window.ErrorRate(), a.ErrorRate), p99, a.SlowMs, a.SlowMean, maint)
	case a.Kind == agent.SetWeight:
		p99, _ := b.RecentP99()
		ledger.Cut(k, a.Weight, v.State.Initial, now, a.Reason, p99)
	case a.Kind == agent.Ready:
		weight := v.State.Weight // a re-admission keeps the weight it staged
		if restores(a, v) {
			weight = v.State.Initial
		}
		ledger.Ready(k, weight, v.State.Initial, now, a.Reason, a.NoDrainFor)
		if v.Changed != nil && v.Changed.Phase == agent.PhaseDrained {
			if f, ok := l.Windows.(forgetter); ok {
				f.Forget(a.Backend, a.Server) // its errors before the drain are history
			}
		}
	}
}
