package counters

import (
	"slices"
	"sync"
	"time"

	"github.com/hapilot/hapilot/haproxy"
)

// Sight checks, server by server, that the per-response paths report
// HAProxy's own 502/503/504 (window.FailProxy) when the stats path
// assumes they do (StatPoller.Unseen leaves FailProxy out: the Lua
// companion's and the logs' stanzas see them). A stanza that cannot, the
// Lua companion's written with http-response as it was before, reports
// the server's own 5xx and none of HAProxy's: without this check a
// server that hangs would be judged on its answers alone, and never
// drained. A blind server's HAProxy 5xx are recorded from the counters
// until a later round finds the path reporting them again.
//
// Each round gathers a server's evidence until HAProxy counted
// MinProxy of its own 5xx for it: the path must have reported the
// server's own 5xx (hrsp_5xx) and at least half of HAProxy's, else it is
// blind to them. The half leaves room for a path's lag (a Lua flush, a
// poll that reads a 504 before its line arrives).
type Sight struct {
	// MinProxy is HAProxy's own 5xx of one server a round needs; 0 is
	// DefaultMinProxy.
	MinProxy int64
	// Delivered5xx is the 5xx the per-response paths reported for a
	// server so far (window.Store.Delivered5xx).
	Delivered5xx func(backend, server string) uint64

	mu      sync.Mutex
	servers map[haproxy.ServerKey]*sight
	// rounds counts the times a server was found blind.
	rounds uint64
}

// DefaultMinProxy is a round's HAProxy 5xx: enough that a path's lag of
// a line or two cannot pass for blindness.
const DefaultMinProxy = 10

// sight is one server's round.
type sight struct {
	delivered    uint64 // Delivered5xx at the last look
	own, proxy   int64  // the server's 5xx and HAProxy's, counted this round
	got          int64  // 5xx the paths reported this round
	blind        bool   // the last round's verdict
	blindSince   time.Time
	seenDelivery bool // Delivered5xx read once: a baseline
}

// Observe takes one poll's gains for server k: own, its 5xx answers
// (hrsp_5xx); proxy, HAProxy's own 5xx for it (the classes' FailProxy).
// It reports whether the paths are blind to HAProxy's 5xx for k: then
// the caller records them from the counters.
func (s *Sight) Observe(k haproxy.ServerKey, own, proxy int64, now time.Time) bool {
	delivered := s.Delivered5xx(k.Backend, k.Server)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.servers == nil {
		s.servers = map[haproxy.ServerKey]*sight{}
	}
	v := s.servers[k]
	if v == nil {
		v = &sight{}
		s.servers[k] = v
	}
	if v.seenDelivery && delivered >= v.delivered {
		v.got += int64(delivered - v.delivered)
	}
	v.delivered, v.seenDelivery = delivered, true
	v.own += max(own, 0)
	v.proxy += max(proxy, 0)
	if v.proxy >= s.minProxy() {
		blind := v.got < v.own+v.proxy/2
		switch {
		case blind && !v.blind:
			v.blindSince = now
			s.rounds++
		case !blind:
			v.blindSince = time.Time{}
		}
		v.blind = blind
		v.own, v.proxy, v.got = 0, 0, 0
	}
	return v.blind
}

func (s *Sight) minProxy() int64 {
	if s.MinProxy <= 0 {
		return DefaultMinProxy
	}
	return s.MinProxy
}

// Forget drops the servers the last poll did not list.
func (s *Sight) Forget(keep func(haproxy.ServerKey) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.servers {
		if !keep(k) {
			delete(s.servers, k)
		}
	}
}

// Blindness is what Sight knows now.
type Blindness struct {
	// Blind are the servers whose HAProxy 5xx no path reports, sorted.
	Blind []haproxy.ServerKey
	// Since is when the longest blindness began; zero when none.
	Since time.Time
	// Episodes counts the times a server was found blind, since the start.
	Episodes uint64
}

// Blindness lists the servers the paths are blind to HAProxy's 5xx of.
func (s *Sight) Blindness() Blindness {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := Blindness{Episodes: s.rounds}
	for k, v := range s.servers {
		if !v.blind {
			continue
		}
		out.Blind = append(out.Blind, k)
		if out.Since.IsZero() || v.blindSince.Before(out.Since) {
			out.Since = v.blindSince
		}
	}
	slices.SortFunc(out.Blind, compareKeys)
	return out
}

// compareKeys orders server keys by backend, then server.
func compareKeys(a, b haproxy.ServerKey) int {
	switch {
	case a.Backend < b.Backend:
		return -1
	case a.Backend > b.Backend:
		return 1
	case a.Server < b.Server:
		return -1
	case a.Server > b.Server:
		return 1
	}
	return 0
}
