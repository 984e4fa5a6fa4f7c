package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"strings"
	"time"

	"github.com/hapilot/hapilot/internal/bench"
)

func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "overhead" {
		return errors.New("usage: hapilot bench overhead [flags] (the study's scenario runner is not here yet)")
	}
	fs := flag.NewFlagSet("hapilot bench overhead", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := bench.OverheadConfig{}
	fs.IntVar(&cfg.Concurrency, "concurrency", 16, "requests in flight")
	fs.DurationVar(&cfg.Duration, "duration", 20*time.Second, "load per telemetry path, split over the rounds")
	fs.IntVar(&cfg.Rounds, "rounds", 4, "interleaved rounds (plain, syslog, lua, spoe, plain, ...)")
	fs.IntVar(&cfg.Backends, "backends", 2, "backend servers, answering at once")
	paths := fs.String("paths", "plain,syslog,lua,spoe", "telemetry paths to compare, plain first (also syslog-noagent, lua-noagent: HAProxy's side alone)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	cfg.Paths = strings.Split(*paths, ",")
	if cfg.Paths[0] != "plain" {
		return errors.New("--paths must start with plain: every ratio is to it")
	}
	if cfg.Concurrency < 1 || cfg.Rounds < 1 || cfg.Backends < 1 || cfg.Duration < time.Second {
		return errors.New("concurrency, rounds and backends must be positive, duration at least 1s")
	}
	dir, err := os.MkdirTemp("", "hapilot-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	res, err := bench.Overhead(ctx, cfg, dir)
	if err != nil {
		return err
	}
	bench.PrintOverhead(stdout, cfg, res)
	return nil
}
