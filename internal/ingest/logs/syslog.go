package logs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hapilot/hapilot/internal/lib/netx"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/rs/zerolog"
)

// LogMarker starts hapilot's log-format; see examples/haproxy-syslog.cfg:
//
//	log-format "hapilot %b %s %ST %Tr"
//
// Whatever syslog header HAProxy puts before it (RFC 3164, RFC 5424, or
// none with `format raw`) is skipped.
const LogMarker = "hapilot "

// SyslogServer takes HAProxy's log datagrams.
type SyslogServer struct {
	Sink     window.Sink
	Log      zerolog.Logger
	Counters Counters
	// FrameTimeout bounds one frame of a stream, whole, from its first
	// byte (default 10 s); IdleTimeout, the silence between frames
	// (default 5 minutes; HAProxy's ring forwarder reconnects). A
	// connection past either is closed, so that half-sent frames cannot
	// hold memory. The frame's limit is not renewed by each read: a peer
	// sending a byte every few seconds once held its frame open for ever.
	FrameTimeout, IdleTimeout time.Duration
}

// ParseLogLine finds the marker and parses what follows it.
func ParseLogLine(msg []byte) (window.Event, error) {
	i := bytes.Index(msg, []byte(LogMarker))
	if i < 0 {
		return window.Event{}, errors.New("no hapilot marker")
	}
	ev, _, err := parseLine(msg[i+len(LogMarker):])
	return ev, err
}

// Serve reads datagrams until ctx ends. One datagram is one log line.
func (s *SyslogServer) Serve(ctx context.Context, pc net.PacketConn) error {
	stop := context.AfterFunc(ctx, func() { pc.Close() })
	defer stop()
	buf := make([]byte, 64<<10)
	for {
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("syslog: read: %w", err)
		}
		s.Counters.Batches.Add(1)
		s.line(buf[:n])
	}
}

// line takes one log line.
func (s *SyslogServer) line(msg []byte) {
	ev, err := ParseLogLine(bytes.TrimRight(msg, "\r\n\x00"))
	switch {
	case err != nil:
		s.Counters.Errors.Add(1)
	case noServer(ev.Server):
		s.Counters.NoServer.Add(uint64(max(ev.Count, 1)))
	default:
		s.Counters.Events.Add(uint64(max(ev.Count, 1)))
		s.Sink.Record(ev)
	}
}

// maxFrame bounds one octet-counted message: HAProxy's ring maxlen is far
// below it, so a larger count is a broken stream.
const maxFrame = 64 << 10

// ServeStream accepts ring forwarders until ctx ends. Each connection
// carries syslog over TCP (RFC 6587): octet-counted frames ("LEN MSG"),
// as HAProxy's log-proto octet-count sends them, or lines ended by LF.
func (s *SyslogServer) ServeStream(ctx context.Context, ln net.Listener) error {
	// netx.Serve owns every connection's goroutine and waits for them.
	if err := netx.Serve(ctx, ln, s.Log, func(conn net.Conn) { s.stream(ctx, conn) }); err != nil {
		return fmt.Errorf("syslog: %w", err)
	}
	return nil
}

func (s *SyslogServer) stream(ctx context.Context, conn net.Conn) {
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	defer conn.Close()
	// Between frames a read may wait the idle timeout; a frame, once its
	// first byte is in, must be whole within the frame timeout.
	frame, idle := netx.Or(s.FrameTimeout, 10*time.Second), netx.Or(s.IdleTimeout, 5*time.Minute)
	uc := netx.Track(conn)
	r := bufio.NewReaderSize(uc, 64<<10)
	var msg []byte // allocated with the first octet-counted frame
	for {
		uc.Wait(idle)
		c, err := r.Peek(1)
		if err != nil {
			return // closed or idle: HAProxy reconnects on its own
		}
		uc.Unit(frame)
		s.Counters.Batches.Add(1)
		if c[0] < '0' || c[0] > '9' {
			line, err := r.ReadSlice('\n')
			if err != nil {
				if errors.Is(err, bufio.ErrBufferFull) {
					s.Counters.Errors.Add(1)
					s.Log.Warn().Msg("syslog stream: a line longer than 64 KiB; dropping the connection")
				}
				return
			}
			s.line(line)
			continue
		}
		n, err := octetCount(r)
		if err != nil {
			s.Counters.Errors.Add(1)
			s.Log.Warn().Err(err).Msg("syslog stream: bad frame; dropping the connection")
			return
		}
		if msg == nil {
			msg = make([]byte, maxFrame)
		}
		if _, err := io.ReadFull(r, msg[:n]); err != nil {
			return
		}
		s.line(msg[:n])
	}
}

// octetCount reads "LEN " and returns LEN.
func octetCount(r *bufio.Reader) (int, error) {
	n := 0
	for i := 0; ; i++ {
		c, err := r.ReadByte()
		if err != nil {
			return 0, err
		}
		switch {
		case c == ' ' && i > 0:
			return n, nil
		case c >= '0' && c <= '9' && i < 6:
			n = n*10 + int(c-'0')
			if n > maxFrame {
				return 0, fmt.Errorf("frame of %d bytes is over %d", n, maxFrame)
			}
		default:
			return 0, fmt.Errorf("bad octet count byte %q", c)
		}
	}
}
