package loop

import (
	"context"
	"sort"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/ledger"
	"github.com/hapilot/hapilot/agent/merge"
	"github.com/hapilot/hapilot/internal/lib/window"
)

func key(backend, server string) agent.Key { return agent.Key{Backend: backend, Server: server} }

// observe builds the step's observation from the processes and the
// windows, with the ledger's word on who holds each server. It also
// returns the changes a reload lost, to be applied again, and what it
// found that the loop must record (settle): observe only reads. The
// windows' places it keeps from step to step are a memo of where each
// server's series lies, not a record.
func (l *Loop) observe(ctx context.Context, now time.Time, cycle uint64) (agent.Observation, agent.Plan, *found, error) {
	procs, err := merge.Read(ctx, l.Runtimes)
	if err != nil {
		return agent.Observation{}, nil, nil, err
	}
	lg := l.theLedger()
	f := &found{now: now, procs: procs, present: make(map[agent.Key]bool, len(procs.Order)), leftAlone: map[agent.Key]string{}}
	span := l.RecentSpan
	if span <= 0 {
		span = 10 * time.Second
	}
	windows := l.readWindows(l.Lookback, span)
	obs := agent.Observation{Time: now, Cycle: cycle, Lookback: l.Lookback, RecentSpan: span}
	var reapply agent.Plan
	all := procs.Everywhere()
	places := l.st.places.of(all, windows)
	index := map[string]int{} // backend name -> its place in obs.Backends
	// Each backend's servers are counted first so that its slice is made
	// once: appending 10,000 views of 456 bytes copied each several times.
	perBackend := map[string]int{}
	for _, e := range all {
		perBackend[e.State.Backend]++
	}
	f.judgments = make([]ledger.Judgment, 0, len(all))
	for i, e := range all {
		s := e.State
		k := key(s.Backend, s.Server)
		f.present[k] = true
		if why := l.leftAlone(k, e.Kind); why != "" {
			f.leftAlone[k] = why
			continue
		}
		f.addrs = append(f.addrs, addrOf{k, s.Addr})
		v := agent.ServerView{Backend: s.Backend, Server: s.Server, State: s, MaxConn: e.MaxConn, RespTimeMs: e.RespTimeMs}
		windows.setAt(&v, places[i])
		j := lg.Judge(k, s, now, procs.Epoch, procs.Site)
		f.judgments = append(f.judgments, j)
		v.Owner, v.Changed = j.Owner, j.Change
		v.NoDrainUntil = lg.HeldUntil(k, now)
		v.OperatorUntil = j.OperatorUntil
		if j.Reapply {
			f.reapplied = append(f.reapplied, v)
			reapply = append(reapply, reapplyAction(v))
		}
		if h, ok := holder(v, lg); ok {
			f.held = append(f.held, h)
		}
		label := ""
		if v.Owner == agent.OwnerOperator && (s.Drain() || s.Maint()) {
			label = s.Label()
		}
		f.seen = append(f.seen, seenAs{k, label})
		bi, ok := index[s.Backend]
		if !ok {
			bi = len(obs.Backends)
			index[s.Backend] = bi
			obs.Backends = append(obs.Backends, agent.BackendView{Name: s.Backend, Servers: make([]agent.ServerView, 0, perBackend[s.Backend])})
		}
		obs.Backends[bi].Servers = append(obs.Backends[bi].Servers, v)
	}
	sort.Slice(obs.Backends, func(i, j int) bool { return obs.Backends[i].Name < obs.Backends[j].Name })
	return obs, reapply, f, nil
}

// found is what an observation found that the loop records (settle):
// the HAProxy it read, the ledger's judgments, the servers present and
// those left alone, each server's address, what the operator holds, and
// the changes a reload lost.
type found struct {
	now       time.Time
	procs     *merge.Processes
	judgments []ledger.Judgment
	present   map[agent.Key]bool
	leftAlone map[agent.Key]string
	addrs     []addrOf
	seen      []seenAs
	held      []Held
	reapplied []agent.ServerView
}

// addrOf is a server's address as an observation found it.
type addrOf struct {
	k    agent.Key
	addr string
}

// seenAs is a server's state when the operator holds it ("" when not).
type seenAs struct {
	k     agent.Key
	label string
}

