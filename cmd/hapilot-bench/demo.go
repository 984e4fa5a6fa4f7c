package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/scenario"
	"github.com/rs/zerolog"
)

func cmdDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hapilot-bench demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	servers := fs.Int("servers", 6, "servers in the fleet; every third (srv3, srv6, ...) fails")
	errRate := fs.Float64("error-rate", 0.05, "share of requests the faulty servers fail (answer 500, or as --fault says)")
	fault := fleet.Fault500
	fs.Var(&fault, "fault", "how the faulty servers fail: "+faultWords()+"; any but 500 runs HAProxy with option http-server-close, retries 3, option redispatch and timeout server 2s, as operators set it in front of such servers")
	rate := fs.Float64("rate", 300, "client requests per second")
	duration := fs.Duration("duration", 45*time.Second, "load per policy")
	interval := fs.Duration("interval", time.Second, "agent's control-loop interval")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var cfgs []fleet.BackendConfig
	for i := 0; i < *servers; i++ {
		c := fleet.BackendConfig{Latency: 9 * time.Millisecond, Jitter: 4 * time.Millisecond, Capacity: 64, Seed: uint64(i + 1)}
		if i%3 == 2 {
			c.ErrorRate, c.Fault = *errRate, fault
		}
		cfgs = append(cfgs, c)
	}
	faulty := scenario.Faulty(cfgs, 0)
	var names []string
	for n := range faulty {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(stdout, "demo: %d servers behind a real HAProxy, %v fail %.0f%% of requests; %.0f req/s for %v per policy, agent interval %v\n",
		*servers, names, 100**errRate, *rate, *duration, *interval)
	redispatch := fault != fleet.Fault500
	if redispatch {
		fmt.Fprintf(stdout, "fault: %s: %s\n", fault, faultSays[fault])
	}

	var outs []*scenario.Outcome
	for _, pol := range []string{"static", "rules"} {
		dir, err := os.MkdirTemp("", "hapilot-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		fmt.Fprintf(stdout, "running --policy %s ...\n", pol)
		out, err := scenario.Scenario{
			Servers: cfgs, Rate: *rate, Duration: *duration, Policy: pol, Interval: *interval,
			Redispatch: redispatch, Dir: dir, Log: zerolog.Nop(),
		}.Run(ctx)
		if err != nil {
			return fmt.Errorf("policy %s: %w", pol, err)
		}
		outs = append(outs, out)
	}
	printTable(stdout, outs, names)
	return nil
}

// faultSays is what HAProxy 2.6 makes of each fault, as measured
// (docs/explanation/telemetry.md), and how the agent hears of it.
var faultSays = map[fleet.Fault]string{
	fleet.FaultHang:    "the server holds the request past timeout server; HAProxy answers 504 itself (sH--), counted in eresp: HAProxy's own 5xx",
	fleet.FaultReset:   "the server resets the connection; the keep-alive client's connection is closed without an answer, counted in srv_abrt: an abort",
	fleet.FaultRefuse:  "the server refuses connections; HAProxy redispatches them to another server (wredis): a retry the client never sees",
	fleet.FaultGarbage: "the server answers bytes that are not HTTP; HAProxy answers 502 itself (PH--), counted in eresp: HAProxy's own 5xx",
	fleet.FaultSlow:    "the server answers 200 after 1.5 s: a slow tail, no error",
}

func faultWords() string {
	var w []string
	for _, f := range fleet.Faults {
		w = append(w, string(f))
	}
	return strings.Join(w, "|")
}

func printTable(w io.Writer, outs []*scenario.Outcome, faulty []string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	header := "policy\trequests\tclient 5xx\treduction\tp50 ms\tp99 ms\t"
	for _, f := range faulty {
		header += "drained " + f + " at\t"
	}
	fmt.Fprintln(tw, header)
	base := outs[0].Load.Err5xx
	for _, o := range outs {
		red := "-"
		if o != outs[0] && base > 0 {
			red = fmt.Sprintf("%.1f%%", 100*(1-float64(o.Load.Err5xx)/float64(base)))
		}
		line := fmt.Sprintf("%s\t%d\t%d\t%s\t%.1f\t%.1f\t", o.Policy, o.Load.Completed+o.Load.Failed, o.Load.Err5xx+o.Load.Failed, red,
			ms(o.Load.Quantile(0.50)), ms(o.Load.Quantile(0.99)))
		for _, f := range faulty {
			if at, ok := o.DrainedAt[f]; ok {
				line += fmt.Sprintf("%.1f s\t", at.Seconds())
			} else {
				line += "never\t"
			}
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	var healthy []string
	for _, o := range outs {
		for s := range o.DrainedAt {
			if !contains(faulty, s) {
				healthy = append(healthy, o.Policy+":"+s)
			}
		}
	}
	if len(healthy) > 0 {
		fmt.Fprintf(w, "healthy servers drained: %v\n", healthy)
	} else {
		fmt.Fprintln(w, "healthy servers drained: none")
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
