package loop

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/ledger"
	"github.com/hapilot/hapilot/agent/merge"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/rs/zerolog"
)

// Control is the operator's commands on the loop (`hapilot ctl` and
// --on-exit restore): release, restore, pause, resume, explain, undo.
// Each takes its turn with the step. Get it with Loop.Control.
type Control struct{ l *Loop }

// Control is the loop's operator commands.
func (l *Loop) Control() Control { return Control{l} }

// Released is one server an operator's command brought back.
type Released struct {
	Server agent.Key `json:"server"`
	// Was is the agent's change it ended.
	Was      agent.Change          `json:"was"`
	Commands []agent.CommandResult `json:"commands"`
	// Until is when the server stops being the operator's: the agent
	// does not act on it before, unless its state changes.
	Until time.Time `json:"until"`
	Error string    `json:"error,omitempty"`
}

// releaseHold is how long a released server stays the operator's: the
// operator hold, or its default where the hold is off (a release is the
// operator's word, and a word that lasts no time would be overridden at
// the next step).
func (l *Loop) releaseHold() time.Duration {
	if l.OperatorHold > 0 {
		return l.OperatorHold
	}
	return agent.DefaultOperatorHold
}

// Release brings server k back to its configured state now, and leaves
// it to the operator for the hold time: the agent's own change only.
// It acts in observe mode and while paused too: it is the operator's
// command, not the agent's decision.
func (c Control) Release(ctx context.Context, k agent.Key, by string) (Released, error) {
	l := c.l
	l.st.stepMu.Lock()
	defer l.st.stepMu.Unlock()
	defer l.theLedger().Batch()() // what it reads and the release, one write
	obs, err := l.observeNow(ctx)
	if err != nil {
		return Released{Server: k}, err
	}
	_, v := obs.Find(k.Backend, k.Server)
	if v == nil {
		return Released{Server: k}, fmt.Errorf("%w: no server %s in HAProxy", agent.ErrRefused, k)
	}
	if v.Owner != agent.OwnerAgent || v.Changed == nil {
		return Released{Server: k}, fmt.Errorf("%w: %s is not the agent's change (owner %s, %s, weight %d of %d): the agent only releases its own",
			agent.ErrRefused, k, v.Owner, v.State.Label(), v.State.Weight, v.State.Initial)
	}
	r := l.release(ctx, v, by)
	if r.Error != "" {
		return r, errors.New(r.Error)
	}
	return r, nil
}

// Restore releases every server the agent changed.
func (c Control) Restore(ctx context.Context, by string) ([]Released, error) {
	l := c.l
	l.st.stepMu.Lock()
	defer l.st.stepMu.Unlock()
	defer l.theLedger().Batch()() // every release, one write
	obs, err := l.observeNow(ctx)
	if err != nil {
		return nil, err
	}
	out := []Released{}
	var errs []error
	for _, b := range obs.Backends {
		for i := range b.Servers {
			if v := &b.Servers[i]; v.Owner == agent.OwnerAgent && v.Changed != nil {
				r := l.release(ctx, v, by)
				if r.Error != "" {
					errs = append(errs, fmt.Errorf("%s: %s", r.Server, r.Error))
				}
				out = append(out, r)
			}
		}
	}
	return out, errors.Join(errs...)
}

// observeNow reads the servers for an operator's command.
func (l *Loop) observeNow(ctx context.Context) (agent.Observation, error) {
	l.st.mu.Lock()
	cycle := l.st.cycle
	l.st.mu.Unlock()
	obs, _, f, err := l.observe(ctx, l.Clock.Now(), cycle)
	if err != nil {
		return obs, fmt.Errorf("read server states: %w", err)
	}
	l.settle(f)
	return obs, nil
}