// settle records what observe found, in the order observe found it: the
// HAProxy's epoch and site, the ledger's judgments, the operator's
// servers, the servers gone; the windows of servers gone or readdressed;
// the servers left alone, and, at the first step, the inventory. Called
// with stepMu held.
func (l *Loop) settle(f *found) {
	lg := l.theLedger()
	if was, changed := lg.SetEpoch(f.procs.Epoch); changed && was != "" {
		l.Log.Warn().Str("was", was).Str("now", f.procs.Epoch).Msg("HAProxy reloaded or restarted")
	}
	lg.SetSite(f.procs.Site)
	lg.Apply(f.judgments)
	for _, v := range f.reapplied {
		// Once per server and HAProxy epoch: held back (observe mode,
		// a pause), the re-application is proposed every step.
		k := v.Key()
		ev := l.Log.Warn()
		if l.st.reapplyLogged[k] == f.procs.Epoch {
			ev = l.Log.Debug()
		}
		if l.st.reapplyLogged == nil {
			l.st.reapplyLogged = map[agent.Key]string{}
		}
		l.st.reapplyLogged[k] = f.procs.Epoch
		ev.Stringer("server", k).Str("phase", string(v.Changed.Phase)).Msg("a reload lost the agent's change; applying it again")
	}
	for _, s := range f.seen {
		lg.SeeOperator(s.k, s.label)
	}
	for _, a := range f.addrs {
		l.readdress(a.k, a.addr)
	}
	for k, why := range l.st.alone.note(f.leftAlone) {
		l.Log.Info().Stringer("server", k).Str("why", why).Msg("left alone: neither judged nor acted on")
	}
	lg.Keep(f.present, f.now)
	l.retain(f.procs)
	if !l.st.inventoried {
		l.st.inventoried = true
		l.takeInventory(f.held)
	}
}

// windowsRead is one read of the long and the recent window, looked up by
// server through one index: the store returns the same series in the
// same order for both spans, so the recent read is found at the long
// one's place, and a map of 10,000 figures is built once a read, not
// twice (each had been a tenth of a step).
type windowsRead struct {
	long, recent []window.Stats
	at           map[agent.Key]int32
	// recentAt is the recent read's own index, made only where its series
	// are not the long read's, place for place.
	recentAt map[agent.Key]int32
}

// bothWindows is a Windows that reads two spans in one pass
// (*window.Store).
type bothWindows interface {
	Snapshots(a, b time.Duration) (x, y []window.Stats)
}

func (l *Loop) readWindows(long, recent time.Duration) *windowsRead {
	w := &windowsRead{}
	if both, ok := l.Windows.(bothWindows); ok {
		w.long, w.recent = both.Snapshots(long, recent)
	} else {
		w.long, w.recent = l.Windows.Snapshot(long), l.Windows.Snapshot(recent)
	}
	if len(w.recent) != len(w.long) {
		w.recentAt = index(w.recent)
		return w
	}
	for i := range w.recent {
		if w.recent[i].Backend != w.long[i].Backend || w.recent[i].Server != w.long[i].Server {
			w.recentAt = index(w.recent)
			break
		}
	}
	return w
}

func index(stats []window.Stats) map[agent.Key]int32 {
	at := make(map[agent.Key]int32, len(stats))
	for i, st := range stats {
		at[key(st.Backend, st.Server)] = int32(i)
	}
	return at
}

// place is k's place in the long read, -1 where it holds no series for k.
func (w *windowsRead) place(k agent.Key) int32 {
	if w.at == nil {
		w.at = index(w.long)
	}
	if i, ok := w.at[k]; ok {
		return i
	}
	return -1
}

// holds says whether the long read's place i is k's series.
func (w *windowsRead) holds(i int32, k agent.Key) bool {
	return int(i) < len(w.long) && w.long[i].Backend == k.Backend && w.long[i].Server == k.Server
}

// set is SetWindows from this read.
func (w *windowsRead) set(v *agent.ServerView) { w.setAt(v, w.place(key(v.Backend, v.Server))) }

// setAt is set with v's place in the long read known (-1: none).
func (w *windowsRead) setAt(v *agent.ServerView, i int32) {
	v.Window, v.Recent = window.Stats{}, window.Stats{}
	if i >= 0 {
		v.Window = w.long[i]
	}
	switch {
	case w.recentAt != nil:
		if j, ok := w.recentAt[key(v.Backend, v.Server)]; ok {
			v.Recent = w.recent[j]
		}
	case i >= 0:
		v.Recent = w.recent[i]
	}
	v.Window.Backend, v.Window.Server = v.Backend, v.Server
	v.Recent.Backend, v.Recent.Server = v.Backend, v.Server
}

// viewPlaces is, for the servers of the last step in HAProxy's order,
// each one's place in the windows' read. Both orders hold from step to
// step until a server comes or goes, so a step checks the places kept,
// comparing names in order, instead of finding 10,000 servers by hash.
type viewPlaces struct {
	keys   []agent.Key
	places []int32
}

