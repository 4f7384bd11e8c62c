"""``--stats``: counts per message type, function and status, bytes per stream, latency."""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional

from jetwire import Close, FetchAdd, FetchChange, FetchRemove, Info, Request, Response

from .dissector import OK, FrameRecord, NoteRecord, Record
from .render import FUNCTION_NAMES, TYPE_NAMES, code_name

PERCENTILES = (50, 90, 99)


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of an ascending list (not empty)."""
    rank = max(1, -(-len(sorted_values) * pct // 100))
    return sorted_values[int(rank) - 1]


def type_name(record: FrameRecord) -> str:
    """REQUEST / RESPONSE / EVENT / INFO as on the wire (fire-and-forget is an EVENT)."""
    message = record.message
    if message is None:
        return code_name(TYPE_NAMES, record.frame_type) if record.frame_type is not None else "?"
    if isinstance(message, Request):
        return "REQUEST" if message.id is not None else "EVENT"
    if type(message) is Response:
        return "RESPONSE"
    if type(message) is Info:
        return "INFO"
    return "EVENT"


def function_name(record: FrameRecord) -> Optional[str]:
    """The function (requests, answered responses) or event code (events) of a frame."""
    message = record.message
    if isinstance(message, Request):
        return message.function.name
    if isinstance(message, (FetchAdd, FetchChange, FetchRemove)):
        return message.code.name
    if type(message) is Close:
        return "CLOSE"
    if record.request is not None:
        return code_name(FUNCTION_NAMES, record.request.function)
    return None


def status_name(record: FrameRecord) -> Optional[str]:
    """The status of a RESPONSE or CLOSE."""
    message = record.message
    if type(message) is Response or type(message) is Close:
        return message.status.name
    return None


class Stats:
    """Accumulates statistics over the records shown."""

    def __init__(self) -> None:
        self.frames = 0
        self.types: Counter[str] = Counter()
        self.functions: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()
        self.problems: Counter[str] = Counter()
        self.notes: Counter[str] = Counter()
        self.stream_bytes: Counter[tuple[int, int]] = Counter()
        self.stream_frames: Counter[tuple[int, int]] = Counter()
        self.latency: dict[str, list[float]] = {}

    def add(self, record: Record) -> None:
        if type(record) is NoteRecord:
            self.notes[record.kind] += 1
            return
        fr: FrameRecord = record  # type: ignore[assignment]
        self.frames += 1
        self.types[type_name(fr)] += 1
        if fr.kind != OK:
            self.problems[fr.kind] += 1
        function = function_name(fr)
        if function is not None:
            self.functions[function] += 1
        status = status_name(fr)
        if status is not None:
            self.statuses[status] += 1
        self.stream_bytes[(fr.stream, fr.direction)] += fr.size
        self.stream_frames[(fr.stream, fr.direction)] += 1
        if fr.rtt is not None and fr.request is not None:
            self.latency.setdefault(code_name(FUNCTION_NAMES, fr.request.function), []).append(fr.rtt)

    def report(self, labels: dict[int, tuple[str, str]]) -> dict[str, Any]:
        """Everything as one JSON-able dict (latencies in milliseconds)."""
        latency: dict[str, Any] = {}
        everything: list[float] = []
        for name, values in sorted(self.latency.items()):
            everything.extend(values)
            latency[name] = _latency(values)
        if everything:
            latency["ALL"] = _latency(everything)
        streams = []
        for (stream, direction), size in sorted(self.stream_bytes.items()):
            names = labels.get(stream, ("?", "?"))
            streams.append({
                "stream": stream, "direction": direction, "src": names[direction], "dst": names[1 - direction],
                "frames": self.stream_frames[(stream, direction)], "bytes": size,
            })
        return {
            "frames": self.frames,
            "types": dict(self.types.most_common()),
            "functions": dict(self.functions.most_common()),
            "statuses": dict(self.statuses.most_common()),
            "problems": dict(self.problems),
            "notes": dict(self.notes),
            "streams": streams,
            "latency_ms": latency,
        }

    def text(self, labels: dict[int, tuple[str, str]]) -> str:
        """A plain-text report."""
        rep = self.report(labels)
        out = [f"frames: {rep['frames']}"]
        for title, key in (("by type", "types"), ("by function / event", "functions"),
                           ("by status", "statuses"), ("problems", "problems"), ("notes", "notes")):
            if rep[key]:
                out.append(f"{title}:")
                out.extend(f"  {name:<20} {count:>10}" for name, count in rep[key].items())
        if rep["streams"]:
            out.append("streams:")
            out.append(f"  {'stream':>6} {'src -> dst':<50} {'frames':>10} {'bytes':>12}")
            for s in rep["streams"]:
                out.append(f"  {s['stream']:>6} {s['src'] + ' -> ' + s['dst']:<50} {s['frames']:>10} {s['bytes']:>12}")
        if rep["latency_ms"]:
            out.append("request/response latency (ms):")
            out.append(f"  {'function':<16} {'count':>8} {'p50':>10} {'p90':>10} {'p99':>10} {'max':>10}")
            for name, lat in rep["latency_ms"].items():
                out.append(
                    f"  {name:<16} {lat['count']:>8} {lat['p50']:>10.3f} {lat['p90']:>10.3f} {lat['p99']:>10.3f} {lat['max']:>10.3f}"
                )
        return "\n".join(out) + "\n"


def _latency(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    result: dict[str, float] = {"count": len(ordered)}
    for pct in PERCENTILES:
        result[f"p{pct}"] = round(percentile(ordered, pct) * 1000, 6)
    result["max"] = round(ordered[-1] * 1000, 6)
    return result
