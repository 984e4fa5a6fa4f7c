// Package fleet is the test fleet: fault-injecting HTTP backends, an
// open-loop load generator, and the HAProxy config that puts them behind
// the example stanza. Tests, the demo and the benchmark share it.
package fleet

import (
	"fmt"
	"github.com/hapilot/hapilot/spoe"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/hapilot/hapilot/examples"
	hapilotlua "github.com/hapilot/hapilot/lua"
)

// HAProxyOptions describe one generated HAProxy.
type HAProxyOptions struct {
	Dir          string   // where the config, SPOE file and socket go
	FrontendPort int      // client traffic
	Servers      []string // backend addresses, named srv1..srvN in "app"
	Algo         string   // roundrobin (default) or leastconn
	// AgentAddr is where the hapilot agent listens for SPOE; empty means
	// no SPOE stanza at all (plain HAProxy).
	AgentAddr string
	// LuaAgent (host:port) adds the Lua companion's stanza from
	// examples/haproxy-lua.cfg; SyslogAddr (host:port, UDP) the log
	// stanza from examples/haproxy-syslog.cfg.
	LuaAgent   string
	SyslogAddr string
	// SyslogRing (host:port, TCP) adds examples/haproxy-syslog-ring.cfg:
	// logs batched through a ring forwarded to the agent.
	SyslogRing string
	// Weight is every server's configured weight; 0 leaves HAProxy's 1.
	Weight int
	// MaxConn is every server's maxconn (HAProxy queues beyond it); 0 none.
	MaxConn int
	// Sample, with AgentAddr, uses the sampled stanza
	// (examples/haproxy-sampled.cfg) with this k: every 5xx and one in k
	// other answers. 0 or 1 is the full stanza.
	Sample int
	// Retries gives the backend the retries many operators set on
	// idempotent services: retry-on 500 502 503 504, retries 2, option
	// redispatch 1. Each response then carries HAProxy's retry count in
	// RetriesHeader.
	Retries bool
	// Redispatch gives the backend what operators set in front of servers
	// that may hang, reset or refuse (issue 42's setup): option
	// http-server-close, retries 3, option redispatch and timeout server
	// 2s. HAProxy then answers a hang with its own 504 and sends a refused
	// connection's last retry to another server.
	Redispatch bool
	// SocketGroup gives the admin socket `mode 660 group SocketGroup`, as
	// Debian's HAProxy has it (group haproxy); "" keeps mode 600.
	SocketGroup string
	// Threads is HAProxy's nbthread; 0 means 1, which keeps one core for
	// the load generator and backends on a small machine.
	Threads int
	// ServerOptions are appended to every server line (the benchmark's
	// haproxy-l7 baseline: "check observe layer7 error-limit 10 on-error
	// mark-down"); HTTPCheck gives the backend `option httpchk GET /`, so
	// that those checks are HTTP requests.
	ServerOptions string
	HTTPCheck     bool
	// SPOETime, with AgentAddr, has HAProxy report how long the SPOE held
	// each response (the engine's `option set-total-time`, in ms) in
	// SPOETimeHeader, absent where the SPOE was not consulted: what a test
	// of a dead or slow agent must read, since the client's latency also
	// holds every stall of a loaded machine.
	SPOETime bool
	// StockGlobal, when set, is a distribution's haproxy.cfg whose global
	// section is used as it is (chroot, user, group and all), but for its
	// stats socket's path, which becomes Socket(): what operators deploy.
	StockGlobal string
}

// SPOETimeHeader is where a config with HAProxyOptions.SPOETime puts the
// milliseconds the SPOE added to the response.
const SPOETimeHeader = "X-Hapilot-Spoe-Ms"

// spoeTimeVar is the engine's variable for set-total-time; the stanza's
// `option var-prefix hapilot` puts it at txn.hapilot.<name>.
const spoeTimeVar = "spoe_ms"

// Backend is the backend name the generated config uses.
const BackendName = "app"

// ServerName is the name of the i-th server (0-based).
func ServerName(i int) string { return fmt.Sprintf("srv%d", i+1) }

// Socket is the runtime socket path of a generated config.
func (o HAProxyOptions) Socket() string { return filepath.Join(o.Dir, "admin.sock") }

// GlobalLines are the directives of cfg's global section, indented by
// spaces or tabs (Debian's file uses tabs), comments left out.
func GlobalLines(cfg string) []string {
	var out []string
	in := false
	for _, line := range strings.Split(cfg, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || trimmed[0] == '#' {
			continue
		}
		if line[0] != ' ' && line[0] != '\t' {
			in = trimmed == "global"
			continue
		}
		if in {
			out = append(out, trimmed)
		}
	}
	return out
}

