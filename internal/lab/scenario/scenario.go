// Package scenario runs one end-to-end experiment: a fleet of
// fault-injecting backends behind a real HAProxy carrying the example
// stanza, the agent (in process, or as a `hapilot run` process), and an
// open-loop load; it reports what the clients saw and what happened to
// each server, as HAProxy itself reported it.
package scenario

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hapilot/hapilot/cmd/hapilot/config"
	"github.com/hapilot/hapilot/cmd/hapilot/daemon"
	"github.com/hapilot/hapilot/examples"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
	"github.com/rs/zerolog"
)

// Scenario describes one run.
type Scenario struct {
	Servers  []fleet.BackendConfig
	Algo     string
	Weight   int // every server's configured weight; 0 for HAProxy's default
	MaxConn  int // every server's maxconn in HAProxy; 0 for none
	Threads  int // HAProxy's nbthread; 0 for 1
	Rate     float64
	Duration time.Duration
	// Warmup is load sent (and discarded) before the measured run, so
	// connections are open and windows hold data; 0 for none.
	Warmup time.Duration

	Policy   string // static|rules|llm; "" runs no agent at all
	Interval time.Duration
	// AgentArgs are further `hapilot run` flags (the LLM's, say).
	AgentArgs []string
	// Name tells runs of one policy apart in file names; default Policy.
	Name string
	// AgentBinary runs the agent as `AgentBinary run ...` instead of in
	// process, so that it can be killed.
	AgentBinary string
	// Build, when set, builds the in-process agent in place of
	// daemon.New: the lab's rerun of the study's loop (bench.StudyLoop),
	// which no flag of the agent can ask for. Not with AgentBinary.
	Build func(config.Config, zerolog.Logger) (*daemon.Daemon, error)
	// KillAgentAt sends SIGKILL to the agent process at this offset;
	// RestartAgentAt, later, starts it again with the same flags (and so
	// the same state file).
	KillAgentAt    time.Duration
	RestartAgentAt time.Duration
	// KillSignal is what KillAgentAt sends; default SIGKILL.
	KillSignal syscall.Signal
	// NoSPOE leaves the SPOE stanza out of HAProxy's config.
	NoSPOE bool
	// SPOETime has HAProxy report on each answer how long the SPOE held
	// it (fleet.HAProxyOptions.SPOETime; Load.SPOEHeld reads it).
	SPOETime bool
	// Telemetry is the path from HAProxy to the agent: "spoe" (default),
	// "spoe-unix", "lua-unix", "syslog-unix" and "syslog-ring-unix" (the
	// same over unix sockets, as the examples have them),
	// "lua" (the companion, examples/haproxy-lua.cfg), "syslog"
	// (examples/haproxy-syslog.cfg) or "syslog-ring"
	// (examples/haproxy-syslog-ring.cfg); "spoe-sampled" (k=16) or
	// "spoe-sampledK" (examples/haproxy-sampled.cfg); "stats" (no stanza:
	// HAProxy's own counters read every second) or "scrape15s" (the same
	// every 15 s, the study's Prometheus lag).
	Telemetry string
	// StockGlobal is fleet.HAProxyOptions.StockGlobal: a distribution's
	// haproxy.cfg whose global section (chroot, user, group) HAProxy runs
	// with. With Telemetry "stock", the stanza is the README's word for
	// word (abns@hapilot-spoe) and the agent runs with its defaults;
	// "stock-lua", "stock-syslog" and "stock-ring" are the other examples'
	// stanzas as they are (abns@hapilot-lua, -log, -ring).
	StockGlobal string
	// MasterWorker runs HAProxy as Debian's unit does (haproxy -Ws), so
	// that Env.HAProxy.Reload is `systemctl reload haproxy`.
	MasterWorker bool
	// AgentUnreachable says HAProxy is expected never to reach the
	// agent's SPOE listener (a test of a broken path): the run does not
	// wait for the agents' server to come up.
	AgentUnreachable bool
	// StatusListen is the agent's --status-listen; "" for off.
	StatusListen string
	// Retries gives HAProxy's backend retry-on 500 502 503 504, retries 2
	// and option redispatch 1 (fleet.HAProxyOptions.Retries).
	Retries bool
	// Redispatch gives HAProxy's backend option http-server-close,
	// retries 3, option redispatch and timeout server 2s
	// (fleet.HAProxyOptions.Redispatch): what operators set in front of
	// servers that hang, reset or refuse.
	Redispatch bool
	// NoKeepAlive has the load's client close its connection after each
	// request (fleet.Load.NoKeepAlive).
	NoKeepAlive bool
	// ServerOptions and HTTPCheck are fleet.HAProxyOptions' (HAProxy's own
	// detection: checks and `observe layer7`).
	ServerOptions string
	HTTPCheck     bool
	// DownIsOut counts a server HAProxy marked DOWN (its checks, or
	// `observe layer7 ... on-error mark-down`) as out of rotation in the
	// Timeline, as a drain is.
	DownIsOut bool
	// Sidecar, with no Policy and the SPOE stanza in place, is what
	// listens for HAProxy's SPOE messages instead of the agent (the
	// benchmark's envoy baseline): it serves on ln until ctx ends, and may
	// act through rt.
	Sidecar func(ctx context.Context, ln net.Listener, rt *haproxy.Client) error
	// Prepare runs once HAProxy is up, before the load (e.g. an operator's
	// `set server ... state maint`).
	Prepare func(ctx context.Context, rt *haproxy.Client) error
	// EditHAProxy, when set, rewrites the generated haproxy.cfg (a second
	// backend, say); Watch and the outcome still follow fleet.BackendName.
	EditHAProxy func(cfg string) string
	// At runs at the given offsets into the load.
	At map[time.Duration]func(env *Env)

	Dir string // scratch directory (config, socket, audit log)
	Log zerolog.Logger
}

