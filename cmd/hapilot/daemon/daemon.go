// Package daemon wires hapilot's parts into one agent: SPOE ingest into
// the window store, the control loop over the runtime sockets, and the
// status server. `hapilot run`, the demo and the end-to-end tests all
// start the agent through it.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/ledger"
	"github.com/hapilot/hapilot/agent/loop"
	"github.com/hapilot/hapilot/agent/peers"
	"github.com/hapilot/hapilot/agent/policy"
	"github.com/hapilot/hapilot/agent/policy/luapolicy"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/agent/recovery"
	"github.com/hapilot/hapilot/agent/status"
	"github.com/hapilot/hapilot/cmd/hapilot/config"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/ingest/counters"
	"github.com/hapilot/hapilot/internal/ingest/logs"
	"github.com/hapilot/hapilot/internal/ingest/telemetry"
	"github.com/hapilot/hapilot/internal/lib/auditlog"

	"github.com/hapilot/hapilot/agent/notify"
	"github.com/hapilot/hapilot/internal/ingest/spoe"
	"github.com/hapilot/hapilot/internal/lib/netx"
	"github.com/hapilot/hapilot/internal/lib/promtext"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/rs/zerolog"
)

// Daemon is one configured agent.
type Daemon struct {
	Config config.Config
	Store  *window.Store
	SPOE   *spoe.Server
	Loop   *loop.Loop
	Status *status.Server

	Lua    *logs.LineServer     // nil unless --lua-listen
	Syslog *logs.SyslogServer   // nil unless --syslog-listen
	Stats  *counters.StatPoller // nil with --stats-poll 0
	Fleet  *peers.Node          // nil unless --fleet-bind
	// Paths judges the telemetry paths together: silent, blind, unseen.
	Paths *telemetry.Paths

	log       zerolog.Logger
	clients   []*haproxy.Client
	readmit   *recovery.Readmitter // nil with --readmit off
	spoeLn    net.Listener
	luaLn     net.Listener
	statusLn  net.Listener
	controlLn net.Listener
	// capped are the stream listeners, by the name their metrics use.
	capped []namedListener
	audit  *auditlog.File // nil without --audit-log
	// auditQ writes to audit from a goroutine of its own: a hung disk
	// never stops the loop; lost records are counted.
	auditQ *auditlog.Queue
	// stopState ends the state file's writer (Serve starts it).
	stopState func(wait time.Duration) ledger.SaveStatus
	// sinks receive the loop's events: the audit log, the webhook.
	sinks fanout
	// startEvents are written once the loop's sinks are in place: what
	// New found (a calibration verdict).
	startEvents []agent.Event
	notifier    *notify.Notifier // nil without --notify-webhook
	// parts are what Serve runs, each opened in New, serving until the
	// agent stops, and released by Close.
	parts     []component
	closeOnce sync.Once
}

// component is one part of the agent: it opened what it needs when it
// was added, serves until ctx ends, and releases it in close.
type component struct {
	name  string
	serve func(ctx context.Context) error
	close func() // nil: nothing of its own to release
}

// namedListener is a capped listener and the name of its metrics.
type namedListener struct {
	name string
	ln   *netx.Listener
}

// limit caps ln and keeps it for /metrics.
func (d *Daemon) limit(name string, ln net.Listener, max int) *netx.Listener {
	l := netx.Limit(ln, max, d.log.With().Str("component", name).Logger())
	d.capped = append(d.capped, namedListener{name, l})
	return l
}

// add makes c one of the agent's parts.
func (d *Daemon) add(c component) { d.parts = append(d.parts, c) }

// closer adapts an io.Closer's Close to a component's.
func closer(c io.Closer) func() { return func() { c.Close() } }

// Connection caps: HAProxy holds a handful of SPOE connections per
// process, the Lua companion one per flush, a ring one; /status is for
// people and scrapers. At a cap, the open connection that has done least
// is closed to make room for the new one (netx.Listener), so that no
// number of slow peers can keep HAProxy's own connection out.
const (
	MaxConns       = 256
	MaxStatusConns = 64
)

// NewPolicy builds the policy a config names, with its hooks.
func NewPolicy(c config.Config, log zerolog.Logger) (agent.Policy, error) {
	p, _, err := newPolicy(c, log, func(agent.Event) {})
	return p, err
}

