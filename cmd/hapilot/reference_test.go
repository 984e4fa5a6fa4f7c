package main

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent/loop"
)

// settingRE matches a setting's own line in `hapilot defaults`: the name,
// commented out, then its default if it has one. Usage lines start "# ".
var settingRE = regexp.MustCompile(`(?m)^#([a-z][a-z0-9-]*)(?: |$)`)

// missingSettings returns the settings a `hapilot defaults` output names
// that the settings reference has no row for.
func missingSettings(defaults, reference []byte) (names []string, missing []string) {
	for _, m := range settingRE.FindAllSubmatch(defaults, -1) {
		name := string(m[1])
		names = append(names, name)
		if !bytes.Contains(reference, []byte("| `"+name+"` |")) {
			missing = append(missing, name)
		}
	}
	return names, missing
}

// Every setting `hapilot defaults` prints, the file an operator starts
// from, has its row in the settings reference. TestSettingsDoc checks the
// generated table against the flags; this checks it against what the
// operator reads, so a setting the defaults print and the reference lacks
// fails here whichever of the two drifted.
func TestDefaultsInSettingsReference(t *testing.T) {
	var out, errs bytes.Buffer
	if err := cmdDefaults(nil, &out, &errs); err != nil {
		t.Fatalf("hapilot defaults: %v: %s", err, errs.String())
	}
	ref, err := os.ReadFile(settingsDoc)
	if err != nil {
		t.Fatal(err)
	}
	names, missing := missingSettings(out.Bytes(), ref)
	if len(names) < 50 {
		t.Fatalf("read only %d settings from hapilot defaults: has its format changed?", len(names))
	}
	if len(missing) > 0 {
		t.Errorf("%s has no row for %v, which hapilot defaults prints", settingsDoc, missing)
	}
}

func TestMissingSettings(t *testing.T) {
	defaults := []byte("# usage of interval\n#interval 10s\n\n# usage\n#audit-log\n")
	for _, tc := range []struct {
		name, ref string
		want      []string
	}{
		{"both rows", "| `interval` | `10s` | x |\n| `audit-log` | none | y |\n", nil},
		{"one missing", "| `interval` | `10s` | x |\n", []string{"audit-log"}},
		{"named in prose only", "`interval` and `audit-log`", []string{"interval", "audit-log"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			names, missing := missingSettings(defaults, []byte(tc.ref))
			if !reflect.DeepEqual(names, []string{"interval", "audit-log"}) {
				t.Fatalf("names %q", names)
			}
			if !reflect.DeepEqual(missing, tc.want) {
				t.Errorf("missing %q, want %q", missing, tc.want)
			}
		})
	}
}

// statusDoc is the reference of GET /status.
const statusDoc = "../../docs/reference/status.md"

// statusWrapperFields are the fields agent/status adds around
// agent.Status in its /status handler.
var statusWrapperFields = []string{"warnings", "ingest", "fleet"}

// Every top-level field of /status has its row in the reference: a field
// added to agent.Status without a word for the operator fails here.
func TestStatusReference(t *testing.T) {
	doc, err := os.ReadFile(statusDoc)
	if err != nil {
		t.Fatal(err)
	}
	fields := append([]string(nil), statusWrapperFields...)
	st := reflect.TypeOf(loop.Status{})
	for i := 0; i < st.NumField(); i++ {
		name, _, _ := strings.Cut(st.Field(i).Tag.Get("json"), ",")
		if name == "" || name == "-" {
			t.Fatalf("agent.Status.%s has no JSON name", st.Field(i).Name)
		}
		fields = append(fields, name)
	}
	for _, f := range fields {
		if !bytes.Contains(doc, []byte("| `"+f+"` |")) {
			t.Errorf("%s has no row for /status field %q", statusDoc, f)
		}
	}
}

// The package installs its settings at /etc/hapilot/hapilot.conf
// (Makefile's deb target, debian/conffiles, the unit's ExecStart); the
// docs once named /etc/hapilot.conf too.
func TestDocsNameThePackagedConfigFile(t *testing.T) {
	files := []string{"../../README.md"}
	for _, dir := range []string{"tutorial", "howto", "reference", "explanation"} {
		m, err := filepath.Glob("../../docs/" + dir + "/*.md")
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 10 {
		t.Fatalf("only %d files to read", len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("/etc/hapilot.conf")) {
			t.Errorf("%s names /etc/hapilot.conf; the package installs /etc/hapilot/hapilot.conf", f)
		}
	}
}

// printedDefaults reads `hapilot defaults`: each setting's default as it
// prints it, "" where it prints none.
func printedDefaults(out []byte) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if s := settingRE.FindStringSubmatch(line); s != nil {
			m[s[1]] = strings.TrimSpace(strings.TrimPrefix(line, "#"+s[1]))
		}
	}
	return m
}

