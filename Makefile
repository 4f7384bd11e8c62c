# The two commands the README gives. `make test` installs everything it needs and runs the
# whole suite: Debian packages through apt-get (root, or sudo), then a virtual environment
# in .venv with the package and its test extras, then pytest. `.ci/run` calls it.
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# command -> Debian package, for what the tests drive for real.
SYSTEM_DEPS := tshark:tshark java:openjdk-17-jre-headless chromium:chromium node:nodejs npm:npm nats-server:nats-server

.PHONY: test lint bench system-deps venv

system-deps:
	@missing=""; for pair in $(SYSTEM_DEPS); do \
		command -v $${pair%%:*} >/dev/null || missing="$$missing $${pair#*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $$missing; \
	fi

$(VPY):
	$(PYTHON) -m venv $(VENV)

# The checkout runs pure Python (an editable install would otherwise compile the hot path
# into it, and the .py files would no longer be what runs); tests/test_compiled.py builds
# and checks the compiled wheel.
venv: $(VPY)
	JET_PURE_PYTHON=1 $(VPY) -m pip install -q -e '.[dev]'

# One worker more than cores (many tests wait on a JVM, a browser or a time-out rather
# than compute: with one worker a core, 2 cores were 55% busy over the suite), one test
# file at a time per worker (a file's fixtures, such as its SparkSession or the compiled
# wheel, are made once), the files in tests/conftest.py's order (longest first; xdist
# would otherwise re-sort them by their number of tests).
test: system-deps venv
	$(VPY) -m pytest -n $$(( $$(nproc) + 1 )) --dist loadfile --no-loadscope-reorder

lint: venv
	$(VPY) -m ruff check .
	$(VPY) -m mypy

# The full benchmarks behind BENCHMARKS.md (tens of minutes; the machine should be quiet).
bench: venv
	$(VPY) -m tools.bench.codec
	$(VPY) -m tools.bench.daemon --against all
	$(VPY) -m tools.bench.peer
	$(VPY) -m tools.bench.jetdump
	$(VPY) -m tools.bench.ingest
	$(VPY) -m tools.bench.latency
