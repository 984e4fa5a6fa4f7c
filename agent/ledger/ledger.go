package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/safefile"
	"github.com/rs/zerolog"
)

// Ledger owns the agent's changes: who changed each server, when, to
// what, in which HAProxy epoch. Every transition is one method, and
// writes the state file (once for all of a Batch's: a step's), so the
// agent's own restarts lose nothing: a write that fails (a full disk) is
// tried again at every Flush until one succeeds, and the ledger says it
// is unsaved meanwhile. It is safe for
// concurrent use (the status server reads it).
type Ledger struct {
	file string // "" keeps the ledger in memory only
	log  zerolog.Logger
	// OperatorHold is how long an operator's override of the agent's
	// change stands: the agent leaves that server alone until then, or
	// until its state changes again (0: only while it differs from the
	// configured state, as any operator's state).
	OperatorHold time.Duration
	// Now is the clock for the save status; nil means time.Now.
	Now func() time.Time
	// ReapplyWithin: a change read from the state file that a reload
	// lost is applied again at start only if the file was written within
	// it; else the server is judged afresh.
	ReapplyWithin time.Duration
	// Replace writes the state file whole; nil means ReplaceFile. Set
	// it before the ledger is shared (a test counts the writes).
	Replace func(path string, data []byte) error

	// mu guards the fields below. Methods without a lock of their own say
	// that their caller must hold it (or runs before the ledger is shared:
	// load, at start).
	mu sync.Mutex
	// aside, when set, is where the unreadable state file found at start
	// is to be kept before anything is written over it.
	aside     string
	keptAside string // where it was kept
	// unreadErr is why the state file found at start could not be read.
	unreadErr string
	// unsaved: the last write of the state file failed, at since, with
	// saveErr; failures counts every failed write.
	unsaved  bool
	since    time.Time
	saveErr  error
	failures uint64
	// bg, when set, writes the file from a goroutine of its own (see
	// WriteInBackground): save hands it each new state and returns.
	bg *stateWriter
	// batch counts the batches under way (Batch), and dirty says a
	// transition made in one is not yet saved: a step's transitions are
	// one write of the state file, at its end.
	batch int
	dirty bool

	epoch   string
	site    agent.Site
	changes map[agent.Key]*agent.Change
	// fromFile are the changes read from the state file that no step has
	// judged yet against the HAProxy it finds (Reconcile).
	fromFile map[agent.Key]bool
	// foreign are the file's changes made on another HAProxy: not this
	// agent's, but written back as they were, so that the agent of that
	// HAProxy still finds them.
	foreign      map[agent.Key]*agent.Change
	notReapplied []agent.NotReapplied
	// holds keep a server the tail guard brought back to full weight from
	// being drained again until the time given, after its change is over.
	holds map[agent.Key]time.Time
	// overrides are operators' undos of the agent's changes, which stand.
	overrides map[agent.Key]Override
	// pauses hold the agent's actions back, by backend (AllBackends for
	// every one); they survive restarts with the state file.
	pauses map[string]agent.Pause
	// operatorSeen are the servers the agent saw held by someone else
	// (drain or maint), with the state it saw: after a restart they read
	// as the operator's, not as unknown.
	operatorSeen map[agent.Key]string
}

// Override is an operator's undo of the agent's change: the server is
// theirs until Until, or until its state leaves the one they set.
type Override struct {
	Until      time.Time `json:"until"`
	AdminState int       `json:"admin_state"`
	Weight     int       `json:"weight"`
	// Released: the operator asked for it (hapilot ctl release or
	// restore) rather than changing the server behind the agent's back.
	Released bool `json:"released,omitempty"`
}

// MaxStateFile bounds the state file read at start: a change is a few
// hundred bytes, and --max-servers of them fit many times over.
const MaxStateFile = 16 << 20

// Open reads file, if it exists, and returns the ledger it holds.
// A path that is not a regular file (a FIFO, a link, a directory, a
// device) is an error: the agent refuses to start on it, and checking it
// never blocks. So is a file someone other than the agent's user, root or
// the owner of its folder may have written (safefile.Trust): its owner,
// or a mode that lets group or others write it. A file that cannot be read (truncated, of an unknown
// version, too big) is logged, kept aside as FILE.bad-TIME, and the
// ledger starts empty: the servers it named then read as the operator's,
// which is the safe side.
func Open(file string, log zerolog.Logger) (*Ledger, error) {
	l := newLedger(file, log)
	err := l.load()
	if errors.Is(err, safefile.ErrNotRegular) {
		return nil, fmt.Errorf("state file: %w", err)
	}
	if errors.Is(err, safefile.ErrUntrusted) {
		return nil, err
	}
	if err != nil {
		l.unreadable(err)
	}
	return l, nil
}

