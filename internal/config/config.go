// Package config holds hapilot's settings: flags, an optional config file
// of the same names, and their validation.
package config

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/hapilot/hapilot/agent/recovery"
	"github.com/hapilot/hapilot/agent/rules"
	"github.com/hapilot/hapilot/haproxy"
)

// Config is everything `hapilot run` takes.
type Config struct {
	SPOEListen     string
	LuaListen      string
	SyslogListen   string
	HAProxySockets []string
	Interval       time.Duration
	Window         time.Duration
	Policy         string
	PolicyFile     string
	MaxServers     int
	MinServing     int
	StatusListen   string
	AuditLog       string
	LogFormat      string
	LogLevel       string
	Rules          rules.Config
	LLM            LLM
	StateFile      string
	OnExit         string
	Readmit        string
	Recovery       recovery.Config
	MaxUtilization float64
}

// LLM holds the settings of --policy llm and --shadow.
type LLM struct {
	Model           string
	OllamaHost      string
	Think           string
	NumPredict      int
	TokenBudget     int
	SystemPrompt    string
	Confirm         int
	MinHold         time.Duration
	Gate            string
	Deadline        time.Duration
	Fallback        string
	Shadow          bool
	SkipCalibration bool
	CalibrationDir  string
	// Unprotected switches off every fix hapilot puts around the model,
	// for the benchmark's side-by-side runs (the study's loop).
	Unprotected bool
}

// LLMDeadline is the model's deadline: --llm-deadline, or 80% of the interval.
func (c *Config) LLMDeadline() time.Duration {
	if c.LLM.Deadline > 0 {
		return c.LLM.Deadline
	}
	return c.Interval * 8 / 10
}

// Policies lists the policies this build knows.
var Policies = []string{"static", "rules", "llm", "lua"}

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

