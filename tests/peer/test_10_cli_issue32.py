"""``jet`` never lies and never crashes (issue 32): rejected sets said as such, one
``jet:`` line and exit 2 for arguments the protocol cannot carry, exit 130 and no
traceback on Ctrl-C, binary files with ``--type bytes``. Each runs the real CLI as a
subprocess against a real jetd."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pty
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_05_cli import ENV
from test_05_cli import REPO
from test_05_cli import Streaming
from test_08_cli_usage import _wait_registered
from test_08_cli_usage import assert_usage_error

from peer import Peer
from peer import Rejected

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
        # The command line first: before the exec, the child is a fork of pytest, whose
        # own handlers show in SigCgt.
        with open(f"/proc/{proc.pid}/cmdline", "rb") as cmdline:
            if b"peer.cli" not in cmdline.read():
                time.sleep(0.005)
                continue
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


def test_serve_state_read_only_marks_every_set(jetd):
    served = Streaming(jetd, "serve-state", "plant/fixed", "1", "--read-only")
    try:
        with Peer(jetd.host, jetd.port) as client:
            _wait_registered(client, "plant/fixed")
            with pytest.raises(Rejected, match="read-only"):
                client.set("plant/fixed", 2)
            assert client.get("plant/fixed") == 1
            line = served.line()
            assert line.startswith("reject plant/fixed = 2") and "read-only" in line, line
    finally:
        served.stop()


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


# --- not a jet daemon ------------------------------------------------------------------


class FakeServer:
    """A real TCP listener on 127.0.0.1 that is not jetd: it sends ``greeting`` to each
    connection (nothing if empty) and keeps it open until closed."""

    def __init__(self, greeting: bytes = b"", close_at_once: bool = False) -> None:
        import socket

        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.greeting, self.close_at_once = greeting, close_at_once
        self.accepted: list[Any] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted.append(conn)
            if self.greeting:
                conn.sendall(self.greeting)
            if self.close_at_once:
                conn.close()

    def close(self) -> None:
        import socket

        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() of its thread (Linux)
        self.listener.close()
        for conn in self.accepted:
            conn.close()
        self.thread.join(10)


@pytest.fixture
def http_server():
    """``python -m http.server`` on 127.0.0.1, port 0, output discarded."""
    proc = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()  # "Serving HTTP on 127.0.0.1 port N (...)"
        port = int(line.split(" port ")[1].split()[0])
        yield port
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def run_at_port(port: int, *args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    cmd = [sys.executable, "-m", "peer.cli", "--port", str(port), *args]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=timeout, cwd=REPO)
    return proc, time.monotonic() - started


@pytest.mark.parametrize("command", [["get", "a"], ["info"]])  # peer.tiny, and the blocking peer
def test_http_server_is_not_a_jet_daemon(http_server, command):
    # http.server waits for a request line that never comes: it says nothing. jet used
    # to wait its whole --timeout (10 s) and call it a TIMEOUT.
    got, took = run_at_port(http_server, *command, "--timeout", "30")
    assert got.returncode == 3 and "Traceback" not in got.stderr, got.stderr
    assert "not a jet daemon" in got.stderr and "sent nothing in 5 s" in got.stderr, got.stderr
    assert took < 30, took  # the INFO wait (5 s), not --timeout


@pytest.mark.parametrize(
    ("greeting", "words"),
    [
        (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", ["an HTTP answer", "HTTP/1.1 400 Bad Request"]),
        (b"SSH-2.0-OpenSSH_9.2p1 Debian\r\n", ["text 'SSH-2.0-OpenSSH"]),
        (b"\x15\x03\x03\x00\x02\x02\x46", ["speaks TLS", "--tls"]),
        (b"\x04\xff\xff\xff\xffjunk", ["the bytes 04 ff ff ff ff"]),
    ],
)
@pytest.mark.parametrize("command", [["get", "a"], ["info"]])
def test_foreign_bytes_say_not_a_jet_daemon_at_once(greeting, words, command):
    server = FakeServer(greeting)
    try:
        got, took = run_at_port(server.port, *command, "--timeout", "60")
    finally:
        server.close()
    assert got.returncode == 3 and "Traceback" not in got.stderr, got.stderr
    assert f"127.0.0.1:{server.port} is not a jet daemon" in got.stderr, got.stderr
    for word in words:
        assert word in got.stderr, (word, got.stderr)
    assert "TOO_LARGE" not in got.stderr and "unknown frame type" not in got.stderr
    assert took < 60


def test_peer_libraries_raise_not_jet_daemon():
    from peer import ConnectionClosed
    from peer import NotJetDaemon
    from peer import PeerAsync
    from peer.tiny import NotJetDaemon as TinyNotJetDaemon
    from peer.tiny import TinyPeer

    http = FakeServer(b"HTTP/1.0 400 Bad Request\r\n\r\n")
    silent = FakeServer()
    closing = FakeServer(close_at_once=True)
    try:
        with pytest.raises(NotJetDaemon, match=r"HTTP/1\.0 400") as caught:
            Peer("127.0.0.1", http.port, timeout=30)
        assert isinstance(caught.value, ConnectionClosed) and caught.value.seen.startswith(b"HTTP/1.0")
        with pytest.raises(TinyNotJetDaemon, match=r"HTTP/1\.0 400"):
            TinyPeer("127.0.0.1", http.port, timeout=30)
        with pytest.raises(NotJetDaemon, match=r"sent nothing in 0\.5 s"):
            Peer("127.0.0.1", silent.port, timeout=30, info_timeout=0.5)
        with pytest.raises(TinyNotJetDaemon, match=r"sent nothing in 0\.5 s"):
            TinyPeer("127.0.0.1", silent.port, timeout=30, info_timeout=0.5)
        with pytest.raises(NotJetDaemon, match="without sending anything") as closed:
            Peer("127.0.0.1", closing.port, timeout=30)
        assert closed.value.tls
        with pytest.raises(TinyNotJetDaemon, match="without sending anything"):
            TinyPeer("127.0.0.1", closing.port, timeout=30)

        async def aio() -> None:
            with pytest.raises(NotJetDaemon, match=r"HTTP/1\.0 400"):
                await PeerAsync.connect("127.0.0.1", http.port, timeout=30)

        asyncio.run(aio())
    finally:
        for server in (http, silent, closing):
            server.close()


@pytest.mark.parametrize("command", [["fetch", "x/"], ["get", "x"]])  # the sync peer, and tiny
def test_ctrl_c_while_waiting_for_info(command):
    silent = FakeServer()
    try:
        cmd = [sys.executable, "-m", "peer.cli", "--port", str(silent.port), "--timeout", "60", *command]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, cwd=REPO)
        try:
            deadline = time.monotonic() + 30
            while not silent.accepted and time.monotonic() < deadline:
                time.sleep(0.01)
            assert silent.accepted, "jet did not connect"
            proc.send_signal(signal.SIGINT)
        finally:
            code, err = finish(proc)
    finally:
        silent.close()
    assert code == 130 and "Traceback" not in err, (code, err)


# --- TLS messages -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A CA and a certificate for 127.0.0.1 (IP subjectAltName), made with openssl as
    the README says."""
    out = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    (out / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for cmd in (
        ["openssl", "req", "-x509", *ec, "-days", "2", "-subj", "/CN=jet test CA", "-keyout", "ca-key.pem",
         "-out", "ca.pem"],
        ["openssl", "req", *ec, "-subj", "/CN=127.0.0.1", "-keyout", "key.pem", "-out", "cert.csr"],
        ["openssl", "x509", "-req", "-in", "cert.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
         "-days", "2", "-extfile", "san.ext", "-out", "cert.pem"],
    ):
        subprocess.run(cmd, cwd=out, check=True, capture_output=True, timeout=60)
    return {name: out / f"{name}.pem" for name in ("ca", "ca-key", "key", "cert")}


def test_tls_mistakes_are_said_plainly(start_jetd, pki):
    tls = start_jetd("--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"]))
    plain = start_jetd()
    ca = str(pki["ca"])
    ok, _ = run_at_port(tls.port, "--ca", ca, "info")
    assert ok.returncode == 0 and "protocol 1." in ok.stdout, ok.stderr
    for command in (["get", "a"], ["info"]):
        # A TLS port without --tls: it closes without a word, which says TLS.
        got, _ = run_at_port(tls.port, *command)
        assert got.returncode == 3 and "looks like a TLS port" in got.stderr and "--tls" in got.stderr, got.stderr
        # A plaintext port with --ca.
        got, _ = run_at_port(plain.port, "--ca", ca, *command)
        assert got.returncode == 3 and "did not speak TLS" in got.stderr, got.stderr
        assert "Traceback" not in got.stderr
        # --tls without the CA: name what is missing.
        got, _ = run_at_port(tls.port, "--tls", *command)
        assert got.returncode == 3 and "--ca FILE" in got.stderr, got.stderr
    missing, _ = run_at_port(tls.port, "--ca", str(pki["ca"].parent / "nope.pem"), "get", "a")
    assert missing.returncode == 2 and "nope.pem" in missing.stderr, missing.stderr
    swapped, _ = run_at_port(tls.port, "--ca", ca, "--cert", str(pki["key"]), "--key", str(pki["key"]), "get", "a")
    assert swapped.returncode == 2 and "holds a private key" in swapped.stderr, swapped.stderr


