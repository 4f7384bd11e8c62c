"""Which build of the hot path this process runs (issue 19): the modules compiled with
mypyc when the package was installed with a C compiler, or the pure-Python source they are
compiled from. ``setup.py`` decides at install time; ``JET_PURE_PYTHON=1`` there forces
pure Python. One source of truth: the compiled modules are these same ``.py`` files."""

from __future__ import annotations

import importlib.machinery
from importlib.metadata import PackageNotFoundError, version

__all__ = ["COMPILED_MODULES", "build_description", "compiled", "jet_version"]

# The modules setup.py compiles: the codec's frame splitter and decoder, and the daemon's
# sans-IO core (receive, route, fan-out) with the parts it calls.
COMPILED_MODULES = (
    "jetwire.codec",
    "jetd.frames",
    "jetd.connection",
    "jetd.base",
    "jetd.registry",
    "jetd.routes",
    "jetd.subscriptions",
    "jetd.query",
    "jetd.querying",
    "jetd.access",
    "jetd.core",
)


def compiled() -> bool:
    """True when the daemon core running here is a compiled extension module."""
    import jetd.core

    origin = jetd.core.__file__ or ""
    return origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def build_description() -> str:
    """``compiled (mypyc)`` or ``pure Python``, as ``jetd --version`` and its log say."""
    return "compiled (mypyc)" if compiled() else "pure Python"


def jet_version() -> str:
    try:
        return version("jet")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown"
