"""The fuzz harness runs without atheris: its seed corpus, and a bounded random run."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from tools.fuzz.fuzz_decoder import TestOneInput
from tools.fuzz.fuzz_decoder import make_corpus
from tools.fuzz.fuzz_decoder import replay


def test_seed_corpus_replays_clean(tmp_path: Path) -> None:
    written = make_corpus(tmp_path)
    assert written >= 200
    assert replay([tmp_path]) == 0


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=400))
def test_random_inputs_hold_every_invariant(data: bytes) -> None:
    TestOneInput(data)