// Register defines the flags on fs, with their defaults in c.
func Register(fs *flag.FlagSet) *Config {
	c := &Config{HAProxySockets: []string{"/run/haproxy/admin.sock"}, Rules: rules.DefaultConfig()}
	fs.StringVar(&c.SPOEListen, "spoe-listen", "127.0.0.1:12345", "where HAProxy's SPOE engine connects (host:port or unix:/path; \"off\" to disable)")
	fs.StringVar(&c.LuaListen, "lua-listen", "", "where lua/hapilot.lua sends its batches (host:port); empty: off")
	fs.StringVar(&c.SyslogListen, "syslog-listen", "", "HAProxy log lines in hapilot's log-format: udp://host:port, unixgram:///path, or tcp://host:port for an HAProxy ring's forwarder; empty: off")
	fs.Var(&multi{v: &c.HAProxySockets}, "haproxy-socket", "HAProxy runtime socket with level admin (unix path, unix:/path, tcp:host:port); repeat for several HAProxy processes")
	fs.DurationVar(&c.Interval, "interval", 10*time.Second, "time between control-loop steps (at least 250ms)")
	fs.DurationVar(&c.Window, "window", 60*time.Second, "length of the sliding windows (1 s buckets)")
	fs.StringVar(&c.Policy, "policy", "rules", "decision policy: "+strings.Join(Policies, "|"))
	fs.StringVar(&c.PolicyFile, "policy-file", "", "lua: the script defining decide(obs) (see examples/policies)")
	fs.IntVar(&c.MaxServers, "max-servers", 4096, "most backend/server series kept; events for more are counted and dropped")
	fs.IntVar(&c.MinServing, "min-serving", 0, "fewest servers a backend is left serving (0: half, rounded up, at least one)")
	fs.StringVar(&c.StatusListen, "status-listen", "127.0.0.1:9310", "address of the read-only /status and /metrics endpoints (\"off\" to disable)")
	fs.StringVar(&c.AuditLog, "audit-log", "", "file that receives one JSON line per control-loop step")
	fs.StringVar(&c.LogFormat, "log-format", "auto", "auto (console on a terminal, else JSON) | json | console")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug|info|warn|error")
	fs.StringVar(&c.StateFile, "state-file", "", "file keeping the agent's own changes across its restarts (\"\": memory only)")
	fs.StringVar(&c.OnExit, "on-exit", "keep", "on SIGTERM: keep the agent's drains, or restore every server it changed")
	c.Recovery = recovery.DefaultConfig()
	r := &c.Recovery
	fs.StringVar(&c.Readmit, "readmit", "probe", "bring drained servers back: probe (a burst of the agent's own requests, then a canary weight) | canary (weight ramp only) | off")
	fs.StringVar(&r.Path, "probe-path", r.Path, "path of the probe requests")
	fs.StringVar(&r.Host, "probe-host", r.Host, "Host header of the probe requests (default: the server's address)")
	fs.Float64Var(&r.Rate, "probe-rate", r.Rate, "probe requests per second during a burst")
	fs.DurationVar(&r.Cooldown, "probe-cooldown", r.Cooldown, "first wait after a drain; doubled per failed burst or new drain, capped at 10m")
	fs.Float64Var(&r.P99Guard, "p99-guard", r.P99Guard, "a drain that leaves the backend's p99 above this many times its level before, two steps running, is undone to a reduced weight (0: off)")
	fs.Float64Var(&c.MaxUtilization, "max-utilization", 0.85, "capacity-aware draining: where servers have maxconn, a drain may not push the others past this share of their throughput (0: off)")
	fs.Float64Var(&c.Rules.Alpha, "rules-alpha", c.Rules.Alpha, "rules: false-drain probability per backend per step")
	fs.Uint64Var(&c.Rules.MinRequests, "rules-min-requests", c.Rules.MinRequests, "rules: fewest requests in the window before a server is judged")
	fs.Uint64Var(&c.Rules.MinErrors, "rules-min-errors", c.Rules.MinErrors, "rules: fewest 5xx before a server may be drained")
	fs.Float64Var(&c.Rules.MinRatio, "rules-min-ratio", c.Rules.MinRatio, "rules: a server's 5xx rate must be at least this many times its peers'")
	fs.Float64Var(&c.Rules.LatencyRatio, "rules-latency-ratio", c.Rules.LatencyRatio, "rules: drain a server whose median answer time is this many times its peers' (0: judge 5xx only)")
	fs.IntVar(&c.Rules.LatencyMinMs, "rules-latency-min-ms", c.Rules.LatencyMinMs, "rules: ... and at least this many milliseconds above it")
	l := &c.LLM
	fs.StringVar(&l.Model, "model", "", "llm: Ollama model name")
	fs.StringVar(&l.OllamaHost, "ollama-host", "", "llm: Ollama's address (default: $OLLAMA_HOST, as Ollama's client reads it)")
	fs.StringVar(&l.Think, "think", "off", "llm: thinking, always sent explicitly: off|on|low|medium|high")
	fs.IntVar(&l.NumPredict, "num-predict", 256, "llm: completion token cap per call")
	fs.IntVar(&l.TokenBudget, "token-budget", 512, "llm: a thinking reply over this many completion tokens switches thinking off for a while")
	fs.StringVar(&l.SystemPrompt, "system-prompt", "", "llm: file replacing the embedded system prompt")
	fs.IntVar(&l.Confirm, "confirm", 2, "llm: consecutive steps that must propose an action before it runs")
	fs.DurationVar(&l.MinHold, "min-hold", time.Minute, "llm: readying a server drained less than this long ago needs evidence from the windows")
	fs.StringVar(&l.Gate, "llm-gate", "anomaly", "llm: anomaly (call the model only when the windows show a candidate) | always")
	fs.DurationVar(&l.Deadline, "llm-deadline", 0, "llm: deadline of each call (0: 80% of the interval)")
	fs.StringVar(&l.Fallback, "fallback", "rules", "llm: policy for a step whose call failed or overran: rules|none")
	fs.BoolVar(&l.Shadow, "shadow", false, "llm: the model decides, the rules act, disagreements are audited")
	fs.BoolVar(&l.SkipCalibration, "skip-calibration", false, "llm: let a model act without a passing calibration record")
	fs.BoolVar(&l.Unprotected, "unprotected", false, "llm, research only: the study's loop, without hapilot's fixes (calibration gate, confirmation, hold, anomaly gate, evidence check, deadlines, cost-aware thinking), to measure what they buy")
	fs.StringVar(&l.CalibrationDir, "calibration-dir", "/var/lib/hapilot", "llm: where `hapilot calibrate` keeps its records")
	return c
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

func applyFile(fs *flag.FlagSet, path string, skip map[string]bool) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
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
	return sc.Err()
}

