// Package config composes hapilot's settings: every part's Config (with
// its own defaults and validation), the flags bound to their fields, and
// an optional config file of the same names.
package config

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/guard"
	"github.com/hapilot/hapilot/agent/peers"
	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/agent/policy/llm/modelapi"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/agent/recovery"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/ingest/counters"
	"github.com/hapilot/hapilot/internal/lib/enum"

	"github.com/hapilot/hapilot/agent/notify"
	"github.com/hapilot/hapilot/internal/lib/netx"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/rs/zerolog"
)

// Config is everything `hapilot run` takes. Each part's settings live
// in that part's own Config, with its defaults and its validation; this
// struct only composes them, and Register binds the flags to their
// fields.
type Config struct {
	SPOEListen   string
	LuaListen    string
	SyslogListen string
	// PeerGroup is the group, besides the agent's own user and group and
	// root, whose processes may send evidence to an abstract (abns@)
	// socket: HAProxy's, since its stock config drops to it.
	PeerGroup      string
	HAProxySockets []string
	// Loop is the control loop's own settings: its interval, evidence
	// checks, state file and operator hold.
	Loop       agent.Settings
	Window     time.Duration
	Policy     PolicyName
	PolicyFile string
	MaxServers int
	// MaxStatRows bounds the rows of one `show stat` or `show servers
	// state` reply, which are parsed as they arrive (haproxy.Client).
	MaxStatRows  int
	StatusListen string
	// StatusToken, when set, is required of every request to the status
	// endpoints; it must be set when they listen beyond loopback.
	StatusToken string
	AuditLog    string
	// AuditSteps adds every step's snapshot of every server to the
	// audit log, beside the events.
	AuditSteps bool
	// ControlSocket is where `hapilot ctl` reaches the agent: a unix
	// socket only (mode 0660), never the status port, so that nothing on
	// the network can change what the agent does.
	ControlSocket string
	LogFormat     LogFormat
	LogLevel      string
	OnExit        OnExit
	// Shadow is the old spelling of --policy shadow, kept for existing
	// configs; with any --policy but rules or shadow it is refused.
	Shadow bool

	Stats    counters.StatsConfig
	Guard    guard.Guardrails
	Rules    rules.Config
	Recovery recovery.Config
	LLM      llm.Config
	Fleet    peers.Config
	Notify   notify.Config
}

// Bounds on the windows: one bucket a second per series, allocated when a
// series is first seen.
const (
	MaxWindow       = time.Hour
	MaxWindowMemory = 1 << 30
	// MaxStatRows is the highest --max-stat-rows.
	MaxStatRows = 1 << 20
)

// PolicyName names the policy that decides.
type PolicyName string

const (
	PolicyStatic PolicyName = "static"
	PolicyRules  PolicyName = "rules"
	PolicyLLM    PolicyName = "llm"
	PolicyLua    PolicyName = "lua"
	// PolicyShadow: the model decides, the rules act, and every step's
	// disagreement is audited.
	PolicyShadow PolicyName = "shadow"
)

// Policies lists the policies this build knows.
var Policies = []PolicyName{PolicyStatic, PolicyRules, PolicyLLM, PolicyLua, PolicyShadow}

// Chosen is the policy that runs, --shadow's old spelling resolved.
func (c Config) Chosen() PolicyName {
	if c.Shadow {
		return PolicyShadow
	}
	return c.Policy
}

// UsesModel reports whether the chosen policy calls a model.
func (c Config) UsesModel() bool { return c.Chosen() == PolicyLLM || c.Chosen() == PolicyShadow }

func (p *PolicyName) String() string { return string(*p) }

// Set implements flag.Value.
func (p *PolicyName) Set(s string) (err error) {
	*p, err = enum.Parse("policy", s, Policies...)
	return err
}

// LogFormat is how the agent logs.
type LogFormat string

const (
	LogAuto    LogFormat = "auto" // console on a terminal, else JSON
	LogJSON    LogFormat = "json"
	LogConsole LogFormat = "console"
)

// LogFormats lists the log formats.
var LogFormats = []LogFormat{LogAuto, LogJSON, LogConsole}

func (f *LogFormat) String() string { return string(*f) }

// Set implements flag.Value.
func (f *LogFormat) Set(s string) (err error) {
	*f, err = enum.Parse("log-format", s, LogFormats...)
	return err
}

// OnExit is what the agent does with its changes when it stops.
type OnExit string

const (
	OnExitKeep    OnExit = "keep"    // leave the agent's drains in place
	OnExitRestore OnExit = "restore" // ready every server it changed
)

// OnExits lists the choices.
var OnExits = []OnExit{OnExitKeep, OnExitRestore}

func (o *OnExit) String() string { return string(*o) }

// Set implements flag.Value.
func (o *OnExit) Set(s string) (err error) {
	*o, err = enum.Parse("on-exit", s, OnExits...)
	return err
}

