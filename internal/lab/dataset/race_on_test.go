//go:build race

package dataset

// underRace: make test's unit tests run with -race, which runs the
// dataset's generation about ten times slower.
const underRace = true
