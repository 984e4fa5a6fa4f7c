// Package wait holds the one sleep that a cancelled context cuts short,
// for every loop of the agent that waits between tries (the model's
// life cycle, a model pull's polling, the webhook's retries).
package wait

import (
	"context"
	"time"
)

// Sleep waits d, or less if ctx ends first; it reports whether the whole
// d passed, so that a caller stops at once on false.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
