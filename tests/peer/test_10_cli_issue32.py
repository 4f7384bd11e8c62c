"""``jet`` never lies and never crashes (issue 32): rejected sets said as such, one
``jet:`` line and exit 2 for arguments the protocol cannot carry, exit 130 and no
traceback on Ctrl-C, binary files with ``--type bytes``. Each runs the real CLI as a
subprocess against a real jetd."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_05_cli import ENV, REPO, Streaming
from test_08_cli_usage import _wait_registered, assert_usage_error

from peer import Peer, Rejected

SIGTERM_BIT = 1 << (signal.SIGTERM - 1)


def jet_at(daemon, *args: str, stdin: bytes | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "peer.cli", "--host", daemon.host, "--port", str(daemon.port), *args]
    proc = subprocess.run(cmd, input=stdin, capture_output=True, env=ENV, timeout=timeout, cwd=REPO)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def wait_in_main(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Until jet's main() runs: it installs its SIGTERM handler first thing, which
    /proc shows in SigCgt. A signal sent after this lands in jet's own code, never in
    the interpreter's start-up (which is not ours to make quiet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "jet exited before its main() ran"
        with open(f"/proc/{proc.pid}/status") as status:
            for line in status:
                if line.startswith("SigCgt:") and int(line.split()[1], 16) & SIGTERM_BIT:
                    return
        time.sleep(0.005)
    raise AssertionError(f"jet's main() did not start within {timeout} s")


def finish(proc: subprocess.Popen[bytes], timeout: float = 30) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, (err or b"").decode()


# --- arguments ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["set", "", "1"], ["KEY is empty"]),
        (["get", ""], ["KEY is empty"]),
        (["call", ""], ["KEY is empty"]),
        (["serve-state", "", "1"], ["KEY is empty"]),
        (["serve-method", ""], ["KEY is empty"]),
        (["get", "k" * 70000], ["70000 bytes", "at most 65535"]),
        (["get", "bad\udcffkey"], ["not valid UTF-8"]),
        (["fetch", "bad\udcff"], ["PREFIX", "not valid UTF-8"]),
        (["--user", "", "get", "k"], ["--user is empty"]),
        (["fetch", "x", "--sort-by", " "], ["--sort-by is empty"]),
        (["set", "k", "seven", "--type", "int"], ["--type int", "'seven' is not a whole number"]),
        (["set", "k", "99999999999999999999", "--type", "int"], ["does not fit in 64 bits"]),
        (["set", "k", "99999999999999999999"], ["does not fit INT64"]),
        (["set", "k", "x1", "--type", "float"], ["--type float", "is not a number"]),
        (["set", "k", "zz", "--type", "hex"], ["--type hex", "not hex bytes"]),
        (["set", "k", "{", "--type", "json"], ["--type json", "does not parse as JSON"]),
    ],
)
def test_arguments_the_protocol_cannot_carry(jetd, args, words):
    # Argument strings with lone surrogates stand for bytes that are not UTF-8 in argv.
    cmd = [sys.executable, "-m", "peer.cli", "--port", str(jetd.port), *args]
    env = {**ENV, "PYTHONIOENCODING": "utf-8"}
    encoded = [os.fsencode(part) for part in cmd]
    proc = subprocess.run(encoded, capture_output=True, env=env, timeout=30, cwd=REPO)
    done = subprocess.CompletedProcess(cmd, proc.returncode, proc.stdout.decode(), proc.stderr.decode())
    assert_usage_error(done, *words)
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "invalid literal" not in done.stderr


def test_a_long_key_is_shortened_in_messages(jetd):
    key = "plant/" + "x" * 1994  # 2,000 bytes: over jetd's default key limit
    got = jet_at(jetd, "get", key)
    assert got.returncode != 0 and "Traceback" not in got.stderr
    line = got.stderr.strip()
    assert line.startswith("jet: ") and "… (2000 bytes)" in line, line
    assert key not in line and len(line) < 300, line


# --- serve-state prints only what it accepted --------------------------------------


@pytest.mark.parametrize("as_json", [False, True])
def test_serve_state_marks_the_sets_it_rejects(jetd, as_json):
    served = Streaming(jetd, *(["--json"] if as_json else []), "serve-state", "plant/level2", "3", "--type", "int")
    try:
        with Peer(jetd.host, jetd.port) as client:
            _wait_registered(client, "plant/level2")
            with pytest.raises(Rejected):
                client.set("plant/level2", 4.5)
            assert client.set("plant/level2", 5) == 5
            first, second = served.line(), served.line()
    finally:
        code, err = served.stop()
    assert code == 130 and "Traceback" not in err, err
    if as_json:
        rejected, accepted = json.loads(first), json.loads(second)
        assert rejected["event"] == "rejected" and rejected["value"] == 4.5 and "int" in rejected["reason"]
        assert accepted == {"event": "set", "key": "plant/level2", "value": 5, "type": "INT64"}
    else:
        assert first.startswith("reject plant/level2 = 4.5") and "holds int values" in first, first
        assert not first.startswith("set"), first
        assert second == "set    plant/level2 = 5"


def test_serve_state_prints_the_value_it_keeps(jetd):
    served = Streaming(jetd, "--json", "serve-state", "plant/ratio", "0.5", "--type", "float")
    try:
        with Peer(jetd.host, jetd.port) as client:
            _wait_registered(client, "plant/ratio")
            assert client.set("plant/ratio", 2) == 2.0
            assert json.loads(served.line()) == {"event": "set", "key": "plant/ratio", "value": 2.0, "type": "FLOAT64"}
    finally:
        served.stop()


# --- Ctrl-C: exit 130, no traceback --------------------------------------------------


def test_ctrl_c_while_call_waits(jetd):
    called = threading.Event()

    async def never_answers(args):
        called.set()
        await asyncio.sleep(60)

    with Peer(jetd.host, jetd.port, name="slow") as owner:
        owner.add_method("svc/slow", never_answers)
        cmd = [sys.executable, "-m", "peer.cli", "--port", str(jetd.port), "--timeout", "60", "call", "svc/slow", "1"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, cwd=REPO)
        try:
            assert called.wait(30), "the call did not reach the owner"
            proc.send_signal(signal.SIGINT)
        finally:
            code, err = finish(proc)
    assert code == 130, (code, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.15, 0.3])
def test_ctrl_c_early_in_fetch_on_a_terminal(jetd, delay):
    # stdout on a terminal: jet imports rich for colour while it starts, where a
    # Ctrl-C used to print rich's traceback.
    with Peer(jetd.host, jetd.port) as owner:
        owner.add_state("fx/a", 1)
        main_side, terminal = pty.openpty()
        cmd = [sys.executable, "-m", "peer.cli", "--port", str(jetd.port), "fetch", "fx/"]
        try:
            proc = subprocess.Popen(cmd, stdout=terminal, stderr=subprocess.PIPE, env=ENV, cwd=REPO)
            os.close(terminal)
            try:
                wait_in_main(proc)
                time.sleep(delay)
                proc.send_signal(signal.SIGINT)
            finally:
                code, err = finish(proc)
        finally:
            os.close(main_side)
    assert code == 130, (code, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_ctrl_c_and_sigterm_while_fetch_streams(jetd):
    with Peer(jetd.host, jetd.port) as owner:
        owner.add_state("fs/a", 1)
        for sig, expected in ((signal.SIGINT, 130), (signal.SIGTERM, 0)):
            fetch = Streaming(jetd, "fetch", "fs/")
            try:
                assert fetch.line() == "add    fs/a = 1"
            finally:
                code, err = fetch.stop(sig)
            assert code == expected and "Traceback" not in err, (sig, code, err)


# --- binary files -------------------------------------------------------------------


def test_set_a_binary_file_with_type_bytes(jetd, tmp_path: Path):
    blob = bytes(range(256)) * 40 + b"\n"  # not UTF-8, and its last newline is data
    (tmp_path / "bin.dat").write_bytes(blob)
    with Peer(jetd.host, jetd.port) as owner:
        owner.add_state("big/v", b"", on_set=lambda value: value)
        refused = jet_at(jetd, "set", "big/v", f"@{tmp_path / 'bin.dat'}")
        assert refused.returncode == 2 and "--type bytes" in refused.stderr, refused.stderr
        done = jet_at(jetd, "set", "big/v", f"@{tmp_path / 'bin.dat'}", "--type", "bytes")
        assert done.returncode == 0, done.stderr
        assert owner.get("big/v") == blob
        piped = jet_at(jetd, "set", "big/v", "-", "--type", "bytes", stdin=b"\x00\xff\n")
        assert piped.returncode == 0, piped.stderr
        assert owner.get("big/v") == b"\x00\xff\n"
        literal = jet_at(jetd, "--json", "set", "big/v", "abc", "--type", "bytes")
        assert json.loads(literal.stdout) == {"key": "big/v", "value": {"hex": "616263"}}
