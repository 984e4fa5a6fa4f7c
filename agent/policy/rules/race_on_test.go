//go:build race

package rules

// underRace: make test's unit tests run with -race, which runs the
// tail test's long simulations (one goroutine, nothing for the race
// detector to find) about ten times slower; make unit runs them again
// without it.
const underRace = true
