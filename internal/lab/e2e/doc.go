// Package e2e holds the end-to-end tests: a real HAProxy (Debian's 2.6),
// real backends and real load, with the agent in process or as a
// `hapilot run` process. They build only with the e2e tag (`make e2e`,
// part of `make test`), so that `go test ./...` needs no HAProxy.
package e2e