// Env is what an At hook can reach.
type Env struct {
	HAProxy   *haproxyproc.Process
	Backends  []*fleet.Backend
	AgentAddr string         // the agent's SPOE address
	Daemon    *daemon.Daemon // nil when the agent is a process or absent
	AuditLog  string         // the agent's --audit-log
	// SignalAgent sends sig to the agent process, and AgentPID names it
	// (AgentBinary only; 0 without).
	SignalAgent func(sig os.Signal) error
	AgentPID    func() int
}

// Outcome is what one run produced.
type Outcome struct {
	Policy    string
	Load      *fleet.Result
	DrainedAt map[string]time.Duration // first seen entering drain, from the load's start
	Flips     map[string]int           // changes of drained state during the load
	Timeline  map[string][]Transition  // every change of drained state
	Changes   map[string][]StateChange // every change of state or weight, the first at 0
	Start     time.Time                // when the measured load began
	Final     []haproxy.ServerState
	// HAProxyCPU is HAProxy's CPU time during the measured load; Retried
	// the attempts its backend retried then (the servers' wretr).
	HAProxyCPU time.Duration
	Retried    int64
	Events     uint64 // responses the agent recorded (in-process agent only)
	Ingest     uint64 // ingest errors (in-process agent only)
	AuditLog   string
	HAProxy    *haproxyproc.Process
	agentLog   *os.File
	downIsOut  bool
}

// Transition is a server entering or leaving drain.
type Transition struct {
	At      time.Duration
	Drained bool
}

// StateChange is a server's state label (ready, drain, maint, down) and
// weight from At on, as HAProxy reported them.
type StateChange struct {
	At     time.Duration `json:"at"`
	State  string        `json:"state"`
	Weight int           `json:"weight"`
}

