"""Builds jet with its hot path compiled by mypyc when it can (issue 19), else pure Python.

Everything else is in pyproject.toml. The compiled modules are listed in
``jetwire/_pure.py`` (COMPILED_MODULES); their ``.py`` source stays in the package and is
what runs when the extension is missing. ``JET_PURE_PYTHON=1`` forces pure Python; so
does the absence of mypyc or of a working C compiler, with one line saying so.
"""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

HOT = [
    "jetwire/codec.py",
    "jetd/frames.py",
    "jetd/connection.py",
    "jetd/base.py",
    "jetd/registry.py",
    "jetd/routes.py",
    "jetd/subscriptions.py",
    "jetd/query.py",
    "jetd/querying.py",
    "jetd/access.py",
    "jetd/core.py",
    "tools/jetdump/packets.py",
    "tools/jetdump/capture.py",
    "tools/jetdump/dissector.py",
    "tools/jetdump/events.py",
    "tools/ingest/chain.py",
]


def _say(message: str) -> None:
    print(f"jet: {message}", file=sys.stderr, flush=True)


class OptionalBuildExt(build_ext):
    """build_ext that falls back to pure Python when compiling fails (no compiler, no
    Python headers): then no extension at all is installed (the compiled modules share
    one library, so a part of them is no use) and the .py modules run instead."""

    def run(self) -> None:
        self._failure = ""
        try:
            super().run()
        except Exception as exc:  # distutils raises several unrelated types here
            self._failure = self._failure or str(exc)
        if self._failure:
            for ext in self.extensions:
                path = self.get_ext_fullpath(ext.name)
                if os.path.exists(path):
                    os.remove(path)
            _say(f"the compiled hot path could not be built ({self._failure.strip()}); installing pure Python")

    def build_extension(self, ext: object) -> None:
        if self._failure:
            return
        try:
            super().build_extension(ext)  # type: ignore[arg-type]
        except Exception as exc:
            self._failure = str(exc)


def ext_modules() -> list[object]:
    if os.environ.get("JET_PURE_PYTHON", "") not in ("", "0"):
        _say("JET_PURE_PYTHON is set: installing pure Python")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _say("mypyc is not available: installing pure Python")
        return []
    try:
        # The build environment may lack the runtime dependencies (pip's build isolation):
        # their types are then Any. The strict checks that this changes are for `make
        # lint`, which runs with them installed; the build needs the types only.
        relaxed = ["--no-warn-return-any", "--no-warn-unused-ignores", "--allow-subclassing-any",
                   "--allow-untyped-calls", "--allow-untyped-decorators", "--no-warn-unused-configs"]
        return list(mypycify([*HOT, *relaxed], opt_level="3"))
    except BaseException as exc:  # mypyc exits through SystemExit on a type error
        _say(f"mypyc failed ({exc!r}): installing pure Python")
        return []


setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
