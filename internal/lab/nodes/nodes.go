// Package nodes runs several HAProxy nodes in front of the same
// fault-injecting backends, each with its own `hapilot run` process, the
// load split across them: the lab of fleet mode. It can kill an agent,
// cut one off from its peers (nftables rules on its fleet port) and let it
// back, and reads each agent's /status.
package nodes

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hapilot/hapilot/agent/peers"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
	"github.com/hapilot/hapilot/internal/lab/scenario"
)

// Setup describes a cluster.
type Setup struct {
	Servers []fleet.BackendConfig
	Nodes   int
	// Fleet runs the agents in fleet mode, each joining all the others.
	Fleet       bool
	Interval    time.Duration // default 1 s
	AgentBinary string
	AgentArgs   []string
	Dir         string
}

// Node is one HAProxy and its agent.
type Node struct {
	Index      int
	Name       string
	Dir        string
	HAProxy    *haproxyproc.Process
	Runtime    *haproxy.Client
	Frontend   string // host:port of HAProxy's frontend
	StatusAddr string
	FleetPort  int
	args       []string
	binary     string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	logFile *os.File
	cut     string // the nftables table cutting it off, "" when none
}

// Cluster is a started setup.
type Cluster struct {
	Nodes    []*Node
	Backends []*fleet.Backend
	KeyFile  string
}

// Start starts the backends, every HAProxy and every agent, and waits
// until each HAProxy sees its agent up.
func Start(ctx context.Context, s Setup) (_ *Cluster, err error) {
	if s.Interval == 0 {
		s.Interval = time.Second
	}
	c := &Cluster{}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	if c.Backends, err = fleet.StartBackends(s.Servers); err != nil {
		return nil, err
	}
	ports, err := haproxyproc.FreePorts(4 * s.Nodes)
	if err != nil {
		return nil, err
	}
	if s.Fleet {
		c.KeyFile = filepath.Join(s.Dir, "fleet.key")
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		if err := os.WriteFile(c.KeyFile, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
			return nil, err
		}
	}
	var fleetAddrs []string
	for i := 0; i < s.Nodes; i++ {
		fleetAddrs = append(fleetAddrs, fmt.Sprintf("127.0.0.1:%d", ports[4*i+3]))
	}
	for i := 0; i < s.Nodes; i++ {
		n := &Node{Index: i, Name: fmt.Sprintf("node%d", i+1), Dir: filepath.Join(s.Dir, fmt.Sprintf("node%d", i+1)), binary: s.AgentBinary,
			Frontend: fmt.Sprintf("127.0.0.1:%d", ports[4*i]), StatusAddr: fmt.Sprintf("127.0.0.1:%d", ports[4*i+2]), FleetPort: ports[4*i+3]}
		if err := os.MkdirAll(n.Dir, 0o755); err != nil {
			return nil, err
		}
		spoe := fmt.Sprintf("127.0.0.1:%d", ports[4*i+1])
		opts := fleet.HAProxyOptions{Dir: n.Dir, FrontendPort: ports[4*i], Servers: fleet.Addrs(c.Backends), AgentAddr: spoe}
		cfg, err := fleet.HAProxyConfig(opts)
		if err != nil {
			return nil, err
		}
		if n.HAProxy, err = haproxyproc.Start(ctx, n.Dir, cfg, opts.Socket()); err != nil {
			return nil, fmt.Errorf("%s: %w", n.Name, err)
		}
		c.Nodes = append(c.Nodes, n)
		if n.Runtime, err = haproxy.New(opts.Socket()); err != nil {
			return nil, err
		}
		n.args = []string{"run", "--log-format", "json", "--policy", "rules", "--interval", s.Interval.String(), "--haproxy-socket", opts.Socket(),
			"--spoe-listen", spoe, "--status-listen", n.StatusAddr, "--audit-log", filepath.Join(n.Dir, "audit.jsonl"), "--audit-steps",
			"--state-file", filepath.Join(n.Dir, "state.json"), "--control-socket", "unix:" + filepath.Join(n.Dir, "ctl.sock")}
		if s.Fleet {
			var others []string
			for j, a := range fleetAddrs {
				if j != i {
					others = append(others, a)
				}
			}
			n.args = append(n.args, "--fleet-bind", fleetAddrs[i], "--fleet-join", strings.Join(others, ","), "--fleet-key", c.KeyFile, "--fleet-name", n.Name)
		}
		n.args = append(n.args, s.AgentArgs...)
		if err := n.StartAgent(); err != nil {
			return nil, err
		}
	}
	for _, n := range c.Nodes {
		if err := scenario.WaitAgentUp(ctx, n.Runtime); err != nil {
			return nil, fmt.Errorf("%s: %w\n%s", n.Name, err, n.AgentLog())
		}
	}
	return c, nil
}

