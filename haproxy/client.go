// Package haproxy is a client for HAProxy's runtime API (the stats socket
// at `level admin`), over a unix socket or TCP.
//
// Every command opens its own connection in non-interactive mode, so a
// socket that vanished or an HAProxy that reloaded is simply dialed again;
// a command that fails to connect or loses its connection before a reply is
// retried once (all our commands are idempotent). Each command is prefixed
// with `set severity-output number`, so that HAProxy marks its failures
// with "[N]: " and they can be told from data.
package haproxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// Client talks to one HAProxy runtime socket.
type Client struct {
	network, address string
	// DialTimeout bounds a connection attempt within the caller's context.
	DialTimeout time.Duration
	// MaxReply bounds what one reply may hold.
	MaxReply int64
	// MaxRows bounds the rows of one `show stat` or `show servers state`
	// reply, which are parsed as they arrive: a reply of more is refused
	// at the first row past it, not read to its end.
	MaxRows int
}

// DefaultMaxRows is MaxRows unless set: `show stat` has a row per
// server, one per backend and one per frontend, so this leaves room for
// several times the windows' default --max-servers (4,096).
const DefaultMaxRows = 1 << 16

// New returns a client for addr: "unix:/path", "tcp:host:port", an
// absolute path (unix) or "host:port" (TCP).
func New(addr string) (*Client, error) {
	c := &Client{DialTimeout: 2 * time.Second, MaxReply: 32 << 20, MaxRows: DefaultMaxRows}
	switch {
	case strings.HasPrefix(addr, "unix:"):
		c.network, c.address = "unix", addr[len("unix:"):]
	case strings.HasPrefix(addr, "tcp:"):
		c.network, c.address = "tcp", addr[len("tcp:"):]
	case strings.HasPrefix(addr, "/"):
		c.network, c.address = "unix", addr
	default:
		c.network, c.address = "tcp", addr
	}
	if c.address == "" {
		return nil, fmt.Errorf("haproxy: empty socket address %q", addr)
	}
	if c.network == "tcp" {
		if _, _, err := net.SplitHostPort(c.address); err != nil {
			return nil, fmt.Errorf("haproxy: socket address %q: %w", addr, err)
		}
	}
	return c, nil
}

// Addr names the socket, for logs.
func (c *Client) Addr() string { return c.network + ":" + c.address }

// CommandError is a failure HAProxy reported for a command.
type CommandError struct {
	Command  string
	Severity int // from "[N]: ", or -1 when HAProxy gave none
	Reply    string
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("haproxy: %s: %s", e.Command, e.Reply)
}

// ErrConnection wraps failures to reach the socket or read a reply.
var ErrConnection = errors.New("runtime socket unreachable")

// ErrTooManyRows is a reply of more rows than MaxRows.
var ErrTooManyRows = errors.New("reply has too many rows")

var errTooLong = errors.New("reply too long")

// Run sends one command and returns HAProxy's reply without the severity
// preamble. Most callers want the typed methods.
func (c *Client) Run(ctx context.Context, cmd string) (string, error) {
	var reply string
	err := c.stream(ctx, cmd, func(r *bufio.Reader) error {
		var b strings.Builder
		_, err := io.Copy(&b, r)
		reply = b.String()
		return err
	})
	return reply, err
}

// stream sends one command and hands HAProxy's reply, without the
// severity preamble, to read as it arrives. A command that fails to
// connect or loses its connection is tried once more; what read returns
// of its own (a malformed reply, too many rows) is not, since the same
// reply would come back.
func (c *Client) stream(ctx context.Context, cmd string, read func(*bufio.Reader) error) error {
	if strings.ContainsAny(cmd, "\n\r;") {
		return fmt.Errorf("haproxy: refusing command with a separator: %q", cmd)
	}
	var lastErr error
	for attempt := 0; attempt < 2; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return fmt.Errorf("haproxy: %s: %w (after %v)", cmd, ctx.Err(), lastErr)
			case <-time.After(50 * time.Millisecond):
			}
		}
		err := c.roundTrip(ctx, cmd, read)
		var conn *connError
		if err == nil || !errors.As(err, &conn) {
			return err
		}
		lastErr = conn.err
		if ctx.Err() != nil || errors.Is(lastErr, errTooLong) {
			break // a reply too long would be too long again
		}
	}
	return fmt.Errorf("haproxy: %s on %s: %w: %w", cmd, c.Addr(), ErrConnection, lastErr)
}

// connError is a failure of the connection itself (dial, write, read,
// the reply's bound), which stream may retry.
type connError struct{ err error }

func (e *connError) Error() string { return e.err.Error() }
func (e *connError) Unwrap() error { return e.err }

// connReader reads the reply within MaxReply and keeps the connection's
// own error, so that a read callback's failure can be told from the
// socket's.
type connReader struct {
	r    io.Reader
	left int64 // bytes the reply may still hold
	max  int64
	err  error
}

func (cr *connReader) Read(p []byte) (int, error) {
	if cr.left <= 0 {
		// One byte past the bound tells a reply of exactly MaxReply from
		// a longer one.
		var one [1]byte
		if n, _ := cr.r.Read(one[:]); n > 0 {
			cr.err = fmt.Errorf("%w: over %d bytes", errTooLong, cr.max)
			return 0, cr.err
		}
		return 0, io.EOF
	}
	if int64(len(p)) > cr.left {
		p = p[:cr.left]
	}
	n, err := cr.r.Read(p)
	cr.left -= int64(n)
	if err != nil && err != io.EOF {
		cr.err = err
	}
	return n, err
}