// New is Open for callers that cannot refuse to start: a
// path that is not a regular file is kept aside like an unreadable one.
func New(file string, log zerolog.Logger) *Ledger {
	l := newLedger(file, log)
	if err := l.load(); err != nil {
		l.unreadable(err)
	}
	return l
}

func newLedger(file string, log zerolog.Logger) *Ledger {
	return &Ledger{file: file, log: log, changes: map[agent.Key]*agent.Change{}, holds: map[agent.Key]time.Time{}, overrides: map[agent.Key]Override{},
		pauses: map[string]agent.Pause{}, operatorSeen: map[agent.Key]string{}, fromFile: map[agent.Key]bool{}, foreign: map[agent.Key]*agent.Change{},
		ReapplyWithin: agent.DefaultReapplyWithin}
}

func (l *Ledger) now() time.Time {
	if l.Now == nil {
		return time.Now()
	}
	return l.Now()
}

// unreadable logs why the state file could not be read and keeps it
// aside; if that fails, every write tries again first, so nothing
// overwrites it. Called by load, before the ledger is shared.
func (l *Ledger) unreadable(err error) {
	l.unreadErr = err.Error()
	l.aside = l.file + ".bad-" + l.now().UTC().Format("20060102T150405Z")
	l.log.Error().Err(err).Str("file", l.file).Str("kept_as", l.aside).
		Msg("cannot read the state file; keeping it aside, and starting with no record of earlier changes")
	if err := l.keepAside(); err != nil {
		l.log.Error().Err(err).Str("file", l.file).Msg("cannot keep the unreadable state file aside; nothing is written over it until it is")
	}
}

// keepAside renames the unreadable state file to l.aside (or, if a file
// of that name exists, l.aside.N), once. Called with l.mu held, or before
// the ledger is shared.
func (l *Ledger) keepAside() error {
	if l.aside == "" {
		return nil
	}
	to := l.aside
	for i := 1; i <= 100; i++ {
		if _, err := os.Lstat(to); err != nil {
			break // free (or unreachable: the rename says why)
		}
		to = l.aside + "." + strconv.Itoa(i)
	}
	if err := os.Rename(l.file, to); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("keep the unreadable state file aside as %s: %w", to, err)
	}
	l.log.Warn().Str("file", l.file).Str("kept_as", to).Msg("the unreadable state file is kept aside")
	l.aside, l.keptAside = "", to
	return nil
}

// SetEpoch records the HAProxy processes now running; it reports the
// previous epoch when this one differs ("" on the first call).
func (l *Ledger) SetEpoch(epoch string) (was string, changed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	was, changed = l.epoch, l.epoch != epoch
	l.epoch = epoch
	return was, changed
}

// SetSite records the HAProxy now observed (see Site).
func (l *Ledger) SetSite(site agent.Site) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.site = site
}

// Reconcile says who holds server k, whose merged state is s, at now. A
// change still in force is adopted under the current epoch. One that a
// reload lost (the server is back at its configured state under a new
// epoch) stays, and reapply is set so that the loop applies it again. One
// that someone else undid or replaced is lost, and the server is the
// operator's for OperatorHold, even back at its configured state: their
// word stands until then, or until the server's state changes again.
// It is Judge and Apply in one.
func (l *Ledger) Reconcile(k agent.Key, s haproxy.ServerState, now time.Time) (owner agent.Owner, ch *agent.Change, reapply bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	j := l.judge(k, s, now, l.epoch, l.site)
	l.apply(j)
	return j.Owner, j.Change, j.Reapply
}

// Judgment is the ledger's word on one server as one observation finds
// it (Judge), with the transition that word makes, which Apply records:
// an observation reads the ledger, and the step writes what it found.
type Judgment struct {
	Server agent.Key
	// Owner holds the server; Change is the agent's change in force on
	// it (its own only), adopted under the observation's epoch; Reapply:
	// a reload lost it, and the loop applies it again.
	Owner   agent.Owner
	Change  *agent.Change
	Reapply bool
	// OperatorUntil is when an operator's override of the agent's change
	// stops holding the agent off, as of the judgment (zero: none).
	OperatorUntil time.Time

	state        haproxy.ServerState
	epoch        string
	site         agent.Site
	dropOverride bool // the override stands no more
	fromFile     bool // the state file's change is judged here
	// notHere: the file's change is not taken up here, and why; foreign:
	// it is another HAProxy's, kept in the file for its agent.
	notHere string
	foreign bool
	adopt   bool      // the change holds: adopted under epoch and site
	lose    bool      // someone else undid or replaced the change
	hold    *Override // the operator's override the loss starts
}