// newPolicy is NewPolicy with the calibration verdict it read, if any,
// as the event the agent writes once it runs; a verdict read later (when
// the LLM policy starts) goes to emit.
func newPolicy(c config.Config, log zerolog.Logger, emit func(agent.Event)) (agent.Policy, *agent.Event, error) {
	switch c.Chosen() {
	case config.PolicyStatic:
		return policy.NewStatic(), nil, nil
	case config.PolicyRules:
		return rules.NewPerBackend(c.Rules), nil, nil
	case config.PolicyLLM, config.PolicyShadow:
		return newLLMPolicy(c, log, emit)
	case config.PolicyLua:
		p, err := luapolicy.NewPolicy(c.PolicyFile, log.With().Str("component", "lua-policy").Logger())
		return p, nil, err
	}
	return agent.Policy{}, nil, fmt.Errorf("unknown policy %q", c.Policy)
}

// Options replace parts the config would build. No flag reaches them:
// `hapilot run` passes none, and the lab passes its own (its rerun of the
// study's unguarded loop, internal/lab/bench.StudyLoop), so that no
// research switch ships in the agent.
type Options struct {
	// Policy, when set, builds the policy in place of the one c names.
	Policy func(c config.Config, log zerolog.Logger) (agent.Policy, error)
}

// New validates c, opens the listeners and the audit log, and builds
// every part; nothing runs until Serve.
func New(c config.Config, log zerolog.Logger) (*Daemon, error) {
	return NewWith(c, log, Options{})
}

