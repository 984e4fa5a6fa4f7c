// Package agent is hapilot's control loop: each step it observes the
// windows and HAProxy's server states, asks a Policy for a plan, passes the
// plan through the guardrails, applies what survives through the runtime
// socket, and writes one audit record.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/window"
)

// ServerView is what a policy sees of one server.
type ServerView struct {
	Backend string              `json:"backend"`
	Server  string              `json:"server"`
	State   haproxy.ServerState `json:"state"`
	Window  window.Stats        `json:"window"`
	Recent  window.Stats        `json:"recent"`            // the last RecentSpan only
	MaxConn int                 `json:"maxconn,omitempty"` // HAProxy's maxconn for it (show stat slim); 0 unknown
	// RespTimeMs is HAProxy's average server response time over its last
	// 1024 requests (show stat rtime): service time without HAProxy's queue.
	RespTimeMs int     `json:"resp_time_ms,omitempty"`
	Owner      Owner   `json:"owner"`
	Changed    *Change `json:"changed,omitempty"` // the agent's own change in force
	// NoDrainUntil: the tail-latency guard brought the server back; it is
	// not drained again before this, even at full weight.
	NoDrainUntil time.Time `json:"no_drain_until,omitzero"`
	// OperatorUntil: an operator undid the agent's change on this server;
	// it is theirs until then, or until its state changes again.
	OperatorUntil time.Time `json:"operator_until,omitzero"`
}

// Owner says who holds a server's admin state and weight.
type Owner string

const (
	// OwnerNone: ready at its configured weight; the agent may act.
	OwnerNone Owner = "none"
	// OwnerAgent: drained or reweighted by this agent.
	OwnerAgent Owner = "agent"
	// OwnerOperator: in maint, drained or reweighted by someone else;
	// the agent never changes it.
	OwnerOperator Owner = "operator"
)

// Serving reports whether the server takes new traffic.
func (v ServerView) Serving() bool { return v.State.Serving() }

// ServiceMs is the server's service time: HAProxy's rtime (no queue wait
// in it), else the recent p50 (which has it, and so errs on the safe side).
func (v ServerView) ServiceMs() int {
	if v.RespTimeMs > 0 {
		return v.RespTimeMs
	}
	return v.Recent.P50Ms
}

// Busy is the share of the server's maxconn in use: requests in flight
// (rps times the service time) over the limit; 0 when it has no maxconn.
func (v ServerView) Busy(rps float64) float64 {
	if v.MaxConn <= 0 {
		return 0
	}
	return rps * float64(v.ServiceMs()) / 1000 / float64(v.MaxConn)
}

// BackendView groups a backend's servers.
type BackendView struct {
	Name    string       `json:"name"`
	Servers []ServerView `json:"servers"`
}

// ServingCount is how many of the backend's servers take traffic.
func (b BackendView) ServingCount() int {
	n := 0
	for _, s := range b.Servers {
		if s.Serving() {
			n++
		}
	}
	return n
}

// RecentP99 is the backend's recent p99 over its serving servers,
// weighted by their requests, and how many requests it rests on.
func (b BackendView) RecentP99() (ms float64, requests uint64) {
	var sum float64
	for _, s := range b.Servers {
		if s.Serving() {
			sum += float64(s.Recent.P99Ms) * float64(s.Recent.Requests)
			requests += s.Recent.Requests
		}
	}
	if requests == 0 {
		return 0, 0
	}
	return sum / float64(requests), requests
}

// Observation is one step's input to a policy.
type Observation struct {
	Time       time.Time     `json:"time"`
	Cycle      uint64        `json:"cycle"`
	Lookback   time.Duration `json:"lookback"`
	RecentSpan time.Duration `json:"recent_span"`
	Backends   []BackendView `json:"backends"`
	// Refused: why the guardrails refused an action on a server last
	// step, so that a policy can see its word was not enough.
	Refused map[Key]string `json:"refused,omitempty"`
	// DrainsLastHour is each backend's drains the agent sent in the last
	// hour, for the rate cap; not a policy's business.
	DrainsLastHour map[string]int `json:"-"`
}

// Find returns the view of backend/server.
func (o *Observation) Find(backend, server string) (*BackendView, *ServerView) {
	for i := range o.Backends {
		b := &o.Backends[i]
		if b.Name != backend {
			continue
		}
		for j := range b.Servers {
			if b.Servers[j].Server == server {
				return b, &b.Servers[j]
			}
		}
		return b, nil
	}
	return nil, nil
}

// Key names one server, "backend/server": its identity everywhere in the
// agent (the ledger, the candidates, the refusals). haproxy.ServerKey is
// the one place that formats and parses it.
type Key = haproxy.ServerKey

// Key is the view's server.
func (v ServerView) Key() Key { return Key{Backend: v.Backend, Server: v.Server} }

// Kind is what an action does.
type Kind string

const (
	Drain     Kind = "drain"
	Ready     Kind = "ready"
	SetWeight Kind = "set_weight"
)

