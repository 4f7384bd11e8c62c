"""spec/vectors/README.md: the language-neutral FLOAT64 readings read back exactly."""

from __future__ import annotations

import math
import shutil
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tools.vectors import float_hex
from tools.vectors import float_text


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_readings_round_trip(x: float) -> None:
    assert math.copysign(1.0, float(float_text(x))) == math.copysign(1.0, x)
    assert float(float_text(x)) == x
    assert float.fromhex(float_hex(x)) == x
    assert float_hex(x).lstrip("-").startswith(("0x1", "0x0p"))


def test_layout_is_javascripts():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    samples = [22.5, 100.0, 1.5e-6, 1e-7, 1e21, 1e20, 5e-324, 1.7976931348623157e308, 0.1, 1 / 3, -2.5e-300, 123456.789]
    script = "for (const x of process.argv.slice(1)) console.log(String(Number(x)))"
    out = subprocess.run([node, "-e", script, *map(repr, samples)], capture_output=True, text=True, timeout=30)
    assert out.stdout.split() == [float_text(x) for x in samples]
    assert (float_text(-0.0), float_text(math.inf), float_text(math.nan)) == ("-0", "Infinity", "NaN")
