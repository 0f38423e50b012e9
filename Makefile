# quictun Makefile. Go is expected at /usr/local/go or on PATH.
export PATH := /usr/local/go/bin:$(PATH)
GO       ?= go
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS  := -s -w -X github.com/quictun/quictun/pkg/version.Version=$(VERSION) -X github.com/quictun/quictun/pkg/version.Revision=$(REVISION) -X main.version=$(VERSION)
FUZZTIME ?= 30s
BINARIES := ./cmd/quictun-server ./cmd/quictun-client ./tools/latency-client ./tools/linkem
# what a release holds (tools/release/main.go's Binaries); they build for every RELEASE_TARGETS platform
PRODUCT  := ./cmd/quictun-server ./cmd/quictun-client ./tools/latency-client
RELEASE_TARGETS := linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64
# make cross (part of make test) checks every RELEASE_TARGETS platform but linux/amd64 (lint's and the tests'):
# go vet with the tests for CROSS_TARGETS, one a GOOS (CROSS_TARGETS="$(RELEASE_TARGETS)" vets them all), and
# tools/typecheck, with the tests, for the rest (CROSS_TYPECHECK_TARGETS: the other architectures)
CROSS_TARGETS ?= windows/amd64 darwin/arm64
CROSS_TYPECHECK_TARGETS = $(filter-out linux/amd64 $(CROSS_TARGETS),$(RELEASE_TARGETS))
# every file time in the archives and the image: the commit's, so a release is reproducible
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
# make image's tag is IMAGE_REPO:VERSION (no leading v: the Helm chart's appVersion); deploy/helm's image.repository
IMAGE_REPO ?= quictun

.PHONY: all docs quic-go test-quic-go build cross release image test-release demo test test-short check vet lint fmt fmt-check fuzz fuzz-ci bench bench-full bench-run bench-loss bench-floor bench-compare bench-scale bench-idle bench-scale-report bench-reference e2e soak deploy-check clean

# golangci-lint, pinned; installed from the module proxy into GOPATH/bin under a versioned name (about
# 2 minutes the first time), so every clone on the machine (CI's fresh ones too) shares one build
GOLANGCI_LINT_VERSION := v2.15.0
GOBIN_DIR := $(shell $(GO) env GOPATH)/bin
GOLANGCI_LINT := $(GOBIN_DIR)/golangci-lint-$(GOLANGCI_LINT_VERSION)

all: build

## quic-go: the patched quic-go tree go.mod's replace points at (third_party/quic-go/README.md); every target below runs it first
quic-go:
	@bash scripts/quic-go.sh

## test-quic-go: quic-go's own tests of the packages our patches touch, on the patched tree
# (patch 0004's and 0012's regression tests can only fail under the race detector, so they run with -race; patch 0007's,
# 0011's and 0013's tests live in integrationtests/self too)
# (GOWORK=off: quic-go is its own module, outside go.work)
test-quic-go: quic-go
	cd third_party/quic-go/run-make-quic-go && GOWORK=off $(GO) test -count=1 . ./congestion ./internal/ackhandler ./internal/congestion ./internal/handshake ./internal/wire
	cd third_party/quic-go/run-make-quic-go && GOWORK=off $(GO) test -race -count=1 -run '^(Test0RTTOpenStreamsWhileHandshaking|TestStreamWritesOfConcurrentGoroutinesSharePackets|TestTailCopiesRecoverALostTailPacket|TestTailCopiesFillingTheSendQueue|TestConnectionMigrationAddressesWhileSwitching|Test0RTTTicketRemembersRaisedStreamLimit)$$' ./integrationtests/self

build: quic-go
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/ $(BINARIES)

## cross: the released packages and their tests for every release platform but linux/amd64: go vet (its
## analyzers, after compiling every dependency for the platform) for CROSS_TARGETS, one a GOOS, since the files
## differ by GOOS (Linux-only features are in *_linux.go files); tools/typecheck for the other architectures
## (a type check from source, the standard library's too, a few CPU-seconds where vet or go build compiles
## everything for one more platform, 70-140 s with a cold cache on this machine: it catches what golang.org/x/sys/unix
## defines on one architecture only; it generates no code, make release builds every platform)
cross: quic-go
	@for t in $(CROSS_TARGETS); do echo "== go vet $$t"; export CGO_ENABLED=0 GOOS=$${t%/*} GOARCH=$${t#*/}; \
	  pkgs=$$($(GO) list -deps $(PRODUCT) | grep '^github.com/quictun/quictun/') && $(GO) vet $$pkgs || exit 1; done
	@for t in $(CROSS_TYPECHECK_TARGETS); do echo "== typecheck $$t"; \
	  pkgs=$$(CGO_ENABLED=0 GOOS=$${t%/*} GOARCH=$${t#*/} $(GO) list -deps $(PRODUCT) | grep '^github.com/quictun/quictun/') && \
	  $(GO) run ./tools/typecheck -target $$t -test $$pkgs || exit 1; done