// DefaultSPOEListen is an abstract socket, so that the README's stanza
// (server agent1 abns@hapilot-spoe) reaches it from inside the chroot
// of Debian's and Ubuntu's stock haproxy.cfg; a unix@/run/... path would
// resolve inside /var/lib/haproxy and find nothing.
const DefaultSPOEListen = "abns@hapilot-spoe"

// Default is the configuration with every part's defaults.
func Default() Config {
	return Config{
		SPOEListen: DefaultSPOEListen, PeerGroup: "haproxy", HAProxySockets: []string{"/run/haproxy/admin.sock"},
		Loop: defaultLoop(), Window: 60 * time.Second, Policy: PolicyRules, MaxServers: 4096,
		MaxStatRows:  haproxy.DefaultMaxRows,
		StatusListen: "127.0.0.1:9310", LogFormat: LogAuto, LogLevel: "info", OnExit: OnExitKeep,
		ControlSocket: DefaultControlSocket,
		Stats:         counters.DefaultStatsConfig(),
		Guard:         guard.DefaultGuardrails(), Rules: rules.DefaultConfig(), Recovery: recovery.DefaultConfig(), LLM: llm.DefaultConfig(),
		Fleet: peers.DefaultConfig(), Notify: notify.DefaultConfig(),
	}
}

type multi struct {
	v   *[]string
	set bool
}

func (m *multi) String() string {
	if m == nil || m.v == nil { // flag's zero-value probe for -help
		return ""
	}
	return strings.Join(*m.v, ",")
}
func (m *multi) Set(s string) error {
	if !m.set { // the first explicit value replaces the default
		*m.v, m.set = nil, true
	}
	*m.v = append(*m.v, s)
	return nil
}