// Judge is Reconcile without the write: who holds server k, whose
// merged state is s, at now, under the HAProxy of epoch and site, and
// the transition that makes, for Apply. It changes nothing.
func (l *Ledger) Judge(k agent.Key, s haproxy.ServerState, now time.Time, epoch string, site agent.Site) Judgment {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.judge(k, s, now, epoch, site)
}

// judge is Judge. Called with l.mu held.
func (l *Ledger) judge(k agent.Key, s haproxy.ServerState, now time.Time, epoch string, site agent.Site) Judgment {
	j := Judgment{Server: k, state: s, epoch: epoch, site: site}
	if o, ok := l.overrides[k]; ok {
		if now.Before(o.Until) && s.AdminState == o.AdminState && s.Weight == o.Weight {
			j.Owner, j.OperatorUntil = agent.OwnerOperator, o.Until
			return j
		}
		j.dropOverride = true
	}
	c := l.changes[k]
	if c != nil && l.fromFile[k] {
		j.fromFile = true
		if why, foreign := notForHere(c, s, now, epoch, site, l.ReapplyWithin); why != "" {
			j.notHere, j.foreign = why, foreign
			c = nil
		}
	}
	if c != nil {
		pristine := s.AdminState == 0 && s.Weight == s.Initial
		switch {
		case c.Holds(s):
			j.adopt = true
			cp := *c
			cp.Epoch, cp.Site = epoch, site
			j.Owner, j.Change = agent.OwnerAgent, &cp
			return j
		case pristine && c.Epoch != epoch:
			cp := *c
			j.Owner, j.Change, j.Reapply = agent.OwnerAgent, &cp, true
			return j
		}
		j.lose = true
		if l.OperatorHold > 0 {
			j.hold = &Override{Until: now.Add(l.OperatorHold), AdminState: s.AdminState, Weight: s.Weight}
			j.Owner, j.OperatorUntil = agent.OwnerOperator, j.hold.Until
			return j
		}
	}
	if s.AdminState != 0 || s.Weight != s.Initial {
		j.Owner = agent.OwnerOperator
	} else {
		j.Owner = agent.OwnerNone
	}
	return j
}

// Apply records the transitions of judgments an observation made
// (Judge), in their order.
func (l *Ledger) Apply(judgments []Judgment) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, j := range judgments {
		l.apply(j)
	}
}

// apply records one judgment's transition. Called with l.mu held.
func (l *Ledger) apply(j Judgment) {
	k := j.Server
	if j.dropOverride {
		delete(l.overrides, k)
		l.changed()
	}
	if j.fromFile {
		delete(l.fromFile, k)
	}
	if j.notHere != "" {
		c := l.changes[k]
		l.log.Warn().Stringer("server", k).Str("phase", string(c.Phase)).Time("at", c.At).Str("why", j.notHere).
			Msg("a change from the state file is not taken up: the server is judged afresh")
		l.notReapplied = append(l.notReapplied, agent.NotReapplied{Server: k, Change: *c, Why: j.notHere})
		delete(l.changes, k)
		if j.foreign {
			l.foreign[k] = c
		}
		l.changed()
	}
	if c := l.changes[k]; c != nil && j.adopt {
		c.Epoch, c.Site = j.epoch, j.site
	}
	if c := l.changes[k]; c != nil && j.lose {
		l.log.Warn().Stringer("server", k).Str("phase", string(c.Phase)).Str("now", j.state.Label()).Int("weight", j.state.Weight).
			Dur("for", l.OperatorHold).Msg("the agent's change was overridden outside the agent; leaving the server to the operator")
		delete(l.changes, k)
		if j.hold != nil {
			l.overrides[k] = *j.hold
		}
		l.changed()
	}
}

// Epoch is the HAProxy processes last recorded (SetEpoch).
func (l *Ledger) Epoch() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.epoch
}

// notForHere says why a change read from the state file is not the
// agent's on the HAProxy it finds, "" when it is: it was made on another
// HAProxy (a per-user file used against a second one, a file copied from
// another host), or a reload lost it longer ago than ReapplyWithin, when
// the server's faults may be long over.
func notForHere(c *agent.Change, s haproxy.ServerState, now time.Time, epoch string, site agent.Site, within time.Duration) (why string, foreign bool) {
	if c.Site != "" && site != "" && c.Site != site {
		return fmt.Sprintf("made on another HAProxy (%s), not this one (%s)", c.Site, site), true
	}
	lost := s.AdminState == 0 && s.Weight == s.Initial && !c.Holds(s) && c.Epoch != epoch
	if !lost {
		return "", false
	}
	ref := c.Saved
	if c.At.After(ref) {
		ref = c.At // a file of an earlier agent: the change's own time
	}
	if age := now.Sub(ref); age > within {
		return fmt.Sprintf("lost to a reload, and last recorded %v ago, beyond --reapply-within %v", age.Round(time.Second), within), false
	}
	return "", false
}

