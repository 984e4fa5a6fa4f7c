package dataset

import (
	"encoding/json"
	"github.com/hapilot/hapilot/internal/lab/llmprompts"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
	"github.com/hapilot/hapilot/internal/lab/modelserver"
)

// Calibration's names never reach a training prompt, and no simulated
// backend has the size and weight of one of calibration's.
func TestCalibrationIsHeldOut(t *testing.T) {
	h := CalibrationHoldout()
	if len(h.Names) < 20 || len(h.Sizes) < 5 {
		t.Fatalf("hold-out read %d names and %d sizes from fixtures.Sequences: too few", len(h.Names), len(h.Sizes))
	}
	g := &gen{r: rand.New(rand.NewPCG(3, 3)), hold: h}
	now := time.Unix(0, 0)
	for range 3000 {
		for _, b := range g.situation(now).backends {
			uniform := true
			for _, s := range b.servers {
				uniform = uniform && s.weight == b.servers[0].weight
				if h.Names[s.name] {
					t.Fatalf("server %s of calibration in training", s.name)
				}
			}
			if h.Names[b.name] {
				t.Fatalf("backend %s of calibration in training", b.name)
			}
			if uniform && h.Sizes[[2]int{len(b.servers), b.servers[0].weight}] {
				t.Fatalf("backend %s: %d servers at weight %d, as one of calibration's", b.name, len(b.servers), b.servers[0].weight)
			}
		}
	}
	ex, err := Generate(3, 400, prompt.Compact, DefaultRecipe().Draw, llmprompts.New)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ex {
		for _, rw := range rows(e.User) {
			if h.Names[rw.server] || h.Names[rw.backend] {
				t.Fatalf("calibration's %s/%s in a prompt:\n%s", rw.backend, rw.server, e.User)
			}
		}
	}
}

// Labels come from the ground truth, not from the rules: a drain or cut
// names a flagged server that is truly faulty, slow or overloaded; a
// no_op leaves no flagged server that is; and the labels drain servers
// the rules leave (the grey zone), which a label copied from the rules
// would not.
func TestLabelsFollowGroundTruth(t *testing.T) {
	if underRace {
		t.Skip("generates and labels examples on one goroutine, ten times slower under -race (make unit runs it without -race)")
	}
	for _, style := range prompt.Styles {
		t.Run(string(style), func(t *testing.T) { labelsFollowGroundTruth(t, style) })
	}
}

func labelsFollowGroundTruth(t *testing.T, style prompt.Style) {
	// 800 examples a form: each form's run is about as long as one
	// form's 1,500 was, under -race beside the other packages.
	ex, err := Generate(5, 800, style, DefaultRecipe().Draw, llmprompts.New)
	if err != nil {
		t.Fatal(err)
	}
	beyondRules, noops, suspicious := 0, 0, 0
	for _, e := range ex {
		if !strings.HasPrefix(e.System, style.SystemPrompt()[:40]) || !strings.HasPrefix(e.User, "step ") {
			t.Fatalf("not the policy's prompt:\n%s", e.User)
		}
		plan, err := prompt.ParseReply(e.Answer)
		if err != nil {
			t.Fatalf("label %s: %v", e.Answer, err)
		}
		if len(plan) > 1 {
			t.Fatalf("label %s: more than one action", e.Answer)
		}
		flagged := map[agent.Key]row{}
		refs := map[agent.Key]agent.Key{} // the numbered form's b1/s3 → the server
		for _, rw := range rows(e.User) {
			if (rw.sref == "") != (style != prompt.Numbered) {
				t.Fatalf("row %+v of a %s prompt:\n%s", rw, style, e.User)
			}
			refs[agent.Key{Backend: rw.bref, Server: rw.sref}] = agent.Key{Backend: rw.backend, Server: rw.server}
			if rw.candidate != "" {
				flagged[agent.Key{Backend: rw.backend, Server: rw.server}] = rw
			}
		}
		if style == prompt.Numbered && len(plan) == 1 {
			k, ok := refs[plan[0].Key()]
			if !ok {
				t.Fatalf("label %s names no row:\n%s", e.Answer, e.User)
			}
			plan[0].Backend, plan[0].Server = k.Backend, k.Server
		}
		if e.Suspicious {
			suspicious++
		}
		if len(plan) == 0 {
			noops++
			for k := range flagged {
				if tr := e.Truth[k]; tr != Healthy && strings.Contains(e.User, k.Server+" ready none") {
					t.Fatalf("no_op while %s is flagged and %s:\n%s\n%s", k, tr, e.User, e.Answer)
				}
			}
			continue
		}
		a := plan[0]
		rw, ok := flagged[a.Key()]
		if !ok {
			t.Fatalf("label acts on %s, which the prompt does not flag:\n%s\n%s", a.Key(), e.User, e.Answer)
		}
		want := map[agent.Kind]Truth{agent.Drain: Faulty, agent.SetWeight: Overloaded}[a.Kind]
		if tr := e.Truth[a.Key()]; tr != want && !(a.Kind == agent.Drain && tr == Slow) {
			t.Fatalf("label %s %s, which is %s", a.Kind, a.Key(), tr)
		}
		if !rw.floor {
			beyondRules++
		}
	}
	t.Logf("%d examples: %d no_op, %d acting where the rules do not, %d flag a healthy server", len(ex), noops, beyondRules, suspicious)
	// The candidates come from the rules' sequential test (at a looser
	// threshold): it flags a healthy server far less often than the
	// windowed loose test it replaced (10 of these 800 examples at seed
	// 5, where that test gave over 50), so fewer no-ops teach the model
	// to leave a flagged healthy server alone; some still must.
	if beyondRules < 50 || suspicious < 5 || noops == len(ex) {
		t.Fatalf("too few grey-zone actions (%d) or suspicious no-ops (%d)", beyondRules, suspicious)
	}
}