func (c *Client) roundTrip(ctx context.Context, cmd string, read func(*bufio.Reader) error) error {
	d := net.Dialer{Timeout: c.DialTimeout}
	conn, err := d.DialContext(ctx, c.network, c.address)
	if err != nil {
		return &connError{err}
	}
	defer conn.Close()
	// The context's end cuts the reply wherever it is, the parse with it.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := io.WriteString(conn, "set severity-output number; "+cmd+"\n"); err != nil {
		return &connError{err}
	}
	cr := &connReader{r: conn, left: c.MaxReply, max: c.MaxReply}
	r := bufio.NewReaderSize(cr, 64<<10)
	// The first command answers with one empty line; a reply then ends
	// with an empty line of its own.
	first, err := r.ReadByte()
	switch {
	case cr.err != nil:
		return &connError{cr.err}
	case err == io.EOF:
		return &connError{fmt.Errorf("unexpected reply start %q", "")}
	case err != nil:
		return &connError{err}
	case first != '\n':
		head, _ := r.Peek(200)
		return &connError{fmt.Errorf("unexpected reply start %q", truncate(string(first)+string(head)))}
	}
	err = read(r)
	if cr.err != nil {
		return &connError{cr.err}
	}
	return err
}

// failure returns the error a reply carries, if it starts with "[N]: ".
func failure(cmd, reply string) error {
	r := strings.TrimSpace(reply)
	if len(r) >= 4 && r[0] == '[' && r[2] == ']' && r[3] == ':' && r[1] >= '0' && r[1] <= '9' {
		return &CommandError{Command: cmd, Severity: int(r[1] - '0'), Reply: strings.TrimSpace(r[4:])}
	}
	return nil
}

// runSet runs a command whose success prints nothing.
func (c *Client) runSet(ctx context.Context, cmd string) error {
	reply, err := c.Run(ctx, cmd)
	if err != nil {
		return err
	}
	if err := failure(cmd, reply); err != nil {
		return err
	}
	if r := strings.TrimSpace(reply); r != "" {
		return &CommandError{Command: cmd, Severity: -1, Reply: r}
	}
	return nil
}

// runShow runs a command that prints data, failing on a marked reply.
func (c *Client) runShow(ctx context.Context, cmd string) (string, error) {
	reply, err := c.Run(ctx, cmd)
	if err != nil {
		return "", err
	}
	if err := failure(cmd, reply); err != nil {
		return "", err
	}
	return reply, nil
}

// streamShow runs a command that prints data and hands its reply to read
// as it arrives, failing on a marked reply first.
func (c *Client) streamShow(ctx context.Context, cmd string, read func(*bufio.Reader) error) error {
	err := c.stream(ctx, cmd, func(r *bufio.Reader) error {
		// A failure is a short "[N]: text" reply: the data's own first
		// line never starts so.
		if head, _ := r.Peek(4); len(head) == 4 && head[0] == '[' && head[2] == ']' && head[3] == ':' {
			msg, err := io.ReadAll(io.LimitReader(r, 4096))
			if err != nil {
				return err
			}
			if f := failure(cmd, string(msg)); f != nil {
				return f
			}
		}
		return read(r)
	})
	var ce *CommandError
	if err != nil && !errors.As(err, &ce) && !errors.Is(err, ErrConnection) {
		return fmt.Errorf("haproxy: %s: %w", cmd, err)
	}
	return err
}

// ValidName reports whether s can be put in a command as a backend or
// server name: HAProxy's own name characters only, so that nothing can
// split or extend the command.
func ValidName(s string) error {
	if s == "" {
		return errors.New("empty name")
	}
	if len(s) > 255 {
		return fmt.Errorf("name of %d bytes", len(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
			return fmt.Errorf("name %q holds %q", s, c)
		}
	}
	return nil
}

func target(backend, server string) (string, error) {
	if err := ValidName(backend); err != nil {
		return "", fmt.Errorf("haproxy: backend: %w", err)
	}
	if err := ValidName(server); err != nil {
		return "", fmt.Errorf("haproxy: server: %w", err)
	}
	return ServerKey{Backend: backend, Server: server}.String(), nil
}

// AdminState is what `set server ... state` takes.
type AdminState string

const (
	StateReady AdminState = "ready"
	StateDrain AdminState = "drain"
	StateMaint AdminState = "maint"
)

// SetStateCommand is the runtime command that puts backend/server into
// st. Every such command is built here, so that what the agent logs is
// what it sends.
func SetStateCommand(backend, server string, st AdminState) (string, error) {
	t, err := target(backend, server)
	if err != nil {
		return "", err
	}
	switch st {
	case StateReady, StateDrain, StateMaint:
	default:
		return "", fmt.Errorf("haproxy: unknown server state %q", st)
	}
	return "set server " + t + " state " + string(st), nil
}

// SetWeightCommand is the runtime command that sets backend/server's
// absolute weight (0..256).
func SetWeightCommand(backend, server string, weight int) (string, error) {
	t, err := target(backend, server)
	if err != nil {
		return "", err
	}
	if weight < 0 || weight > MaxWeight {
		return "", fmt.Errorf("haproxy: weight %d outside [0, %d]", weight, MaxWeight)
	}
	return fmt.Sprintf("set weight %s %d", t, weight), nil
}

// SetServerState puts a server into ready, drain or maint.
func (c *Client) SetServerState(ctx context.Context, backend, server string, st AdminState) error {
	cmd, err := SetStateCommand(backend, server, st)
	if err != nil {
		return err
	}
	return c.runSet(ctx, cmd)
}

// SetWeight sets a server's absolute weight (0..256).
func (c *Client) SetWeight(ctx context.Context, backend, server string, weight int) error {
	cmd, err := SetWeightCommand(backend, server, weight)
	if err != nil {
		return err
	}
	return c.runSet(ctx, cmd)
}

func truncate(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}
