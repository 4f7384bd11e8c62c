"""``jet-ingest`` on a real Spark standalone cluster: a master and a one-core worker
started with pyspark's own launcher (``spark-class``) on 127.0.0.1, stopped at the end.

The worker (and so every executor it starts) runs in a private mount namespace in which
a tmpfs is mounted over ``driver-only/``: a directory that exists, with files in it, for
the driver, and is empty for the executors, as a local disk of the driver's machine
is on a real cluster. Each failure case puts the log directory or the warehouse there.
And ``short-copy/`` is bind-mounted over ``short/``: the executors see other files at
the driver's paths there (a stale network-filesystem or object-store cache).

One driver process runs ``jet-ingest``'s ``main`` three times (one JVM start, three
Spark applications): with paths every node sees, with a log directory the executors
cannot see, and with a warehouse they cannot see.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from tools.ingest.session import REPO_ROOT

pytestmark = [pytest.mark.spark, pytest.mark.slow]

pyspark = pytest.importorskip("pyspark")
SPARK_CLASS = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _can_unshare() -> bool:
    if not shutil.which("unshare"):
        return False
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, check=False)
    return done.returncode == 0 and os.geteuid() == 0


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.hidden = root / "driver-only"
        self.hidden.mkdir()
        # short/ as the driver sees it; the executors see short-copy/ there (bind-mounted):
        # a stale copy of the files at the same paths.
        self.short, self.short_copy = root / "short", root / "short-copy"
        self.short.mkdir()
        self.short_copy.mkdir()
        self.port, self.ui = _free_port(), _free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_HOME": os.path.dirname(pyspark.__file__),
                    "PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(root / "logs"),
                    "SPARK_WORKER_DIR": str(root / "work")}
        self.procs: list[subprocess.Popen[bytes]] = []

    def _start(self, cmd: list[str], log: str) -> None:
        with open(self.root / log, "wb") as out:
            self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                               start_new_session=True))

    def start(self) -> None:
        self._start([SPARK_CLASS, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                     "--port", str(self.port), "--webui-port", str(self.ui)], "master.log")
        worker = [SPARK_CLASS, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                  "--memory", "1g", "--webui-port", str(_free_port()), "--work-dir", str(self.root / "work"),
                  self.url]
        # The executors inherit the worker's mount namespace: driver-only/ is empty there.
        self._start(["unshare", "-m", "--propagation", "private", "sh", "-c",
                     f'mount -t tmpfs jet-test-hidden "{self.hidden}" && '
                     f'mount --bind "{self.short_copy}" "{self.short}" && exec "$@"', "sh", *worker], "worker.log")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=5) as reply:
                    state = json.load(reply)
                if any(w.get("state") == "ALIVE" for w in state.get("workers", [])):
                    return
            except OSError:
                pass
            for p in self.procs:
                assert p.poll() is None, (self.root / "master.log").read_text()[-2000:] + \
                    (self.root / "worker.log").read_text()[-2000:]
            time.sleep(0.5)
        raise AssertionError("the Spark worker did not register with the master in 120 s")

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)  # its own session: the daemon and its executors
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not _can_unshare():
        pytest.skip("needs root and unshare(1) to give the worker its own mounts")
    c = Cluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


_DRIVER = """
import json, sys
from tools.ingest.cli import main
for argv in json.loads(sys.argv[1]):
    print("EXIT", main(argv), flush=True)
"""


_DRIVER_WITH_PYTHON = """
import json, os, sys
from tools.ingest.cli import main
for python, argv in json.loads(sys.argv[1]):
    os.environ["PYSPARK_PYTHON"] = python  # read by each new SparkContext
    print("EXIT", main(argv), flush=True)