// The penalty set holds the same examples for the same budget of
// tokens, with those that flag a healthy server oftener.
func TestPenaltySetWeighsCollateralDamage(t *testing.T) {
	r := DefaultRecipe()
	r.Examples, r.VocabFit, r.Vocab = 400, 40, 600
	r.Spec.Width, r.Spec.FF = 16, 32
	dir := t.TempDir()
	var log strings.Builder
	st, err := Build(dir, r, llmprompts.New, &log)
	if err != nil {
		t.Fatal(err)
	}
	// The budget is train.txt's blocks: a block the penalty set cannot
	// fill with its next example is padded, so its token count falls
	// short of train.txt's by that padding (an example is about half a
	// block at this size, where the padding came to 15% with the util
	// column on most fleets), and it stops a block short at most.
	if st.PenaltyTokens > st.Tokens || st.PenaltyBlocks > st.Blocks || st.PenaltyBlocks < st.Blocks-1 || st.PenaltyTokens < st.Tokens*3/4 {
		t.Fatalf("penalty set %d tokens in %d blocks, plain %d in %d: not the same budget", st.PenaltyTokens, st.PenaltyBlocks, st.Tokens, st.Blocks)
	}
	plain := float64(st.Suspicious) / float64(st.Examples)
	pen := float64(st.PenaltySuspicious) / float64(st.PenaltyExamples)
	t.Logf("suspicious examples: %.2f of the plain set, %.2f of the penalty set", plain, pen)
	// Each suspicious example Penalty times, the rest once: their share
	// is k*p/(1+(k-1)*p) of a set drawn from the same order.
	k := float64(r.Penalty)
	if want := k * plain / (1 + (k-1)*plain); pen < want-0.05 || pen <= plain {
		t.Fatalf("the penalty set does not weigh suspicious examples up: %.2f against %.2f (want about %.2f)", pen, plain, want)
	}
	for _, f := range []string{"init.gguf", "train.txt", "train-penalty.txt", "stats.json"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Size() == 0 {
			t.Fatalf("%s: %v", f, err)
		}
	}
}