// Register defines the flags on fs, bound to the fields of a Config that
// holds the defaults (which the flags therefore show).
func Register(fs *flag.FlagSet) *Config {
	c := Default()
	fs.StringVar(&c.SPOEListen, "spoe-listen", c.SPOEListen, "where HAProxy's SPOE engine connects: abns@name (Linux's abstract namespace, reached from inside HAProxy's chroot; peers checked against peer-group), unix:/path (mode 0660; outside a chrooted HAProxy's reach), or host:port; \"off\" to disable")
	fs.StringVar(&c.LuaListen, "lua-listen", c.LuaListen, "where lua/hapilot.lua sends its batches (abns@name, unix:/path, mode 0660, or host:port); empty: off")
	fs.StringVar(&c.SyslogListen, "syslog-listen", c.SyslogListen, "HAProxy log lines in hapilot's log-format: abnsgram@name (log abns@name), udp://host:port, unixgram:///path, or abns@name, tcp://host:port or unix:///path for an HAProxy ring's forwarder; empty: off")
	fs.StringVar(&c.PeerGroup, "peer-group", c.PeerGroup, "besides the agent's own user and group and root, the group whose processes may send evidence to an abns@ socket (HAProxy's group); empty: none")
	fs.DurationVar(&c.Stats.Poll, "stats-poll", c.Stats.Poll, "read HAProxy's own per-server counters (show stat) this often, from every haproxy-socket: the whole telemetry with no stanza, or the retried attempts no per-response path sees (0: off)")
	fs.Var(&c.Stats.Mode, "stats-poll-mode", "what the counters feed: counts (every answer, 5xx and retry; no per-request detail), retries (retried attempts only, beside SPOE, Lua or logs) or auto (counts when spoe-listen is off and no lua-listen or syslog-listen is set, else retries)")
	fs.DurationVar(&c.Loop.EvidenceCheck, "evidence-check", c.Loop.EvidenceCheck, "check the windows this often between steps, and step at once when the policy's test first finds a server (rules only; 0: off)")
	fs.Var(&multi{v: &c.HAProxySockets}, "haproxy-socket", "HAProxy runtime socket with level admin (unix path, unix:/path, tcp:host:port); repeat for several HAProxy processes")
	fs.DurationVar(&c.Loop.Interval, "interval", c.Loop.Interval, "time between control-loop steps (at least 250ms)")
	fs.DurationVar(&c.Window, "window", c.Window, "length of the sliding windows (1 s buckets)")
	fs.Var(&c.Policy, "policy", "decision policy: "+enum.Join(Policies...))
	fs.StringVar(&c.PolicyFile, "policy-file", c.PolicyFile, "lua: the script defining decide(obs) (see examples/policies)")
	fs.IntVar(&c.MaxServers, "max-servers", c.MaxServers, "most backend/server series kept; events for more are counted and dropped")
	fs.IntVar(&c.MaxStatRows, "max-stat-rows", c.MaxStatRows, "most rows one reply of show stat or show servers state may hold (a row per server, backend and frontend); a longer reply is refused, and that step reads nothing")
	fs.StringVar(&c.StatusListen, "status-listen", c.StatusListen, "address of the read-only /status and /metrics endpoints (\"off\" to disable)")
	fs.StringVar(&c.StatusToken, "status-token", c.StatusToken, "token every request to the live page, /status, /series and /metrics must carry (Authorization: Bearer TOKEN, or ?token=TOKEN); required beyond loopback. Keep it in the config file (mode 0640), not on the command line")
	fs.StringVar(&c.AuditLog, "audit-log", c.AuditLog, "file that receives the event log: one JSON line per action, refusal, would-action, operator command (docs/reference/events.md)")
	fs.BoolVar(&c.AuditSteps, "audit-steps", c.AuditSteps, "also write every step's snapshot of every server to the audit log: one line per step holding every server, which grows with servers times steps")
	fs.Var(&c.LogFormat, "log-format", "log format: "+enum.Join(LogFormats...)+" (auto: console on a terminal, else JSON)")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug|info|warn|error")
	fs.StringVar(&c.Loop.StateFile, "state-file", c.Loop.StateFile, "file keeping the agent's own changes and pauses across its restarts, and what `hapilot restore` reads; auto: $STATE_DIRECTORY/state.json under systemd, else $XDG_STATE_HOME/hapilot/state.json (~/.local/state/hapilot/state.json); off: memory only, and a restarted agent reads its own drains as the operator's")
	fs.Var(&c.Loop.Mode, "mode", "enforce: send vetted actions to HAProxy; observe: run everything and send nothing, recording each action as a would-action (audit log, /status, metrics)")
	fs.StringVar(&c.ControlSocket, "control-socket", c.ControlSocket, "unix socket of `hapilot ctl` (unix:/path, mode 0660, the agent's user and group; \"off\" to disable): list, explain, release, pause, resume, restore")
	fs.Var(&multi{v: &c.Loop.HashBackends}, "hash-backends", "hash-balanced backends (balance uri, source, hdr, url_param, rdp-cookie, hash) the agent may govern; repeat it for each; every other one is left alone, since its servers see different request mixes")
	fs.DurationVar(&c.Loop.OperatorHold, "operator-hold", c.Loop.OperatorHold, "how long an operator's undo of the agent's change stands: the agent leaves that server alone until then, or until its state changes again")
	fs.DurationVar(&c.Loop.ReapplyWithin, "reapply-within", c.Loop.ReapplyWithin, "at start, a change from the state file that an HAProxy reload lost is applied again only if the file was written this recently, and only on the HAProxy it was made on; otherwise the server is judged afresh")
	fs.Var(&c.OnExit, "on-exit", "on SIGTERM: keep the agent's drains, or restore every server it changed: "+enum.Join(OnExits...))
	fs.Var(backendFlag{scope: &c.Guard.Scope, rules: &c.Rules}, "backend", "a backend's own settings, PATTERN.KEY=VALUE (repeatable; in the config file also `backend.PATTERN.KEY VALUE`): PATTERN is a name or a glob, KEY one of "+strings.Join(backendKeys(), ", ")+"; every block a backend matches applies, later over earlier; a rules key takes the values its flag takes")
	registerGuard(fs, &c.Guard)
	registerRecovery(fs, &c.Recovery)
	registerRules(fs, &c.Rules)
	fs.BoolVar(&c.Shadow, "shadow", c.Shadow, "the old spelling of --policy shadow: the model decides, the rules act, disagreements are audited")
	registerLLM(fs, &c.LLM)
	registerFleet(fs, &c.Fleet)
	fs.StringVar(&c.Notify.URL, "notify-webhook", c.Notify.URL, "URL that receives one JSON POST per action, refusal, release, fallback and telemetry silence (docs/howto/notifications.md); empty: off. It never blocks the loop: a slow or failing receiver costs dropped events, counted")
	fs.Var(&c.Notify.Format, "notify-format", "the webhook's payload: event (the event log's line), alertmanager (POST /api/v2/alerts) or slack (a chat incoming webhook's {\"text\"})")
	fs.DurationVar(&c.Notify.Timeout, "notify-timeout", c.Notify.Timeout, "the webhook: one attempt's timeout (4 attempts, backoff 1s doubling)")
	return &c
}

// commaList is a flag of comma-separated values, repeatable.
type commaList struct{ v *[]string }

func (l commaList) String() string {
	if l.v == nil {
		return ""
	}
	return strings.Join(*l.v, ",")
}

func (l commaList) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l.v = append(*l.v, p)
		}
	}
	return nil
}

func registerFleet(fs *flag.FlagSet, f *peers.Config) {
	fs.StringVar(&f.Bind, "fleet-bind", f.Bind, "fleet mode: where this agent talks to the other nodes' agents (host:port, UDP and TCP); empty: off")
	fs.Var(commaList{&f.Join}, "fleet-join", "fleet: peers to join, host:port[,host:port...]; tried again while one is not a member")
	fs.StringVar(&f.KeyFile, "fleet-key", f.KeyFile, "fleet: file holding the shared key (base64 of 16, 24 or 32 bytes; mode 0600): every message is encrypted and authenticated with it. `hapilot fleet-key FILE` writes one")
	fs.StringVar(&f.Name, "fleet-name", f.Name, "fleet: this node's name among its peers (default: the hostname)")
	fs.DurationVar(&f.Sync, "fleet-sync", f.Sync, "fleet: how often each agent sends its state and its windows' gains")
	fs.DurationVar(&f.Warmup, "fleet-warmup", f.Warmup, "fleet: an agent decides a backend only once it has been in the fleet this long (until then it follows, unless no one is warm): a restarted agent starts from the fleet's word, not an empty record")
	fs.DurationVar(&f.Timeout, "fleet-timeout", f.Timeout, "fleet: a peer silent this long is out of the picture: its backends pass to the next agent, and an agent that hears no one decides alone")
}

