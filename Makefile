# The two commands the README gives: `make test` installs everything and runs the suite.
PYTHON ?= python3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test lint bench system-deps

system-deps:
	@if ! command -v tshark >/dev/null || ! command -v java >/dev/null; then \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q tshark openjdk-17-jre-headless; \
	fi

test: system-deps
	$(PYTHON) -m pip install -q -e '.[dev]'
	$(PYTHON) -m pytest

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy

# The full benchmarks behind BENCHMARKS.md (tens of minutes; the machine should be quiet).
bench:
	$(PYTHON) -m tools.bench.codec
	$(PYTHON) -m tools.bench.daemon --against all
	$(PYTHON) -m tools.bench.peer
	$(PYTHON) -m tools.bench.jetdump
	$(PYTHON) -m tools.bench.ingest