// of is each server's place in w, in the order of servers.
func (p *viewPlaces) of(servers []*merge.Server, w *windowsRead) []int32 {
	if p.fit(servers, w) {
		return p.places
	}
	p.keys, p.places = p.keys[:0], p.places[:0]
	for _, e := range servers {
		k := key(e.State.Backend, e.State.Server)
		p.keys = append(p.keys, k)
		p.places = append(p.places, w.place(k))
	}
	return p.places
}

// fit says whether the places kept are the servers' in w: the same
// servers in the same order, each place holding its server's series, and
// every series of w placed (so that a server kept without one still has
// none).
func (p *viewPlaces) fit(servers []*merge.Server, w *windowsRead) bool {
	if len(p.keys) != len(servers) {
		return false
	}
	placed := 0
	for i, e := range servers {
		k := p.keys[i]
		if k.Backend != e.State.Backend || k.Server != e.State.Server {
			return false
		}
		if at := p.places[i]; at >= 0 {
			if !w.holds(at, k) {
				return false
			}
			placed++
		}
	}
	return placed == len(w.long)
}

// reapplyAction puts back a change a reload lost.
func reapplyAction(v agent.ServerView) agent.Action {
	a := agent.Action{Kind: agent.Drain, Backend: v.Backend, Server: v.Server, Reason: "re-applied after a reload: " + v.Changed.Reason, Origin: agent.OriginReapply}
	if v.Changed.Phase != agent.PhaseDrained {
		a.Kind, a.Weight = agent.SetWeight, v.Changed.Weight
	}
	return a
}

// retain drops the windows' series of servers no HAProxy reports, so
// that names that only arrive in events cannot fill the store for good.
func (l *Loop) retain(procs *merge.Processes) {
	r, ok := l.Windows.(retainer)
	if !ok {
		return
	}
	if n := r.Retain(func(b, s string) bool { e, known := procs.ByKey[key(b, s)]; return known && e.SeenBy > 0 }); n > 0 {
		l.Log.Warn().Int("series", n).Msg("dropped the windows of servers HAProxy does not report")
	}
}

// Holder says who holds a server found out of its configured state.
type Holder string

const (
	// HeldByAgent: the agent's own change, from its state file.
	HeldByAgent Holder = "agent"
	// HeldByOperator: the operator's: they undid or released the agent's
	// change, or the agent saw them set it before it restarted.
	HeldByOperator Holder = "operator"
	// HeldByUnknown: found so at start with no record of who set it: a
	// change made while the agent was not running, or by an agent that
	// kept no state file. The agent never touches it, as an operator's.
	HeldByUnknown Holder = "unknown"
)

// Held is a server found in drain or maint, or at a weight the agent
// set, and who holds it.
type Held struct {
	Server agent.Key `json:"server"`
	State  string    `json:"state"`
	Weight int       `json:"weight"`
	Holder Holder    `json:"holder"`
	// Since is when the agent's change began (its own only).
	Since time.Time `json:"since,omitzero"`
	// Reason is the agent's reason for its change (its own only).
	Reason string `json:"reason,omitempty"`
}

// holder classifies v for the start-up inventory: ok is false for a
// server at its configured state that nobody holds. Called before the
// step records what it saw of the operator's servers.
func holder(v agent.ServerView, lg *ledger.Ledger) (Held, bool) {
	h := Held{Server: v.Key(), State: v.State.Label(), Weight: v.State.Weight}
	switch {
	case v.Owner == agent.OwnerAgent && v.Changed != nil:
		h.Holder, h.Since, h.Reason = HeldByAgent, v.Changed.At, v.Changed.Reason
	case !v.State.Drain() && !v.State.Maint():
		return h, false
	case !v.OperatorUntil.IsZero() || lg.SeenOperator(v.Key()):
		h.Holder = HeldByOperator
	default:
		h.Holder = HeldByUnknown
	}
	return h, true
}

// takeInventory logs what the first step found held, and keeps it for
// /status: every unknown server once, at warn, since nothing says who
// drained it or whether it should come back.
func (l *Loop) takeInventory(held []Held) {
	counts := map[Holder]int{}
	for _, h := range held {
		counts[h.Holder]++
		if h.Holder == HeldByUnknown {
			l.Log.Warn().Stringer("server", h.Server).Str("state", h.State).
				Msg("found out of rotation with no record of who set it: left alone, as an operator's; bring it back by hand if no one meant it")
			k := h.Server
			l.emit(agent.Event{Type: agent.EventUnknownServer, Server: &k, Reason: "found " + h.State + " at start with no record of who set it: left alone",
				Detail: map[string]string{"state": h.State}})
		}
	}
	l.Log.Info().Int("agent", counts[HeldByAgent]).Int("operator", counts[HeldByOperator]).Int("unknown", counts[HeldByUnknown]).
		Msg("servers held at start")
	l.st.mu.Lock()
	l.st.inventory = held
	l.st.mu.Unlock()
}
