package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/guard"
	"github.com/hapilot/hapilot/agent/ledger"
	"github.com/hapilot/hapilot/agent/loop"
	"github.com/hapilot/hapilot/cmd/hapilot/ctl"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/netx"
)

// MaxControlConns caps the control socket's connections: it is for an
// operator's commands, one at a time.
const MaxControlConns = 8

// listenControl opens the control socket (unix only, mode 0660: the
// agent's user and group).
func (d *Daemon) listenControl() error {
	a, err := netx.ParseAddress("control-socket", d.Config.ControlSocket, netx.Unix)
	if err != nil || a.Off() {
		return err
	}
	ln, err := netx.ListenAddress(a)
	if err != nil {
		return fmt.Errorf("control-socket: %w", err)
	}
	capped := d.limit("control", ln, MaxControlConns)
	capped.Evicting = refuseAtCap
	d.controlLn = capped
	log := d.log.With().Str("component", "control").Logger()
	d.add(component{"control", func(ctx context.Context) error {
		return netx.Serve(ctx, d.controlLn, log, func(c net.Conn) { d.serveControl(ctx, c) })
	}, closer(d.controlLn)})
	return nil
}

// ControlAddr is the control socket's path, "" when off.
func (d *Daemon) ControlAddr() string {
	if d.controlLn == nil {
		return ""
	}
	return d.controlLn.Addr().String()
}

// refuseAtCap tells the peer of a control connection closed at the cap
// (one that had not sent a whole request, or a new one while every open
// one carries out a command) that nothing was carried out: the client
// sends its request again (ctl.Do).
func refuseAtCap(c net.Conn, evicted bool) {
	why := fmt.Sprintf("the agent's control connections are at their cap (%d), each carrying out a command", MaxControlConns)
	if evicted {
		why = fmt.Sprintf("the agent's control connections are at their cap (%d): this one, holding no whole request, was closed to make room", MaxControlConns)
	}
	b, _ := json.Marshal(ctl.Answer{Error: "refused: " + why + "; nothing was carried out: send it again", Retry: true})
	// A unix socket's buffer takes one short line at once; the deadline
	// only bounds a peer that stopped reading a full one.
	_ = c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	_, _ = c.Write(append(b, '\n'))
}

// serveControl answers one request on c.
func (d *Daemon) serveControl(ctx context.Context, c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(ctl.Timeout))
	req, err := ctl.ReadRequest(bufio.NewReaderSize(c, 4096))
	// From here the request (or the reason it is refused) is answered:
	// the cap never evicts the connection mid-command. Evicted first, it
	// is not carried out: its caller was told so, and sends it again.
	if tc, ok := c.(*netx.Conn); ok && !tc.Claim() {
		return
	}
	var a ctl.Answer
	by := peer(c)
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		// Closed before a whole request: nothing was asked.
		d.log.Debug().Str("by", by).Msg("control connection closed before a request")
		return
	case err != nil:
		a.Error = "refused: " + err.Error()
		d.log.Warn().Str("by", by).Str("reason", a.Error).Msg("control request malformed")
	default:
		cctx, cancel := context.WithTimeout(ctx, ctl.Timeout)
		a = d.control(cctx, req, by)
		cancel()
	}
	b, err := json.Marshal(a)
	if err != nil {
		b, _ = json.Marshal(ctl.Answer{Error: "encode the answer: " + err.Error()})
	}
	if len(b) > ctl.MaxAnswer {
		// The client reads no more: say so rather than send what it
		// cannot read.
		b, _ = json.Marshal(ctl.Answer{Error: fmt.Sprintf("failed: the answer is %d bytes, over the %d a ctl answer may hold: read /status instead", len(b), ctl.MaxAnswer)})
	}
	_, _ = c.Write(append(b, '\n'))
}

// peer names who is on the other end of a unix connection, for the
// logs of what they asked: their uid and pid.
func peer(c net.Conn) string {
	if tc, ok := c.(*netx.Conn); ok {
		c = tc.Conn
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return "ctl"
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return "ctl"
	}
	var cred *syscall.Ucred
	_ = raw.Control(func(fd uintptr) {
		cred, err = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	})
	if err != nil || cred == nil {
		return "ctl"
	}
	return "ctl uid " + strconv.Itoa(int(cred.Uid)) + " pid " + strconv.Itoa(int(cred.Pid))
}

