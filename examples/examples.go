// Package examples embeds the drop-in files so that tests, the demo and
// the benchmark run exactly the stanza operators copy.
package examples

import _ "embed"

// SPOEConf is hapilot-spoe.conf.
//
//go:embed hapilot-spoe.conf
var SPOEConf string

// HAProxyCfg is haproxy.cfg.
//
//go:embed haproxy.cfg
var HAProxyCfg string
