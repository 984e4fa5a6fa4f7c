// Package lua holds the HAProxy-side Lua companion (hapilot.lua), embedded
// so that tests and examples use the very file operators load.
package lua

import _ "embed"

// Companion is hapilot.lua.
//
//go:embed hapilot.lua
var Companion string