// Drain records that the agent drained k.
func (l *Ledger) Drain(k agent.Key, at time.Time, reason string, errorRate, baselineP99Ms float64, slowMs int, slowMean, maint bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.put(k, &agent.Change{Phase: agent.PhaseDrained, At: at, Reason: reason, ErrorRate: errorRate, BaselineP99Ms: baselineP99Ms, SlowMs: slowMs, SlowMean: slowMean, Maint: maint})
}

// Cut records that the agent set k's weight to weight, with the
// backend's p99 before it for the tail guard. On a drained server that
// only stages the weight it will come back at, so the drain stays the
// change in force; back at the configured weight, the change is over.
func (l *Ledger) Cut(k agent.Key, weight, initial int, at time.Time, reason string, baselineP99Ms float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.changes[k]
	switch {
	case c != nil && c.Phase == agent.PhaseDrained:
		return
	case weight == initial:
		l.lose(k)
		return
	}
	next := &agent.Change{Phase: agent.PhaseCut, Weight: weight, At: at, Reason: reason, BaselineP99Ms: baselineP99Ms}
	if c != nil {
		// A weight moves within its phase, against the level before the
		// first change.
		next.Phase, next.BaselineP99Ms = c.Phase, c.BaselineP99Ms
	}
	l.put(k, next)
}

// Ready records that the agent readied k, which now serves at weight. A
// drained server back below its configured weight becomes a canary;
// anything else is back to normal and leaves the ledger. With noDrainFor
// set (the tail guard), the server is held from another drain until
// at+noDrainFor either way.
func (l *Ledger) Ready(k agent.Key, weight, initial int, at time.Time, reason string, noDrainFor time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if noDrainFor > 0 {
		l.holds[k] = at.Add(noDrainFor)
	}
	if c := l.changes[k]; c != nil && c.Phase == agent.PhaseDrained && weight != initial {
		l.put(k, &agent.Change{Phase: agent.PhaseCanary, Weight: weight, At: at, Reason: reason})
		return
	}
	delete(l.changes, k)
	l.changed()
}

// OverriddenUntil is when an operator's undo of the agent's change on k
// stops holding the agent off (zero: none).
func (l *Ledger) OverriddenUntil(k agent.Key) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.overrides[k].Until
}

// HeldUntil is when k's hold on draining ends (zero: none).
func (l *Ledger) HeldUntil(k agent.Key, now time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	until := l.holds[k]
	if !until.After(now) {
		return time.Time{}
	}
	return until
}

// Adopt records that k's change, lost to a reload, was applied again
// under the current epoch.
func (l *Ledger) Adopt(k agent.Key) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.changes[k]; c != nil {
		c.Epoch = l.epoch
		l.changed()
	}
}

// Lose forgets k's change: undone, overridden, or the server is gone.
func (l *Ledger) Lose(k agent.Key) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lose(k)
}

// lose forgets k's change. The caller must hold l.mu.
func (l *Ledger) lose(k agent.Key) {
	if _, ok := l.changes[k]; ok {
		delete(l.changes, k)
		l.changed()
	}
}

// Keep loses the change of every server not in present: a server gone
// from HAProxy takes the agent's change with it. Holds past now go too.
func (l *Ledger) Keep(present map[agent.Key]bool, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.batch++ // every entry it drops, one write
	defer l.endBatch()
	for k, until := range l.holds {
		if !present[k] || !until.After(now) {
			delete(l.holds, k)
		}
	}
	for k, o := range l.overrides {
		if !present[k] || !o.Until.After(now) {
			delete(l.overrides, k)
		}
	}
	for k := range l.operatorSeen {
		if !present[k] {
			delete(l.operatorSeen, k)
			l.changed()
		}
	}
	for b, p := range l.pauses {
		if !p.Active(now) {
			l.log.Info().Str("backend", b).Time("until", p.Until).Msg("pause over: the agent acts again")
			delete(l.pauses, b)
			l.changed()
		}
	}
	for k, c := range l.changes {
		if present[k] {
			continue
		}
		if l.fromFile[k] && c.Site != "" && l.site != "" && c.Site != l.site {
			// Another HAProxy's server, which this one does not have:
			// kept in the file for that HAProxy's agent.
			delete(l.changes, k)
			delete(l.fromFile, k)
			l.foreign[k] = c
			l.notReapplied = append(l.notReapplied, agent.NotReapplied{Server: k, Change: *c,
				Why: fmt.Sprintf("made on another HAProxy (%s), not this one (%s)", c.Site, l.site)})
			continue
		}
		l.log.Warn().Stringer("server", k).Msg("server the agent changed is gone from HAProxy; forgetting the change")
		l.lose(k)
	}
}

