package guard

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"
)

// Cap bounds how many of a backend's servers the agent may hold drained
// at once: a count, or a percentage of the backend's servers (rounded
// down, at least one). The zero Cap is no cap.
type Cap struct {
	N       int  `json:"n"`
	Percent bool `json:"percent,omitempty"`
}

// ParseCap reads "3" or "25%".
func ParseCap(s string) (Cap, error) {
	pct := strings.HasSuffix(s, "%")
	n, err := strconv.Atoi(strings.TrimSuffix(s, "%"))
	if err != nil || n < 0 || (pct && n > 100) {
		return Cap{}, fmt.Errorf("max-drained %q: want a count (3) or a percentage (25%%)", s)
	}
	return Cap{N: n, Percent: pct}, nil
}

func (c Cap) String() string {
	if c.Percent {
		return strconv.Itoa(c.N) + "%"
	}
	return strconv.Itoa(c.N)
}

// Of is the cap for a backend of n servers; 0 when there is none.
func (c Cap) Of(n int) int {
	if !c.Percent {
		return c.N
	}
	if c.N == 0 {
		return 0
	}
	return max(1, n*c.N/100)
}

// DrainAction is what a drain sends: HAProxy's drain (persistent
// sessions still reach the server) or maint (nothing does).
type DrainAction string

const (
	ActionDrain DrainAction = "drain"
	ActionMaint DrainAction = "maint"
)

// BackendSettings are the settings one block of the config file gives
// the backends its pattern matches. A nil field leaves the global
// setting (the flag's) in force.
type BackendSettings struct {
	// Pattern is a backend name or a glob (path.Match: *, ?, [a-z]).
	Pattern    string `json:"pattern"`
	Enabled    *bool  `json:"enabled,omitempty"`
	MinServing *int   `json:"min_serving,omitempty"`
	MaxDrained *Cap   `json:"max_drained,omitempty"`
	// The rules' own keys of a block (rules-floor, ...) are the rules'
	// value (rules.Blocks), validated as their flags are; a block that
	// sets only those is declared here still, so that /status lists it.
	Action *DrainAction `json:"action,omitempty"`
	// LeaveAlone are server names or globs the agent never acts on.
	LeaveAlone []string `json:"leave_alone,omitempty"`
}

// BackendKeys are the keys of a backend block the agent's guardrails
// own; the policy's own keys (rules.OverrideKeys) are its to parse.
var BackendKeys = []string{"enabled", "min-serving", "max-drained", "action", "leave-alone"}

// Scope is every backend block, in the config file's order: a backend
// takes each block its name matches, later blocks over earlier ones. Blocks
// are indexed by pattern, and a pattern without a glob character matches
// only its own name, so that reading n blocks takes time in n, not n²,
// and finding a backend's, time in the globs, not in n: a config
// generated with a block per backend (100,000 of them) is read at once.
type Scope struct {
	blocks []BackendSettings
	index  map[string]int // pattern -> its block's place
	globs  []int          // the places of the patterns with a glob character, in order
}

