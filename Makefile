# hapilot: `make demo` runs the main job, `make test` the tests. Both install
# what they need on a Debian machine (HAProxy through apt-get).
#
# Two binaries: bin/hapilot is the agent an operator installs; bin/hapilot-bench
# is the lab (demo, benchmark, overhead), which the agent never links.

GO          ?= go
BIN         := bin/hapilot
LAB         := bin/hapilot-bench
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -X main.version=$(VERSION)
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

# Tests that need HAProxy skip where it is missing (so `go test ./...` runs
# anywhere); under make, a missing HAProxy fails them instead.
export HAPILOT_REQUIRE_HAPROXY := 1

.PHONY: all build demo test unit e2e test-faults soak soak-long lint vet fmt tidy fuzz bench bench-quick bench-study bench-overhead-matrix deps clean deb test-deb haproxy-matrix test-matrix test-browser test-fleet test-fake-fleet modelservers test-llm model model-grey torch

all: build

# HAProxy 2.6 from Debian, installed when missing (root, or sudo).
deps:
	@command -v haproxy >/dev/null 2>&1 || { \
		echo "installing haproxy (apt-get)"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq haproxy >/dev/null; }
	@haproxy -v | sed -n 1p

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/hapilot
	$(GO) build -ldflags "$(LDFLAGS)" -o $(LAB) ./cmd/hapilot-bench

