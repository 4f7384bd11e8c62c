"""Benchmark of jetdump: frames/s in summary and --json mode over a capture and an event
log, tshark + jet.lua beside it, and the tap's added round-trip latency.

    python -m tools.bench.jetdump                 # 1,000,000 frames (takes minutes)
    python -m tools.bench.jetdump --frames 200000 --json-frames 100000 --tshark-frames 50000
    python -m tools.bench.jetdump --compiled      # also the compiled build (pip wheel .)

``--compiled [SITE]``: the summary rows again with jetdump run from SITE, an unpacked
wheel of ``pip wheel .`` (built into a temporary directory when SITE is not given), in
the same run: the wheel compiles jetdump's per-packet path with mypyc.

Prints markdown tables. Rates are frames per second of wall time and of CPU time (user +
system of the child process): on a shared machine the CPU figure is the one to compare
with the target of 200,000 frames/s in summary mode on one core.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from jetwire import FetchChange
from jetwire import GetState
from jetwire import Info
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from jetwire import encode
from jetwire.log import LogHeader
from jetwire.log import LogKind
from jetwire.log import conn_open_data
from jetwire.log import encode_header
from jetwire.log import encode_record
from tools.jetdump.synth import CaptureWriter
from tools.jetdump.synth import TcpSession
from tools.procs import stop_process

REPO = Path(__file__).resolve().parents[2]
LUA = REPO / "tools" / "wireshark" / "jet.lua"
P99_MIN_SAMPLES = 1000  # fewer round trips: no p99 is printed
BATCH = 20  # requests per segment; responses and fetch events follow in one segment


def _traffic(batch: int = BATCH) -> tuple[bytes, bytes]:
    """One round of traffic: ``batch`` SET_STATE requests one way; their responses and
    as many FETCH_CHANGE events the other way."""
    requests = b"".join(encode(SetState(i, f"plant/line{i % 10}/temp", Value.of(20.0 + i % 7))) for i in range(batch))
    answers = b"".join(encode(Response(i, Status.OK, Value.of(20.0 + i % 7))) for i in range(batch))
    events = b"".join(encode(FetchChange(3, f"plant/line{i % 10}/temp", Value.of(20.0 + i % 7))) for i in range(batch))
    return requests, answers + events


def write_capture(path: Path, frames: int, *, per_packet: bool = False) -> int:
    """A capture of about ``frames`` frames; returns the exact count. Batched: rounds of
    ``BATCH`` frames per segment; ``per_packet``: every frame in its own segment (as
    request/response traffic without pipelining looks), the costly case per frame."""
    with open(path, "wb") as f:
        session = TcpSession(CaptureWriter(f), ("127.0.0.1", 40000), ("127.0.0.1", 11124))
        session.handshake()
        session.send(1, encode(Info("jetd")))
        count = 1
        if per_packet:
            requests, answers, events = _traffic_frames()
            while count < frames:
                for request, answer, event in zip(requests, answers, events, strict=True):
                    session.send(0, request, dt=0.00002)
                    session.send(1, answer, dt=0.00002)
                    session.send(1, event, dt=0.00001)
                count += 3 * BATCH
        else:
            to_daemon, to_peer = _traffic()
            while count < frames:
                session.send(0, to_daemon, dt=0.00005)
                session.send(1, to_peer, dt=0.00005)
                count += 3 * BATCH
        session.close()
    return count


def _traffic_frames(batch: int = BATCH) -> tuple[list[bytes], list[bytes], list[bytes]]:
    requests = [encode(SetState(i, f"plant/line{i % 10}/temp", Value.of(20.0 + i % 7))) for i in range(batch)]
    answers = [encode(Response(i, Status.OK, Value.of(20.0 + i % 7))) for i in range(batch)]
    events = [encode(FetchChange(3, f"plant/line{i % 10}/temp", Value.of(20.0 + i % 7))) for i in range(batch)]
    return requests, answers, events


def write_log(path: Path, frames: int) -> int:
    """An event log of ``frames`` FRAME_IN/FRAME_OUT records (plus CONN_OPENs)."""
    to_daemon = [encode(SetState(i, f"plant/line{i % 10}/temp", Value.of(20.0 + i % 7))) for i in range(BATCH)]
    to_peer = [encode(Response(i, Status.OK, Value.of(20.0 + i % 7))) for i in range(BATCH)]
    ts = 1_700_000_000_000_000_000
    count = 0
    with open(path, "wb") as f:
        f.write(encode_header(LogHeader("jetd", ts, 0)))
        f.write(encode_record(ts, 1, LogKind.CONN_OPEN, conn_open_data("127.0.0.1:40000")))
        chunk = []
        while count < frames:
            for request, response in zip(to_daemon, to_peer, strict=True):
                ts += 20_000
                chunk.append(encode_record(ts, 1, LogKind.FRAME_IN, request))
                ts += 30_000
                chunk.append(encode_record(ts, 1, LogKind.FRAME_OUT, response))
                count += 2
            if len(chunk) > 10_000:
                f.write(b"".join(chunk))
                chunk.clear()
        f.write(b"".join(chunk))
    return count


def timed(cmd: list[str], site: Optional[Path] = None) -> tuple[float, float]:
    """Run ``cmd`` with stdout to /dev/null; (wall seconds, CPU seconds of the child).
    ``site``: run jetdump from that build instead of this checkout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    root = site or REPO
    env = {k: v for k, v in os.environ.items() if k != "JET_PURE_PYTHON"}
    env["PYTHONPATH"] = str(root)
    with open(os.devnull, "wb") as devnull:
        subprocess.run(cmd, stdout=devnull, stderr=subprocess.DEVNULL, check=True, env=env, cwd=root)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def rate_row(label: str, frames: int, cmd: list[str], repeats: int, site: Optional[Path] = None) -> str:
    runs = [timed(cmd, site) for _ in range(repeats)]
    wall = statistics.median(r[0] for r in runs)
    cpu = statistics.median(r[1] for r in runs)
    return f"| {label} | {frames:,} | {repeats} | {wall:.2f} | {frames / wall:,.0f} | {cpu:.2f} | {frames / cpu:,.0f} |"


