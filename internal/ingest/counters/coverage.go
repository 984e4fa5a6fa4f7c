package counters

import (
	"slices"
	"sync"
	"time"

	"github.com/hapilot/hapilot/haproxy"
)

// Coverage compares, server by server, the answers HAProxy's own counters
// grew by with the responses the per-response paths (SPOE, the Lua
// companion, logs) delivered for it. A server that answers while no path
// reports it is silent: the stanza's socket is out of a chrooted
// HAProxy's reach, HAProxy's user may not connect, the frontend lacks the
// `filter spoe` line, or the agents' backend is down so the nbsrv guard
// skips SPOE. Without this check the agent would judge such a server on
// an empty window for good, and drain nothing while HAProxy serves its
// errors. The stats path records a silent server's answers from the
// counters instead (as with --spoe-listen off) until a path reports it
// again.
//
// Coverage is called from the stats path's polls; its figures are read
// from any goroutine.
type Coverage struct {
	// After is how long a server may answer with no response delivered
	// before it is silent.
	After time.Duration
	// MinAnswers is how many answers HAProxy must count for a server in
	// that time for its silence to mean anything: a sampled stanza
	// reports one answer in k, so the caller raises it once sampled
	// events arrive. Nil means DefaultMinAnswers.
	MinAnswers func() int64
	// Delivered is the count of responses the per-response paths reported
	// for a server so far (window.Store.Delivered).
	Delivered func(backend, server string) uint64

	mu      sync.Mutex // guards servers and episodes
	servers map[haproxy.ServerKey]*coverage
	// episodes counts the times a server went silent.
	episodes uint64
}

// DefaultMinAnswers is the answers that make a silence: more than any
// gap between two reported responses of a path that reports every one.
const DefaultMinAnswers = 25

// DefaultSilentAfter is Coverage.After by default: a Lua companion
// flushes every second, and SPOE and logs report at once, so five seconds
// without a response is no lag.
const DefaultSilentAfter = 5 * time.Second

// coverage is one server's account.
type coverage struct {
	delivered    uint64    // Delivered at the last look
	lastDelivery time.Time // when Delivered last grew, or the server was first seen
	answers      int64     // answers HAProxy counted since lastDelivery
	silentSince  time.Time // zero while a path reports it
}

// Observe takes one poll's answers for server k, counted by HAProxy, and
// reports whether the server is silent: then the caller records those
// answers from the counters.
func (c *Coverage) Observe(k haproxy.ServerKey, answers int64, now time.Time) bool {
	delivered := c.Delivered(k.Backend, k.Server)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.servers == nil {
		c.servers = map[haproxy.ServerKey]*coverage{}
	}
	s := c.servers[k]
	if s == nil {
		s = &coverage{delivered: delivered, lastDelivery: now}
		c.servers[k] = s
		return false
	}
	switch {
	case delivered > s.delivered:
		*s = coverage{delivered: delivered, lastDelivery: now}
		return false
	case delivered < s.delivered: // the series was dropped and made anew
		s.delivered = delivered
	}
	s.answers += answers
	if s.silentSince.IsZero() && now.Sub(s.lastDelivery) >= c.After && s.answers >= c.minAnswers() {
		s.silentSince = now
		c.episodes++
	}
	return !s.silentSince.IsZero()
}

func (c *Coverage) minAnswers() int64 {
	if c.MinAnswers == nil {
		return DefaultMinAnswers
	}
	return c.MinAnswers()
}

// Forget drops the servers the last poll did not list, so that a server
// removed from HAProxy stops counting as silent.
func (c *Coverage) Forget(keep func(haproxy.ServerKey) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.servers {
		if !keep(k) {
			delete(c.servers, k)
		}
	}
}

// Silence is what Coverage knows now.
type Silence struct {
	// Silent are the servers HAProxy counts answers for and no path
	// reports, sorted; Covered, those a path has reported.
	Silent  []haproxy.ServerKey
	Covered int
	// Since is when the longest silence began; zero when none.
	Since time.Time
	// Episodes counts the times a server went silent, since the start.
	Episodes uint64
}

// Silence lists the silent servers.
func (c *Coverage) Silence() Silence {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := Silence{Episodes: c.episodes}
	for k, s := range c.servers {
		if s.silentSince.IsZero() {
			if s.delivered > 0 {
				out.Covered++
			}
			continue
		}
		out.Silent = append(out.Silent, k)
		if out.Since.IsZero() || s.silentSince.Before(out.Since) {
			out.Since = s.silentSince
		}
	}
	slices.SortFunc(out.Silent, func(a, b haproxy.ServerKey) int {
		if a.Backend != b.Backend {
			if a.Backend < b.Backend {
				return -1
			}
			return 1
		}
		switch {
		case a.Server < b.Server:
			return -1
		case a.Server > b.Server:
			return 1
		}
		return 0
	})
	return out
}