func registerGuard(fs *flag.FlagSet, g *guard.Guardrails) {
	fs.Var(capFlag{&g.MaxDrained}, "max-drained", "most servers the agent holds drained across every backend: a count, or a percentage of every server (0: no cap)")
	fs.IntVar(&g.DrainsPerHour, "max-drains-per-hour", g.DrainsPerHour, "most drains the agent sends to one backend in any hour (0: no cap)")
	fs.IntVar(&g.MinServing, "min-serving", g.MinServing, "fewest servers a backend is left serving (0: half, rounded up, at least one)")
	fs.Float64Var(&g.MaxUtilization, "max-utilization", g.MaxUtilization, "capacity-aware draining: where servers have maxconn, a drain may not push the others past this share of their throughput (0: off)")
}

func registerRecovery(fs *flag.FlagSet, r *recovery.Config) {
	fs.Var(&r.Mode, "readmit", "bring drained servers back: slowstart (a burst of the agent's own requests, then a weight ramp judged on live traffic by a sequential test, drained again at once when it says faulty) | probe (the burst, then a canary weight, the cooldown doubled after a failed burst) | canary (weight ramp only) | off")
	fs.StringVar(&r.Path, "probe-path", r.Path, "path of the probe requests")
	fs.StringVar(&r.Host, "probe-host", r.Host, "Host header of the probe requests (default: the server's address)")
	fs.Float64Var(&r.Rate, "probe-rate", r.Rate, "probe requests per second during a burst")
	fs.DurationVar(&r.Cooldown, "probe-cooldown", r.Cooldown, "first wait after a drain; doubled per new drain of the same server (and, with --readmit probe, per failed burst), capped at 10m")
	fs.Float64Var(&r.P99Guard, "p99-guard", r.P99Guard, "a drain that leaves the backend's p99 above this many times its level before, for --p99-guard-for and two steps at least, is undone to a reduced weight (0: off)")
	fs.DurationVar(&r.TailFor, "p99-guard-for", r.TailFor, "how long the p99 must stay over --p99-guard before a drain is undone (0: two steps)")
}

func registerRules(fs *flag.FlagSet, r *rules.Config) {
	fs.Float64Var(&r.Alpha, "rules-alpha", r.Alpha, "rules: the windowed test's false-drain probability per backend per step (the test the rules ran before the sequential one, which hapilot-bench soak --windowed still runs; no decision of the agent's rests on it)")
	fs.Uint64Var(&r.MinRequests, "rules-min-requests", r.MinRequests, "rules: fewest requests in the window before the windowed test judges a server, and before the LLM policy reads a drained server's window as healthy again")
	fs.Uint64Var(&r.MinErrors, "rules-min-errors", r.MinErrors, "rules: fewest 5xx before the windowed test finds a server")
	fs.Float64Var(&r.MinRatio, "rules-min-ratio", r.MinRatio, "rules: the windowed test's ratio: a server's 5xx rate must be at least this many times its peers'")
	fs.Float64Var(&r.LatencyRatio, "rules-latency-ratio", r.LatencyRatio, "rules: drain a server whose median answer time is this many times its peers' (0: judge 5xx only)")
	fs.IntVar(&r.LatencyMinMs, "rules-latency-min-ms", r.LatencyMinMs, "rules: ... and at least this many milliseconds above it")
	fs.Float64Var(&r.LatencyBaselineRatio, "rules-latency-baseline-ratio", r.LatencyBaselineRatio, "rules: ... and, once its own latency baseline is learned (10 minutes judged), this many times that baseline, so that a server always slower than its peers is not drained (0: the peers alone)")
	fs.Float64Var(&r.TailRatio, "rules-tail-ratio", r.TailRatio, "rules: drain a server whose share of slow answers has grown, an answer being slow at this many times the backend's p95 and --rules-latency-min-ms above it (0: off; the stats path's mean has no tail)")
	fs.Float64Var(&r.TailFloor, "rules-tail-floor", r.TailFloor, "rules: a server's slow share is degraded only above this (and --rules-degraded-ratio times its backend's healthy median share)")
	fs.Float64Var(&r.Floor, "rules-floor", r.Floor, "rules: a server is degraded only above this 5xx rate (and --rules-degraded-ratio times its backend's healthy median)")
	fs.Float64Var(&r.DegradedRatio, "rules-degraded-ratio", r.DegradedRatio, "rules: a server is degraded only at this many times its backend's healthy median 5xx rate (and above --rules-floor)")
	fs.Float64Var(&r.ARLDays, "rules-arl-days", r.ARLDays, "rules: mean days between false drains of one server the sequential test's threshold is set for")
	fs.Float64Var(&r.HealthyFloor, "rules-healthy-floor", r.HealthyFloor, "rules: a server failing at most this 5xx rate (or --rules-healthy-ratio times its backend's healthy median, the larger) is healthy: the false-drain promise holds for it, whatever the fleet's spread")
	fs.Float64Var(&r.HealthyRatio, "rules-healthy-ratio", r.HealthyRatio, "rules: ... and a server at most this many times its backend's healthy median; between healthy and degraded lies the zone, drained at most once a --rules-zone-every")
	fs.DurationVar(&r.MinDuration, "rules-min-duration", r.MinDuration, "rules: a burst of errors shorter than this, however large and however spread, never drains; a fault is found about this much later than without it, and about as much again on a server that had a burst forgiven in the last day, which has two bursts forgiven however close")
	fs.DurationVar(&r.ZoneEvery, "rules-zone-every", r.ZoneEvery, "rules: a server whose evidence never showed it degraded (in the zone) is drained at most once this often; condemned again sooner, it is left serving, with its reason on /status")
	fs.DurationVar(&r.BaselineSpan, "rules-baseline-span", r.BaselineSpan, "rules: time constant of each server's own long 5xx baseline")
}

