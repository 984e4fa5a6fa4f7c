// Command hapilot takes degraded backend servers out of HAProxy's rotation.
//
//	hapilot run        run the agent
//	hapilot check      validate settings (flags or --config FILE) and exit
//	hapilot calibrate  score an Ollama model; only a passing one may act
//	hapilot defaults   print every setting, commented, at its default
//	hapilot fleet-key  write a new shared key for --fleet-key
//	hapilot ctl        ask or overrule the running agent (list, explain, release, pause, resume, restore)
//	hapilot restore    bring back every server the agent changed, with the agent stopped
//	hapilot stop       undo every running agent's changes, then stop it (the package's prerm)
//	hapilot version    print the version
//
// The demo and the benchmark are the lab's, in cmd/hapilot-bench: this
// binary holds the agent and nothing else.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"

	"github.com/hapilot/hapilot/cmd/hapilot/config"
	"github.com/hapilot/hapilot/cmd/hapilot/daemon"
	"github.com/rs/zerolog"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `usage: hapilot <command> [flags]

commands:
  run       run the agent beside HAProxy
  check     validate settings (flags or --config FILE) and exit; with --live, also
            against the running HAProxy: what the agent would govern and see
  calibrate score a model on built-in scenarios; only a passing model may act
  defaults  print a settings file with every setting, commented, at its default
  fleet-key FILE  write a new random key for --fleet-key (mode 0600; never overwrites)
  ctl       ask or overrule the running agent: status, list, explain, release, pause, resume, restore
  restore   with the agent stopped: bring back every server it changed (reads its state file)
  stop      undo what every running agent of this binary changed, then stop it; names
            what could not be undone (the package's prerm runs it before removal)
  version   print the version

Run 'hapilot <command> -h' for a command's flags.
`

func main() {
	daemon.Version = version
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// SIGHUP never stops hapilot: `run` reopens its audit log on it (what
	// logrotate sends), every other command ignores it. Go's default for
	// it is to exit, which skipped --on-exit.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var err error
	switch args[0] {
	case "run":
		err = cmdRun(ctx, args[1:], stderr, hup)
	case "check":
		err = cmdCheck(ctx, args[1:], stdout, stderr)
	case "calibrate":
		err = cmdCalibrate(ctx, args[1:], stdout, stderr)
	case "defaults":
		err = cmdDefaults(args[1:], stdout, stderr)
	case "fleet-key":
		err = cmdFleetKey(args[1:], stdout)
	case "ctl":
		err = cmdCtl(ctx, args[1:], stdout, stderr)
	case "restore":
		err = cmdRestore(ctx, args[1:], stdout, stderr)
	case "stop":
		err = cmdStop(ctx, args[1:], stdout, stderr)
	case "version", "--version", "-v":
		fmt.Fprintln(stdout, versionString())
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "hapilot: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "hapilot %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

func versionString() string {
	v := "hapilot " + version
	if bi, ok := debug.ReadBuildInfo(); ok {
		v += " " + bi.GoVersion
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += " " + s.Value[:12]
			}
		}
	}
	return v
}

// defaultsHeader opens `hapilot defaults` and the packaged
// /etc/hapilot/hapilot.conf.
const defaultsHeader = `hapilot settings: one "name value" per line, names as the flags of
'hapilot run' without dashes; flags on the command line win. Every
setting is below, commented out at its default: uncomment what you change.
Check a change with: hapilot check --config /etc/hapilot/hapilot.conf`

// cmdDefaults prints the settings file. With --packaged it sets what the
// Debian package's service needs (its state and audit files under the
// unit's StateDirectory and LogsDirectory) above the commented defaults.
func cmdDefaults(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hapilot defaults", flag.ContinueOnError)
	fs.SetOutput(stderr)
	packaged := fs.Bool("packaged", false, "the file the Debian package installs as /etc/hapilot/hapilot.conf")
	if err := fs.Parse(args); err != nil {
		return err
	}
	settings := flag.NewFlagSet("hapilot run", flag.ContinueOnError)
	config.Register(settings)
	if *packaged {
		header := defaultsHeader + "\n\nSet by the package: observe first (/usr/share/doc/hapilot/docs/howto/install.md shows the step\nto enforce), and the paths its systemd unit makes writable (/lib/systemd/system/hapilot.service):"
		return config.WriteFile(stdout, settings, header, PackagedSettings...)
	}
	return config.WriteFile(stdout, settings, defaultsHeader)
}

// PackagedSettings are the lines the Debian package sets in
// /etc/hapilot/hapilot.conf: paths its unit makes writable.
var PackagedSettings = []string{
	// Observe first: the package installs an agent that watches and
	// says what it would do; docs/howto/install.md shows the step to enforce.
	"mode observe",
	"state-file /var/lib/hapilot/state.json",
	"audit-log /var/log/hapilot/audit.jsonl",
}

func parse(name string, args []string, stderr io.Writer) (*config.Config, error) {
	fs := flag.NewFlagSet("hapilot "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := config.Register(fs)
	if err := config.Parse(fs, args); err != nil {
		return nil, err
	}
	return c, nil
}

func newLogger(c *config.Config, stderr io.Writer) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(c.LogLevel)
	if err != nil {
		return zerolog.Logger{}, fmt.Errorf("log-level: %w", err)
	}
	w := stderr
	console := c.LogFormat == config.LogConsole
	if c.LogFormat == config.LogAuto {
		if f, ok := stderr.(*os.File); ok {
			if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
				console = true
			}
		}
	}
	if console {
		w = zerolog.ConsoleWriter{Out: stderr, TimeFormat: "15:04:05.000"}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}

// cmdRun runs the agent until ctx ends (SIGINT, SIGTERM); each signal on
// hup reopens its audit log meanwhile.
func cmdRun(ctx context.Context, args []string, stderr io.Writer, hup <-chan os.Signal) error {
	c, err := parse("run", args, stderr)
	if err != nil {
		return err
	}
	log, err := newLogger(c, stderr)
	if err != nil {
		return err
	}
	d, err := daemon.New(*c, log)
	if err != nil {
		return err
	}
	served := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // owned here: stopped once Serve returns, and waited for
		defer wg.Done()
		for {
			select {
			case <-served:
				return
			case <-hup:
				d.Reopen()
			}
		}
	}()
	err = d.Serve(ctx)
	close(served)
	wg.Wait()
	return err
}

// cmdCheck validates the settings; with --live it also checks them
// against the running HAProxy, and fails when the agent could not act or
// could not see.
func cmdCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hapilot check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	live := fs.Bool("live", false, "also check against the running HAProxy: version and level of each socket, the servers governed and left alone, whether each telemetry path delivers the traffic HAProxy counts, and the advice per version; exits non-zero when the agent could not act or see")
	wait := fs.Duration("live-wait", daemon.LiveWait, "with --live, how long to listen for telemetry")
	c := config.Register(fs)
	if err := config.Parse(fs, args); err != nil {
		return err
	}
	if err := c.Validate(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "ok: policy %s, interval %v, window %v, spoe %s, status %s, haproxy %v, mode %s\n",
		c.Policy, c.Loop.Interval, c.Window, c.SPOEListen, c.StatusListen, c.HAProxySockets, c.Loop.Mode)
	if !*live {
		return nil
	}
	r := daemon.LiveCheck(ctx, *c, *wait)
	r.Write(stdout)
	if len(r.Problems) > 0 {
		return fmt.Errorf("--live: %d problem(s): %s", len(r.Problems), strings.Join(r.Problems, "; "))
	}
	return nil
}
