package wait

import (
	"context"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cancel bool
		d      time.Duration
		want   bool
	}{
		{"a short wait passes", false, time.Millisecond, true},
		{"a cancelled context cuts an hour short", true, time.Hour, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				cancel()
			}
			if got := Sleep(ctx, tc.d); got != tc.want {
				t.Fatalf("Sleep = %v, want %v", got, tc.want)
			}
		})
	}
}