func registerLLM(fs *flag.FlagSet, l *llm.Config) {
	fs.StringVar(&l.Model, "model", l.Model, "llm: the model's name on its server")
	fs.Var(&l.API, "llm-api", "llm: the model server's API: ollama (Ollama's native /api) | openai (/v1/chat/completions: llama-server, vLLM, SGLang, LM Studio, Ollama's /v1)")
	fs.StringVar(&l.URL, "llm-url", l.URL, "llm: the model server's base URL, required with --llm-api openai (default for ollama: $OLLAMA_HOST, as Ollama's client reads it)")
	fs.StringVar(&l.Host, "ollama-host", l.Host, "llm: Ollama's address, the native API's alias of --llm-url")
	fs.StringVar(&l.KeyFile, "llm-key-file", l.KeyFile, "llm: file holding the model server's API key (one line; mode 0600), sent as \"Authorization: Bearer\"")
	fs.Var(&l.Think, "think", "llm: thinking, always sent explicitly: "+enum.Join(modelapi.Thinks...))
	fs.IntVar(&l.NumPredict, "num-predict", l.NumPredict, "llm: the answer's token cap per call")
	fs.IntVar(&l.ThinkBudget, "think-budget", l.ThinkBudget, "llm: thinking's own tokens, added to num-predict when thinking is on")
	fs.IntVar(&l.NumCtx, "num-ctx", l.NumCtx, "llm: the model's context in tokens (0: sized from the prompt, grown after an overflow, capped by the model's own); with --llm-api openai, the server's own context where it does not say it (llama-server's /props does)")
	fs.IntVar(&l.NumThread, "num-thread", l.NumThread, "llm, native API: Ollama's num_thread, the threads its runner computes on (0: Ollama's default, every physical core); fewer than the node's cores keep the model from fighting HAProxy for them")
	fs.DurationVar(&l.KeepAlive, "keep-alive", l.KeepAlive, "llm: how long Ollama keeps the model loaded after a call (negative: for good)")
	fs.DurationVar(&l.LoadTimeout, "llm-load-timeout", l.LoadTimeout, "llm: the longest a load or a call may run in the background")
	fs.IntVar(&l.TokenBudget, "token-budget", l.TokenBudget, "llm: a thinking call over this many completion tokens, cut at its cap, or over the deadline switches thinking off for a while")
	fs.StringVar(&l.SystemPromptFile, "system-prompt", l.SystemPromptFile, "llm: file replacing the embedded system prompt")
	fs.Var(&l.Prompt, "llm-prompt", "llm: the prompt's form: full | compact (for small models: a short system prompt and the columns that decide) | numbered (compact, with a reference on every row that the reply names instead of the server: hapilot's own model reads it) (default: the form the model names in its GGUF metadata, general.hapilot.prompt_form, as hapilot's own models do; else full)")
	fs.IntVar(&l.Confirm, "confirm", l.Confirm, "llm: consecutive steps that must propose an action before it runs")
	fs.DurationVar(&l.MinHold, "min-hold", l.MinHold, "llm: readying a server drained less than this long ago needs evidence from the windows")
	fs.Var(&l.Gate, "llm-gate", "llm: anomaly (call the model only when the windows show a candidate) | always")
	fs.DurationVar(&l.Deadline, "llm-deadline", l.Deadline, "llm: a deadline for each call tighter than the step's own (0: the step's, 80% of the interval)")
	fs.BoolVar(&l.SkipCalibration, "skip-calibration", l.SkipCalibration, "llm: let a model act without a passing calibration record")
	fs.StringVar(&l.CalibrationDir, "calibration-dir", l.CalibrationDir, "llm: where `hapilot calibrate` keeps its records")
}