@pytest.mark.parametrize(
    ("files", "words"),
    [
        (("cert", None), ["--tls-cert and --tls-key go together"]),
        (("key", "key"), ["--tls-cert", "holds a private key"]),
        (("cert", "cert"), ["--tls-key", "holds a certificate"]),
        (("cert", "ca-key"), ["is not the key of the certificate"]),
        (("cert", "missing"), ["cannot read --tls-key", "missing.pem"]),
    ],
)
def test_jetd_tls_file_mistakes(pki, files, words):
    cert, key = files
    args = ["--tls-cert", str(pki[cert])]
    if key is not None:
        args += ["--tls-key", str(pki.get(key, pki["ca"].parent / f"{key}.pem"))]
    proc = subprocess.run([sys.executable, "-m", "jetd", "--host", "127.0.0.1", "--port", "0", *args],
                          capture_output=True, text=True, env=ENV, timeout=60, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    assert "PEM lib" not in proc.stderr and "tls_cert and tls_key" not in proc.stderr.split("(")[0]
    for word in words:
        assert word in proc.stderr, (word, proc.stderr)


# --- ls sorts like fetch, fetch --timestamps, info names its features, SyncFetch.rows ----


def _players(owner: Peer) -> dict[str, Any]:
    return {name: owner.add_state(f"players/{name}", {"score": score})
            for name, score in (("ann", 30), ("bob", 10), ("cat", 50), ("dan", 20), ("eve", 40))}


def test_ls_sorts_and_windows_like_fetch(jetd):
    with Peer(jetd.host, jetd.port) as owner:
        _players(owner)
        plain = jet_at(jetd, "ls", "players/")
        assert plain.stdout.split() == [f"players/{n}" for n in ("ann", "bob", "cat", "dan", "eve")], plain.stderr
        top = jet_at(jetd, "ls", "players/", "--sort-by", "score", "--desc", "--top", "3")
        assert top.returncode == 0 and top.stdout.split() == ["players/cat", "players/eve", "players/ann"], top.stderr
        window = jet_at(jetd, "--json", "ls", "players/", "--sort-by", "score", "--from", "2", "--to", "4")
        rows = [json.loads(line) for line in window.stdout.splitlines()]
        assert [(row["key"], row["value"]["score"]) for row in rows] == [
            ("players/dan", 20), ("players/ann", 30), ("players/eve", 40)], window.stderr
        for args, words in (
            (["--top", "2"], ["need --sort-by"]),
            (["--sort-by", "score", "--from", "2"], ["--from and --to go together"]),
            (["--sort-by", "score", "--from", "3", "--to", "2"], ["--to 2 is before --from 3"]),
            (["--sort-by", "score", "--top", "2", "--from", "1", "--to", "2"], ["not both"]),
        ):
            assert_usage_error(jet_at(jetd, "ls", "players/", *args), *words)


def test_fetch_timestamps(jetd):
    import datetime

    with Peer(jetd.host, jetd.port) as owner:
        owner.add_state("ts/a", 1)
        before = datetime.datetime.now().astimezone()
        text = jet_at(jetd, "fetch", "ts/", "--timestamps", "--count", "1", "--timeout", "20")
        stamp, rest = text.stdout.strip().split(" ", 1)
        assert rest == "add    ts/a = 1", text.stdout
        when = datetime.datetime.fromisoformat(stamp)
        assert when.tzinfo is not None and before - datetime.timedelta(seconds=1) <= when, stamp
        as_json = jet_at(jetd, "--json", "fetch", "ts/", "--timestamps", "--count", "1", "--timeout", "20")
        line = json.loads(as_json.stdout)
        assert line["key"] == "ts/a" and datetime.datetime.fromisoformat(line["time"]).tzinfo is not None
        plain = jet_at(jetd, "fetch", "ts/", "--count", "1", "--timeout", "20")
        assert plain.stdout == "add    ts/a = 1\n"


def test_info_names_the_feature_bits(jetd):
    from peer.cli import feature_names

    assert feature_names(0x0B) == ["CONFLATION", "QUERIES", "LIMITS"]
    assert feature_names(0x4 | 0x100) == ["AUTH_REQUIRED", "0x00000100"]
    text = jet_at(jetd, "info")
    assert "features 0x0000001B (CONFLATION, QUERIES, LIMITS, DAEMON_STATES)" in text.stdout, text.stdout
    as_json = json.loads(jet_at(jetd, "--json", "info").stdout)
    assert as_json["features"] == 0x1B
    assert as_json["feature_names"] == ["CONFLATION", "QUERIES", "LIMITS", "DAEMON_STATES"]


def test_sync_fetch_rows_is_the_window(jetd):
    # README: peer.fetch(..., sort_by=..., top=N); fetch.rows is the window.
    def window(fetch: Any, size: int, expected: list[tuple[int, str, int]]) -> None:
        deadline = time.monotonic() + 20
        seen: list[tuple[int, str, int]] = []
        while time.monotonic() < deadline:
            seen = [(row.index, row.key, row.value["score"]) for row in fetch.rows]
            if seen == expected:
                return
            time.sleep(0.01)
        raise AssertionError(f"fetch.rows is {seen}, not {expected}")

    with Peer(jetd.host, jetd.port) as owner, Peer(jetd.host, jetd.port) as client:
        players = _players(owner)
        fetch = client.fetch("players/", sort_by="score", descending=True, top=3)
        with client.fetch("players/") as unsorted:
            assert unsorted.rows == ()
        # Without iterating: the latest window the peer has.
        window(fetch, 3, [(1, "players/cat", 50), (2, "players/eve", 40), (3, "players/ann", 30)])
        players["bob"].notify({"score": 45})
        window(fetch, 3, [(1, "players/cat", 50), (2, "players/bob", 45), (3, "players/eve", 40)])
        # Iterated: each WINDOW event carries its own window, the last one equals rows.
        last = None
        while True:
            try:
                last = fetch.next(timeout=0.5)
            except TimeoutError:
                break
        assert last is not None and last.kind == "window" and last.rows == fetch.rows
        # A callback fetch has it too.
        called = threading.Event()
        with client.fetch("players/", on_event=lambda event: called.set(), sort_by="key", top=2) as by_key:
            assert called.wait(20)
            window(by_key, 2, [(1, "players/ann", 30), (2, "players/bob", 45)])


def test_readme_recipe_from_a_file(jetd, tmp_path: Path):
    # README, "A minute with jet": serve-state plant/recipe '{}' --type json, then
    # jet set plant/recipe @recipe.json.
    served = Streaming(jetd, "serve-state", "plant/recipe", "{}", "--type", "json")
    try:
        with Peer(jetd.host, jetd.port) as client:
            _wait_registered(client, "plant/recipe")
            (tmp_path / "recipe.json").write_text('{"flour": 500, "water": 350}\n')
            done = jet_at(jetd, "set", "plant/recipe", f"@{tmp_path / 'recipe.json'}")
            assert done.returncode == 0 and json.loads(done.stdout) == {"flour": 500, "water": 350}, done.stderr
            assert served.line() == 'set    plant/recipe = {"flour": 500, "water": 350}'
            assert client.get_raw("plant/recipe").vtype == 5  # JSON
    finally:
        served.stop()
