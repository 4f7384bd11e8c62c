"""tools.chaos at a hundredth of its size: every attack runs against a real jetd, prints
its row, and everything it started is gone afterwards. It keeps the script from rotting;
what the attacks measure is asserted by the jetd tests, never here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from tools.chaos.attacks import ATTACKS

REPO = Path(__file__).resolve().parent.parent


def _jetd_processes(marker: str) -> set[int]:
    """Pids of the `python -m jetd` processes whose environment carries ``marker`` (the
    daemons of this test's chaos run, not those of tests running beside it)."""
    pids = set()
    tag = f"JET_CHAOS_SMOKE={marker}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmdline[1:3] == [b"-m", b"jetd"] and tag in environ:
                pids.add(int(entry.name))
    return pids


def test_every_attack_prints_a_row_and_exits_0() -> None:
    marker = uuid.uuid4().hex  # the chaos harness passes its environment to its daemons
    result = subprocess.run(
        [sys.executable, "-m", "tools.chaos", "--scale", "0.01", "--json"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "JET_CHAOS_SMOKE": marker},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["attack"] for row in rows] == list(ATTACKS)
    for row in rows:
        assert not row["outcome"].startswith(("error", "skipped")), row
        assert isinstance(row["rss_peak_mb"], float) and row["rss_peak_mb"] > 0, row
    watched = [row for row in rows if row["attack"] not in ("shutdown-close", "fd-limit", "tls-handshakes")]
    assert all(isinstance(row["health_max_ms"], float) for row in watched), watched
    assert "%" in next(row["log_lost"] for row in rows if row["attack"] == "fsync-always")
    assert not _jetd_processes(marker)  # every daemon it started has been stopped


def test_connect_mode_skips_what_needs_its_own_daemon(start_jetd) -> None:  # type: ignore[no-untyped-def]
    daemon = start_jetd()
    result = subprocess.run(
        [sys.executable, "-m", "tools.chaos", "--scale", "0.01", "--json", "--connect", f"127.0.0.1:{daemon.port}",
         "--pid", str(daemon.proc.pid), "--attack", "get-400", "--attack", "fsync-always"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    get, fsync = (json.loads(line) for line in result.stdout.splitlines())
    assert get["rss_peak_mb"] > 0 and "answers of" in get["outcome"]
    assert fsync["outcome"].startswith("skipped")
    assert daemon.stop() == 0
