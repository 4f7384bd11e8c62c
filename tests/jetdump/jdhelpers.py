"""Shared helpers of the jetdump tests: run jetdump and tshark, build captures and logs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from typing import Optional

import pytest

from jetwire import AddMethod
from jetwire import AddState
from jetwire import Authenticate
from jetwire import CallMethod
from jetwire import Close
from jetwire import EventCode
from jetwire import FetchAdd
from jetwire import FetchChange
from jetwire import FetchRemove
from jetwire import FetchStates
from jetwire import FrameType
from jetwire import Function
from jetwire import GetState
from jetwire import Info
from jetwire import Message
from jetwire import NotifyState
from jetwire import RemoveMethod
from jetwire import RemoveState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Unfetch
from jetwire import Value
from jetwire import ValueType
from tools.procs import stop_process

REPO = Path(__file__).resolve().parents[2]
LUA = REPO / "tools" / "wireshark" / "jet.lua"
TSHARK = shutil.which("tshark")
RUN_TIMEOUT = 60

# A conversation touching every message kind and every value type: (direction, message);
# direction 0 is peer -> daemon.
CONVERSATION: list[tuple[int, Message]] = [
    (1, Info("jetd", features=1)),
    (0, Info("sensor-7")),
    (0, AddState(1, "plant/temp", Value.of(21))),
    (1, Response(1)),
    (0, FetchStates(2, "plant/")),
    (1, Response(2, Status.OK, fetch_id=3)),
    (1, FetchAdd(3, "plant/temp", Value.of(21))),
    (0, SetState(3, "plant/temp", Value.of(22.5))),
    (1, SetState(900, "plant/temp", Value.of(22.5))),
    (0, NotifyState(4, "plant/temp", Value.of(22.5))),
    (1, Response(4)),
    (1, FetchChange(3, "plant/temp", Value.of(22.5))),
    (0, Response(900, Status.OK, Value.of(22.5))),
    (1, Response(3, Status.OK, Value.of(22.5))),
    (0, GetState(5, "plant/missing")),
    (1, Response(5, Status.NOT_FOUND, message="no such state")),
    (0, AddMethod(6, "plant/reset")),
    (1, Response(6)),
    (0, CallMethod(7, "plant/reset", Value.of([1, 2]))),
    (1, Response(7, Status.REJECTED, message="not now")),
    (0, CallMethod(None, "plant/reset", Value.of({"a": "ü"}))),
    (0, SetState(None, "plant/flag", Value.of(True))),
    (0, NotifyState(None, "plant/temp", Value(ValueType.BYTES, b"\x00\xff"))),
    (0, AddState(8, "plant/name", Value.of("Kessel ü"))),
    (1, Response(8, Status.ALREADY_EXISTS, message="")),
    (0, AddState(9, "plant/none", Value.of(None))),
    (0, AddState(10, "plant/cbor", Value(ValueType.CBOR, b"\xa1\x61a\x01"))),
    (0, AddState(11, "plant/app", Value(0x80, b"app-data"))),
    (0, AddState(12, "plant/neg", Value.of(-(2**63)))),
    (0, AddState(13, "plant/off", Value.of(False))),
    (0, RemoveMethod(14, "plant/reset")),
    (0, RemoveState(15, "plant/none")),
    (1, FetchRemove(3, "plant/none", Value.of(None))),
    (0, Unfetch(16, 3)),
    (1, Response(16)),
    (0, Authenticate(20, "sensor-7", "wrong")),  # PROTOCOL.md 6.12: shown masked by both tools
    (1, Response(20, Status.AUTH_FAILED, message="authentication failed")),
    (0, Authenticate(21, "sensor-7", "s3cr3t")),
    (1, Response(21)),
    (0, CallMethod(17, "plant/secret", Value.of(None))),
    (1, Response(17, Status.NOT_AUTHORIZED, message="not authorized: write plant/secret")),
    (1, Close(Status.OK, "shutting down")),
]


def kill_if_running(proc: subprocess.Popen[Any]) -> None:
    """The cleanup of a test's jetdump process: killed if still running, always reaped."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def run_jetdump(*args: str, stdin: Optional[bytes] = None, timeout: float = RUN_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """``python -m tools.jetdump ARGS`` from the repository root."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "tools.jetdump", *args],
        input=stdin.decode("latin-1") if stdin is not None else None,
        capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env,
    )


