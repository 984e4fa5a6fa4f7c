package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

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
