"""Issue 30, the web surface: the Host allow-list (DNS rebinding), the headers of every
page (framing, referrer, CSP) and CORS on /jet.js (PROTOCOL.md 13.3), over real HTTP on
127.0.0.1, and in real Chromium where the browser's behaviour is the point."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from typing import Any
from typing import Optional

import pytest
from webtest import CHROMIUM
from webtest import TIMEOUT
from webtest import TIMEOUT_MS
from webtest import WsPeer
from webtest import chromium
from webtest import start_web_jetd
from webtest import until

from jetwire import GetState
from jetwire import Status

PAGES = ("/", "/index.html", "/console.js", "/console.css", "/jet.js", "/registry.json")


def http_get(web: tuple[str, int], path: str, host: Optional[str], *headers: str) -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP/1.1 request with the ``Host`` header given (None: no Host line);
    returns (status, headers with lower-case names, body)."""
    lines = [f"GET {path} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    lines += [*headers, "Connection: close"]
    with socket.create_connection(web, timeout=TIMEOUT) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
            if data.startswith(b"HTTP/1.1 101 ") and b"\r\n\r\n" in data:
                break  # upgraded: a jet connection, which stays open
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    fields: dict[str, str] = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), fields, body


def ws_upgrade(path: str = "/jet", protocol: str = "jet") -> tuple[str, ...]:
    return ("Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version: 13", f"Sec-WebSocket-Protocol: {protocol}")


def test_dns_rebinding_a_foreign_host_is_refused_even_as_its_own_origin(start_jetd):
    """The attack of issue 30: a page of evil.test, whose name now resolves to 127.0.0.1,
    sends Host: evil.test:PORT and Origin: http://evil.test:PORT ("same origin")."""
    daemon = start_web_jetd(start_jetd)
    host, port = daemon.web
    evil = f"evil.test:{port}"
    status, _, body = http_get(daemon.web, "/jet", evil, *ws_upgrade(), f"Origin: http://{evil}")
    assert status == 403 and b"host 'evil.test' is not allowed" in body, (status, body)
    for path in PAGES:
        status, _, body = http_get(daemon.web, path, evil)
        assert status == 403, (path, status, body)
        assert b"--http-hosts" in body
    # The same requests with an allowed Host work.
    assert http_get(daemon.web, "/registry.json", f"{host}:{port}")[0] == 200
    peer = WsPeer(daemon.web, "same-origin", origin=f"http://{host}:{port}")
    assert peer.request(lambda rid: GetState(rid, "x")).status == Status.NOT_FOUND
    peer.close()
    daemon.stop()
    log = daemon.stderr()
    assert log.count("refused: host 'evil.test' is not allowed") == 1 + len(PAGES), log
    assert log.count("open #") == 1


def test_host_allow_list(start_jetd):
    daemon = start_web_jetd(start_jetd, "--http-origins", "http://app.example:8000, https://Other.example",
                            "--http-hosts", "jet.lan, Console.Example.")
    _, port = daemon.web
    allowed = ("127.0.0.1", f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}", "[::1]",
               "localhost.", f"jet.lan:{port}", "console.example", "app.example:8000", "other.example:443")
    for host in allowed:
        status, _, body = http_get(daemon.web, "/", host)
        assert status == 200, (host, status, body)
        status, _, body = http_get(daemon.web, "/jet", host, *ws_upgrade())
        assert status == 101, (host, status, body)
    refused = ("evil.test", f"evil.test:{port}", "127.0.0.2", "[::2]:1", "jet.lan.evil.test", "localhost.evil.test",
               "app.example.evil.test:8000", "0.0.0.0")
    for host in refused:
        for headers in ((), ws_upgrade()):
            status, _, body = http_get(daemon.web, "/jet" if headers else "/", host, *headers)
            assert status == 403 and b"is not allowed" in body, (host, status, body)
    # RFC 9112 3.2: no Host, two Hosts or a malformed one is a bad request.
    for lines in ((None,), ("127.0.0.1", "Host: evil.test"), ("127.0.0.1:x",), ("[::1",), ("a b",), ("",)):
        status, _, body = http_get(daemon.web, "/", lines[0], *(lines[1:]))
        assert status == 400 and b"Host" in body, (lines, status, body)
    daemon.stop()
    assert daemon.stderr().count("is not allowed (the listen address, localhost") == 2 * len(refused)


