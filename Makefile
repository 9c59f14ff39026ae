# shard: a Redis module in Rust. `make run` and `make test` do all the set-up on a fresh
# Debian machine (root, or sudo): Debian packages, a Python virtualenv, the build.

SHELL := /bin/bash
CARGO ?= cargo
MODULE := target/release/libshard.so
VENV := .venv
PY := $(VENV)/bin/python
APT_PACKAGES := redis-server redis-tools libclang-dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.DEFAULT_GOAL := help
.PHONY: help deps build run test unit integration bench fuzz fmt lint clean

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

deps: ## Install what is missing: Debian packages (redis-server 7.0, libclang for bindgen)
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

build: deps ## Build the module (target/release/libshard.so)
	$(CARGO) build --release

$(VENV)/.installed: tests/requirements.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r tests/requirements.txt
	touch $@

run: build ## Start redis-server on port 6379 with the module (redis.conf.example)
	redis-server redis.conf.example

test: build $(VENV)/.installed ## Run the unit tests and the integration tests against real redis-server
	$(CARGO) test --release
	$(PY) -m pytest tests

unit: ## Run only the Rust unit tests
	$(CARGO) test --release

integration: build $(VENV)/.installed ## Run only the Python integration tests
	$(PY) -m pytest tests

bench: build ## Benchmarks side by side with Redis's own commands; writes bench/results.md
	python3 bench/run.py --micro

# Fuzzing (issue 8): every target runs FUZZ_SECONDS; FUZZ_TARGETS picks some, e.g.
# `make fuzz FUZZ_TARGETS=resp FUZZ_SECONDS=600`. Crashes land in fuzz/artifacts/<target>/.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= key_codec base62 layout_config generator ring_file ring_args persist resp command_args
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

lint: ## Clippy with warnings as errors, and a formatting check
	$(CARGO) clippy --release --all-targets -- -D warnings
	$(CARGO) fmt --check

clean: ## Remove build output and the virtualenv
	$(CARGO) clean
	rm -rf $(VENV)
