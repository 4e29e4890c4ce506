# Every target sets up what it needs: a fresh Debian machine only needs `make demo` or `make test`
# (as root; another user is told which Debian packages to install first).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# memstaged alone (what `make demo` and `make install` need), then the dev and bench extras.
RUNTIME_STAMP := $(VENV)/.installed-runtime
STAMP := $(VENV)/.installed
DEMO := demo
DEMO_MDIR := $(DEMO)/example-project/.pi/memory/project
PREFIX ?= $(HOME)/.local
# Debian packages (packaging/debian-deps names and checks them): `builddeps` what builds memstaged
# in the venv (systemd-python compiles), all `make demo` and `make install` need; `sysdeps` that
# and what the tests and the benchmark run. Missing ones are installed when make runs as root
# (CI); any other user is told which, and the command, and make stops: sudo is never called.

.PHONY: setup builddeps sysdeps current demo install uninstall completions dist test test-fast \
	test-slow lint bench clean

setup: $(STAMP)

builddeps:
	@PYTHON=$(PYTHON) sh packaging/debian-deps build

sysdeps:
	@PYTHON=$(PYTHON) sh packaging/debian-deps test

$(RUNTIME_STAMP): pyproject.toml constraints.txt | builddeps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e .
	@echo "$(HEAD)" > $(BUILT)
	touch $@

# The version `memstaged --version` says is the one the build took from git (setuptools-scm), so
# `make demo` and `make install` build memstaged again (pip install -e, seconds) once the commit
# it was built from is no longer the clone's: after `git pull`, say. A copy without git, nothing.
HEAD := $(shell git describe --tags --always 2>/dev/null)
BUILT := $(VENV)/.built-from
current: $(RUNTIME_STAMP)
	@if [ -n "$(HEAD)" ] && [ "$$(cat $(BUILT) 2>/dev/null)" != "$(HEAD)" ]; then \
		echo "building memstaged again: the clone is at $(HEAD) now"; \
		$(BIN)/pip install -q --no-deps -c constraints.txt -e . && echo "$(HEAD)" > $(BUILT); \
	fi

$(STAMP): $(RUNTIME_STAMP)
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,bench]'
	touch $@

# The demo: a copy of examples/memory-dir, a config naming it and its own decision log, and one
# `memstaged --once`. Then `export MEMSTAGED_CONFIG=$PWD/demo/config.toml` (README) makes every
# command (log, stats, status, deadletter) find the demo's memory dir and log.
demo: current
	@rm -rf $(DEMO) && mkdir -p $(DEMO)/example-project/.pi/memory
	@cp -rp examples/memory-dir $(DEMO_MDIR)
	@printf 'memory_dirs = ["%s"]\nlog_file = "%s"\n' \
		"$(CURDIR)/$(DEMO_MDIR)" "$(CURDIR)/$(DEMO)/decisions.jsonl" > $(DEMO)/config.toml
	@echo "--- staging/ before:"; ls $(DEMO_MDIR)/staging
	MEMSTAGED_CONFIG=$(CURDIR)/$(DEMO)/config.toml $(BIN)/memstaged --once
	@echo "--- staging/ after:"; ls $(DEMO_MDIR)/staging
	@echo "--- deadletter/ after:"; ls $(DEMO_MDIR)/deadletter
	@echo "--- decision log: $(DEMO)/decisions.jsonl; config: $(DEMO)/config.toml"
	@echo "--- next: export PATH=\"$$PWD/.venv/bin:\$$PATH\" MEMSTAGED_CONFIG=\"$$PWD/$(DEMO)/config.toml\"; memstaged log"

# memstaged on PATH ($(PREFIX)/bin, ~/.local/bin by default) as a link to this clone's venv,
# with its shell completions and man page where bash-completion, zsh, fish and man look.
# A memstaged already there that is not this clone's (pipx's link, say) is not replaced
# silently: `make install FORCE=1` replaces it. `make uninstall` removes exactly these files.
LINK := $(PREFIX)/bin/memstaged
INSTALLED := $(PREFIX)/share/bash-completion/completions/memstaged \
	$(PREFIX)/share/zsh/site-functions/_memstaged \
	$(PREFIX)/share/fish/vendor_completions.d/memstaged.fish \
	$(PREFIX)/share/man/man1/memstaged.1
