"""Helpers for the web tests: jetd with its HTTP listener, a WebSocket jet peer, and
Chromium (driven by Playwright) for the console pages."""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from collections.abc import Callable
from pathlib import Path
from typing import Any
from typing import Optional

import pytest
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect

from jetwire import Close
from tests.jetd.jetd_testlib import FramedPeer

TIMEOUT = 5.0
REPO = Path(__file__).resolve().parent.parent.parent
ARTIFACTS = REPO / "tests" / "artifacts"  # screenshots, ignored by git, kept after the run

# Chromium from Debian (``playwright install`` cannot download browsers here).
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
TIMEOUT_MS = 15_000  # a page waits this long for what it should show


async def launch_chromium(playwright: Any) -> Any:
    """A headless Chromium from ``async_playwright()``; the caller closes it."""
    return await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    """A headless Chromium of its own Playwright, closed when the block ends (also when
    it fails)."""
    from playwright.async_api import async_playwright  # only the browser tests need it

    async with async_playwright() as playwright:
        browser = await launch_chromium(playwright)
        try:
            yield browser
        finally:
            await browser.close()


needs_chromium = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM}")


def page_errors(page: Any, errors: Optional[list[str]] = None) -> list[str]:
    """The list (``errors``, or a new one) that collects the page's uncaught JavaScript
    errors from now on."""
    found: list[str] = [] if errors is None else errors
    page.on("pageerror", lambda e: found.append(str(e)))
    return found


async def until(page: Any, predicate: str, timeout_ms: int = TIMEOUT_MS) -> None:
    """Wait for a JavaScript expression to hold on ``page``. It is passed as a function:
    the console's CSP forbids eval, which a string predicate needs once it is not true."""
    await page.wait_for_function(f"() => {predicate}", timeout=timeout_ms)


async def act_from_page(page: Any, row: Any, text: str, outcome: str) -> str:
    """On the console: click ``row`` of the tree, send ``text`` from its form (a set or a
    call) and wait for the answer of class ``outcome`` ("ok" or "error"); its text."""
    await row.click()
    await page.fill("form.act input[name=text]", text)
    await page.click("form.act button")
    await page.wait_for_selector(f".answer.{outcome}", timeout=TIMEOUT_MS)
    return await page.text_content(".answer") or ""  # type: ignore[no-any-return]


def user_add(users: Path, name: str, password: str, *grants: str) -> None:
    """``jetd user add USERS NAME GRANTS... --password-stdin`` (PROTOCOL.md 15)."""
    done = subprocess.run(
        [sys.executable, "-m", "jetd", "user", "add", str(users), name, *grants, "--password-stdin"],
        input=password + "\n", capture_output=True, text=True, cwd=REPO, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr


def web_address(daemon: Any) -> tuple[str, int]:
    """Read jetd's second stdout line, ``web on http://HOST:PORT/``; returns (host, port)."""
    cached = getattr(daemon, "web", None)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    stdout = daemon.proc.stdout
    selector = selectors.DefaultSelector()
    selector.register(stdout, selectors.EVENT_READ)
    line = b""
    deadline = time.monotonic() + 15
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        assert remaining > 0 and selector.select(remaining), f"no web line: {daemon.stderr()}"
        chunk = os.read(stdout.fileno(), 1)
        assert chunk, f"jetd exited before its web line: {daemon.stderr()}"
        line += chunk
    selector.close()
    text = line.decode().strip()
    assert text.startswith("web on http://") and text.endswith("/"), text
    host, _, port = text[len("web on http://") : -1].rpartition(":")
    daemon.web = (host, int(port))
    return daemon.web  # type: ignore[no-any-return]


def start_web_jetd(start_jetd: Callable[..., Any], *args: str, env: Optional[dict[str, str]] = None) -> Any:
    """A jetd on port 0 with ``--http-port 0``; its ``web`` attribute is the HTTP address."""
    daemon = start_jetd("--http-port", "0", *args, env=env)
    web_address(daemon)
    return daemon


class WsPeer(FramedPeer):
    """A jet peer over WebSocket (the websockets sync client); reads the daemon's INFO.
    ``recv`` raises ConnectionClosed at the end, TimeoutError on timeout."""

    def __init__(self, web: tuple[str, int], name: Optional[str] = None, *, read_info: bool = True,
                 **kwargs: Any) -> None:
        super().__init__()
        kwargs.setdefault("subprotocols", ["jet"])
        self.ws: ClientConnection = connect(f"ws://{web[0]}:{web[1]}/jet", open_timeout=TIMEOUT, **kwargs).__enter__()
        self.closed = False
        self.start(name, read_info)

    def write(self, data: bytes) -> None:
        self.ws.send(data)

    def read(self, deadline: float, timeout: float) -> Optional[bytes]:
        data = self.ws.recv(max(0.0, deadline - time.monotonic()))
        assert isinstance(data, bytes), f"text message from jetd: {data!r}"
        return data

    def expect_close(self, status: Any, timeout: float = TIMEOUT) -> Close:
        message = self.recv(timeout)
        assert isinstance(message, Close) and message.status == status, message
        return message

    def close(self) -> None:
        self.ws.close()