// A statedDefault is a default a doc states for a flag, where it states it.
type statedDefault struct {
	where, flag, value string
}

var (
	flagSpan = regexp.MustCompile("`--([a-z][a-z0-9-]*)`")
	// the prose forms: "`--x` (default `v`", "`--x` (default 3)",
	// "`--x` (`v` by default", "`--x` (500 ms by default"
	proseDefault = regexp.MustCompile("`--([a-z][a-z0-9-]*)` \\((?:default (?:`([^`]+)`|([0-9][0-9.,]*(?: ?[a-z]+)?)[),;:])|(?:`([^`]+)`|([0-9][0-9.,]*(?: ?[a-z]+)?|on|off|none)) by default)")
)

// cells splits a Markdown table row into its cells, a pipe inside a code
// span kept.
func cells(row string) []string {
	row = strings.TrimSpace(row)
	row = strings.TrimSuffix(strings.TrimPrefix(row, "|"), "|")
	var out []string
	var b strings.Builder
	code := false
	for _, r := range row {
		switch {
		case r == '`':
			code = !code
		case r == '|' && !code:
			out = append(out, strings.TrimSpace(b.String()))
			b.Reset()
			continue
		}
		b.WriteRune(r)
	}
	return append(out, strings.TrimSpace(b.String()))
}

// splitTop splits s at the ", " outside code spans and brackets.
func splitTop(s string) []string {
	var out []string
	depth, code, start := 0, false, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '`':
			code = !code
		case code:
		case c == '(':
			depth++
		case c == ')':
			depth--
		case c == ',' && depth == 0 && i+1 < len(s) && s[i+1] == ' ':
			out = append(out, strings.TrimSpace(s[start:i]))
			start = i + 1
		}
	}
	return append(out, strings.TrimSpace(s[start:]))
}

// cellValue is the default a table cell states: its first code span, or
// "none" or "off" in words; "" where it describes one in words only
// ("80% of the interval"), which nothing here can check.
func cellValue(cell string) string {
	if i := strings.Index(cell, "`"); i >= 0 {
		if j := strings.Index(cell[i+1:], "`"); j >= 0 {
			return cell[i+1 : i+1+j]
		}
	}
	switch w := strings.Fields(cell); {
	case len(w) > 0 && (w[0] == "none" || w[0] == "off"):
		return w[0]
	}
	return ""
}

// statedDefaults finds the defaults a Markdown text states for flags: in
// a table with a "default" column whose first cell names flags, and in
// prose.
func statedDefaults(file, text string) []statedDefault {
	var out []statedDefault
	lines := strings.Split(text, "\n")
	col := -1 // the default column of the table being read
	fence := false
	for i, line := range lines {
		where := fmt.Sprintf("%s:%d", file, i+1)
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if fence {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			col = -1
			for _, m := range proseDefault.FindAllStringSubmatch(line, -1) {
				v := strings.TrimSpace(m[2] + m[3] + m[4] + m[5])
				out = append(out, statedDefault{where, m[1], v})
			}
			continue
		}
		if i+1 < len(lines) && strings.HasPrefix(lines[i+1], "|---") {
			col = -1
			for j, h := range cells(line) {
				if h == "default" {
					col = j
				}
			}
			continue
		}
		c := cells(line)
		if col < 0 || col >= len(c) || strings.HasPrefix(line, "|---") {
			continue
		}
		var flags []string
		for _, m := range flagSpan.FindAllStringSubmatch(c[0], -1) {
			flags = append(flags, m[1])
		}
		values := []string{c[col]}
		if len(flags) > 1 {
			values = splitTop(c[col])
		}
		if len(values) != len(flags) {
			continue // one value for several flags: words, not a default each
		}
		for k, f := range flags {
			if v := cellValue(values[k]); v != "" {
				out = append(out, statedDefault{where, f, v})
			}
		}
	}
	return out
}

