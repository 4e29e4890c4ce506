# Every target sets up what it needs: a fresh Debian machine only needs `make demo` or `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Debian packages: systemd-python builds against libsystemd; the real-service tests need systemd.
APT_PACKAGES := libsystemd-dev pkg-config systemd dbus-user-session

.PHONY: setup sysdeps demo test test-slow lint bench clean

setup: $(STAMP)

sysdeps:
	@if ! pkg-config --exists libsystemd 2>/dev/null || ! command -v systemctl >/dev/null \
		|| [ ! -e /usr/lib/systemd/user/dbus.socket ]; then \
		echo "installing Debian packages: $(APT_PACKAGES)"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(APT_PACKAGES); \
	fi

$(STAMP): pyproject.toml | sysdeps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,bench]'
	touch $@

demo: setup
	@rm -rf demo && mkdir -p demo/example-project/.pi/memory
	@cp -rp examples/memory-dir demo/example-project/.pi/memory/project
	@echo "--- staging/ before:"; ls demo/example-project/.pi/memory/project/staging
	MEMSTAGED_LOG_FILE=$(CURDIR)/demo/decisions.jsonl \
		$(BIN)/memstaged --once --memory-dir demo/example-project/.pi/memory/project
	@echo "--- staging/ after:"; ls demo/example-project/.pi/memory/project/staging
	@echo "--- deadletter/ after:"; ls demo/example-project/.pi/memory/project/deadletter
	@echo "--- decision log: demo/decisions.jsonl"

test: setup
	$(BIN)/pytest -m "not slow"

test-slow: setup
	$(BIN)/pytest -m slow

lint: setup
	$(BIN)/ruff check memstaged tests bench
	$(BIN)/ruff format --check memstaged tests bench
	$(BIN)/mypy

bench: setup
	$(BIN)/python bench/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) demo build *.egg-info .pytest_cache .mypy_cache .ruff_cache
