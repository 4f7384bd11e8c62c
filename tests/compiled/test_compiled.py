"""The compiled hot path (issue 19): the wheel that ``pip install .`` builds compiles the
modules of jetd/build.py with mypyc; it must behave exactly as the pure-Python source.

One wheel is built (as a user's install builds it) and unpacked; then:
- ``jetd --version`` tells the two builds apart;
- hypothesis feeds the same byte streams to both builds' Decoder and Daemon and every
  output byte must agree (tests/compiled/differential_worker.py);
- the daemon core's sans-IO tests and the codec tests run again with the compiled build,
  and the conformance suite (real TCP) against a compiled jetd. The whole tests/jetd
  (with its TCP tests) passes on the compiled build too (JET_TEST_SITE=DIR, see
  tests/conftest.py), but takes minutes more than CI's budget allows twice.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from jetwire import AddMethod
from jetwire import AddState
from jetwire import Authenticate
from jetwire import CallMethod
from jetwire import Close
from jetwire import FetchChange
from jetwire import FetchQuery
from jetwire import FetchStates
from jetwire import FilterOp
from jetwire import GetState
from jetwire import Info
from jetwire import NotifyState
from jetwire import PathMatcher
from jetwire import PathOp
from jetwire import Query
from jetwire import QueryOnce
from jetwire import RemoveState
from jetwire import Response
from jetwire import SetState
from jetwire import SortBy
from jetwire import Status
from jetwire import Unfetch
from jetwire import Value
from jetwire import ValueFilter
from jetwire import encode

REPO = Path(__file__).resolve().parents[2]
# pytest-timeout guards against hangs; here the first test that uses ``site`` also pays
# for building the wheel (about a minute on a quiet 2-core machine, many more on a busy
# one), which has its own bound below. Nothing in this module asserts a duration.
BUILD_TIMEOUT = 1200
pytestmark = pytest.mark.timeout(BUILD_TIMEOUT + 300)
WORKER = Path(__file__).with_name("differential_worker.py")


def _clean_env(**extra: str) -> dict[str, str]:
    # JET_TEST_TIMELINE (tests/conftest.py): a re-run's tests would be logged under this
    # worker's name, as if they ran beside this file.
    dropped = ("PYTHONPATH", "JET_PURE_PYTHON", "JET_TEST_SITE", "JET_TEST_TIMELINE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel ``pip wheel .`` builds, unpacked: an importable compiled jet. Built as the
    README's ``pip install .`` builds it, in pip's isolated build environment (mypy from
    the package index, none of jet's runtime dependencies there)."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: only the pure-Python build can be made here")
    work = tmp_path_factory.mktemp("compiled")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(work), str(REPO)],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT, env=_clean_env(),
    )
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = work.glob("jet-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    compiled = [n for n in names if n.endswith(".so")]
    assert any(n.startswith("jetd/core.") for n in compiled), f"no compiled core in the wheel: {compiled}"
    assert "jetd/core.py" in names  # the source stays: it is what runs without the extension
    assert any(n.startswith("tools/jetdump/capture.") for n in compiled), f"no compiled jetdump: {compiled}"
    site = work / "site"
    zipfile.ZipFile(wheel).extractall(site)
    zipfile.ZipFile(wheel).extractall(work / "site-full")  # as installed: jetdump compiled too
    # Only the compiled packages: tools (which finds spec/ next to itself) and peer come
    # from the checkout, as in the rest of the suite.
    for name in ("tools", "peer"):
        shutil.rmtree(site / name)
    return site


def _run(site: Path | None, *args: str, timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
    env = _clean_env(PYTHONPATH=str(site)) if site is not None else _clean_env(PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=site or REPO, **kw)  # type: ignore[call-overload]


def test_version_tells_the_builds_apart(site: Path) -> None:
    compiled = _run(site, "-m", "jetd", "--version")
    assert compiled.returncode == 0 and compiled.stdout.strip().endswith("compiled (mypyc)"), compiled
    pure = _run(None, "-m", "jetd", "--version")
    assert pure.returncode == 0 and pure.stdout.strip().endswith("pure Python"), pure


def _pure_wheel(source: Path, out: Path, timeout: float, **env: str) -> str:
    """``pip wheel -v`` of ``source`` into ``out`` (no build isolation) with ``env`` set;
    asserts it built one wheel without an extension module; returns pip's output."""
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v", "-w", str(out), str(source)],
        capture_output=True, text=True, timeout=timeout, env=_clean_env(**env),
    )
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = out.glob("jet-*.whl")
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".so")]
    return built.stdout + built.stderr


