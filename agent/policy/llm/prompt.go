package llm

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/hapilot/hapilot/agent"
)

// Prompt renders an observation compactly: backend figures, then one row
// per server. prev holds each server's 5xx rate at the previous step, for
// the trend column. Backends with more than maxShown servers list the
// maxShown most anomalous in full and sum the rest in one line, so that
// the prompt stays small as fleets grow (the study lost recall with N).
func Prompt(obs agent.Observation, prev map[string]float64, maxShown int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "window: last %s\n", lookback(obs.Lookback))
	for _, be := range obs.Backends {
		var req, e5 uint64
		for _, s := range be.Servers {
			req += s.Window.Requests
			e5 += s.Window.Err5xx
		}
		if req == 0 {
			continue // no traffic seen: nothing to judge
		}
		fmt.Fprintf(&b, "\nbackend %s: %d servers, %d serving (keep at least %d), %d requests, 5xx %.2f%%\n",
			be.Name, len(be.Servers), be.ServingCount(), (len(be.Servers)+1)/2, req, pct(e5, req))
		b.WriteString("server state owner weight requests 5xx err% p95ms p99ms trend agent_change\n")
		servers := append([]agent.ServerView(nil), be.Servers...)
		sort.SliceStable(servers, func(i, j int) bool {
			return servers[i].Window.ErrorRate() > servers[j].Window.ErrorRate()
		})
		hidden := 0
		var hReq, hErr uint64
		for i, s := range servers {
			if maxShown > 0 && i >= maxShown {
				hidden++
				hReq += s.Window.Requests
				hErr += s.Window.Err5xx
				continue
			}
			k := s.Backend + "/" + s.Server
			change := "-"
			if s.Changed != nil {
				change = fmt.Sprintf("%s %.0fs ago", s.Changed.Phase, obs.Time.Sub(s.Changed.At).Seconds())
			}
			fmt.Fprintf(&b, "%s %s %s %d %d %d %.2f %d %d %s %s\n", s.Server, s.State.Label(), s.Owner, s.State.Weight,
				s.Window.Requests, s.Window.Err5xx, 100*s.Window.ErrorRate(), s.Window.P95Ms, s.Window.P99Ms,
				trend(prev, k, s.Window.ErrorRate()), change)
		}
		if hidden > 0 {
			fmt.Fprintf(&b, "(%d more servers with lower error rates: %d requests, 5xx %.2f%%)\n", hidden, hReq, pct(hErr, hReq))
		}
	}
	return b.String()
}

func lookback(d time.Duration) string {
	if d == 0 {
		return "window"
	}
	return d.String()
}

func pct(x, n uint64) float64 {
	if n == 0 {
		return 0
	}
	return 100 * float64(x) / float64(n)
}

func trend(prev map[string]float64, k string, now float64) string {
	p, ok := prev[k]
	switch {
	case !ok:
		return "new"
	case now > p*1.2 && now-p > 0.001:
		return "rising"
	case now < p*0.8 && p-now > 0.001:
		return "falling"
	}
	return "steady"
}
