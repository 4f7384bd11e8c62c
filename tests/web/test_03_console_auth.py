"""The web console against ``jetd --auth`` in real Chromium: without a login it says that
authentication is required, a wrong password is shown as AUTH_FAILED, a user made with
``jetd user add`` sees what it may read, and a set outside its ``write`` shows
NOT_AUTHORIZED. A screenshot is saved under tests/artifacts/ (ignored by git)."""

from __future__ import annotations

import asyncio

import pytest
from webtest import ARTIFACTS
from webtest import TIMEOUT_MS
from webtest import act_from_page
from webtest import chromium
from webtest import needs_chromium
from webtest import page_errors
from webtest import start_web_jetd
from webtest import until
from webtest import user_add

from peer import PeerAsync

playwright_api = pytest.importorskip("playwright.async_api", reason="playwright is not installed")


pytestmark = needs_chromium


def test_console_login_under_auth(start_jetd, tmp_path):
    users = tmp_path / "users.toml"
    user_add(users, "admin", "admin-pw", "--own", "", "--read", "", "--write", "")
    user_add(users, "viewer", "viewer-pw", "--read", "plant/")
    daemon = start_web_jetd(start_jetd, "--auth", str(users), "--auth-failure-delay", "0.05")
    host, port = daemon.web

    async def run() -> None:
        owner = await PeerAsync.connect(*daemon.address, name="plant", user="admin", password="admin-pw")
        temp = await owner.add_state("plant/temp", 20.5, on_set=lambda v: v)
        await owner.add_state("secret/code", "1234")
        async with chromium() as browser:
            page = await browser.new_page(viewport={"width": 1200, "height": 700})
            errors = page_errors(page)
            await page.goto(f"http://{host}:{port}/")
            # Anonymous: nothing readable, and the page says why.
            await until(page, "document.getElementById('status').textContent.includes('log in')")
            assert await page.is_visible("#login")
            assert "NOT_AUTHORIZED" in (await page.text_content("#more") or "")
            # A wrong password.
            await page.fill("#login input[name=user]", "viewer")
            await page.fill("#login input[name=password]", "wrong")
            await page.click("#login button")
            await until(page, "document.querySelector('#login .error')?.textContent.includes('AUTH_FAILED')")
            # The right one: the viewer sees plant/, not secret/.
            await page.fill("#login input[name=password]", "viewer-pw")
            await page.click("#login button")
            await until(page, "document.getElementById('status').textContent === 'live as viewer'")
            await until(page, "document.querySelector('#counts')?.textContent.startsWith('1 states')")
            await page.fill("#search", "plant/")
            row = page.locator('.node[data-key="plant/temp"]')
            await row.locator(".val").wait_for(timeout=TIMEOUT_MS)
            assert await page.locator('.node[data-key="secret/code"]').count() == 0
            await temp.notify(22.0)
            await until(page, "document.querySelector('.node[data-key=\"plant/temp\"] .val')?.textContent === '22'")
            # A set outside its write permission: the typed error, named plainly.
            answer = await act_from_page(page, row, "25", "error")
            assert "NOT_AUTHORIZED" in answer and "write plant/temp" in answer and "viewer" in answer, answer
            ARTIFACTS.mkdir(exist_ok=True)
            await page.screenshot(path=str(ARTIFACTS / "console-auth.png"))
            # Log out: back to the login form.
            await page.click("#logout")
            await until(page, "document.getElementById('status').textContent.includes('log in')")
            assert not errors, errors
        await owner.close()

    asyncio.run(run())
