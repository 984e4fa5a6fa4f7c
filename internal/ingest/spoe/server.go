// Package spoe is hapilot's SPOE agent: it takes HAProxy's NOTIFY frames,
// decodes each hapilot-response message into a window.Event, and ACKs at
// once.
//
// The frame layer is our own rather than negasus/haproxy-spoe-go's worker:
// v1.0.7's reader indexes frames without bounds checks (a frame shorter
// than its header, a truncated message or a non-boolean "healthcheck"
// panics in a goroutine with no recover, taking the agent down), and it
// spends a goroutine and several allocations on every NOTIFY. We keep its
// varint and typed-data codecs and its frame encoder for the handshake.
package spoe

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/hapilot/hapilot/internal/lib/netx"
	"github.com/hapilot/hapilot/internal/lib/promtext"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/negasus/haproxy-spoe-go/frame"
	"github.com/negasus/haproxy-spoe-go/varint"
	"github.com/rs/zerolog"
)

// MaxFrameSize is the largest frame we accept; HAProxy's default is 16384.
const MaxFrameSize = 16384

// SPOP status codes (SPOE.txt, section 3.2.7).
const (
	statusNormal       = 0
	statusInvalidFrame = 3
	statusBadVersion   = 8
)

// Counters are the ingest path's figures, read by /metrics.
type Counters struct {
	Connections  atomic.Uint64
	Frames       atomic.Uint64 // NOTIFY frames
	Events       atomic.Uint64
	IngestErrors atomic.Uint64 // malformed frames or messages, dropped
	Unknown      atomic.Uint64 // messages of another name
	NoServer     atomic.Uint64 // responses with no server to attribute
	// Sampled counts the events of messages with a sample above 1: the
	// sampled stanza is the one in use (the agent's telemetry advice).
	Sampled atomic.Uint64
}

// Server accepts SPOP connections from HAProxy.
type Server struct {
	Sink     window.Sink
	Log      zerolog.Logger
	Counters Counters
	// HelloTimeout bounds a new connection's HAPROXY-HELLO, whole, from
	// the moment it is accepted (default 10 s; HAProxy's own `timeout
	// hello` is 500 ms in the example); FrameTimeout, each later frame,
	// whole, from its first byte (default 10 s: HAProxy writes a frame of
	// at most 16 KiB at once); IdleTimeout, the silence between frames
	// (default 5 minutes; HAProxy closes idle connections itself after its
	// `timeout idle`, 30 s in the example). A connection past any of them
	// is closed. Each bounds its unit as a whole, not each read: a peer
	// sending a byte now and then once held a connection for ever.
	HelloTimeout, FrameTimeout, IdleTimeout time.Duration
}

// Serve accepts connections until ctx ends or the listener is closed,
// through netx.Serve: every connection is closed and waited for before
// it returns.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if err := netx.Serve(ctx, ln, s.Log, s.handleConn); err != nil {
		return fmt.Errorf("spoe: %w", err)
	}
	return nil
}

func (s *Server) handleConn(conn net.Conn) {
	defer conn.Close()
	s.Counters.Connections.Add(1)
	uc := netx.Track(conn)
	// The HELLO's clock starts now, with the connection.
	uc.Unit(netx.Or(s.HelloTimeout, 10*time.Second))
	units := units{conn: uc, frame: netx.Or(s.FrameTimeout, 10*time.Second), idle: netx.Or(s.IdleTimeout, 5*time.Minute)}
	err := s.serveConn(bufio.NewReaderSize(uc, MaxFrameSize+4), bufio.NewWriter(conn), &units)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		s.Log.Debug().Err(err).Str("peer", conn.RemoteAddr().String()).Msg("spoe connection ended")
	}
}

// units gives each frame after the HELLO its own deadline: the silence
// before it is bounded by idle, the frame itself, from its first byte,
// by frame.
type units struct {
	conn        *netx.Conn
	frame, idle time.Duration
}

// next waits for the next frame's first byte, then starts its clock.
func (u *units) next(r *bufio.Reader) error {
	u.conn.Wait(u.idle)
	if _, err := r.Peek(1); err != nil {
		return err
	}
	u.conn.Unit(u.frame)
	return nil
}

// protocolError closes a connection with an AGENT-DISCONNECT.
type protocolError struct {
	status uint32
	err    error
}

func (e *protocolError) Error() string { return e.err.Error() }
func (e *protocolError) Unwrap() error { return e.err }

