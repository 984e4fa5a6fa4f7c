package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/hapilot/hapilot/cmd/hapilot/config"
)

// settingGroups sorts every setting of `hapilot run` into the groups
// docs/reference/configuration.md lists them in. A flag in no group fails
// TestSettingsDoc: a new setting gets its group and its line.
var settingGroups = []struct {
	name  string
	flags []string
}{
	{"Core", []string{"config", "haproxy-socket", "interval", "mode", "state-file", "on-exit", "operator-hold", "reapply-within", "audit-log", "audit-steps",
		"log-format", "log-level", "max-stat-rows"}},
	{"Telemetry", []string{"spoe-listen", "lua-listen", "syslog-listen", "peer-group", "stats-poll", "stats-poll-mode", "window", "max-servers", "evidence-check"}},
	{"Policy and guardrails", []string{"policy", "policy-file", "shadow", "rules-alpha", "rules-min-requests", "rules-min-errors", "rules-min-ratio",
		"rules-latency-ratio", "rules-latency-min-ms", "rules-latency-baseline-ratio", "rules-tail-ratio", "rules-tail-floor", "rules-floor", "rules-degraded-ratio", "rules-arl-days", "rules-healthy-floor", "rules-healthy-ratio", "rules-min-duration", "rules-zone-every", "rules-baseline-span", "min-serving", "max-utilization", "hash-backends", "backend", "max-drained", "max-drains-per-hour",
		"readmit", "probe-path", "probe-host", "probe-rate", "probe-cooldown", "p99-guard", "p99-guard-for"}},
	{"LLM", []string{"model", "llm-api", "llm-url", "ollama-host", "llm-key-file", "think", "num-predict", "think-budget", "num-ctx", "num-thread",
		"keep-alive", "llm-load-timeout", "token-budget", "system-prompt", "llm-prompt", "confirm", "min-hold", "llm-gate", "llm-deadline",
		"skip-calibration", "calibration-dir"}},
	{"Fleet", []string{"fleet-bind", "fleet-join", "fleet-key", "fleet-name", "fleet-sync", "fleet-warmup", "fleet-timeout"}},
	{"Control and notifications", []string{"control-socket", "status-listen", "status-token", "notify-webhook", "notify-format", "notify-timeout"}},
}

// writeSettingsDoc writes the grouped table of every setting with its
// default and usage, as docs/reference/configuration.md holds it; it fails on a
// flag in no group, or a group's name that is no flag.
func writeSettingsDoc(w io.Writer) error {
	fs := flag.NewFlagSet("hapilot run", flag.ContinueOnError)
	config.Register(fs)
	fs.String("config", "", "file of settings, one \"name value\" per line, names as these flags without dashes; the command line wins")
	grouped := map[string]bool{}
	for _, g := range settingGroups {
		fmt.Fprintf(w, "\n### %s\n\n| setting | default | meaning |\n|---|---|---|\n", g.name)
		for _, name := range g.flags {
			f := fs.Lookup(name)
			if f == nil {
				return fmt.Errorf("group %s names %q, which is no setting", g.name, name)
			}
			grouped[name] = true
			def := "`" + f.DefValue + "`"
			if f.DefValue == "" {
				def = "none"
			}
			usage := strings.ReplaceAll(f.Usage, "|", "\\|")
			fmt.Fprintf(w, "| `%s` | %s | %s |\n", name, def, usage)
		}
	}
	var missing []string
	fs.VisitAll(func(f *flag.Flag) {
		if !grouped[f.Name] {
			missing = append(missing, f.Name)
		}
	})
	if len(missing) > 0 {
		return fmt.Errorf("settings in no group of settingGroups: %v", missing)
	}
	return nil
}
