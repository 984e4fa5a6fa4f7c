package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/hapilot/hapilot/agent/policy/llm/calibrate"
	"github.com/hapilot/hapilot/cmd/hapilot/config"
)

// errCalibrationFailed makes `hapilot calibrate` exit 1 after printing a
// failing scorecard.
var errCalibrationFailed = errors.New("the model failed calibration: it will not be allowed to act")

func cmdCalibrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hapilot calibrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := config.Register(fs)
	if err := config.Parse(fs, args); err != nil {
		return err
	}
	if c.LLM.Model == "" {
		return errors.New("--model is required")
	}
	// The model is judged as `hapilot run` will call it: the same
	// options, and its calls' p95 against the same step deadline.
	sc, err := calibrate.Run(ctx, c.LLM, c.Rules, c.Loop, time.Now())
	if err != nil {
		return err
	}
	sc.Print(stdout)
	path, err := sc.Save(c.LLM.CalibrationDir)
	if err != nil {
		return fmt.Errorf("save record: %w", err)
	}
	fmt.Fprintf(stdout, "record: %s\n", path)
	if !sc.Passed {
		return errCalibrationFailed
	}
	return nil
}
