"""The Lua dissector on the frames of protocol 1.1 queries (PROTOCOL.md 14): every valid
vector of section 14 decodes, every invalid one is reported malformed, under tshark."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from jdhelpers import LUA
from jdhelpers import TSHARK

from tools.jetdump.synth import CaptureWriter
from tools.jetdump.synth import TcpSession
from tools.vectors import invalid_vectors
from tools.vectors import valid_vectors

pytestmark = [pytest.mark.tshark, pytest.mark.skipif(TSHARK is None, reason="tshark is not installed")]

INFO = bytes.fromhex("04000000100101001000000000000300046a657464")


def _capture(path: Path, frames: list[bytes]) -> None:
    with open(path, "wb") as f:
        session = TcpSession(CaptureWriter(f), ("127.0.0.1", 40001), ("127.0.0.1", 11124))
        session.handshake()
        session.send(1, INFO)
        for frame in frames:
            session.send(0 if frame[0] == 1 else 1, frame)
        session.close()


def _infos(path: Path) -> list[str]:
    result = subprocess.run(
        [str(TSHARK), "-X", f"lua_script:{LUA}", "-r", str(path), "-Y", "jet", "-T", "fields", "-e", "_ws.col.Info"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    return [line for line in result.stdout.splitlines() if line][1:]  # after the INFO


def test_query_frames_decode_and_bad_ones_are_malformed(tmp_path: Path) -> None:
    good = [v for v in valid_vectors() if v["section"].startswith("14")]
    _capture(tmp_path / "good.pcap", [bytes.fromhex(v["hex"]) for v in good])
    infos = _infos(tmp_path / "good.pcap")
    assert len(infos) == len(good)
    for vector, info in zip(good, infos, strict=True):
        name = vector["message"].get("function") or vector["message"]["code"]
        assert name in info and "MALFORMED" not in info, (vector["name"], info)
    assert 'starts_with("players/") gender EQ STRING "female" sort=score desc 1..10' in infos[0]
    bad = [v for v in invalid_vectors() if v["section"].startswith("14")]
    _capture(tmp_path / "bad.pcap", [bytes.fromhex(v["hex"]) for v in bad])
    infos = _infos(tmp_path / "bad.pcap")
    assert len(infos) == len(bad) and all(info.startswith("MALFORMED") for info in infos), infos