// NewWith is New with o's parts in place of the config's.
func NewWith(c config.Config, log zerolog.Logger, o Options) (*Daemon, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	// The first line says whether anything the agent decides reaches
	// HAProxy.
	mode := c.Loop.Mode
	if mode == "" {
		mode = agent.ModeEnforce
	}
	log.Info().Str("mode", string(mode)).Str("policy", string(c.Chosen())).
		Msg("hapilot starting in " + string(mode) + " mode" + map[bool]string{true: ": no command changes HAProxy's state", false: ""}[mode.Observing()])
	state, err := c.StateFile()
	if err != nil {
		return nil, err
	}
	c.Loop.StateFile = state
	if state == "" {
		log.Warn().Msg("no state file: a restarted agent reads its own drains as the operator's, and `hapilot restore` has nothing to read")
	}
	d := &Daemon{Config: c, log: log}
	// A verdict read once the policy starts goes into the loop's events:
	// the loop is built below, and the policy starts only in Serve.
	var pol agent.Policy
	var verdict *agent.Event
	if o.Policy != nil {
		pol, err = o.Policy(c, log)
	} else {
		pol, verdict, err = newPolicy(c, log, func(ev agent.Event) {
			if d.Loop != nil {
				d.Loop.Emit(ev)
			}
		})
	}
	if err != nil {
		return nil, err
	}
	if verdict != nil {
		d.startEvents = append(d.startEvents, *verdict)
	}
	var runtimes []agent.Runtime
	var sources []counters.StatSource
	var infos []telemetry.InfoSource
	for _, s := range c.HAProxySockets {
		cl, err := haproxy.New(s)
		if err != nil {
			if pol.Close != nil {
				pol.Close() // a Lua policy's worker
			}
			return nil, err
		}
		cl.MaxRows = c.MaxStatRows
		runtimes = append(runtimes, cl)
		sources = append(sources, cl)
		infos = append(infos, cl)
		d.clients = append(d.clients, cl)
	}
	d.Store = window.New(c.Window, c.MaxServers, nil)
	if c.Stats.Poll > 0 {
		d.Stats = &counters.StatPoller{Sources: sources, Sink: d.Store, Mode: c.StatsMode(), Period: c.Stats.Poll, Unseen: c.StatsUnseen(),
			Log: log.With().Str("component", "stats").Logger()}
	}
	d.SPOE = &spoe.Server{Sink: d.Store, Log: log.With().Str("component", "spoe").Logger()}
	ls, _ := c.Listeners() // validated above
	d.Paths = &telemetry.Paths{SPOEAt: ls.SPOE, LuaAt: ls.Lua, SyslogAt: ls.Syslog, PeerGroup: c.PeerGroup,
		SPOE: d.SPOE, Stats: d.Stats, Runtimes: infos, Sockets: c.HAProxySockets, Log: log}
	d.Paths.Cover(d.Store)
	// The policy's own needs (its drain cap per fleet size, its step
	// budget) are declared by the policy and read by the loop.
	d.Loop = &loop.Loop{
		Settings: c.Loop, Clock: agent.RealClock{}, Policy: pol, Guard: c.Guard, Identity: identity(),
		Runtimes: runtimes, Windows: d.Store, Log: log.With().Str("component", "loop").Logger(),
	}
	d.Paths.OnSilent = d.Loop.TelemetrySilent
	if d.Stats != nil {
		// A new HAProxy process put every server back at its configured
		// state: the loop steps at once to put the agent's changes back,
		// rather than leaving a drained server serving until the next tick.
		loop := d.Loop
		d.Stats.OnReload = func(addr string) {
			loop.Wake("the stats path saw a new HAProxy process behind " + addr + " (reload or restart)")
		}
	}
	// The state file is read now: a path that is not a regular file (a
	// FIFO would block the first step's read for good) stops the start.
	if err := d.Loop.OpenState(); err != nil {
		d.Close()
		return nil, err
	}
	if c.Recovery.Mode != recovery.ModeOff {
		d.readmit = recovery.New(c.Recovery, nil, log.With().Str("component", "recovery").Logger())
		d.Loop.Recovery = d.readmit
	}
	if c.Fleet.Enabled() {
		if err := d.joinFleet(); err != nil {
			d.Close()
			return nil, err
		}
	}
	if err := d.listen(); err != nil {
		d.Close()
		return nil, err
	}
	if err := d.listenControl(); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// joinFleet starts this agent's membership of the fleet and wraps the
// policy and recovery in it: the policy decides only the backends this
// agent decides, on pooled evidence, and follows the others' deciders;
// recovery leaves the servers a decider elsewhere holds to that decider.
func (d *Daemon) joinFleet() error {
	c := d.Config
	key, err := peers.ReadKey(c.Fleet.KeyFile)
	if err != nil {
		return err
	}
	d.Fleet, err = peers.Start(peers.Params{Config: c.Fleet, Key: key, Local: d.Store, MaxSeries: c.MaxServers,
		Log: d.log.With().Str("component", "fleet").Logger()})
	if err != nil {
		return fmt.Errorf("%w%s", err, netx.Hint(err))
	}
	d.Fleet.SetChanges(d.Loop.View().Ledger)
	d.Loop.Policy = peers.Wrap(d.Loop.Policy, d.Fleet)
	if d.Loop.Recovery != nil {
		d.Loop.Recovery = peers.Recovery{Inner: d.Loop.Recovery, Node: d.Fleet}
	}
	return nil
}

// listen opens the audit log and every listener the config names.
func (d *Daemon) listen() error {
	c, log := &d.Config, d.log
	var err error
	if c.AuditLog != "" {
		// A regular file only, checked without blocking: a link planted at
		// the path is refused, never appended through, and a FIFO is
		// refused at once instead of blocking the start.
		f, err := auditlog.Open(c.AuditLog)
		if err != nil {
			return err
		}
		d.audit = f
		alog := d.log.With().Str("component", "audit").Logger()
		d.auditQ = auditlog.NewQueue(f, alog)
		d.sinks = append(d.sinks, eventLog{w: d.auditQ, log: alog})
		// The snapshot of every server at every step is opt-in: issue 36
		// measured 17.2 MB in 150 s at 1,000 servers and a 1 s interval.
		if c.AuditSteps {
			d.Loop.Audit = d.auditQ
		}
	}
	if c.Notify.URL != "" {
		d.notifier = notify.New(c.Notify, d.log.With().Str("component", "notify").Logger())
		d.sinks = append(d.sinks, d.notifier)
		d.add(component{"notify", d.notifier.Run, nil})
	}
	if len(d.sinks) > 0 {
		d.Loop.Events = d.sinks
	}
	ls, err := c.Listeners()
	if err != nil {
		return err
	}
	// Who may send evidence to an abstract socket, which has no file mode.
	peers := netx.DefaultPeers(c.PeerGroup)
	ls.SPOE.Peers, ls.Lua.Peers, ls.Syslog.Peers = peers, peers, peers
	if !ls.SPOE.Off() {
		if d.spoeLn, err = netx.ListenAddress(ls.SPOE); err != nil {
			return fmt.Errorf("spoe-listen: %w", err)
		}
		d.Paths.WatchPeers("spoe", d.spoeLn)
		d.spoeLn = d.limit("spoe", d.spoeLn, MaxConns)
		d.add(component{"spoe", func(ctx context.Context) error { return d.SPOE.Serve(ctx, d.spoeLn) }, closer(d.spoeLn)})
	}
	if !ls.Lua.Off() {
		if d.luaLn, err = netx.ListenAddress(ls.Lua); err != nil {
			return fmt.Errorf("lua listen: %w", err)
		}
		d.Paths.WatchPeers("lua", d.luaLn)
		d.luaLn = d.limit("lua", d.luaLn, MaxConns)
		d.Lua = &logs.LineServer{Sink: d.Store, Log: log.With().Str("component", "lua").Logger()}
		d.Paths.Lua = d.Lua
		d.add(component{"lua", func(ctx context.Context) error { return d.Lua.Serve(ctx, d.luaLn) }, closer(d.luaLn)})
	}
	if !ls.Syslog.Off() {
		d.Syslog = &logs.SyslogServer{Sink: d.Store, Log: log.With().Str("component", "syslog").Logger()}
		d.Paths.Syslog = d.Syslog
		switch ls.Syslog.Network {
		case netx.TCP, netx.Unix, netx.Abstract: // an HAProxy ring's forwarder
			ln, err := netx.ListenAddress(ls.Syslog)
			if err != nil {
				return fmt.Errorf("syslog listen: %w", err)
			}
			d.Paths.WatchPeers("syslog", ln)
			ln = d.limit("syslog", ln, MaxConns)
			d.add(component{"syslog", func(ctx context.Context) error { return d.Syslog.ServeStream(ctx, ln) }, closer(ln)})
		default:
			pc, err := netx.ListenPacketAddress(ls.Syslog)
			if err != nil {
				return fmt.Errorf("syslog listen: %w", err)
			}
			d.Paths.WatchPeers("syslog", pc)
			d.add(component{"syslog", func(ctx context.Context) error { return d.Syslog.Serve(ctx, pc) }, closer(pc)})
		}
	}
	if !ls.Status.Off() {
		if d.statusLn, err = netx.ListenAddress(ls.Status); err != nil {
			return fmt.Errorf("status-listen: %w", err)
		}
		sl := d.limit("status", d.statusLn, MaxStatusConns)
		sl.MaxLife = status.MaxConnLife
		d.statusLn = sl
		d.Status = &status.Server{Loop: d.Loop, Extra: []func(io.Writer){d.writeIngestMetrics, writeProcessMetrics}, Warnings: d.Warnings, Unseen: d.Paths.Unseen,
			Ingest: d.ingestCounters, Series: func(n int) any { return d.Store.PerSecond(n) }, Token: c.StatusToken,
			Log: log.With().Str("component", "status").Logger()}
		if d.notifier != nil {
			d.Status.Extra = append(d.Status.Extra, d.notifier.WriteMetrics)
		}
		if d.Fleet != nil {
			d.Status.Extra = append(d.Status.Extra, d.Fleet.WriteMetrics)
			d.Status.Fleet = func() any { return d.Fleet.Status() }
		}
		d.add(component{"status", func(ctx context.Context) error { return d.Status.Serve(ctx, d.statusLn) }, closer(d.statusLn)})
	}
	return nil
}

// ingestFigures gathers the counters each part keeps of itself (the
// ingest paths, the audit queue, the capped listeners, the silent-path
// check, the window store), for /metrics, /status and the live page.
func (d *Daemon) ingestFigures() []promtext.Figure {
	fs := d.SPOE.Figures()
	if d.Lua != nil {
		fs = append(fs, d.Lua.Figures()...)
	}
	if d.Syslog != nil {
		fs = append(fs, d.Syslog.Figures()...)
	}
	if d.auditQ != nil {
		fs = append(fs, d.auditQ.Figures()...)
	}
	if d.Stats != nil {
		fs = append(fs, d.Stats.Figures()...)
	}
	for _, l := range d.capped {
		fs = append(fs, l.ln.Figures(l.name)...)
	}
	fs = append(fs, d.Paths.Figures()...)
	return append(fs, d.Store.Figures()...)
}

func (d *Daemon) writeIngestMetrics(w io.Writer) { promtext.WriteFigures(w, d.ingestFigures()) }

// ingestCounters are the same figures for /status and the live page.
func (d *Daemon) ingestCounters() map[string]uint64 {
	m := map[string]uint64{}
	for _, f := range d.ingestFigures() {
		m[f.Key()] = f.V
	}
	return m
}

func (d *Daemon) luaCounters() *logs.Counters {
	if d.Lua == nil {
		return nil
	}
	return &d.Lua.Counters
}

func (d *Daemon) syslogCounters() *logs.Counters {
	if d.Syslog == nil {
		return nil
	}
	return &d.Syslog.Counters
}

// Silence is what the silent-path check found (Paths.Silence).
func (d *Daemon) Silence() counters.Silence { return d.Paths.Silence() }

// Blindness is what the blind-path check found (Paths.Blindness).
func (d *Daemon) Blindness() counters.Blindness { return d.Paths.Blindness() }

// Events is how many responses every path recorded together
// (Paths.Events).
func (d *Daemon) Events() uint64 { return d.Paths.Events() }

// SPOEAddr and StatusAddr are the bound addresses (useful with port 0).
func (d *Daemon) SPOEAddr() string {
	if d.spoeLn == nil {
		return ""
	}
	return d.spoeLn.Addr().String()
}

// LuaAddr is the Lua companion's listener, "" when off.
func (d *Daemon) LuaAddr() string {
	if d.luaLn == nil {
		return ""
	}
	return d.luaLn.Addr().String()
}
func (d *Daemon) StatusAddr() string {
	if d.statusLn == nil {
		return ""
	}
	return d.statusLn.Addr().String()
}

// Serve runs ingest, the loop and the status server until ctx ends or
// one of them fails. However it ends, --on-exit is done before it
// returns, and the state file is written one last time if a write had
// failed.
func (d *Daemon) Serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer d.Close()
	defer d.exit()
	if err := d.preflight(ctx); err != nil {
		return err
	}
	// The state file is written by a goroutine of its own, which exit
	// stops once the last state is on disk.
	d.stopState = d.Loop.WriteStateInBackground()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	run := func(name string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		}()
	}
	for _, p := range d.parts {
		run(p.name, p.serve)
	}
	if d.Stats != nil {
		if d.Stats.Mode == counters.StatCounts {
			d.log.Info().Msg("telemetry from HAProxy's counters alone: latency is HAProxy's average response time (rtime), so the latency test and the p99 guard judge a mean, not a percentile")
		}
		run("stats", d.Stats.Run)
	}
	// A policy with a life of its own (the model's warm-up) starts with
	// the agent; Close stops it.
	if d.Loop.Policy.Start != nil {
		d.Loop.Policy.Start()
	}
	if d.Fleet != nil {
		run("fleet", d.Fleet.Run)
	}
	d.Loop.Start()
	for _, ev := range d.startEvents {
		d.Loop.Emit(ev)
	}
	run("loop", d.Loop.Run)
	run("telemetry watch", d.Paths.WatchFirstResponse)
	run("telemetry advice", d.Paths.Advise)
	if d.Paths.Covered() {
		run("telemetry silence", d.Paths.WatchSilence)
	}
	d.log.Info().Str("spoe", d.SPOEAddr()).Str("lua", d.LuaAddr()).Str("syslog", d.Config.SyslogListen).Str("status", d.StatusAddr()).Strs("haproxy", d.Config.HAProxySockets).
		Str("stats_poll", statsPoll(d.Config)).Str("fleet", d.fleetLine()).
		Str("policy", string(d.Config.Chosen())).Dur("interval", d.Config.Loop.Interval).
		Str("mode", string(d.Loop.View().Status().Mode)).Str("control", d.ControlAddr()).Str("state_file", d.Config.Loop.StateFile).Msg("hapilot running")
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// OnExitTimeout bounds --on-exit restore's commands.
const OnExitTimeout = 5 * time.Second