// sameDefault says whether a doc's stated default is what `hapilot
// defaults` prints: the same text, the same duration or number however
// written ("30m" and "30m0s", "500 ms" and "500ms", "1,000" and "1000",
// "1e-6" and "1e-06"), or, for "none" and "off", no value or a zero one.
func sameDefault(doc, printed string) bool {
	if doc == printed {
		return true
	}
	switch doc {
	case "none", "off":
		return printed == "" || printed == "0" || printed == "false" || printed == "off" || printed == "0s"
	case "on":
		return printed == "true"
	}
	if printed == "" {
		return false
	}
	d := strings.ReplaceAll(doc, ",", "")
	if m := regexp.MustCompile(`^(-?[0-9.]+) ?(ms|s|m|h)$`).FindStringSubmatch(d); m != nil {
		d = m[1] + m[2]
	}
	if a, err := time.ParseDuration(d); err == nil {
		b, err := time.ParseDuration(printed)
		return err == nil && a == b
	}
	a, errA := strconv.ParseFloat(d, 64)
	b, errB := strconv.ParseFloat(printed, 64)
	return errA == nil && errB == nil && a == b
}

// Every default a doc states for a flag of `hapilot run` is the one
// `hapilot defaults` prints: a changed default, or a doc that guessed,
// fails here wherever the doc says it (README.md and docs/, in tables
// with a default column and in prose: "`--x` (default `v`)").
func TestDocsStateTheDefaultsAsPrinted(t *testing.T) {
	var out, errs bytes.Buffer
	if err := cmdDefaults(nil, &out, &errs); err != nil {
		t.Fatalf("hapilot defaults: %v: %s", err, errs.String())
	}
	printed := printedDefaults(out.Bytes())
	if len(printed) < 50 {
		t.Fatalf("read only %d settings from hapilot defaults: has its format changed?", len(printed))
	}
	files := []string{"README.md"}
	err := fs.WalkDir(os.DirFS("../.."), "docs", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p == resultsDir {
			return fs.SkipDir // hapilot-bench's reports, verbatim
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile("../../" + f)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range statedDefaults(f, string(b)) {
			p, ok := printed[s.flag]
			if !ok {
				continue // not a setting of hapilot run (a hapilot-bench flag)
			}
			checked++
			if !sameDefault(s.value, p) {
				t.Errorf("%s: says --%s defaults to %q; hapilot defaults prints %q", s.where, s.flag, s.value, p)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked only %d stated defaults: are the docs' forms still the ones read here?", checked)
	}
}

// The reader finds the forms the docs state defaults in, and the
// comparison tells a changed default from one written another way.
func TestStatedDefaults(t *testing.T) {
	printed := map[string]string{"interval": "10s", "operator-hold": "30m0s", "rules-arl-days": "1000", "mode": "enforce",
		"lua-listen": "", "audit-steps": "false", "rules-alpha": "1e-06", "llm-prompt": ""}
	for _, tc := range []struct {
		name, doc string
		want      []string // each stated default "flag=value", and whether it is the printed one
	}{
		{"a table row", "| flag | default | meaning |\n|---|---|---|\n| `--interval` | `10s` | x |\n", []string{"interval=10s true"}},
		{"a stale table row", "| flag | default | meaning |\n|---|---|---|\n| `--interval` | `5s` | x |\n", []string{"interval=5s false"}},
		{"a row of several flags", "| flag | default | meaning |\n|---|---|---|\n| `--mode`, `--lua-listen` | `observe`, off | x |\n",
			[]string{"mode=observe false", "lua-listen=off true"}},
		{"words only: not read", "| flag | default | meaning |\n|---|---|---|\n| `--interval` | the hostname | x |\n", nil},
		{"a default the flag does not have", "| flag | default | meaning |\n|---|---|---|\n| `--llm-prompt` | `full` | x |\n", []string{"llm-prompt=full false"}},
		{"no default column", "| flag | meaning |\n|---|---|\n| `--interval` | `5s` |\n", nil},
		{"prose, in code", "the hold, `--operator-hold` (default `30m`), stands", []string{"operator-hold=30m true"}},
		{"prose, a number", "`--rules-arl-days` (default 1,000) sets", []string{"rules-arl-days=1,000 true"}},
		{"prose, by default", "`--audit-steps` (off by default) adds", []string{"audit-steps=off true"}},
		{"prose, a duration by default", "`--interval` (5 s by default)", []string{"interval=5 s false"}},
		{"prose, an exponent", "`--rules-alpha` (default `1e-6`)", []string{"rules-alpha=1e-6 true"}},
		{"an example value is no default", "run it with `--interval` (`5s`, say)", nil},
		{"in a code block", "```\n| flag | default |\n|---|---|\n| `--interval` | `5s` |\n```\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, s := range statedDefaults("doc.md", tc.doc) {
				got = append(got, fmt.Sprintf("%s=%s %v", s.flag, s.value, sameDefault(s.value, printed[s.flag])))
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
