// Package envoyod is Envoy's outlier detection, re-implemented as its
// documentation specifies it, so that the benchmark can run it beside
// hapilot as a baseline: the detector an Envoy, Istio or Envoy Gateway
// user gets by default.
//
// Sources (both in envoyproxy/envoy):
//   - api/envoy/config/cluster/v3/outlier_detection.proto: every field
//     and its default;
//   - docs/root/intro/arch_overview/upstream/outlier.rst: the ejection
//     algorithm (inline consecutive-error ejection, success-rate and
//     failure-percentage sweeps every interval, ejection time growing with
//     the times ejected in a row up to max_ejection_time, the multiplier
//     decremented at each sweep a host is healthy, max_ejection_percent
//     with at least one host ejectable).
//
// What it leaves out: split_external_local_origin_errors (off by default:
// every error counts as a 5xx, as here), active health checking (the lab's
// fleet has none in this mode), max_ejection_time_jitter (0 by default),
// and the load balancer's panic threshold (50% by default, never reached
// with max_ejection_percent at 10%).
//
// It is a baseline of the lab: it acts on HAProxy through the runtime
// socket (drain to eject, ready to return), with none of hapilot's
// guardrails, as Envoy has none of them. The agent binary never links it.
package envoyod

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Config holds Envoy's OutlierDetection fields that apply to HTTP
// upstreams; percentages are 0..100, as in the proto.
type Config struct {
	Consecutive5xx                     int
	ConsecutiveGatewayFailure          int
	Interval                           time.Duration
	BaseEjectionTime                   time.Duration
	MaxEjectionTime                    time.Duration
	MaxEjectionPercent                 int
	EnforcingConsecutive5xx            int
	EnforcingConsecutiveGatewayFailure int
	EnforcingSuccessRate               int
	SuccessRateMinimumHosts            int
	SuccessRateRequestVolume           int
	SuccessRateStdevFactor             int // thousandths: 1900 is 1.9
	FailurePercentageThreshold         int
	EnforcingFailurePercentage         int
	FailurePercentageMinimumHosts      int
	FailurePercentageRequestVolume     int
	// AlwaysEjectOneHost (Envoy 1.31, default false) lets one host be
	// ejected whatever max_ejection_percent. Without it, since Envoy 1.28,
	// max_ejection_percent is always respected: at 10%, no host of 9.
	AlwaysEjectOneHost bool
}

// Defaults are outlier_detection.proto's.
func Defaults() Config {
	return Config{
		Consecutive5xx:                     5,
		ConsecutiveGatewayFailure:          5,
		Interval:                           10 * time.Second,
		BaseEjectionTime:                   30 * time.Second,
		MaxEjectionTime:                    300 * time.Second,
		MaxEjectionPercent:                 10,
		EnforcingConsecutive5xx:            100,
		EnforcingConsecutiveGatewayFailure: 0,
		EnforcingSuccessRate:               100,
		SuccessRateMinimumHosts:            5,
		SuccessRateRequestVolume:           100,
		SuccessRateStdevFactor:             1900,
		FailurePercentageThreshold:         85,
		EnforcingFailurePercentage:         0,
		FailurePercentageMinimumHosts:      5,
		FailurePercentageRequestVolume:     50,
	}
}

// fields maps the proto's field names to Config's, for ParseConfig.
func (c *Config) fields() map[string]any {
	return map[string]any{
		"consecutive_5xx":                       &c.Consecutive5xx,
		"consecutive_gateway_failure":           &c.ConsecutiveGatewayFailure,
		"interval":                              &c.Interval,
		"base_ejection_time":                    &c.BaseEjectionTime,
		"max_ejection_time":                     &c.MaxEjectionTime,
		"max_ejection_percent":                  &c.MaxEjectionPercent,
		"enforcing_consecutive_5xx":             &c.EnforcingConsecutive5xx,
		"enforcing_consecutive_gateway_failure": &c.EnforcingConsecutiveGatewayFailure,
		"enforcing_success_rate":                &c.EnforcingSuccessRate,
		"success_rate_minimum_hosts":            &c.SuccessRateMinimumHosts,
		"success_rate_request_volume":           &c.SuccessRateRequestVolume,
		"success_rate_stdev_factor":             &c.SuccessRateStdevFactor,
		"failure_percentage_threshold":          &c.FailurePercentageThreshold,
		"enforcing_failure_percentage":          &c.EnforcingFailurePercentage,
		"failure_percentage_minimum_hosts":      &c.FailurePercentageMinimumHosts,
		"failure_percentage_request_volume":     &c.FailurePercentageRequestVolume,
		"always_eject_one_host":                 &c.AlwaysEjectOneHost,
	}
}

