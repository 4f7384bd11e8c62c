"""Building a SparkSession that can run the ``jetlog`` source.

The Python workers import ``tools.ingest`` and ``jetwire``. On one machine they inherit
``PYTHONPATH`` from the driver's environment, which :func:`spark_session` extends with
this repository. On a cluster, numpy and pyarrow cannot travel with ``--py-files``
(they are compiled): install the project with its ``spark`` extra on every node
(``pip install 'jet[spark]'``), or ship a packed environment with
``spark-submit --archives jet-env.tar.gz#env`` (made with ``venv-pack`` or
``conda-pack``) and ``--conf spark.pyspark.python=./env/bin/python``.

On a master that is not local, :func:`spark_session` also ships jet's own Python code
(:func:`ship_code`): the executors then need only numpy and pyarrow, and they run the
driver's version of the parser whatever jet they have installed.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any
from typing import Optional

__all__ = ["REPO_ROOT", "class_data_sharing", "ship_code", "spark_session"]

REPO_ROOT = str(Path(__file__).resolve().parent.parent.parent)
DEFAULT_LOCAL_MEMORY = "4g"


def _driver_running() -> bool:
    """A driver JVM exists already (a session in this process, or spark-submit's)."""
    from pyspark import SparkContext

    return SparkContext._active_spark_context is not None or "PYSPARK_GATEWAY_PORT" in os.environ


def _with_repo(pythonpath: str) -> str:
    parts = [p for p in pythonpath.split(os.pathsep) if p]
    return os.pathsep.join([REPO_ROOT, *[p for p in parts if p != REPO_ROOT]])


# Quiet: a missing or mismatched archive is skipped (the JVM runs as without one), and
# whatever the VM still has to say goes to stderr, not into jet-ingest's report.
_CDS_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off -XX:+DisplayVMOutputToStderr"
_PART_SETTLED_S = 30.0  # a partial archive this old is no longer being written
_STALE_S = 30 * 86400  # another install's archive unused this long is deleted
# A complete dynamic archive starts with this magic; HotSpot writes the header last, so a
# writer killed mid-dump leaves zeros here.
_DYNAMIC_MAGIC = bytes.fromhex("a8ab0bf0")


def _java() -> Optional[str]:
    """The java that pyspark's launcher runs (spark-class: $JAVA_HOME/bin/java, else PATH)."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.exists(found) else None


def _cds_blocked() -> bool:
    """The driver JVM's options or class path are the user's to set here: a Spark conf
    directory with files in it (its spark-defaults.conf may set the driver's java
    options, which ours would replace; and HotSpot cannot record an archive with a
    non-empty directory on the class path), or java options in PYSPARK_SUBMIT_ARGS."""
    import pyspark

    submit = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    if "extraJavaOptions" in submit or "--driver-java-options" in submit:
        return True
    home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    conf = os.environ.get("SPARK_CONF_DIR") or os.path.join(home, "conf")
    try:
        return any(os.scandir(conf))
    except OSError:
        return False


def class_data_sharing(cache_dir: Optional[str] = None) -> Optional[str]:
    """JVM options that load the local driver JVM's classes from a class-data-sharing
    archive (JDK CDS), or that make this run write one when it exits; None if off.

    Spark loads some 20,000 classes, and parsing and verifying them is a good part of a
    short ``jet-ingest`` run. The first local run on a machine writes an archive of the
    classes it loaded (``-XX:ArchiveClassesAtExit``, about 200 MB, in
    ``$JET_INGEST_CDS_DIR``, else ``$XDG_CACHE_HOME/jet``, else ``~/.cache/jet``); later
    runs map it (``-XX:SharedArchiveFile``). The archive is keyed by the java binary and
    the pyspark install. A JVM can crash mapping a truncated archive, and a killed
    writer leaves one, so an archive is used only once it has its header and a
    throwaway ``java -version`` has mapped it. Opt-in (``JET_INGEST_CDS=1``): it saves
    3-6 s of a 50 s ingest (BENCHMARKS.md) for 200 MB of cache and a first run that is
    slower. Even when asked for, off (None) when the cache directory cannot be written or
    its path has a space or quote (Spark splits java options on spaces), and when the
    user sets the driver's java options or class path (:func:`_cds_blocked`).
    """
    if os.environ.get("JET_INGEST_CDS") != "1" or _cds_blocked():
        return None
    java = _java()
    if java is None:
        return None
    import pyspark

    root = Path(cache_dir or os.environ.get("JET_INGEST_CDS_DIR")
                or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jet").absolute()
    if any(c.isspace() or c in "\"'\\" for c in str(root)):
        return None
    ident = f"{java}:{os.stat(java).st_mtime_ns}:{pyspark.__file__}:{pyspark.__version__}"
    key = hashlib.sha256(ident.encode()).hexdigest()[:16]
    archive = root / f"spark-driver-{key}.jsa"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=root):  # root may bypass os.access on a read-only mount
            pass
        now = time.time()
        for other in glob.glob(str(root / "spark-driver-*.jsa*")):
            if key not in os.path.basename(other) and now - os.stat(other).st_mtime > _STALE_S:
                os.unlink(other)  # another java or pyspark, long unused
        if archive.exists() and not _complete(str(archive)):
            os.unlink(archive)
        writing = False
        for part in sorted(glob.glob(str(archive) + ".*.part")):
            if now - os.stat(part).st_mtime < _PART_SETTLED_S:
                writing = True  # its JVM may still be writing it
            elif not archive.exists() and _complete(part) and _maps(java, part):
                os.replace(part, archive)
            else:
                os.unlink(part)
        if archive.exists():
            os.utime(archive)  # in use: not stale for another install sharing the directory
            return f"-XX:SharedArchiveFile={archive} {_CDS_QUIET}"
        if writing:
            return None
        return f"-XX:ArchiveClassesAtExit={archive}.{os.getpid()}.part {_CDS_QUIET}"
    except OSError:  # a full or vanishing cache directory: run without
        return None


def _complete(archive: str) -> bool:
    """Whether ``archive`` has the header a finished dynamic-archive dump writes last."""
    try:
        with open(archive, "rb") as fh:
            return fh.read(len(_DYNAMIC_MAGIC)) == _DYNAMIC_MAGIC
    except OSError:
        return False


def _maps(java: str, archive: str) -> bool:
    """Whether a JVM starts with ``archive`` mapped (a truncated one kills it)."""
    try:
        done = subprocess.run([java, f"-XX:SharedArchiveFile={archive}", *_CDS_QUIET.split(),
                               "-XX:ErrorFile=/dev/null", "-XX:-CreateCoredumpOnCrash", "-version"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


_QUIET_LOG4J = """\
# jet-ingest without --verbose: only Spark's errors reach the console (stderr).
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
# Spark lowers the root level to this logger's (WARN unless set) in a Python driver.
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
# A failed task is reported by jet-ingest itself, with its cause, once.
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = off
logger.tasks.name = org.apache.spark.scheduler.TaskSetManager
logger.tasks.level = off
"""


def _quiet_log4j() -> Optional[str]:
    """A log4j2 configuration file that keeps Spark's INFO and WARN lines off the
    console (written once to the temp directory), or None if it cannot be written."""
    digest = hashlib.sha256(_QUIET_LOG4J.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"jet-ingest-log4j2-{digest}.properties"
    if any(c.isspace() or c in "\"'\\" for c in str(path)):
        return None
    try:
        if not path.exists():
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(_QUIET_LOG4J)
            os.replace(tmp, path)
    except OSError:
        return None
    return str(path)


def spark_session(master: Optional[str] = None, *, app: str = "jet-ingest", ui: bool = False,
                  conf: Optional[dict[str, str]] = None, quiet: bool = False) -> Any:
    """Get or create a SparkSession with the ``jetlog`` source registered.

    ``master`` None leaves the master to ``spark-submit`` (or pyspark's own default,
    ``local[*]``); it is never hard-coded here. For local masters the driver binds to
    127.0.0.1 and the workers get this repository on their ``PYTHONPATH``. ``quiet``
    keeps Spark's log lines below ERROR and its stage progress bars off the console
    (a driver JVM this call starts; not one that ``spark-submit`` started).
    """
    from pyspark.sql import SparkSession

    from .source import register

    local = master is None or master.startswith("local")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = _with_repo(os.environ.get("PYTHONPATH", ""))
    builder = SparkSession.builder.appName(app)
    if master is not None:
        builder = builder.master(master)
    settings = {
        "spark.ui.enabled": "true" if ui else "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "8",
        "spark.executorEnv.PYTHONPATH": os.environ["PYTHONPATH"],
    }
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
        if "spark.driver.memory" not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
            # In local mode the driver JVM runs every task: with Spark's default 1 GiB
            # heap, queries over a large warehouse's frames spill and collect garbage.
            settings["spark.driver.memory"] = DEFAULT_LOCAL_MEMORY
    if quiet:
        settings["spark.ui.showConsoleProgress"] = "false"
    settings.update(conf or {})
    starting = not _driver_running()
    options = []
    if local and starting:
        options.append(class_data_sharing())
    if quiet and starting and not _cds_blocked():
        log4j = _quiet_log4j()
        options.append(f"-Dlog4j2.configurationFile=file:{log4j}" if log4j else None)
    for extra in filter(None, options):
        user = settings.get("spark.driver.extraJavaOptions")
        settings["spark.driver.extraJavaOptions"] = f"{user} {extra}" if user else extra
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if not str(spark.sparkContext.master).startswith("local"):
        ship_code(spark)
    register(spark)
    return spark


# What the executors import: the source, the parser and the derived tables' functions
# (tools.ingest), the codes and the log format they use (jetwire), and the short name.
_SHIPPED_PACKAGES = ("jetwire", "tools.ingest")
_SHIPPED_MODULES = ("pyspark_jetlog",)


def ship_code(spark: Any) -> str:
    """Zip jet's pure-Python code for the executors and add it to their path
    (``SparkContext.addPyFile``, as ``--py-files`` does). Returns the zip's path.

    Only ``.py`` files travel (a zip cannot hold the compiled build's extension
    modules; the executors run the pure-Python fallback, which reads the same). Spark
    puts the zip ahead of site-packages, so a different jet installed on a worker does
    not take over. The zip is served for the session's life and removed at exit.
    """
    import atexit
    import importlib

    tmp = tempfile.mkdtemp(prefix="jet-ingest-code-")
    atexit.register(shutil.rmtree, tmp, True)
    path = os.path.join(tmp, "jet_ingest_code.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in _SHIPPED_PACKAGES:
            pkg = importlib.import_module(name)
            top = Path(pkg.__file__ or "").parent
            base = top.parents[name.count(".")]  # the directory that holds the top package
            for parent in list(top.relative_to(base).parents)[:-1]:  # e.g. tools/__init__.py
                init = base / parent / "__init__.py"
                zf.write(init, str(init.relative_to(base)))
            for src in sorted(top.rglob("*.py")):
                zf.write(src, str(src.relative_to(base)))
        for name in _SHIPPED_MODULES:
            src = Path(importlib.import_module(name).__file__ or "")
            zf.write(src, src.name)
    spark.sparkContext.addPyFile(path)
    return path
