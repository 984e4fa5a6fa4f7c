//go:build !race

package dataset

const underRace = false
