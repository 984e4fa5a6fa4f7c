// Package ingest holds the telemetry paths beside SPOE: batches from the
// HAProxy-side Lua companion (lua/hapilot.lua) and HAProxy's own log lines
// over syslog. Both feed the same window.Event as SPOE.
package logs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/hapilot/hapilot/internal/lib/bytesconv"
	"github.com/hapilot/hapilot/internal/lib/netx"
	"github.com/hapilot/hapilot/internal/lib/promtext"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/rs/zerolog"
)

// Counters are one path's figures.
type Counters struct {
	Events   atomic.Uint64
	Errors   atomic.Uint64 // malformed lines, skipped
	NoServer atomic.Uint64 // responses with no server chosen
	Batches  atomic.Uint64 // connections (Lua) or datagrams (syslog)
}

// ParseFields turns "backend server status tr [count]" into an event. The
// names point into line. The optional count (at least 1, at most
// window.MaxCount) says how many identical responses the line stands for:
// the Lua companion sends each distinct line once per flush with its count.
func ParseFields(f [][]byte) (window.Event, error) {
	if len(f) != 4 && len(f) != 5 {
		return window.Event{}, fmt.Errorf("%d fields, want 4 or 5 (backend server status tr [count])", len(f))
	}
	status, ok := bytesconv.Atoi(f[2])
	if !ok || status < 100 || status > 999 {
		return window.Event{}, fmt.Errorf("status %q", f[2])
	}
	tr, ok := bytesconv.Atoi(f[3])
	if !ok {
		return window.Event{}, fmt.Errorf("tr %q", f[3])
	}
	ev := window.Event{Backend: f[0], Server: f[1], Status: status, ResponseMs: tr}
	if len(f) == 5 {
		n, ok := bytesconv.Atoi(f[4])
		if !ok || n < 1 || n > window.MaxCount {
			return window.Event{}, fmt.Errorf("count %q", f[4])
		}
		ev.Count = n
	}
	return ev, nil
}

// noServer reports HAProxy's placeholders for "no server": the Lua
// companion skips those, the log format writes "<NOSRV>".
func noServer(server []byte) bool {
	return len(server) == 0 || bytes.Equal(server, []byte("<NOSRV>")) || bytes.Equal(server, []byte("-"))
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// fields splits line at ASCII white space into at most len(out)
// fields without allocating (bytes.Fields allocates a slice per line:
// the paths' only allocation per event). More fields than out holds
// returns len(out)+1.
func fields(line []byte, out [][]byte) int {
	n := 0
	for i := 0; i < len(line); {
		for i < len(line) && isSpace(line[i]) {
			i++
		}
		if i == len(line) {
			break
		}
		j := i
		for j < len(line) && !isSpace(line[j]) {
			j++
		}
		if n == len(out) {
			return n + 1
		}
		out[n] = line[i:j]
		n++
		i = j
	}
	return n
}

// parseLine parses "backend server status tr [count]" without allocating.
func parseLine(line []byte) (window.Event, bool, error) {
	var buf [5][]byte
	n := fields(line, buf[:])
	if n == 0 {
		return window.Event{}, false, nil
	}
	if n > len(buf) {
		return window.Event{}, true, fmt.Errorf("more than 5 fields (backend server status tr [count])")
	}
	ev, err := ParseFields(buf[:n])
	return ev, true, err
}

// record parses one line into sink, counting what it was.
func record(c *Counters, sink window.Sink, line []byte) {
	ev, any, err := parseLine(line)
	if !any {
		return
	}
	switch {
	case err != nil:
		c.Errors.Add(1)
	case noServer(ev.Server):
		c.NoServer.Add(uint64(max(ev.Count, 1)))
	default:
		c.Events.Add(uint64(max(ev.Count, 1)))
		sink.Record(ev)
	}
}

// LineServer takes the Lua companion's batches: each connection carries
// newline-terminated "backend server status tr [count]" lines, then closes.
type LineServer struct {
	Sink     window.Sink
	Log      zerolog.Logger
	Counters Counters
	// MaxLine bounds one line; longer ones are counted and skipped.
	MaxLine int
	// IdleTimeout bounds the wait for a batch's first byte (default 5 s);
	// BatchTimeout, the whole batch from that byte to its end (default
	// 5 s: the companion writes it at once). A connection past either is
	// closed. The batch's limit is not renewed by each read: a peer
	// sending a byte every few seconds once held its connection for ever.
	IdleTimeout, BatchTimeout time.Duration
}

// Serve accepts batches until ctx ends, through netx.Serve.
func (s *LineServer) Serve(ctx context.Context, ln net.Listener) error {
	err := netx.Serve(ctx, ln, s.Log, func(conn net.Conn) {
		s.Counters.Batches.Add(1)
		s.ReadBatch(ctx, conn)
	})
	if err != nil {
		return fmt.Errorf("lua ingest: %w", err)
	}
	return nil
}

// ReadBatch reads lines from one connection until EOF or its deadline.
func (s *LineServer) ReadBatch(ctx context.Context, conn net.Conn) {
	max := s.MaxLine
	if max <= 0 {
		max = 4096
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	uc := netx.Track(conn)
	uc.Wait(netx.Or(s.IdleTimeout, 5*time.Second))
	r := bufio.NewReaderSize(uc, max)
	if _, err := r.Peek(1); err != nil {
		return
	}
	uc.Unit(netx.Or(s.BatchTimeout, 5*time.Second))
	for {
		line, err := r.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			s.Counters.Errors.Add(1)
			for errors.Is(err, bufio.ErrBufferFull) { // skip the rest of the long line
				_, err = r.ReadSlice('\n')
			}
			continue
		case err != nil && len(line) > 0:
			s.Counters.Errors.Add(1) // a last line without its newline: cut short
			return
		case err != nil:
			return
		}
		record(&s.Counters, s.Sink, line)
	}
}

// figures are a log path's counters under its name (lua, syslog).
func (c *Counters) figures(name string) []promtext.Figure {
	return []promtext.Figure{
		{Metric: "hapilot_" + name + "_events_total", Help: "Responses recorded from the " + name + " path.", V: c.Events.Load()},
		{Metric: "hapilot_" + name + "_ingest_errors_total", Help: "Malformed " + name + " lines, skipped.", V: c.Errors.Load()},
		{Metric: "hapilot_" + name + "_batches_total", Help: "Batches received: Lua connections, syslog datagrams or stream messages.", V: c.Batches.Load()},
	}
}

// Figures are the Lua companion's path's counters, for /metrics and
// /status.
func (s *LineServer) Figures() []promtext.Figure { return s.Counters.figures("lua") }

// Figures are the logs' path's counters, for /metrics and /status.
func (s *SyslogServer) Figures() []promtext.Figure { return s.Counters.figures("syslog") }
