"""jetdump's inputs read forward only: a capture on a pipe (`tcpdump -w - | jetdump -`),
on redirected stdin (`jetdump < cap.pcap`), and live capture (`jetdump -i lo`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jdhelpers import CONVERSATION
from jdhelpers import REPO
from jdhelpers import kill_if_running
from jdhelpers import run_jetdump
from test_jetdump_tap import exchange
from test_jetdump_tap import read_line

from jetwire import GetState
from jetwire import Info
from jetwire import encode
from tools.jetdump.synth import CaptureWriter
from tools.jetdump.synth import TcpSession

ENV = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


def write_conversation(path: Path, *, pcapng: bool) -> None:
    with open(path, "wb") as f:
        session = TcpSession(CaptureWriter(f, pcapng=pcapng), ("10.0.0.1", 50000), ("10.0.0.2", 11124))
        session.handshake()
        for direction, message in CONVERSATION:
            session.send(direction, encode(message), dt=0.001)
        session.close()


@pytest.mark.parametrize("pcapng", [False, True], ids=["pcap", "pcapng"])
def test_capture_from_a_pipe_and_from_redirected_stdin(tmp_path: Path, pcapng: bool) -> None:
    path = tmp_path / "conv.cap"
    write_conversation(path, pcapng=pcapng)
    from_file = run_jetdump(str(path))
    assert from_file.returncode == 0, from_file.stderr
    assert from_file.stdout.count("\n") >= len(CONVERSATION)
    # A real pipe (not seekable): cat's stdout into `jetdump -`.
    with subprocess.Popen(["cat", str(path)], stdout=subprocess.PIPE) as cat:
        piped = subprocess.run([sys.executable, "-m", "tools.jetdump", "-"], stdin=cat.stdout,
                               capture_output=True, text=True, timeout=60, cwd=REPO, env=ENV)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == from_file.stdout
    # `jetdump < cap`: no input argument, stdin is the file.
    with open(path, "rb") as handle:
        redirected = subprocess.run([sys.executable, "-m", "tools.jetdump"], stdin=handle,
                                    capture_output=True, text=True, timeout=60, cwd=REPO, env=ENV)
    assert redirected.returncode == 0, redirected.stderr
    assert redirected.stdout == from_file.stdout


def test_stdin_that_is_not_a_capture_is_a_clear_error() -> None:
    result = run_jetdump("-", stdin=b"hello, not a capture")
    assert result.returncode == 1
    assert "stdin: not a pcap/pcapng capture" in result.stderr
    result = run_jetdump("-", stdin=b"")
    assert result.returncode == 1 and "stdin: no data" in result.stderr


def test_truncated_capture_on_a_pipe_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "conv.pcapng"
    write_conversation(path, pcapng=True)
    data = path.read_bytes()
    result = run_jetdump("-", stdin=data[: len(data) - 30])
    assert result.returncode == 0, result.stderr
    assert "capture truncated" in result.stdout


def test_live_capture_without_dumpcap_or_tcpdump_says_so(tmp_path: Path) -> None:
    env = {**ENV, "PATH": str(tmp_path)}  # neither program on PATH
    result = subprocess.run([sys.executable, "-m", "tools.jetdump", "-i", "lo"], capture_output=True,
                            text=True, timeout=60, cwd=REPO, env=env)
    assert result.returncode == 1
    assert "live capture needs dumpcap" in result.stderr and "tcpdump" in result.stderr


def _can_capture() -> bool:
    dumpcap = shutil.which("dumpcap")
    if dumpcap is None:
        return False
    probe = subprocess.run([dumpcap, "-D"], capture_output=True, text=True, timeout=30)
    return probe.returncode == 0 and "lo" in probe.stdout


@pytest.mark.skipif(not _can_capture(), reason="dumpcap cannot capture on lo here")
def test_live_capture_on_loopback(start_jetd: Callable[..., Any]) -> None:
    daemon = start_jetd()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.jetdump", "-i", "lo", "-f", f"tcp port {daemon.port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=ENV,
    )
    try:
        assert proc.stderr is not None and proc.stdout is not None
        line = read_line(proc.stderr.fileno(), 30)
        assert line.startswith("dumpcap: Capturing on"), line
        # dumpcap says "Capturing on" a little before its filter is attached: ask again
        # until a whole exchange has been captured. Frames are shown as they are captured,
        # before the capture ends.
        os.set_blocking(proc.stdout.fileno(), False)
        seen = ""
        deadline = time.monotonic() + 30
        while "NOT_FOUND" not in seen and time.monotonic() < deadline:
            exchange(daemon.port, [Info("live-test"), GetState(1, "live/missing")], 1)
            time.sleep(0.3)
            with contextlib.suppress(BlockingIOError):
                seen += os.read(proc.stdout.fileno(), 1 << 16).decode()
        assert "NOT_FOUND" in seen
        os.set_blocking(proc.stdout.fileno(), True)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        kill_if_running(proc)
    assert proc.returncode == 0, err
    text = seen + out.decode()
    assert 'INFO "live-test"' in text
    assert 'REQUEST id=1 GET_STATE key="live/missing"' in text
    assert "dumpcap: Packets captured" in err.decode()