// put records c as k's change under the current epoch. Called with l.mu
// held.
func (l *Ledger) put(k agent.Key, c *agent.Change) {
	c.Epoch, c.Site = l.epoch, l.site
	delete(l.fromFile, k)
	delete(l.foreign, k)
	l.changes[k] = c
	l.changed()
}

// Changes returns a copy of the changes in force, keyed "backend/server".
// ReadChanges reads the agent's changes from its state file and changes
// nothing (an unreadable file is an error, not set aside): `hapilot
// check --live` names the stopped agent's own drains with it. A missing
// file holds none.
func ReadChanges(file string) (map[agent.Key]agent.Change, error) {
	l := newLedger(file, zerolog.Nop())
	if err := l.load(); err != nil {
		return nil, err
	}
	return l.Changes(), nil
}

func (l *Ledger) Changes() map[agent.Key]agent.Change {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[agent.Key]agent.Change, len(l.changes))
	for k, c := range l.changes {
		out[k] = *c
	}
	return out
}

// stateFile is the file's layout. Version 1 named the change's kind
// ("drain" or "set_weight") where version 2 names its phase.
type stateFile struct {
	Version   int                         `json:"version"`
	Changes   map[agent.Key]*agent.Change `json:"changes"`
	Holds     map[agent.Key]time.Time     `json:"holds,omitempty"`
	Overrides map[agent.Key]Override      `json:"operator_overrides,omitempty"`
	// Pauses and OperatorSeen came after version 2 without a new
	// version: a file without them reads as none, and an older agent
	// ignores them.
	Pauses       map[string]agent.Pause `json:"pauses,omitempty"`
	OperatorSeen map[agent.Key]string   `json:"operator_seen,omitempty"`
	// Saved is when the file was written.
	Saved time.Time `json:"saved,omitzero"`
}

// oldChange is what earlier files held that Change no longer does: the
// kind (version 1), and a canary's hold on draining, now kept in holds.
type oldChange struct {
	Kind         agent.Kind `json:"kind"`
	NoDrainUntil time.Time  `json:"no_drain_until"`
}

func (l *Ledger) load() error {
	if l.file == "" {
		return nil
	}
	f, err := safefile.Open(l.file, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil // none yet (its folder is not one: the writes will say so)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("state file %s: %w", l.file, err)
	}
	// The file says which servers are the agent's to undo, and which the
	// operator holds: one a stranger could write would have the agent
	// drain, or ready, servers on the stranger's word.
	if err := safefile.Trust("state file", l.file, fi, 0o022, "whoever may write it can have the agent drain or ready any server"); err != nil {
		return err
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxStateFile+1))
	if err != nil {
		return fmt.Errorf("state file %s: %w", l.file, err)
	}
	if len(b) > MaxStateFile {
		return fmt.Errorf("state file %s: over %d bytes", l.file, MaxStateFile)
	}
	var st stateFile
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("state file %s: %w", l.file, err)
	}
	if st.Version != 1 && st.Version != 2 {
		return fmt.Errorf("state file %s: version %d, want 1 or 2", l.file, st.Version)
	}
	var old struct{ Changes map[agent.Key]oldChange }
	if err := json.Unmarshal(b, &old); err != nil {
		return fmt.Errorf("state file %s: %w", l.file, err)
	}
	for k, c := range st.Changes {
		o := old.Changes[k]
		switch {
		case c == nil:
			continue
		case st.Version == 1 && o.Kind == agent.Drain:
			c.Phase = agent.PhaseDrained
		case st.Version == 1 && o.Kind == agent.SetWeight:
			c.Phase = agent.PhaseCut
		}
		if o.NoDrainUntil.After(l.holds[k]) {
			l.holds[k] = o.NoDrainUntil
		}
	}
	for k, c := range st.Changes {
		if c != nil && (c.Phase == agent.PhaseDrained || c.Phase == agent.PhaseCut || c.Phase == agent.PhaseCanary) {
			l.changes[k] = c
			l.fromFile[k] = true
		}
	}
	for k, until := range st.Holds {
		if until.After(l.holds[k]) {
			l.holds[k] = until
		}
	}
	for k, o := range st.Overrides {
		l.overrides[k] = o
	}
	for b, p := range st.Pauses {
		p.Backend = b
		l.pauses[b] = p
	}
	for k, label := range st.OperatorSeen {
		l.operatorSeen[k] = label
	}
	l.log.Info().Int("changes", len(l.changes)).Str("file", l.file).Msg("loaded the agent's earlier changes")
	return nil
}