// Validate checks the settings together.
func (c *Config) Validate() error {
	var errs []error
	if c.Interval < 250*time.Millisecond {
		errs = append(errs, fmt.Errorf("interval %v is below 250ms", c.Interval))
	}
	if c.Window < time.Second {
		errs = append(errs, fmt.Errorf("window %v is below 1s", c.Window))
	}
	known := false
	for _, p := range Policies {
		known = known || p == c.Policy
	}
	if !known {
		errs = append(errs, fmt.Errorf("unknown policy %q (want %s)", c.Policy, strings.Join(Policies, "|")))
	}
	if c.MaxServers < 1 {
		errs = append(errs, fmt.Errorf("max-servers %d must be positive", c.MaxServers))
	}
	if c.MinServing < 0 {
		errs = append(errs, fmt.Errorf("min-serving %d is negative", c.MinServing))
	}
	if len(c.HAProxySockets) == 0 {
		errs = append(errs, errors.New("no haproxy-socket"))
	}
	for _, s := range c.HAProxySockets {
		if _, err := haproxy.New(s); err != nil {
			errs = append(errs, err)
		}
	}
	if c.SPOEListen != "off" {
		if err := checkAddr("spoe-listen", c.SPOEListen, true); err != nil {
			errs = append(errs, err)
		}
	}
	if c.LuaListen != "" {
		if err := checkAddr("lua-listen", c.LuaListen, false); err != nil {
			errs = append(errs, err)
		}
	}
	if c.SyslogListen != "" && !strings.HasPrefix(c.SyslogListen, "udp://") && !strings.HasPrefix(c.SyslogListen, "unixgram://") && !strings.HasPrefix(c.SyslogListen, "tcp://") {
		errs = append(errs, fmt.Errorf("syslog-listen %q: want udp://host:port, unixgram:///path or tcp://host:port", c.SyslogListen))
	}
	if c.StatusListen != "off" {
		if err := checkAddr("status-listen", c.StatusListen, false); err != nil {
			errs = append(errs, err)
		}
	}
	switch c.Readmit {
	case "probe", "canary", "off":
	default:
		errs = append(errs, fmt.Errorf("readmit %q: want probe|canary|off", c.Readmit))
	}
	if c.MaxUtilization < 0 || c.MaxUtilization > 1 || c.Recovery.P99Guard < 0 {
		errs = append(errs, fmt.Errorf("max-utilization must be in [0, 1] and p99-guard not negative"))
	}
	if c.Recovery.Rate <= 0 || c.Recovery.Cooldown <= 0 {
		errs = append(errs, fmt.Errorf("probe-rate and probe-cooldown must be positive"))
	}
	if c.OnExit != "keep" && c.OnExit != "restore" {
		errs = append(errs, fmt.Errorf("on-exit %q: want keep|restore", c.OnExit))
	}
	switch c.LogFormat {
	case "auto", "json", "console":
	default:
		errs = append(errs, fmt.Errorf("log-format %q: want auto|json|console", c.LogFormat))
	}
	r := c.Rules
	if r.Alpha <= 0 || r.Alpha >= 1 {
		errs = append(errs, fmt.Errorf("rules-alpha %v outside (0, 1)", r.Alpha))
	}
	if r.MinRatio < 1 {
		errs = append(errs, fmt.Errorf("rules-min-ratio %v below 1", r.MinRatio))
	}
	if c.Policy == "lua" && c.PolicyFile == "" {
		errs = append(errs, errors.New("--policy lua needs --policy-file"))
	}
	if c.Policy == "llm" || c.LLM.Shadow {
		errs = append(errs, c.LLM.validate()...)
	}
	return errors.Join(errs...)
}

func (l *LLM) validate() []error {
	var errs []error
	if l.Model == "" {
		errs = append(errs, errors.New("llm: --model is required"))
	}
	switch l.Think {
	case "off", "on", "low", "medium", "high":
	default:
		errs = append(errs, fmt.Errorf("think %q: want off|on|low|medium|high", l.Think))
	}
	switch l.Gate {
	case "anomaly", "always":
	default:
		errs = append(errs, fmt.Errorf("llm-gate %q: want anomaly|always", l.Gate))
	}
	switch l.Fallback {
	case "rules", "none":
	default:
		errs = append(errs, fmt.Errorf("fallback %q: want rules|none", l.Fallback))
	}
	if l.Confirm < 1 {
		errs = append(errs, fmt.Errorf("confirm %d: at least 1", l.Confirm))
	}
	if l.NumPredict < 1 {
		errs = append(errs, fmt.Errorf("num-predict %d: at least 1", l.NumPredict))
	}
	return errs
}

func checkAddr(name, addr string, unixOK bool) error {
	if unixOK && strings.HasPrefix(addr, "unix:") && len(addr) > 5 {
		return nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("%s %q: %w", name, addr, err)
	}
	return nil
}
