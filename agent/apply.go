package agent

import (
	"context"

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
	send func(ctx context.Context, rt Runtime) error
}

// commandFor turns a vetted action on server v into its runtime command;
// the text comes from haproxy/, which builds every command. A ready of a
// server the agent only reweighted puts its configured weight back.
func commandFor(a Action, v *ServerView, maint bool) (command, error) {
	switch {
	case a.Kind == Drain, a.Kind == Ready && (v.Changed == nil || v.Changed.Phase == PhaseDrained):
		st := haproxy.StateDrain
		switch {
		case a.Kind == Ready:
			st = haproxy.StateReady
		case maint:
			st = haproxy.StateMaint
		}
		text, err := haproxy.SetStateCommand(a.Backend, a.Server, st)
		return command{text, func(ctx context.Context, rt Runtime) error { return rt.SetServerState(ctx, a.Backend, a.Server, st) }}, err
	default:
		w := a.Weight
		if a.Kind == Ready {
			w = v.State.Initial
		}
		text, err := haproxy.SetWeightCommand(a.Backend, a.Server, w)
		return command{text, func(ctx context.Context, rt Runtime) error { return rt.SetWeight(ctx, a.Backend, a.Server, w) }}, err
	}
}

// apply sends one vetted action to every HAProxy, and records it in the
// ledger when at least one took it.
func (l *Loop) apply(ctx context.Context, obs *Observation, a Action) []CommandResult {
	b, v := obs.Find(a.Backend, a.Server)
	maint := l.maintFor(a, v)
	cmd, err := commandFor(a, v, maint)
	if err != nil {
		return []CommandResult{{Command: a.ID().String(), Error: err.Error()}}
	}
	results := make([]CommandResult, 0, len(l.Runtimes))
	took := 0
	for _, rt := range l.Runtimes {
		r := CommandResult{Socket: rt.Addr(), Command: cmd.text}
		if err := cmd.send(ctx, rt); err != nil {
			r.Error = err.Error()
		} else {
			took++
		}
		results = append(results, r)
	}
	if took > 0 {
		l.record(b, v, a, maint)
	}
	return results
}

// maintFor says whether a drain of v goes out as maint: its backend's
// action, or, for a change a reload lost, the action it was made with.
func (l *Loop) maintFor(a Action, v *ServerView) bool {
	if a.Origin == OriginReapply && v != nil && v.Changed != nil {
		return v.Changed.Maint
	}
	return a.Kind == Drain && l.Guard.Scope.For(a.Backend).Maint()
}

// record is the ledger transition an applied action makes.
func (l *Loop) record(b *BackendView, v *ServerView, a Action, maint bool) {
	k, now, ledger := a.Key(), l.Clock.Now(), l.theLedger()
	switch {
	case a.Origin == OriginReapply:
		ledger.Adopt(k)
	case a.Kind == Drain:
		p99, _ := b.RecentP99()
		ledger.Drain(k, now, a.Reason, v.Window.ErrorRate(), p99, maint)
	case a.Kind == SetWeight:
		p99, _ := b.RecentP99()
		ledger.Cut(k, a.Weight, v.State.Initial, now, a.Reason, p99)
	case a.Kind == Ready:
		ledger.Ready(k, v.State.Weight, v.State.Initial, now, a.Reason, a.NoDrainFor)
		if v.Changed != nil && v.Changed.Phase == PhaseDrained {
			if f, ok := l.Windows.(forgetter); ok {
				f.Forget(a.Backend, a.Server) // its errors before the drain are history
			}
		}
	}
}