// StartAgent starts (or restarts) the node's agent, logging to agent.log.
func (n *Node) StartAgent() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.logFile == nil {
		f, err := os.Create(filepath.Join(n.Dir, "agent.log"))
		if err != nil {
			return err
		}
		n.logFile = f
	}
	cmd := exec.Command(n.binary, n.args...)
	cmd.Stdout, cmd.Stderr = n.logFile, n.logFile
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: start agent: %w", n.Name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	n.cmd, n.done = cmd, done
	return nil
}

// Kill sends the agent sig and waits for it to end.
func (n *Node) Kill(sig syscall.Signal) {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	<-done
}

// AgentLog is what the node's agent printed.
func (n *Node) AgentLog() string {
	b, _ := os.ReadFile(filepath.Join(n.Dir, "agent.log"))
	return string(b)
}

// Cut drops every packet to or from the node's fleet port (UDP and TCP),
// as a network that no longer reaches it would: its peers stop hearing
// it, and it hears none of them.
func (n *Node) Cut() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	table := fmt.Sprintf("hapilot_lab_%d_%d", os.Getpid(), n.FleetPort)
	p := n.FleetPort
	script := fmt.Sprintf(`table inet %[1]s {
	chain in { type filter hook input priority -10; udp dport %[2]d drop; tcp dport %[2]d drop; }
	chain out { type filter hook output priority -10; udp sport %[2]d drop; tcp sport %[2]d drop; }
}
`, table, p)
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft: %v: %s", err, out)
	}
	n.cut = table
	return nil
}

// Heal removes the node's cut.
func (n *Node) Heal() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut == "" {
		return nil
	}
	if out, err := exec.Command("nft", "delete", "table", "inet", n.cut).CombinedOutput(); err != nil {
		return fmt.Errorf("nft: %v: %s", err, out)
	}
	n.cut = ""
	return nil
}

// Status is the part of an agent's /status the lab reads.
type Status struct {
	Cycle uint64        `json:"cycle"`
	Fleet *peers.Status `json:"fleet"`
}

var client = &http.Client{Timeout: 2 * time.Second}

// Status reads the node's agent's /status.
func (n *Node) Status(ctx context.Context) (Status, error) {
	var st Status
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.StatusAddr+"/status", nil)
	if err != nil {
		return st, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("%s /status: %s", n.Name, resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// Decider is who the node's agent says decides backend, and its role.
func (st Status) Decider(backend string) (decider, role string) {
	if st.Fleet == nil {
		return "", ""
	}
	for _, b := range st.Fleet.Backends {
		if b.Backend == backend {
			return b.Decider, string(b.Role)
		}
	}
	return "", ""
}

// Load sends rate requests per second in all, split evenly over the
// nodes' frontends, for d; the results are merged.
func (c *Cluster) Load(ctx context.Context, rate float64, d time.Duration) *fleet.Result {
	results := make([]*fleet.Result, len(c.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = fleet.Load{Addr: n.Frontend, Rate: rate / float64(len(c.Nodes)), Duration: d}.Run(ctx)
		}()
	}
	wg.Wait()
	out := results[0]
	for _, r := range results[1:] {
		out.Merge(r)
	}
	return out
}

// Watch records every node's HAProxy's view of the servers from start on,
// until ctx ends; read the outcomes once the returned wait returns.
func (c *Cluster) Watch(ctx context.Context, start time.Time) (outs []*scenario.Outcome, wait func()) {
	var wg sync.WaitGroup
	for _, n := range c.Nodes {
		o := scenario.NewOutcome(n.Name)
		outs = append(outs, o)
		wg.Add(1)
		go func() { defer wg.Done(); o.Watch(ctx, n.Runtime, start) }()
	}
	return outs, wg.Wait
}

// Stop stops every agent (SIGTERM), HAProxy and backend, and removes any
// cut.
func (c *Cluster) Stop() {
	for _, n := range c.Nodes {
		_ = n.Heal()
		n.Kill(syscall.SIGTERM)
		if n.HAProxy != nil {
			n.HAProxy.Stop()
		}
		n.mu.Lock()
		if n.logFile != nil {
			n.logFile.Close()
		}
		n.mu.Unlock()
	}
	fleet.CloseAll(c.Backends)
}