// release sends v back to its configured state and records it in the
// ledger. Called with stepMu held.
func (l *Loop) release(ctx context.Context, v *agent.ServerView, by string) Released {
	now := l.Clock.Now()
	r := Released{Server: v.Key(), Was: *v.Changed}
	var took bool
	r.Commands, took = sendRestore(ctx, l.Runtimes, v.State)
	if !took {
		r.Error = "no HAProxy took the commands: " + commandErrors(r.Commands)
		l.Log.Error().Stringer("server", r.Server).Str("by", by).Str("error", r.Error).Msg("release failed")
		return r
	}
	r.Until = now.Add(l.releaseHold())
	l.theLedger().Release(r.Server, v.State.Initial, now, l.releaseHold())
	if v.Changed.Phase == agent.PhaseDrained {
		if f, ok := l.Windows.(forgetter); ok {
			f.Forget(v.Backend, v.Server) // its errors before the drain are history
		}
	}
	if errs := commandErrors(r.Commands); errs != "" {
		r.Error = "partial: " + errs
	}
	l.Log.Warn().Stringer("server", r.Server).Str("was", string(r.Was.Phase)).Str("by", by).Time("operator_until", r.Until).
		Msg("released by the operator: back to its configured state, and theirs until then")
	k := r.Server
	l.emit(agent.Event{Type: agent.EventRelease, Server: &k, By: by, Until: r.Until, Reason: "released by the operator; the agent's change was: " + r.Was.Reason,
		Detail: map[string]string{"was": string(r.Was.Phase)}, Evidence: agent.EvidenceOf(nil, v, nil)})
	return r
}

// sendRestore sends the commands that bring a server at state s back to
// its configured state (restoreCommands, every undo's) to every runtime;
// took is true when at least one took all of them.
func sendRestore(ctx context.Context, runtimes []agent.Runtime, s haproxy.ServerState) (results []agent.CommandResult, took bool) {
	cmds, err := restoreCommands(s)
	if err != nil {
		return []agent.CommandResult{{Command: "restore " + s.Backend + "/" + s.Server, Error: err.Error()}}, false
	}
	results, n := sendAll(ctx, runtimes, cmds)
	return results, n > 0
}

func commandErrors(results []agent.CommandResult) string {
	var errs []string
	for _, r := range results {
		if r.Error != "" {
			errs = append(errs, r.Socket+": "+r.Error)
		}
	}
	if len(errs) == 0 {
		return ""
	}
	return fmt.Sprint(errs)
}

// Pause holds the agent's actions back on backend (AllBackends:
// everywhere) for d (0: until resumed). While paused it observes: every
// vetted action is a would-action. A backend the agent does not govern
// (no such backend in HAProxy, a typo, one out of scope) is refused: a
// pause there would read as holding while the agent acts on the backend
// the operator meant.
func (c Control) Pause(ctx context.Context, backend string, d time.Duration, by string) (agent.Pause, error) {
	l := c.l
	defer l.theLedger().Batch()() // what it reads and the pause, one write
	if backend != agent.AllBackends {
		if err := l.pausable(ctx, backend); err != nil {
			return agent.Pause{Backend: backend}, err
		}
	}
	now := l.Clock.Now()
	p := agent.Pause{Backend: backend, Since: now, By: by}
	if d > 0 {
		p.Until = now.Add(d)
	}
	if err := l.theLedger().SetPause(p); err != nil {
		return p, err
	}
	l.emit(agent.Event{Type: agent.EventPause, Backend: backend, By: by, Until: p.Until, Reason: p.Why()})
	l.Log.Warn().Str("backend", backend).Time("until", p.Until).Str("by", by).Msg("paused: the agent observes and sends nothing there")
	return p, nil
}

// pausable says why backend cannot be paused, nil when it can: a name
// HAProxy could hold (haproxy.ValidName: its characters, at most 255
// bytes, so that no control character reaches a log or the state file),
// among the backends the agent governs (the last step's, else HAProxy's
// now: a backend a reload just added), and in scope.
func (l *Loop) pausable(ctx context.Context, backend string) error {
	if err := haproxy.ValidName(backend); err != nil {
		return fmt.Errorf("%w: pause: not a backend name: %v", agent.ErrRefused, err)
	}
	l.st.mu.Lock()
	names := backendNames(l.st.last)
	l.st.mu.Unlock()
	if !slices.Contains(names, backend) {
		l.st.stepMu.Lock()
		obs, err := l.observeNow(ctx)
		l.st.stepMu.Unlock()
		if err != nil {
			return fmt.Errorf("cannot check that the agent governs backend %s: %w", backend, err)
		}
		names = backendNames(obs)
	}
	if !slices.Contains(names, backend) {
		return fmt.Errorf("%w: pause: no backend %s among the %d the agent governs in HAProxy%s: nothing paused", agent.ErrRefused, backend, len(names), someNames(names))
	}
	if bs := l.Guard.Scope.For(backend); !bs.InScope() {
		return fmt.Errorf("%w: pause: backend %s is out of scope (enabled false in the config's backend %s block): the agent already sends nothing there", agent.ErrRefused, backend, bs.Pattern)
	}
	return nil
}

