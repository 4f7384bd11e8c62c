"""The ingest report tells the truth, checked in the collected summary and in the HTML
rendered by a real headless Chromium (Playwright), whose screenshot is kept.

Two daemon runs 10 minutes apart (a restart, an idle gap), records with damage,
requests that time out. The screenshot is written to pytest's tmp dir and, if
``$JET_TEST_ARTIFACTS`` is set, copied there.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spark

CHROMIUM = "/usr/bin/chromium"


def _report(spark: Any, tmp_path: Path) -> tuple[Any, Path, int]:
    from jetd_logs import RUN
    from jetd_logs import JetdLog

    from tools.ingest.cli import ingest_once
    from tools.ingest.cli import load_tables
    from tools.ingest.report import collect_summary
    from tools.ingest.report import write_report

    logs, wh = tmp_path / "logs", tmp_path / "wh"
    logs.mkdir()
    JetdLog(41, 500).write(logs / "jetd-a.jetlog", damage=3)
    restart = RUN + 600 * 10**9
    seg = JetdLog(42, 300, start_ns=restart).write(logs / "jetd-b.jetlog", created_ns=restart)
    seg.write_bytes(seg.read_bytes()[:-5])  # the daemon died mid-record
    ingest_once(spark, str(logs), wh)
    tables = load_tables(spark, wh)
    summary = collect_summary(tables, source=str(logs))
    write_report(summary, wh / "report.html")
    corrupt = tables["frames"].filter("corrupt IS NOT NULL").count()
    return summary, wh / "report.html", corrupt


def test_report_tells_the_truth_and_renders_in_chromium(spark: Any, tmp_path: Path) -> None:
    from tools.ingest.report import TOP

    summary, page, corrupt = _report(spark, tmp_path)
    # Damage first, counted.
    found = dict(zip(summary.damage["what"], summary.damage["count"], strict=True))
    assert corrupt > 0 and found.get("damaged region", 0) + found.get("truncated record", 0) == corrupt, found
    assert summary.damaged
    # The header: where from, and when.
    assert summary.source.endswith("logs")
    assert summary.first is not None and summary.last is not None
    assert (summary.last - summary.first).total_seconds() >= 600
    # Idle time is zero, not a straight line across the gap; the restart is marked.
    assert (summary.per_second["events"] == 0).sum() > 0
    assert len(summary.restarts) == 1 and summary.runs == 2
    # Latency by status, capped: TIMEOUTs have rows of their own, not a share of a p99.
    lat = summary.latency
    assert len(lat[lat["status"] == "OK"]) <= TOP and len(lat[lat["status"] != "OK"]) <= TOP
    assert len(lat[lat["status"] == "TIMEOUT"]) and len(lat[lat["status"] == "OK"])
    assert set(summary.latencies_ms["status"]) >= {"OK", "TIMEOUT"}

    playwright = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.skip("needs /usr/bin/chromium")
    shot = tmp_path / "report.png"
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            tab = browser.new_page(viewport={"width": 1200, "height": 900})
            tab.goto(page.as_uri())
            tab.wait_for_load_state("load")
            # Every plot decoded; the damage box is the first thing under the header.
            widths = tab.eval_on_selector_all("img", "imgs => imgs.map(i => i.naturalWidth)")
            assert len(widths) == 3 and all(w > 100 for w in widths), widths
            damage = tab.locator("#damage")
            assert damage.is_visible() and "Damage found" in damage.inner_text()
            box = damage.bounding_box()
            rows_title = tab.get_by_role("heading", name="Rows per table").bounding_box()
            assert box is not None and rows_title is not None and box["y"] < rows_title["y"] < 900
            assert str(tmp_path / "logs") in tab.locator("#source").inner_text()
            assert "2026-01-01" in tab.locator("#range").inner_text()
            tab.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
    artifacts = os.environ.get("JET_TEST_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(artifacts) / "ingest-report.png")
