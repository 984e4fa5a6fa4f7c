package rules

import "fmt"

// Region is where a server's error rate lies against its backend's
// healthy median: the operator's terms for the test's hypotheses.
type Region int

const (
	// RegionHealthy: at most max(HealthyFloor, HealthyRatio × median). The
	// promise (one false drain per ARLDays at most) holds here.
	RegionHealthy Region = iota
	// RegionZone: between healthy and degraded. A server here may be drained,
	// but at most once a ZoneEvery: it is never cycled.
	RegionZone
	// RegionDegraded: at least max(Floor, DegradedRatio × median).
	RegionDegraded
)

func (r Region) String() string {
	switch r {
	case RegionHealthy:
		return "healthy"
	case RegionZone:
		return "zone"
	case RegionDegraded:
		return "degraded"
	}
	return fmt.Sprintf("Region(%d)", int(r))
}

// HealthyMax is the healthy region's upper end for a backend whose
// healthy median is median: the least favourable point of the test's
// null hypothesis.
func (c Config) HealthyMax(median float64) float64 {
	return max(c.HealthyFloor, c.HealthyRatio*median)
}

// DegradedMin is the degraded region's lower end.
func (c Config) DegradedMin(median float64) float64 {
	return max(c.Floor, c.DegradedRatio*median)
}

// Region classifies an error rate in a backend whose healthy median is
// median.
func (c Config) Region(rate, median float64) Region {
	switch {
	case rate <= c.HealthyMax(median):
		return RegionHealthy
	case rate >= c.DegradedMin(median):
		return RegionDegraded
	}
	return RegionZone
}