// backendNames are obs's backends: those with a server the agent
// governs (a backend it leaves wholly alone is not among them).
func backendNames(obs agent.Observation) []string {
	out := make([]string, 0, len(obs.Backends))
	for _, b := range obs.Backends {
		out = append(out, b.Name)
	}
	return out
}

// someNames lists the first few of names, for a refusal that helps with
// a typo.
func someNames(names []string) string {
	const few = 8
	if len(names) == 0 {
		return ""
	}
	if len(names) > few {
		return " (" + strings.Join(names[:few], ", ") + ", ...)"
	}
	return " (" + strings.Join(names, ", ") + ")"
}

// Resume ends the pause of backend (AllBackends: the pause of every
// backend; "": every pause), and returns those it ended.
func (c Control) Resume(backend, by string) []agent.Pause {
	l := c.l
	ended := l.theLedger().ClearPause(backend)
	for _, p := range ended {
		l.Log.Warn().Str("backend", p.Backend).Str("by", by).Msg("resumed: the agent acts again")
		l.emit(agent.Event{Type: agent.EventResume, Backend: p.Backend, By: by, Reason: "resumed"})
	}
	return ended
}

// Explanation is what the agent knows of one server: its last view, the
// agent's change, whether its test finds it, and the recent decisions.
type Explanation struct {
	Server agent.Key  `json:"server"`
	Mode   agent.Mode `json:"mode"`
	// Change is the agent's change in force on it now, if any.
	Change *agent.Change `json:"change,omitempty"`
	// View is the server as HAProxy showed it at the last step's start,
	// with its windows, before that step's commands.
	View      *agent.ServerView `json:"view"`
	Serving   int               `json:"backend_serving"`
	Servers   int               `json:"backend_servers"`
	Candidate bool              `json:"candidate"`
	// PolicyNote is the policy's word on a server it leaves as it is.
	PolicyNote string           `json:"policy_note,omitempty"`
	Paused     *agent.Pause     `json:"paused,omitempty"`
	Decisions  []agent.Decision `json:"decisions"`
	// Probe is recovery's word on it: the next probe burst, the last.
	Probe *agent.ProbeStatus `json:"probe,omitempty"`
}

// prober is a Recovery that can say where a server's probes stand.
type prober interface {
	Probe(k agent.Key) (agent.ProbeStatus, bool)
}

// Explain says what the agent knows of k as of its last step.
func (c Control) Explain(k agent.Key) (Explanation, error) {
	l := c.l
	e := Explanation{Server: k, Mode: l.mode(), Decisions: []agent.Decision{}}
	if p, ok := l.Recovery.(prober); ok {
		if st, ok := p.Probe(k); ok {
			e.Probe = &st
		}
	}
	if p, ok := l.theLedger().PausedFor(k.Backend, l.Clock.Now()); ok {
		e.Paused = &p
	}
	if l.Policy.Notes != nil {
		e.PolicyNote = l.Policy.Notes()[k]
	}
	if c, ok := l.theLedger().Changes()[k]; ok {
		e.Change = &c
	}
	l.st.mu.Lock()
	defer l.st.mu.Unlock()
	b, v := l.st.last.Find(k.Backend, k.Server)
	if v == nil {
		if l.st.last.Time.IsZero() {
			return e, fmt.Errorf("%w: no step has read HAProxy yet", agent.ErrRefused)
		}
		return e, fmt.Errorf("%w: no server %s in the last step's view", agent.ErrRefused, k)
	}
	cp := *v
	e.View, e.Serving, e.Servers = &cp, b.ServingCount(), len(b.Servers)
	for _, c := range l.st.candidates {
		e.Candidate = e.Candidate || c == k
	}
	for _, d := range l.st.recent {
		if d.Proposed.Key() == k {
			e.Decisions = append(e.Decisions, d)
		}
	}
	return e, nil
}