// replacer is what writes the state file: Replace, else ReplaceFile.
func (l *Ledger) replacer() func(path string, data []byte) error {
	if l.Replace != nil {
		return l.Replace
	}
	return ReplaceFile
}

// changed marks the state dirty after a transition: it is saved at the
// end of the batch under way (a step, an operator's command), else at
// once. Called with l.mu held.
func (l *Ledger) changed() {
	if l.batch > 0 {
		l.dirty = true
		return
	}
	l.save()
}

// Batch defers the state file's writes until end: every transition in
// between marks the state dirty, and end saves it once, if anything
// changed. A step is one batch, so that its transitions are one write
// (and one fsync) instead of one each, none of them inside a transition.
// Batches nest: the outermost end saves. end may be called more than
// once; the first call counts.
func (l *Ledger) Batch() (end func()) {
	l.mu.Lock()
	l.batch++
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.endBatch()
		})
	}
}

// endBatch ends one batch, and saves a dirty state at the outermost.
// Called with l.mu held.
func (l *Ledger) endBatch() {
	l.batch--
	if l.batch == 0 && l.dirty {
		l.dirty = false
		l.save()
	}
}

// save replaces the state file atomically, after keeping an unreadable
// one aside. A failure leaves the ledger unsaved, for Flush to try again.
// Called with l.mu held.
func (l *Ledger) save() {
	if l.file == "" {
		return
	}
	err := l.keepAside()
	if err == nil {
		now := l.now().UTC()
		changes := make(map[agent.Key]*agent.Change, len(l.changes)+len(l.foreign))
		for k, c := range l.foreign {
			changes[k] = c
		}
		for k, c := range l.changes {
			if !l.fromFile[k] { // one not yet judged here keeps its time
				c.Saved = now
			}
			changes[k] = c
		}
		var b []byte
		b, err = json.MarshalIndent(stateFile{Version: 2, Changes: changes, Holds: l.holds, Overrides: l.overrides,
			Pauses: l.pauses, OperatorSeen: l.operatorSeen, Saved: now}, "", "  ")
		if err == nil && len(b)+1 > MaxStateFile {
			// The reader (load) takes no more: a file it would set aside
			// at the next start is worse than the last one it can read.
			err = fmt.Errorf("the state would be %d bytes, over the %d the agent reads back at start: the file keeps its last state", len(b)+1, MaxStateFile)
		}
		if err == nil && l.bg != nil {
			l.bg.offer(append(b, '\n'))
			return
		}
		if err == nil {
			err = l.replacer()(l.file, append(b, '\n'))
		}
	}
	l.wrote(err)
}

// wrote records how a write of the state file ended. Called with l.mu
// held.
func (l *Ledger) wrote(err error) {
	switch {
	case err == nil && l.unsaved:
		l.log.Info().Str("file", l.file).Time("unsaved_since", l.since).Uint64("failed_writes", l.failures).Msg("the state file is saved again")
		l.unsaved, l.saveErr = false, nil
	case err == nil:
	case !l.unsaved:
		l.unsaved, l.since, l.saveErr = true, l.now(), err
		l.failures++
		l.log.Error().Err(err).Str("file", l.file).Msg("cannot write the state file; the agent's changes are unsaved, and it tries again every step")
	default:
		l.saveErr = err
		l.failures++
		l.log.Debug().Err(err).Str("file", l.file).Msg("cannot write the state file yet")
	}
}

// Flush writes the state file again if the last write failed (or an
// unreadable one is still to be kept aside), and reports where it stands.
func (l *Ledger) Flush() SaveStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.unsaved || l.aside != "" {
		l.save()
	}
	return l.saveStatus()
}

// SaveStatus is where the state file stands, for /status and /metrics.
type SaveStatus struct {
	File string `json:"file"`
	// Saved is false while the last write failed: the agent's changes
	// since UnsavedSince are in memory only.
	Saved        bool      `json:"saved"`
	UnsavedSince time.Time `json:"unsaved_since,omitzero"`
	Error        string    `json:"error,omitempty"`
	// FailedWrites counts every failed write since the start.
	FailedWrites uint64 `json:"failed_writes"`
	// KeptAside is where an unreadable state file found at start was
	// kept, and Unreadable why it could not be read.
	KeptAside  string `json:"kept_aside,omitempty"`
	Unreadable string `json:"unreadable,omitempty"`
	// NotReapplied are the changes read from the file at start that the
	// agent did not take up, and why.
	NotReapplied []agent.NotReapplied `json:"not_reapplied,omitempty"`
}