// FieldNames lists the fields ParseConfig takes, sorted.
func FieldNames() []string {
	var c Config
	var out []string
	for k := range c.fields() {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// ParseConfig reads "field=value,field=value" over Defaults, with the
// proto's field names (durations as Go writes them: 10s, 300ms).
func ParseConfig(s string) (Config, error) {
	c := Defaults()
	f := c.fields()
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return c, fmt.Errorf("envoy setting %q: want field=value", kv)
		}
		switch p := f[strings.TrimSpace(k)].(type) {
		case *int:
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n < 0 {
				return c, fmt.Errorf("envoy setting %s: %q is not a count", k, v)
			}
			*p = n
		case *bool:
			b, err := strconv.ParseBool(strings.TrimSpace(v))
			if err != nil {
				return c, fmt.Errorf("envoy setting %s: %q is not true or false", k, v)
			}
			*p = b
		case *time.Duration:
			d, err := time.ParseDuration(strings.TrimSpace(v))
			if err != nil || d <= 0 {
				return c, fmt.Errorf("envoy setting %s: %q is not a duration", k, v)
			}
			*p = d
		default:
			return c, fmt.Errorf("envoy setting %q: want one of %s", k, strings.Join(FieldNames(), ", "))
		}
	}
	return c, c.validate()
}

func (c Config) validate() error {
	for _, p := range []int{c.MaxEjectionPercent, c.EnforcingConsecutive5xx, c.EnforcingConsecutiveGatewayFailure, c.EnforcingSuccessRate,
		c.FailurePercentageThreshold, c.EnforcingFailurePercentage} {
		if p > 100 {
			return fmt.Errorf("envoy settings: a percentage above 100 (%d)", p)
		}
	}
	if c.Interval <= 0 || c.BaseEjectionTime <= 0 {
		return fmt.Errorf("envoy settings: interval and base_ejection_time must be positive")
	}
	return nil
}

// Reason is the detection type behind an ejection, as Envoy names it in
// its outlier detection event log.
type Reason string

const (
	Consecutive5xx            Reason = "CONSECUTIVE_5XX"
	ConsecutiveGatewayFailure Reason = "CONSECUTIVE_GATEWAY_FAILURE"
	SuccessRate               Reason = "SUCCESS_RATE"
	FailurePercentage         Reason = "FAILURE_PERCENTAGE"
)

// Action is an ejection or a return to service.
type Action struct {
	At     time.Time
	Host   string
	Eject  bool   // false: returned to service
	Reason Reason // ejections only
	// For success-rate ejections: the host's rate and the sweep's
	// threshold, in percent.
	Rate, Threshold float64
}

func (a Action) String() string {
	if !a.Eject {
		return a.Host + " returned to service"
	}
	return fmt.Sprintf("%s ejected (%s)", a.Host, a.Reason)
}

type host struct {
	consec5xx, consecGateway int
	total, failed            int // this interval's
	ejected                  bool
	ejectedAt                time.Time
	multiplier               int // ejections in a row, decremented at each healthy sweep
	ejections                int
}

// Detector is one cluster's outlier detector. It is not safe for
// concurrent use: the caller serialises Record and Sweep.
type Detector struct {
	cfg   Config
	hosts map[string]*host
	order []string
	// Roll returns a number in [0, 100) for the enforcing_* coins;
	// nil always enforces when enforcing > 0.
	Roll func() int
	// Last is what the latest sweep computed.
	Last SweepStats
	// Detected counts the consecutive-error detections by type, enforced
	// or not (Envoy's ejections_detected_* statistics).
	Detected map[Reason]int
}

// SweepStats is one sweep's success-rate arithmetic, for the record.
type SweepStats struct {
	At time.Time `json:"at"`
	// Hosts had success_rate_request_volume; Rates are theirs, in
	// percent.
	Hosts []string  `json:"hosts"`
	Rates []float64 `json:"success_rates"`
	// Ran: at least success_rate_minimum_hosts hosts had the volume, so
	// Mean, Stdev and Threshold were computed.
	Ran       bool    `json:"ran"`
	Mean      float64 `json:"mean"`
	Stdev     float64 `json:"stdev"`
	Threshold float64 `json:"threshold"`
	Ejected   int     `json:"ejected"`
}

// New is a detector over a fixed set of hosts.
func New(cfg Config, hosts []string) *Detector {
	d := &Detector{cfg: cfg, hosts: map[string]*host{}}
	for _, h := range hosts {
		if _, ok := d.hosts[h]; !ok {
			d.hosts[h] = &host{}
			d.order = append(d.order, h)
		}
	}
	return d
}