// StateStopWait bounds how long a stopping agent waits for the disk to
// take its last state.
const StateStopWait = 5 * time.Second

// exit does what the agent does however it stops: --on-exit restore
// readies every server it changed, and a state file a write failed on
// gets one last try, its loss logged if that fails too.
func (d *Daemon) exit() {
	if d.Config.OnExit == config.OnExitRestore {
		uctx, cancel := context.WithTimeout(context.Background(), OnExitTimeout)
		results := d.Loop.Control().Undo(uctx)
		cancel()
		d.log.Info().Int("commands", len(results)).Msg("--on-exit restore: the agent's changes undone")
	}
	st := d.Loop.FlushState
	if d.stopState != nil {
		st = func() ledger.SaveStatus { return d.stopState(StateStopWait) }
	}
	if st := st(); !st.Saved {
		d.log.Error().Str("file", st.File).Time("unsaved_since", st.UnsavedSince).Str("error", st.Error).
			Msg("stopping with the state file unsaved: the changes since are lost to the next start")
	}
}

// Reopen opens the audit log again at its path: after logrotate moved it
// away (SIGHUP), the agent writes a new one. A path it cannot open leaves
// the log where it was, logged.
func (d *Daemon) Reopen() {
	if d.audit == nil {
		return
	}
	if err := d.audit.Reopen(); err != nil {
		d.log.Error().Err(err).Msg("cannot reopen the audit log; still writing to the file it was")
		return
	}
	d.log.Info().Str("audit_log", d.audit.Path()).Msg("audit log reopened")
}

