package fleetsim

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// A small fleet, in process over loopback: it forms, a fault is drained
// on every node, and a late node catches up with the fleet's word.
func TestSmallFleetConverges(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 40 s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := Run(ctx, Setup{Nodes: 8, Backends: 10, Servers: 10, Rate: 4, Steady: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	WriteTable(&b, []*Result{r})
	t.Logf("decider %s for %s\n%s", r.Decider, r.Faulty, b.String())
	if r.BytesPerNode <= 0 || r.FleetPerNode <= 0 {
		t.Errorf("bytes per node: %.0f in all, %.0f of hapilot's", r.BytesPerNode, r.FleetPerNode)
	}
	if r.Converged < r.Decided {
		t.Errorf("every node drained (%v) before the decider did (%v)", r.Converged, r.Decided)
	}
}
