package agent

import (
	"time"

	"github.com/hapilot/hapilot/haproxy"
)

// Phase is where a server the agent changed stands. Only the ledger's
// transitions move a server from one phase to another; recovery and the
// policies read it and never work it out for themselves.
type Phase string

const (
	// PhaseDrained: the agent drained the server.
	PhaseDrained Phase = "drained"
	// PhaseCut: the server serves at a weight the agent cut (a policy's
	// set_weight, or a drain the capacity check turned into a cut).
	PhaseCut Phase = "cut"
	// PhaseCanary: the agent brought a drained server back at a reduced
	// weight; full weight returns once its live traffic is clean.
	PhaseCanary Phase = "canary"
)

// Change is a change the agent made and still holds.
type Change struct {
	Phase  Phase     `json:"phase"`
	Weight int       `json:"weight,omitempty"` // cut and canary: the weight the agent set
	At     time.Time `json:"at"`               // when the phase began
	Reason string    `json:"reason,omitempty"`
	// ErrorRate is the server's 5xx rate when it was drained (for a drain
	// for a slow tail, its slow share), which sizes the probe burst that
	// may bring it back.
	ErrorRate float64 `json:"error_rate,omitempty"`
	// SlowMs, for a drain for a slow tail, is the answer time at or over
	// which an answer was slow (Action.SlowMs): a probe burst counts an
	// answer that slow as a failure.
	SlowMs int `json:"slow_ms,omitempty"`
	// SlowMean: SlowMs was judged on a mean (Action.SlowMean).
	SlowMean bool `json:"slow_mean,omitempty"`
	// BaselineP99Ms is the backend's recent p99 just before a drain, what
	// the tail-latency guard compares against.
	BaselineP99Ms float64 `json:"baseline_p99_ms,omitempty"`
	// Epoch names the HAProxy processes the change was applied to (see
	// haproxy.Info.Instance). A server back at its configured state under
	// a new epoch lost the change to a reload or restart; under the same
	// epoch, someone undid it.
	Epoch string `json:"epoch"`
	// Maint: the drain went out as maint (the backend's action), so
	// that not even persistent sessions reach the server.
	Maint bool `json:"maint,omitempty"`
	// Site is the HAProxy the change was made on (see Site): a state
	// file read at start re-applies only what was made on the HAProxy
	// the agent now finds. "" in files of earlier agents.
	Site Site `json:"haproxy,omitempty"`
	// Saved is when an agent holding the change last wrote the state
	// file: a restarted agent re-applies a change a reload lost only
	// while this is recent (Ledger.ReapplyWithin).
	Saved time.Time `json:"saved,omitzero"`
}

// Site names an HAProxy across its reloads and restarts, unlike an
// epoch: the runtime socket the agent reaches it by and its node name
// (`show info`'s node: global's `node`, else the host's name), for each
// runtime socket, joined. Another HAProxy on the same host has another
// socket; the same socket path on another host (a state file copied
// there) has another node name. Pid and start time change with every
// reload, so they are the epoch's, not the site's.
type Site string

// SiteOf is the site of the HAProxy reached at addr that answered info.
func SiteOf(addr string, info haproxy.Info) Site {
	return Site(addr + " node " + info.Node)
}

// NotReapplied is a change read from the state file at start that the
// agent did not take up, and why: made on another HAProxy, or lost to a
// reload longer ago than ReapplyWithin. The server is judged afresh.
type NotReapplied struct {
	Server Key    `json:"server"`
	Change Change `json:"change"`
	Why    string `json:"why"`
}

// holds reports whether s shows this change in force.
func (c *Change) Holds(s haproxy.ServerState) bool {
	// The resolver's bits (a server-template slot whose name stopped
	// resolving) come and go with DNS, not with anyone's word: a drained
	// slot that also enters resolver maintenance is still the agent's.
	admin := s.AdminState &^ (haproxy.AdminDNSMaint | haproxy.AdminHostnameMaint)
	if c.Phase == PhaseDrained && c.Maint {
		return admin == haproxy.AdminForcedMaint
	}
	if c.Phase == PhaseDrained {
		return admin == haproxy.AdminForcedDrain
	}
	return admin == 0 && s.Weight == c.Weight
}