// buildSmall builds r's dataset, on a model 16 wide (the tests read its
// text and vocabulary, not its weights), into a temporary directory, and
// reads back the vocabulary init.gguf holds.
func buildSmall(t *testing.T, r Recipe) (string, *Stats, Vocab) {
	t.Helper()
	r.Spec.Width, r.Spec.FF = 16, 32
	dir := t.TempDir()
	st, err := Build(dir, r, llmprompts.New, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	v, err := ReadVocab(filepath.Join(dir, "init.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	return dir, st, v
}

// With Pack, each training text is units of exactly Pack/2 tokens, as
// the vocabulary tokenizes them, each unit starting an example: the
// chunks llama-finetune cuts at its -c, at a stride of -c/2, hold whole
// examples.
func TestPackedBlocksHoldWholeExamples(t *testing.T) {
	r := DefaultRecipe()
	r.Examples, r.VocabFit, r.Pack, r.Vocab = 120, 40, 1024, 400
	dir, st, v := buildSmall(t, r)
	tk := v.Tokenizer()
	for _, name := range []string{"train.txt", "train-penalty.txt"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		ids, err := tk.Encode(string(b), false)
		if err != nil {
			t.Fatal(err)
		}
		unit := r.Pack / 2
		if len(ids)%unit != 0 || len(ids)/unit > st.Blocks || len(ids) == 0 {
			t.Fatalf("%s: %d tokens, not whole units of %d (train.txt has %d)", name, len(ids), unit, st.Blocks)
		}
		start, _ := tk.Encode("<|im_start|>system\n", false)
		for at := 0; at < len(ids); at += unit {
			if !slices.Equal(ids[at:at+len(start)], start) {
				t.Fatalf("%s: unit at token %d does not start an example", name, at)
			}
		}
		t.Logf("%s: %d units of %d tokens (%d examples too long)", name, len(ids)/unit, unit, st.TooLong)
	}
	for _, tok := range v.Tokens {
		if len(tok) > 1 && strings.ContainsAny(tok, "0123456789") && !strings.HasPrefix(tok, "<0x") {
			t.Fatalf("token %q merges a digit", tok)
		}
	}
}

// The fitted vocabulary round-trips every text, has a newline only at
// the end of a token, tokenizes a prompt as the start of its example (no
// token spans the prompt's end and its answer), and has no
// token llama.cpp would take for a control one.
func TestVocabulary(t *testing.T) {
	ex, err := Generate(7, 60, prompt.Full, DefaultRecipe().Draw, llmprompts.New)
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	for _, e := range ex[:30] {
		texts = append(texts, e.Text())
	}
	v := FitVocab(texts, 800)
	if len(v.Tokens) != 800 {
		t.Fatalf("%d tokens, want 800", len(v.Tokens))
	}
	for i, tok := range v.Tokens {
		if v.Types[i] == typeNormal && (strings.Contains(strings.TrimSuffix(tok, "\n"), "\n") || controlLike(tok)) {
			t.Fatalf("token %d %q", i, tok)
		}
	}
	tk := v.Tokenizer()
	for _, e := range ex[30:] {
		ids, err := tk.Encode(e.Text(), false)
		if err != nil {
			t.Fatal(err)
		}
		back, err := tk.Decode(ids)
		if err != nil || back != e.Text() {
			t.Fatalf("round trip: %v\n%q\n%q", err, back, e.Text())
		}
		pids, _ := tk.Encode(e.Prompt(), false)
		if last := v.Tokens[pids[len(pids)-1]]; !strings.HasSuffix(last, "\n") || !slices.Equal(pids, ids[:len(pids)]) {
			t.Fatalf("the prompt ends with %q, or its tokens are not the example's first", last)
		}
		if len(ids)*2 > len(e.Text()) {
			t.Fatalf("%d tokens for %d bytes: the vocabulary does not fit the prompts", len(ids), len(e.Text()))
		}
	}
	// The GGUF carries it, and says to add no BOS.
	path := filepath.Join(t.TempDir(), "v.gguf")
	if err := modelserver.WriteGGUF(path, modelserver.Spec{Width: 16, FF: 32, Train: true,
		Vocabulary: &modelserver.Vocabulary{Tokens: v.Tokens, Types: v.Types, Scores: v.Scores}}); err != nil {
		t.Fatal(err)
	}
}

// examples.jsonl, what train.py reads, holds each example once, in the
// order drawn: its ids decode to the example's text, the ids before
// answer_at to its prompt (what the server tokenizes), and the rest to its
// answer and the newline the Modelfile stops at. The loss is taken there
// and nowhere else, so a wrong offset would train the model on prompt.
func TestTokenExamples(t *testing.T) {
	r := DefaultRecipe()
	r.Examples, r.VocabFit, r.Vocab = 60, 30, 400
	dir, _, v := buildSmall(t, r)
	ex, err := Generate(r.Seed, r.Examples, r.Prompt, r.Draw, llmprompts.New)
	if err != nil {
		t.Fatal(err)
	}
	tk := v.Tokenizer()
	b, err := os.ReadFile(filepath.Join(dir, "examples.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != len(ex) {
		t.Fatalf("%d lines for %d examples", len(lines), len(ex))
	}
	suspicious := 0
	for i, line := range lines {
		var te TokenExample
		if err := json.Unmarshal([]byte(line), &te); err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		decode := func(ids []int32) string {
			s, err := tk.Decode(ids)
			if err != nil {
				t.Fatalf("line %d: %v", i, err)
			}
			return s
		}
		if got := decode(te.Ids[:te.AnswerAt]); got != ex[i].Prompt() {
			t.Fatalf("line %d: the ids before answer_at decode to\n%q\nwant the prompt\n%q", i, got, ex[i].Prompt())
		}
		if got := decode(te.Ids[te.AnswerAt:]); got != ex[i].Answer+"\n" {
			t.Fatalf("line %d: the answer's ids decode to %q, want %q", i, got, ex[i].Answer+"\n")
		}
		if te.Suspicious != ex[i].Suspicious || te.Kind != ex[i].Kind {
			t.Fatalf("line %d: suspicious %v kind %s, want %v %s", i, te.Suspicious, te.Kind, ex[i].Suspicious, ex[i].Kind)
		}
		if te.ActsAfterHistory != (ex[i].HasHistory() && ex[i].Acts()) {
			t.Fatalf("line %d: acts_after_history %v for an example with history %v that acts %v", i, te.ActsAfterHistory, ex[i].HasHistory(), ex[i].Acts())
		}
		if te.Suspicious {
			suspicious++
		}
	}
	// The field is each example's own (checked above). How many flag a
	// healthy server is the candidates' false-alarm rate: none of these 60
	// since the peer check reads the evidence's whole span (it was a few
	// when it read the last 64 s); all of them would be a broken test.
	t.Logf("%d of %d examples flag a healthy server", suspicious, len(lines))
	if suspicious == len(lines) {
		t.Fatalf("all %d examples flag a healthy server", len(lines))
	}
}

// Acts is what train.py's history weight reads: an answer that changes
// a server, not no_op and not an answer with no action.
func TestActs(t *testing.T) {
	for _, tc := range []struct {
		answer string
		want   bool
	}{
		{`{"actions":[{"reason":"s2: 5xx far above its peers","action":"drain","backend":"b1","server":"s2"}]}`, true},
		{`{"actions":[{"reason":"s1: near its maxconn, cut its weight","action":"set_weight","backend":"b1","server":"s1","weight":6}]}`, true},
		{`{"actions":[{"reason":"s1: within chance of its peers","action":"no_op","backend":"-","server":"-"}]}`, false},
		{`{"actions":[]}`, false},
		{`not json`, false},
	} {
		if got := (Example{Answer: tc.answer}).Acts(); got != tc.want {
			t.Errorf("Acts of %s = %v, want %v", tc.answer, got, tc.want)
		}
	}
}

// A history line ("you: step 1: drain ...") does not give the answer
// away: after some the right answer is an action, both the same action
// again when the last one is not in force (a frozen situation) and a
// drain of a new fault beside one drained before (a fault that begins
// mid-situation). In the fourth attempt's data 25 of 828 examples with
// a history line had an action for answer, and its model stopped at one.
// The second fault's drain beside the first is rare: it needs a
// two-fault situation whose second fault begins late, and that the
// rules' floor has not drained by the step the model is asked. About 1
// in 2,000 examples (1 to 4 in each of seeds 1 to 5's 4,000 on b1e4083;
// 2 to 4 in seeds 1 to 5 and 9 on 7f3c8fb), so a single seed's 4,000
// hold none by chance (seed 9's on b1e4083), and every change to the
// floor moves which seed. Seeds 9, 10 and 12, 4,000 each, hold 0, 2
// and 2 on b1e4083, and 5, 5 and 0 on ea22af6.
func TestHistoryDoesNotGiveTheAnswerAway(t *testing.T) {
	if underRace {
		t.Skip("12,000 examples take minutes under -race (make test); make test-llm runs this package without it")
	}
	var withHistory, acts, again, beside int
	for _, seed := range []uint64{9, 10, 12} {
		ex, err := Generate(seed, 4000, prompt.Numbered, DefaultRecipe().Draw, llmprompts.New)
		if err != nil {
			t.Fatal(err)
		}
		var b int
		for _, e := range ex {
			if !e.HasHistory() {
				continue
			}
			withHistory++
			if e.Action() == agent.VerbNoOp {
				continue
			}
			acts++
			switch {
			case strings.Contains(e.User, ": not in force\n"):
				again++
			case strings.Contains(e.User, ": in force (drained)\n") && e.Action() == string(agent.Drain):
				beside++
				b++
			}
		}
		t.Logf("seed %d: %d drains beside one in force", seed, b)
	}
	t.Logf("%d examples with a history line: %d act, %d again after one not in force, %d drain beside one in force", withHistory, acts, again, beside)
	if withHistory == 0 || acts*20 < withHistory || again == 0 || beside == 0 {
		t.Fatalf("history lines come before no_op in all but %d of %d examples (%d again, %d beside)", acts, withHistory, again, beside)
	}
}

// A util figure is not a sign of overload: the lab's HAProxy, and many an
// operator's, sets a maxconn on every server, so the column shows at any
// load. The fifth attempt's data showed it in overload situations only,
// and its model cut the weight of a faulty server wherever one showed.
// Now most prompts that show one answer something else, drains among
// them, and each answer's share holds near its share over all prompts.
func TestUtilDoesNotMeanOverload(t *testing.T) {
	if underRace {
		t.Skip("2,000 examples take minutes under -race (make test); make test-llm runs this package without it")
	}
	ex, err := Generate(11, 2000, prompt.Numbered, Draw{Frozen: 8, Unlimited: 3}, llmprompts.New)
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]int{}
	all := map[string]int{}
	withUtil := 0
	for _, e := range ex {
		all[e.Action()]++
		for _, rw := range rows(e.User) {
			if rw.util != "-" {
				shown[e.Action()]++
				withUtil++
				break
			}
		}
	}
	t.Logf("%d of %d prompts show a util figure; their answers %v (all prompts: %v)", withUtil, len(ex), shown, all)
	cut, drain := string(agent.SetWeight), string(agent.Drain)
	if withUtil < len(ex)/2 {
		t.Fatalf("only %d of %d prompts show a util figure", withUtil, len(ex))
	}
	// At most a third: with the sequential test as the floor (issue 41)
	// the generator's situations drain less, fewer prompts show a util
	// figure, and overload's set_weight answers, which always show one,
	// weigh 26% of them (they were under a quarter with the windowed
	// test). The training data's mix is the LLM issue's to rebalance.
	if shown[cut]*3 > withUtil || shown[drain]*10 < withUtil {
		t.Fatalf("of %d prompts with a util figure %d answer set_weight and %d drain: util still reads as overload", withUtil, shown[cut], shown[drain])
	}
}

// TestSlowBelowDrawsUnderThePeerTest: with Draw.SlowBelow 2 about half the
// latency situations' slow server is 2.5 to 5 times its backend's median
// (under the rules' 5x peer test, which the candidates' p95 test flags
// and only a model judges); without it, about one in nine, as the
// committed hapilot-tiny's data drew.
func TestSlowBelowDrawsUnderThePeerTest(t *testing.T) {
	share := func(d Draw) (below float64, n int) {
		g := &gen{r: rand.New(rand.NewPCG(5, 5)), hold: CalibrationHoldout(), draw: d}
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		k := 0
		for n < 400 {
			sit := g.situation(now)
			if sit.kind != KindLatency {
				continue
			}
			for _, b := range sit.backends {
				var slow *sserver
				var peers []int
				for _, s := range b.servers {
					if s.truth == Slow {
						slow = s
					} else {
						peers = append(peers, s.p50)
					}
				}
				if slow == nil || len(peers) == 0 {
					continue
				}
				slices.Sort(peers)
				n++
				if float64(slow.p50) < 5.5*float64(peers[len(peers)/2]) {
					k++
				}
			}
		}
		return float64(k) / float64(n), n
	}
	below, n := share(Draw{SlowBelow: 2})
	all, m := share(Draw{})
	t.Logf("under 5.5x the peers: %.2f of %d slow servers with SlowBelow 2, %.2f of %d without", below, n, all, m)
	if below < 0.45 || below > 0.7 {
		t.Errorf("SlowBelow 2: %.2f of %d slow servers under 5.5x their peers' median, want about half and a ninth of the rest", below, n)
	}
	if all > 0.25 {
		t.Errorf("SlowBelow 0: %.2f of %d slow servers under 5.5x their peers' median, want about one in nine", all, m)
	}
}