// ServeConn runs the SPOP conversation on one connection: HELLO, then
// NOTIFY frames each answered by an ACK, until DISCONNECT or an error. It
// never panics on input: a panic is turned into an error and counted.
func (s *Server) ServeConn(r *bufio.Reader, w *bufio.Writer) error {
	return s.serveConn(r, w, nil)
}

// serveConn is ServeConn with each frame's deadlines (u, nil for none).
func (s *Server) serveConn(r *bufio.Reader, w *bufio.Writer, u *units) (err error) {
	defer func() {
		if p := recover(); p != nil {
			s.Counters.IngestErrors.Add(1)
			err = fmt.Errorf("spoe: panic serving connection: %v", p)
		}
	}()
	c := conn{r: r, w: w, buf: make([]byte, MaxFrameSize), units: u}
	err = s.converse(&c)
	var pe *protocolError
	if errors.As(err, &pe) {
		s.Counters.IngestErrors.Add(1)
		_ = c.writeKV(frame.TypeAgentDisconnect, func(f *frame.Frame) {
			f.KV.Add("status-code", pe.status)
			f.KV.Add("message", pe.err.Error())
		})
	}
	return err
}

type conn struct {
	r     *bufio.Reader
	w     *bufio.Writer
	buf   []byte
	hdr   [4]byte
	maxFS uint32
	units *units // nil: no deadlines (ServeConn on buffers, in tests)
}

type header struct {
	typ      frame.Type
	flags    uint32
	streamID uint64
	frameID  uint64
	payload  []byte
}

// readFrame reads one frame into the connection's buffer; the payload is
// valid until the next call.
func (c *conn) readFrame() (header, error) {
	if _, err := io.ReadFull(c.r, c.hdr[:]); err != nil {
		return header{}, err
	}
	n := binary.BigEndian.Uint32(c.hdr[:])
	limit := c.maxFS
	if limit == 0 {
		limit = MaxFrameSize
	}
	if n < 7 || n > limit {
		return header{}, &protocolError{statusInvalidFrame, fmt.Errorf("frame length %d outside [7, %d]", n, limit)}
	}
	b := c.buf[:n]
	if _, err := io.ReadFull(c.r, b); err != nil {
		return header{}, fmt.Errorf("frame of %d bytes: %w", n, err)
	}
	h := header{typ: frame.Type(b[0]), flags: binary.BigEndian.Uint32(b[1:5])}
	rd := reader{b: b, off: 5}
	var err error
	if h.streamID, err = rd.uvarint(); err == nil {
		h.frameID, err = rd.uvarint()
	}
	if err != nil {
		return header{}, &protocolError{statusInvalidFrame, fmt.Errorf("frame ids: %w", err)}
	}
	h.payload = b[rd.off:]
	return h, nil
}

func (s *Server) converse(c *conn) error {
	h, err := c.readFrame()
	if err != nil {
		return err
	}
	if h.typ != frame.TypeHaproxyHello {
		return &protocolError{statusInvalidFrame, fmt.Errorf("expected HAPROXY-HELLO, got frame type %d", h.typ)}
	}
	hello, err := parseHello(h.payload)
	if err != nil {
		return &protocolError{statusInvalidFrame, fmt.Errorf("HAPROXY-HELLO: %w", err)}
	}
	// HAProxy offers "2.0"; any 2.x speaks the frames we use.
	if !bytes.Contains(hello.versions, []byte("2")) {
		return &protocolError{statusBadVersion, fmt.Errorf("unsupported SPOP versions %q", hello.versions)}
	}
	c.maxFS = MaxFrameSize
	if hello.maxFrameSize != 0 && hello.maxFrameSize < c.maxFS {
		c.maxFS = hello.maxFrameSize
	}
	if err := c.writeKV(frame.TypeAgentHello, func(f *frame.Frame) {
		f.KV.Add("version", "2.0")
		f.KV.Add("max-frame-size", c.maxFS)
		// We answer frames in order on the reading goroutine, so
		// pipelining is safe; no fragmentation, no async.
		f.KV.Add("capabilities", "pipelining")
	}); err != nil {
		return err
	}
	if hello.healthcheck {
		return nil
	}
	for {
		if c.units != nil {
			if err := c.units.next(c.r); err != nil {
				return err
			}
		}
		h, err := c.readFrame()
		if err != nil {
			return err
		}
		switch h.typ {
		case frame.TypeNotify:
			s.notify(h.payload)
			if err := c.ack(h.streamID, h.frameID); err != nil {
				return err
			}
		case frame.TypeHaproxyDisconnect:
			return c.writeKV(frame.TypeAgentDisconnect, func(f *frame.Frame) {
				f.KV.Add("status-code", uint32(statusNormal))
				f.KV.Add("message", "bye")
			})
		default:
			return &protocolError{statusInvalidFrame, fmt.Errorf("unexpected frame type %d", h.typ)}
		}
	}
}

