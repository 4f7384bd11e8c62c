"""The web cases of the conformance suite (spec/conformance/13-web.json, PROTOCOL.md 13)
against a real jetd with its HTTP listener: ``jet-conformance HOST:PORT --web HOST:PORT``."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

from webtest import start_web_jetd

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.conformance", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_web_cases_pass_against_jetd(start_jetd, tmp_path):
    daemon = start_web_jetd(start_jetd)
    report = tmp_path / "web.json"
    result = _run(f"{daemon.host}:{daemon.port}", "--web", f"{daemon.web[0]}:{daemon.web[1]}", "--cases", "web.*",
                  "--strict", "--json", str(report))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr
    cases = json.loads(report.read_text())["cases"]
    assert len(cases) >= 10 and {c["outcome"] for c in cases} == {"OK"}, [(c["id"], c["outcome"]) for c in cases]
    # Without --web they are skipped, saying why.
    result = _run(f"{daemon.host}:{daemon.port}", "--cases", "web.*")
    assert result.returncode == 0 and result.stdout.strip().endswith(f"0 passed, 0 failed, {len(cases)} skipped")
    assert "--web HOST:PORT" in result.stdout


def test_web_cases_catch_a_daemon_that_checks_no_host(start_jetd, tmp_path):
    """The cases can fail: jetd with any Host allowed (--http-hosts '*') is what jetd was
    before issue 30, and the DNS-rebinding cases say so."""
    daemon = start_web_jetd(start_jetd, "--http-hosts", "*")
    report = tmp_path / "web.json"
    result = _run(f"{daemon.host}:{daemon.port}", "--web", f"{daemon.web[0]}:{daemon.web[1]}", "--cases", "web.*",
                  "--json", str(report))
    assert result.returncode == 1
    failed = {c["id"] for c in json.loads(report.read_text())["cases"] if c["outcome"] == "FAILED"}
    assert failed == {"web.host-foreign-handshake", "web.host-foreign-handshake-no-origin", "web.host-foreign-page"}


def test_web_cases_against_a_port_that_is_not_http_fail_without_a_traceback(start_jetd, tmp_path):
    """--web given the jet TCP port by mistake: the server answers no HTTP (jetd sends INFO
    and closes on the request). Each case fails (NON-STRICT for a SHOULD) saying so; no traceback."""
    daemon = start_web_jetd(start_jetd)
    report = tmp_path / "web.json"
    result = _run(f"{daemon.host}:{daemon.port}", "--web", f"{daemon.host}:{daemon.port}", "--cases", "web.*",
                  "--json", str(report))
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-4000:]
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr
    cases = json.loads(report.read_text())["cases"]
    outcomes = {c["outcome"] for c in cases}  # NON-STRICT: a SHOULD case that failed
    assert "FAILED" in outcomes and outcomes <= {"FAILED", "NON-STRICT"}, [(c["id"], c["outcome"]) for c in cases]
    assert "no HTTP response" in result.stdout, result.stdout[-4000:]


def test_web_cases_against_a_server_with_a_garbled_status_fail_without_a_traceback(start_jetd, tmp_path):
    """A listener that answers 'HTTP/1.1 \\xb9 OK' (the latin-1 '¹', a digit to
    str.isdigit() but not to int()): the cases fail saying so; no traceback."""
    import socket
    import threading

    daemon = start_web_jetd(start_jetd)
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def answer() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 \xb9 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        report = tmp_path / "web.json"
        result = _run(f"{daemon.host}:{daemon.port}", "--web", f"127.0.0.1:{server.getsockname()[1]}",
                      "--cases", "web.*", "--json", str(report))
    finally:
        stop.set()
        thread.join(10)
        server.close()
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-4000:]
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr
    outcomes = {c["outcome"] for c in json.loads(report.read_text())["cases"]}
    assert "FAILED" in outcomes and outcomes <= {"FAILED", "NON-STRICT"}, outcomes
    assert "not an HTTP response" in result.stdout, result.stdout[-4000:]
