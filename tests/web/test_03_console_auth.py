"""The web console against ``jetd --auth`` in real Chromium: without a login it says that
authentication is required, a wrong password is shown as AUTH_FAILED, a user made with
``jetd user add`` sees what it may read, and a set outside its ``write`` shows
NOT_AUTHORIZED. A screenshot is saved under tests/artifacts/ (ignored by git)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from webtest import start_web_jetd

from peer import PeerAsync

playwright_api = pytest.importorskip("playwright.async_api", reason="playwright is not installed")

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parent.parent.parent
ARTIFACTS = REPO / "tests" / "artifacts"
TIMEOUT_MS = 15_000

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM}")


def _user_add(users: Path, name: str, password: str, *grants: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "jetd", "user", "add", str(users), name, *grants, "--password-stdin"],
        input=password + "\n", capture_output=True, text=True, cwd=REPO, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr


def test_console_login_under_auth(start_jetd, tmp_path):
    users = tmp_path / "users.toml"
    _user_add(users, "admin", "admin-pw", "--own", "", "--read", "", "--write", "")
    _user_add(users, "viewer", "viewer-pw", "--read", "plant/")
    daemon = start_web_jetd(start_jetd, "--auth", str(users), "--auth-failure-delay", "0.05")
    host, port = daemon.web

    async def run() -> None:
        owner = await PeerAsync.connect(*daemon.address, name="plant", user="admin", password="admin-pw")
        temp = await owner.add_state("plant/temp", 20.5, on_set=lambda v: v)
        await owner.add_state("secret/code", "1234")
        async with playwright_api.async_playwright() as p:
            browser = await p.chromium.launch(
                executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
            )
            page = await browser.new_page(viewport={"width": 1200, "height": 700})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            await page.goto(f"http://{host}:{port}/")
            # Anonymous: nothing readable, and the page says why.
            await page.wait_for_function(
                "() => " "document.getElementById('status').textContent.includes('log in')", timeout=TIMEOUT_MS
            )
            assert await page.is_visible("#login")
            assert "NOT_AUTHORIZED" in (await page.text_content("#more") or "")
            # A wrong password.
            await page.fill("#login input[name=user]", "viewer")
            await page.fill("#login input[name=password]", "wrong")
            await page.click("#login button")
            await page.wait_for_function(
                "() => " "document.querySelector('#login .error')?.textContent.includes('AUTH_FAILED')", timeout=TIMEOUT_MS
            )
            # The right one: the viewer sees plant/, not secret/.
            await page.fill("#login input[name=password]", "viewer-pw")
            await page.click("#login button")
            await page.wait_for_function(
                "() => " "document.getElementById('status').textContent === 'live as viewer'", timeout=TIMEOUT_MS
            )
            await page.wait_for_function(
                "() => " "document.querySelector('#counts')?.textContent.startsWith('1 states')", timeout=TIMEOUT_MS
            )
            await page.fill("#search", "plant/")
            row = page.locator('.node[data-key="plant/temp"]')
            await row.locator(".val").wait_for(timeout=TIMEOUT_MS)
            assert await page.locator('.node[data-key="secret/code"]').count() == 0
            await temp.notify(22.0)
            await page.wait_for_function(
                "() => " "document.querySelector('.node[data-key=\"plant/temp\"] .val')?.textContent === '22'",
                timeout=TIMEOUT_MS,
            )
            # A set outside its write permission: the typed error, named plainly.
            await row.click()
            await page.fill("form.act input[name=text]", "25")
            await page.click("form.act button")
            await page.wait_for_selector(".answer.error", timeout=TIMEOUT_MS)
            answer = await page.text_content(".answer") or ""
            assert "NOT_AUTHORIZED" in answer and "write plant/temp" in answer and "viewer" in answer, answer
            ARTIFACTS.mkdir(exist_ok=True)
            await page.screenshot(path=str(ARTIFACTS / "console-auth.png"))
            # Log out: back to the login form.
            await page.click("#logout")
            await page.wait_for_function(
                "() => " "document.getElementById('status').textContent.includes('log in')", timeout=TIMEOUT_MS
            )
            assert not errors, errors
            await browser.close()
        await owner.close()

    asyncio.run(run())
