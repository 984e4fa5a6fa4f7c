package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hapilot/hapilot/internal/lab/fleetsim"
	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
)

// cmdFleetSim runs fleet mode at sizes one machine's HAProxy processes
// cannot reach: the real agents (loop, rules, guardrails, fleet over
// memberlist, encrypted) on loopback, with in-memory runtime sockets.
func cmdFleetSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hapilot-bench fleet-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	nodes := fs.String("nodes", "100", "fleet sizes, comma-separated (one run each)")
	backends := fs.Int("backends", 100, "backends per node")
	servers := fs.Int("servers", 10, "servers per backend")
	rate := fs.Float64("rate", 2, "requests per second each node sends each server")
	steady := fs.Duration("steady", 10*time.Second, "how long traffic is measured before the fault")
	probe := fs.Duration("probe-timeout", 0, "memberlist's probe timeout and interval (0: its LAN defaults, 500ms and 1s, as the agent runs); a hundred nodes sharing two cores answer probes late")
	compress := fs.Bool("compress", true, "the fleet port's compression (memberlist's packets, and hapilot's messages, which follow it), on as in the agent; off, the bytes counted are an upper bound of the wire's, and a hundred nodes on two cores keep up")
	nodeLog := fs.String("node-log", "", "write every node's fleet log (memberlist's warnings included) to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	nodes0 := zerolog.Nop()
	if *nodeLog != "" {
		f, err := os.Create(*nodeLog)
		if err != nil {
			return err
		}
		defer f.Close()
		nodes0 = zerolog.New(f).Level(zerolog.DebugLevel).With().Timestamp().Logger()
	}
	tune := func(c *memberlist.Config) {
		if *probe > 0 {
			c.ProbeTimeout, c.ProbeInterval = *probe, 2**probe
		}
		c.EnableCompression = *compress
	}
	var results []*fleetsim.Result
	for _, f := range strings.Split(*nodes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			return fmt.Errorf("--nodes %q: want sizes of at least 2", f)
		}
		fmt.Fprintf(stderr, "fleet-sim: %d nodes x %d servers...\n", n, *backends**servers)
		r, err := fleetsim.Run(ctx, fleetsim.Setup{Nodes: n, Backends: *backends, Servers: *servers, Rate: *rate, Steady: *steady, NodeLog: nodes0, Tune: tune,
			Log: zerolog.New(stderr).With().Timestamp().Logger()})
		if err != nil {
			return fmt.Errorf("%d nodes: %w", n, err)
		}
		fmt.Fprintf(stderr, "fleet-sim: %d nodes: decider of %s was %s\n", n, r.Faulty, r.Decider)
		results = append(results, r)
	}
	fmt.Fprintf(stdout, "fleet-sim: every node is the real agent (loop, rules, guardrails, fleet mode over memberlist with its keyring) on memberlist's in-memory network, with an in-memory runtime socket; interval 10s with the evidence check every 1s, windows 10s, fleet-sync 250ms, fleet-timeout 1s, compression %v; one server of one backend starts failing 5%% of requests on every node\n", *compress)
	fleetsim.WriteTable(stdout, results)
	return nil
}
