# hapilot: `make demo` runs the main job, `make test` the tests. Both install
# what they need on a Debian machine (HAProxy through apt-get).

GO       ?= go
BIN      := bin/hapilot
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)

.PHONY: all build demo test unit e2e fuzz bench bench-quick bench-study vet fmt deps clean

all: build

# HAProxy 2.6 from Debian, installed when missing (root, or sudo).
deps:
	@command -v haproxy >/dev/null 2>&1 || { \
		echo "installing haproxy (apt-get)"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq haproxy >/dev/null; }
	@haproxy -v | head -1

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/hapilot

# The demo: a real HAProxy, 6 servers of which srv3 and srv6 fail 5%,
# 300 req/s with --policy static then --policy rules, and a table.
demo: deps build
	./$(BIN) demo

# Unit tests, the fuzz seed corpora, and the end-to-end tests against a
# real HAProxy (run in parallel: they are light on CPU and long on time).
test: deps vet
	$(GO) test -count=1 -race $$($(GO) list ./... | grep -v /internal/e2e)
	$(GO) test -count=1 -parallel 8 -timeout 9m ./internal/e2e/

vet:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# Longer fuzzing, outside CI: FUZZTIME per target.
FUZZTIME ?= 5m
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeNotify$$' -fuzztime $(FUZZTIME) ./spoe/
	$(GO) test -run '^$$' -fuzz '^FuzzServeConn$$' -fuzztime $(FUZZTIME) ./spoe/
	$(GO) test -run '^$$' -fuzz '^FuzzParseServersState$$' -fuzztime $(FUZZTIME) ./haproxy/

# Ingest cost per event and per SPOE message.
bench:
	$(GO) test -run '^$$' -bench . -benchmem -cpu 1 ./internal/window/ ./spoe/

# The study's benchmark, compressed tenfold (60 steps of 1 s): the paper
# scenario at N=3 and N=9, static and rules, real HAProxy. About 4.5 min.
BENCH_OUT ?= bench-out/quick
bench-quick: deps build
	./$(BIN) bench --scenario paper --servers 3,9 --algo roundrobin --policy rules --steps 60 --interval 1s --out $(BENCH_OUT)

# The study's grid at the study's own pace (60 steps of 10 s): N = 3, 5, 7,
# 9 x roundrobin, leastconn, static and rules: 32 runs of 10 min, about 5.5 hours.
bench-study: deps build
	./$(BIN) bench --sweep --scenario paper --policy rules --steps 60 --interval 10s --out bench-out/study

clean:
	rm -rf bin bench-out
