"""Builds jet with its hot path compiled by mypyc when it can (issue 19), else pure Python.

Everything else is in pyproject.toml. The compiled modules are listed once, in
``jetwire/_pure.py`` (COMPILED_MODULES); their ``.py`` source stays in the package and is
what runs when the extension is missing. ``JET_PURE_PYTHON=1`` forces pure Python; so
does the absence of mypyc or of a working C compiler, with one line saying so.

The build is made to be quick on a small machine (issue 32): mypyc writes one C file per
module (``multi_file``) and they are compiled side by side, one compiler per core
(``JET_BUILD_JOBS`` to choose), each announced in one line. pip shows those lines with
``pip install -v``; without it pip shows a spinner, and the whole build takes under a
minute on 2 cores (BENCHMARKS.md, "Install time").
"""

from __future__ import annotations

import ast
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

# -O3: -O2 compiles in 0.84x the CPU but made the daemon core 7-16% slower per message
# (tools.bench.daemon_core --ab, BENCHMARKS.md "Install time"); one C file per module
# (multi_file) costs nothing measurable there. JET_OPT_LEVEL overrides it, for measuring.
OPT_LEVEL = "3"


def _compiled_modules() -> list[str]:
    """COMPILED_MODULES of jetwire/_pure.py, read without importing jetwire (its
    dependencies need not be installed in pip's build environment)."""
    tree = ast.parse(Path(__file__).with_name("jetwire").joinpath("_pure.py").read_text())
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "COMPILED_MODULES" and node.value is not None:
            return list(ast.literal_eval(node.value))
    raise RuntimeError("jetwire/_pure.py defines no COMPILED_MODULES")


HOT = [name.replace(".", "/") + ".py" for name in _compiled_modules()]


def _say(message: str) -> None:
    print(f"jet: {message}", file=sys.stderr, flush=True)


def _jobs() -> int:
    try:
        return max(1, int(os.environ.get("JET_BUILD_JOBS", "0"))) if os.environ.get("JET_BUILD_JOBS") else \
            len(os.sched_getaffinity(0))
    except (ValueError, AttributeError):
        return os.cpu_count() or 1


class OptionalBuildExt(build_ext):
    """build_ext that compiles an extension's C files in parallel, one line each, and
    falls back to pure Python when compiling fails (no compiler, no Python headers): then
    no extension at all is installed (the compiled modules share one library, so a part
    of them is no use) and the .py modules run instead."""

    def run(self) -> None:
        self._failure = ""
        self._started = time.monotonic()
        self._units = sum(len(ext.sources) for ext in self.extensions)
        self._done = 0
        self._lock = threading.Lock()
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
        elif self.extensions:
            _say(f"compiled the hot path in {time.monotonic() - self._started:.0f} s")

    def build_extension(self, ext: Any) -> None:
        if self._failure:
            return
        serial = self.compiler.compile
        jobs = _jobs()

        def compile_in_parallel(sources: list[str], *args: Any, **kwargs: Any) -> list[str]:
            # Largest first, so that the longest unit does not start last.
            order = sorted(sources, key=lambda s: -os.path.getsize(s) if os.path.exists(s) else 0)

            def one(source: str) -> list[str]:
                objects: list[str] = serial([source], *args, **kwargs)
                with self._lock:
                    self._done += 1
                    _say(f"[{self._done}/{self._units}] compiled {source}")
                return objects

            with ThreadPoolExecutor(max_workers=jobs) as pool:
                by_source = dict(zip(order, pool.map(one, order), strict=True))
            return [obj for source in sources for obj in by_source[source]]

        self.compiler.compile = compile_in_parallel
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._failure = str(exc)
        finally:
            self.compiler.compile = serial


def _metadata_only() -> bool:
    """True when setuptools runs this file only for metadata: pip's build backend does so
    twice before it builds (get_requires_for_build_wheel: egg_info; prepare_metadata:
    dist_info). Translating to C then would be thrown away (about 20 s each time)."""
    commands = [arg for arg in sys.argv[1:] if not arg.startswith("-")]
    return bool(commands) and all(cmd in ("egg_info", "dist_info") or os.path.sep in cmd or
                                  not cmd.isidentifier() for cmd in commands)


def _compiler_failure() -> str:
    """Why the C compiler that build_ext would use cannot build an extension (a file that
    includes Python.h), or "" when it can. Asked before mypyc translates: translating
    takes minutes of CPU on a busy 2-core machine, thrown away when nothing compiles."""
    import tempfile
    from distutils.ccompiler import new_compiler  # setuptools' copy (it is imported above)
    from distutils.sysconfig import customize_compiler
    from distutils.sysconfig import get_python_inc

    with tempfile.TemporaryDirectory(prefix="jet-cc-probe-") as work:
        source = os.path.join(work, "probe.c")
        with open(source, "w") as out:
            out.write("#include <Python.h>\nint jet_probe(void) { return 0; }\n")
        try:
            compiler: Any = new_compiler()
            customize_compiler(compiler)  # CC, CFLAGS, ... as build_ext would take them
            compiler.compile([source], output_dir=work, include_dirs=[get_python_inc()])
        except Exception as exc:  # distutils raises several unrelated types here
            return str(exc).strip() or type(exc).__name__
    return ""


def ext_modules() -> list[object]:
    if _metadata_only():
        return []
    if os.environ.get("JET_PURE_PYTHON", "") not in ("", "0"):
        _say("JET_PURE_PYTHON is set: installing pure Python")
        return []
    failure = _compiler_failure()
    if failure:
        _say(f"the compiled hot path could not be built (no working C compiler: {failure}); installing pure Python")
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
        started = time.monotonic()
        _say(f"translating {len(HOT)} modules to C with mypyc")
        extensions = list(mypycify([*HOT, *relaxed], opt_level=os.environ.get("JET_OPT_LEVEL", OPT_LEVEL),
                                   multi_file=True))
        _say(f"translated in {time.monotonic() - started:.0f} s; compiling with {_jobs()} jobs")
        return extensions
    except BaseException as exc:  # mypyc exits through SystemExit on a type error
        _say(f"mypyc failed ({exc!r}): installing pure Python")
        return []


setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