# The Debian package, built with dpkg-deb from a staged tree (no packaging
# library: Debian's own tool makes exactly what dpkg installs). It holds the
# agent (static, no cgo), its hardened systemd unit, /etc/hapilot/hapilot.conf
# (a conffile: every setting commented at its default), the audit log's
# /etc/logrotate.d/hapilot (a conffile too) and the drop-in stanzas under
# /usr/share/doc/hapilot/examples.
DEB_ARCH    := $(shell dpkg --print-architecture 2>/dev/null || echo amd64)
DEB_VERSION ?= 0.1.0~git$(shell git rev-list --count HEAD 2>/dev/null || echo 0).$(shell git rev-parse --short HEAD 2>/dev/null || echo none)
DEB         := bin/hapilot_$(DEB_VERSION)_$(DEB_ARCH).deb
DEB_ROOT    := bin/deb
DEB_DOC     := $(DEB_ROOT)/usr/share/doc/hapilot
deb:
	rm -rf $(DEB_ROOT) bin/hapilot_*.deb
	mkdir -p $(DEB_ROOT)/DEBIAN $(DEB_ROOT)/usr/bin $(DEB_ROOT)/lib/systemd/system $(DEB_ROOT)/etc/hapilot $(DEB_DOC)/examples/policies
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(DEB_ROOT)/usr/bin/hapilot ./cmd/hapilot
	install -m 644 examples/hapilot.service $(DEB_ROOT)/lib/systemd/system/hapilot.service
	install -m 644 examples/hapilot.conf $(DEB_ROOT)/etc/hapilot/hapilot.conf
	install -D -m 644 cmd/hapilot/debian/logrotate $(DEB_ROOT)/etc/logrotate.d/hapilot
	install -m 644 examples/haproxy*.cfg spoe/hapilot-spoe*.conf lua/hapilot.lua $(DEB_DOC)/examples/
	install -m 644 examples/policies/*.lua $(DEB_DOC)/examples/policies/
	install -m 644 README.md $(DEB_DOC)/
	cp -r docs $(DEB_DOC)/docs && chmod -R u=rwX,go=rX $(DEB_DOC)/docs
	sed -e 's/@VERSION@/$(DEB_VERSION)/' -e 's/@ARCH@/$(DEB_ARCH)/' cmd/hapilot/debian/control > $(DEB_ROOT)/DEBIAN/control
	install -m 644 cmd/hapilot/debian/conffiles $(DEB_ROOT)/DEBIAN/
	install -m 755 cmd/hapilot/debian/postinst cmd/hapilot/debian/prerm cmd/hapilot/debian/postrm $(DEB_ROOT)/DEBIAN/
	dpkg-deb --root-owner-group -Zxz --build $(DEB_ROOT) $(DEB)
	@echo "built $(DEB): sudo apt install ./$(DEB)"

# The package's tests: dpkg -i on this machine (root), `hapilot check` of
# the installed config, `systemd-analyze verify` of the unit, and the
# installed binary with the installed config against a real HAProxy whose
# admin socket has the permissions the unit expects, run as the package's
# user.
test-deb: deps deb
	HAPILOT_DEB=$(CURDIR)/$(DEB) $(GO) test -tags e2e,deb -count=1 -v -timeout 5m -run '^TestDebianPackage' ./internal/lab/e2e/

# Every HAProxy LTS an operator runs today: Debian 12's 2.6 (the system's),
# Debian 13's 3.0 and sid's 3.2, the last two fetched from Debian's archive
# and run with their own loader and libraries, nothing installed
# (internal/lab/haproxyproc/fetch-haproxy.sh, patchelf for their loader).
# The e2e subset runs against each: the paper fault, the agent killed, the
# Lua companion, syslog and the ring, reload and restart, the stats path
# and retries; Debian's stock global section (chroot, user, group) with
# every example's stanza, a silent path noticed, check --live, master-worker
# reloads and the server kinds; and `haproxy -c` of every example, which
# must pass without a warning. On 3.0 and 3.2, the fault classes too (issue
# 42): what HAProxy's counters record for each, and every class drained on
# every path in one fleet (TestEveryFaultAtOnce, its drain times printed);
# on 2.6 they are `make test`'s and `make test-faults`' one class at a time.
MATRIX_E2E := ^(TestFaultyServersDrained|TestAgentKilledMidLoad|TestLuaAndSyslogPathsDrainFaulty|TestAgentKilledLuaAndSyslog|TestHAProxyReloadAndRestart|TestStatsAndSampledPaths|TestRetriedFailuresAreSeen|TestStockDebianConfig|TestSilentSPOEIsNoticed|TestCheckLive|TestMasterWorkerReload|TestServerKinds|TestServerTemplateSlots)$$
haproxy-matrix: deps
	@command -v patchelf >/dev/null 2>&1 || { \
		echo "installing patchelf (apt-get)"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq patchelf >/dev/null; }
	internal/lab/haproxyproc/fetch-haproxy.sh trixie bin/haproxy-3.0
	internal/lab/haproxyproc/fetch-haproxy.sh sid bin/haproxy-3.2

test-matrix: haproxy-matrix
	@set -e; for v in 2.6 3.0 3.2; do \
		bin=haproxy; [ $$v = 2.6 ] || bin=$(CURDIR)/bin/haproxy-$$v/haproxy; \
		echo "== HAProxy $$v: $$($$bin -v | sed -n 1p)"; \
		HAPROXY_BIN=$$bin $(GO) test -count=1 -run 'Example' ./examples/; \
		HAPROXY_BIN=$$bin $(GO) test -tags e2e -count=1 -parallel 8 -timeout 12m -run '$(MATRIX_E2E)' ./internal/lab/e2e/; \
		if [ $$v != 2.6 ]; then \
			HAPROXY_BIN=$$bin $(GO) test -count=1 -run '^TestFaultsInHAProxysCounters$$' ./internal/lab/fleet/; \
			log=bin/every-fault-$$v.log; \
			HAPROXY_BIN=$$bin $(GO) test -tags e2e,faults -count=1 -v -parallel 4 -timeout 6m -run '^TestEveryFaultAtOnce$$' ./internal/lab/e2e/ >$$log 2>&1 || { cat $$log; exit 1; }; \
			grep -E 'after its onset|^(---|ok)|    ---' $$log | sed 's/; final.*//'; \
		fi; \
	done

# The live page in a real browser: Debian's Chromium, headless, through
# chromedriver, during a demo fleet's run; the screenshot lands in
# bin/artifacts/live-page.png.
test-browser: deps
	@command -v chromedriver >/dev/null 2>&1 || { \
		echo "installing chromium and chromium-driver (apt-get)"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; }
	HAPILOT_ARTIFACTS=$(CURDIR)/bin/artifacts $(GO) test -tags e2e,browser -count=1 -v -timeout 5m -run '^TestLivePageInABrowser$$' ./internal/lab/e2e/

# Real model servers for the LLM policy's tests: Ollama built from the
# module version go.mod pins (about 6 minutes on 2 cores the first time;
# bin/ollama is reused after, and a copy in ~/.cache/hapilot serves any
# fresh clone on the machine),
# and llama-server from Debian sid, unpacked under bin/llama.cpp, nothing
# installed. A missing header or a failed build stops here, naming the
# package.
modelservers:
	internal/lab/modelserver/build-ollama.sh bin/ollama
	internal/lab/modelserver/fetch-llama.sh bin/llama.cpp

