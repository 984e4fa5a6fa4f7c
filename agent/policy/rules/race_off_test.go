//go:build !race

package rules

const underRace = false