// Warnings lists what an operator should fix, for /status.
func (d *Daemon) Warnings() []string {
	ws := d.Paths.Warnings()
	if w := d.Loop.View().StateWarning(); w != "" {
		ws = append(ws, w)
	}
	if u := d.Paths.Unseen(); strings.HasPrefix(u, "telemetry blind") {
		ws = append(ws, u)
	}
	return ws
}

// preflight checks every runtime socket once: one the agent may not use
// (permission denied, a level below admin) stops it with the fix in the
// message; one that does not answer yet is logged, and the loop keeps
// trying it every step.
func (d *Daemon) preflight(ctx context.Context) error {
	var errs []error
	for _, c := range d.clients {
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := c.Preflight(pctx)
		cancel()
		switch {
		case err == nil:
		case errors.Is(err, haproxy.ErrMisconfigured):
			errs = append(errs, err)
		default:
			d.log.Warn().Err(err).Str("haproxy", c.Addr()).Msg("HAProxy's runtime socket does not answer yet; the agent retries it every step")
		}
	}
	return errors.Join(errs...)
}

// Close stops the probe bursts and releases the listeners, the policy
// and the audit log. It is safe to call more than once.
func (d *Daemon) Close() {
	d.closeOnce.Do(d.close)
}

func (d *Daemon) close() {
	if d.Fleet != nil {
		d.Fleet.Close()
	}
	if d.readmit != nil {
		d.readmit.Close()
	}
	if d.Loop != nil && d.Loop.Policy.Close != nil {
		d.Loop.Policy.Close()
	}
	for i := len(d.parts) - 1; i >= 0; i-- {
		if c := d.parts[i].close; c != nil {
			c()
		}
	}
	if d.auditQ != nil {
		if err := d.auditQ.Close(AuditStopWait); err != nil {
			// Its goroutine is in a write the disk does not return: the
			// file is left to the process's end, not closed under it.
			d.log.Error().Err(err).Msg("audit log records lost at stop")
			return
		}
	}
	if d.audit != nil {
		d.audit.Close()
	}
}

// AuditStopWait bounds how long a stopping agent waits for the disk to
// take the audit records still queued.
const AuditStopWait = 5 * time.Second

// fleetLine describes fleet mode for the start-up line.
func (d *Daemon) fleetLine() string {
	if d.Fleet == nil {
		return "off"
	}
	return d.Fleet.Name() + " at " + d.Fleet.Addr()
}

// statsPoll describes the stats path for the start-up line.
func statsPoll(c config.Config) string {
	if c.Stats.Poll <= 0 {
		return "off"
	}
	return c.Stats.Poll.String() + " " + string(c.StatsMode())
}
