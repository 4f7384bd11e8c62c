"""The garbage-collector part: when Python's cyclic collector runs in jetd, and over
what (issue 29: no pause longer than a slice or two).

Why it is needed. CPython's full (generation 2) collection traverses every tracked
container at once: the registry's dict of a million states and the sorted index's lists
are traversed entry by entry, however few objects are tracked. At 1.1M states one such
collection held the loop 60-120 ms (BENCHMARKS.md, "Every scenario at once"): a long job
no slice of the :class:`jetd.scheduler.Scheduler` can cut, since it runs inside whatever
allocation triggers it.

The policy. What survives a collection is moved to the permanent generation
(``gc.freeze()``), which no collection traverses; so each collection walks only what was
allocated since the previous one:

- CPython's own collections of generations 0 and 1 stay as they are (bounded by the
  young objects: about 700 and 7,000 allocations).
- Its automatic full collections are switched off (generation 2's threshold set out of
  reach). Instead :meth:`GcPolicy.tick`, driven by the IO layer's timer every
  ``DEFAULT_CHECK_INTERVAL`` seconds (``jetd.launch``), collects generations 0 and 1 and
  then freezes everything not frozen yet: that collection walks only the objects made
  since the previous tick, between two loop callbacks. (What a collection of generation
  1 promoted to generation 2 in between is frozen uncollected: a cycle among it would
  wait for the full collection; see below.) Every tick, not when CPython's counters say so: jetd's
  big containers (the registry's dicts, the sorted index's lists) grow by untracked
  entries (bytes) that the counters never see (measured: a daemon seeded with 200,000
  states made no collection at all, and kept 600,000 references unfrozen), so a
  container must be frozen soon after it is made, while it is still small.
- A frozen object that later becomes part of unreachable reference cycles is never
  freed by the above. That is safe only because jetd's normal life makes no cycles
  (``tests/jetd/test_21_gc_cycles.py`` churns connections, fetches, queries, routed
  requests, owners going away, failed logins, TCP and WebSocket peers and then finds no
  cyclic garbage). As a safety net against the cycles no test found, a *full* collection
  (``gc.unfreeze()``, collect everything, freeze again) runs every ``full_interval``
  seconds (``DEFAULT_FULL_INTERVAL``, an hour): it costs one pause as long as an
  unfrozen full collection (60-120 ms at 1.1M states), once an interval.

Pauses are measured from ``gc.callbacks`` (start and stop of every collection, in
whichever thread it runs) and kept as the longest per kind; :meth:`GcPolicy.summary`
puts them in the SIGUSR1 and exit lines.

The policy reads no clock for its decisions: ``tick`` takes ``now``; the collector
(the ``gc`` module) is an argument so that tests can drive the decisions with fake
counters (``tests/jetd/test_21_gc_policy.py``).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Literal
from typing import Protocol

__all__ = [
    "DEFAULT_CHECK_INTERVAL",
    "DEFAULT_FULL_INTERVAL",
    "Collector",
    "GcPolicy",
]

# How often the IO layer calls GcPolicy.tick (seconds): what accumulates in generation 2
# between two calls is what the next collection walks.
DEFAULT_CHECK_INTERVAL = 0.1
# Seconds between two full collections (the safety net against cycles among frozen objects).
DEFAULT_FULL_INTERVAL = 3600.0
# Generation 2's threshold while the policy runs: CPython never reaches it by itself.
_OUT_OF_REACH = 1 << 30

YOUNG = "young"  # generations 0 and 1 collected, the rest frozen; the frozen heap not walked
FULL = "full"  # everything unfrozen and collected (the safety net)
START = "start"  # the start-up heap, before jetd listens


class Collector(Protocol):
    """What the policy uses of the ``gc`` module (tests pass a fake)."""

    @property
    def callbacks(self) -> list[Callable[[Literal["start", "stop"], dict[str, int]], object]]: ...

    def get_threshold(self) -> tuple[int, int, int]: ...

    def set_threshold(self, threshold0: int, threshold1: int = ..., threshold2: int = ..., /) -> None: ...

    def collect(self, generation: int = ...) -> int: ...

    def freeze(self) -> None: ...

    def unfreeze(self) -> None: ...


class GcPolicy:
    """Decides when the cyclic garbage collector runs over what (module docstring).

    Args:
        collector: the ``gc`` module, or a fake with the same calls.
        full_interval: seconds between two full collections (unfreeze, collect, freeze).
        cpu_clock: the clock that times pauses (not decisions): the collecting thread's
            CPU time, so that the pause of a process preempted on a busy machine is not counted.
    """

    __slots__ = (
        "_kind",
        "_saved_threshold",
        "_started",
        "collected",
        "collector",
        "cpu_clock",
        "full_interval",
        "full_runs",
        "longest",
        "next_full",
        "young_runs",
    )

    def __init__(self, collector: Collector = gc, full_interval: float = DEFAULT_FULL_INTERVAL,
                 cpu_clock: Callable[[], float] = time.thread_time) -> None:
        if full_interval <= 0:
            raise ValueError("full_interval must be > 0")
        self.collector = collector
        self.full_interval = full_interval
        self.cpu_clock = cpu_clock
        self.next_full = float("inf")
        self.young_runs = 0  # the ticks' collections (generations 0 and 1, then all frozen)
        self.full_runs = 0  # safety-net collections over everything
        self.collected = 0  # unreachable objects found by the policy's collections
        # The longest pause (seconds) of each kind: "0" and "1" (CPython's automatic
        # collections), "2" (an automatic full one: none while the policy runs), "start",
        # "young" and "full" (the policy's own).
        self.longest: dict[str, float] = {"0": 0.0, "1": 0.0, "2": 0.0, START: 0.0, YOUNG: 0.0, FULL: 0.0}
        self._saved_threshold: tuple[int, int, int] | None = None
        self._started = 0.0
        self._kind = ""  # the policy's own collection under way, if any

    # --- start and stop ---------------------------------------------------------------

    def start(self, now: float) -> None:
        """Take over generation 2: collect and freeze the start-up heap, switch off
        CPython's automatic full collections, time every collection; the first full
        collection is due ``full_interval`` after ``now``."""
        collector = self.collector
        if self._saved_threshold is not None:
            return
        self._saved_threshold = collector.get_threshold()
        threshold0, threshold1, _ = self._saved_threshold
        collector.set_threshold(threshold0, threshold1, _OUT_OF_REACH)
        collector.callbacks.append(self._observe)
        self._collect(START)
        self.next_full = now + self.full_interval

    def stop(self) -> None:
        """Give generation 2 back to CPython (thresholds as before, nothing frozen)."""
        saved = self._saved_threshold
        if saved is None:
            return
        self._saved_threshold = None
        collector = self.collector
        if self._observe in collector.callbacks:
            collector.callbacks.remove(self._observe)
        collector.set_threshold(*saved)
        collector.unfreeze()

    # --- the decisions ----------------------------------------------------------------

    def tick(self, now: float) -> str:
        """Called by the IO layer every ``DEFAULT_CHECK_INTERVAL`` seconds, between loop
        callbacks. Runs one collection, the full one when it is due; returns its kind
        (``"young"``, ``"full"``), or ``""`` when the policy is not started."""
        if self._saved_threshold is None:
            return ""
        if now >= self.next_full:
            self.next_full = now + self.full_interval
            self._collect(FULL)
            return FULL
        self._collect(YOUNG)
        return YOUNG

    def _collect(self, kind: str) -> None:
        collector = self.collector
        if kind == FULL:
            collector.unfreeze()
            self.full_runs += 1
        elif kind == YOUNG:
            self.young_runs += 1
        self._kind = kind
        try:
            # Young: generations 0 and 1 only, whose survivors then join what generation 2
            # got since the last freeze. Not collect(2): CPython's full collection also
            # untracks every dict whose values are all untracked (a sorted index of
            # (score, key) tuples), and the next tuple stored re-tracks it into generation
            # 0, where the whole dict is walked again (1M entries: 18 ms at gen 0, 27 ms
            # for the collect(2) that untracks it once more, and so on each tick).
            self.collected += collector.collect(1 if kind == YOUNG else 2)
        finally:
            self._kind = ""
        # Everything that survived is now old: no collection walks it again (but the full one).
        collector.freeze()

    # --- measuring ----------------------------------------------------------------------

    def _observe(self, phase: str, info: dict[str, int]) -> None:
        """gc.callbacks: the start and the stop of each collection (collections never
        overlap: CPython runs one at a time, in whichever thread allocates)."""
        if phase == "start":
            self._started = self.cpu_clock()
            return
        pause = self.cpu_clock() - self._started
        kind = self._kind or str(info["generation"])
        if pause > self.longest.get(kind, 0.0):
            self.longest[kind] = pause

    def summary(self) -> str:
        """The policy's counters for the SIGUSR1 and exit lines: collections run, the
        longest pause of each kind in ms, and the objects not frozen with the references
        they hold (what the next collection of generation 2 would walk; counted now,
        O(those objects))."""
        unfrozen = gc.get_objects()
        refs = len(gc.get_referents(*unfrozen)) if unfrozen else 0
        pauses = " ".join(f"gc_max_ms_{kind}={seconds * 1e3:.2f}" for kind, seconds in self.longest.items())
        return (f"gc_young={self.young_runs} gc_full={self.full_runs} gc_collected={self.collected} "
                f"{pauses} gc_unfrozen={len(unfrozen)} gc_unfrozen_refs={refs}")
