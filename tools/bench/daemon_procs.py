"""Daemon processes for the daemon benchmark: start jetd or node-jet 3, read their CPU and RSS.

Both daemons run as child processes on 127.0.0.1 and print one ``... listening on
HOST:PORT`` line first. Every process started here is stopped (SIGTERM, then SIGKILL)
when its context manager exits, whatever happened inside.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

from tools.procs import stop_process

REPO = Path(__file__).resolve().parents[2]
NODEJET_SOURCE = Path(__file__).resolve().parent / "nodejet"
NODEJET_VERSION = "3.0.17"
DEFAULT_NODEJET_PREFIX = REPO / "scratch" / "nodejet"
STARTUP_TIMEOUT = 20.0
SHUTDOWN_TIMEOUT = 10.0
_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class DaemonUnavailable(RuntimeError):
    """The daemon cannot be run here (node or npm missing, install failed)."""


@dataclass
class DaemonProcess:
    """A running daemon child process and the address it listens on."""

    kind: str
    proc: subprocess.Popen[bytes]
    host: str
    port: int
    stderr_path: Path
    exit_stats: dict[str, int] = field(default_factory=dict)  # jetd's "stopped; stats:" counters

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) to connect to."""
        return self.host, self.port

    def cpu_seconds(self) -> float:
        """User plus system CPU seconds the daemon has used so far (all its threads).

        From the scheduler's nanosecond counts (``/proc/PID/task/*/schedstat``) where the
        kernel keeps them: ``/proc/PID/stat`` counts in clock ticks (10 ms), a tenth of a
        fan-out run to 50 subscribers. A thread that exited takes its time with it there,
        which is fine for the daemons measured here (their threads live as long as they)."""
        try:
            total = 0
            for task in os.scandir(f"/proc/{self.proc.pid}/task"):
                with open(f"{task.path}/schedstat", "rb") as schedstat:
                    total += int(schedstat.read().split()[0])
            return total / 1e9
        except (OSError, ValueError, IndexError):
            pass
        with open(f"/proc/{self.proc.pid}/stat", "rb") as stat:
            text = stat.read()
        # Fields after the ")" that closes the command name; utime and stime are 14, 15.
        fields = text[text.rindex(b")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS_PER_SECOND

    def rss_bytes(self) -> int:
        """The daemon's resident set size in bytes."""
        with open(f"/proc/{self.proc.pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE

    def alive(self) -> bool:
        """True while the process has not exited."""
        return self.proc.poll() is None

    def stderr_tail(self, limit: int = 2000) -> str:
        """The last ``limit`` characters the daemon wrote to stderr."""
        try:
            return self.stderr_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""


def _read_listening_line(proc: subprocess.Popen[bytes], prefix: str, timeout: float) -> tuple[str, int]:
    """Wait for ``PREFIX HOST:PORT`` as the child's first stdout line."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = b""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                raise RuntimeError(f"no listening line within {timeout} s")
            chunk = os.read(proc.stdout.fileno(), 256)
            if not chunk:
                raise RuntimeError(f"exited with {proc.wait()} before listening")
            line += chunk
    text = line.split(b"\n", 1)[0].decode(errors="replace").strip()
    if not text.startswith(prefix):
        raise RuntimeError(f"unexpected first line {text!r}")
    host, _, port = text[len(prefix) :].rpartition(":")
    return host, int(port)


@contextlib.contextmanager
def _spawn(kind: str, cmd: list[str], prefix: str, env: dict[str, str], cwd: Path) -> Iterator[DaemonProcess]:
    with tempfile.TemporaryDirectory(prefix=f"bench-{kind}-") as tmp:
        stderr_path = Path(tmp) / "stderr"
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, cwd=cwd)
        try:
            try:
                host, port = _read_listening_line(proc, prefix, STARTUP_TIMEOUT)
            except RuntimeError as exc:
                raise RuntimeError(f"{kind}: {exc}: {stderr_path.read_text(errors='replace')[-2000:]}") from None
            daemon = DaemonProcess(kind, proc, host, port, stderr_path)
            yield daemon
        finally:
            stop_process(proc, SHUTDOWN_TIMEOUT)
        daemon.exit_stats = _exit_stats(stderr_path)


def _exit_stats(stderr_path: Path) -> dict[str, int]:
    """The counters of jetd's last ``stats: name=value ...`` log line, if it wrote one."""
    try:
        text = stderr_path.read_text(errors="replace")
    except OSError:
        return {}
    _, found, rest = text.rpartition("stats: ")
    if not found:
        return {}
    stats = {}
    for pair in rest.split("\n", 1)[0].split():
        name, _, value = pair.partition("=")
        if value.isdigit():
            stats[name] = int(value)
    return stats


JETD_CPU: int | None = None
"""The CPU jetd is pinned to (``taskset -c``), or None; set by ``daemon.py --pin``."""


@contextlib.contextmanager
def start_jetd(extra_args: list[str] | None = None, source: Path = REPO) -> Iterator[DaemonProcess]:
    """Run ``python -m jetd --host 127.0.0.1 --port 0 EXTRA_ARGS`` for the ``with`` block.

    ``source`` is the directory holding the ``jetd`` and ``jetwire`` packages (this
    checkout by default; a frozen copy keeps a long run on one version of jetd).
    """
    cmd = [sys.executable, "-m", "jetd", "--host", "127.0.0.1", "--port", "0", *(extra_args or [])]
    if JETD_CPU is not None:
        # taskset execs jetd (same pid), and every thread of it, the event-log writer too, inherits the CPU.
        cmd = ["taskset", "-c", str(JETD_CPU), *cmd]
    env = {**os.environ, "PYTHONPATH": str(source), "PYTHONUNBUFFERED": "1"}
    with _spawn("jetd", cmd, "jetd listening on ", env, source) as daemon:
        yield daemon


def ensure_nodejet(prefix: Path = DEFAULT_NODEJET_PREFIX) -> Path:
    """Install node-jet 3.0.17 into ``prefix`` with npm unless it is already there.

    Returns the path of node-jet's package directory.

    Raises:
        DaemonUnavailable: node or npm is missing, or the install failed.
    """
    if shutil.which("node") is None:
        raise DaemonUnavailable("node is not installed")
    package_dir = prefix / "node_modules" / "node-jet"
    manifest = package_dir / "package.json"
    if manifest.exists() and f'"version": "{NODEJET_VERSION}"' in manifest.read_text():
        return package_dir
    npm = shutil.which("npm")
    if npm is None:
        raise DaemonUnavailable("npm is not installed")
    prefix.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(NODEJET_SOURCE / "package.json", prefix / "package.json")
    result = subprocess.run(
        [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--omit=dev"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0 or not manifest.exists():
        raise DaemonUnavailable(f"npm install of node-jet {NODEJET_VERSION} failed: {result.stderr[-1000:]}")
    return package_dir


@contextlib.contextmanager
def start_nodejet(prefix: Path = DEFAULT_NODEJET_PREFIX) -> Iterator[DaemonProcess]:
    """Run node-jet 3's daemon on 127.0.0.1 (free port) for the ``with`` block.

    Raises:
        DaemonUnavailable: see :func:`ensure_nodejet`.
    """
    ensure_nodejet(prefix)
    node = shutil.which("node")
    assert node is not None
    cmd = [node, str(NODEJET_SOURCE / "launch.mjs"), str(prefix), "0"]
    with _spawn("node-jet", cmd, "nodejet listening on ", dict(os.environ), REPO) as daemon:
        yield daemon


@contextlib.contextmanager
def start_daemon(kind: str, *, nodejet_prefix: Path = DEFAULT_NODEJET_PREFIX,
                 jetd_args: list[str] | None = None, jetd_source: Path = REPO) -> Iterator[DaemonProcess]:
    """Start ``kind`` ("jetd" or "nodejet") for the ``with`` block."""
    if kind == "jetd":
        with start_jetd(jetd_args, jetd_source) as daemon:
            yield daemon
    elif kind == "nodejet":
        with start_nodejet(nodejet_prefix) as daemon:
            yield daemon
    else:
        raise ValueError(f"unknown daemon {kind!r}")
