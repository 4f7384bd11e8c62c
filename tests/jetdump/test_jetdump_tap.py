"""``jetdump tap``: a real jetd behind the tap, raw sockets in front of it."""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from jdhelpers import REPO
from jdhelpers import kill_if_running

from jetwire import AddState
from jetwire import Decoder
from jetwire import GetState
from jetwire import Info
from jetwire import Message
from jetwire import Response
from jetwire import Status
from jetwire import Value
from jetwire import encode


@contextmanager
def tap(upstream: str, *options: str, stdout: Any = subprocess.PIPE) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """Run ``jetdump tap --listen 0``; yields the process and the port it listens on.

    The tap writes every frame before reading more: a test that does not read its
    stdout as it goes must give a file, or the pipe fills and traffic stalls."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.jetdump", "tap", "--listen", "0", "--upstream", upstream, *options],
        stdout=stdout, stderr=subprocess.PIPE, env=env, cwd=REPO,
    )
    try:
        assert proc.stderr is not None
        line = read_line(proc.stderr.fileno(), 15)
        assert line.startswith("jetdump tap listening on 127.0.0.1:"), line
        port = int(line.split("127.0.0.1:")[1].split(",")[0])
        yield proc, port
    finally:
        kill_if_running(proc)


def read_line(fd: int, timeout: float) -> str:
    selector = selectors.DefaultSelector()
    selector.register(fd, selectors.EVENT_READ)
    data = b""
    deadline = time.monotonic() + timeout
    try:
        while not data.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                raise AssertionError(f"no line within {timeout} s (got {data!r})")
            chunk = os.read(fd, 1)
            if not chunk:
                break
            data += chunk
    finally:
        selector.close()
    return data.decode()


def stop(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    return proc.returncode, (out or b"").decode()


def exchange(port: int, requests: list[Message], answers: int) -> tuple[list[Message], int, int]:
    """Send requests, read until ``answers`` responses; returns (messages, sent, received)."""
    sent = received = 0
    messages: list[Message] = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        payload = b"".join(encode(m) for m in requests)
        sock.sendall(payload)
        sent = len(payload)
        decoder = Decoder()
        deadline = time.monotonic() + 10
        while sum(isinstance(m, Response) for m in messages) < answers and time.monotonic() < deadline:
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            received += len(chunk)
            decoder.receive_data(chunk)
            messages.extend(decoder.messages())
    return messages, sent, received


def test_tap_forwards_unchanged_and_prints_both_directions(start_jetd: Callable[..., Any], tmp_path: Path) -> None:
    daemon = start_jetd()
    big = "x" * 300_000  # several TCP segments and write-buffer pressure both ways
    requests: list[Message] = [
        Info("tap-test"),
        AddState(1, "tap/x", Value.of(1)),
        GetState(2, "tap/x"),
        AddState(3, "tap/big", Value.of(big)),
        GetState(4, "tap/big"),
        GetState(5, "tap/none"),
    ]
    out_path = tmp_path / "tap.jsonl"
    with open(out_path, "wb") as sink, tap(f"{daemon.host}:{daemon.port}", "--json", stdout=sink) as (proc, port):
        messages, sent, received = exchange(port, requests, 5)
        code, _ = stop(proc)
    assert code == 0
    out = out_path.read_text()
    assert isinstance(messages[0], Info) and messages[0].name
    responses = {m.id: m for m in messages if isinstance(m, Response)}
    assert responses[2].value == Value.of(1)
    assert responses[4].value == Value.of(big)
    assert responses[5].status == Status.NOT_FOUND
    frames = [json.loads(line) for line in out.splitlines() if json.loads(line)["record"] == "frame"]
    to_daemon = [f for f in frames if f["direction"] == 0]
    to_peer = [f for f in frames if f["direction"] == 1]
    assert [f.get("function") or f["type"] for f in to_daemon] == [
        "INFO", "ADD_STATE", "GET_STATE", "ADD_STATE", "GET_STATE", "GET_STATE",
    ]
    assert sum(f["size"] for f in to_daemon) == sent
    assert sum(f["size"] for f in to_peer) == received
    assert to_peer[0]["type"] == "INFO"
    big_answer = next(f for f in to_peer if f.get("id") == 4)
    assert big_answer["value"] == big and big_answer["request"]["function"] == "GET_STATE"
    assert big_answer["rtt_ms"] > 0
    assert {f["src"] for f in to_peer} == {f"{daemon.host}:{daemon.port}"}


def test_tap_prints_frames_as_they_pass(start_jetd: Callable[..., Any]) -> None:
    daemon = start_jetd()
    with tap(f"{daemon.host}:{daemon.port}") as (proc, port):
        assert proc.stdout is not None
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            first = read_line(proc.stdout.fileno(), 10)  # the daemon's INFO, before we send anything
            assert "INFO" in first and f"→ 127.0.0.1:{sock.getsockname()[1]}" in first
            sock.sendall(encode(GetState(9, "nope")))
            request_line = read_line(proc.stdout.fileno(), 10)
            response_line = read_line(proc.stdout.fileno(), 10)
            assert 'REQUEST id=9 GET_STATE key="nope"' in request_line
            assert "RESPONSE id=9 NOT_FOUND" in response_line and "[answers #2 GET_STATE" in response_line
        code, _ = stop(proc)
    assert code == 0


def test_tap_reports_an_unreachable_upstream() -> None:
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        dead_port = placeholder.getsockname()[1]  # bound, never listening: refused
        with tap(f"127.0.0.1:{dead_port}") as (proc, port):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                assert sock.recv(10) == b""  # the tap closes the peer's connection
            code, out = stop(proc)
    assert code == 0
    assert f"cannot connect to upstream 127.0.0.1:{dead_port}" in out


def test_tap_usage_errors() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "tools.jetdump", "tap", "--listen", "0", "--upstream", "nowhere"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=30,
    )
    assert result.returncode == 2 and "expected HOST:PORT" in result.stderr


@pytest.mark.parametrize("upstream", ["127.0.0.1:\u00b9", "127.0.0.1:99999", "127.0.0.1:0"])
def test_tap_upstream_port_out_of_range_is_a_usage_error(upstream: str) -> None:
    # '¹' passes str.isdigit() and fails int(); 99999 is no port: exit 2, not a traceback
    # or a tap that listens and then cannot connect anyone.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "tools.jetdump", "tap", "--listen", "0", "--upstream", upstream],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=30,
    )
    assert result.returncode == 2 and "expected HOST:PORT" in result.stderr, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr


def test_a_stalled_terminal_never_stalls_the_bus(start_jetd: Callable[..., Any]) -> None:
    """Nobody reads the tap's stdout while 3,000 gets pass (the pipe holds 64 KB): the
    traffic completes, the lines that did not fit are dropped, counted in a note in the
    output and at exit."""
    daemon = start_jetd()
    with tap(f"{daemon.host}:{daemon.port}", "--output-buffer", "65536") as (proc, port):
        # 30 rounds of 100 gets, each answered before the next: many chunks pass the tap
        # while its stdout is full (one huge chunk would be let through whole).
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(encode(Info("slow-terminal")))
            decoder = Decoder()
            answered = 0
            for round_no in range(30):
                first = round_no * 100 + 1
                sock.sendall(b"".join(encode(GetState(i, f"k/{i}")) for i in range(first, first + 100)))
                while answered < first + 99:
                    chunk = sock.recv(1 << 16)
                    assert chunk, "the tap closed the connection"
                    decoder.receive_data(chunk)
                    answered += sum(isinstance(m, Response) for m in decoder.messages())
        assert answered == 3000
        proc.send_signal(signal.SIGTERM)
        out_bytes, err_bytes = proc.communicate(timeout=30)
    out, err = out_bytes.decode(), err_bytes.decode()
    assert proc.returncode == 0, err
    match = re.search(r"jetdump: (\d+) line\(s\) dropped", err)
    assert match is not None, (err, len(out), out[-300:])
    dropped = int(match.group(1))
    assert dropped > 0
    shown = out.count("REQUEST id=") + out.count("RESPONSE id=")
    noted = sum(int(line.split("line(s) dropped")[0].split()[-1]) for line in out.splitlines() if "line(s) dropped" in line)
    assert noted == dropped
    # Every frame is either shown or counted as dropped (2 INFO + 3,000 requests + 3,000 responses).
    assert shown + out.count(" INFO ") + dropped == 6002