// Warning is what an operator must hear of the state file, "" when
// nothing: one found at start that could not be read. The agent started
// without the changes, releases, holds and pauses it recorded: a drain
// it made reads as the operator's, and a server the operator was given
// back may be drained again.
func (s SaveStatus) Warning() string {
	if s.Unreadable == "" {
		return ""
	}
	where := "it could not be kept aside either: nothing is written over it"
	if s.KeptAside != "" {
		where = "it is kept as " + s.KeptAside
	}
	return fmt.Sprintf("the state file %s could not be read at start (%s); %s. The agent started with no record of its earlier changes, "+
		"the operator's releases and holds, or pauses: fix the cause, read the kept file, and release, pause or restore by hand (docs/howto/runbook.md)",
		s.File, s.Unreadable, where)
}

// Saved reports where the state file stands.
func (l *Ledger) Saved() SaveStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.saveStatus()
}

// saveStatus is what Saved reports. The caller must hold l.mu.
func (l *Ledger) saveStatus() SaveStatus {
	st := SaveStatus{File: l.file, Saved: !l.unsaved, FailedWrites: l.failures, KeptAside: l.keptAside, Unreadable: l.unreadErr,
		NotReapplied: append([]agent.NotReapplied(nil), l.notReapplied...)}
	if l.unsaved {
		st.UnsavedSince, st.Error = l.since, l.saveErr.Error()
	}
	if l.bg != nil && st.Saved {
		// A write the disk has not returned for long is unsaved too: a
		// hung disk fails no write, it takes none.
		if since, ok := l.bg.stuck(l.now()); ok {
			st.Saved, st.UnsavedSince = false, since
			st.Error = fmt.Sprintf("a write of the state file has not returned since %s (a hung disk?)", since.UTC().Format(time.RFC3339))
		}
	}
	return st
}

// StuckWrite is how long a write of the state file may take before the
// ledger reports the file unsaved.
const StuckWrite = 10 * time.Second

// WriteInBackground writes the state file from a goroutine of its own
// from now on: each change hands the goroutine the new state and returns,
// so that a disk that hangs (NFS, FUSE) stops that goroutine, never the
// loop, the control socket or /status. A state handed over while the
// last is still being written replaces any waiting one: each is whole,
// so the latest carries every change before it. stop ends the goroutine
// once the latest state is written, waiting at most wait, and reports
// where the file stands.
func (l *Ledger) WriteInBackground() (stop func(wait time.Duration) SaveStatus) {
	replace := l.replacer()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file == "" || l.bg != nil {
		return func(time.Duration) SaveStatus { return l.Saved() }
	}
	w := &stateWriter{file: l.file, replace: replace, next: make(chan []byte, 1), quit: make(chan struct{}), done: make(chan struct{})}
	l.bg = w
	go w.run(l)
	return func(wait time.Duration) SaveStatus {
		l.Flush() // a write that failed, offered again
		close(w.quit)
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-w.done:
		case <-t.C:
			l.mu.Lock()
			defer l.mu.Unlock()
			st := l.saveStatus()
			st.Saved, st.Error = false, fmt.Sprintf("the disk took no write of the state file for %v at stop", wait)
			return st
		}
		l.mu.Lock()
		l.bg = nil
		l.mu.Unlock()
		return l.Saved()
	}
}

// stateWriter is the goroutine of WriteInBackground.
type stateWriter struct {
	file    string
	replace func(path string, data []byte) error // the ledger's Replace
	next    chan []byte                          // the state waiting to be written: one, the latest
	quit    chan struct{}
	done    chan struct{}

	mu      sync.Mutex // guards writing: the goroutine sets it, the status reads it
	writing time.Time  // when the write in progress began; zero: none
}

// offer hands the writer state, replacing one still waiting. Called
// with the ledger's mu held: one sender at a time.
func (w *stateWriter) offer(state []byte) {
	select {
	case <-w.next:
	default:
	}
	w.next <- state
}

// stuck reports when the write in progress began, if it has run past
// StuckWrite at now.
func (w *stateWriter) stuck(now time.Time) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writing, !w.writing.IsZero() && now.Sub(w.writing) > StuckWrite
}

func (w *stateWriter) run(l *Ledger) {
	defer close(w.done)
	for {
		select {
		case b := <-w.next:
			w.write(l, b)
		case <-w.quit:
			select {
			case b := <-w.next:
				w.write(l, b)
			default:
			}
			return
		}
	}
}

func (w *stateWriter) write(l *Ledger, b []byte) {
	w.mu.Lock()
	w.writing = l.now()
	w.mu.Unlock()
	err := w.replace(w.file, b)
	w.mu.Lock()
	w.writing = time.Time{}
	w.mu.Unlock()
	l.mu.Lock()
	l.wrote(err)
	l.mu.Unlock()
}