# The stand-in checked against the real Ollama, and what llama-server and
# Ollama's /v1 accept, on tiny random models written in Go
# (internal/lab/modelserver, build tag modelserver); and train.py's model,
# trained for a few seconds, served by llama-server as PyTorch runs it
# (internal/lab/dataset). A missing server fails the tests here instead of
# skipping them.
test-llm: modelservers deps torch
	HAPILOT_REQUIRE_MODELSERVERS=1 $(GO) test -tags modelserver -count=1 -v -timeout 15m ./internal/lab/modelserver/ ./internal/lab/dataset/
	HAPILOT_REQUIRE_MODELSERVERS=1 $(GO) test -tags e2e,modelserver,fleet -count=1 -v -timeout 25m -run '^TestReal' ./internal/lab/e2e/

# PyTorch from Debian for train.py, installed when missing, with
# OpenBLAS: torch's generic BLAS is nearly six times slower.
torch:
	@/usr/bin/python3 -c 'import torch' 2>/dev/null && [ -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 ] || { \
		echo "installing python3-torch and libopenblas0-pthread (apt-get)"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq python3-torch libopenblas0-pthread >/dev/null; }

# hapilot's own policy model (internal/lab/models, docs/lab/own-model.md): the
# dataset from the recipe's seed (hapilot-bench dataset), then the
# recipe's trainer on one thread a model at nice 10, the two at once:
# train.py on Debian's PyTorch, its loss on the answer only, for
# hapilot-tiny and for hapilot-tiny-penalty. llama-server (Debian sid)
# then checks each served model against PyTorch. It rewrites the committed
# GGUFs, Modelfiles and training logs; the progress shows as it trains.
model: build torch
	internal/lab/modelserver/fetch-llama.sh bin/llama.cpp
	HAPILOT_LLAMA_DIR=bin/llama.cpp internal/lab/models/train.sh ./$(LAB) internal/lab/models bin/model-work

# hapilot-grey (internal/lab/models/recipe-grey.env): one model trained for
# the grey band the rules' sequential test leaves to a model, alone on
# both cores. It rewrites internal/lab/models/hapilot-grey/.
model-grey: build torch
	internal/lab/modelserver/fetch-llama.sh bin/llama.cpp
	RECIPE=internal/lab/models/recipe-grey.env HAPILOT_LLAMA_DIR=bin/llama.cpp internal/lab/models/train.sh ./$(LAB) internal/lab/models bin/model-grey-work

# The demo: a real HAProxy, 6 servers of which srv3 and srv6 fail 5%,
# 300 req/s with --policy static then --policy rules, and a table.
demo: deps build
	./$(LAB) demo

# Static checks, the unit tests (with the fuzz seed corpora) under the race
# detector, then the end-to-end tests against a real HAProxy.
# Every way a real server fails (issue 42), on every telemetry path, and a
# deploy's restarts (issue 41), against a real HAProxy with retries 3 and
# option redispatch: one HAProxy, fleet and agent at a time, about 40 s
# each (internal/lab/e2e/faults_long_test.go).
test-faults: deps build
	$(GO) test -tags e2e,faults -count=1 -v -timeout 25m -run '^(TestEveryFaultDrained|TestEveryFaultDrainedLuaAndLogs|TestSlowTailDrained|TestDemoFault|TestDeployRestartNotDrained|TestResettingServerDrained|TestCapacityTightFleet)$$' ./internal/lab/e2e/

# The real agent in front of a fake runtime socket of 90 servers for 10
# minutes, rules and llm (its model unreachable) side by side, no healthy
# server touched (issue 41; internal/lab/e2e/fakesocket_long_test.go).
# Light on CPU: CI runs it beside make soak-long.
test-fake-fleet:
	$(GO) test -tags e2e,faults -count=1 -v -timeout 20m -run '^TestRealAgentFakeFleetNoFalseDrain$$' ./internal/lab/e2e/

# Fleet mode end to end: 3 HAProxy nodes and 3 agents on loopback (pooled
# detection against one node and against the fleet off; the decider
# killed; an agent cut off with nftables, then let back; the LLM asked
# once per step for the fleet). It needs root for nft.
test-fleet: deps
	@command -v nft >/dev/null 2>&1 || { \
		echo "installing nftables (apt-get)"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq nftables >/dev/null; }
	$(GO) test -tags e2e,fleet -count=1 -v -timeout 10m -run '^TestFleet(PooledDetection|SurvivesKillCutAndRejoin|AsksTheModelOncePerStep)$$' ./internal/lab/e2e/

