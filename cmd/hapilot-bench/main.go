// Command hapilot-bench is hapilot's lab: a real HAProxy, fault-injecting
// backends, load, and the agent, to show and measure what it does.
//
//	hapilot-bench demo            a demo fleet, static then rules, and a before/after table
//	hapilot-bench bench           the study's benchmark, and harder scenarios
//	hapilot-bench bench overhead  what each telemetry path costs HAProxy
//	hapilot-bench fleet-sim       fleet mode at scale, in process over loopback
//	hapilot-bench soak            simulated server-days through the rules' test
//	hapilot-bench dataset         the training text of hapilot's own policy model
//
// It links the lab (fleets, scenarios, the Ollama stand-in, the HAProxy
// process runner); the agent an operator installs is cmd/hapilot, which
// links none of it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `usage: hapilot-bench <command> [flags]

commands:
  demo            run a demo fleet behind a real HAProxy, static then rules, and print a table
  bench           the study's benchmark and harder scenarios against a real HAProxy
  bench overhead  what each telemetry path costs HAProxy
  fleet-sim       fleet mode at 100 nodes x 1,000 servers, in one process over loopback
  soak            simulated server-days through the rules' test: false drains, time to detect
  dataset         the training text and initial weights of hapilot's own policy model
  version         print the version

Run 'hapilot-bench <command> -h' for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch args[0] {
	case "demo":
		err = cmdDemo(ctx, args[1:], stdout, stderr)
	case "bench":
		err = cmdBench(ctx, args[1:], stdout, stderr)
	case "fleet-sim":
		err = cmdFleetSim(ctx, args[1:], stdout, stderr)
	case "soak":
		err = cmdSoak(ctx, args[1:], stdout, stderr)
	case "dataset":
		err = cmdDataset(ctx, args[1:], stdout, stderr)
	case "version", "--version", "-v":
		fmt.Fprintln(stdout, "hapilot-bench "+version)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "hapilot-bench: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "hapilot-bench %s: %v\n", args[0], err)
		return 1
	}
	return 0
}