// Origin says who proposes an action, which decides the limits it is
// held to.
type Origin string

const (
	// OriginPolicy: the policy's own plan (the zero value, left out of
	// the audit's JSON). Every guardrail applies.
	OriginPolicy Origin = ""
	// OriginRecovery: recovery's re-admissions (after a clean probe burst,
	// the canary ramp with probing off, the tail guard), or a fleet
	// decider's, followed here. A drained server comes back only through
	// one: any other ready of it is refused and turned into a request to
	// probe it.
	OriginRecovery Origin = "recovery"
	// OriginReapply: the loop putting back a change of its own that a
	// reload lost. Exempt from the per-step counts, not from the floor.
	OriginReapply Origin = "reapply"
	// OriginRestore: `--on-exit restore` undoing the agent's changes as
	// it stops.
	OriginRestore Origin = "restore"
)

// Action is one change a policy proposes.
type Action struct {
	Kind    Kind   `json:"kind"`
	Backend string `json:"backend"`
	Server  string `json:"server"`
	Weight  int    `json:"weight,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Origin is who proposed it.
	Origin Origin `json:"origin,omitempty"`
	// NoDrainFor, on a Ready, keeps the server from being drained again
	// for that long (the tail-latency guard).
	NoDrainFor time.Duration `json:"no_drain_for,omitempty"`
	// ErrorRate, on a Drain, is the 5xx rate it was judged at where this
	// agent's own window does not show it (a fleet decider's word), or,
	// with SlowMs, the share of slow answers it was drained for: the
	// ledger keeps the larger of it and the window's 5xx rate, and the
	// probe burst that may bring the server back is sized on it.
	ErrorRate float64 `json:"error_rate,omitempty"`
	// SlowMs, on a Drain for a slow tail, is the answer time in ms at or
	// over which the test counted an answer slow. The probe burst that
	// may bring the server back counts such an answer as a failure: its
	// median is a healthy server's, and judged on the median alone it was
	// let back while still slow, and drained again.
	SlowMs int `json:"slow_ms,omitempty"`
	// SlowMean, with SlowMs, says the answer time judged was a mean (the
	// stats path's, its last 10 s of answers read out of HAProxy's rtime),
	// not each answer's: no share of slow answers was seen, and the probe
	// burst is sized on the least share that lifts such a mean to SlowMs
	// (recovery). ErrorRate is then the window's 5xx rate alone: sized on
	// the share of checks whose mean was slow (84% in TestSlowTailDrained),
	// a burst of 20 probes let a server with 5% of its answers at 1.5 s
	// back about one time in three.
	SlowMean bool `json:"slow_mean,omitempty"`
	// Test is the figures of the test behind the action, where a policy
	// ran one (the rules do); Reason is their text for people, never
	// parsed back.
	Test *TestFigures `json:"test,omitempty"`
}

// TestFigures is a test's verdict on one server, as numbers: its
// statistic against the threshold that condemns it, its p-value where
// the test has one, and the server's rate against the one it is judged
// by.
type TestFigures struct {
	// Name is the test: "sequential" (the rules' CUSUM), "windowed" (the
	// binomial test against the peers), "latency" (the median against the
	// peers').
	Name      string  `json:"name"`
	Statistic float64 `json:"statistic"`
	Threshold float64 `json:"threshold"`
	// PValue is the windowed test's; the sequential test has none.
	PValue *float64 `json:"p_value,omitempty"`
	// Rate is the server's 5xx share over the evidence, Baseline the
	// share it is judged against (the sequential test's healthy rate,
	// the windowed test's peers'); neither is set by the latency test.
	Rate     float64 `json:"rate,omitempty"`
	Baseline float64 `json:"baseline,omitempty"`
}

// Key is the action's server.
func (a Action) Key() Key { return Key{Backend: a.Backend, Server: a.Server} }

// ActionID names an action: its verb on its server, whatever its weight,
// reason or origin. It is comparable, so that maps of actions (refusals
// and would-actions remembered across steps, proposals awaiting
// confirmation, calibration's expected answers) key on it; it is written
// as text ("drain app/srv1") only at the edges: logs, records, JSON.
type ActionID struct {
	Kind   Kind
	Server Key
}

// ID is a's identity.
func (a Action) ID() ActionID { return ActionID{Kind: a.Kind, Server: a.Key()} }

// String is "kind backend/server".
func (id ActionID) String() string { return string(id.Kind) + " " + id.Server.String() }

// ParseActionID reads String's form back.
func ParseActionID(s string) (ActionID, error) {
	kind, server, ok := strings.Cut(s, " ")
	if !ok {
		return ActionID{}, fmt.Errorf("action %q: want \"kind backend/server\"", s)
	}
	switch k := Kind(kind); k {
	case Drain, Ready, SetWeight:
	default:
		return ActionID{}, fmt.Errorf("action %q: kind %q: want %s, %s or %s", s, kind, Drain, Ready, SetWeight)
	}
	key, err := haproxy.ParseServerKey(server)
	if err != nil {
		return ActionID{}, fmt.Errorf("action %q: %w", s, err)
	}
	return ActionID{Kind: Kind(kind), Server: key}, nil
}

// MarshalText writes String's form: an ActionID is a JSON map key.
func (id ActionID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText reads String's form.
func (id *ActionID) UnmarshalText(b []byte) (err error) {
	*id, err = ParseActionID(string(b))
	return err
}

// Counted reports whether a counts against the per-step caps and the
// capacity check: everything but the loop's own re-application of a lost
// change, which only puts back what was already in force.
func (a Action) Counted() bool { return a.Origin != OriginReapply }

// Plan is a policy's answer for one step.
type Plan []Action

// Decider is a policy's judgment: a plan from an observation. Decide
// must return by ctx's deadline, which the loop sets for every step (see
// Settings.PolicyBudget); a policy takes its time from it, never from a
// timer of its own.
type Decider interface {
	Name() string
	Decide(ctx context.Context, obs Observation) (Plan, error)
}

// Policy is a decider together with its hooks: one value that the loop,
// the daemon and the status server read, so that nothing is ever
// type-asserted through a wrapper. Each policy's constructor fills in
// what it has; a nil hook is one the policy lacks. A wrapper (fleet mode,
// shadow) replaces the Decider and the Evidence test and keeps the rest
// as they are.
type Policy struct {
	Decider
	// Needs is what the policy asks of the loop around it.
	Needs Needs
	// Evidence tells, cheaply and from the windows alone, which servers
	// Decide would act on now: the loop asks it between steps and steps
	// at once when a new server appears, instead of waiting for the next
	// tick. Policies that cost a call (a model) leave it nil: their
	// cadence is the interval.
	Evidence func(obs Observation) []Key
	// Report adds the policy's own figures (model calls, tokens,
	// fallbacks) to each step's audit record.
	Report func() any
	// Status is a state worth showing in /status: a model loading, say.
	Status func() any
	// Notes is the policy's standing word on servers it judges but leaves
	// as they are (the rules' zone server, drained once and left serving
	// after): /status and `ctl explain` show it. Safe to call from any
	// goroutine.
	Notes func() map[Key]string
	// Metrics writes the policy's counters into /metrics.
	Metrics func(w io.Writer)
	// Start and Close run and end a life of the policy's own (a model's
	// warm-up and watch), with the agent's.
	Start func()
	Close func()
}

// PolicyOf is d with no hooks.
func PolicyOf(d Decider) Policy { return Policy{Decider: d} }

// Needs is what a policy asks of the loop around it; the loop never tells
// policies apart by name.
type Needs struct {
	// DrainsPer lets a backend of N servers lose up to N/DrainsPer of them
	// in one step (at least the guardrails' MaxDrains), floor and capacity
	// permitting. 0 keeps MaxDrains for the whole step.
	DrainsPer int
}

// Runtime is the part of the runtime API the loop uses; *haproxy.Client
// implements it, tests use a recording fake.
type Runtime interface {
	Addr() string
	ShowInfo(ctx context.Context) (haproxy.Info, error)
	ServerStats(ctx context.Context) ([]haproxy.ServerStat, error)
	ShowServersState(ctx context.Context) ([]haproxy.ServerState, error)
	SetServerState(ctx context.Context, backend, server string, st haproxy.AdminState) error
	SetWeight(ctx context.Context, backend, server string, weight int) error
}

// Windows is where observations come from; *window.Store implements it.
type Windows interface {
	Snapshot(last time.Duration) []window.Stats
}

// SetWindows gives v its long and recent window figures, named after v
// even where the windows hold no series for it yet.
func (v *ServerView) SetWindows(long, recent map[Key]window.Stats) {
	k := Key{Backend: v.Backend, Server: v.Server}
	v.Window, v.Recent = long[k], recent[k]
	v.Window.Backend, v.Window.Server = v.Backend, v.Server
	v.Recent.Backend, v.Recent.Server = v.Backend, v.Server
}

// ErrRefused marks an operator's command the agent will not carry out;
// the error's text says why.
var ErrRefused = errors.New("refused")

// ProbeStatus is where recovery stands with a drained server.
type ProbeStatus struct {
	// Next is when the next probe burst may start.
	Next         time.Time `json:"next,omitzero"`
	LastBurst    string    `json:"last_burst,omitempty"`
	FailedBursts int       `json:"failed_bursts"`
	Drains       int       `json:"drains"`
}

// Recovery proposes re-admissions each step (see agent/recovery). Its
// actions pass the guardrails like any policy's.
type Recovery interface {
	Plan(ctx context.Context, obs Observation) Plan
	// RequestProbe asks for a server drained by the agent to be probed as
	// soon as its backoff allows: what a policy's ready of a drained
	// server becomes.
	RequestProbe(server Key)
}
