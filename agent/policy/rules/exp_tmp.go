package rules

import (
	"os"
	"strconv"
)

func envf(name string, def float64) float64 {
	if v, err := strconv.ParseFloat(os.Getenv(name), 64); err == nil {
		return v
	}
	return def
}

var (
	expCredit    = envf("HAP_CREDIT", windowCredit)
	expPeerAlpha = envf("HAP_PEERALPHA", peerAlpha)
	expMinDur    = envf("HAP_MINDUR", -1)
	expNoPeer    = envf("HAP_NOPEER", 0)
	expForget    = int(envf("HAP_FORGET", forgetWindows))
)
