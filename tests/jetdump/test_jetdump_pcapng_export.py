"""``jetdump LOGDIR --write-pcapng FILE``: a real jetd's event log as pcapng, read back by
real tshark (with jet.lua) and by jetdump itself."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jdhelpers import LUA
from jdhelpers import RUN_TIMEOUT
from jdhelpers import TSHARK
from jdhelpers import jet_frames
from jdhelpers import jetdump_json
from jdhelpers import run_jetdump

from jetwire import AddState
from jetwire import Decoder
from jetwire import GetState
from jetwire import Info
from jetwire import Response
from jetwire import SetState
from jetwire import Value
from jetwire import encode


def _traffic(port: int) -> None:
    """A peer that owns a state and another that sets it (routed through the daemon)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as owner, \
            socket.create_connection(("127.0.0.1", port), timeout=5) as setter:
        owner.sendall(encode(Info("owner")) + encode(AddState(1, "x/t", Value.of(1))))
        owner_decoder, setter_decoder = Decoder(), Decoder()
        deadline = time.monotonic() + 10

        def until(sock: socket.socket, decoder: Decoder, want: Callable[[Any], bool]) -> Any:
            while time.monotonic() < deadline:
                decoder.receive_data(sock.recv(65536))
                for message in decoder.messages():
                    if want(message):
                        return message
            raise AssertionError("no answer")

        until(owner, owner_decoder, lambda m: isinstance(m, Response) and m.id == 1)
        setter.sendall(encode(Info("setter")) + encode(SetState(7, "x/t", Value.of("big" * 30_000))))
        routed = until(owner, owner_decoder, lambda m: isinstance(m, SetState))
        owner.sendall(encode(Response(routed.id)))  # type: ignore[attr-defined]
        until(setter, setter_decoder, lambda m: isinstance(m, Response) and m.id == 7)
        setter.sendall(encode(GetState(8, "x/none")))
        until(setter, setter_decoder, lambda m: isinstance(m, Response) and m.id == 8)


@pytest.mark.skipif(TSHARK is None, reason="tshark is not installed")
def test_event_log_as_pcapng_opens_in_tshark(tmp_path: Path, start_jetd: Callable[..., Any]) -> None:
    log_dir = tmp_path / "logs"
    daemon = start_jetd("--log-dir", str(log_dir), "--log-fsync", "always")
    _traffic(daemon.port)
    assert daemon.stop() == 0
    out = tmp_path / "log.pcapng"
    result = run_jetdump(str(log_dir), "--write-pcapng", str(out))
    assert result.returncode == 0, result.stderr
    from_log = jet_frames(jetdump_json(str(log_dir)))
    assert f"wrote {len(from_log)} frame(s) of 2 connection(s)" in result.stderr

    # jetdump reads the capture back: the same frames, at the daemon's times.
    from_capture = jet_frames(jetdump_json(str(out)))
    assert [(f["type"], f.get("function"), f.get("id"), f["direction"]) for f in from_capture] == \
        [(f["type"], f.get("function"), f.get("id"), f["direction"]) for f in from_log]
    assert [f["timestamp"] for f in from_capture] == pytest.approx([f["timestamp"] for f in from_log], abs=2e-6)

    # Real tshark with the dissector: two TCP streams, every frame decoded, the big SET
    # reassembled from its segments.
    assert TSHARK is not None
    shark = subprocess.run(
        [TSHARK, "-X", f"lua_script:{LUA}", "-r", str(out), "-Y", "jet", "-T", "json", "--no-duplicate-keys"],
        capture_output=True, text=True, errors="replace", timeout=RUN_TIMEOUT,
    )
    assert shark.returncode == 0, shark.stderr
    packets = json.loads(shark.stdout)
    streams = {p["_source"]["layers"]["tcp"]["tcp.stream"] for p in packets}
    assert len(streams) == 2
    pdus = 0
    for packet in packets:
        layer = packet["_source"]["layers"]["jet"]
        pdus += len(layer) if isinstance(layer, list) else 1
    assert pdus == len(from_log)
    assert "Malformed" not in shark.stdout


def test_write_pcapng_refuses_a_capture(tmp_path: Path) -> None:
    from tools.jetdump.synth import CaptureWriter
    from tools.jetdump.synth import TcpSession

    cap = tmp_path / "c.pcap"
    with open(cap, "wb") as f:
        session = TcpSession(CaptureWriter(f), ("10.0.0.1", 5), ("10.0.0.2", 11124))
        session.handshake()
        session.send(0, encode(GetState(1, "a")))
        session.close()
    result = run_jetdump(str(cap), "--write-pcapng", str(tmp_path / "o.pcapng"))
    assert result.returncode == 1 and "converts event logs" in result.stderr
