"""``--stats``: counts per message type, function and status, bytes per stream, per key and
per peer, latency, routed legs and unanswered requests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any
from typing import Optional
from typing import TypeVar

from jetwire import Close
from jetwire import Info
from jetwire import Request
from jetwire import Response

from .dissector import OK
from .dissector import FrameRecord
from .dissector import NoteRecord
from .dissector import Record
from .render import FUNCTION_NAMES
from .render import TYPE_NAMES
from .render import code_name

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
    code = getattr(message, "code", None)  # every daemon event (PROTOCOL.md 7.2, 14.2, 14.4)
    if code is not None:
        return str(code.name)
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


TOP = 20  # rows of the per-key and per-peer tables in the text report
MAX_KEYS = 100_000  # keys tracked (later new keys are counted under "(other)")
_Entry = TypeVar("_Entry")


def bounded_entry(table: dict[str, _Entry], key: str, make: Callable[[], _Entry], other: str) -> _Entry:
    """``table[key]``, made by ``make()`` if new; once ``table`` holds MAX_KEYS keys, a new
    key is counted under ``other`` instead (memory stays bounded on any input)."""
    entry = table.get(key)
    if entry is None:
        if len(table) >= MAX_KEYS:
            key = other
            entry = table.get(key)
        if entry is None:
            entry = table[key] = make()
    return entry
UNANSWERED_SHOWN = 20


def is_leg(record: FrameRecord) -> bool:
    """A frame of the daemon-to-owner leg of a routed request (PROTOCOL.md 7): a request
    the daemon sends to a peer (direction 1), or the peer's answer to it (direction 0).
    Peers never receive requests from anyone but the daemon, which sends them only to
    route another peer's request to the state's or method's owner."""
    message = record.message
    if record.direction == 1:
        return isinstance(message, Request) and message.id is not None
    return type(message) is Response or (record.kind != OK and record.request is not None)


