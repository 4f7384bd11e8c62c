"""How ``make test`` hands the files to the xdist workers: longest first, as
tests/conftest.py orders them. A long file handed out late sets the suite's end."""

from __future__ import annotations

import re

from tests.conftest import _LONGEST_FIRST
from tests.conftest import REPO


def _test_recipe() -> str:
    makefile = (REPO / "Makefile").read_text()
    match = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert match, "no test rule in the Makefile"
    return match.group(1)


def test_make_test_keeps_the_conftest_order() -> None:
    """Without --no-loadscope-reorder xdist re-sorts the files by their number of tests
    (at 5abd833 the 346 s cluster file went out 59th of 119)."""
    recipe = _test_recipe()
    assert "--dist loadfile" in recipe, recipe
    assert "--no-loadscope-reorder" in recipe, recipe


def test_every_longest_file_exists() -> None:
    """A renamed or removed file would silently drop out of the order."""
    missing = [path for path in _LONGEST_FIRST if not (REPO / path).is_file()]
    assert not missing, missing
    assert len(set(_LONGEST_FIRST)) == len(_LONGEST_FIRST)
