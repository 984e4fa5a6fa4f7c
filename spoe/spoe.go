// Package spoe holds the HAProxy side of the SPOE path: the engine
// configuration HAProxy loads (hapilot-spoe.conf, and
// hapilot-spoe-sampled.conf for sampled telemetry), embedded so that tests,
// the demo and the benchmark run the very files operators copy. The agent's
// side, the SPOE agent that receives the messages, is
// internal/ingest/spoe; the Lua path's HAProxy side is lua/.
package spoe

import _ "embed"

// Conf is hapilot-spoe.conf: one NOTIFY message per response.
//
//go:embed hapilot-spoe.conf
var Conf string

// SampledConf is hapilot-spoe-sampled.conf: the message with its sample
// argument.
//
//go:embed hapilot-spoe-sampled.conf
var SampledConf string
