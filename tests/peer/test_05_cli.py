"""The ``jet`` command line, run as a subprocess against a real jetd."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jetwire import Value
from jetwire import ValueType
from peer import Peer
from peer.cli import EXIT_CODES
from peer.cli import UsageError
from peer.cli import parse_value

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


def jet(daemon, *args: str, env: dict[str, str] | None = None, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "peer.cli", "--host", daemon.host, "--port", str(daemon.port), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env or ENV, timeout=timeout, cwd=REPO)


class Streaming:
    """A long-running ``jet`` (fetch, serve-state) whose stdout is read line by line."""

    def __init__(self, daemon, *args: str) -> None:
        cmd = [sys.executable, "-m", "peer.cli", "--host", daemon.host, "--port", str(daemon.port), *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, cwd=REPO)
        self.selector = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        self.selector.register(self.proc.stdout, selectors.EVENT_READ)
        self.pending = b""

    def line(self, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.selector.select(remaining):
                raise AssertionError(f"no output line within {timeout} s")
            assert self.proc.stdout is not None
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise AssertionError("jet exited: " + self.proc.stderr.read().decode() if self.proc.stderr else "")
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return line.decode()

    def stop(self, sig: int = signal.SIGINT) -> tuple[int, str]:
        self.proc.send_signal(sig)
        try:
            _, err = self.proc.communicate(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.selector.close()
        return self.proc.returncode, err.decode()


def test_parse_value():
    assert parse_value("42") == 42 and isinstance(parse_value("42"), int)
    assert parse_value("3.5") == 3.5
    assert parse_value("true") is True and parse_value("null") is None
    assert parse_value('"text"') == "text"
    assert parse_value("hello world") == "hello world"
    assert parse_value('{"a": [1]}') == {"a": [1]}
    assert parse_value("NaN") == "NaN"
    assert parse_value("42", "string") == "42"
    assert parse_value("0x10", "int") == 16
    assert parse_value("on", "bool") is True
    assert parse_value("00ff", "hex") == b"\x00\xff"
    assert parse_value("7", "json") == Value(ValueType.JSON, b"7")
    assert parse_value("", "none") is None
    for text, vtype in (("x", "int"), ("maybe", "bool"), ("{", "json"), ("zz", "hex"), ("1", "none")):
        with pytest.raises(UsageError):
            parse_value(text, vtype)


def test_help_documents_exit_codes():
    result = subprocess.run(
        [sys.executable, "-m", "peer.cli", "--help"], capture_output=True, text=True, env=ENV, timeout=20
    )
    assert result.returncode == 0
    for code in EXIT_CODES:
        assert f"  {code}  " in result.stdout
    assert "JET_HOST" in result.stdout


def test_info_get_set_call(jetd):
    result = jet(jetd, "info")
    assert result.returncode == 0 and "jetd" in result.stdout and "1.3" in result.stdout
    info = json.loads(jet(jetd, "--json", "info").stdout)
    assert info["name"] == "jetd" and info["version"] == "1.3"
    with Peer(jetd.host, jetd.port) as owner:
        owner.add_state("cli/temp", 20.5, on_set=lambda v: min(v, 30))
        owner.add_state("cli/ro", "x")
        owner.add_method("cli/sum", lambda args: sum(args))
        assert jet(jetd, "get", "cli/temp").stdout == "20.5\n"
        assert json.loads(jet(jetd, "--json", "get", "cli/temp").stdout) == {
            "key": "cli/temp",
            "value": 20.5,
            "type": "FLOAT64",
        }
        result = jet(jetd, "set", "cli/temp", "99")
        assert (result.returncode, result.stdout) == (0, "30\n")
        assert owner.get("cli/temp") == 30
        result = jet(jetd, "--json", "call", "cli/sum", "[1, 2, 3.5]")
        assert json.loads(result.stdout) == {"key": "cli/sum", "result": 6.5}
        assert jet(jetd, "set", "cli/temp", "12", "--no-wait").returncode == 0
        assert owner.get("cli/temp") == 12
        # Errors: status and message on stderr, distinct exit codes.
        result = jet(jetd, "get", "cli/missing")
        assert result.returncode == 4 and "NOT_FOUND" in result.stderr and result.stdout == ""
        result = jet(jetd, "set", "cli/ro", "1")
        assert result.returncode == 5 and "REJECTED" in result.stderr and "read-only" in result.stderr
        result = jet(jetd, "set", "cli/sum", "1")
        assert result.returncode == 1 and "WRONG_KIND" in result.stderr
        result = jet(jetd, "set", "cli/temp", "abc", "--type", "int")
        assert result.returncode == 2 and "not a whole number" in result.stderr


def test_environment_and_connection_errors(jetd):
    env = {**ENV, "JET_HOST": jetd.host, "JET_PORT": str(jetd.port)}
    result = subprocess.run(
        [sys.executable, "-m", "peer.cli", "info"], capture_output=True, text=True, env=env, timeout=20
    )
    assert result.returncode == 0 and "jetd" in result.stdout
    result = subprocess.run(
        [sys.executable, "-m", "peer.cli", "--port", "1", "--timeout", "2", "get", "x"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=20,
    )
    assert result.returncode == 3 and "cannot connect" in result.stderr


def test_fetch_streams_until_sigint(jetd):
    with Peer(jetd.host, jetd.port) as owner:
        state = owner.add_state("fx/a", 1)
        fetch = Streaming(jetd, "--json", "fetch", "fx/")
        try:
            assert json.loads(fetch.line()) == {"event": "add", "key": "fx/a", "value": 1, "type": "INT64"}
            state.notify("two")
            assert json.loads(fetch.line()) == {"event": "change", "key": "fx/a", "value": "two", "type": "STRING"}
            owner.add_state("fx/b", b"\x01")
            assert json.loads(fetch.line())["value"] == {"hex": "01"}
            state.remove()
            assert json.loads(fetch.line())["event"] == "remove"
        finally:
            code, err = fetch.stop(signal.SIGINT)
        assert code == 130, err  # Ctrl-C: 128 + SIGINT (issue 32)
        assert "Traceback" not in err


def test_fetch_readable_and_sigterm(jetd):
    with Peer(jetd.host, jetd.port) as owner:
        owner.add_state("fr/a", {"x": 1})
        fetch = Streaming(jetd, "fetch", "fr/")
        try:
            assert fetch.line() == 'add    fr/a = {"x": 1}'
        finally:
            code, err = fetch.stop(signal.SIGTERM)
        assert code == 0, err


def test_serve_state(jetd):
    server = Streaming(jetd, "--json", "serve-state", "srv/led", "false")
    try:
        with Peer(jetd.host, jetd.port) as client:
            deadline = time.monotonic() + 10
            while True:
                try:
                    assert client.get("srv/led") is False
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            assert client.set("srv/led", True) is True
            assert json.loads(server.line()) == {"event": "set", "key": "srv/led", "value": True, "type": "BOOL"}
            assert client.get("srv/led") is True
    finally:
        code, err = server.stop(signal.SIGINT)
    assert code == 130, err


def test_serve_state_exits_when_daemon_stops(start_jetd):
    daemon = start_jetd()
    server = Streaming(daemon, "serve-state", "srv/x", "1")
    try:
        with Peer(daemon.host, daemon.port) as client:
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.get("srv/x")
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        daemon.stop()
        assert server.proc.wait(10) == 3
    finally:
        server.stop()