// isGlob reports whether pattern holds one of path.Match's special
// characters; one that does not matches only the identical name.
func isGlob(pattern string) bool { return strings.ContainsAny(pattern, `*?[\`) }

// SplitBackend reads one "PATTERN.KEY=VALUE" (the --backend flag's form;
// the config file's `backend.PATTERN.KEY VALUE` lines arrive so). The key
// is after the last dot: a backend name may hold dots, a key never does.
func SplitBackend(v string) (pattern, key, value string, err error) {
	lhs, value, ok := strings.Cut(v, "=")
	i := strings.LastIndexByte(lhs, '.')
	if !ok || i <= 0 || i == len(lhs)-1 {
		return "", "", "", fmt.Errorf("backend %q: want PATTERN.KEY=VALUE", v)
	}
	pattern, key = lhs[:i], lhs[i+1:]
	if _, err := path.Match(pattern, ""); err != nil {
		return "", "", "", fmt.Errorf("backend %q: pattern: %w", pattern, err)
	}
	return pattern, key, strings.TrimSpace(value), nil
}

// MatchBackend reports whether a block's pattern matches backend: the
// one matching rule of every block's keys, the agent's and a policy's.
func MatchBackend(pattern, backend string) bool {
	ok, _ := path.Match(pattern, backend)
	return ok
}

// Set applies one "PATTERN.KEY=VALUE" of the agent's own keys.
func (s *Scope) Set(v string) error {
	pattern, key, value, err := SplitBackend(v)
	if err != nil {
		return fmt.Errorf("%w (keys: %s)", err, strings.Join(BackendKeys, ", "))
	}
	return s.SetKey(pattern, key, value)
}

// Declare makes pattern's block, if new, with nothing set: the block of
// a policy's own keys, listed among the blocks a backend matched.
func (s *Scope) Declare(pattern string) error {
	if _, err := path.Match(pattern, ""); err != nil {
		return fmt.Errorf("backend %q: pattern: %w", pattern, err)
	}
	s.block(pattern)
	return nil
}

// SetKey applies one key of pattern's block.
func (s *Scope) SetKey(pattern, key, value string) error {
	if _, err := path.Match(pattern, ""); err != nil {
		return fmt.Errorf("backend %q: pattern: %w", pattern, err)
	}
	b := s.block(pattern)
	var err error
	switch key {
	case "enabled":
		var on bool
		on, err = strconv.ParseBool(value)
		b.Enabled = &on
	case "min-serving":
		var n int
		if n, err = strconv.Atoi(value); err == nil && n < 0 {
			err = errors.New("negative")
		}
		b.MinServing = &n
	case "max-drained":
		var c Cap
		c, err = ParseCap(value)
		b.MaxDrained = &c
	case "action":
		a := DrainAction(value)
		if a != ActionDrain && a != ActionMaint {
			err = errors.New("want drain or maint")
		}
		b.Action = &a
	case "leave-alone":
		for _, p := range strings.Split(value, ",") {
			if p = strings.TrimSpace(p); p != "" {
				if _, perr := path.Match(p, ""); perr != nil {
					err = perr
				}
				b.LeaveAlone = append(b.LeaveAlone, p)
			}
		}
	default:
		return fmt.Errorf("backend %s: unknown key %q (keys: %s)", pattern, key, strings.Join(BackendKeys, ", "))
	}
	if err != nil {
		return fmt.Errorf("backend %s.%s %q: %w", pattern, key, value, err)
	}
	return nil
}

func (s *Scope) String() string {
	if s == nil {
		return ""
	}
	var parts []string
	for _, b := range s.blocks {
		parts = append(parts, b.Pattern)
	}
	return strings.Join(parts, ",")
}

// Len is how many blocks there are.
func (s *Scope) Len() int {
	if s == nil {
		return 0
	}
	return len(s.blocks)
}

// block is the block of pattern, added at the end if new.
func (s *Scope) block(pattern string) *BackendSettings {
	if i, ok := s.index[pattern]; ok {
		return &s.blocks[i]
	}
	if s.index == nil {
		s.index = map[string]int{}
	}
	i := len(s.blocks)
	s.index[pattern] = i
	if isGlob(pattern) {
		s.globs = append(s.globs, i)
	}
	s.blocks = append(s.blocks, BackendSettings{Pattern: pattern})
	return &s.blocks[i]
}

// matching are the places of the blocks whose pattern matches backend,
// in order: the globs that match, and the block named exactly so.
func (s Scope) matching(backend string) []int {
	var out []int
	exact, ok := s.index[backend]
	ok = ok && !isGlob(backend)
	for _, i := range s.globs {
		if ok && exact < i {
			out, ok = append(out, exact), false
		}
		if MatchBackend(s.blocks[i].Pattern, backend) {
			out = append(out, i)
		}
	}
	if ok {
		out = append(out, exact)
	}
	return out
}

// For is the settings of backend: every matching block merged, later
// over earlier; Pattern lists the blocks that matched.
func (s Scope) For(backend string) BackendSettings {
	var out BackendSettings
	var matched []string
	for _, i := range s.matching(backend) {
		b := s.blocks[i]
		matched = append(matched, b.Pattern)
		if b.Enabled != nil {
			out.Enabled = b.Enabled
		}
		if b.MinServing != nil {
			out.MinServing = b.MinServing
		}
		if b.MaxDrained != nil {
			out.MaxDrained = b.MaxDrained
		}
		if b.Action != nil {
			out.Action = b.Action
		}
		out.LeaveAlone = append(out.LeaveAlone, b.LeaveAlone...)
	}
	out.Pattern = strings.Join(matched, ",")
	return out
}

// InScope reports whether the agent acts on backend.
func (b BackendSettings) InScope() bool { return b.Enabled == nil || *b.Enabled }

// LeftAlone reports whether server is one of the block's servers to
// leave alone.
func (b BackendSettings) LeftAlone(server string) bool {
	for _, p := range b.LeaveAlone {
		if ok, _ := path.Match(p, server); ok {
			return true
		}
	}
	return false
}

// Maint reports whether a drain of the backend is sent as maint.
func (b BackendSettings) Maint() bool { return b.Action != nil && *b.Action == ActionMaint }

// BackendScope is how a backend stands, for /status and the live page.
type BackendScope struct {
	Backend string `json:"backend"`
	InScope bool   `json:"in_scope"`
	// Blocks are the config blocks that matched it.
	Blocks     string       `json:"blocks,omitempty"`
	MinServing int          `json:"min_serving,omitempty"`
	MaxDrained string       `json:"max_drained,omitempty"`
	Action     DrainAction  `json:"action"`
	LeaveAlone []string     `json:"leave_alone,omitempty"`
	Drains     int          `json:"drains_last_hour"`
	Rates      *RateSummary `json:"rate,omitempty"`
}

// RateSummary is the rate cap's standing on a backend.
type RateSummary struct {
	PerHour int `json:"per_hour"`
	Used    int `json:"used"`
}

// DrainLog keeps each backend's drains of the last hour, for the rate
// cap. It lives in memory: a restart forgets it, which errs toward
// letting a drain through, never toward holding one the floor allows.
type DrainLog map[string][]time.Time

func (d DrainLog) Add(backend string, at time.Time) { d[backend] = append(d[backend], at) }

// within counts backend's drains in the hour before now, dropping older.
func (d DrainLog) Within(backend string, now time.Time) int {
	ts := d[backend]
	i := 0
	for i < len(ts) && !ts[i].After(now.Add(-time.Hour)) {
		i++
	}
	d[backend] = ts[i:]
	return len(ts) - i
}
