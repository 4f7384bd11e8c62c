"""jetd.gcpolicy's decisions (issue 29), with a fake collector and fake clocks: what each
tick collects, what is frozen, what start and stop change; and with the real ``gc``
module, that a tick's collection walks only what is not frozen."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Literal

import pytest

from jetd.gcpolicy import DEFAULT_FULL_INTERVAL
from jetd.gcpolicy import GcPolicy

Callback = Callable[[Literal["start", "stop"], dict[str, int]], object]


class FakeCollector:
    """Records the calls the policy makes; ``collect`` plays a collection of generation
    ``gen`` taking ``cost`` seconds of the fake CPU clock, through the callbacks."""

    def __init__(self, cpu: list[float]) -> None:
        self.calls: list[str] = []
        self.threshold = (700, 10, 10)
        self._callbacks: list[Callback] = []
        self.frozen = False
        self.cpu = cpu
        self.cost = 0.002

    @property
    def callbacks(self) -> list[Callback]:
        return self._callbacks

    def get_threshold(self) -> tuple[int, int, int]:
        return self.threshold

    def set_threshold(self, threshold0: int, threshold1: int = 10, threshold2: int = 10, /) -> None:
        self.threshold = (threshold0, threshold1, threshold2)

    def collect(self, generation: int = 2) -> int:
        self.calls.append(f"collect {generation}{' frozen' if self.frozen else ''}")
        self.automatic(generation, self.cost)
        return 3

    def automatic(self, generation: int, cost: float) -> None:
        for callback in list(self._callbacks):
            callback("start", {"generation": generation})
        self.cpu[0] += cost
        for callback in list(self._callbacks):
            callback("stop", {"generation": generation, "collected": 0, "uncollectable": 0})

    def freeze(self) -> None:
        self.calls.append("freeze")
        self.frozen = True

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")
        self.frozen = False


@pytest.fixture
def fake() -> tuple[GcPolicy, FakeCollector]:
    cpu = [0.0]
    collector = FakeCollector(cpu)
    return GcPolicy(collector, full_interval=60.0, cpu_clock=lambda: cpu[0]), collector


def test_start_takes_over_generation_2_and_stop_gives_it_back(fake: tuple[GcPolicy, FakeCollector]) -> None:
    policy, collector = fake
    assert policy.tick(1.0) == ""  # not started: nothing
    policy.start(100.0)
    assert collector.threshold[:2] == (700, 10)
    assert collector.threshold[2] > 1_000_000  # CPython's automatic full collections off
    assert collector.calls == ["collect 2", "freeze"]  # the start-up heap frozen
    assert len(collector.callbacks) == 1
    policy.stop()
    assert collector.threshold == (700, 10, 10)
    assert collector.callbacks == []
    assert collector.calls[-1] == "unfreeze" and not collector.frozen
    policy.stop()  # twice is harmless
    assert collector.calls.count("unfreeze") == 1


def test_each_tick_collects_what_is_young_and_freezes_it(fake: tuple[GcPolicy, FakeCollector]) -> None:
    policy, collector = fake
    policy.start(100.0)
    collector.calls.clear()
    for step in range(5):
        assert policy.tick(100.1 + step * 0.1) == "young"
    # The frozen heap is never unfrozen for a young collection: it walks only what is new.
    assert collector.calls == ["collect 1 frozen", "freeze"] * 5
    assert policy.young_runs == 5 and policy.full_runs == 0
    assert policy.collected == 3 * 6  # the start's collection counts too


def test_the_full_collection_is_due_every_interval(fake: tuple[GcPolicy, FakeCollector]) -> None:
    policy, collector = fake
    policy.start(100.0)
    collector.calls.clear()
    assert policy.tick(159.9) == "young"
    assert policy.tick(160.0) == "full"
    assert collector.calls[-3:] == ["unfreeze", "collect 2", "freeze"]
    assert policy.tick(160.1) == "young"  # the next one an interval later
    assert policy.tick(219.9) == "young"
    assert policy.tick(220.0) == "full"
    assert policy.full_runs == 2
    # A late tick runs one full collection, not one per interval missed.
    assert policy.tick(1000.0) == "full"
    assert policy.tick(1000.1) == "young"


def test_pauses_are_kept_per_kind(fake: tuple[GcPolicy, FakeCollector]) -> None:
    policy, collector = fake
    policy.start(0.0)
    collector.cost = 0.0005
    policy.tick(0.1)
    collector.automatic(0, 0.0001)
    collector.automatic(1, 0.0007)
    collector.automatic(0, 0.0003)
    collector.cost = 0.08
    policy.tick(60.0)
    assert policy.longest["start"] == pytest.approx(0.002)
    assert policy.longest["young"] == pytest.approx(0.0005)
    assert policy.longest["0"] == pytest.approx(0.0003)
    assert policy.longest["1"] == pytest.approx(0.0007)
    assert policy.longest["full"] == pytest.approx(0.08)
    assert policy.longest["2"] == 0.0
    line = policy.summary()
    assert "gc_young=1 gc_full=1" in line and "gc_max_ms_full=80.00" in line


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        GcPolicy(full_interval=0)
    assert DEFAULT_FULL_INTERVAL >= 600  # the full pause is rare


def test_a_frozen_index_of_tuples_is_not_walked_again() -> None:
    """A dict whose values are all untracked tuples (a sorted index) is untracked by a
    full collection and re-tracked, into generation 0, by the next tuple stored: the
    policy's young collections must not untrack it, or each tick walks it whole again."""
    policy = GcPolicy()
    policy.start(0.0)
    try:
        index = {i: (i, "k") for i in range(20_000)}
        policy.tick(0.1)
        index[1] = (2, "k" + str(len(index)))  # a new tuple: tracked
        policy.tick(0.2)
        index[2] = (3, "k" + str(len(index)))
        assert gc.is_tracked(index)
        assert not any(o is index for o in gc.get_objects())  # frozen: no collection walks it
    finally:
        policy.stop()


def test_with_the_real_gc_a_tick_walks_only_what_is_not_frozen() -> None:
    """A big container made before a tick is frozen by it: later collections do not walk
    it (the references they would visit are counted by gc.get_referents)."""
    policy = GcPolicy()
    policy.start(0.0)
    try:
        big: dict[bytes, list[int]] = {i.to_bytes(4, "big"): [] for i in range(50_000)}  # tracked values: walked when young
        assert any(o is big for o in gc.get_objects())
        policy.tick(0.1)
        unfrozen = gc.get_objects()
        assert not any(o is big for o in unfrozen)
        assert len(gc.get_referents(*unfrozen)) < 50_000
        assert gc.get_threshold()[2] > 1_000_000
    finally:
        policy.stop()
    assert gc.get_threshold()[2] < 1_000_000
    assert any(o is big for o in gc.get_objects())  # unfrozen again