class _KeyStats:
    __slots__ = ("errors", "events", "latency", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.events = 0
        self.errors = 0
        self.latency: list[float] = []


class Stats:
    """Accumulates statistics over the records shown.

    A routed request is counted once, as its requester sees it (request, answer and the
    round trip through the daemon and the owner); the daemon's request to the owner and
    the owner's answer are counted apart as its *legs*.
    """

    def __init__(self) -> None:
        self.frames = 0
        self.types: Counter[str] = Counter()
        self.functions: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()
        self.leg_functions: Counter[str] = Counter()
        self.leg_statuses: Counter[str] = Counter()
        self.leg_latency: dict[str, list[float]] = {}
        self.problems: Counter[str] = Counter()
        self.notes: Counter[str] = Counter()
        self.stream_bytes: Counter[tuple[int, int]] = Counter()
        self.stream_frames: Counter[tuple[int, int]] = Counter()
        self.stream_requests: Counter[int] = Counter()
        self.stream_errors: Counter[int] = Counter()
        self.latency: dict[str, list[float]] = {}
        self.keys: dict[str, _KeyStats] = {}
        self.unanswered: list[dict[str, Any]] = []
        self.unanswered_count = 0

    def _key(self, key: str) -> _KeyStats:
        return bounded_entry(self.keys, key, _KeyStats, "(other)")

    def add(self, record: Record) -> None:
        if type(record) is NoteRecord:
            self.notes[record.kind] += 1
            return
        fr: FrameRecord = record  # type: ignore[assignment]
        self.frames += 1
        self.types[type_name(fr)] += 1
        if fr.kind != OK:
            self.problems[fr.kind] += 1
        self.stream_bytes[(fr.stream, fr.direction)] += fr.size
        self.stream_frames[(fr.stream, fr.direction)] += 1
        function = function_name(fr)
        status = status_name(fr)
        if is_leg(fr):
            if function is not None:
                self.leg_functions[function] += 1
            if status is not None:
                self.leg_statuses[status] += 1
            if fr.rtt is not None and fr.request is not None:
                self.leg_latency.setdefault(code_name(FUNCTION_NAMES, fr.request.function), []).append(fr.rtt)
            return
        if function is not None:
            self.functions[function] += 1
        if status is not None:
            self.statuses[status] += 1
        message = fr.message
        if fr.direction == 0 and message is not None:
            key = getattr(message, "key", None)
            if isinstance(message, Request):
                if message.id is not None:
                    self.stream_requests[fr.stream] += 1
                if key is not None:
                    entry = self._key(key)
                    if message.id is None:
                        entry.events += 1
                    else:
                        entry.requests += 1
        if fr.request is not None:
            if status is not None and status != "OK":
                self.stream_errors[fr.stream] += 1
            answered_key = fr.request.key
            answered = self._key(answered_key) if answered_key is not None else None
            if answered is not None and status is not None and status != "OK":
                answered.errors += 1
            if fr.rtt is not None:
                self.latency.setdefault(code_name(FUNCTION_NAMES, fr.request.function), []).append(fr.rtt)
                if answered is not None:
                    answered.latency.append(fr.rtt)

    def add_unanswered(self, stream: int, direction: int, number: int, function: int, key: Optional[str],
                       ts: Optional[float]) -> None:
        """A request still waiting for its response at the end of the input."""
        self.unanswered_count += 1
        if len(self.unanswered) < UNANSWERED_SHOWN:
            self.unanswered.append({
                "frame": number, "stream": stream, "leg": direction == 1,
                "function": code_name(FUNCTION_NAMES, function), "key": key, "timestamp": ts,
            })

    def report(self, labels: dict[int, tuple[str, str]]) -> dict[str, Any]:
        """Everything as one JSON-able dict (latencies in milliseconds)."""
        streams = []
        peers: dict[str, dict[str, int]] = {}
        for (stream, direction), size in sorted(self.stream_bytes.items()):
            names = labels.get(stream, ("?", "?"))
            frames = self.stream_frames[(stream, direction)]
            streams.append({
                "stream": stream, "direction": direction, "src": names[direction], "dst": names[1 - direction],
                "frames": frames, "bytes": size,
            })
            peer = peers.setdefault(names[0], {"streams": 0, "frames_sent": 0, "frames_received": 0,
                                                "bytes_sent": 0, "bytes_received": 0, "requests": 0, "errors": 0})
            if direction == 0:
                peer["streams"] += 1
                peer["frames_sent"] += frames
                peer["bytes_sent"] += size
                peer["requests"] += self.stream_requests[stream]
                peer["errors"] += self.stream_errors[stream]
            else:
                peer["frames_received"] += frames
                peer["bytes_received"] += size
        keys = {}
        for key, entry in sorted(self.keys.items(), key=lambda item: -(item[1].requests + item[1].events)):
            row: dict[str, Any] = {"requests": entry.requests, "events": entry.events, "errors": entry.errors}
            if entry.latency:
                row["latency_ms"] = _latency(entry.latency)
            keys[key] = row
        return {
            "frames": self.frames,
            "types": dict(self.types.most_common()),
            "functions": dict(self.functions.most_common()),
            "statuses": dict(self.statuses.most_common()),
            "legs": {
                "functions": dict(self.leg_functions.most_common()),
                "statuses": dict(self.leg_statuses.most_common()),
                "latency_ms": _latencies(self.leg_latency),
            },
            "problems": dict(self.problems),
            "notes": dict(self.notes),
            "streams": streams,
            "peers": dict(sorted(peers.items(), key=lambda item: -item[1]["frames_sent"] - item[1]["frames_received"])),
            "keys": keys,
            "latency_ms": _latencies(self.latency),
            "unanswered": {"count": self.unanswered_count, "first": self.unanswered},
        }

    def text(self, labels: dict[int, tuple[str, str]]) -> str:
        """A plain-text report."""
        rep = self.report(labels)
        out = [f"frames: {rep['frames']}"]
        for title, key in (("by type", "types"), ("by function / event (a routed request once)", "functions"),
                           ("by status", "statuses"), ("problems", "problems"), ("notes", "notes")):
            if rep[key]:
                out.append(f"{title}:")
                out.extend(f"  {name:<20} {count:>10}" for name, count in rep[key].items())
        legs = rep["legs"]
        if legs["functions"] or legs["statuses"]:
            out.append("routed legs (daemon -> owner requests and the owners' answers):")
            out.extend(f"  {name:<20} {count:>10}" for name, count in legs["functions"].items())
            out.extend(f"  {name:<20} {count:>10}" for name, count in legs["statuses"].items())
        if rep["streams"]:
            out.append("streams:")
            out.append(f"  {'stream':>6} {'src -> dst':<50} {'frames':>10} {'bytes':>12}")
            for s in rep["streams"]:
                out.append(f"  {s['stream']:>6} {s['src'] + ' -> ' + s['dst']:<50} {s['frames']:>10} {s['bytes']:>12}")
        if rep["peers"]:
            out.append(f"peers (top {TOP}):")
            out.append(f"  {'peer':<30} {'streams':>7} {'sent':>9} {'received':>9} {'requests':>9} {'errors':>7}")
            for name, p in list(rep["peers"].items())[:TOP]:
                out.append(f"  {name:<30} {p['streams']:>7} {p['frames_sent']:>9} {p['frames_received']:>9} "
                           f"{p['requests']:>9} {p['errors']:>7}")
        if rep["keys"]:
            out.append(f"keys (top {TOP} by requests and events):")
            out.append(f"  {'key':<30} {'requests':>9} {'events':>8} {'errors':>7} {'p50 ms':>9} {'p99 ms':>9}")
            for key, k in list(rep["keys"].items())[:TOP]:
                lat = k.get("latency_ms")
                p50 = f"{lat['p50']:>9.3f}" if lat else f"{'-':>9}"
                p99 = f"{lat['p99']:>9.3f}" if lat else f"{'-':>9}"
                out.append(f"  {key:<30} {k['requests']:>9} {k['events']:>8} {k['errors']:>7} {p50} {p99}")
        for title, lat_table in (("request/response latency (ms), as the requester sees it:", rep["latency_ms"]),
                                 ("routed legs latency (ms), the owner's share:", legs["latency_ms"])):
            if lat_table:
                out.append(title)
                out.append(f"  {'function':<16} {'count':>8} {'p50':>10} {'p90':>10} {'p99':>10} {'max':>10}")
                for name, lat in lat_table.items():
                    out.append(
                        f"  {name:<16} {lat['count']:>8} {lat['p50']:>10.3f} {lat['p90']:>10.3f} {lat['p99']:>10.3f} {lat['max']:>10.3f}"
                    )
        unanswered = rep["unanswered"]
        if unanswered["count"]:
            out.append(f"unanswered requests: {unanswered['count']}")
            for u in unanswered["first"]:
                leg = " (routed leg)" if u["leg"] else ""
                out.append(f"  #{u['frame']} stream {u['stream']} {u['function']} key={u['key']!r}{leg}")
        return "\n".join(out) + "\n"


def _latencies(table: dict[str, list[float]]) -> dict[str, Any]:
    latency: dict[str, Any] = {}
    everything: list[float] = []
    for name, values in sorted(table.items()):
        everything.extend(values)
        latency[name] = _latency(values)
    if everything:
        latency["ALL"] = _latency(everything)
    return latency


def _latency(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    result: dict[str, float] = {"count": len(ordered)}
    for pct in PERCENTILES:
        result[f"p{pct}"] = round(percentile(ordered, pct) * 1000, 6)
    result["max"] = round(ordered[-1] * 1000, 6)
    return result