func listChanges(changes map[agent.Key]agent.Change) []Holding {
	out := make([]Holding, 0, len(changes))
	for k, c := range changes {
		out = append(out, Holding{Server: k, Change: c})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Server.String() < out[j].Server.String() })
	return out
}

// RestoreFromState is `hapilot restore`, for when the agent is not
// running: it reads the agent's changes from its state file and brings
// back each server that still shows the change, leaving it to the
// operator for hold like a release. A server someone changed since is
// left as it is, and said so, as is one whose change was made on another
// HAProxy than the one runtimes reach.
func RestoreFromState(ctx context.Context, file string, runtimes []agent.Runtime, hold time.Duration, now time.Time, log zerolog.Logger) ([]Released, error) {
	if file == "" {
		return nil, fmt.Errorf("%w: no state file: nothing records the agent's changes", agent.ErrRefused)
	}
	lg, err := ledger.Open(file, log)
	if err != nil {
		return nil, err
	}
	if st := lg.Saved(); st.KeptAside != "" {
		return nil, fmt.Errorf("%w: the state file could not be read (kept as %s): nothing records the agent's changes", agent.ErrRefused, st.KeptAside)
	}
	procs, err := merge.Read(ctx, runtimes)
	if err != nil {
		return nil, fmt.Errorf("read server states: %w", err)
	}
	out := []Released{}
	var errs []error
	end := lg.Batch() // every release, one write
	for _, h := range listChanges(lg.Changes()) {
		r := Released{Server: h.Server, Was: h.Change}
		s, ok := procs.EveryProcess(h.Server)
		switch {
		case !ok:
			r.Error = "not in every HAProxy: left as it is"
			lg.Lose(h.Server)
		case h.Change.Site != "" && h.Change.Site != procs.Site:
			// The file's change is another HAProxy's: this one's server
			// of the same name is someone else's to undo.
			r.Error = fmt.Sprintf("made on another HAProxy (%s), not this one (%s): left as it is", h.Change.Site, procs.Site)
		case !h.Change.Holds(*s):
			r.Error = fmt.Sprintf("no longer the agent's change (%s, weight %d of %d): left as it is", s.Label(), s.Weight, s.Initial)
			lg.Lose(h.Server)
		default:
			var took bool
			if r.Commands, took = sendRestore(ctx, runtimes, *s); !took {
				r.Error = "no HAProxy took the commands: " + commandErrors(r.Commands)
				errs = append(errs, fmt.Errorf("%s: %s", h.Server, r.Error))
				break
			}
			r.Until = now.Add(hold)
			lg.Release(h.Server, s.Initial, now, hold)
		}
		out = append(out, r)
	}
	end()
	if st := lg.Flush(); !st.Saved {
		errs = append(errs, fmt.Errorf("state file %s unsaved: %s", st.File, st.Error))
	}
	return out, errors.Join(errs...)
}

// Undo readies every server the agent drained and puts back every weight
// it changed, on every HAProxy (`--on-exit restore`).
func (c Control) Undo(ctx context.Context) []agent.CommandResult {
	l := c.l
	l.st.stepMu.Lock() // never beside a step: both read the servers and change them
	defer l.st.stepMu.Unlock()
	defer l.theLedger().Batch()()
	if l.mode().Observing() {
		// Observe mode's promise is that nothing the agent decides
		// changes HAProxy; the operator's own commands (ctl restore,
		// hapilot restore) still do.
		l.Log.Warn().Msg("observe mode: --on-exit restore sends nothing; `hapilot ctl restore` or `hapilot restore` brings back what an earlier run changed")
		return nil
	}
	l.st.mu.Lock()
	cycle := l.st.cycle
	l.st.mu.Unlock()
	obs, _, f, err := l.observe(ctx, l.Clock.Now(), cycle)
	if err != nil {
		l.Log.Error().Err(err).Msg("cannot read server states: the agent's changes stay in place")
		return nil
	}
	l.settle(f)
	var out []agent.CommandResult
	for _, b := range obs.Backends {
		for _, s := range b.Servers {
			if s.Owner == agent.OwnerAgent {
				out = append(out, l.apply(ctx, &obs, agent.Action{Kind: agent.Ready, Backend: s.Backend, Server: s.Server, Reason: "agent exit", Origin: agent.OriginRestore})...)
			}
		}
	}
	return out
}
