// Package examples embeds the drop-in files so that tests, the demo and
// the benchmark run exactly the stanza operators copy.
package examples

import _ "embed"

// HAProxyCfg is haproxy.cfg.
//
//go:embed haproxy.cfg
var HAProxyCfg string

// HAProxyLuaCfg is haproxy-lua.cfg.
//
//go:embed haproxy-lua.cfg
var HAProxyLuaCfg string

// HAProxySyslogCfg is haproxy-syslog.cfg.
//
//go:embed haproxy-syslog.cfg
var HAProxySyslogCfg string

// RatioPolicy is policies/ratio.lua, the benchmark's default Lua policy.
//
//go:embed policies/ratio.lua
var RatioPolicy string

// HAProxySyslogRingCfg is haproxy-syslog-ring.cfg.
//
//go:embed haproxy-syslog-ring.cfg
var HAProxySyslogRingCfg string

// HAProxySampledCfg is haproxy-sampled.cfg: every 5xx and one in k
// other answers.
//
//go:embed haproxy-sampled.cfg
var HAProxySampledCfg string
