"""jet-conformance: the conformance suite of the jet wire protocol (issue 7).

Cases are data (``spec/conformance/*.json``, language in ``spec/conformance/README.md``);
this package loads them, runs them against any daemon over raw TCP with :mod:`jetwire`
only, and writes console, JSON, JUnit XML and HTML reports.
"""

from __future__ import annotations

from .cases import Case
from .cases import CaseError
from .cases import load_cases
from .cases import select_cases
from .runner import CaseResult
from .runner import RunConfig
from .runner import run_cases

__all__ = ["Case", "CaseError", "CaseResult", "RunConfig", "load_cases", "run_cases", "select_cases"]
