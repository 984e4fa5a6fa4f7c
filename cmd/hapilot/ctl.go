package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/loop"
	"github.com/hapilot/hapilot/cmd/hapilot/config"
	"github.com/hapilot/hapilot/cmd/hapilot/ctl"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/netx"
)

const ctlUsage = `usage: hapilot ctl [--socket unix:PATH | --config FILE] [-o table|json] COMMAND [ARGS]

commands (to the running agent, over its control socket):
  status                      mode, policy, pauses, backends, what it holds
  list                        every server the agent changed, since when, why
  explain BACKEND/SERVER      its window, the test's view, recent decisions
  release BACKEND/SERVER      restore it now; the operator's for the hold time
  pause [--for D] [BACKEND]   observe only (everywhere, or one backend)
  resume [BACKEND]            act again (every pause, or one backend's)
  restore                     restore every server the agent changed

Answers print as tables; -o json (before or after the command) prints the
agent's result as JSON, for scripts.

With the agent stopped, 'hapilot restore --config FILE' reads its state file.
`

// cmdCtl sends one command to the running agent and prints its answer:
// the message, then the result as tables (-o json: as indented JSON). A
// refusal is an error, with the agent's reason.
func cmdCtl(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	args, format, err := takeOutput(args)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("hapilot ctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, ctlUsage) }
	socket := fs.String("socket", config.DefaultControlSocket, "the agent's control socket (its --control-socket)")
	file := fs.String("config", "", "the agent's settings file: its control-socket line names the socket (--socket wins)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *file != "" && !flagSet(fs, "socket") {
		c, err := parse("ctl", []string{"--config", *file}, stderr)
		if err != nil {
			return err
		}
		*socket = c.ControlSocket
	}
	req, err := ctlRequest(fs.Args(), stderr)
	if err != nil {
		return err
	}
	a, err := netx.ParseAddress("socket", *socket, netx.Unix)
	if err != nil {
		return err
	}
	if a.Off() {
		return errors.New("no control socket")
	}
	cctx, cancel := context.WithTimeout(ctx, ctl.Timeout)
	defer cancel()
	ans, err := ctl.Do(cctx, a.Addr, req)
	if err != nil {
		return err
	}
	if format == outputJSON {
		printJSON(stdout, ans)
	} else {
		printTable(stdout, req.Command, ans)
	}
	if !ans.OK {
		return errors.New(ans.Error)
	}
	return nil
}

// ctlRequest reads a command line into a request.
func ctlRequest(args []string, stderr io.Writer) (ctl.Request, error) {
	if len(args) == 0 {
		fmt.Fprint(stderr, ctlUsage)
		return ctl.Request{}, errors.New("no command")
	}
	req := ctl.Request{Command: ctl.Command(args[0])}
	rest := args[1:]
	switch req.Command {
	case ctl.Status, ctl.List, ctl.Restore:
		if len(rest) != 0 {
			return req, fmt.Errorf("%s takes no argument", req.Command)
		}
	case ctl.Explain, ctl.Release:
		if len(rest) != 1 {
			return req, fmt.Errorf("%s needs BACKEND/SERVER", req.Command)
		}
		if _, err := haproxy.ParseServerKey(rest[0]); err != nil {
			return req, fmt.Errorf("%s: %w", req.Command, err)
		}
		req.Server = rest[0]
	case ctl.Pause, ctl.Resume:
		fs := flag.NewFlagSet("hapilot ctl "+string(req.Command), flag.ContinueOnError)
		fs.SetOutput(stderr)
		var d time.Duration
		if req.Command == ctl.Pause {
			fs.DurationVar(&d, "for", 0, "pause this long (0: until resumed)")
		}
		if err := fs.Parse(rest); err != nil {
			return req, err
		}
		if fs.NArg() > 1 {
			return req, fmt.Errorf("%s takes at most one BACKEND", req.Command)
		}
		if d < 0 {
			return req, fmt.Errorf("pause --for %v is negative", d)
		}
		if d > 0 {
			req.For = d.String()
		}
		req.Backend = fs.Arg(0)
	default:
		names := make([]string, len(ctl.Commands))
		for i, c := range ctl.Commands {
			names[i] = string(c)
		}
		return req, fmt.Errorf("unknown command %q: want %s", args[0], strings.Join(names, ", "))
	}
	return req, nil
}

// cmdRestore is `hapilot restore`, for when the agent is not running:
// it reads the agent's changes from the state file named by the
// settings and brings each server that still shows one back. It refuses
// while the agent answers on its control socket: the agent would take
// them for the operator's otherwise, and `hapilot ctl restore` does it.
func cmdRestore(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parse("restore", args, stderr)
	if err != nil {
		return err
	}
	if a, err := netx.ParseAddress("control-socket", c.ControlSocket, netx.Unix); err == nil && !a.Off() {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := ctl.Do(pctx, a.Addr, ctl.Request{Command: ctl.Status})
		cancel()
		if err == nil {
			return errors.New("the agent is running: use `hapilot ctl restore`")
		}
	}
	file, err := c.StateFile()
	if err != nil {
		return err
	}
	log, err := newLogger(c, stderr)
	if err != nil {
		return err
	}
	var runtimes []agent.Runtime
	for _, s := range c.HAProxySockets {
		cl, err := haproxy.New(s)
		if err != nil {
			return err
		}
		runtimes = append(runtimes, cl)
	}
	rctx, cancel := context.WithTimeout(ctx, ctl.Timeout)
	defer cancel()
	hold := c.Loop.OperatorHold
	if hold <= 0 {
		hold = agent.DefaultOperatorHold
	}
	released, err := loop.RestoreFromState(rctx, file, runtimes, hold, time.Now(), log)
	for _, r := range released {
		switch {
		case r.Error != "":
			fmt.Fprintf(stdout, "%s: %s\n", r.Server, r.Error)
		default:
			fmt.Fprintf(stdout, "%s: restored (was %s since %s)\n", r.Server, r.Was.Phase, r.Was.At.Format(time.RFC3339))
		}
	}
	fmt.Fprintf(stdout, "%d server(s) in the state file %s\n", len(released), file)
	return err
}

// flagSet reports whether name was given on fs's command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
