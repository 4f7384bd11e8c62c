"""Which build of the hot path this process runs (issue 19): the modules compiled with
mypyc when the package was installed with a C compiler, or the pure-Python source they are
compiled from. ``setup.py`` decides at install time; ``JET_PURE_PYTHON=1`` there forces
pure Python, and when importing it runs the source of a compiled install
(:mod:`jetwire._pure`). One source of truth: the compiled modules are these same ``.py`` files."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version

from jetwire._pure import COMPILED_MODULES  # the one list (setup.py compiles them)

__all__ = ["COMPILED_MODULES", "build_description", "compiled", "jet_version"]


def compiled() -> bool:
    """True when the daemon core running here is a compiled extension module."""
    return _core_origin().endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def _core_origin() -> str:
    """Where ``jetd.core`` is loaded from, asked without importing it here: the core
    imports jetd.config, which imports this module for ``--version`` (no cycle)."""
    spec = importlib.util.find_spec("jetd.core")
    return (spec.origin if spec is not None else None) or ""


def build_description() -> str:
    """``compiled (mypyc)`` or ``pure Python``, as ``jetd --version`` and its log say;
    ``pure Python (JET_PURE_PYTHON is set)`` when a compiled install runs its source."""
    if compiled():
        return "compiled (mypyc)"
    from jetwire._pure import FORCED

    return "pure Python (JET_PURE_PYTHON is set)" if FORCED and _has_extension() else "pure Python"


def _has_extension() -> bool:
    base = os.path.splitext(_core_origin())[0]
    return any(os.path.exists(base + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def jet_version() -> str:
    try:
        return version("jet")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown"