// Parse reads args into fs; a --config FILE names a file of `name value`
// lines (flag names without dashes, # comments) applied first, so that the
// command line wins. Unknown names in the file are errors.
func Parse(fs *flag.FlagSet, args []string) error {
	var file string
	fs.StringVar(&file, "config", "", "`file` of settings, one \"name value\" per line, names as these flags without dashes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if file == "" {
		return nil
	}
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	return applyFile(fs, file, explicit)
}

// capFlag is --max-drained.
type capFlag struct{ c *guard.Cap }

func (f capFlag) String() string {
	if f.c == nil {
		return "0"
	}
	return f.c.String()
}

func (f capFlag) Set(s string) (err error) {
	*f.c, err = guard.ParseCap(s)
	return err
}

// backendKeys are every key a backend block may set: the guardrails'
// and the rules'.
func backendKeys() []string {
	return append(append([]string{}, guard.BackendKeys...), rules.OverrideKeys...)
}

// backendFlag is --backend: each key goes to the part that owns it, the
// rules' keys to the rules' blocks (validated with the rules' flags, by
// rules.Config.Validate), the others to the guardrails' scope. A block
// of rules keys only is declared in the scope too, so that /status
// lists it among the blocks a backend matched.
type backendFlag struct {
	scope *guard.Scope
	rules *rules.Config // its Blocks, made at the first rules key
}

func (f backendFlag) String() string {
	if f.scope == nil {
		return ""
	}
	return f.scope.String()
}

func (f backendFlag) Set(v string) error {
	pattern, key, value, err := guard.SplitBackend(v)
	if err != nil {
		return fmt.Errorf("%w (keys: %s)", err, strings.Join(backendKeys(), ", "))
	}
	if rules.IsOverrideKey(key) {
		if f.rules.Blocks == nil {
			f.rules.Blocks = &rules.Blocks{}
		}
		if err := f.rules.Blocks.Set(pattern, key, value); err != nil {
			return fmt.Errorf("backend %s: %w", pattern, err)
		}
		return f.scope.Declare(pattern)
	}
	for _, k := range guard.BackendKeys {
		if k == key {
			return f.scope.SetKey(pattern, key, value)
		}
	}
	return fmt.Errorf("backend %s: unknown key %q (keys: %s)", pattern, key, strings.Join(backendKeys(), ", "))
}

// backendLine turns a `backend.PATTERN.KEY VALUE` line of the config
// file into the --backend flag's PATTERN.KEY=VALUE: the file keeps its
// one-setting-per-line form, and the flag parses every block the same
// way, unknown keys included.
func backendLine(name, value string) (string, string, bool) {
	rest, ok := strings.CutPrefix(name, "backend.")
	if !ok {
		return name, value, false
	}
	return "backend", rest + "=" + value, true
}

// retired names settings the agent no longer has, with the one value that
// meant what the agent now always does: a config file written for an
// older agent with that value still loads (the line changes nothing),
// and any other value is refused with the reason, so that an upgrade
// neither stops an agent that kept a default nor silently drops a choice.
var retired = map[string]struct{ same, why string }{
	"rules-burst-cap":    {same: "0.25", why: "the minimum duration (--rules-min-duration) replaced the burst cap: a burst shorter than it never drains, whatever its size"},
	"rules-burst-errors": {same: "10", why: "the minimum duration (--rules-min-duration) replaced the burst allowance: a burst shorter than it never drains, whatever its size"},
	"fallback":           {same: "rules", why: "the rules are always the LLM policy's fallback; `fallback none` (the study's unguarded loop) is the lab's, hapilot-bench's, not the agent's"},
}

func applyFile(fs *flag.FlagSet, path string, skip map[string]bool) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), MaxConfigLine)
	n := 1
	for ; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.IndexAny(line, " \t=")
		if i <= 0 {
			return fmt.Errorf("config %s:%d: want `name value`, got %q", path, n, line)
		}
		name := line[:i]
		value := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line[i:]), "="))
		if value == "" {
			return fmt.Errorf("config %s:%d: %s has no value", path, n, name)
		}
		name, value, _ = backendLine(name, value)
		if r, ok := retired[name]; ok && fs.Lookup(name) == nil {
			if value == r.same {
				continue
			}
			return fmt.Errorf("config %s:%d: %s %s: the setting was removed: %s", path, n, name, value, r.why)
		}
		if name == "config" || fs.Lookup(name) == nil {
			return fmt.Errorf("config %s:%d: unknown setting %q", path, n, name)
		}
		if skip[name] {
			continue
		}
		if err := fs.Set(name, value); err != nil {
			return fmt.Errorf("config %s:%d: %s: %w", path, n, name, err)
		}
	}
	if errors.Is(sc.Err(), bufio.ErrTooLong) {
		return fmt.Errorf("config %s:%d: line over %d bytes: a setting's line is far shorter; is this the settings file?", path, n, MaxConfigLine)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("config %s:%d: %w", path, n, err)
	}
	return nil
}

