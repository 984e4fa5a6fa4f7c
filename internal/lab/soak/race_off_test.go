//go:build !race

package soak

const scale = 1.0
