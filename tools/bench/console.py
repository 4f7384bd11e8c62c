"""The web console under load (issues 16 and 33): 10,000 states and 1,000 changes per second.

Starts jetd with ``--http-port 0``, an owner peer (TCP) with ``--states`` states, and the
console (``/``) in Debian's Chromium through Playwright. Loads the page ``--runs`` times,
each in a fresh browser context (nothing cached), and reports the median, min and max
time from navigation until the page's count says every state is there (issue 33's target:
10,000 states in 2 s or less on 2 cores), with the load average it ran under. Then
notifies ``--rate`` changes per second (spread over the states, a tenth of them to keys on
screen) for ``--seconds`` (0: not at all) and reports, from the page, the gaps between
animation frames (requestAnimationFrame) and how long the page's main thread was blocked
(long tasks): a responsive page keeps frames near 16.7 ms.

    python -m tools.bench.console [--states 10000] [--runs 5] [--rate 1000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from typing import Any
from typing import Optional

from peer import PeerAsync

from .daemon_procs import REPO

CHROMIUM = "/usr/bin/chromium"

_PROBE = """() => {
  window.__gaps = []; window.__long = [];
  let last = performance.now();
  const tick = (t) => { window.__gaps.push(t - last); last = t; requestAnimationFrame(tick); };
  requestAnimationFrame(tick);
  new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__long.push(e.duration); })
    .observe({ entryTypes: ["longtask"] });
}"""


_RATE_PASS = """() => {
  const times = [];
  for (let i = 0; i < 21; i++) {
    const t0 = performance.now();
    window.jetConsole.showRowRates();
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  return [document.querySelectorAll('#tree .node').length, times[10]];
}"""


async def run(states: int, rate: int, seconds: float, runs: int = 1) -> dict[str, float]:
    from playwright.async_api import async_playwright

    proc = subprocess.Popen(
        [sys.executable, "-m", "jetd", "--port", "0", "--http-port", "0", "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().strip().rpartition(":")[2])
        web = proc.stdout.readline().strip().removeprefix("web on ").rstrip("/")
        owner = await PeerAsync.connect("127.0.0.1", port, name="bench-owner")
        handles = []
        for start in range(0, states, 1000):
            handles += await asyncio.gather(*(
                owner.add_state(f"bench/{i // 100:03d}/{i:05d}", i) for i in range(start, min(states, start + 1000))
            ))
        result: dict[str, float] = {}
        async with async_playwright() as p:
            browser = await p.chromium.launch(
                executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
            )
            loads: list[float] = []
            load_before = os.getloadavg()[0]
            for n in range(runs):
                # A fresh context each time: nothing cached, as a first visit.
                context = await browser.new_context(viewport={"width": 1280, "height": 900})
                page = await context.new_page()
                t0 = time.perf_counter()
                await page.goto(f"{web}/")
                await page.wait_for_function(
                    # a function, not a string: the console's CSP forbids eval
                    f"() => document.querySelector('#counts').textContent.startsWith('{states} states')",
                    timeout=120_000, polling="raf",
                )
                loads.append(time.perf_counter() - t0)
                if n < runs - 1:
                    await context.close()
            result["page load until every state is shown, median [s]"] = statistics.median(loads)
            result["page load, min [s]"] = min(loads)
            result["page load, max [s]"] = max(loads)
            result["page loads"] = len(loads)
            result["load average (1 min) before the loads"] = load_before
            result["load average (1 min) after the loads"] = os.getloadavg()[0]
            if seconds <= 0:
                await browser.close()
                await owner.close()
                return result
            # Open a level so that changing rows are on screen.
            await page.click('.node[data-key="bench"]')
            await page.click('.node[data-key="bench/000"]')
            await page.evaluate(_PROBE)
            on_screen = handles[:100]
            sent = 0
            t0 = time.perf_counter()
            tick = 0.05
            while (now := time.perf_counter()) - t0 < seconds:
                due = int((now - t0) * rate)
                for n in range(sent, due):
                    state = on_screen[n % len(on_screen)] if n % 10 == 0 else handles[(n * 7919) % len(handles)]
                    state.notify_nowait(n)
                sent = due
                await owner.drain()
                await asyncio.sleep(tick)
            elapsed = time.perf_counter() - t0
            gaps: list[float] = await page.evaluate("() => window.__gaps.slice(1)")
            longs: list[float] = await page.evaluate("() => window.__long")
            shown = await page.evaluate(
                "() => document.querySelector('.node[data-key=\"bench/000/00000\"] .val').textContent"
            )
            result["changes sent per second"] = sent / elapsed
            result["animation frames per second"] = len(gaps) / elapsed
            result["frame gap median [ms]"] = statistics.median(gaps)
            result["frame gap p99 [ms]"] = sorted(gaps)[int(len(gaps) * 0.99)]
            result["frame gap max [ms]"] = max(gaps)
            result["main thread blocked by long tasks [% of time]"] = 100 * sum(longs) / 1000 / elapsed
            # The update rates of the rows on screen: one pass a second (issue 33).
            rows, pass_ms = await page.evaluate(_RATE_PASS)
            result["rows on screen"] = rows
            result["update-rate pass over them, median of 21 [ms]"] = pass_ms
            result["last value on screen is a recent one"] = float(int(shown or -1) > sent - 2 * rate)
            await browser.close()
        await owner.close()
        return result
    finally:
        proc.terminate()
        proc.wait(10)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--states", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=1000, help="changes per second")
    parser.add_argument("--seconds", type=float, default=5.0, help="of changes after the loads (0: none)")
    parser.add_argument("--runs", type=int, default=5, help="page loads, each in a fresh browser context")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be 1 or more")
    result: dict[str, Any] = asyncio.run(run(args.states, args.rate, args.seconds, args.runs))
    print(f"| console, {args.states} states, {args.runs} loads, {args.rate} changes/s for {args.seconds:g} s | value |")
    print("|---|---|")
    for name, value in result.items():
        print(f"| {name} | {value:,.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
