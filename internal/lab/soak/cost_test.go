package soak

import (
	"context"
	"testing"
)

// BenchmarkStep is one scheduled step of the real loop at 10,000
// servers over 1,000 backends (go test -bench Step -cpuprofile to see
// where it goes).
func BenchmarkStep(b *testing.B) {
	r, err := newRig(10000, 1000, 33)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for b.Loop() {
		b.StopTimer()
		r.advance(10)
		b.StartTimer()
		r.loop.Step(ctx)
	}
}

func TestCostSmall(t *testing.T) {
	r, err := Cost(20, 2, 33, 3, 2)
	if err != nil {
		t.Fatal(err)
	}
	if r.StepCPUms <= 0 || r.AuditBytesPerDay <= 0 || r.HeapMB <= 0 {
		t.Errorf("cost figures missing: %+v", r)
	}
	if _, err := Cost(3, 2, 33, 1, 1); err == nil {
		t.Error("3 servers over 2 backends accepted")
	}
}