// MaxConfigLine bounds one line of the settings file: the longest
// setting (a backend block's leave-alone list, a URL) is far shorter.
const MaxConfigLine = 64 << 10

// Validate checks the settings together: this struct's own, then each
// part's through its own Validate.
func (c *Config) Validate() error {
	errs := []error{c.Loop.Validate()}
	if c.Window < time.Second || c.Window > MaxWindow {
		errs = append(errs, fmt.Errorf("window %v: want 1s to %v", c.Window, MaxWindow))
	}
	if mem := window.BytesPerSeries(c.Window) * int64(max(c.MaxServers, 1)); mem > MaxWindowMemory {
		errs = append(errs, fmt.Errorf("window %v for max-servers %d would hold up to %d MiB of buckets, over the %d MiB allowed: a shorter window or fewer servers",
			c.Window, c.MaxServers, mem>>20, MaxWindowMemory>>20))
	}
	if _, err := enum.Parse("policy", string(c.Policy), Policies...); err != nil {
		errs = append(errs, err)
	}
	if c.MaxServers < 1 {
		errs = append(errs, fmt.Errorf("max-servers %d must be positive", c.MaxServers))
	}
	// A server needs a row in each reply, and a bound past a million rows
	// bounds nothing a step could read in time.
	if c.MaxStatRows < c.MaxServers || c.MaxStatRows > MaxStatRows {
		errs = append(errs, fmt.Errorf("max-stat-rows %d: want from max-servers (%d) to %d", c.MaxStatRows, c.MaxServers, MaxStatRows))
	}
	if len(c.HAProxySockets) == 0 {
		errs = append(errs, errors.New("no haproxy-socket"))
	}
	for _, s := range c.HAProxySockets {
		if _, err := haproxy.New(s); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, c.checkListeners()...)
	if _, err := enum.Parse("on-exit", string(c.OnExit), OnExits...); err != nil {
		errs = append(errs, err)
	}
	if _, err := enum.Parse("log-format", string(c.LogFormat), LogFormats...); err != nil {
		errs = append(errs, err)
	}
	if _, err := zerolog.ParseLevel(c.LogLevel); err != nil || c.LogLevel == "" {
		errs = append(errs, fmt.Errorf("log-level %q: want debug|info|warn|error", c.LogLevel))
	}
	if _, err := netx.ParseAddress("control-socket", c.ControlSocket, netx.Unix); err != nil {
		errs = append(errs, err)
	}
	if c.Policy == PolicyLua && c.PolicyFile == "" {
		errs = append(errs, errors.New("--policy lua needs --policy-file"))
	}
	if c.Shadow && c.Policy != PolicyRules && c.Policy != PolicyShadow {
		errs = append(errs, fmt.Errorf("--shadow contradicts --policy %s: shadow mode is its own policy, --policy shadow (the model decides, the rules act)", c.Policy))
	}
	errs = append(errs, c.Notify.Validate(), c.Fleet.Validate(), c.Stats.Validate(), c.Guard.Validate(), c.Rules.Validate(), c.Recovery.Validate())
	if c.UsesModel() {
		errs = append(errs, c.LLM.Validate())
	}
	return errors.Join(errs...)
}

// StatsMode is the stats path's mode with auto resolved: the counters are
// the whole telemetry when no per-response path listens, else they add
// the retried attempts those paths cannot see.
func (c Config) StatsMode() counters.StatMode {
	if c.Stats.Mode != counters.StatAuto {
		return c.Stats.Mode
	}
	if l, _ := c.Listeners(); l.SPOE.Off() && l.Lua.Off() && l.Syslog.Off() {
		return counters.StatCounts
	}
	return counters.StatRetries
}

// StatsUnseen are the failure classes the stats path records beside the
// per-response paths (counters.StatPoller.Unseen): retries and aborts,
// which none sees, and HAProxy's own 502/503/504 unless the Lua companion
// or the logs listen, which see them (the SPOE stanza's http-response
// rule does not run for them).
func (c Config) StatsUnseen() []window.Fail {
	if l, _ := c.Listeners(); l.Lua.Off() && l.Syslog.Off() {
		return nil // all of them
	}
	return []window.Fail{window.FailRetry, window.FailAbort}
}

// Listeners are the listen settings, parsed: each is an address or off.
type Listeners struct {
	SPOE, Lua, Syslog, Status netx.Address
}