// CtlStatus is `hapilot ctl status`'s answer.
type CtlStatus struct {
	Mode     agent.Mode    `json:"mode"`
	Policy   string        `json:"policy"`
	Interval string        `json:"interval"`
	Cycle    uint64        `json:"cycle"`
	Observed time.Time     `json:"observed"`
	Pauses   []agent.Pause `json:"pauses"`
	// Backends are the backends the last step saw, each in scope or not,
	// with its own floor, caps and action.
	Backends  []guard.BackendScope `json:"backends"`
	Holding   []loop.Holding       `json:"holding"`
	Inventory []loop.Held          `json:"inventory"`
	StateFile *ledger.SaveStatus   `json:"state_file,omitempty"`
}

// control carries out one request.
func (d *Daemon) control(ctx context.Context, req ctl.Request, by string) ctl.Answer {
	l := d.Loop
	var result any
	var msg string
	var err error
	switch req.Command {
	case ctl.Status:
		st := l.View().Status()
		cs := CtlStatus{Mode: st.Mode, Policy: st.Policy, Interval: st.Interval, Cycle: st.Cycle, Observed: st.Observed,
			Pauses: st.Pauses, Backends: st.Scope, Holding: l.View().List(), Inventory: st.Inventory, StateFile: st.StateFile}
		result = cs
	case ctl.List:
		result = l.View().List()
	case ctl.Explain, ctl.Release:
		var k agent.Key
		if k, err = haproxy.ParseServerKey(req.Server); err != nil {
			err = fmt.Errorf("%w: %s needs BACKEND/SERVER: %v", agent.ErrRefused, req.Command, err)
			break
		}
		if req.Command == ctl.Explain {
			result, err = l.Control().Explain(k)
			break
		}
		var r loop.Released
		r, err = l.Control().Release(ctx, k, by)
		result = r
		if err == nil {
			msg = fmt.Sprintf("released %s: back to its configured state; the agent leaves it alone until %s, or until its state changes",
				k, r.Until.Format(time.RFC3339))
		}
	case ctl.Pause:
		var dur time.Duration
		if req.For != "" {
			if dur, err = time.ParseDuration(req.For); err != nil || dur < 0 {
				err = fmt.Errorf("%w: pause --for %q: want a positive duration (10m, 2h)", agent.ErrRefused, req.For)
				break
			}
		}
		backend := req.Backend
		if backend == "" {
			backend = agent.AllBackends
		}
		var p agent.Pause
		if p, err = l.Control().Pause(ctx, backend, dur, by); err != nil {
			break
		}
		result, msg = p, p.Why()+": the agent observes and sends nothing there; `hapilot ctl resume` ends it"
	case ctl.Resume:
		backend := req.Backend
		ended := l.Control().Resume(backend, by)
		result = ended
		switch {
		case len(ended) == 0:
			msg = "nothing was paused there"
		default:
			msg = fmt.Sprintf("%d pause(s) ended", len(ended))
		}
		if rest := l.View().Pauses(); len(rest) > 0 {
			msg += fmt.Sprintf("; still paused: %s", rest[0].Why())
		}
	case ctl.Restore:
		var rs []loop.Released
		rs, err = l.Control().Restore(ctx, by)
		result = rs
		msg = fmt.Sprintf("%d server(s) brought back to their configured state; each is the operator's for the hold time", len(rs))
	default:
		err = fmt.Errorf("%w: unknown command %q", agent.ErrRefused, req.Command)
	}
	a := ctl.Answer{OK: err == nil, Message: msg}
	if err != nil {
		a.Error = err.Error()
		if !errors.Is(err, agent.ErrRefused) {
			a.Error = "failed: " + a.Error
		}
		d.log.Warn().Str("command", short(string(req.Command))).Str("server", short(req.Server)).Str("backend", short(req.Backend)).
			Str("by", by).Str("reason", a.Error).Msg("control command refused")
	} else {
		// Every command is logged with its caller, the read-only ones
		// and those that changed nothing too: who looked, and when.
		d.log.Info().Str("command", string(req.Command)).Str("server", short(req.Server)).Str("backend", short(req.Backend)).
			Str("by", by).Str("answer", msg).Msg("control command answered")
	}
	if result != nil {
		b, merr := json.Marshal(result)
		if merr != nil {
			return ctl.Answer{Error: "encode the result: " + merr.Error()}
		}
		a.Result = b
	}
	return a
}

// short bounds what a log line repeats of a request's field: its first
// 256 bytes.
func short(s string) string {
	if len(s) > 256 {
		return s[:256] + "..."
	}
	return s
}
