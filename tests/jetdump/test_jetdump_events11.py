"""Issue 32: every event of protocol 1.1 (PROTOCOL.md 14.2, 14.4) is known to jetdump's
filters and statistics, and QUERY_ENTRY's entry kind does not overwrite the JSON
``kind`` field ("frame", "malformed", "truncated")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jdhelpers import jet_frames
from jdhelpers import jetdump_json
from jdhelpers import run_jetdump

from jetwire import EventCode
from tools.jetdump.synth import CaptureWriter
from tools.jetdump.synth import TcpSession
from tools.vectors import valid_vectors

INFO = bytes.fromhex("04000000100101001000000000000300046a657464")
# Events only the daemon sends, one valid vector per code (PROTOCOL.md 7.2, 14.2, 14.4).
EVENTS = {v["message"]["code"]: bytes.fromhex(v["hex"]) for v in valid_vectors()
          if v["message"].get("code", "").startswith(("FETCH_", "QUERY_"))}


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    path = tmp_path / "events11.pcap"
    with open(path, "wb") as f:
        session = TcpSession(CaptureWriter(f), ("127.0.0.1", 40001), ("127.0.0.1", 11124))
        session.handshake()
        session.send(1, INFO)
        for frame in EVENTS.values():
            session.send(1, frame)
        session.close()
    return path


def test_every_daemon_event_code_has_a_vector() -> None:
    assert set(EVENTS) == {c.name for c in EventCode if c.name.startswith(("FETCH_", "QUERY_"))}


@pytest.mark.parametrize("code", sorted(EVENTS))
def test_function_filter_selects_each_event(capture: Path, code: str) -> None:
    frames = jet_frames(jetdump_json(str(capture), "--function", code))
    assert [f["code"] for f in frames] == [code]


def test_stats_count_each_event(capture: Path) -> None:
    result = run_jetdump("--stats", "--json", str(capture))
    assert result.returncode == 0, result.stderr
    functions = json.loads(result.stdout.splitlines()[-1])["functions"]
    for code in EVENTS:
        assert functions.get(code) == 1, (code, functions)


def test_query_entry_keeps_the_record_kind(capture: Path) -> None:
    entries = [f for f in jetdump_json(str(capture)) if f.get("code") == "QUERY_ENTRY"]
    assert len(entries) == 1
    entry = entries[0]
    assert entry["kind"] == "frame"  # the documented record kind, not the entry's
    assert entry["entry_kind"] in ("STATE", "METHOD", "NODE")
    assert "entry_kind" in entry["offsets"] and "kind" not in entry["offsets"]


def test_verbose_tree_names_the_entry_kind(capture: Path) -> None:
    result = run_jetdump("-V", "--function", "QUERY_ENTRY", str(capture))
    assert result.returncode == 0, result.stderr
    assert "entry_kind: STATE (0x01)" in result.stdout or "entry_kind: NODE (0x03)" in result.stdout, result.stdout
