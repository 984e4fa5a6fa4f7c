package dataset

import (
	"time"

	"github.com/hapilot/hapilot/agent/policy/llm/calibrate/fixtures"
)

// Holdout is what training must not show: every backend and server name
// of calibration's sequences, and the size and weight of each of their
// backends (a training backend of that many servers all at that weight
// is refused; a fleet of another size, or of mixed weights, is not).
type Holdout struct {
	Names map[string]bool
	Sizes map[[2]int]bool // {servers, weight}
}

// CalibrationHoldout reads the hold-out from fixtures.Sequences, so that a
// new calibration case is held out without a change here.
func CalibrationHoldout() Holdout {
	h := Holdout{Names: map[string]bool{}, Sizes: map[[2]int]bool{}}
	for _, seq := range fixtures.Sequences(time.Unix(0, 0)) {
		for _, st := range seq.Steps {
			for _, b := range st.Obs.Backends {
				h.Names[b.Name] = true
				for _, s := range b.Servers {
					h.Names[s.Server] = true
				}
				h.Sizes[[2]int{len(b.Servers), b.Servers[0].State.Initial}] = true
			}
		}
	}
	return h
}

// Allows reports whether a simulated backend stays clear of the hold-out.
func (h Holdout) Allows(b *sbackend) bool {
	if h.Names[b.name] {
		return false
	}
	uniform := true
	for _, s := range b.servers {
		if h.Names[s.name] {
			return false
		}
		uniform = uniform && s.weight == b.servers[0].weight
	}
	return !uniform || !h.Sizes[[2]int{len(b.servers), b.servers[0].weight}]
}