test: deps lint unit e2e

# The long statistical simulations skip under -race (one goroutine each:
# ten times slower with it, 235 s of the rules package's unit run and 140
# s of the dataset's) and run here without it, in one go test so that the
# packages run side by side. The soak package (the lab's simulated
# server-days, one goroutine a cell) runs without -race as a whole: under
# it, it was the unit run's longest package (134 s, 27 s without); the
# policies it drives have their own tests under -race.
UNIT_NORACE = ^(TestTailFound|TestTailStalls|TestTailHealthy|TestTwoBurstsSecondsApart|TestOverlappingBurstsOnABurstyServer|TestZoneServerWithBurstsOnceADay|TestMinimumDuration|TestLabelsFollowGroundTruth)$$
UNIT_NORACE_PKGS = ./agent/policy/rules/ ./internal/lab/dataset/
UNIT_NORACE_WHOLE = github.com/hapilot/hapilot/internal/lab/soak
unit:
	$(GO) test -count=1 -race $$($(GO) list ./... | grep -v -x -F '$(UNIT_NORACE_WHOLE)')
	$(GO) test -count=1 -run '$(UNIT_NORACE)' $(UNIT_NORACE_PKGS) & p1=$$!; \
	$(GO) test -count=1 $(UNIT_NORACE_WHOLE); s2=$$?; wait $$p1; s1=$$?; [ $$s1 = 0 ] && [ $$s2 = 0 ]

# The end-to-end tests (build tag e2e), run in parallel: they are light on
# CPU and long on time. Twelve at once: at eight the run took 317-327 s
# (1,580 s of tests), at twelve 229 s beside a busy loop on one of the two
# cores, every test passing.
e2e: deps
	$(GO) test -tags e2e -count=1 -parallel 12 -timeout 9m ./internal/lab/e2e/

# A soak of SOAK (30m): a real HAProxy at steady load, the agent taking a
# drip of hostile input on every port; its RSS, steps and goroutines are
# checked. Outside make test.
SOAK ?= 30m
soak: deps
	HAPILOT_SOAK=$(SOAK) $(GO) test -tags e2e,soak -count=1 -v -timeout 0 -run '^TestSoak$$' ./internal/lab/e2e/

