"""Issue 33, the console's live views in real Chromium (Playwright) against a real jetd:
the update rate per key in the tree, the Peers view and the Daemon panel (from the
daemon's own states under $jet/), a plain "not available" line for a user who may not
read them, and both viewports without sideways scroll with these views open.
Screenshots go to tests/artifacts/ (ignored by git, kept after the run)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from webtest import (
    ARTIFACTS,
    TIMEOUT_MS,
    chromium,
    needs_chromium,
    page_errors,
    start_web_jetd,
    until,
    user_add,
)

from peer import PeerAsync

playwright_api = pytest.importorskip("playwright.async_api", reason="playwright is not installed")

VIEWPORTS = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}

pytestmark = needs_chromium


@contextlib.asynccontextmanager
async def _console(web: tuple[str, int], viewport: dict[str, int], search: str = "") -> AsyncIterator[Any]:
    """The console, live, at ``viewport``; the page must raise no JavaScript error (nor log
    one, but for the HTTP 403 of /registry.json under --auth) until the block ends."""
    async with chromium() as browser:
        page = await browser.new_page(viewport=viewport)
        errors = page_errors(page)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "403" not in m.text else None)
        await page.goto(f"http://{web[0]}:{web[1]}/")
        await until(page, "document.getElementById('status').textContent.startsWith('live')")
        if search:
            await page.fill("#search", search)
        yield page
        assert not errors, errors


def _rate(key: str) -> str:
    return f"document.querySelector('.node[data-key=\"{key}\"] .rate')?.textContent"


def test_update_rate_per_key_shows_and_decays(start_jetd):
    """A key changed about 10 times a second shows a rate in its row ("9.8/s"); a quiet
    key beside it shows none; once the changes stop, the rate falls and is gone."""
    daemon = start_web_jetd(start_jetd)

    async def run() -> None:
        owner = await PeerAsync.connect(*daemon.address, name="plant")
        fast = await owner.add_state("plant/fast", 0)
        await owner.add_state("plant/quiet", 0)
        async with _console(daemon.web, VIEWPORTS["desktop"], "plant/") as page:
            await page.locator('.node[data-key="plant/fast"]').wait_for(timeout=TIMEOUT_MS)
            assert await page.evaluate(f"() => {_rate('plant/fast')}") == ""
            loop = asyncio.get_running_loop()
            start = loop.time()
            sent = 0
            while loop.time() - start < 3.0:
                sent += 1
                await fast.notify(sent)
                await asyncio.sleep(0.1)
            sent_rate = sent / (loop.time() - start)
            await until(page, f"/^[0-9.]+\\/s$/.test({_rate('plant/fast')} ?? '')")
            shown = await page.evaluate(f"() => {_rate('plant/fast')}")
            rate = float(re.fullmatch(r"([0-9.]+)/s", shown).group(1))  # type: ignore[union-attr]
            # The page's estimate of what was sent (a busy machine delays events, both ways).
            assert sent_rate / 3 <= rate <= sent_rate * 3, (shown, sent_rate)
            assert await page.evaluate(f"() => {_rate('plant/quiet')}") == ""
            # The rate falls once the key is quiet, and is gone after a while (about 13 s
            # at a decay time of 4 s): nothing is shown for a key that no longer changes.
            await until(page, f"parseFloat({_rate('plant/fast')} || '0') < {rate}")
            await until(page, f"{_rate('plant/fast')} === ''", timeout_ms=60_000)
        await owner.close()

    asyncio.run(run())


def test_peers_and_daemon_not_available_to_a_user_who_may_not_read_them(start_jetd, tmp_path):
    """Anonymous may read plant/ only: both views say plainly that the figures are not
    available, with no error (and the tree works as before)."""
    users = tmp_path / "users.toml"
    user_add(users, "admin", "admin-pw", "--own", "", "--read", "", "--write", "")
    text = users.read_text()
    users.write_text(text + '\n[anonymous]\nread = ["plant/"]\n' if "[anonymous]" not in text
                     else text.replace("[anonymous]", '[anonymous]\nread = ["plant/"]', 1))
    daemon = start_web_jetd(start_jetd, "--auth", str(users))

    async def run() -> None:
        owner = await PeerAsync.connect(*daemon.address, name="plant", user="admin", password="admin-pw")
        await owner.add_state("plant/temp", 1)
        async with _console(daemon.web, VIEWPORTS["desktop"]) as page:
            await until(page, "document.getElementById('status').textContent === 'live (anonymous)'")
            for view in ("peers", "daemon"):
                await page.click(f"#views button[data-view={view}]")
                line = f"#{view}-pane .unavailable"
                await until(page, f"document.querySelector('{line}').textContent.startsWith('Not available')")
                assert "may not read" in (await page.text_content(line) or "")
                assert await page.is_visible(line)
            await page.click("#views button[data-view=tree]")
            await page.locator('.node[data-key="plant"]').wait_for(timeout=TIMEOUT_MS)
        await owner.close()

    asyncio.run(run())


async def _no_sideways_scroll(page: Any, name: str) -> None:
    await page.wait_for_timeout(100)  # a layout pass
    sizes = await page.evaluate(
        "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth,"
        " ...[...document.querySelectorAll('.pane:not([hidden])')].flatMap((p) => [p.scrollWidth, p.clientWidth])]"
    )
    for i in range(0, len(sizes), 2):
        assert sizes[i] <= sizes[i + 1], (name, sizes)


def test_views_open_at_both_viewports_without_sideways_scroll(start_jetd):
    """Keys (with rates), Peers and Daemon at 1280x800 and 390x844: nothing scrolls
    sideways and the tabs are on screen. Screenshots are kept."""
    daemon = start_web_jetd(start_jetd)

    async def run() -> None:
        owner = await PeerAsync.connect(*daemon.address, name="plant-" + "long-name-" * 8)
        temp = await owner.add_state("plant/line3/temperature/sensor-" + "x" * 60, 20.5)
        for i in range(25):
            await owner.add_state(f"plant/line3/s{i:02d}", i)
        async with _console(daemon.web, VIEWPORTS["desktop"], "plant/") as page:
            for n in range(15):
                await temp.notify(20.5 + n)
                await asyncio.sleep(0.05)
            for name, viewport in VIEWPORTS.items():
                await page.set_viewport_size(viewport)
                for view in ("tree", "peers", "daemon"):
                    await page.click(f"#views button[data-view={view}]")
                    await _no_sideways_scroll(page, f"{name} {view}")
                    for part in ("#views", "#status", "#counts"):
                        box = await page.locator(part).bounding_box()
                        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"], (
                            name, view, part, box)
                    ARTIFACTS.mkdir(exist_ok=True)
                    await page.screenshot(path=str(ARTIFACTS / f"console-{view}-{name}.png"), full_page=True)
        await owner.close()

    asyncio.run(run())