def test_pure_python_is_forced_by_the_environment(tmp_path: Path) -> None:
    """``JET_PURE_PYTHON=1 pip install .`` builds no extension, saying so in one line."""
    output = _pure_wheel(REPO, tmp_path, 300, JET_PURE_PYTHON="1")
    assert "jet: JET_PURE_PYTHON is set: installing pure Python" in output


def test_a_compiled_install_runs_its_source_with_jet_pure_python_set(site: Path) -> None:
    """``JET_PURE_PYTHON=1`` when importing: no extension module of jet is loaded."""
    probe = ("import sys, jetd.core, jetwire; from jetd.build import build_description; "
             "print(build_description()); "
             "print(sorted(m for m, mod in sys.modules.items() "
             "if (getattr(mod, '__file__', '') or '').endswith('.so') and m.split('.')[0] in "
             "('jetd', 'jetwire') or m.endswith('__mypyc')))")
    for forced, description, loaded in (("1", "pure Python (JET_PURE_PYTHON is set)", "[]"),
                                        ("", "compiled (mypyc)", None)):
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=site,
                              env=_clean_env(PYTHONPATH=str(site), JET_PURE_PYTHON=forced))
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0] == description, done.stdout
        if loaded is not None:
            assert lines[1] == loaded, done.stdout
        else:
            assert "jetd.core" in lines[1] and "jetwire.codec" in lines[1], done.stdout
    version = subprocess.run([sys.executable, "-m", "jetd", "--version"], capture_output=True, text=True, timeout=60,
                             cwd=site, env=_clean_env(PYTHONPATH=str(site), JET_PURE_PYTHON="1"))
    assert version.stdout.strip().endswith("pure Python (JET_PURE_PYTHON is set)"), version


def test_the_wheel_compiles_exactly_the_modules_jetwire_pure_lists(site: Path) -> None:
    """setup.py reads its list from jetwire/_pure.py (one list): every module there is an
    extension in the wheel, and no other module of jet is."""
    from jetwire._pure import COMPILED_MODULES

    names = zipfile.ZipFile(next(site.parent.glob("jet-*.whl"))).namelist()
    compiled = sorted(n.split(".")[0].replace("/", ".") for n in names
                      if n.endswith(".so") and "__mypyc" not in n)
    assert compiled == sorted(COMPILED_MODULES)


def test_without_a_compiler_it_installs_pure_python_saying_so(tmp_path: Path) -> None:
    """A C compiler that fails (CC=false) gives a pure-Python wheel and one line that
    says why, not a failed install."""
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "node_modules", "build", "tests", "scratch", "*.so", "__pycache__", ".*_cache"))
    output = _pure_wheel(source, tmp_path, 600, CC="false")
    said = [line.strip() for line in output.splitlines() if line.strip().startswith("jet: ")]
    # Progress lines, then one that says why; never a line claiming a compiled build.
    assert said and "could not be built" in said[-1] and "installing pure Python" in said[-1], said
    assert not [line for line in said if "compiled the hot path" in line], said


# --- the same bytes, the same output ------------------------------------------------------

_QUERY = Query((PathMatcher(PathOp.STARTS_WITH, ("k/",)),), (ValueFilter(FilterOp.GT, Value.of(0)),))
_FRAMES = [encode(m) for m in (
    Info("peer", 128), AddState(1, "p/a", Value.of(True)), SetState(2, "k/0", Value.of(7)), SetState(None, "k/1", Value.of("x")),
    GetState(3, "k/2"), GetState(4, "nope"), FetchStates(5, "k/"), Unfetch(6, 1), Unfetch(7, 999), CallMethod(8, "m/0", Value.of([1])),
    NotifyState(None, "p/a", Value.of(3)), NotifyState(9, "k/0", Value.of(1)), RemoveState(10, "p/a"), AddMethod(11, "p/m"),
    FetchQuery(12, _QUERY), QueryOnce(13, Query((PathMatcher(PathOp.STARTS_WITH, ("",)),), sort_by=SortBy.KEY,
                                                window_from=1, window_to=5)),
    Authenticate(14, "u", "p"), AddState(15, "k/0", Value.of(None)),
)]
# The peer sets its own state and calls its own method, then answers the routed requests
# (route ids start at 1): the routing fast paths both ways (PROTOCOL.md 10.3).
_EXCHANGES = [b"".join(encode(m) for m in exchange) for exchange in (
    (AddState(1, "p/a", Value.of(True)), SetState(16, "p/a", Value.of(False)),
     *(Response(oid, Status.OK, Value.of(oid)) for oid in (1, 2, 3))),
    (AddMethod(11, "p/m"), CallMethod(17, "p/m", Value.of(2)), CallMethod(18, "p/m", Value.of(b"x")),
     *(Response(oid, Status.OK, Value.of(b"raw")) for oid in (2, 1, 3))),
)]


