// Package bench holds hapilot's benchmarks against a real HAProxy.
package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hapilot/hapilot/cmd/hapilot/config"
	"github.com/hapilot/hapilot/cmd/hapilot/daemon"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
	"github.com/hapilot/hapilot/internal/lab/scenario"
	"github.com/rs/zerolog"
)

// OverheadConfig shapes `hapilot-bench bench overhead`.
type OverheadConfig struct {
	Concurrency int
	Duration    time.Duration // per path, split over Rounds
	Rounds      int
	Backends    int
	// Paths to run, plain first (OverheadPaths); the "-noagent" ones send
	// to a port nobody reads: HAProxy's side of the cost alone.
	Paths []string
	// Pin puts HAProxy on the machine's last core and this process (load
	// generator, backends, agent) on the others, where there is more than
	// one: then nothing else runs on HAProxy's core.
	Pin bool
	// Pinned is what Overhead did: HAProxy's CPU list, "" when unpinned.
	Pinned string
	// Profile turns HAProxy's task profiling on for the measured rounds
	// (`set profiling tasks on`) and keeps `show profiling tasks` in each
	// PathResult: where HAProxy's CPU goes, handler by handler. It costs
	// HAProxy CPU of its own, so the ratios of a profiled run are not the
	// figures to quote.
	Profile bool
}

// OverheadPaths are the telemetry paths Overhead knows.
var OverheadPaths = []string{"plain", "stats", "syslog", "syslog-noagent", "unixgram", "unixgram-noagent", "ring", "ring-noagent", "lua", "lua-noagent",
	"spoe", "spoe-sampled4", "spoe-sampled16"}

// PathResult is one telemetry path's figures.
type PathResult struct {
	Path       string
	Throughput float64 // responses per second
	P50, P99   time.Duration
	Failed     int
	Recorded   uint64 // responses the agent recorded
	Ratio      float64
	// HAProxyCPU is HAProxy's own CPU time (user and system, from
	// /proc/PID/stat) per response: the path's cost to HAProxy alone,
	// apart from the load generator, the backends and the agent that share
	// the machine and so shape the throughput. Zero when /proc is missing.
	HAProxyCPU time.Duration
	// Responses are the measured rounds' responses, the warm-up's left out.
	Responses int
	// AgentConns, AgentFrames and AgentMsgs are the SPOE connections the
	// agent accepted, the NOTIFY frames it read and the messages in them,
	// warm-up included: whether HAProxy reuses its connections, and how
	// many messages go per frame.
	AgentConns, AgentFrames, AgentMsgs uint64
	// Profile is HAProxy's `show profiling tasks` over the measured
	// rounds, with OverheadConfig.Profile.
	Profile []ProfileRow
}

type variant struct {
	name  string
	hp    *haproxyproc.Process
	addr  string
	agent *daemon.Daemon
	stop  context.CancelFunc
	done  chan error
	res   *fleet.Result
	cpu   time.Duration // HAProxy's CPU time over the measured rounds
}