def test_any_host_with_star_and_the_listen_address(start_jetd):
    daemon = start_web_jetd(start_jetd, "--http-hosts", "*")
    assert http_get(daemon.web, "/", "whatever.example")[0] == 200
    # --http-host names the listen address: 127.0.0.1 is localhost anyway, so use a name
    # that resolves to it.
    other = start_web_jetd(start_jetd, "--http-host", "localhost")
    assert http_get(other.web, "/", "localhost")[0] == 200
    assert http_get(other.web, "/", "evil.test")[0] == 403


def test_http_hosts_takes_ipv6_in_brackets_as_its_help_shows(start_jetd):
    """The refusal says an entry is 'like jet.lan, 10.0.0.5 or [::1]': that form (with or
    without a port) must be accepted and allowed, as must a bare IPv6 address."""
    daemon = start_web_jetd(start_jetd, "--http-hosts", "[fd00::5], [FD00::6]:8080, fd00::7")
    _, port = daemon.web
    for host in ("[fd00::5]", f"[fd00::5]:{port}", "[fd00::6]", "[fd00::7]:1"):
        status, _, body = http_get(daemon.web, "/", host)
        assert status == 200, (host, status, body)
    status, _, body = http_get(daemon.web, "/", "[fd00::8]")
    assert status == 403 and b"is not allowed" in body, (status, body)


def test_a_host_port_of_non_ascii_digits_is_a_bad_request_not_a_traceback(start_jetd):
    """HTTP headers arrive as latin-1: the byte 0xB9 is '¹', which str.isdigit() takes for
    a digit and int() refuses. Such a Host is malformed (400), not an error on the
    transport that drops the connection and logs a traceback."""
    daemon = start_web_jetd(start_jetd)
    for port_bytes in (b"\xb9", b"1\xb2", b"\xb3\xb3"):
        with socket.create_connection(daemon.web, timeout=TIMEOUT) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: localhost:" + port_bytes + b"\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        assert data.startswith(b"HTTP/1.1 400 "), (port_bytes, data[:200])
    daemon.stop()
    log = daemon.stderr()
    assert "Traceback" not in log and "Fatal error" not in log, log


def test_pipelined_requests_get_the_first_answer_and_no_traceback(start_jetd):
    """Two requests in one write (HTTP/1.1 pipelining): jetd answers the first and closes
    (Connection: close); the second, whatever its Host, is not served. websockets hands
    over both requests: answering the second raised AssertionError on the transport
    ('Fatal error', a traceback in the log per request) and the first answer was lost."""
    daemon = start_web_jetd(start_jetd)
    host, port = daemon.web
    for first, second in (("/nope", "/registry.json"), ("/", "/")):
        with socket.create_connection(daemon.web, timeout=TIMEOUT) as sock:
            sock.sendall(f"GET {first} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n"
                         f"GET {second} HTTP/1.1\r\nHost: evil.test\r\n\r\n".encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        assert data.startswith(b"HTTP/1.1 404 " if first == "/nope" else b"HTTP/1.1 200 "), (first, data[:200])
        assert data.count(b"HTTP/1.1 ") == 1, data[:400]
    # A handshake followed by bytes that are no WebSocket frame: refused, not upgraded.
    with socket.create_connection(daemon.web, timeout=TIMEOUT) as sock:
        head = "\r\n".join(("GET /jet HTTP/1.1", f"Host: {host}:{port}", *ws_upgrade()))
        sock.sendall(f"{head}\r\n\r\nGET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 400 ") and b"not WebSocket frames" in data, data[:400]
    daemon.stop()
    log = daemon.stderr()
    assert "Traceback" not in log and "Fatal error" not in log, log


@pytest.mark.parametrize("value", ["http://jet.lan", "jet.lan/x", "a b", "jet.lan:99999"])
def test_bad_http_hosts_is_a_config_error(start_jetd, value):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "jetd", "--port", "0", "--http-port", "0", "--http-hosts", value],
                            capture_output=True, text=True, timeout=30,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert result.returncode == 2 and "http_hosts" in result.stderr, result.stderr


