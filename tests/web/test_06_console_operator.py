"""Issue 33, the console as an operator uses it, in real Chromium (Playwright) against a
real jetd: a Set that sends the state's type, pretty JSON, copy, a bad search, the empty
state, the "call any method by key" form, the badge after a failed login, long keys, the
phone layout; and the Todo page's first connect. Screenshots go to tests/artifacts/
(ignored by git, kept after the run)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from webtest import ARTIFACTS
from webtest import TIMEOUT_MS
from webtest import chromium
from webtest import needs_chromium
from webtest import page_errors
from webtest import start_web_jetd
from webtest import until
from webtest import user_add

from peer import PeerAsync

playwright_api = pytest.importorskip("playwright.async_api", reason="playwright is not installed")

LONG_KEY = "plant/" + "very-long-segment-" * 16 + "end"
VIEWPORTS = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}

pytestmark = needs_chromium


async def _open(page: Any, web: tuple[str, int], search: str = "") -> None:
    await page.goto(f"http://{web[0]}:{web[1]}/")
    await until(page, "document.getElementById('status').textContent.startsWith('live')")
    if search:
        await page.fill("#search", search)


@contextlib.asynccontextmanager
async def _console(web: tuple[str, int], viewport: dict[str, int], search: str = "") -> AsyncIterator[Any]:
    """The console, live, at ``viewport`` and showing ``search``; the page must raise no
    JavaScript error until the block ends."""
    async with chromium() as browser:
        page = await browser.new_page(viewport=viewport)
        errors = page_errors(page)
        await _open(page, web, search)
        yield page
        assert not errors, errors


def _row(page: Any, key: str) -> Any:
    return page.locator(f'.node[data-key="{key}"]')


def test_set_sends_the_states_type(start_jetd):
    """An int state gets INT64 from "5" (it got FLOAT64 5.0, which owners of int states
    refuse); a float state FLOAT64, a bool BOOL, a string the text itself."""
    daemon = start_web_jetd(start_jetd)

    async def run() -> None:
        owner = await PeerAsync.connect(*daemon.address, name="plant")
        asked: list[Any] = []

        def record(value: Any) -> Any:
            asked.append(value)
            return value

        await owner.add_state("plant/count", 3, on_set=record)
        await owner.add_state("plant/ratio", 0.5, on_set=record)
        await owner.add_state("plant/on", False, on_set=record)
        await owner.add_state("plant/label", "a", on_set=record)
        async with _console(daemon.web, VIEWPORTS["desktop"], "plant/") as page:
            for key, text, expected in (("plant/count", "5", 5), ("plant/ratio", "2", 2.0), ("plant/on", "true", True),
                                        ("plant/label", "hello world", "hello world"), ("plant/label", '"quoted"', "quoted")):
                await _row(page, key).click()
                await page.fill("form.act input[name=text]", text)
                await page.click("form.act button")
                await page.wait_for_selector(".answer.ok", timeout=TIMEOUT_MS)
                got = asked.pop()
                assert got == expected and type(got) is type(expected), (key, text, got)
            await until(page, "document.querySelector('.node[data-key=\"plant/count\"] .val')?.textContent === '5'")
            # Not an integer for an int state: said at once, nothing sent.
            await _row(page, "plant/count").click()
            await page.fill("form.act input[name=text]", "5.5")
            await page.click("form.act button")
            await page.wait_for_selector(".answer.error", timeout=TIMEOUT_MS)
            assert "INT64" in (await page.text_content(".answer") or "")
            assert asked == []
            # The type can still be chosen by hand.
            await page.select_option("form.act select", "float64")
            await page.fill("form.act input[name=text]", "6")
            await page.click("form.act button")
            await page.wait_for_selector(".answer.error, .answer.ok", timeout=TIMEOUT_MS)
            assert asked == [6.0] and type(asked[0]) is float
        await owner.close()

    asyncio.run(run())


async def _plant(daemon: Any) -> Any:
    """An owner with a JSON state, a long key, a plain state and a method."""
    owner = await PeerAsync.connect(*daemon.address, name="plant")
    await owner.add_state("plant/config", DOCUMENT)
    await owner.add_state(LONG_KEY, 42.5)
    await owner.add_state("plant/temp", 20.5)
    await owner.add_method("plant/reset", lambda arg: "reset done")
    return owner


DOCUMENT = {"line": 3, "sensors": [{"id": "t1", "ok": True}], "note": None, "big": 12345678901234567890}


def test_json_pretty_with_copy_value_and_copy_key(start_jetd):
    daemon = start_web_jetd(start_jetd)

    async def run() -> None:
        owner = await _plant(daemon)
        async with chromium() as browser:
            context = await browser.new_context(viewport=VIEWPORTS["desktop"])
            await context.grant_permissions(["clipboard-read", "clipboard-write"])
            page = await context.new_page()
            errors = page_errors(page)
            await _open(page, daemon.web, "plant/")
            await _row(page, "plant/config").click()
            pretty = json.dumps(DOCUMENT, indent=2)  # the big integer keeps its 20 digits
            assert await page.text_content("#detail .value") == pretty
            await page.click("#detail button.copy-value")
            assert await page.evaluate("() => navigator.clipboard.readText()") == pretty
            await page.click("#detail button.copy-key")
            assert await page.evaluate("() => navigator.clipboard.readText()") == "plant/config"
            assert not errors, errors
        await owner.close()

    asyncio.run(run())


def test_call_any_method_form_stays_while_a_key_is_selected(start_jetd):
    daemon = start_web_jetd(start_jetd)

    async def run() -> None:
        owner = await _plant(daemon)
        async with _console(daemon.web, VIEWPORTS["desktop"], "plant/") as page:
            await _row(page, "plant/temp").click()
            assert await page.is_visible("#call-any")
            await page.fill("#call-any input[name=key]", "plant/reset")
            await page.click("#call-any button")
            await page.fill("form.act input[name=text]", "1")
            await page.click("form.act button")
            await page.wait_for_selector(".answer.ok", timeout=TIMEOUT_MS)
            assert await page.text_content(".answer") == 'OK: "reset done"'
            assert await page.is_visible("#call-any")
        await owner.close()

    asyncio.run(run())


def test_a_typo_in_a_value_filter_is_an_error(start_jetd):
    """v>>3 silently became v > the string ">3"."""
    daemon = start_web_jetd(start_jetd)

    async def run() -> None:
        owner = await _plant(daemon)
        async with _console(daemon.web, VIEWPORTS["desktop"], "plant/") as page:
            for typo in ("v>>3", "value<=>1", "score==!2"):
                await page.fill("#search", f"plant/ {typo}")
                await until(page, "document.getElementById('more').textContent.includes('cannot read the search')")
                assert typo in (await page.text_content("#more") or "")
            await page.fill("#search", "plant/ value>=20")  # a good one still works
            await until(page, "document.querySelectorAll('#tree .node').length === 2")
        await owner.close()

    asyncio.run(run())


def test_long_keys_and_a_phone_width_need_no_sideways_scroll(start_jetd):
    """Both viewports: nothing scrolls sideways, a long key's value and owner stay in the
    row, the counts, badge and search are on screen. Screenshots are kept."""
    daemon = start_web_jetd(start_jetd)

    async def run() -> None:
        owner = await _plant(daemon)
        async with _console(daemon.web, VIEWPORTS["desktop"], "plant/") as page:
            for name, viewport in VIEWPORTS.items():
                await page.set_viewport_size(viewport)
                await _row(page, LONG_KEY).click()
                await _row(page, LONG_KEY).locator(".val").wait_for(timeout=TIMEOUT_MS)
                await page.wait_for_timeout(100)  # a layout pass
                width = viewport["width"]
                overflow = await page.evaluate(
                    "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth,"
                    " document.getElementById('tree-pane').scrollWidth, document.getElementById('tree-pane').clientWidth]"
                )
                assert overflow[0] <= overflow[1] and overflow[2] <= overflow[3], (name, overflow)
                pane = await page.locator("#tree-pane").bounding_box()
                row = _row(page, LONG_KEY)
                for part in (".val", ".owner"):
                    box = await row.locator(part).bounding_box()
                    assert box is not None and box["width"] > 20, (name, part, box)
                    assert box["x"] + box["width"] <= pane["x"] + pane["width"] + 1, (name, part, box, pane)
                assert await row.locator(".val").text_content() == "42.5"
                for part in ("#counts", "#status", "#search"):
                    box = await page.locator(part).bounding_box()
                    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, (name, part, box)
                ARTIFACTS.mkdir(exist_ok=True)
                await page.screenshot(path=str(ARTIFACTS / f"console-{name}.png"), full_page=True)
        await owner.close()

    asyncio.run(run())


def test_empty_bus_is_said_plainly(start_jetd):
    daemon = start_web_jetd(start_jetd)

    async def run() -> None:
        async with _console(daemon.web, VIEWPORTS["phone"]) as page:
            await until(page, "document.getElementById('more').textContent.includes('Nothing on the bus yet')")
            text = await page.inner_text("main")
            for jargon in ("PROTOCOL.md", "FETCH_STATES", "registry.json", "query fetch"):
                assert jargon not in text, (jargon, text)
            ARTIFACTS.mkdir(exist_ok=True)
            await page.screenshot(path=str(ARTIFACTS / "console-empty-phone.png"))
            # The first key replaces the message.
            owner = await PeerAsync.connect(*daemon.address, name="plant")
            await owner.add_state("plant/temp", 1)
            await until(page, "!document.getElementById('more').textContent.includes('Nothing on the bus yet')")
            await owner.close()

    asyncio.run(run())


def test_failed_login_keeps_the_anonymous_badge(start_jetd, tmp_path):
    """Under --auth with anonymous read: a wrong password leaves the anonymous connection
    live, and the badge says so (it turned red)."""
    users = tmp_path / "users.toml"
    user_add(users, "admin", "admin-pw", "--own", "", "--read", "", "--write", "")
    text = users.read_text()
    users.write_text(text + '\n[anonymous]\nread = ["plant/"]\n' if "[anonymous]" not in text
                     else text.replace("[anonymous]", '[anonymous]\nread = ["plant/"]', 1))
    daemon = start_web_jetd(start_jetd, "--auth", str(users), "--auth-failure-delay", "0.05")

    async def run() -> None:
        owner = await PeerAsync.connect(*daemon.address, name="plant", user="admin", password="admin-pw")
        temp = await owner.add_state("plant/temp", 1)
        async with _console(daemon.web, VIEWPORTS["desktop"], "plant/") as page:
            await until(page, "document.getElementById('status').textContent === 'live (anonymous)'")
            await page.fill("#login input[name=user]", "admin")
            await page.fill("#login input[name=password]", "wrong")
            await page.click("#login button")
            await until(page, "document.querySelector('#login .error')?.textContent.includes('AUTH_FAILED')")
            assert await page.text_content("#status") == "live (anonymous)"
            assert "open" in (await page.get_attribute("#status", "class") or "")
            await temp.notify(2)  # and it is live indeed
            await until(page, "document.querySelector('.node[data-key=\"plant/temp\"] .val')?.textContent === '2'")
        await owner.close()

    asyncio.run(run())


def test_plot_moves_with_the_value(start_jetd):
    """The selected numeric state is plotted (uPlot, vendored) with last/min/max, and the
    plot changes as the owner notifies; a JSON object's numeric fields are plotted too."""
    daemon = start_web_jetd(start_jetd)

    async def run() -> None:
        owner = await PeerAsync.connect(*daemon.address, name="plant")
        temp = await owner.add_state("plant/temp", 20)
        line = await owner.add_state("plant/line", {"speed": 1.5, "count": 10, "name": "l1"})
        async with _console(daemon.web, VIEWPORTS["desktop"], "plant/") as page:
            console_errors: list[str] = []
            page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
            await _row(page, "plant/temp").click()
            stats = "document.querySelector('#detail .plot-stats')?.textContent ?? ''"
            await until(page, f"({stats}).startsWith('value: last 20 ')")
            canvas = page.locator("#detail figure.plot canvas")
            before = await canvas.screenshot()
            for value in (25, 19, 23):
                await temp.notify(value)
                await until(page, f"({stats}).startsWith('value: last {value} ')")
                await page.wait_for_timeout(150)  # separate samples in time
            assert (await page.text_content("#detail .plot-stats") or "").startswith("value: last 23 · min 19 · max 25")
            # Every change counts in the rate, even those one frame conflates for the plot.
            # 3 (fewer only on a machine so slow that the first is older than 10 s already)
            rate = await page.text_content("#detail .rate") or ""
            assert re.fullmatch(r"[123] changes? in the last 10 s \(0\.[123]/s\)", rate), rate
            for value in range(100, 120):
                await temp.notify(value)
            await until(page, "parseInt(document.querySelector('#detail .rate').textContent) >= 20")
            after = await canvas.screenshot()
            assert after != before, "the plot did not change with the value"
            ARTIFACTS.mkdir(exist_ok=True)
            await page.screenshot(path=str(ARTIFACTS / "console-plot.png"))
            # A JSON object: one line per numeric field; non-numeric ones are left out.
            await _row(page, "plant/line").click()
            await until(page, f"({stats}).startsWith('speed: last 1.5 · min 1.5 · max 1.5; count: last 10 ')")
            await line.notify({"speed": 2.5, "count": 7, "name": "l1"})
            await until(page, f"({stats}).startsWith('speed: last 2.5 · min 1.5 · max 2.5; count: last 7 · min 7 · max 10')")
            # A string state has no plot.
            await owner.add_state("plant/mode", "auto")
            await _row(page, "plant/mode").click()
            await page.wait_for_selector("#detail figure.plot", state="hidden", timeout=TIMEOUT_MS)
            assert not console_errors, console_errors
        await owner.close()

    asyncio.run(run())