// Run executes the scenario.
func (s Scenario) Run(ctx context.Context) (*Outcome, error) {
	backends, err := fleet.StartBackends(s.Servers)
	if err != nil {
		return nil, err
	}
	defer fleet.CloseAll(backends)
	ports, err := haproxyproc.FreePorts(3)
	if err != nil {
		return nil, err
	}
	opts := fleet.HAProxyOptions{Dir: s.Dir, FrontendPort: ports[0], Servers: fleet.Addrs(backends), Algo: s.Algo, Weight: s.Weight, MaxConn: s.MaxConn, Threads: s.Threads,
		Retries: s.Retries, Redispatch: s.Redispatch, ServerOptions: s.ServerOptions, HTTPCheck: s.HTTPCheck, SPOETime: s.SPOETime, StockGlobal: s.StockGlobal}
	ingestArgs := []string{"--spoe-listen", "off"}
	telemetry := s.Telemetry
	if k, sampled, err := fleet.SampledPath(telemetry); err != nil {
		return nil, err
	} else if sampled {
		opts.Sample, telemetry = k, "spoe"
	}
	switch telemetry {
	case "stats":
		// the agent's default period
		ingestArgs = append(ingestArgs, "--stats-poll-mode", "counts")
	case "scrape15s":
		ingestArgs = append(ingestArgs, "--stats-poll", "15s")
	case "", "spoe":
		if !s.NoSPOE {
			opts.AgentAddr = fmt.Sprintf("127.0.0.1:%d", ports[1])
			ingestArgs = []string{"--spoe-listen", opts.AgentAddr}
		}
	case "stock":
		// The README's stanza as it is, and the agent's default listener.
		opts.AgentAddr = examples.AgentAddr
		ingestArgs = nil
	case "stock-lua", "stock-syslog", "stock-ring":
		// The examples' stanzas as they are, with the agent listening at
		// the addresses their comments give.
		addr := map[string]string{"stock-lua": "abns@hapilot-lua", "stock-syslog": "abns@hapilot-log", "stock-ring": "abns@hapilot-ring"}[telemetry]
		listen := map[string]string{"stock-lua": "--lua-listen", "stock-syslog": "--syslog-listen", "stock-ring": "--syslog-listen"}[telemetry]
		arg := addr
		switch telemetry {
		case "stock-lua":
			opts.LuaAgent = addr
		case "stock-syslog":
			opts.SyslogAddr, arg = addr, "abnsgram@hapilot-log"
		case "stock-ring":
			opts.SyslogRing = addr
		}
		ingestArgs = append(ingestArgs, listen, arg)
	case "spoe-unix":
		path := filepath.Join(s.Dir, "spoe.sock")
		opts.AgentAddr = "unix@" + path
		ingestArgs = []string{"--spoe-listen", "unix:" + path}
	case "lua":
		opts.LuaAgent = fmt.Sprintf("127.0.0.1:%d", ports[1])
		ingestArgs = append(ingestArgs, "--lua-listen", opts.LuaAgent)
	case "lua-unix":
		path := filepath.Join(s.Dir, "lua.sock")
		opts.LuaAgent = "unix@" + path
		ingestArgs = append(ingestArgs, "--lua-listen", "unix:"+path)
	case "syslog":
		opts.SyslogAddr = fmt.Sprintf("127.0.0.1:%d", ports[2])
		ingestArgs = append(ingestArgs, "--syslog-listen", "udp://"+opts.SyslogAddr)
	case "syslog-ring", "ring":
		opts.SyslogRing = fmt.Sprintf("127.0.0.1:%d", ports[2])
		ingestArgs = append(ingestArgs, "--syslog-listen", "tcp://"+opts.SyslogRing)
	case "syslog-unix":
		opts.SyslogAddr = filepath.Join(s.Dir, "syslog.sock")
		ingestArgs = append(ingestArgs, "--syslog-listen", "unixgram://"+opts.SyslogAddr)
	case "syslog-ring-unix":
		path := filepath.Join(s.Dir, "ring.sock")
		opts.SyslogRing = "unix@" + path
		ingestArgs = append(ingestArgs, "--syslog-listen", "unix://"+path)
	default:
		return nil, fmt.Errorf("unknown telemetry %q", s.Telemetry)
	}
	cfg, err := fleet.HAProxyConfig(opts)
	if err != nil {
		return nil, err
	}
	if s.EditHAProxy != nil {
		cfg = s.EditHAProxy(cfg)
	}
	startHAProxy := haproxyproc.Start
	if s.MasterWorker {
		startHAProxy = haproxyproc.StartMasterWorker
	}
	hp, err := startHAProxy(ctx, s.Dir, cfg, opts.Socket())
	if err != nil {
		return nil, err
	}
	out := NewOutcome(s.Policy)
	out.downIsOut = s.DownIsOut
	out.HAProxy = hp
	defer hp.Stop()
	rt, err := haproxy.New(opts.Socket())
	if err != nil {
		return nil, err
	}
	if s.Prepare != nil {
		if err := s.Prepare(ctx, rt); err != nil {
			return nil, fmt.Errorf("prepare: %w", err)
		}
	}

	agentCtx, stopAgent := context.WithCancel(ctx)
	defer stopAgent()
	var agentDone chan error
	var d *daemon.Daemon
	var proc *exec.Cmd
	var procMu sync.Mutex // proc and agentDone change when the agent is restarted
	var restartAgent func() error
	if s.Sidecar != nil && s.Policy == "" && opts.AgentAddr != "" {
		ln, err := net.Listen("tcp", opts.AgentAddr)
		if err != nil {
			return nil, fmt.Errorf("sidecar: %w", err)
		}
		sideDone := make(chan error, 1)
		go func() { sideDone <- s.Sidecar(agentCtx, ln, rt) }()
		defer func() { stopAgent(); ln.Close(); <-sideDone }()
		if err := WaitAgentUp(ctx, rt); err != nil {
			return nil, fmt.Errorf("sidecar: %w\nhaproxy log:\n%s", err, hp.Log())
		}
	}
	if s.Policy != "" {
		if s.Build != nil && s.AgentBinary != "" {
			return nil, errors.New("scenario: Build builds an in-process agent; AgentBinary runs a process")
		}
		name := s.Name
		if name == "" {
			name = s.Policy
		}
		out.AuditLog = filepath.Join(s.Dir, "audit-"+name+".jsonl")
		statusListen := s.StatusListen
		if statusListen == "" {
			statusListen = "off"
		}
		args := []string{"--policy", s.Policy, "--interval", s.Interval.String(), "--haproxy-socket", opts.Socket(),
			"--status-listen", statusListen, "--audit-log", out.AuditLog, "--audit-steps",
			"--state-file", filepath.Join(s.Dir, "state-"+name+".json"), "--control-socket", "unix:" + filepath.Join(s.Dir, "ctl-"+name+".sock")}
		args = append(args, ingestArgs...)
		args = append(args, s.AgentArgs...)
		if s.AgentBinary != "" {
			if out.agentLog, err = os.Create(filepath.Join(s.Dir, "agent-"+name+".log")); err != nil {
				return nil, err
			}
			startAgent := func() error {
				procMu.Lock()
				defer procMu.Unlock()
				proc = exec.Command(s.AgentBinary, append([]string{"run", "--log-format", "json"}, args...)...)
				proc.Stdout, proc.Stderr = out.agentLog, out.agentLog
				if err := proc.Start(); err != nil {
					return fmt.Errorf("start agent: %w", err)
				}
				done := make(chan error, 1)
				agentDone = done
				go func(p *exec.Cmd) { done <- p.Wait() }(proc)
				return nil
			}
			if err := startAgent(); err != nil {
				return nil, err
			}
			restartAgent = startAgent
			defer func() {
				procMu.Lock()
				defer procMu.Unlock()
				_ = proc.Process.Signal(syscall.SIGTERM)
				<-agentDone
				out.agentLog.Close()
			}()
		} else {
			fs := newFlagSet()
			c := config.Register(fs)
			if err := config.Parse(fs, args); err != nil {
				return nil, err
			}
			build := daemon.New
			if s.Build != nil {
				build = s.Build
			}
			d, err = build(*c, s.Log)
			if err != nil {
				return nil, err
			}
			agentDone = make(chan error, 1)
			go func() { agentDone <- d.Serve(agentCtx) }()
			defer func() { stopAgent(); <-agentDone }()
		}
		switch {
		case s.AgentUnreachable:
		case opts.AgentAddr != "":
			if err := WaitAgentUp(ctx, rt); err != nil {
				return nil, fmt.Errorf("%w\nhaproxy log:\n%s", err, hp.Log())
			}
		case proc != nil:
			if err := out.waitAgentLog(ctx, "hapilot running"); err != nil {
				return nil, err
			}
		}
	}

	load := fleet.Load{Addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), Rate: s.Rate, Duration: s.Duration, NoKeepAlive: s.NoKeepAlive}
	if s.Warmup > 0 {
		w := load
		w.Duration = s.Warmup
		w.Run(ctx)
	}
	start := time.Now()
	out.Start = start
	watchCtx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); out.Watch(watchCtx, rt, start) }()
	env := &Env{HAProxy: hp, Backends: backends, AgentAddr: opts.AgentAddr, Daemon: d, AuditLog: out.AuditLog,
		SignalAgent: func(sig os.Signal) error {
			procMu.Lock()
			defer procMu.Unlock()
			if proc == nil {
				return fmt.Errorf("no agent process to signal")
			}
			return proc.Process.Signal(sig)
		},
		AgentPID: func() int {
			procMu.Lock()
			defer procMu.Unlock()
			if proc == nil {
				return 0
			}
			return proc.Process.Pid
		}}
	for at, f := range s.At {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-watchCtx.Done():
			case <-time.After(at):
				f(env)
			}
		}()
	}
	if s.KillAgentAt > 0 && proc != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-watchCtx.Done():
			case <-time.After(s.KillAgentAt):
				procMu.Lock()
				sig := s.KillSignal
				if sig == 0 {
					sig = syscall.SIGKILL
				}
				_ = proc.Process.Signal(sig)
				<-agentDone // reap it
				agentDone <- nil
				procMu.Unlock()
			}
			if s.RestartAgentAt > s.KillAgentAt {
				select {
				case <-watchCtx.Done():
				case <-time.After(s.RestartAgentAt - s.KillAgentAt):
					procMu.Lock()
					<-agentDone
					procMu.Unlock()
					if err := restartAgent(); err != nil {
						s.Log.Error().Err(err).Msg("restart agent")
					}
				}
			}
		}()
	}
	cpu, retried := hp.CPU(), wretr(ctx, rt)
	out.Load = load.Run(ctx)
	out.HAProxyCPU, out.Retried = hp.CPU()-cpu, wretr(ctx, rt)-retried
	stopWatch()
	wg.Wait()
	if out.Final, err = rt.ShowServersState(ctx); err != nil {
		return nil, err
	}
	if d != nil {
		out.Events, out.Ingest = d.Events(), d.SPOE.Counters.IngestErrors.Load()
	}
	return out, nil
}