@pytest.mark.parametrize("value", ["http://app.test:3000/app", "http://", "https://user@app.test", "http://app.test:x"])
def test_an_origin_that_no_browser_sends_is_a_config_error(value):
    """--http-origins takes what a browser sends as Origin (scheme://host[:port]); an
    entry with a path or userinfo would silently match nothing (a trailing / is fine)."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "jetd", "--port", "0", "--http-port", "0", "--http-origins", value],
                            capture_output=True, text=True, timeout=30,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert result.returncode == 2 and "http_origins" in result.stderr, result.stderr


def _security_headers(fields: dict[str, str]) -> None:
    csp = [d.strip() for d in fields.get("content-security-policy", "").split(";")]
    assert "frame-ancestors 'none'" in csp and "default-src 'self'" in csp, fields
    assert fields.get("x-frame-options") == "DENY", fields
    assert fields.get("referrer-policy") == "no-referrer", fields
    assert fields.get("x-content-type-options") == "nosniff", fields


def test_every_page_has_the_security_headers(start_jetd):
    daemon = start_web_jetd(start_jetd)
    host, port = daemon.web
    own = f"{host}:{port}"
    for path in (*PAGES, "/nope"):
        status, fields, _ = http_get(daemon.web, path, own)
        assert status in (200, 404), path
        _security_headers(fields)
    # Refusals too: a foreign host, a foreign origin, a handshake without the subprotocol.
    for path, host_line, headers, expected in (
        ("/", "evil.test", (), 403),
        ("/", None, (), 400),
        ("/jet", own, (*ws_upgrade(), "Origin: http://evil.example"), 403),
        ("/jet", own, ws_upgrade(protocol="chat"), 400),
    ):
        status, fields, _ = http_get(daemon.web, path, host_line, *headers)
        assert status == expected, (path, host_line, headers, status)
        _security_headers(fields)


def test_websockets_own_refusals_carry_the_security_headers_too(start_jetd):
    """PROTOCOL.md 13.3: every response, refusals included. A header line or a request
    line over websockets' 8 KiB line limit is answered by websockets itself (431, 414),
    before jetd sees a request."""
    daemon = start_web_jetd(start_jetd)
    host, port = daemon.web
    for path, headers, expected in (("/", (f"X-Long: {'a' * 9000}",), 431), ("/" + "a" * 9000, (), 414)):
        status, fields, _ = http_get(daemon.web, path, f"{host}:{port}", *headers)
        assert status == expected, (expected, status)
        _security_headers(fields)


def test_a_request_websockets_cannot_parse_gets_a_400_not_silence(start_jetd):
    """A request line that is not HTTP/1.1, or a GET with a body: websockets gives up on
    the request and would close without a word; the client gets a 400 that says why.
    (Bytes that are not HTTP at all still get only the close: test_01_websocket.)"""
    daemon = start_web_jetd(start_jetd)
    host, port = daemon.web
    for raw in (f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: 5\r\n\r\nhello",
                f"GET / HTTP/2.0\r\nHost: {host}:{port}\r\n\r\n"):
        with socket.create_connection(daemon.web, timeout=TIMEOUT) as sock:
            sock.sendall(raw.encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 ") and b"not a valid HTTP request" in body, (raw, data[:300])
        fields = {line.partition(":")[0].strip().lower(): line.partition(":")[2].strip()
                  for line in head.decode("latin-1").split("\r\n")[1:]}
        _security_headers(fields)
    daemon.stop()
    assert "Traceback" not in daemon.stderr()


def test_cors_on_jet_js_for_the_allowed_origins_only(start_jetd):
    daemon = start_web_jetd(start_jetd, "--http-origins", "http://app.example:8000")
    host, port = daemon.web
    own = f"{host}:{port}"
    status, fields, body = http_get(daemon.web, "/jet.js", own, "Origin: http://APP.example:8000")
    assert status == 200 and b"export" in body
    assert fields.get("access-control-allow-origin") == "http://APP.example:8000"
    assert "origin" in fields.get("vary", "").lower()
    for origin in ("http://evil.example", f"http://{own}", "null"):
        status, fields, _ = http_get(daemon.web, "/jet.js", own, f"Origin: {origin}")
        assert status == 200 and "access-control-allow-origin" not in fields, origin
    status, fields, _ = http_get(daemon.web, "/jet.js", own)
    assert "access-control-allow-origin" not in fields
    # Only the library: the console and the registry are not for other sites.
    for path in ("/", "/console.js", "/registry.json"):
        status, fields, _ = http_get(daemon.web, path, own, "Origin: http://app.example:8000")
        assert status == 200 and "access-control-allow-origin" not in fields, path
    anyone = start_web_jetd(start_jetd, "--http-origins", "*")
    _, fields, _ = http_get(anyone.web, "/jet.js", f"{anyone.web[0]}:{anyone.web[1]}", "Origin: http://x.example")
    assert fields.get("access-control-allow-origin") == "*"


def test_jet_js_with_two_origin_headers_gets_no_cors_and_no_traceback(start_jetd):
    """Two Origin headers on /jet.js: no browser sends that, so no CORS header (one of
    them may be allowed); the library is still served. It raised MultipleValuesError on
    the transport: no answer and a traceback in the log."""
    daemon = start_web_jetd(start_jetd, "--http-origins", "http://app.example:8000")
    host, port = daemon.web
    status, fields, body = http_get(daemon.web, "/jet.js", f"{host}:{port}", "Origin: http://app.example:8000",
                                    "Origin: http://evil.example")
    assert status == 200 and b"export" in body, (status, body[:200])
    assert "access-control-allow-origin" not in fields, fields
    daemon.stop()
    log = daemon.stderr()
    assert "Traceback" not in log and "Fatal error" not in log, log


# --- in Chromium ------------------------------------------------------------------------

def _needs_browser() -> Any:
    api = pytest.importorskip("playwright.async_api", reason="playwright is not installed")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM}")
    return api


def test_console_cannot_be_framed_and_runs_under_its_csp(start_jetd, tmp_path):
    """Clickjacking (issue 30): a page of another origin frames the console; Chromium must
    refuse to show it. The console itself still works under its Content-Security-Policy,
    with no violation reported."""
    api = _needs_browser()
    daemon = start_web_jetd(start_jetd)
    host, port = daemon.web
    console = f"http://{host}:{port}/"

    async def run() -> None:
        from peer import PeerAsync

        owner = await PeerAsync.connect(*daemon.address, name="plant")
        await owner.add_state("plant/boiler/setpoint", 50)
        async with chromium() as browser:
            page = await browser.new_page()
            messages: list[str] = []
            page.on("console", lambda m: messages.append(m.text))
            page.on("pageerror", lambda e: messages.append(str(e)))
            await page.goto(console)
            await until(page, "document.getElementById('status').textContent === 'live'")
            await page.fill("#search", "plant/")
            await page.locator('.node[data-key="plant/boiler/setpoint"] .val').wait_for(timeout=TIMEOUT_MS)
            await page.screenshot(path=str(tmp_path / "console-under-csp.png"))
            assert not [m for m in messages if "Content Security Policy" in m or "Refused" in m], messages
            # The framing page, on another origin (localhost is another origin than 127.0.0.1).
            framer = await browser.new_page()  # about:blank: an origin of its own, no CSP of jetd's
            await framer.set_content(f'<iframe id="f" src="{console}" width="800" height="600"></iframe>')
            await framer.wait_for_timeout(500)
            await framer.wait_for_load_state()
            frames = [f for f in framer.frames if f != framer.main_frame]
            assert frames, "no iframe"
            has_console = False
            for frame in frames:
                with contextlib.suppress(api.Error):  # a blocked frame may have no document at all
                    has_console = has_console or await frame.evaluate("!!document.getElementById('search')")
            assert not has_console, "the console was shown inside a foreign frame"
            await framer.screenshot(path=str(tmp_path / "console-framed.png"))
        await owner.close()

    asyncio.run(run())


def test_an_allowed_origins_page_imports_jet_js_from_jetd_and_others_cannot(start_jetd):
    """CORS in Chromium: a module import of jetd's /jet.js from a page of an allowed origin
    works; from another origin the browser refuses it."""
    import http.server
    import threading

    _needs_browser()

    class Blank(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<!doctype html><title>app</title>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    app = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Blank)
    threading.Thread(target=app.serve_forever, daemon=True).start()
    app_origin = f"http://127.0.0.1:{app.server_address[1]}"
    try:
        allowing = start_web_jetd(start_jetd, "--http-origins", app_origin)
        other = start_web_jetd(start_jetd)

        async def run() -> None:
            async with chromium() as browser:
                page = await browser.new_page()
                await page.goto(app_origin + "/")
                load = "async (url) => { try { return (await import(url)).PROTOCOL_MAJOR; } catch (e) { return String(e); } }"
                ok = await page.evaluate(load, f"http://{allowing.web[0]}:{allowing.web[1]}/jet.js")
                assert ok == 1, ok
                refused = await page.evaluate(load, f"http://{other.web[0]}:{other.web[1]}/jet.js")
                assert "Failed to fetch" in str(refused) or "TypeError" in str(refused), refused

        asyncio.run(run())
    finally:
        app.shutdown()
        app.server_close()