@st.composite
def streams(draw: st.DrawFn) -> list[bytes]:
    parts = draw(st.lists(st.one_of(st.sampled_from(_FRAMES), st.sampled_from(_EXCHANGES), st.binary(max_size=12)),
                          min_size=1, max_size=25))
    data = bytearray(b"".join(parts))
    for _ in range(draw(st.integers(0, 3))):  # a few flipped bytes
        if data:
            data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
    cuts = sorted(set(draw(st.lists(st.integers(0, len(data)), max_size=6))))
    return [bytes(data[a:b]) for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


class _Worker:
    """differential_worker.py in one build, kept running: a line in, a line out."""

    def __init__(self, site: Path | None) -> None:
        env = _clean_env(PYTHONPATH=str(site or REPO))
        self.proc = subprocess.Popen([sys.executable, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env, cwd=site or REPO)

    def run(self, chunks: list[bytes]) -> object:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([c.hex() for c in chunks]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the worker died (exit {self.proc.poll()})"
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(30)


@pytest.fixture(scope="module")
def workers(site: Path) -> Iterator[tuple[_Worker, _Worker]]:
    compiled, pure = _Worker(site), _Worker(None)
    yield compiled, pure
    compiled.close()
    pure.close()


@settings(max_examples=300, deadline=None)
@given(streams())
def test_both_builds_give_the_same_output_for_the_same_bytes(workers: tuple[_Worker, _Worker],
                                                             chunks: list[bytes]) -> None:
    compiled, pure = workers
    assert compiled.run(chunks) == pure.run(chunks)


# --- jetdump: the compiled per-packet path prints what the source prints ----------------

_JETDUMP_WORKER = """
import contextlib, io, json, sys
import tools.jetdump.capture, tools.jetdump.dissector
from tools.jetdump.cli import main
runs = [[tools.jetdump.capture.__file__, tools.jetdump.dissector.__file__]]
for path in sys.argv[1:]:
    for extra in ([], ["--stats"], ["--json"], ["--port", "9"]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = main([*extra, path])
        runs.append([path, extra, code, out.getvalue()])
print(json.dumps(runs))
"""


def _random_capture(path: Path, seed: int) -> None:
    """A capture of a few jet connections as a network delivers them: frames whole, split
    and batched, segments lost, repeated and out of order, garbage, a non-default port."""
    import random

    from tools.jetdump.synth import CaptureWriter
    from tools.jetdump.synth import TcpSession

    rnd = random.Random(seed)
    frames = [encode(m) for m in (
        Info("peer", 1 << 20), SetState(1, "plant/temp", Value.of(21.5)), Response(1, value=Value.of(21.5)),
        FetchChange(3, "plant/temp", Value.of(22.0)), SetState(2, "a", Value.of("x" * 40)), Response(2),
        GetState(7, "plant/temp"), Response(7, Status.NOT_FOUND, message="no such state"),
        FetchStates(9, "plant/"), Close(Status.OK, "bye"))] + [b"\x01\x00\x00\x00\x01\x00", b"\xff" * 7]
    with open(path, "wb") as fh:
        writer = CaptureWriter(fh)
        for conn in range(rnd.randint(1, 3)):
            port = rnd.choice([11124, 11124, 4000 + conn])
            session = TcpSession(writer, (f"10.0.0.{conn + 2}", 40000 + conn), ("10.0.0.1", port))
            if rnd.random() < 0.8:
                session.handshake()
            for _ in range(rnd.randint(5, 60)):
                direction = rnd.randint(0, 1)
                data = b"".join(rnd.choice(frames) for _ in range(rnd.choice([1, 1, 1, 2, 5])))
                roll = rnd.random()
                if roll < 0.1:
                    session.skip(direction, rnd.randint(1, 30))  # lost
                    session.send(direction, data)
                elif roll < 0.2 and len(data) > 2:
                    cut = rnd.randint(1, len(data) - 1)  # out of order, then repeated
                    start = session.next[direction] - session.isn[direction] - 1
                    session.send(direction, data[cut:], at=start + cut, advance=False)
                    session.send(direction, data[:cut])
                    session.send(direction, data[cut:], at=start + cut)
                    session.send(direction, data[:cut], at=start)
                elif roll < 0.35 and len(data) > 2:
                    cut = rnd.randint(1, len(data) - 1)  # split
                    session.send(direction, data[:cut])
                    session.send(direction, data[cut:])
                else:
                    session.send(direction, data)
            if rnd.random() < 0.7:
                session.close()


def test_compiled_jetdump_prints_what_the_source_prints(site: Path, tmp_path: Path) -> None:
    full = site.parent / "site-full"
    paths = []
    for seed in range(40):
        paths.append(tmp_path / f"c{seed}.pcap")
        _random_capture(paths[-1], seed)
    from tools.bench.jetdump import write_capture

    for per_packet in (False, True):
        paths.append(tmp_path / f"bench-{per_packet}.pcap")
        write_capture(paths[-1], 3000, per_packet=per_packet)
    outputs = []
    # The compiled install; the checkout; the compiled install with JET_PURE_PYTHON=1.
    for root, forced in ((full, ""), (REPO, ""), (full, "1")):
        done = subprocess.run([sys.executable, "-c", _JETDUMP_WORKER, *map(str, paths)], capture_output=True,
                              text=True, timeout=300, cwd=root,
                              env=_clean_env(PYTHONPATH=str(root), JET_PURE_PYTHON=forced))
        assert done.returncode == 0, done.stderr[-3000:]
        outputs.append(json.loads(done.stdout))
    compiled, pure, forced_pure = outputs
    assert all(f.endswith(".so") for f in compiled[0]), compiled[0]
    assert all(f.endswith(".py") for f in pure[0] + forced_pure[0]), (pure[0], forced_pure[0])
    assert len(compiled) == len(pure) == len(forced_pure) == 1 + 4 * len(paths)
    for mine, theirs, forced_run in zip(compiled[1:], pure[1:], forced_pure[1:], strict=True):
        assert mine == theirs == forced_run, (mine[:3], theirs[:3])
    assert sum(run[3].count("\n") for run in pure[1:]) > 10_000  # they printed plenty


# --- the suites, again --------------------------------------------------------------------


# What the compiled modules are: the whole daemon suite (sans-IO core and real TCP, the
# daemons started from the compiled build through JET_TEST_SITE) and the codec's tests.
# Every test runs, each hypothesis test with a fifth of its examples (at least 10;
# tests/conftest.py): the full counts run on the pure build in the same suite, and
# test_both_builds_give_the_same_output_for_the_same_bytes feeds both builds the same
# bytes. What is no longer repeated is the other four fifths of the examples on the
# compiled build.
COMPILED_SUITE = ["tests/jetd", "tests/codec"]


def _suite_passes(root: Path, paths: list[str], timeout: float, **env: str) -> None:
    """Run the checkout's tests ``paths`` with ``root`` (an unpacked wheel) first on the
    path; the checkout after it, since some tests import tests.conftest."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--rootdir", str(REPO),
         "-c", str(REPO / "pyproject.toml"), *(str(REPO / path) for path in paths)],
        capture_output=True, text=True, timeout=timeout, cwd=root,
        env=_clean_env(PYTHONPATH=f"{root}{os.pathsep}{REPO}", **env),
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout


def test_daemon_and_codec_tests_pass_on_the_compiled_build(site: Path) -> None:
    check = _run(site, "-c", "import jetd.build as b; print(b.build_description())")
    assert check.stdout.strip() == "compiled (mypyc)", check
    _suite_passes(site, COMPILED_SUITE, BUILD_TIMEOUT, JET_TEST_SITE=str(site))  # the daemons it starts too


def test_log_reader_tests_pass_on_the_compiled_record_walk(site: Path) -> None:
    """tests/ingest/test_parse.py (with its hypothesis test of damage at random offsets
    and random chunk sizes against a reference reader) on the installed wheel, whose
    tools.ingest.chain is compiled."""
    full = site.parent / "site-full"
    check = _run(full, "-c", "import tools.ingest.chain as c; print(c.__file__)")
    assert check.stdout.startswith(str(full)) and check.stdout.strip().endswith(".so"), check
    _suite_passes(full, ["tests/ingest/test_parse.py"], 300)


def test_conformance_suite_passes_against_a_compiled_jetd(site: Path) -> None:
    daemon = subprocess.Popen([sys.executable, "-m", "jetd", "--host", "127.0.0.1", "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env=_clean_env(PYTHONPATH=str(site)), cwd=site)
    try:
        assert daemon.stdout is not None
        line = daemon.stdout.readline()
        address = line.split()[-1]
        result = _run(None, "-m", "tools.conformance", "--strict", address, timeout=300)
        assert result.returncode == 0, result.stdout[-4000:]
    finally:
        daemon.terminate()
        daemon.wait(10)