// HAProxyConfig writes the SPOE file (when needed) and returns haproxy.cfg.
func HAProxyConfig(o HAProxyOptions) (string, error) {
	algo := o.Algo
	if algo == "" {
		algo = "roundrobin"
	}
	threads := max(o.Threads, 1)
	var b strings.Builder
	perm := "mode 600"
	if o.SocketGroup != "" {
		perm = "mode 660 group " + o.SocketGroup
	}
	if o.StockGlobal != "" {
		b.WriteString("global\n")
		for _, l := range GlobalLines(o.StockGlobal) {
			if f := strings.Fields(l); len(f) > 2 && f[0] == "stats" && f[1] == "socket" {
				l = "stats socket " + o.Socket() + " " + strings.Join(f[3:], " ")
			}
			fmt.Fprintf(&b, "    %s\n", l)
		}
		fmt.Fprintf(&b, "    maxconn 4096\n    nbthread %d\n", threads)
	} else {
		fmt.Fprintf(&b, `global
    stats socket %s %s level admin
    maxconn 4096
    nbthread %d
`, o.Socket(), perm, threads)
	}
	var front []string
	if o.LuaAgent != "" {
		luaFile := filepath.Join(o.Dir, "hapilot.lua")
		if err := os.WriteFile(luaFile, []byte(hapilotlua.Companion), 0o644); err != nil {
			return "", err
		}
		for _, l := range examples.Lines(examples.HAProxyLuaCfg, "global") {
			if strings.Contains(l, "HAPILOT") || strings.HasPrefix(l, "lua-load") || strings.HasPrefix(l, ".") || strings.HasPrefix(l, "tune.lua.") {
				l = strings.Replace(l, "abns@hapilot-lua", o.LuaAgent, 1)
				l = strings.Replace(l, "/etc/haproxy/hapilot.lua", luaFile, 1)
				fmt.Fprintf(&b, "    %s\n", l)
			}
		}
		front = append(front, examples.Lines(examples.HAProxyLuaCfg, "frontend www")...)
	}
	if o.SyslogAddr != "" {
		for _, l := range examples.Lines(examples.HAProxySyslogCfg, "frontend www") {
			front = append(front, strings.Replace(l, "abns@hapilot-log", o.SyslogAddr, 1))
		}
	}
	if o.SyslogRing != "" {
		b.WriteString("\nring hapilot\n")
		for _, l := range examples.Lines(examples.HAProxySyslogRingCfg, "ring hapilot") {
			fmt.Fprintf(&b, "    %s\n", strings.Replace(l, "abns@hapilot-ring", o.SyslogRing, 1))
		}
		front = append(front, examples.Lines(examples.HAProxySyslogRingCfg, "frontend www")...)
	}
	fmt.Fprintf(&b, `
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    retries 0

frontend www
    bind 127.0.0.1:%d
`, o.FrontendPort)
	for _, l := range front {
		fmt.Fprintf(&b, "    %s\n", l)
	}
	if o.Retries {
		fmt.Fprintf(&b, "    http-response set-header %s %%rc\n", RetriesHeader)
	}
	var agents string
	if o.AgentAddr != "" {
		cfg, spoeConf, spoeName := examples.HAProxyCfg, spoe.Conf, "hapilot-spoe.conf"
		if o.Sample > 1 {
			cfg, spoeConf = examples.Sampled(o.Sample)
			spoeName = "hapilot-spoe-sampled.conf"
		}
		if o.SPOETime {
			agent := "\nspoe-agent hapilot\n"
			if !strings.Contains(spoeConf, agent) {
				return "", fmt.Errorf("%s: no %q section to time", spoeName, strings.TrimSpace(agent))
			}
			spoeConf = strings.Replace(spoeConf, agent, agent+"    option set-total-time "+spoeTimeVar+"\n", 1)
		}
		spoeFile := filepath.Join(o.Dir, spoeName)
		if err := os.WriteFile(spoeFile, []byte(spoeConf), 0o644); err != nil {
			return "", err
		}
		front, be, err := examples.StanzaOf(cfg, o.AgentAddr)
		if err != nil {
			return "", err
		}
		for _, l := range front {
			l = strings.Replace(l, "/etc/haproxy/"+spoeName, spoeFile, 1)
			fmt.Fprintf(&b, "    %s\n", l)
		}
		if o.SPOETime {
			// After every http-response rule, so after send-spoe-group.
			fmt.Fprintf(&b, "    http-after-response set-header %s %%[var(txn.hapilot.%s)] if { var(txn.hapilot.%s) -m found }\n", SPOETimeHeader, spoeTimeVar, spoeTimeVar)
		}
		agents = "\n" + be
	}
	fmt.Fprintf(&b, "    default_backend %s\n\nbackend %s\n    balance %s\n", BackendName, BackendName, algo)
	if o.Retries {
		b.WriteString("    retry-on 500 502 503 504\n    retries 2\n    option redispatch 1\n")
	}
	if o.Redispatch {
		b.WriteString("    option http-server-close\n    retries 3\n    option redispatch\n    timeout server 2s\n")
	}
	if o.HTTPCheck {
		b.WriteString("    option httpchk GET /\n")
	}
	weight := ""
	if o.Weight > 0 {
		weight = fmt.Sprintf(" weight %d", o.Weight)
	}
	if o.MaxConn > 0 {
		weight += fmt.Sprintf(" maxconn %d", o.MaxConn)
	}
	if o.ServerOptions != "" {
		weight += " " + o.ServerOptions
	}
	for i, addr := range o.Servers {
		fmt.Fprintf(&b, "    server %s %s%s\n", ServerName(i), addr, weight)
	}
	b.WriteString(agents)
	return b.String(), nil
}

// SampledPath reads a telemetry path's name: "spoe-sampled" is sampled
// SPOE at k=16, "spoe-sampledK" at k=K (1 to 1024, as the agent takes);
// sampled is false for any other path. A malformed K is an error.
func SampledPath(path string) (k int, sampled bool, err error) {
	rest, ok := strings.CutPrefix(path, "spoe-sampled")
	if !ok {
		return 0, false, nil
	}
	if rest == "" {
		return 16, true, nil
	}
	k, err = strconv.Atoi(rest)
	if err != nil || k < 1 || k > 1024 {
		return 0, true, fmt.Errorf("telemetry %q: want spoe-sampled or spoe-sampledK, K from 1 to 1024", path)
	}
	return k, true, nil
}