// ReplaceFile writes data to a new file of a random name beside path
// (created exclusively, so a planted link is never followed), syncs it,
// and renames it over path, which replaces a link at path rather than
// write through it. The new file keeps the owner, group and mode of the
// one it replaces (mode 0640 for a first one), never writable by group
// or others: `sudo hapilot restore` must not leave root's file where the
// service's user can no longer read it.
func ReplaceFile(path string, data []byte) error {
	mode, uid, gid := fs.FileMode(0o640), -1, -1
	if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() {
		mode = fi.Mode().Perm() &^ 0o022
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			uid, gid = int(st.Uid), int(st.Gid)
		}
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil && uid >= 0 && (uid != os.Geteuid() || gid != os.Getegid()) {
		// Root gives the file back to its owner. Anyone else can only
		// give it a group of their own; failing that, the file is theirs,
		// which the next start trusts as it trusted the old one's owner.
		if cerr := f.Chown(uid, gid); cerr != nil && os.Geteuid() == 0 {
			err = fmt.Errorf("keep the state file's owner %d:%d: %w", uid, gid, cerr)
		} else if cerr != nil {
			_ = f.Chown(-1, gid)
		}
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// Release records that the operator had k brought back to its
// configured state through the agent (hapilot ctl release or restore):
// the change is over, and the server is the operator's until now+hold
// or until its state changes, like any undo of theirs.
func (l *Ledger) Release(k agent.Key, initial int, now time.Time, hold time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.changes, k)
	delete(l.holds, k)
	l.overrides[k] = Override{Until: now.Add(hold), AdminState: 0, Weight: initial, Released: true}
	l.changed()
}

// MaxPauses bounds the backends' pauses held at once: a pause is an
// operator's hold on a backend or a few during an incident (every
// backend is one pause, AllBackends, never refused: it is the safe
// side), and the bound keeps the state file and `ctl status` small
// whatever is asked: 256 names of at most 255 bytes.
const MaxPauses = 256

// SetPause holds the agent's actions back on p.Backend (AllBackends:
// everywhere), replacing any pause of that scope. A backend's new pause
// past MaxPauses is refused; pauses over at p.Since make room first.
func (l *Ledger) SetPause(p agent.Pause) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	held := len(l.pauses)
	if _, ok := l.pauses[agent.AllBackends]; ok {
		held--
	}
	if _, ok := l.pauses[p.Backend]; !ok && p.Backend != agent.AllBackends && held >= MaxPauses {
		for b, q := range l.pauses {
			if !q.Active(p.Since) {
				delete(l.pauses, b)
			}
		}
		held = len(l.pauses)
		if _, ok := l.pauses[agent.AllBackends]; ok {
			held--
		}
		if held >= MaxPauses {
			return fmt.Errorf("%w: pause: %d backends' pauses held, the most the agent keeps: resume some, or pause every backend", agent.ErrRefused, held)
		}
	}
	l.pauses[p.Backend] = p
	l.changed()
	return nil
}

// ClearPause ends the pause of backend (AllBackends: the pause of every
// backend; "": every pause) and returns those it ended.
func (l *Ledger) ClearPause(backend string) []agent.Pause {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ended []agent.Pause
	for b, p := range l.pauses {
		if backend == "" || b == backend {
			ended = append(ended, p)
			delete(l.pauses, b)
		}
	}
	if len(ended) > 0 {
		l.changed()
	}
	return ended
}

// Pauses lists the pauses in force at now, every backend's first.
func (l *Ledger) Pauses(now time.Time) []agent.Pause {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []agent.Pause
	for b, p := range l.pauses {
		if b != agent.AllBackends && p.Active(now) {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Backend < out[j].Backend })
	if p, ok := l.pauses[agent.AllBackends]; ok && p.Active(now) {
		out = append([]agent.Pause{p}, out...)
	}
	return out
}

// PausedFor is the pause that holds backend's actions back at now, if
// any: every backend's first.
func (l *Ledger) PausedFor(backend string, now time.Time) (agent.Pause, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range []string{agent.AllBackends, backend} {
		if p, ok := l.pauses[b]; ok && p.Active(now) {
			return p, true
		}
	}
	return agent.Pause{}, false
}

// SeeOperator records whether k is held by someone else (drain or
// maint, label its state) or not (label ""), so that after a restart
// the agent can tell the operator's servers from ones it never saw
// change.
func (l *Ledger) SeeOperator(k agent.Key, label string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.operatorSeen[k] == label {
		return
	}
	if label == "" {
		delete(l.operatorSeen, k)
	} else {
		l.operatorSeen[k] = label
	}
	l.changed()
}

// SeenOperator reports whether k was last seen held by the operator.
func (l *Ledger) SeenOperator(k agent.Key) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.operatorSeen[k]
	return ok
}
