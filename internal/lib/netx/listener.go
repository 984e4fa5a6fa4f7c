// Package netx holds the listener every ingest path and the status server
// accept through: it lives through errors that come from the machine
// rather than the listener (out of file descriptors, a connection aborted
// before it was accepted), and it caps how many connections are open at
// once, so that a flood of connections can neither stop the agent nor
// take all its file descriptors.
package netx

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hapilot/hapilot/internal/lib/promtext"
	"github.com/rs/zerolog"
)

// Listener is a net.Listener with a connection cap and retried accepts.
//
// At the cap, a new connection is never made to wait: the open one that
// has done least is closed to make room for it. A connection that has
// never proven itself (no HELLO yet, no authorized request: see
// Conn.Proven) goes before one that has; among either kind, the one
// longest in its current unit or wait goes first (the slowest, or the
// longest idle). A waiting cap let peers that send a byte now and then
// keep HAProxy's own connection out for as long as they liked; with
// eviction its new connection always gets in, and a connection that
// carries traffic is never the one that has waited longest. A connection
// carrying out a request it read whole (Conn.Claim) is never evicted; when
// every open one is, the new connection is turned away instead.
type Listener struct {
	net.Listener
	log zerolog.Logger
	max int
	// MaxLife, when set, bounds each connection's whole life: no read or
	// write deadline may reach past it (the status server: an idle
	// timeout renewed by every request does not bound it). Set it before
	// the first Accept.
	MaxLife time.Duration
	// Evicting, when set, is given a connection about to be closed at
	// the cap (evicted: true) or turned away because every open one is
	// busy (false), to tell its peer before the close; it must not block
	// long (a short write deadline), since Accept waits for it. Set it
	// before the first Accept.
	Evicting func(c net.Conn, evicted bool)

	mu    sync.Mutex // guards conns: Accept adds, a connection's Close removes, Open counts
	conns map[*Conn]struct{}
	done  chan struct{}
	once  sync.Once

	// Refused counts accept errors lived through; Evicted, connections
	// closed to make room at the cap; Turned, new connections closed at
	// the cap because every open one was busy.
	Refused, Evicted, Turned atomic.Uint64
}

// Limit wraps ln: at most max connections open at once (at the cap, the
// one that has done least is evicted), and accept errors other than the
// listener's own closing are logged and retried after a pause of 5 ms
// doubling to 1 s.
func Limit(ln net.Listener, max int, log zerolog.Logger) *Listener {
	return &Listener{Listener: ln, log: log, max: max, conns: make(map[*Conn]struct{}, max), done: make(chan struct{})}
}

// Accept waits for a connection, and makes room for it.
func (l *Listener) Accept() (net.Conn, error) {
	pause := 5 * time.Millisecond
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			if tc := l.admit(c); tc != nil {
				return tc, nil
			}
			continue // turned away: every open connection is busy
		}
		if errors.Is(err, net.ErrClosed) {
			return nil, err
		}
		if l.Refused.Add(1)%100 == 1 { // once, then every hundredth
			l.log.Error().Err(err).Dur("retry_in", pause).Msg("accept failed: the listener goes on")
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-l.done:
			t.Stop()
			return nil, net.ErrClosed
		}
		pause = min(2*pause, time.Second)
	}
}

// admit counts c in, evicting another when the cap is reached; nil when
// c is turned away, every open connection being busy.
func (l *Listener) admit(c net.Conn) *Conn {
	now := time.Now()
	tc := newConn(c, l, now, l.MaxLife)
	l.mu.Lock()
	var victim *Conn
	if len(l.conns) >= l.max {
		if victim = l.victim(); victim == nil {
			l.mu.Unlock()
			n := l.Turned.Add(1)
			if l.Evicting != nil {
				l.Evicting(c, false)
			}
			c.Close()
			if n%100 == 1 {
				l.log.Warn().Int("cap", l.max).Msg("connection cap reached, every connection busy: the new one was turned away (logged once, then every hundredth)")
			}
			return nil
		}
		delete(l.conns, victim)
	}
	l.conns[tc] = struct{}{}
	l.mu.Unlock()
	if victim != nil {
		n := l.Evicted.Add(1)
		if l.Evicting != nil {
			l.Evicting(victim.Conn, true)
		}
		// The victim's own Close (from its handler, once its read
		// fails) finds it gone and releases nothing.
		victim.Conn.Close()
		if n%100 == 1 {
			l.log.Warn().Int("cap", l.max).Msg("connection cap reached: the connection that had done least was closed to make room (logged once, then every hundredth)")
		}
	}
	return tc
}

// victim is the connection to evict, claimed for it (Conn.evict): one
// never proven before one proven, then the one longest in its current
// unit or wait; never a busy one (nil when every one is). Callers hold
// l.mu.
func (l *Listener) victim() *Conn {
	for {
		var v *Conn
		var vProven bool
		var vSince int64
		for c := range l.conns {
			if c.claim.Load() != idle {
				continue
			}
			p, s := c.proven.Load(), c.since.Load()
			if v == nil || (!p && vProven) || (p == vProven && s < vSince) {
				v, vProven, vSince = c, p, s
			}
		}
		if v == nil || v.evict() {
			return v
		}
		// Claimed by its reader meanwhile: look again.
	}
}

func (l *Listener) release(c *Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
}

// Open is how many connections are open now.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// Close stops accepting; connections already open stay open.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// Figures are the listener's counts at its cap, under the name of the
// path it serves (spoe, lua, syslog, status), for /metrics and /status.
func (l *Listener) Figures(name string) []promtext.Figure {
	return []promtext.Figure{
		{Metric: "hapilot_" + name + "_connections_evicted_total", Help: "Connections to the " + name + " listener closed at its cap to make room for a new one.", V: l.Evicted.Load()},
		{Metric: "hapilot_" + name + "_connections_turned_total", Help: "New connections to the " + name + " listener closed at its cap because every open one was carrying out a request.", V: l.Turned.Load()},
		{Metric: "hapilot_" + name + "_connections_open", Help: "Connections open on the " + name + " listener.", Gauge: true, V: uint64(l.Open())},
	}
}
