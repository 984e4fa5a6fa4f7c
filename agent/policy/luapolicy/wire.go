package luapolicy

import "github.com/hapilot/hapilot/agent"

// The agent and its Lua worker (see worker.go) speak JSON, one message a
// line: the agent sends a request and reads replies until the one marked
// Done; the replies before it are the script's print lines.

// request is what the agent sends: the script once, then a call of
// decide per step.
type request struct {
	Load   *loadRequest   `json:"load,omitempty"`
	Decide *decideRequest `json:"decide,omitempty"`
}

type loadRequest struct {
	Name string `json:"name"`
	Src  string `json:"src"`
}

type decideRequest struct {
	// BudgetMs is the step's time left for the call; 0: no deadline.
	BudgetMs int64   `json:"budget_ms"`
	Obs      obsView `json:"obs"`
}

// reply is one line from the worker: a print line (Log), or the answer
// to a request (Done).
type reply struct {
	Log  string `json:"log,omitempty"`
	Done bool   `json:"done,omitempty"`
	// Error is the request's failure: a script error, a timeout, a
	// malformed answer, all cut to MaxMessage.
	Error string `json:"error,omitempty"`
	// Broken: the script did what makes the policy stop for good (it keeps
	// too much, or the VM panicked).
	Broken bool `json:"broken,omitempty"`
	// DrainsPer answers a load: the script's needs.drains_per.
	DrainsPer int `json:"drains_per,omitempty"`
	// Actions answers a decide: the script's list, each field as the
	// script gave it (strings cut), checked by the agent.
	Actions []rawAction `json:"actions,omitempty"`
	// DroppedLogs counts print lines past MaxPrints in the call.
	DroppedLogs int `json:"dropped_logs,omitempty"`
}

// rawAction is one {action=, backend=, server=, weight=, reason=} table.
type rawAction struct {
	Verb    string `json:"action"`
	Backend string `json:"backend"`
	Server  string `json:"server"`
	Weight  *int   `json:"weight,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// obsView is what the script's obs table holds, and nothing else.
type obsView struct {
	Time     int64         `json:"time"`
	Cycle    uint64        `json:"cycle"`
	Backends []backendView `json:"backends"`
}

type backendView struct {
	Name    string       `json:"name"`
	Serving int          `json:"serving"`
	Servers []serverView `json:"servers"`
}

type serverView struct {
	Name           string  `json:"name"`
	State          string  `json:"state"`
	Owner          string  `json:"owner"`
	Serving        bool    `json:"serving"`
	Weight         int     `json:"weight"`
	InitialWeight  int     `json:"initial_weight"`
	Requests       uint64  `json:"requests"`
	Err5xx         uint64  `json:"err_5xx"`
	Err4xx         uint64  `json:"err_4xx"`
	ErrorRate      float64 `json:"error_rate"`
	P50Ms          int     `json:"p50_ms"`
	P95Ms          int     `json:"p95_ms"`
	P99Ms          int     `json:"p99_ms"`
	RecentRequests uint64  `json:"recent_requests"`
	RecentErr5xx   uint64  `json:"recent_err_5xx"`
}

// viewOf is the script's view of obs.
func viewOf(obs agent.Observation) obsView {
	v := obsView{Time: obs.Time.Unix(), Cycle: obs.Cycle, Backends: make([]backendView, 0, len(obs.Backends))}
	for _, b := range obs.Backends {
		bv := backendView{Name: b.Name, Serving: b.ServingCount(), Servers: make([]serverView, 0, len(b.Servers))}
		for _, s := range b.Servers {
			bv.Servers = append(bv.Servers, serverView{
				Name: s.Server, State: s.State.Label(), Owner: string(s.Owner), Serving: s.Serving(),
				Weight: s.State.Weight, InitialWeight: s.State.Initial,
				Requests: s.Window.Requests, Err5xx: s.Window.Err5xx, Err4xx: s.Window.Err4xx, ErrorRate: s.Window.ErrorRate(),
				P50Ms: s.Window.P50Ms, P95Ms: s.Window.P95Ms, P99Ms: s.Window.P99Ms,
				RecentRequests: s.Recent.Requests, RecentErr5xx: s.Recent.Err5xx,
			})
		}
		v.Backends = append(v.Backends, bv)
	}
	return v
}
