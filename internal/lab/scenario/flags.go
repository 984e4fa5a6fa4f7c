package scenario

import (
	"flag"
	"io"
)

func newFlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("hapilot run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}