## release: bin/release/quictun_VERSION_OS_ARCH.{tar.gz,zip} for RELEASE_TARGETS (binaries, README.md, LICENSE, SECURITY.md, deploy units and configs;
## provenance.json (commit, Go, quic-go base and patches, flags, date, archive hashes) and SHA256SUMS of
## them, reproducible (-trimpath, every time SOURCE_DATE_EPOCH); SIGNING_KEY=path (an SSH private key, or the
## .pub of a key in ssh-agent) signs SHA256SUMS into SHA256SUMS.sig (ssh-keygen -Y sign -n file); without it the
## release is unsigned and says so; a key it cannot use fails it. tools/release says how
SIGNING_KEY ?=
release: quic-go
	rm -rf bin/release
	cd tools/release && GOWORK=off $(GO) run . archives --root ../.. --out ../../bin/release --version $(VERSION) \
	  --mtime $(SOURCE_DATE_EPOCH) --ldflags "$(LDFLAGS)" --targets "$(RELEASE_TARGETS)" \
	  --signing-key "$(if $(strip $(SIGNING_KEY)),$(abspath $(SIGNING_KEY)))"
	cd bin/release && sha256sum -c SHA256SUMS

## image: OCI image without a Docker daemon: bin/image/quictun_VERSION_linux_{amd64,arm64}.image.tar (docker load,
## crane push) and bin/image/oci, both architectures in one index (crane push --index); tagged IMAGE_REPO:VERSION
image: quic-go
	rm -rf bin/image
	cd tools/release && GOWORK=off $(GO) run . image --root ../.. --out ../../bin/image --version $(VERSION) \
	  --mtime $(SOURCE_DATE_EPOCH) --ldflags "$(LDFLAGS)" --repo $(IMAGE_REPO)

## test-release: tools/release's tests: archives reproducible and complete, the image tarball valid (crane validate's check), non-root;
## a release signed with a throwaway key verifies (scripts/verify-release.sh) and a tampered one does not; provenance.json names
## HEAD and the patches' hashes (fake binaries: no platform is built)
test-release:
	cd tools/release && GOWORK=off $(GO) test -count=1 .

## docs: docs/flags-server.md and docs/flags-client.md from the binaries' flags (their tests fail when these are stale)
docs: quic-go
	$(GO) run ./cmd/quictun-server docs > docs/flags-server.md
	$(GO) run ./cmd/quictun-client docs > docs/flags-client.md

## demo: local demo on loopback: echo server, quictun-server, quictun-client, latency direct and through the tunnel
demo: build
	bash scripts/demo.sh

## test: what CI runs: format and lint checks (golangci-lint runs go vet's analyzers, so no separate
## vet pass: it cost CI about 4 minutes on a loaded machine), go vet or tools/typecheck for the other release
## platforms (cross), tools/release's tests, then every test with the race detector (and TestWarmMemory without it)
# (go test starts the packages' test runs in the order given, two at a time on two cores: the bench
# harness's tests, which mostly wait on network namespaces, go first beside the rest instead of alone at
# the end)
test: quic-go fmt-check lint cross test-release test-quic-go
	$(GO) test -race -shuffle=on -count=1 -timeout 15m ./tools/bench/... ./...
	$(GO) test -count=1 -run '^TestWarmMemory$$' ./cmd/internal/cli # its page-fault count needs the race detector off
	$(MAKE) fuzz-ci

## fuzz-ci: the fuzz targets of what a peer without credentials reaches first, for FUZZ_CI_TIME each (part of test)
FUZZ_CI_TIME ?= 30s
fuzz-ci: quic-go
	$(GO) test -run '^$$' -fuzz '^FuzzFrameSequences$$' -fuzztime $(FUZZ_CI_TIME) ./pkg/tcpmux

## e2e: black-box tests of the built binaries (also part of make test)
e2e: quic-go
	$(GO) test -race -count=1 ./test/e2e/

## soak: mixed traffic through a lossy link with blackouts and server restarts for SOAK (default 1h); checks data and leaks
SOAK ?= 1h
soak: quic-go
	QUICTUN_SOAK_DURATION=$(SOAK) $(GO) test -count=1 -run '^TestSoak$$' -timeout 0 -v ./test/integration/

## deploy-check: lint and render the Helm chart, validate deploy/ offline (installs helm with go install if missing, ~4 min the first time)
deploy-check:
	bash deploy/helm/check.sh