@contextmanager
def loopback_capture(path: Path, port: int, tool: str) -> Iterator[None]:
    """Capture TCP port ``port`` on lo into ``path`` with ``tool`` (dumpcap or tshark)
    while the block runs. Skips the test where capturing is not permitted."""
    proc = subprocess.Popen([tool, "-i", "lo", "-f", f"tcp port {port}", "-w", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        started = b""
        deadline = time.monotonic() + 15
        while b"Capturing on" not in started and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            started += line
        if b"Capturing on" not in started:
            pytest.skip(f"capturing on loopback is not permitted here: {started.decode(errors='replace')}")
        time.sleep(0.3)  # the capture filter is compiled and attached after the message
        yield
        time.sleep(0.3)  # the last packets reach the file
    finally:
        stop_process(proc, 10)


def jetdump_json(*args: str, returncode: int = 0) -> list[dict[str, Any]]:
    result = run_jetdump("--json", *args)
    assert result.returncode == returncode, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def tshark_pdus(capture: Path, *extra: str) -> list[dict[str, Any]]:
    """Every jet PDU tshark + jet.lua finds: frame number, epoch time, tcp stream, fields."""
    assert TSHARK is not None
    result = subprocess.run(
        [TSHARK, "-o", "tcp.reassemble_out_of_order:TRUE", *extra, "-X", f"lua_script:{LUA}",
         "-r", str(capture), "-T", "json", "--no-duplicate-keys", "-Y", "jet"],
        capture_output=True, text=True, errors="replace", timeout=RUN_TIMEOUT,
    )
    assert result.returncode == 0, result.stderr
    lua_errors = [line for line in result.stderr.splitlines() if "Lua" in line or "lua" in line]
    assert not lua_errors, lua_errors
    pdus = []
    for packet in json.loads(result.stdout or "[]"):
        layers = packet["_source"]["layers"]
        jet_layers = layers.get("jet")
        if isinstance(jet_layers, dict):
            jet_layers = [jet_layers]
        for layer in jet_layers or []:
            pdus.append({
                "packet": int(layers["frame"]["frame.number"]),
                "timestamp": float(layers["frame"]["frame.time_epoch"]),
                "time": float(layers["frame"]["frame.time_relative"]),
                "stream": int(layers["tcp"]["tcp.stream"]),
                "fields": normalise_tshark(layer),
            })
    return pdus


_INT_FIELDS = {
    "type", "length", "id", "function", "status", "code", "value_type", "key_length", "value_length",
    "fetch_id", "prefix_length", "message_length", "major", "minor", "max_body", "name_length",
    "user_length", "password_length", "max_key_length", "route_timeout_ms",
}


def normalise_tshark(layer: dict[str, Any]) -> dict[str, Any]:
    """tshark's jet layer as {jetdump field name: value}."""
    out: dict[str, Any] = {}

    def walk(node: dict[str, Any]) -> None:
        for key, value in node.items():
            if key.startswith("_ws."):
                continue  # expert info and Wireshark's own items
            if isinstance(value, dict):
                walk(value)
                continue
            if not key.startswith("jet.") or key.startswith("jet.info.features."):
                continue
            name = key[4:]
            if name.startswith("info."):
                name = name[5:]
            if name in _INT_FIELDS:
                out[name] = int(value)
            elif name == "features":
                out[name] = int(value, 16)
            elif name == "value":
                out["value_hex"] = value.replace(":", "")
            elif name == "value.int64":
                out["value"] = int(value)
            elif name == "value.float64":
                out["value"] = float(value)
            elif name == "value.bool":
                out["value"] = value in ("1", "True", "true")
            elif name == "value.json":
                out["value"] = json.loads(value)
            elif name.startswith("value."):
                out["value"] = value
            elif name == "response_to":
                out[name] = int(value)
            elif name == "rtt_ms":
                out[name] = float(value)
            elif name in ("malformed", "truncated"):
                out["kind"] = name
                out["error"] = value
            else:
                out[name] = value

    walk(layer)
    return out


_ENUMS = {"type": FrameType, "function": Function, "code": EventCode, "status": Status, "value_type": ValueType}
_COMPARED = _INT_FIELDS | {"key", "prefix", "message", "name", "features", "value", "value_hex", "user", "password"}


def normalise_jetdump(obj: dict[str, Any]) -> dict[str, Any]:
    """jetdump's JSON object reduced to the fields tshark also shows, codes as ints."""
    out: dict[str, Any] = {}
    for name in _COMPARED:
        if name not in obj:
            continue
        value = obj[name]
        if name in _ENUMS and isinstance(value, str):
            value = int(value, 16) if value.startswith("0x") else int(_ENUMS[name][value])
        out[name] = value
    if out.get("value_type") == 0:
        out.pop("value", None)  # NONE: jet.lua has no decoded form, only the empty data
    return out


def jet_frames(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["record"] == "frame"]
