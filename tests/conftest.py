"""Shared fixtures: a real jetd process on 127.0.0.1, started and stopped per test."""

from __future__ import annotations

import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# tests/test_compiled.py runs tests against the compiled build (issue 19): it sets this to
# the directory the built wheel was unpacked into, and the daemons start from there.
BUILD_SITE = os.environ.get("JET_TEST_SITE")
STARTUP_TIMEOUT = 15.0
SHUTDOWN_TIMEOUT = 10.0


@dataclass
class DaemonProcess:
    """A jetd started by the tests; ``stop()`` sends SIGTERM and returns the exit code."""

    proc: subprocess.Popen[bytes]
    host: str
    port: int
    stderr_path: Path
    args: list[str] = field(default_factory=list)

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = SHUTDOWN_TIMEOUT) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"jetd did not exit within {timeout} s of signal {sig}") from None
        return self.proc.returncode


def launch_jetd(args: list[str], stderr_path: Path, env: dict[str, str] | None = None) -> DaemonProcess:
    """Start ``python -m jetd --host 127.0.0.1 --port 0 ARGS`` and wait for its first line,
    ``jetd listening on HOST:PORT``."""
    cmd = [sys.executable, "-m", "jetd", "--host", "127.0.0.1", "--port", "0", *args]
    full_env = {**os.environ, "PYTHONPATH": BUILD_SITE or str(REPO), "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=full_env, cwd=BUILD_SITE or REPO)
    assert proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + STARTUP_TIMEOUT
    line = b""
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not selector.select(remaining):
            proc.kill()
            proc.wait()
            raise AssertionError(f"jetd printed no listening line: {stderr_path.read_text()}")
        chunk = os.read(proc.stdout.fileno(), 1)
        if not chunk:
            proc.wait()
            raise AssertionError(f"jetd exited ({proc.returncode}) before listening: {stderr_path.read_text()}")
        line += chunk
    selector.close()
    text = line.decode().strip()
    prefix = "jetd listening on "
    assert text.startswith(prefix), text
    host, _, port = text[len(prefix) :].rpartition(":")
    return DaemonProcess(proc, host, int(port), stderr_path, args)


_RESTARTABLE_BASE = 20000  # below Linux's ephemeral range (32768-60999 by default)
_RESTARTABLE_SLICE = 2000  # ports per pytest-xdist worker
_handed_out: set[int] = set()


def restartable_port() -> int:
    """A free port on 127.0.0.1 for a daemon that a test stops and starts again on the same
    port. Port 0 hands out ports of the kernel's ephemeral range, and while the daemon is
    down the kernel may hand its port to any socket of a test running beside this one (it
    happened: a browser page reconnecting to a restarted jetd reached another worker's
    conformance runner). Ports below that range are never handed out that way, and each
    pytest-xdist worker takes its own slice of them, so only this test can reuse its port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    low = _RESTARTABLE_BASE + _RESTARTABLE_SLICE * (int(worker) if worker.isdigit() else 0) % 12000
    for port in random.sample(range(low, low + _RESTARTABLE_SLICE), _RESTARTABLE_SLICE):
        if port in _handed_out:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {low}..{low + _RESTARTABLE_SLICE - 1}")


@pytest.fixture
def start_jetd(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Factory: ``start_jetd("--route-timeout", "0.5")`` -> a running DaemonProcess.

    Every daemon started is stopped with SIGTERM at teardown, and the test fails if one
    does not exit cleanly (code 0) within 10 s.
    """
    started: list[DaemonProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> DaemonProcess:
        daemon = launch_jetd(list(args), tmp_path / f"jetd-{len(started)}.stderr", env)
        started.append(daemon)
        return daemon

    yield start
    failures = []
    for daemon in started:
        was_running = daemon.proc.poll() is None
        code = daemon.stop()
        if was_running and code != 0:
            failures.append(f"jetd {daemon.args} exited {code} on SIGTERM:\n{daemon.stderr()}")
    if failures:
        pytest.fail("\n".join(failures))


@pytest.fixture
def jetd(start_jetd: Callable[..., DaemonProcess]) -> DaemonProcess:
    """One jetd on defaults (port 0)."""
    return start_jetd()


# The longest files, longest first (seconds each at 5abd833, a fresh clone's CI run on
# 2 quiet cores, from its junit XML): they go first, in this order, then the other Spark
# and slow files, then the rest. ``make test`` passes --no-loadscope-reorder: without it
# xdist re-sorts the files by their number of tests, and the cluster file (5 tests, 346 s)
# started 59th of 119 files, the compiled one (10 tests, 405 s) 32nd.
_LONGEST_FIRST = (
    "tests/compiled/test_compiled.py",  # 405
    "tests/ingest/test_cluster.py",  # 346
    "tests/ingest/test_spark.py",  # 158
    "tests/ingest/test_schema_evolution.py",  # 89
    "tests/ingest/test_commit.py",  # 58
    "tests/ingest/test_report.py",  # 54
    "tests/web/test_10_console_views.py",  # 47
    "tests/test_chaos_smoke.py",  # 46
    "tests/ingest/test_queries.py",  # 38
    "tests/peer/test_10_cli_issue32.py",  # 37
)


# In that re-run on the compiled build each hypothesis test runs this fraction of its
# examples (at least COMPILED_RERUN_MIN_EXAMPLES): every property is still exercised on
# the compiled modules, and the full counts run on the pure build in the same suite,
# while tests/compiled's differential test feeds both builds the same 300 byte streams.
COMPILED_RERUN_EXAMPLES_DIVISOR = 5
COMPILED_RERUN_MIN_EXAMPLES = 10


def _fewer_examples_on_the_compiled_build(items: list[pytest.Item]) -> None:
    from hypothesis import settings

    done: set[int] = set()
    for item in items:
        test = getattr(item, "obj", None)
        test = getattr(test, "__func__", test)  # a method of a test class
        current = getattr(test, "_hypothesis_internal_use_settings", None)  # what @given runs with
        if test is None or current is None or id(test) in done:
            continue
        done.add(id(test))
        fewer = max(COMPILED_RERUN_MIN_EXAMPLES, current.max_examples // COMPILED_RERUN_EXAMPLES_DIVISOR)
        test._hypothesis_internal_use_settings = settings(current, max_examples=min(fewer, current.max_examples))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest files first. Under ``make test`` (``--dist loadfile``) each worker takes
    the next file when it is free, so a long file collected last sets the suite's end;
    taken first, the short ones fill in around it. The order within a file is kept.

    In tests/compiled's re-run (``JET_TEST_SITE`` set), hypothesis tests run fewer
    examples (see COMPILED_RERUN_EXAMPLES_DIVISOR)."""
    if BUILD_SITE:
        _fewer_examples_on_the_compiled_build(items)

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        if path in _LONGEST_FIRST:
            return _LONGEST_FIRST.index(path)
        slow = item.get_closest_marker("spark") or item.get_closest_marker("slow")
        return len(_LONGEST_FIRST) + (0 if slow else 1)

    items.sort(key=rank)  # stable


# JET_TEST_TIMELINE=FILE: each test's start and end (wall clock) and its xdist worker, one
# line each, appended to FILE by the workers of a ``-n`` run: to see how the files were
# spread over them (junit XML does not say which worker ran a test).
_TIMELINE = os.environ.get("JET_TEST_TIMELINE") if os.environ.get("PYTEST_XDIST_WORKER") else None


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if _TIMELINE:
        _timeline_line("start", nodeid)


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if _TIMELINE:
        _timeline_line("end", nodeid)


def _timeline_line(event: str, nodeid: str) -> None:
    assert _TIMELINE is not None
    line = f"{time.time():.3f} {os.environ['PYTEST_XDIST_WORKER']} {event} {nodeid}\n"
    with open(_TIMELINE, "a") as fh:
        fh.write(line)
