package netx

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Conn is a stream connection whose protocol bounds each of its units
// (an SPOE HELLO, a frame, a Lua batch) as a whole, from its first byte.
// A timeout renewed at every read, which is what a read deadline set
// before each read gives, lets a peer that sends a byte now and then
// hold a connection for ever; a unit's deadline here is fixed when the
// unit begins and stays fixed until it ends.
//
// A Conn also tells the Listener that accepted it how it is doing, so
// that at the cap the listener evicts the one that has done least (see
// Listener). Every connection a Limit listener accepts is a *Conn; Track
// wraps any other.
//
// Unit, Wait and Read belong to the connection's reading goroutine;
// Proven may be called from any.
type Conn struct {
	net.Conn
	l    *Listener // nil: not counted by a listener
	life time.Time // zero: no bound on the connection's whole life

	// Read by the listener when it picks a connection to evict.
	proven atomic.Bool
	since  atomic.Int64 // UnixNano: when the current unit or wait began
	// claim is idle, busy (Claim: a request read whole is being carried
	// out, never evicted) or evicted; the listener and the reading
	// goroutine move it by compare-and-swap, so that exactly one wins.
	claim atomic.Int32

	// The reading goroutine's own.
	mode     mode
	limit    time.Duration
	started  bool      // the current unit or wait has reached the socket
	deadline time.Time // the current unit's or wait's
	set      time.Time // the read deadline last given the socket
	proved   bool      // proven, as this goroutine last stored it

	closeOnce sync.Once
}

type mode uint8

const (
	free mode = iota // the user sets its own deadlines (an HTTP server)
	wait             // between units: the next one's first byte
	unit             // inside a unit
)

// Track is c as a *Conn: c itself when a Limit listener accepted it, else
// c wrapped, counted by no listener.
func Track(c net.Conn) *Conn {
	if tc, ok := c.(*Conn); ok {
		return tc
	}
	return newConn(c, nil, time.Now(), 0)
}

func newConn(c net.Conn, l *Listener, now time.Time, life time.Duration) *Conn {
	tc := &Conn{Conn: c, l: l}
	tc.since.Store(now.UnixNano())
	if life > 0 {
		tc.life = now.Add(life)
		_ = c.SetDeadline(tc.life)
	}
	return tc
}

// Unit begins a unit that must arrive whole within limit. The clock
// starts at the unit's first read from the socket: a unit whose bytes
// are already buffered costs nothing, and one whose first byte the
// caller has already seen (a Peek after Wait) starts at once.
func (c *Conn) Unit(limit time.Duration) { c.begin(unit, limit) }

// Wait ends the current unit, which arrived whole (the connection has
// now proven itself: see Proven), and waits at most limit for the next
// one's first byte.
func (c *Conn) Wait(limit time.Duration) {
	if c.mode == unit {
		c.prove()
	}
	c.begin(wait, limit)
}

func (c *Conn) begin(m mode, limit time.Duration) {
	c.mode, c.limit, c.started = m, limit, false
}

// A connection's claim.
const (
	idle int32 = iota
	busy
	evicted
)

// Claim marks the connection as carrying out a request it has read
// whole: from then on its listener never evicts it, so that a command
// that runs always reaches its caller with its answer. It reports false
// when the listener evicted the connection first: the request must then
// not be carried out, since its caller was told it was not (Listener's
// Evicting). Unclaim gives the connection back to eviction.
func (c *Conn) Claim() bool { return c.claim.CompareAndSwap(idle, busy) }

// Unclaim ends a Claim: the request is answered, and the connection is
// idle again.
func (c *Conn) Unclaim() { c.claim.CompareAndSwap(busy, idle) }

// evict claims the connection for eviction; false when it is busy (or
// already evicted).
func (c *Conn) evict() bool { return c.claim.CompareAndSwap(idle, evicted) }

// Proven marks the connection as one that did what its protocol asks (a
// HELLO, an authorized request): at the cap, a listener evicts such a
// connection only when none is left that has not proven itself. It also
// restarts the connection's age, as seen by the listener.
func (c *Conn) Proven() {
	c.proven.Store(true)
	c.since.Store(time.Now().UnixNano())
}

func (c *Conn) prove() {
	if !c.proved {
		c.proved = true
		c.proven.Store(true)
	}
}

// Read reads under the current unit's or wait's deadline.
func (c *Conn) Read(b []byte) (int, error) {
	if c.mode != free {
		if !c.started {
			now := time.Now()
			c.started, c.deadline = true, now.Add(c.limit)
			c.since.Store(now.UnixNano())
		}
		if dl := c.clamp(c.deadline); !dl.Equal(c.set) {
			if err := c.Conn.SetReadDeadline(dl); err != nil {
				return 0, err
			}
			c.set = dl
		}
	}
	return c.Conn.Read(b)
}

// clamp bounds t by the connection's life: a deadline never reaches past
// it, whoever sets it.
func (c *Conn) clamp(t time.Time) time.Time {
	if !c.life.IsZero() && (t.IsZero() || t.After(c.life)) {
		return c.life
	}
	return t
}

// SetDeadline, SetReadDeadline and SetWriteDeadline are the socket's,
// bounded by the connection's life.
func (c *Conn) SetDeadline(t time.Time) error { return c.Conn.SetDeadline(c.clamp(t)) }

func (c *Conn) SetReadDeadline(t time.Time) error { return c.Conn.SetReadDeadline(c.clamp(t)) }

func (c *Conn) SetWriteDeadline(t time.Time) error { return c.Conn.SetWriteDeadline(c.clamp(t)) }

// Close closes the connection and gives its place back to its listener.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.closeOnce.Do(func() {
		if c.l != nil {
			c.l.release(c)
		}
	})
	return err
}

// Or is d, or def when d is not positive: a setting's default.
func Or(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
