package ingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/hapilot/hapilot/internal/window"
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
}

// ParseLogLine finds the marker and parses what follows it.
func ParseLogLine(msg []byte) (window.Event, error) {
	i := bytes.Index(msg, []byte(LogMarker))
	if i < 0 {
		return window.Event{}, errors.New("no hapilot marker")
	}
	return ParseFields(bytes.Fields(msg[i+len(LogMarker):]))
}

// ListenSyslog opens "udp://host:port" or "unixgram:///path".
func ListenSyslog(addr string) (net.PacketConn, error) {
	switch {
	case strings.HasPrefix(addr, "udp://"):
		return net.ListenPacket("udp", addr[len("udp://"):])
	case strings.HasPrefix(addr, "unixgram://"):
		path := addr[len("unixgram://"):]
		_ = os.Remove(path) // a stale socket from an earlier run
		return net.ListenPacket("unixgram", path)
	}
	return nil, fmt.Errorf("syslog-listen %q: want udp://host:port or unixgram:///path", addr)
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
		msg := bytes.TrimRight(buf[:n], "\n\x00")
		ev, err := ParseLogLine(msg)
		switch {
		case err != nil:
			s.Counters.Errors.Add(1)
		case noServer(ev.Server):
			s.Counters.NoServer.Add(1)
		default:
			s.Counters.Events.Add(1)
			s.Sink.Record(ev)
		}
	}
}
