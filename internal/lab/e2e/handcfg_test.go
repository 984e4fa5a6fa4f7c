//go:build e2e

package e2e

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hapilot/hapilot/spoe"

	"github.com/hapilot/hapilot/cmd/hapilot/config"
	"github.com/hapilot/hapilot/cmd/hapilot/daemon"
	"github.com/hapilot/hapilot/examples"
	"github.com/rs/zerolog"
)

// handConfig frames a hand-written haproxy.cfg, for the tests whose
// backends fleet.HAProxyConfig cannot write (several backends, a
// server-template): the admin socket, and a frontend with the README's
// stanza, its SPOE file written in dir and the agent at dir/spoe.sock.
type handConfig struct {
	dir, spoeAddr, socket string
	front                 []string // the frontend's stanza lines
	agents                string   // the agents' backend
}

func newHandConfig(t *testing.T, dir string) handConfig {
	t.Helper()
	h := handConfig{dir: dir, spoeAddr: filepath.Join(dir, "spoe.sock"), socket: filepath.Join(dir, "admin.sock")}
	front, agents, err := examples.Stanza("unix@" + h.spoeAddr)
	if err != nil {
		t.Fatal(err)
	}
	spoeFile := filepath.Join(dir, "hapilot-spoe.conf")
	if err := os.WriteFile(spoeFile, []byte(spoe.Conf), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, l := range front {
		h.front = append(h.front, strings.Replace(l, "/etc/haproxy/hapilot-spoe.conf", spoeFile, 1))
	}
	h.agents = agents
	return h
}

// head is the config up to the frontend's stanza: global (its admin
// socket), sections (a resolvers section, say), defaults, and the
// frontend on port with the stanza; the caller adds its routing and
// backends, then tail.
func (h handConfig) head(port int, sections string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "global\n    stats socket %s mode 600 level admin\n%s\ndefaults\n    mode http\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n\nfrontend www\n    bind 127.0.0.1:%d\n",
		h.socket, sections, port)
	for _, l := range h.front {
		fmt.Fprintf(&b, "    %s\n", l)
	}
	return b.String()
}

// agentArgs are the agent's flags for this config: its sockets, state
// file and control socket in dir, a 1 s interval, and args after.
func (h handConfig) agentArgs(args ...string) []string {
	return append([]string{"--haproxy-socket", h.socket, "--spoe-listen", "unix:" + h.spoeAddr, "--interval", "1s",
		"--state-file", filepath.Join(h.dir, "state.json"), "--control-socket", "unix:" + filepath.Join(h.dir, "ctl.sock")}, args...)
}

// startAgent runs the agent in process with args until the test ends.
func startAgent(t *testing.T, ctx context.Context, log zerolog.Logger, args []string) *daemon.Daemon {
	t.Helper()
	fs := flag.NewFlagSet("hapilot run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c := config.Register(fs)
	if err := config.Parse(fs, args); err != nil {
		t.Fatal(err)
	}
	d, err := daemon.New(*c, log)
	if err != nil {
		t.Fatal(err)
	}
	agentCtx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- d.Serve(agentCtx) }()
	t.Cleanup(func() { stop(); <-served })
	return d
}