install: current
	@if [ -z "$(FORCE)" ] && { [ -e $(LINK) ] || [ -L $(LINK) ]; } \
		&& [ "$$(readlink $(LINK))" != "$(CURDIR)/$(BIN)/memstaged" ]; then \
		echo "make install: $(LINK) is $$(readlink $(LINK) || echo 'a file'), not this clone's" \
			"$(CURDIR)/$(BIN)/memstaged: remove that installation first (pipx uninstall" \
			"memstaged), or run make install FORCE=1 to replace it" >&2; \
		exit 2; \
	fi
	mkdir -p $(PREFIX)/bin
	ln -sfn $(CURDIR)/$(BIN)/memstaged $(LINK)
	install -D -m 0644 memstaged/data/completions/bash/memstaged \
		$(PREFIX)/share/bash-completion/completions/memstaged
	install -D -m 0644 memstaged/data/completions/zsh/_memstaged \
		$(PREFIX)/share/zsh/site-functions/_memstaged
	install -D -m 0644 memstaged/data/completions/fish/memstaged.fish \
		$(PREFIX)/share/fish/vendor_completions.d/memstaged.fish
	install -D -m 0644 memstaged/data/man/memstaged.1 $(PREFIX)/share/man/man1/memstaged.1
	@echo "memstaged is $(LINK)"
	@case ":$$PATH:" in *":$(PREFIX)/bin:"*) ;; *) \
		echo "$(PREFIX)/bin is not on this shell's PATH. In this shell, run:"; \
		echo "    export PATH=\"$(PREFIX)/bin:\$$PATH\""; \
		if [ "$(PREFIX)" = "$(HOME)/.local" ]; then \
			echo "Debian's ~/.profile adds ~/.local/bin at login once it exists:" \
				"log in again for every shell to have it."; \
		else \
			echo "and add that line to ~/.profile for the shells of your next login."; \
		fi ;; \
	esac

# The link only while it is this clone's (another installation's stays), and the files above.
uninstall:
	@if [ "$$(readlink $(LINK))" = "$(CURDIR)/$(BIN)/memstaged" ]; then \
		rm -f $(LINK) && echo "removed $(LINK)"; \
	elif [ -e $(LINK) ] || [ -L $(LINK) ]; then \
		echo "kept $(LINK): it is not this clone's ($$(readlink $(LINK) || echo 'a file'))"; \
	fi
	rm -f $(INSTALLED)

# Shell completions and the man page, generated from the argparse parser by shtab and
# argparse-manpage (tests/cli/test_completions.py fails when the committed files are stale).
completions: $(STAMP)
	$(BIN)/python -m memstaged.cli.generate

# The release: a wheel and an sdist in dist/ (the wheel built from the sdist, as pip builds one),
# checked as PyPI checks an upload. Their version is git's (pyproject.toml): tag, then make dist.
dist: setup
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/twine check --strict dist/*

test: sysdeps setup
	$(BIN)/pytest -m "not slow"

# The tests that start no process: tests/system/ holds every one that does (memstaged and daemons
# as subprocesses, node, tmux, a user manager, crashes, races, fuzz); --no-processes (conftest.py)
# fails a test here that starts one. Under a minute on a quiet machine.
test-fast: setup
	$(BIN)/pytest tests --ignore=tests/system -m "not slow" --no-processes

test-slow: sysdeps setup
	$(BIN)/pytest -m slow

lint: setup
	$(BIN)/ruff check memstaged tests bench
	$(BIN)/ruff format --check memstaged tests bench
	$(BIN)/mypy
	$(BIN)/vulture memstaged vulture_whitelist.py

bench: sysdeps setup
	$(BIN)/python bench/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(DEMO) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