"""


def _rows(warehouse: Path, table: str) -> list[tuple[Any, ...]]:
    t = DeltaTable(str(warehouse / table)).to_pyarrow_table().drop_columns(["date"])
    cols = [c for c in t.column_names if c != "file"]  # the same segments, at other paths
    return sorted((tuple(r[c] for c in cols) for r in t.select(cols).to_pylist()), key=repr)


def test_on_a_cluster_tables_match_local_and_invisible_paths_fail_loudly(cluster: Cluster, tmp_path: Path) -> None:
    from jetd_logs import RUN
    from jetd_logs import JetdLog

    from tools.ingest.cli import ingest_once
    from tools.ingest.warehouse import Warehouse

    shared = tmp_path / "logs"
    shared.mkdir()
    JetdLog(21, 300).write(shared / "jetd-a.jetlog", damage=2)
    JetdLog(22, 300, start_ns=RUN + 10**12).write(shared / "jetd-b.jetlog", created_ns=RUN + 10**12)
    hidden_logs = cluster.hidden / "logs"
    shutil.copytree(shared, hidden_logs)
    runs = [
        [str(shared), "--out", str(tmp_path / "wh"), "--master", cluster.url, "--no-report"],
        [str(hidden_logs), "--out", str(tmp_path / "wh-hidden-logs"), "--master", cluster.url, "--no-report"],
        [str(shared), "--out", str(cluster.hidden / "wh"), "--master", cluster.url, "--no-report"],
    ]
    env = {**cluster.env, "PYTHONPATH": REPO_ROOT, "COLUMNS": "300"}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    done = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(runs)], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    out = " ".join(done.stdout.split())  # as one line, however the console wrapped it
    exits = [int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("EXIT")]
    assert exits == [0, 1, 1], (out, done.stderr[-3000:])

    # 1. Paths every node sees: the same tables as a local ingest.
    local = tmp_path / "wh-local"
    ingest_once(None, str(shared), local)
    for table in ("frames", "requests", "state_changes", "connections", "traffic"):
        assert _rows(tmp_path / "wh", table) == _rows(local, table), table
    assert Warehouse.load(tmp_path / "wh").rows("frames") > 0

    # 2. A log directory the executors cannot see: a clear message, nothing marked done.
    assert "could not open 2 log file(s) the driver sees" in out, out
    assert "log directory must be visible at the same path on every executor" in out
    assert "nothing of this run was committed" in out
    assert "no records ingested yet" not in out
    assert Warehouse.load(tmp_path / "wh-hidden-logs").version == 0
    # ... so a later run that can read them ingests everything.
    assert ingest_once(None, str(hidden_logs), tmp_path / "wh-hidden-logs") == \
        Warehouse.load(tmp_path / "wh").rows("frames")

    # 3. A warehouse the executors cannot see: their Parquet files are not where the driver looks.
    assert "not in the warehouse as the driver sees it" in out, out
    assert "warehouse must be a path every executor and the driver share" in out
    assert Warehouse.load(cluster.hidden / "wh").version == 0
    assert "Traceback" not in out + done.stderr


# PYSPARK_PYTHON for executors without jet: the test's Python with this checkout (on the
# path, or installed editable) taken off the import path. Spark starts its Python
# workers as ``PYTHON -m MODULE``.
_PYTHON_WITHOUT_JET = """#!{python}
import os, runpy, sys
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != {repo!r} and "__editable__" not in p]
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
for name in {also_hidden!r}:
    sys.modules[name] = None  # import of NAME halted
if sys.argv[1:2] != ["-m"]:
    raise SystemExit("expected -m MODULE, got %r" % sys.argv[1:])