// NewOutcome is an empty outcome, ready for Watch.
func NewOutcome(policy string) *Outcome {
	return &Outcome{Policy: policy, DrainedAt: map[string]time.Duration{}, Flips: map[string]int{}, Timeline: map[string][]Transition{},
		Changes: map[string][]StateChange{}}
}

// Watch polls HAProxy's own view of the servers every 100 ms until ctx
// ends, recording drains, flips and every change from start on. Only
// Watch writes o's maps; read them once it has returned.
func (o *Outcome) Watch(ctx context.Context, rt *haproxy.Client, start time.Time) {
	var drained map[string]bool // nil until the first poll: the state the run started from
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		states, err := rt.ShowServersState(ctx)
		if err == nil {
			first := drained == nil
			if first {
				drained = map[string]bool{}
			}
			for _, st := range states {
				if st.Backend != fleet.BackendName {
					continue
				}
				at := time.Since(start)
				if first {
					at = 0
				}
				label := st.Label()
				if ch := o.Changes[st.Server]; len(ch) == 0 || ch[len(ch)-1].State != label || ch[len(ch)-1].Weight != st.Weight {
					o.Changes[st.Server] = append(ch, StateChange{At: at, State: label, Weight: st.Weight})
				}
				now := st.Drain() || (o.downIsOut && st.OpState == haproxy.OpStopped)
				if !first && now != drained[st.Server] {
					o.Flips[st.Server]++
					o.Timeline[st.Server] = append(o.Timeline[st.Server], Transition{At: time.Since(start), Drained: now})
					if now {
						if _, seen := o.DrainedAt[st.Server]; !seen {
							o.DrainedAt[st.Server] = time.Since(start)
						}
					}
				}
				drained[st.Server] = now
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// wretr sums the retried attempts of the fleet's servers so far.
func wretr(ctx context.Context, rt *haproxy.Client) int64 {
	stats, err := rt.ServerStats(ctx)
	if err != nil {
		return 0
	}
	var n int64
	for _, st := range stats {
		if st.Backend == fleet.BackendName {
			n += st.Counters.Wretr
		}
	}
	return n
}

// WaitAgentUp waits until HAProxy's check of the hapilot-agents backend
// passes.
func WaitAgentUp(ctx context.Context, rt *haproxy.Client) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		rows, err := showStat(ctx, rt)
		if err == nil && slices.ContainsFunc(rows, func(r map[string]string) bool {
			return r["pxname"] == "hapilot-agents" && r["svname"] == "agent1" && r["status"] == "UP"
		}) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agent not UP in HAProxy's check after 15s (last error %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitAgentLog waits until an agent process has logged msg.
func (o *Outcome) waitAgentLog(ctx context.Context, msg string) error {
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(o.AgentLog(), msg) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("agent never logged %q:\n%s", msg, o.AgentLog())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// AgentLog is what an agent process printed.
func (o *Outcome) AgentLog() string {
	if o.agentLog == nil {
		return ""
	}
	b, _ := os.ReadFile(o.agentLog.Name())
	return string(b)
}

// Faulty names the servers configured with an error rate above healthy.
func Faulty(cfgs []fleet.BackendConfig, above float64) map[string]bool {
	out := map[string]bool{}
	for i, c := range cfgs {
		if c.ErrorRate > above {
			out[fleet.ServerName(i)] = true
		}
	}
	return out
}

// showStat reads `show stat` as rows of every column, keyed by the
// header's names (their positions move between HAProxy releases). The
// agent reads only its typed columns (haproxy.Client.ServerStats); the
// lab wants others, such as a check's status.
func showStat(ctx context.Context, rt *haproxy.Client) ([]map[string]string, error) {
	reply, err := rt.Run(ctx, "show stat")
	if err != nil {
		return nil, err
	}
	return parseStat(reply)
}

// parseStat parses the CSV of `show stat` by its header row.
func parseStat(reply string) ([]map[string]string, error) {
	head, body, _ := strings.Cut(reply, "\n")
	if !strings.HasPrefix(head, "# ") {
		return nil, fmt.Errorf("show stat: no header row: %.80q", head)
	}
	header := strings.Split(strings.TrimSuffix(strings.TrimPrefix(head, "# "), ","), ",")
	r := csv.NewReader(strings.NewReader(body))
	r.FieldsPerRecord = -1
	recs, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("show stat: %w", err)
	}
	rows := make([]map[string]string, 0, len(recs))
	for n, rec := range recs {
		if len(rec) < len(header) {
			return nil, fmt.Errorf("show stat: row %d: %d fields, header has %d", n+1, len(rec), len(header))
		}
		row := make(map[string]string, len(header))
		for i, name := range header {
			row[name] = rec[i]
		}
		rows = append(rows, row)
	}
	return rows, nil
}
