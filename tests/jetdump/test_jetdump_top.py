"""``jetdump top``: the view of a finished capture, of the tap in front of a real jetd,
and of a real jetd's log directory followed as it grows (bounded by --duration)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jdhelpers import CONVERSATION
from jdhelpers import REPO
from jdhelpers import kill_if_running
from jdhelpers import run_jetdump
from test_jetdump_tap import exchange
from test_jetdump_tap import read_line

from jetwire import AddState
from jetwire import GetState
from jetwire import Info
from jetwire import Value
from jetwire import encode
from tools.jetdump.synth import CaptureWriter
from tools.jetdump.synth import TcpSession

ENV = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "COLUMNS": "160"}


def test_top_of_a_finished_capture(tmp_path: Path) -> None:
    path = tmp_path / "conv.pcap"
    with open(path, "wb") as f:
        session = TcpSession(CaptureWriter(f), ("10.0.0.1", 50000), ("10.0.0.2", 11124))
        session.handshake()
        for direction, message in CONVERSATION:
            session.send(direction, encode(message), dt=0.001)
        session.close()
    result = subprocess.run([sys.executable, "-m", "tools.jetdump", "top", str(path)], capture_output=True,
                            text=True, timeout=60, cwd=REPO, env=ENV)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "busiest keys" in out and "busiest peers" in out and "error statuses" in out
    key_rows = [line for line in out.splitlines() if "plant/temp" in line]
    assert key_rows and " 3 " in key_rows[0]  # ADD_STATE, SET_STATE, NOTIFY_STATE
    for status in ("NOT_FOUND", "REJECTED", "AUTH_FAILED", "NOT_AUTHORIZED", "ALREADY_EXISTS"):
        assert status in out
    assert "10.0.0.1:50000" in out


def _run_top(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "tools.jetdump", "top", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=REPO, env=ENV)


def test_top_through_the_tap(start_jetd: Callable[..., Any]) -> None:
    daemon = start_jetd()
    proc = _run_top("--listen", "0", "--upstream", f"{daemon.host}:{daemon.port}", "--duration", "6",
                    "--interval", "0.5")
    try:
        assert proc.stderr is not None
        line = read_line(proc.stderr.fileno(), 30)
        assert "tap listening on 127.0.0.1:" in line, line
        port = int(line.split("127.0.0.1:")[1].split(",")[0])
        requests = [Info("top-test"), AddState(1, "top/a", Value.of(1))] + [GetState(i, "top/missing") for i in range(2, 42)]
        exchange(port, requests, 41)
        out, err = proc.communicate(timeout=60)
    finally:
        kill_if_running(proc)
    text = out.decode()
    assert proc.returncode == 0, err
    missing = [row for row in text.splitlines() if "top/missing" in row]
    assert missing and " 40 " in missing[-1]
    assert "NOT_FOUND" in text


def test_top_follows_a_growing_log_directory(tmp_path: Path, start_jetd: Callable[..., Any]) -> None:
    log_dir = tmp_path / "logs"
    daemon = start_jetd("--log-dir", str(log_dir), "--log-fsync", "always")
    proc = _run_top(str(log_dir), "--follow", "--duration", "6", "--interval", "0.5")
    try:
        exchange(daemon.port, [Info("follow-a")] + [GetState(i, "follow/x") for i in range(1, 6)], 5)
        # The second half is written while top waits at the end of the segment (the
        # counts below hold whatever the timing: a segment is read from its start).
        time.sleep(2)
        exchange(daemon.port, [Info("follow-b")] + [GetState(i, "follow/x") for i in range(6, 11)], 5)
        out, err = proc.communicate(timeout=60)
    finally:
        kill_if_running(proc)
    assert proc.returncode == 0, err
    rows = [row for row in out.decode().splitlines() if "follow/x" in row]
    assert rows and " 10 " in rows[-1]


def test_top_needs_one_source() -> None:
    result = run_jetdump("top")
    assert result.returncode == 2 and "give one source" in result.stderr
