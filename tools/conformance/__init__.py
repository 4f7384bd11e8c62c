"""jet-conformance: the conformance suite of the jet wire protocol (issue 7).

Cases are data (``spec/conformance/*.json``, language in ``spec/conformance/README.md``);
this package loads them, runs them against any daemon over raw TCP with :mod:`jetwire`
only, and writes console, JSON, JUnit XML and HTML reports.
"""

from __future__ import annotations

from .cases import Case, CaseError, load_cases, select_cases
from .runner import CaseResult, RunConfig, run_cases

__all__ = ["Case", "CaseError", "CaseResult", "RunConfig", "load_cases", "run_cases", "select_cases"]