# --- tap latency ----------------------------------------------------------------------------


def _start(cmd: list[str], marker: str, stream: str) -> tuple[subprocess.Popen[bytes], str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE if stream == "stdout" else subprocess.DEVNULL,
                            stderr=subprocess.PIPE if stream == "stderr" else subprocess.DEVNULL, env=env, cwd=REPO)
    pipe = proc.stdout if stream == "stdout" else proc.stderr
    assert pipe is not None
    line = pipe.readline().decode()
    if marker not in line:
        proc.kill()
        raise RuntimeError(f"{cmd[:4]} did not start: {line!r}")
    return proc, line


def round_trips(port: int, count: int) -> list[float]:
    """Sequential GET_STATE round trips; seconds each."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        from jetwire import Decoder

        decoder = Decoder()
        request = encode(GetState(1, "bench/none"))
        times = []
        for _ in range(count):
            start = time.perf_counter()
            sock.sendall(request)
            got = None
            while got is None:
                decoder.receive_data(sock.recv(65536))
                for message in decoder.messages():
                    if isinstance(message, Response):
                        got = message
            times.append(time.perf_counter() - start)
    return times


def tap_latency(count: int) -> list[str]:
    jetd, line = _start([sys.executable, "-m", "jetd", "--host", "127.0.0.1", "--port", "0"], "listening on", "stdout")
    daemon_port = int(line.strip().rsplit(":", 1)[1])
    tap, line = _start(
        [sys.executable, "-m", "tools.jetdump", "tap", "--listen", "0", "--upstream", f"127.0.0.1:{daemon_port}"],
        "listening on", "stderr",
    )
    tap_port = int(line.split("127.0.0.1:")[1].split(",")[0])
    rows = []
    try:
        direct: list[float] = []
        tapped: list[float] = []
        for _ in range(3):  # interleaved, so that both see the same machine load
            direct += round_trips(daemon_port, count // 3)
            tapped += round_trips(tap_port, count // 3)
        direct.sort()
        tapped.sort()

        def p99(values: list[float]) -> Optional[float]:
            # Below 1,000 samples the 99th percentile is one of the last few: noise (a run of
            # 99 round trips once showed the tap "adding" -409 us at p99).
            return values[int(len(values) * 0.99)] if len(values) >= P99_MIN_SAMPLES else None

        def us(value: Optional[float]) -> str:
            return "-" if value is None else f"{value * 1e6:.0f}"

        for label, values in (("direct to jetd", direct), ("through jetdump tap", tapped)):
            rows.append(f"| {label} | {len(values):,} | {us(values[len(values) // 2])} | {us(p99(values))} |")
        d99, t99 = p99(direct), p99(tapped)
        added99 = None if d99 is None or t99 is None else t99 - d99
        rows.append(f"| added by the tap | | {us(tapped[len(tapped) // 2] - direct[len(direct) // 2])} | {us(added99)} |")
    finally:
        for proc in (tap, jetd):
            stop_process(proc, 10)
    return rows


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=1_000_000, help="frames in the capture and the log")
    parser.add_argument("--json-frames", type=int, default=1_000_000, help="frames for the --json runs")
    parser.add_argument("--tshark-frames", type=int, default=100_000, help="frames for tshark (it is slower)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per summary measurement (median)")
    parser.add_argument("--round-trips", type=int, default=3000, help="round trips per tap latency figure")
    parser.add_argument("--compiled", nargs="?", const="build", metavar="SITE",
                        help="also the summary rows from a compiled build (default: build one)")
    args = parser.parse_args(argv)

    jetdump = [sys.executable, "-m", "tools.jetdump"]
    with tempfile.TemporaryDirectory(prefix="jetdump-bench-") as tmp:
        work = Path(tmp)
        capture, log = work / "big.pcap", work / "big.jetlog"
        n_cap = write_capture(capture, args.frames)
        n_log = write_log(log, args.frames)
        json_cap, json_log = capture, log
        n_json_cap, n_json_log = n_cap, n_log
        if args.json_frames != args.frames:
            json_cap, json_log = work / "json.pcap", work / "json.jetlog"
            n_json_cap = write_capture(json_cap, args.json_frames)
            n_json_log = write_log(json_log, args.json_frames)
        print("| input | frames | runs | wall s (median) | frames/s (wall) | CPU s (median) | frames/s (CPU) |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        print(rate_row("capture, summary", n_cap, [*jetdump, str(capture)], args.repeats))
        per_packet = work / "per-packet.pcap"
        n_pp = write_capture(per_packet, args.frames, per_packet=True)
        print(rate_row("capture with one frame per packet, summary", n_pp, [*jetdump, str(per_packet)], args.repeats))
        print(rate_row("event log, summary", n_log, [*jetdump, str(log)], args.repeats))
        if args.compiled:
            from tools.bench.brokers import build_compiled

            site = build_compiled(work / "wheel") if args.compiled == "build" else Path(args.compiled)
            for label, n, path in (("capture, summary", n_cap, capture),
                                   ("capture with one frame per packet, summary", n_pp, per_packet),
                                   ("event log, summary", n_log, log)):
                print(rate_row(f"{label}, compiled", n, [*jetdump, str(path)], args.repeats, site))
        print(rate_row("capture, --json", n_json_cap, [*jetdump, "--json", str(json_cap)], 1))
        print(rate_row("event log, --json", n_json_log, [*jetdump, "--json", str(json_log)], 1))
        tshark = shutil.which("tshark")
        if tshark:
            small = work / "tshark.pcap"
            n_small = write_capture(small, args.tshark_frames)
            print(rate_row("capture, tshark -X lua_script:jet.lua (summary)", n_small,
                           [tshark, "-X", f"lua_script:{LUA}", "-r", str(small)], 1))
            print(rate_row("capture, jetdump summary, same capture", n_small, [*jetdump, str(small)], 1))
        print()
        print("| tap round trip (GET_STATE, sequential) | round trips | p50 us | p99 us |")
        print("|---|---:|---:|---:|")
        for row in tap_latency(args.round_trips):
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
