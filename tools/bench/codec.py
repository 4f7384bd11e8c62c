"""Codec benchmark: decode and encode rates of SET_STATE and FETCH_CHANGE frames.

    python -m tools.bench.codec [--frames 100000] [--runs 7]

Every decoder is fed the same frames as one large buffer (realistic keys such as
``plant/line3/temp``, FLOAT64 / INT64 / short STRING values, in rotation). Rows:

- ``jetwire Decoder.messages()``: the stream decoder, building frozen message objects;
- ``jetwire Decoder.next_message()``: the same, one call per message;
- ``bare struct.unpack_from loop``: the same fields (type, length, id/fetch_id,
  function/code, key as str, value type, value bytes) pulled out with precompiled
  ``struct`` and no objects built, and no validation: the floor for pure Python;
- ``construct (interpreted)`` and ``construct (compiled)``: ``jetwire.schema.FRAME``
  parsing one frame at a time (on a slice of the frames: they are slow);
- ``jetwire encode``: ``encode(message)`` for each message.

Prints a markdown table: medians of ``--runs`` runs (round-robin over the rows, timed
in process CPU time), and the median over runs of the ratio to the bare struct loop of
the same run. Single-threaded; the process is pinned to one core when it can be.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import os
import platform
import statistics
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

from jetwire import Decoder
from jetwire import FetchChange
from jetwire import Message
from jetwire import SetState
from jetwire import Value
from jetwire import encode
from jetwire.log import LogHeader
from jetwire.log import LogKind
from jetwire.log import LogReader
from jetwire.log import LogRecord
from jetwire.log import encode_header
from jetwire.log import encode_record
from jetwire.log import iter_log
from jetwire.schema import FRAME

_HEADER = struct.Struct(">BI")
_REQ = struct.Struct(">IBH")
_EVT = struct.Struct(">BIH")
_VHEAD = struct.Struct(">BI")


def make_messages(kind: str, count: int) -> list[Message]:
    """``count`` SET_STATE requests or FETCH_CHANGE events with realistic keys/values."""
    names = ("temp", "pressure", "state", "speed", "setpoint")
    values = (Value.of(21.5), Value.of(-40), Value.of("running"), Value.of(1234.0625), Value.of(7))
    out: list[Message] = []
    for i in range(count):
        key = f"plant/line{i % 8}/{names[i % 5]}"
        value = values[(i // 5) % 5]
        if kind == "SET_STATE":
            out.append(SetState(i & 0xFFFFFFFF, key, value))
        else:
            out.append(FetchChange(3, key, value))
    return out


def bare_struct(buf: bytes) -> int:
    """Pull the same fields out with ``struct.unpack_from``; build nothing."""
    header = _HEADER.unpack_from
    req = _REQ.unpack_from
    evt = _EVT.unpack_from
    vhead = _VHEAD.unpack_from
    pos = 0
    count = 0
    size = len(buf)
    while pos < size:
        ftype, length = header(buf, pos)
        end = pos + 5 + length
        if ftype == 1:
            rid, _function, klen = req(buf, pos + 5)
            kstart = pos + 12
        else:
            _code, rid, klen = evt(buf, pos + 5)
            kstart = pos + 12
        key = buf[kstart : kstart + klen].decode("utf-8")
        vtype, vlen = vhead(buf, kstart + klen)
        data = buf[kstart + klen + 5 : end]
        pos = end
        count += 1
    del key, vtype, vlen, data, rid
    return count


def jetwire_messages(buf: bytes) -> int:
    decoder = Decoder()
    decoder.receive_data(buf)
    count = 0
    for _ in decoder.messages():
        count += 1
    return count


def jetwire_next_message(buf: bytes) -> int:
    decoder = Decoder()
    decoder.receive_data(buf)
    next_message = decoder.next_message
    count = 0
    while next_message() is not None:
        count += 1
    return count


def construct_parser(schema: Any, frames: list[bytes]) -> Callable[[bytes], int]:
    parse = schema.parse

    def run(_buf: bytes) -> int:
        for frame in frames:
            parse(frame)
        return len(frames)

    return run


def encoder(messages: list[Message]) -> Callable[[bytes], int]:
    def run(_buf: bytes) -> int:
        for message in messages:
            encode(message)
        return len(messages)

    return run


def measure(rows: list[tuple[str, Callable[[bytes], int]]], buf: bytes, runs: int) -> dict[str, list[float]]:
    """Frames/s of every row, ``runs`` times, round-robin so that a busy spell on the
    machine hits all rows of a run alike."""
    rates: dict[str, list[float]] = {name: [] for name, _ in rows}
    for _ in range(runs):
        for name, func in rows:
            gc.collect()
            # CPU time of this process: on a shared machine, time spent waiting for a
            # core is not the codec's.
            start = time.process_time()
            count = func(buf)
            rates[name].append(count / max(time.process_time() - start, 1e-9))
    return rates


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the markdown table."""
    parser = argparse.ArgumentParser(description="jetwire codec benchmark")
    parser.add_argument("--frames", type=int, default=100_000, help="frames per buffer")
    parser.add_argument("--runs", type=int, default=7, help="runs per row (median reported)")
    parser.add_argument("--construct-frames", type=int, default=3_000, help="frames for the construct rows")
    args = parser.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    try:
        compiled: Any = FRAME.compile()
        compiled_note = ""
    except Exception as exc:  # construct raises assorted errors for what it cannot compile
        compiled = None
        compiled_note = f"compile() failed: {type(exc).__name__}: {exc}"

    print(f"Python {platform.python_version()} on {platform.machine()}, {args.frames} frames per buffer, "
          f"median of {args.runs} runs\n")
    print("| frames | implementation | frames/s (median) | time per frame vs bare struct (median ratio) |")
    print("|---|---|---:|---:|")
    for kind in ("SET_STATE", "FETCH_CHANGE"):
        messages = make_messages(kind, args.frames)
        frames = [encode(m) for m in messages]
        buf = b"".join(frames)
        sample = frames[: args.construct_frames]
        # Sanity: every decoder sees the same frames and all of them.
        assert jetwire_messages(buf) == jetwire_next_message(buf) == bare_struct(buf) == args.frames
        decoder = Decoder()
        decoder.receive_data(buf)
        assert list(decoder.messages()) == messages
        rows: list[tuple[str, Callable[[bytes], int]]] = [
            ("bare struct.unpack_from loop", bare_struct),
            ("jetwire Decoder.messages()", jetwire_messages),
            ("jetwire Decoder.next_message()", jetwire_next_message),
            ("construct (interpreted)", construct_parser(FRAME, sample)),
        ]
        if compiled is not None:
            rows.append(("construct (compiled)", construct_parser(compiled, sample)))
        rows.append(("jetwire encode", encoder(messages)))
        rates = measure(rows, buf, args.runs)
        floor = rates["bare struct.unpack_from loop"]
        for name, _ in rows:
            # The ratio is taken within each run, then the median of those ratios.
            ratio = statistics.median(f / r for f, r in zip(floor, rates[name], strict=True))
            print(f"| {kind} | {name} | {statistics.median(rates[name]):,.0f} | {ratio:.2f} |")
    # The event-log reader (JETLOG.md) over FRAME_IN records of the same frames.
    frames = [encode(m) for m in make_messages("SET_STATE", args.frames)]
    log = encode_header(LogHeader("jetd", 0)) + b"".join(
        encode_record(i, 7, LogKind.FRAME_IN, frame) for i, frame in enumerate(frames)
    )

    def read_log(data: bytes) -> int:
        return sum(1 for item in iter_log(io.BytesIO(data)) if isinstance(item, LogRecord))

    def read_tuples(data: bytes) -> int:
        # A bulk reader's loop (jetdump's): record_tuples(), next_item() for the rest.
        reader = LogReader()
        count = 0
        for start in range(0, len(data), 1 << 20):
            reader.feed(data[start : start + (1 << 20)])
            while True:
                for _record in reader.record_tuples():
                    count += 1
                if reader.next_item() is None:
                    break
        return count

    log_rows: list[tuple[str, Callable[[bytes], int]]] = [
        ("jetwire.log iter_log", read_log),
        ("jetwire.log LogReader.record_tuples", read_tuples),
    ]
    log_rates = measure(log_rows, log, args.runs)
    print("\n| event log | implementation | records/s (median) | MB/s |\n|---|---|---:|---:|")
    for name, _ in log_rows:
        rate = statistics.median(log_rates[name])
        print(f"| FRAME_IN of SET_STATE | {name} | {rate:,.0f} | {rate * len(log) / len(frames) / 1e6:.0f} |")
    if compiled_note:
        print(f"\nconstruct (compiled): {compiled_note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
