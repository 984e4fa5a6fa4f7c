// Package agent is hapilot's control loop: each step it observes the
// windows and HAProxy's server states, asks a Policy for a plan, passes the
// plan through the guardrails, applies what survives through the runtime
// socket, and writes one audit record.
package agent

import (
	"context"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/window"
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
	NoDrainUntil time.Time `json:"no_drain_until,omitempty"`
	// OperatorUntil: an operator undid the agent's change on this server;
	// it is theirs until then, or until its state changes again.
	OperatorUntil time.Time `json:"operator_until,omitempty"`
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
	// Refused: "backend/server" -> why the guardrails refused an action
	// on it last step, so that a policy can see its word was not enough.
	Refused map[string]string `json:"refused,omitempty"`
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

// Kind is what an action does.
type Kind string

const (
	Drain     Kind = "drain"
	Ready     Kind = "ready"
	SetWeight Kind = "set_weight"
)

// Action is one change a policy proposes.
type Action struct {
	Kind    Kind   `json:"kind"`
	Backend string `json:"backend"`
	Server  string `json:"server"`
	Weight  int    `json:"weight,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Restore marks the loop's own re-application of a change a reload
	// lost: exempt from the per-step counts, not from the floor.
	Restore bool `json:"restore,omitempty"`
	// NoDrainFor, on a Ready, keeps the server from being drained again
	// for that long (the tail-latency guard).
	NoDrainFor time.Duration `json:"no_drain_for,omitempty"`
	// Readmit marks recovery's own re-admissions (after a clean probe
	// burst, the canary ramp with probing off, or the tail guard). A
	// drained server comes back only through one: any other ready of it
	// is refused and turned into a request to probe it.
	Readmit bool `json:"readmit,omitempty"`
}

// Plan is a policy's answer for one step.
type Plan []Action

// Policy decides what to do from an observation. It must not block past
// ctx's deadline.
type Policy interface {
	Name() string
	Decide(ctx context.Context, obs Observation) (Plan, error)
}

// Reporter is a policy that adds its own figures (model calls, tokens,
// fallbacks) to each step's audit record.
type Reporter interface {
	Report() any
}

// Needs is what a policy asks of the loop around it. A policy declares
// its needs by implementing NeedsDeclarer; the loop never tells policies
// apart by name.
type Needs struct {
	// DrainsPer lets a backend of N servers lose up to N/DrainsPer of them
	// in one step (at least the guardrails' MaxDrains), floor and capacity
	// permitting. 0 keeps MaxDrains for the whole step.
	DrainsPer int
	// NoStepBudget lets a step run as long as the policy takes, as the
	// study's loop did: the cadence slips instead of the call being cut
	// short. Only the benchmark's unprotected runs ask for it.
	NoStepBudget bool
}

// StatusReporter is a policy with a state worth showing in /status: a
// model loading, say.
type StatusReporter interface {
	PolicyStatus() any
}

// EvidenceChecker is a policy that can tell, cheaply and from the
// windows alone, which servers its Decide would act on now: the loop asks
// it between steps and steps at once when a new server appears, instead
// of waiting for the next tick. Policies that cost a call (a model) do
// not implement it: their cadence is the interval.
type EvidenceChecker interface {
	// Evidence returns the "backend/server" keys its test finds.
	Evidence(obs Observation) []string
}

// NeedsDeclarer is a policy with needs of its own.
type NeedsDeclarer interface {
	Needs() Needs
}

// NeedsOf returns p's needs, or none.
func NeedsOf(p Policy) Needs {
	if d, ok := p.(NeedsDeclarer); ok {
		return d.Needs()
	}
	return Needs{}
}