// Config is the detector's configuration.
func (d *Detector) Config() Config { return d.cfg }

// Ejected tells whether h is out of service.
func (d *Detector) Ejected(h string) bool {
	if x := d.hosts[h]; x != nil {
		return x.ejected
	}
	return false
}

// Multiplier is h's ejection time multiplier (ejections in a row).
func (d *Detector) Multiplier(h string) int {
	if x := d.hosts[h]; x != nil {
		return x.multiplier
	}
	return 0
}

func (d *Detector) enforce(pct int) bool {
	if pct <= 0 {
		return false
	}
	if pct >= 100 || d.Roll == nil {
		return true
	}
	return d.Roll() < pct
}

// Record takes one response of host h: its HTTP status (0 or negative:
// no answer, a local-origin failure, which Envoy by default counts as a
// 5xx and a gateway failure). Consecutive-error ejections happen here,
// inline, as in Envoy; it returns the ejection, if any.
//
// As Envoy's host monitor does: a counter fires when it reaches its
// threshold exactly; the gateway failure is checked first, so when both
// fire on one response the gateway failure is the one recorded (and
// ejects, if enforced); only the counter that fired is reset, and not
// when the host is already ejected (Envoy's main thread ignores the
// event then).
func (d *Detector) Record(now time.Time, h string, status int) *Action {
	x := d.hosts[h]
	if x == nil {
		return nil
	}
	x.total++
	is5xx := status >= 500 || status <= 0
	gateway := status == 502 || status == 503 || status == 504 || status <= 0
	if !is5xx {
		x.consec5xx, x.consecGateway = 0, 0
		return nil
	}
	x.failed++
	var out *Action
	if gateway {
		x.consecGateway++
		if d.cfg.ConsecutiveGatewayFailure > 0 && x.consecGateway == d.cfg.ConsecutiveGatewayFailure {
			out = d.consecutive(now, h, ConsecutiveGatewayFailure, d.cfg.EnforcingConsecutiveGatewayFailure)
		}
	} else {
		x.consecGateway = 0
	}
	x.consec5xx++
	if d.cfg.Consecutive5xx > 0 && x.consec5xx == d.cfg.Consecutive5xx {
		if a := d.consecutive(now, h, Consecutive5xx, d.cfg.EnforcingConsecutive5xx); a != nil {
			out = a
		}
	}
	return out
}

// consecutive is Envoy's onConsecutiveErrorWorker: a detection on a host
// not yet ejected is recorded, its counter reset, and the host ejected
// if the enforcing coin says so.
func (d *Detector) consecutive(now time.Time, h string, why Reason, enforcing int) *Action {
	x := d.hosts[h]
	if x.ejected {
		return nil
	}
	if d.Detected == nil {
		d.Detected = map[Reason]int{}
	}
	d.Detected[why]++
	if why == Consecutive5xx {
		x.consec5xx = 0
	} else {
		x.consecGateway = 0
	}
	if !d.enforce(enforcing) {
		return nil
	}
	return d.eject(now, h, why, 0, 0)
}

// ejectable is max_ejection_percent's test as Envoy runs it since 1.28:
// the ejection keeps the share of ejected hosts at or below it; only
// always_eject_one_host lets the first ejection through regardless.
// (Before 1.28 the first was always let through.)
func (d *Detector) ejectable() bool {
	active := 0
	for _, x := range d.hosts {
		if x.ejected {
			active++
		}
	}
	if active == 0 && d.cfg.AlwaysEjectOneHost {
		return true
	}
	return 100*float64(active+1)/float64(len(d.hosts)) <= float64(d.cfg.MaxEjectionPercent)
}

func (d *Detector) eject(now time.Time, h string, why Reason, rate, threshold float64) *Action {
	x := d.hosts[h]
	if x.ejected || !d.ejectable() {
		return nil
	}
	x.ejected, x.ejectedAt = true, now
	x.ejections++
	// Envoy's ejectHost grows the backoff while backoff·base < max +
	// base: with 30 s and 300 s it stops at 11, not 10 (the time is
	// still capped at max_ejection_time; the extra step is one more
	// healthy interval before the time shrinks).
	if d.cfg.MaxEjectionTime <= 0 || time.Duration(x.multiplier)*d.cfg.BaseEjectionTime < d.cfg.MaxEjectionTime+d.cfg.BaseEjectionTime {
		x.multiplier++
	}
	return &Action{At: now, Host: h, Eject: true, Reason: why, Rate: rate, Threshold: threshold}
}

