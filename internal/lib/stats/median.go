package stats

import "slices"

// LowerMedian is the median of v, the lower of the two middle values for
// an even count; 0 for none. It sorts v.
func LowerMedian(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[(len(v)-1)/2]
}
