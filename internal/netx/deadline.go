package netx

import (
	"net"
	"time"
)

// DeadlineConn sets a read deadline before each read from the socket:
// Timeout() from now. A reader that buffers (bufio) reads the socket
// only when it has run dry, so the deadline costs once per read, not
// once per frame or line: the per-response path pays nothing while data
// is waiting.
type DeadlineConn struct {
	net.Conn
	// Timeout says how long the next read may wait; the caller may base
	// it on where it stands (a HELLO yet to come, a frame begun).
	Timeout func() time.Duration
}

func (d *DeadlineConn) Read(b []byte) (int, error) {
	if err := d.Conn.SetReadDeadline(time.Now().Add(d.Timeout())); err != nil {
		return 0, err
	}
	return d.Conn.Read(b)
}

// Or is d, or def when d is not positive: a setting's default.
func Or(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