// EjectionTime is how long h stays out for its current multiplier:
// base_ejection_time times the ejections in a row, at most
// max_ejection_time (but never below base_ejection_time).
func (d *Detector) EjectionTime(h string) time.Duration {
	x := d.hosts[h]
	if x == nil {
		return 0
	}
	t := time.Duration(max(x.multiplier, 1)) * d.cfg.BaseEjectionTime
	if d.cfg.MaxEjectionTime > 0 && t > d.cfg.MaxEjectionTime {
		t = max(d.cfg.MaxEjectionTime, d.cfg.BaseEjectionTime)
	}
	return t
}

// Stats is one host's interval, as a sweep saw it.
type Stats struct {
	Host          string
	Total, Failed int
}

// SuccessRateThreshold is Envoy's success-rate sweep arithmetic over the
// hosts' success rates in percent: the mean, the population standard
// deviation, and mean − stdev·factor/1000.
func SuccessRateThreshold(rates []float64, factor int) (mean, stdev, threshold float64) {
	if len(rates) == 0 {
		return 0, 0, 0
	}
	for _, r := range rates {
		mean += r
	}
	mean /= float64(len(rates))
	var v float64
	for _, r := range rates {
		v += (r - mean) * (r - mean)
	}
	stdev = math.Sqrt(v / float64(len(rates)))
	return mean, stdev, mean - stdev*float64(factor)/1000
}

// Sweep is the interval timer's work (Envoy's onIntervalTimer): return
// hosts whose ejection time has passed, run the success-rate and
// failure-percentage detections over the interval's counts, then
// decrement the multiplier of every host that was in service through the
// interval and still is, and start a new interval. The decrement comes
// after the detections: a host this sweep ejects is not decremented
// first, so its multiplier grows by one (decremented before, it kept its
// value). Actions come in host order.
func (d *Detector) Sweep(now time.Time) []Action {
	var out []Action
	returned := map[string]bool{}
	for _, h := range d.order {
		x := d.hosts[h]
		if x.ejected && now.Sub(x.ejectedAt) >= d.EjectionTime(h) {
			x.ejected = false
			x.consec5xx, x.consecGateway = 0, 0
			returned[h] = true
			out = append(out, Action{At: now, Host: h})
		}
	}
	defer func() {
		for h, x := range d.hosts {
			if !x.ejected && !returned[h] && x.multiplier > 0 {
				x.multiplier--
			}
		}
	}()
	// Success rate: hosts with success_rate_request_volume in the
	// interval, and at least success_rate_minimum_hosts of them.
	var srHosts []string
	var rates []float64
	var fpHosts []string
	for _, h := range d.order {
		x := d.hosts[h]
		if x.ejected {
			continue
		}
		if x.total >= d.cfg.SuccessRateRequestVolume && x.total > 0 {
			srHosts = append(srHosts, h)
			rates = append(rates, 100*float64(x.total-x.failed)/float64(x.total))
		}
		if x.total >= d.cfg.FailurePercentageRequestVolume && x.total > 0 {
			fpHosts = append(fpHosts, h)
		}
	}
	d.Last = SweepStats{At: now, Hosts: srHosts, Rates: rates}
	if d.cfg.EnforcingSuccessRate > 0 && len(srHosts) >= d.cfg.SuccessRateMinimumHosts && len(srHosts) > 0 {
		mean, stdev, threshold := SuccessRateThreshold(rates, d.cfg.SuccessRateStdevFactor)
		d.Last.Ran, d.Last.Mean, d.Last.Stdev, d.Last.Threshold = true, mean, stdev, threshold
		for i, h := range srHosts {
			if rates[i] < threshold && d.enforce(d.cfg.EnforcingSuccessRate) {
				if a := d.eject(now, h, SuccessRate, rates[i], threshold); a != nil {
					out = append(out, *a)
				}
			}
		}
	}
	if d.cfg.EnforcingFailurePercentage > 0 && len(fpHosts) >= d.cfg.FailurePercentageMinimumHosts && len(fpHosts) > 0 {
		for _, h := range fpHosts {
			x := d.hosts[h]
			fail := 100 * float64(x.failed) / float64(x.total)
			if fail >= float64(d.cfg.FailurePercentageThreshold) && d.enforce(d.cfg.EnforcingFailurePercentage) {
				if a := d.eject(now, h, FailurePercentage, 100-fail, 100-float64(d.cfg.FailurePercentageThreshold)); a != nil {
					out = append(out, *a)
				}
			}
		}
	}
	for _, x := range d.hosts {
		x.total, x.failed = 0, 0
	}
	for _, a := range out {
		if a.Eject {
			d.Last.Ejected++
		}
	}
	return out
}