# The detection figures of docs/lab/detection.md: simulated server-days through
# the rules' sequential test (hapilot-bench soak), SOAK_DAYS server-days in
# each healthy-noise model of issue 37's table, then the fault table; then
# issue 41's models: wider spreads, a noisier service, bigger, more frequent
# and spread bursts, restarts, the check every 100 ms (SOAK_DAYS_FINE: ten
# chunks a second cost ten times as much), random fleets, fleet-wide
# incidents at N=2, 3, 9 and 1, 5, 33 req/s (SOAK_INCIDENTS a seed), and
# three faulty servers at once. It fails if one of issue 37's models, or
# one of issue 41's where the robust detector keeps the promise (wider
# spreads, the noisier service, the bursts, the 100 ms check), passes 1
# false drain per 1,000 healthy-region server-days, its 95% upper end
# reaches 2, or a server is drained twice in a day; restarts, random fleets
# and fleet-wide incidents, where docs/lab/detection.md says it does not
# yet, are measured and printed without failing. The lines before issue
# 41's took about 13 minutes of 2 cores; issue 41's, at SOAK_DAYS_NEW server-days a model, add about 5 more (CPU
# measured at small sizes and scaled: 10 ms of CPU a server-day at N=9 and 33 req/s,
# 12 in random fleets, 117 at 100 ms, 9 an incident).
SOAK_DAYS ?= 10000
SOAK_DAYS_NEW ?= 2000
SOAK_DAYS_FINE ?= 2000
SOAK_INCIDENTS ?= 500
SOAK_OUT  ?= bench-out/soak
soak-long: build
	mkdir -p $(SOAK_OUT)
	./$(LAB) soak --servers 9 --rate 5,33,300 --server-days $(SOAK_DAYS) --seeds 1-4 --max-per-1000 1 --max-upper 2 --json $(SOAK_OUT)/n9.json
	./$(LAB) soak --servers 3 --rate 33 --server-days $(SOAK_DAYS) --seeds 1-4 --max-per-1000 1 --max-upper 2 --json $(SOAK_OUT)/n3.json
	./$(LAB) soak --servers 30,100 --rate 5 --server-days $(SOAK_DAYS) --seeds 1-4 --max-per-1000 1 --max-upper 2 --json $(SOAK_OUT)/large5.json
	./$(LAB) soak --servers 100 --rate 33 --server-days $(SOAK_DAYS) --seeds 1-4 --max-per-1000 1 --max-upper 2 --json $(SOAK_OUT)/large33.json
	./$(LAB) soak --servers 9 --rate 33,300 --bursts 6:3-10 --server-days $(SOAK_DAYS) --seeds 1-4 --max-per-1000 1 --max-upper 2 --json $(SOAK_OUT)/bursts.json
	./$(LAB) soak --servers 9 --rate 33 --hetero 0.2,0.3 --server-days $(SOAK_DAYS) --seeds 1-4 --max-per-1000 1 --max-upper 2 --json $(SOAK_OUT)/hetero33.json
	./$(LAB) soak --servers 9 --rate 300 --hetero 0.3 --server-days $(SOAK_DAYS) --seeds 1-4 --max-per-1000 1 --max-upper 2 --json $(SOAK_OUT)/hetero300.json
	./$(LAB) soak --servers 3,9 --rate 5,33,300 --server-days 0 --fault 0.02,0.05,0.2 --trials 50 --seeds 1-4 --json $(SOAK_OUT)/detect.json
	./$(LAB) soak --servers 9 --rate 33 --hetero 0.4,0.5 --server-days $(SOAK_DAYS_NEW) --seeds 1-4 --max-per-1000 1 --max-upper 2 --max-one-server-day 1 --json $(SOAK_OUT)/hetero-wide.json
	./$(LAB) soak --servers 9 --rate 33 --noise 0.01 --hetero 0.3 --server-days $(SOAK_DAYS_NEW) --seeds 1-4 --max-per-1000 1 --max-upper 2 --max-one-server-day 1 --json $(SOAK_OUT)/noisy.json
	./$(LAB) soak --servers 9 --rate 33 --bursts 2:3-10 --server-days $(SOAK_DAYS_NEW) --seeds 1-4 --max-per-1000 1 --max-upper 2 --max-one-server-day 1 --json $(SOAK_OUT)/bursts2h.json
	./$(LAB) soak --servers 9 --rate 33 --bursts 6:10-30 --server-days $(SOAK_DAYS_NEW) --seeds 1-4 --max-per-1000 1 --max-upper 2 --max-one-server-day 1 --json $(SOAK_OUT)/bursts-big.json
	./$(LAB) soak --servers 9 --rate 33 --bursts 6:3-10 --burst-spread 5 --server-days $(SOAK_DAYS_NEW) --seeds 1-4 --max-per-1000 1 --max-upper 2 --max-one-server-day 1 --json $(SOAK_OUT)/bursts-spread.json
	./$(LAB) soak --servers 9 --rate 33 --restarts 6:3 --server-days $(SOAK_DAYS_NEW) --seeds 1-4 --json $(SOAK_OUT)/restarts.json
	./$(LAB) soak --servers 9 --rate 33 --hetero 0.3 --evidence-check 100ms --server-days $(SOAK_DAYS_FINE) --seeds 1-4 --max-per-1000 1 --max-upper 2 --max-one-server-day 1 --json $(SOAK_OUT)/check100ms.json
	./$(LAB) soak --random-fleets --server-days $(SOAK_DAYS_NEW) --seeds 1-4 --json $(SOAK_OUT)/random.json
	./$(LAB) soak --servers 50 --rate 0.5,2,5 --noise 0.003 --hetero 0.3 --bursts 3:10-30 --burst-spread 5 --server-days $(SOAK_DAYS_NEW) --seeds 1-4 --json $(SOAK_OUT)/bursts-low.json
	./$(LAB) soak --servers 2,3,9 --rate 1,5,33 --fleet-fault 0.05 --server-days 0 --trials $(SOAK_INCIDENTS) --seeds 1-4 --json $(SOAK_OUT)/fleet-fault.json
	./$(LAB) soak --servers 9 --rate 5,33 --server-days 0 --fault 0.05 --faulty 3 --trials 50 --seeds 1-4 --json $(SOAK_OUT)/detect-3faulty.json

lint: vet tidy
	$(GO) run $(STATICCHECK) -tags e2e,soak,deb,browser,fleet,modelserver,faults ./...

