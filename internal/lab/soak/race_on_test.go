//go:build race

package soak

// scale shrinks the short soak under the race detector, which runs it
// about ten times slower: make test's unit tests run with -race.
const scale = 0.25