func (s *Server) notify(payload []byte) {
	s.Counters.Frames.Add(1)
	res, err := DecodeNotify(payload, s.Sink.Record)
	s.Counters.Events.Add(uint64(res.Events))
	if res.Unknown > 0 {
		s.Counters.Unknown.Add(uint64(res.Unknown))
	}
	if res.NoServer > 0 {
		s.Counters.NoServer.Add(uint64(res.NoServer))
	}
	if res.Sampled > 0 {
		s.Counters.Sampled.Add(uint64(res.Sampled))
	}
	bad := res.Invalid
	if err != nil {
		bad++
	}
	if bad > 0 {
		s.Counters.IngestErrors.Add(uint64(bad))
		s.Log.Debug().Err(err).Int("invalid", res.Invalid).Msg("spoe: dropped malformed message")
	}
}

// ack writes an empty AGENT-ACK; it is flushed once the reader has no
// further frame buffered, so pipelined frames share one write.
func (c *conn) ack(streamID, frameID uint64) error {
	var f [4 + 1 + 4 + 10 + 10]byte
	f[4] = byte(frame.TypeAgentAck)
	binary.BigEndian.PutUint32(f[5:9], 1) // FIN
	n := 9
	n += varint.PutUvarint(f[n:], streamID)
	n += varint.PutUvarint(f[n:], frameID)
	binary.BigEndian.PutUint32(f[:4], uint32(n-4))
	if _, err := c.w.Write(f[:n]); err != nil {
		return err
	}
	if c.r.Buffered() == 0 {
		return c.w.Flush()
	}
	return nil
}

func (c *conn) writeKV(t frame.Type, fill func(*frame.Frame)) error {
	f := frame.AcquireFrame()
	defer frame.ReleaseFrame(f)
	f.Type = t
	fill(f)
	if _, err := f.Encode(c.w); err != nil {
		return fmt.Errorf("encode frame type %d: %w", t, err)
	}
	return c.w.Flush()
}

type hello struct {
	versions     []byte
	maxFrameSize uint32
	healthcheck  bool
}

func parseHello(payload []byte) (hello, error) {
	var h hello
	r := reader{b: payload}
	for r.off < len(r.b) {
		key, err := r.lenBytes()
		if err != nil {
			return h, err
		}
		v, err := r.value()
		if err != nil {
			return h, fmt.Errorf("%q: %w", key, err)
		}
		switch string(key) {
		case "supported-versions":
			h.versions = v.data
		case "max-frame-size":
			n, ok := v.integer()
			if !ok || n < 256 {
				return h, fmt.Errorf("bad max-frame-size")
			}
			h.maxFrameSize = uint32(n)
		case "healthcheck":
			h.healthcheck = v.typ == 1 && v.num == 1
		}
	}
	return h, nil
}

// Figures are the SPOE path's counters, for /metrics and /status.
func (s *Server) Figures() []promtext.Figure {
	c := &s.Counters
	return []promtext.Figure{
		{Metric: "hapilot_events_total", Help: "Responses recorded into the windows.", V: c.Events.Load()},
		{Metric: "hapilot_ingest_errors_total", Help: "Malformed SPOE frames or messages, dropped.", V: c.IngestErrors.Load()},
		{Metric: "hapilot_spoe_frames_total", Help: "SPOE NOTIFY frames received.", V: c.Frames.Load()},
		{Metric: "hapilot_spoe_connections_total", Help: "SPOE connections accepted.", V: c.Connections.Load()},
		{Metric: "hapilot_spoe_unknown_messages_total", Help: "SPOE messages of another name, skipped.", V: c.Unknown.Load()},
		{Metric: "hapilot_no_server_responses_total", Help: "Responses HAProxy produced with no server chosen.", V: c.NoServer.Load()},
	}
}