vet:
	$(GO) vet ./...
	$(GO) vet -tags e2e ./internal/lab/e2e/
	$(GO) vet -tags e2e,soak ./internal/lab/e2e/
	$(GO) vet -tags e2e,faults ./internal/lab/e2e/
	$(GO) vet -tags e2e,deb ./internal/lab/e2e/
	$(GO) vet -tags e2e,browser ./internal/lab/e2e/
	$(GO) vet -tags e2e,fleet ./internal/lab/e2e/
	$(GO) vet -tags modelserver ./internal/lab/modelserver/
	$(GO) vet -tags e2e,modelserver ./internal/lab/e2e/
	$(GO) vet -tags e2e,fleet,modelserver ./internal/lab/e2e/
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# go.mod and go.sum must be what `go mod tidy` makes of the code.
tidy:
	@cp go.mod /tmp/hapilot-go.mod.$$$$ && cp go.sum /tmp/hapilot-go.sum.$$$$ && \
		$(GO) mod tidy && \
		if ! cmp -s go.mod /tmp/hapilot-go.mod.$$$$ || ! cmp -s go.sum /tmp/hapilot-go.sum.$$$$; then \
			echo "go.mod/go.sum were not tidy: run go mod tidy and commit"; \
			mv /tmp/hapilot-go.mod.$$$$ go.mod; mv /tmp/hapilot-go.sum.$$$$ go.sum; exit 1; \
		fi; rm -f /tmp/hapilot-go.mod.$$$$ /tmp/hapilot-go.sum.$$$$

# Longer fuzzing, outside CI: FUZZTIME per target (a nightly run:
# make fuzz FUZZTIME=30m). make test runs every target's seed corpus.
FUZZTIME ?= 5m
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeNotify$$' -fuzztime $(FUZZTIME) ./internal/ingest/spoe/
	$(GO) test -run '^$$' -fuzz '^FuzzServeConn$$' -fuzztime $(FUZZTIME) ./internal/ingest/spoe/
	$(GO) test -run '^$$' -fuzz '^FuzzParseServersState$$' -fuzztime $(FUZZTIME) ./haproxy/
	$(GO) test -run '^$$' -fuzz '^FuzzParseLine$$' -fuzztime $(FUZZTIME) ./internal/ingest/logs/
	$(GO) test -run '^$$' -fuzz '^FuzzParseLogLine$$' -fuzztime $(FUZZTIME) ./internal/ingest/logs/
	$(GO) test -run '^$$' -fuzz '^FuzzConfigFile$$' -fuzztime $(FUZZTIME) ./cmd/hapilot/config/

# Ingest cost per event and per SPOE message.
bench:
	$(GO) test -run '^$$' -bench . -benchmem -cpu 1 ./internal/lib/window/ ./internal/ingest/spoe/

# The study's benchmark, compressed tenfold (60 steps of 1 s): the paper
# scenario, and paper-late (its fault after 30 s of steady traffic, timed
# from the onset), at N=3 and N=9, static and rules, real HAProxy.
BENCH_OUT ?= bench-out/quick
bench-quick: deps build
	./$(LAB) bench --scenario paper,paper-late --servers 3,9 --algo roundrobin --policy rules --steps 60 --interval 1s --out $(BENCH_OUT)

# What each telemetry path costs HAProxy's CPU per response, on every LTS
# of the test matrix (2.6, 3.0, 3.2) one after the other: `bench overhead`
# on each, then one table of them all. About 4 minutes; not in CI (the
# figures are the machine's, and a timed test would be flaky).
OVERHEAD_PATHS    ?= plain,stats,ring,spoe,spoe-sampled16
OVERHEAD_DURATION ?= 12s
OVERHEAD_ROUNDS   ?= 3
bench-overhead-matrix: haproxy-matrix build
	./$(LAB) bench overhead --paths $(OVERHEAD_PATHS) --duration $(OVERHEAD_DURATION) --rounds $(OVERHEAD_ROUNDS) \
		--haproxy 2.6=haproxy,3.0=$(CURDIR)/bin/haproxy-3.0/haproxy,3.2=$(CURDIR)/bin/haproxy-3.2/haproxy

# The study's grid at the study's own pace (60 steps of 10 s): N = 3, 5, 7,
# 9 x roundrobin, leastconn, static and rules, paper and paper-late: 64 runs
# of 10 min.
bench-study: deps build
	./$(LAB) bench --sweep --scenario paper,paper-late --policy rules --steps 60 --interval 10s --out bench-out/study

clean:
	rm -rf bin bench-out
