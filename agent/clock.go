package agent

import (
	"context"
	"time"
)

// Clock is the loop's time: real in production, driven by hand in tests.
type Clock interface {
	Now() time.Time
	// SleepUntil returns at t, or early with ctx's error.
	SleepUntil(ctx context.Context, t time.Time) error
}

// RealClock is the wall clock.
type RealClock struct{}

func (RealClock) Now() time.Time { return time.Now() }

func (RealClock) SleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-tm.C:
		return nil
	}
}
