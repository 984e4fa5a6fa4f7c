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

	"github.com/rs/zerolog"
)

// Listener is a net.Listener with a connection cap and retried accepts.
type Listener struct {
	net.Listener
	log  zerolog.Logger
	sem  chan struct{}
	done chan struct{}
	once sync.Once
	// Refused counts accept errors lived through.
	Refused atomic.Uint64
}

// Limit wraps ln: at most max connections open at once (a new one waits
// for another to close), and accept errors other than the listener's own
// closing are logged and retried after a pause of 5 ms doubling to 1 s.
func Limit(ln net.Listener, max int, log zerolog.Logger) *Listener {
	return &Listener{Listener: ln, log: log, sem: make(chan struct{}, max), done: make(chan struct{})}
}

// Accept waits for a free slot, then for a connection.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	pause := 5 * time.Millisecond
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			return &conn{Conn: c, release: func() { <-l.sem }}, nil
		}
		if errors.Is(err, net.ErrClosed) {
			<-l.sem
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
			<-l.sem
			return nil, net.ErrClosed
		}
		pause = min(2*pause, time.Second)
	}
}

// Close stops accepting; connections already open stay open.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// conn gives its slot back when it closes.
type conn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