// Listeners parses every listen setting the one way netx.ParseAddress
// reads them ("off" and "" alike turn any of them off).
func (c Config) Listeners() (Listeners, error) {
	var l Listeners
	var errs []error
	parse := func(dst *netx.Address, flag, s string, allowed ...netx.Network) {
		a, err := netx.ParseAddress(flag, s, allowed...)
		errs = append(errs, err)
		*dst = a
	}
	parse(&l.SPOE, "spoe-listen", c.SPOEListen, netx.TCP, netx.Unix, netx.Abstract)
	parse(&l.Lua, "lua-listen", c.LuaListen, netx.TCP, netx.Unix, netx.Abstract)
	// Log lines name their transport: a bare host:port could be either.
	if c.SyslogListen != "" && c.SyslogListen != "off" && !strings.Contains(c.SyslogListen, "://") && !strings.HasPrefix(c.SyslogListen, "abns") {
		errs = append(errs, fmt.Errorf("syslog-listen %q: want abnsgram@name, udp://host:port, unixgram:///path, abns@name, tcp://host:port or unix:///path", c.SyslogListen))
	} else {
		parse(&l.Syslog, "syslog-listen", c.SyslogListen, netx.UDP, netx.Unixgram, netx.AbstractGram, netx.TCP, netx.Unix, netx.Abstract)
	}
	parse(&l.Status, "status-listen", c.StatusListen, netx.TCP)
	return l, errors.Join(errs...)
}

func (c *Config) checkListeners() []error {
	l, err := c.Listeners()
	if err != nil {
		return []error{err}
	}
	if !l.Status.Off() && c.StatusToken == "" && !netx.IsLoopback(l.Status.Addr) {
		return []error{fmt.Errorf("status-listen %s is beyond loopback: set status-token too, since the page and /status show the servers' addresses and the agent's decisions", c.StatusListen)}
	}
	return nil
}

// WriteFile writes a settings file holding every setting of fs, commented
// out at its default with its usage above it: the file a package installs,
// in which an operator uncomments what they change. The active lines, if
// any, come first, after the header.
func WriteFile(w io.Writer, fs *flag.FlagSet, header string, active ...string) error {
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimSpace(header), "\n") {
		b.WriteString(strings.TrimRight("# "+line, " ") + "\n")
	}
	for _, line := range active {
		b.WriteString(line + "\n")
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "config" {
			return
		}
		b.WriteString("\n")
		for _, line := range wrap(f.Usage, 76) {
			b.WriteString("# " + line + "\n")
		}
		value := f.DefValue
		if value == "" {
			b.WriteString("#" + f.Name + "\n")
			return
		}
		if strings.ContainsAny(value, "\n") {
			err = fmt.Errorf("config: default of %s holds a newline", f.Name)
		}
		b.WriteString("#" + f.Name + " " + value + "\n")
	})
	if err != nil {
		return err
	}
	_, err = io.WriteString(w, b.String())
	return err
}

// wrap breaks s into lines of at most width bytes at spaces.
func wrap(s string, width int) []string {
	var out []string
	line := ""
	for _, word := range strings.Fields(s) {
		if line != "" && len(line)+1+len(word) > width {
			out = append(out, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	if line != "" {
		out = append(out, line)
	}
	return out
}

// DefaultControlSocket is where the agent listens for `hapilot ctl`,
// beside its SPOE socket in the unit's RuntimeDirectory.
const DefaultControlSocket = "unix:/run/hapilot/ctl.sock"

// StateAuto and StateOff are --state-file's words: the default place, or
// none.
const (
	StateAuto = "auto"
	StateOff  = "off"
)

// StateFile is the state file's path, auto resolved ("" for none). The
// default is a persistent, per-user place, as the package's
// /var/lib/hapilot is: systemd's StateDirectory when the agent runs
// under a unit that has one, else the XDG state directory
// ($XDG_STATE_HOME, ~/.local/state). Not the runtime directory: it is
// emptied at reboot, and with it the agent's record of the drains
// HAProxy may still hold (a server-state-file keeps them). The auto
// folder is made (0750) when missing.
func (c Config) StateFile() (string, error) {
	file, err := c.StateFileIn(os.Getenv)
	if err != nil || file == "" || c.Loop.StateFile != StateAuto {
		return file, err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o750); err != nil {
		return "", fmt.Errorf("state-file auto: %w", err)
	}
	return file, nil
}

// StateFileIn is the state file's path as a process whose environment
// getenv reads resolves it, making nothing: `hapilot stop` finds another
// agent's file with it. ($HOME is what os.UserHomeDir reads on Unix.)
func (c Config) StateFileIn(getenv func(string) string) (string, error) {
	switch c.Loop.StateFile {
	case "", StateOff:
		return "", nil
	case StateAuto:
	default:
		return c.Loop.StateFile, nil
	}
	dir := ""
	if sd := getenv("STATE_DIRECTORY"); sd != "" {
		dir, _, _ = strings.Cut(sd, ":") // systemd lists each StateDirectory, colon-separated
	} else if x := getenv("XDG_STATE_HOME"); x != "" {
		dir = filepath.Join(x, "hapilot")
	} else if home := getenv("HOME"); home != "" {
		dir = filepath.Join(home, ".local", "state", "hapilot")
	} else {
		return "", fmt.Errorf("state-file auto: no $STATE_DIRECTORY, $XDG_STATE_HOME or home directory: name a file, or off")
	}
	return filepath.Join(dir, "state.json"), nil
}

// defaultLoop is the loop's defaults with the state file auto.
func defaultLoop() agent.Settings {
	s := agent.DefaultSettings()
	s.StateFile = StateAuto
	return s
}