sys.argv = [sys.argv[2], *sys.argv[3:]]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def test_on_a_cluster_whose_python_lacks_jet_the_ingest_ships_its_own_code(cluster: Cluster, tmp_path: Path) -> None:
    from jetd_logs import JetdLog

    from tools.ingest.cli import ingest_once

    def python(name: str, also_hidden: tuple[str, ...] = ()) -> str:
        path = tmp_path / name
        path.write_text(_PYTHON_WITHOUT_JET.format(python=sys.executable, repo=os.path.realpath(REPO_ROOT),
                                                   also_hidden=also_hidden))
        path.chmod(0o755)
        return str(path)

    without_jet, without_pyarrow = python("python-without-jet"), python("python-without-pyarrow", ("pyarrow",))
    env = {**cluster.env, "PYTHONPATH": REPO_ROOT, "COLUMNS": "300"}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    # That Python really cannot import jet ...
    hidden = subprocess.run([without_jet, "-m", "pyspark_jetlog"], env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert hidden.returncode != 0 and "No module named pyspark_jetlog" in hidden.stderr, hidden.stderr

    # ... and the executors (and the driver's planner) run it: jet-ingest ships its code.
    # What it cannot ship (pyarrow, compiled) is named in a message, not a traceback.
    logs = tmp_path / "logs"
    logs.mkdir()
    JetdLog(23, 300).write(logs / "jetd-a.jetlog", damage=1)
    runs = [(without_pyarrow, [str(logs), "--out", str(tmp_path / "wh-bad"), "--master", cluster.url, "--no-report"]),
            (without_jet, [str(logs), "--out", str(tmp_path / "wh"), "--master", cluster.url, "--no-report"])]
    done = subprocess.run([sys.executable, "-c", _DRIVER_WITH_PYTHON, json.dumps(runs)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    out = " ".join(done.stdout.split())
    assert [line for line in done.stdout.splitlines() if line.startswith("EXIT")] == ["EXIT 1", "EXIT 0"], \
        (out, done.stderr[-3000:])
    assert "a Spark worker's Python cannot import what the jetlog source needs" in out, out
    assert "pyarrow" in out and "PYSPARK_PYTHON" in out and "Traceback" not in out + done.stderr
    local = tmp_path / "wh-local"
    ingest_once(None, str(logs), local)
    for table in ("frames", "requests", "state_changes", "connections", "traffic"):
        assert _rows(tmp_path / "wh", table) == _rows(local, table), table


def test_on_a_cluster_an_executor_that_sees_a_shorter_copy_fails_the_run(cluster: Cluster, tmp_path: Path) -> None:
    """Issue 27: the driver sees a whole segment, the executors a shorter copy at the
    same path. jet-ingest exits 1 naming the file and both sizes, and commits nothing
    (it used to report the records of the copy and mark the whole segment done)."""
    from jetd_logs import JetdLog

    from tools.ingest.cli import ingest_once
    from tools.ingest.warehouse import Warehouse

    logs, copy = cluster.short / tmp_path.name, cluster.short_copy / tmp_path.name
    logs.mkdir()
    copy.mkdir()
    JetdLog(24, 1500).write(logs / "jetd-a.jetlog")
    JetdLog(25, 300, start_ns=10**9 + 1_767_225_600_000_000_000).write(logs / "jetd-b.jetlog",
                                                                        created_ns=1_767_225_601_000_000_000)
    data = (logs / "jetd-a.jetlog").read_bytes()
    (copy / "jetd-a.jetlog").write_bytes(data[: len(data) // 2])
    shutil.copy(logs / "jetd-b.jetlog", copy / "jetd-b.jetlog")  # the same everywhere
    wh = tmp_path / "wh"
    env = {**cluster.env, "PYTHONPATH": REPO_ROOT, "COLUMNS": "300"}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    runs = [[str(logs), "--out", str(wh), "--master", cluster.url, "--no-report"]]
    done = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(runs)], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    out = " ".join(done.stdout.split())
    assert [line for line in done.stdout.splitlines() if line.startswith("EXIT")] == ["EXIT 1"], \
        (out, done.stderr[-3000:])
    assert (f"{logs / 'jetd-a.jetlog'}: shorter than the driver planned to read ({len(data) // 2:,} bytes here, "
            f"{len(data):,} planned by the driver)") in out, out
    assert "nothing of this run was committed" in out and "Traceback" not in out + done.stderr
    assert Warehouse.load(wh).version == 0
    # Nothing was marked done: once the executors see the whole file, all of it is ingested.
    assert ingest_once(None, str(logs), wh) > 0
    assert Warehouse.load(wh).rows("frames") == ingest_once(None, str(logs), tmp_path / "wh-local") > 0


def _start_jetd(where: Path, *args: str) -> tuple[subprocess.Popen[bytes], tuple[str, int]]:
    """``python -m jetd --host 127.0.0.1 --port 0 ARGS``, its output to a file (never a
    pipe nobody reads); returns it and the address from its ``jetd listening on`` line."""
    out = where / "jetd.out"
    with open(out, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "jetd", "--host", "127.0.0.1", "--port", "0", *args],
                                stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": REPO_ROOT})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for line in out.read_text(errors="replace").splitlines():
            if line.startswith("jetd listening on "):
                host, _, port = line[len("jetd listening on "):].strip().rpartition(":")
                return proc, (host, int(port))
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    raise AssertionError(f"jetd did not start: {out.read_text()[-2000:]}")


class _Traffic:
    """A peer that adds states and notifies them (events) as fast as jetd takes them, and
    drains what jetd sends back, until stopped."""

    def __init__(self, host: str, port: int) -> None:
        import threading

        from jetwire import AddState
        from jetwire import Info
        from jetwire import Value
        from jetwire import encode

        self.sock = socket.create_connection((host, port), timeout=30)
        self.sock.sendall(encode(Info(name="owner")) + b"".join(
            encode(AddState(i + 1, f"k/{i}", Value.of(0))) for i in range(10)))
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._send, daemon=True),
                        threading.Thread(target=self._drain, daemon=True)]
        for t in self.threads:
            t.start()

    def _send(self) -> None:
        from jetwire import NotifyState
        from jetwire import Value
        from jetwire import encode

        n = 0
        while not self.stopped.is_set():
            self.sock.sendall(b"".join(encode(NotifyState(None, f"k/{(n + i) % 10}", Value.of(n + i)))
                                       for i in range(20)))
            n += 20
            time.sleep(0.01)

    def _drain(self) -> None:
        while not self.stopped.is_set():
            try:
                if not self.sock.recv(1 << 16):
                    return
            except OSError:
                return

    def stop(self) -> None:
        self.stopped.set()
        self.threads[0].join(30)
        self.sock.close()
        self.threads[1].join(30)


@pytest.mark.timeout(1200)  # four JVM starts on a busy 2-core machine
def test_on_a_cluster_follow_killed_at_random_moments_ingests_each_record_once(cluster: Cluster,
                                                                                tmp_path: Path) -> None:
    """Issue 27 item 4: ``jet-ingest --follow --master spark://...`` against a live jetd,
    SIGKILLed (driver and its JVM) at random moments and started again, three times,
    then left to finish (``--idle-exit``) after jetd stopped: frames holds every record a
    strict whole-file read of the segments finds, once each."""
    import random

    from jetwire.log import LogRecord
    from jetwire.log import iter_log
    from tools.ingest.warehouse import Warehouse

    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    logs, wh = tmp_path / "logs", tmp_path / "wh"
    logs.mkdir()
    daemon, (host, port) = _start_jetd(tmp_path, "--log-dir", str(logs), "--log-rotate-size", "300000")
    traffic = None
    env = {**cluster.env, "PYTHONPATH": REPO_ROOT, "COLUMNS": "300"}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    follow = [sys.executable, "-m", "tools.ingest", str(logs), "--out", str(wh), "--master", cluster.url,
              "--no-report", "--follow", "--interval", "1"]
    kills: list[float] = []  # seconds after each start
    commits: list[int] = []  # the warehouse's snapshot after each kill
    procs: list[subprocess.Popen[bytes]] = []  # each in its own session: its JVM is killed with it
    try:
        traffic = _Traffic(host, port)
        for i in range(3):
            log = tmp_path / f"follow-{i}.out"
            with open(log, "wb") as out:
                proc = subprocess.Popen(follow, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            procs.append(proc)
            started = time.monotonic()
            if i:
                # Once it follows: in a micro-batch's planning, reading or commit, or between two.
                # (The first run is killed wherever it is: JVM start, the batch run, a micro-batch.)
                deadline = started + 400
                while "micro-batch" not in log.read_text(errors="replace") and time.monotonic() < deadline:
                    assert proc.poll() is None, (seed, log.read_text()[-3000:])
                    time.sleep(0.2)
            at = rnd.uniform(0, 3) if i else rnd.uniform(3, 30)
            try:
                proc.wait(at)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
                kills.append(round(time.monotonic() - started, 1))
            assert proc.returncode == -signal.SIGKILL, (seed, log.read_text()[-3000:])
            commits.append(Warehouse.load(wh).version)
        if traffic is not None:
            traffic.stop()
            traffic = None
        daemon.terminate()
        assert daemon.wait(30) == 0, (tmp_path / "jetd.out").read_text()[-3000:]
        # What is left, by a last --follow that stops once nothing new arrives.
        with open(tmp_path / "follow-last.out", "wb") as out:
            procs.append(subprocess.Popen([*follow, "--idle-exit", "5"], env=env, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        assert procs[-1].wait(600) == 0, (seed, (tmp_path / "follow-last.out").read_text()[-3000:])
    finally:  # also when the test fails or times out: nothing it started outlives it
        if traffic is not None:
            traffic.stop()
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)

    strict = set()
    for seg in sorted(logs.iterdir()):
        with open(seg, "rb") as fh:
            strict |= {(str(seg), item.offset) for item in iter_log(fh) if isinstance(item, LogRecord)}
    t = DeltaTable(str(wh / "frames")).to_pyarrow_table(columns=["file", "offset"])
    got = list(zip(t.column("file").to_pylist(), t.column("offset").to_pylist(), strict=True))
    assert len(strict) > 1000 and len(list(logs.iterdir())) > 1, (seed, len(strict))
    assert len(got) == len(set(got)), (seed, "duplicates", len(got) - len(set(got)))
    assert set(got) == strict, (seed, kills, commits, len(strict - set(got)), len(set(got) - strict))
    assert commits[-1] > commits[0] > 0 or commits[-1] > 0, (seed, kills, commits)  # killed after commits too
    assert Warehouse.load(wh).rows("frames") == len(strict)


# Before the tasks write Parquet files, after they wrote them, after frames' commit, after
# the whole commit: where the executors' part ends and the driver's commits begin.
# tests/ingest/test_commit.py has every point, JVM-free, "planned" among them (the driver
# alone, as here).
CLUSTER_CRASH_POINTS = ["tasks", "staged", "committed-frames", "committed"]


@pytest.mark.timeout(2400)  # six JVM starts on a busy 2-core machine
def test_on_a_cluster_crashes_at_each_commit_point_lose_and_duplicate_nothing(cluster: Cluster,
                                                                             tmp_path: Path) -> None:
    """Issue 31: ``jet-ingest --master spark://...`` killed (``os._exit``, as SIGKILL) at
    each commit point of its second run; then one driver finishes every warehouse on the
    cluster while a reader thread reads every table's latest version with delta-rs. Each
    warehouse ends with every record a strict whole-file read finds, once; every read
    showed a whole version (the counts before the run or after it, nothing between)."""
    import threading

    from test_concurrent_reader import read_whole_versions

    from tools.ingest.cli import ingest_once
    from tools.ingest.parse import read_segment
    from tools.ingest.synth import BASE_NS
    from tools.ingest.synth import write_synthetic_log
    from tools.ingest.warehouse import CRASH_ENV
    from tools.ingest.warehouse import TABLES
    from tools.ingest.warehouse import Warehouse

    base, logs = tmp_path / "base", tmp_path / "logs"
    logs.mkdir()
    for i in range(6):
        if i == 3:  # a first run, committed before the crashes (JVM-free)
            ingest_once(None, str(logs), base)
        write_synthetic_log(str(logs / f"jet-{i:03d}.jetlog"), 300, segment=i, start_ns=BASE_NS + i * 10**10)
    before = {t: DeltaTable(str(base / t)).to_pyarrow_table().num_rows for t in TABLES}
    env = {**cluster.env, "PYTHONPATH": REPO_ROOT, "COLUMNS": "300"}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    warehouses = {point: tmp_path / f"wh-{point}" for point in CLUSTER_CRASH_POINTS}
    for point, wh in warehouses.items():
        shutil.copytree(base, wh)
        runs = [[str(logs), "--out", str(wh), "--master", cluster.url, "--no-report"]]
        done = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(runs)], env={**env, CRASH_ENV: point},
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 86, (point, done.stdout[-2000:], done.stderr[-3000:])
        assert (wh / "_jet_ingest" / "commit.json").exists() == (point in ("planned", "committed-frames")), point

    stop = threading.Event()
    seen: dict[str, list[tuple[str, int, int, int]]] = {p: [] for p in warehouses}
    errors: list[BaseException] = []
    readers = [threading.Thread(target=read_whole_versions, args=(wh, stop, seen[p], errors), daemon=True)
               for p, wh in warehouses.items()]
    for r in readers:
        r.start()
    try:
        runs = [[str(logs), "--out", str(wh), "--master", cluster.url, "--no-report"] for wh in warehouses.values()]
        done = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(runs)], env=env, capture_output=True,
                              text=True, timeout=900, check=False)
    finally:
        stop.set()
        for r in readers:
            r.join(600)
    assert [line for line in done.stdout.splitlines() if line.startswith("EXIT")] == ["EXIT 0"] * len(warehouses), \
        (done.stdout[-3000:], done.stderr[-3000:])
    assert not errors, errors

    strict = sorted((str(f), o) for f in sorted(logs.iterdir()) for b in read_segment(str(f))
                    for o in b.column("offset").to_pylist())
    local = tmp_path / "wh-local"  # the same two runs, never killed, JVM-free
    shutil.copytree(base, local)
    ingest_once(None, str(logs), local)
    after = {t: DeltaTable(str(local / t)).to_pyarrow_table().num_rows for t in TABLES}
    for point, wh in warehouses.items():
        t = DeltaTable(str(wh / "frames")).to_pyarrow_table(columns=["file", "offset"])
        got = list(zip(t.column("file").to_pylist(), t.column("offset").to_pylist(), strict=True))
        assert len(got) == len(set(got)), (point, "duplicates")
        assert sorted(got) == strict, (point, len(got), len(strict))
        m = Warehouse.load(wh)
        assert m.version == 2 and m.rows("frames") == len(strict), point
        assert {t: DeltaTable(str(wh / t)).to_pyarrow_table().num_rows for t in TABLES} == after, point
        for table in TABLES:
            runs_of = [h.get("jet.run") for h in DeltaTable(str(wh / table)).history()
                       if h.get("jet.operation") == "ingest"]
            assert len(runs_of) == len(set(runs_of)), (point, table)  # no run committed twice
        assert seen[point], point
        torn = [(table, version, rows) for table, version, rows, keys in seen[point]
                if rows not in (before[table], after[table]) or rows != keys]
        assert not torn, (point, torn[:5], before, after)