test-short: quic-go
	$(GO) test -race -short -count=1 ./... ./tools/bench/...

# tools/bench is a module of its own (go.work), so its packages are named apart.
vet: quic-go
	$(GO) vet ./... ./tools/bench/...

## lint: golangci-lint with .golangci.yml (staticcheck, errcheck, depguard's import rules, ...)
lint: quic-go $(GOLANGCI_LINT)
	$(GOLANGCI_LINT) run ./... ./tools/bench/...

$(GOLANGCI_LINT):
	@mkdir -p bin/tools
	GOBIN=$(CURDIR)/bin/tools $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	@mkdir -p $(GOBIN_DIR)
	mv bin/tools/golangci-lint $@

fmt:
	gofmt -w $$(git ls-files '*.go')

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## fuzz: run every fuzz target for FUZZTIME each (CI runs their seed corpora, as part of test, and fuzz-ci)
fuzz: quic-go
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; done

## bench: Go benchmarks, the loopback cases (direct vs tunnel on this host: ping-pong, QPS, echo TPS, connections/s, redis, CPU/GB) and the quick profile of the emulated-link harness (root, a few minutes each)
bench: build
	$(GO) test -run '^$$' -bench . -benchtime 2s -benchmem ./test/integration/ ./pkg/...
	$(GO) run ./tools/bench loopback --bin bin
	$(GO) run ./tools/bench run --profile quick --bin bin

bench-full: build
	$(GO) run ./tools/bench run --profile full --bin bin

## bench-run PROFILE=quick|cc|loss|stn|full: one profile of the emulated-link harness (root), written to bench/runs/ (git-ignored); BENCH_ARGS adds flags, e.g. --bin-b OLD/bin, --reps 1, --runtime-env 'GOMAXPROCS=1 GODEBUG=schedtrace=2147483647', --pin=false
PROFILE ?= quick
BENCH_ARGS ?=
bench-run: build
	$(GO) run ./tools/bench run --profile $(PROFILE) --bin bin --out bench/runs $(BENCH_ARGS)

## bench-loss: issue 31's heavy-loss profile (0-50 % random loss, 100 Mbit/s, 25 ms RTT; ~55 minutes, root): make bench-run PROFILE=loss
bench-loss:
	$(MAKE) bench-run PROFILE=loss

## bench-floor: quictun beside tools/floortun, the simplest tunnel on the same quic-go (issue 13's floor): loopback cases and the LAN link (root)
bench-floor: build
	$(GO) build -trimpath -o bin/floor/quictun-server ./tools/floortun
	$(GO) build -trimpath -o bin/floor/quictun-client ./tools/floortun
	$(GO) run ./tools/bench loopback --bin bin --bin-b bin/floor
	scripts/floor-lan.sh

## bench-scale N=1000: N emulated clients against bin/quictun-server (tools/bench/loadgen/README.md): handshakes/s, RSS/goroutines/CPU per idle client, restarts (SIGTERM, SIGKILL), leaks; LOADGEN_ARGS adds flags
N ?= 1000
LOADGEN_ARGS ?=
bench-scale: build
	$(GO) run ./tools/bench loadgen --bin bin --clients $(N) $(LOADGEN_ARGS)

## bench-idle MODE=none|ssh: idle cost of a connected client and server (scripts/idle-cost.sh, 60 s, root), written to bench/runs/idle-<date>-MODE.json
MODE ?= none
bench-idle: build
	OUT=bench/runs/idle-$$(date -u +%Y-%m-%dT%H%M%SZ)-$(MODE).json MODE=$(MODE) scripts/idle-cost.sh 60

## bench-scale-report: bench/runs/scale/report.md, the "server scale" and "idle" sections, from result files (SCALE_RUNS, IDLE_RUNS: globs)
SCALE_RUNS ?= bench/runs/loadgen-*
IDLE_RUNS ?= bench/runs/idle-*.json
bench-scale-report: quic-go
	$(GO) run ./tools/bench scale-report --loadgen '$(SCALE_RUNS)' --idle '$(IDLE_RUNS)' --out bench/runs/scale

## bench-reference PROFILE=quick RUN=bench/runs/DATE: keep RUN as PROFILE's reference run in bench/reference/PROFILE (report, notes, charts; bench/README.md "Reference runs")
bench-reference: quic-go
	$(GO) run ./tools/bench reference --profile '$(PROFILE)' --run '$(RUN)'

## bench-compare OLD=dir NEW=dir: ratio table of two harness runs
bench-compare: quic-go
	$(GO) run ./tools/bench compare $(OLD) $(NEW)

clean:
	rm -rf bin