// Overhead runs the same HAProxy config several ways (plain, the stats
// path, syslog, the ring, the Lua companion, SPOE whole or sampled), each
// with an in-process agent where it has one, and loads them in turn,
// interleaved round by round, so that drift in the machine hits every path
// alike. With cfg.Pin it sets cfg.Pinned.
func Overhead(ctx context.Context, cfg *OverheadConfig, dir string) ([]PathResult, error) {
	for _, name := range cfg.Paths {
		if _, sampled, err := fleet.SampledPath(name); sampled && err == nil {
			continue
		}
		if !slices.Contains(OverheadPaths, name) {
			return nil, fmt.Errorf("unknown telemetry path %q (want %s)", name, strings.Join(OverheadPaths, ", "))
		}
	}
	if cfg.Pin {
		cpus, restore, err := pinApart()
		if err != nil {
			return nil, err
		}
		defer restore()
		cfg.Pinned = cpus
	}
	backends := make([]fleet.BackendConfig, cfg.Backends)
	bs, err := fleet.StartBackends(backends)
	if err != nil {
		return nil, err
	}
	defer fleet.CloseAll(bs)
	var vs []*variant
	defer func() {
		for _, v := range vs {
			if v.stop != nil {
				v.stop()
				<-v.done
			}
			if v.hp != nil {
				v.hp.Stop()
			}
		}
	}()
	for _, name := range cfg.Paths {
		v, err := startVariant(ctx, name, fleet.Addrs(bs), dir, cfg.Pinned)
		if v != nil {
			vs = append(vs, v)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	per := cfg.Duration / time.Duration(cfg.Rounds)
	for _, v := range vs { // warm up connections and Lua/SPOE state
		fleet.ClosedLoad{Addr: v.addr, Concurrency: cfg.Concurrency, Duration: time.Second}.Run(ctx)
	}
	if cfg.Profile {
		for _, v := range vs {
			if _, err := v.cli(ctx, "set profiling tasks on"); err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
		}
	}
	for r := 0; r < cfg.Rounds; r++ {
		for _, v := range vs {
			before := v.hp.CPU()
			res := fleet.ClosedLoad{Addr: v.addr, Concurrency: cfg.Concurrency, Duration: per}.Run(ctx)
			v.cpu += v.hp.CPU() - before
			if v.res == nil {
				v.res = res
			} else {
				v.res.Merge(res)
			}
		}
	}
	var out []PathResult
	for _, v := range vs {
		p := PathResult{Path: v.name, Throughput: v.res.Throughput(), P50: v.res.Quantile(0.5), P99: v.res.Quantile(0.99), Failed: v.res.Failed,
			Responses: v.res.Completed}
		if v.agent != nil {
			p.Recorded = v.agent.Events()
			p.AgentConns = v.agent.SPOE.Counters.Connections.Load()
			p.AgentFrames = v.agent.SPOE.Counters.Frames.Load()
			p.AgentMsgs = v.agent.SPOE.Counters.Events.Load()
		}
		if cfg.Profile {
			reply, err := v.cli(ctx, "show profiling tasks")
			if err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
			p.Profile = ParseProfile(reply)
		}
		if n := v.res.Completed; n > 0 {
			p.HAProxyCPU = v.cpu / time.Duration(n)
		}
		out = append(out, p)
	}
	for i := range out { // out[0] is plain
		out[i].Ratio = out[i].Throughput / out[0].Throughput
	}
	return out, nil
}

// pinApart moves this process off the machine's last CPU and returns that
// CPU for HAProxy, with a function giving this process its CPUs back. On
// one CPU it pins nothing.
func pinApart() (string, func(), error) {
	n := runtime.NumCPU()
	if n < 2 {
		return "", func() {}, nil
	}
	pid := strconv.Itoa(os.Getpid())
	out, err := exec.Command("taskset", "-c", "-p", pid).Output()
	if err != nil {
		return "", nil, fmt.Errorf("taskset (util-linux) reads this process's CPUs: %w", err)
	}
	_, orig, ok := strings.Cut(strings.TrimSpace(string(out)), ": ")
	if !ok {
		return "", nil, fmt.Errorf("taskset -p: unexpected %q", out)
	}
	// -a: every thread of the process, the Go runtime's included.
	if out, err := exec.Command("taskset", "-a", "-c", "-p", fmt.Sprintf("0-%d", n-2), pid).CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("taskset: %v: %s", err, out)
	}
	restore := func() { _ = exec.Command("taskset", "-a", "-c", "-p", orig, pid).Run() }
	return strconv.Itoa(n - 1), restore, nil
}

// cli runs one command on the variant's runtime socket.
func (v *variant) cli(ctx context.Context, cmd string) (string, error) {
	c, err := haproxy.New(v.hp.Socket)
	if err != nil {
		return "", err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return c.Run(cctx, cmd)
}

func startVariant(ctx context.Context, name string, servers []string, root, cpus string) (*variant, error) {
	dir, err := os.MkdirTemp(root, name+"-")
	if err != nil {
		return nil, err
	}
	ports, err := haproxyproc.FreePorts(2)
	if err != nil {
		return nil, err
	}
	opts := fleet.HAProxyOptions{Dir: dir, FrontendPort: ports[0], Servers: servers}
	args := []string{"--policy", "static", "--interval", "10s", "--status-listen", "off", "--haproxy-socket", opts.Socket(),
		"--state-file", filepath.Join(dir, "state.json"), "--control-socket", "unix:" + filepath.Join(dir, "ctl.sock"), "--spoe-listen", "off"}
	agentAddr := fmt.Sprintf("127.0.0.1:%d", ports[1])
	// A "-noagent" path is its base path's config with nobody on the other end.
	base, noAgent := strings.CutSuffix(name, "-noagent")
	if k, sampled, _ := fleet.SampledPath(base); sampled { // checked by Overhead
		opts.Sample, base = k, "spoe"
	}
	switch base {
	case "stats":
		args = append(args, "--stats-poll-mode", "counts") // at the default period
	case "spoe":
		opts.AgentAddr = agentAddr
		args[len(args)-1] = agentAddr // --spoe-listen's value, last
	case "lua":
		opts.LuaAgent = agentAddr
		args = append(args, "--lua-listen", agentAddr)
	case "syslog":
		opts.SyslogAddr = agentAddr
		args = append(args, "--syslog-listen", "udp://"+agentAddr)
	case "ring":
		opts.SyslogRing = agentAddr
		args = append(args, "--syslog-listen", "tcp://"+agentAddr)
	case "unixgram":
		opts.SyslogAddr = filepath.Join(dir, "log.sock")
		args = append(args, "--syslog-listen", "unixgram://"+opts.SyslogAddr)
	}
	cfg, err := fleet.HAProxyConfig(opts)
	if err != nil {
		return nil, err
	}
	v := &variant{name: name, addr: fmt.Sprintf("127.0.0.1:%d", ports[0])}
	if base != "plain" && !noAgent {
		fs := flag.NewFlagSet("bench", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c := config.Register(fs)
		if err := config.Parse(fs, args); err != nil {
			return nil, err
		}
		if v.agent, err = daemon.New(*c, zerolog.Nop()); err != nil {
			return nil, err
		}
		actx, cancel := context.WithCancel(ctx)
		v.stop, v.done = cancel, make(chan error, 1)
		go func() { v.done <- v.agent.Serve(actx) }()
	}
	if v.hp, err = haproxyproc.StartOn(ctx, dir, cfg, opts.Socket(), cpus); err != nil {
		return v, err
	}
	if opts.AgentAddr != "" && !noAgent {
		rt, err := haproxy.New(opts.Socket())
		if err != nil {
			return v, err
		}
		if err := scenario.WaitAgentUp(ctx, rt); err != nil {
			return v, err
		}
	}
	return v, nil
}

// PrintOverhead writes the table.
func PrintOverhead(w io.Writer, cfg OverheadConfig, res []PathResult) {
	pinned := "HAProxy unpinned"
	if cfg.Pinned != "" {
		pinned = "HAProxy pinned to CPU " + cfg.Pinned + ", everything else to the others"
	}
	fmt.Fprintf(w, "telemetry overhead: %d cores, %s, HAProxy nbthread 1, %d backends answering at once, concurrency %d, %v per path in %d interleaved rounds\n",
		runtime.NumCPU(), pinned, cfg.Backends, cfg.Concurrency, cfg.Duration, cfg.Rounds)
	fmt.Fprintln(w, "headline: HAProxy's own CPU per response; req/s and its ratio depend on the machine (the load generator and backends share it)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tHAProxy CPU µs/resp\tx plain CPU\treq/s\tx plain req/s\tp50 ms\tp99 ms\tfailed\trecorded by agent\tSPOE conns\tmsgs/frame\t")
	for _, r := range res {
		rec := "-"
		if r.Path != "plain" && !strings.HasSuffix(r.Path, "-noagent") {
			rec = fmt.Sprint(r.Recorded)
		}
		cpu := "-"
		if r.HAProxyCPU > 0 {
			cpu = fmt.Sprintf("%.2f", float64(r.HAProxyCPU)/1e3)
		}
		cpuRatio := "-"
		if r.HAProxyCPU > 0 && res[0].HAProxyCPU > 0 {
			cpuRatio = fmt.Sprintf("%.3f", float64(r.HAProxyCPU)/float64(res[0].HAProxyCPU))
		}
		conns, perFrame := "-", "-"
		if r.AgentFrames > 0 {
			conns = fmt.Sprint(r.AgentConns)
			perFrame = fmt.Sprintf("%.2f", float64(r.AgentMsgs)/float64(r.AgentFrames))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t%.2f\t%.3f\t%.3f\t%d\t%s\t%s\t%s\t\n", r.Path, cpu, cpuRatio, r.Throughput, r.Ratio,
			float64(r.P50)/1e6, float64(r.P99)/1e6, r.Failed, rec, conns, perFrame)
	}
	tw.Flush()
	if cfg.Profile {
		PrintProfiles(w, res, 8)
	}
}
