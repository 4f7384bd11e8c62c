"""Area 18: an event log that cannot be written (spec/JETLOG.md 6.5, ``--log-on-error``).

A real jetd, real failures: the log directory renamed or removed while jetd runs, and a
full file system (a small tmpfs mounted for the test; skipped when not root). Clients
pipeline GETs and reconnect when closed; afterwards every OK answer a client got is
checked against the log's records, as in test_15 (JETLOG.md 6.1: under ``always``
nothing is acknowledged that is not durable).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path

import pytest
from jetd_testlib import PeerClosed
from jetd_testlib import RawPeer
from jetd_testlib import logged_ids
from jetd_testlib import v

from jetwire import AddState
from jetwire import Close
from jetwire import GetState
from jetwire import Response
from jetwire import Status
from tests.conftest import DaemonProcess

WAIT = 60.0  # seconds allowed for anything to happen on a busy machine


class _Getter(threading.Thread):
    """Pipelines GETs of "s", ``window`` at a time; reconnects (under a new name) when
    jetd closes it. Records per connection name the ids answered OK, in order, and the
    refusals (INTERNAL answers) and CLOSEs it got.

    ``ok_after_refusal``: the OK answers received after this getter first saw the log
    fail (an INTERNAL refusal, or a CLOSE for answers lost with the log), on any of its
    connections. jetd sent them after it knew of the failure, so they come from records
    written after the resume. (Counting per connection was wrong: a connection closed
    for lost answers reconnects, and the new one may open after the resume, never see
    a refusal and never count.)"""

    def __init__(self, address: tuple[str, int], name: str, window: int = 20) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.base = name
        self.window = window
        self.ok: dict[str, list[int]] = defaultdict(list)
        self.ok_after_refusal: dict[str, list[int]] = defaultdict(list)
        self.refusals: list[str] = []
        self.others: list[Response] = []
        self.closes: list[tuple[int, str]] = []
        self.saw_failure = False
        self.stop = False
        self.connections = 0
        self.failed_to_connect = 0

    def run(self) -> None:
        while not self.stop:
            try:
                peer = RawPeer(self.address, f"{self.base}-{self.connections}")
            except (OSError, AssertionError, PeerClosed):
                self.failed_to_connect += 1  # jetd stopped (--log-on-error stop)
                if self.failed_to_connect > 3:
                    return
                time.sleep(0.2)
                continue
            name = f"{self.base}-{self.connections}"
            self.connections += 1
            try:
                self._talk(peer, name)
            finally:
                peer.close()

    def _talk(self, peer: RawPeer, name: str) -> None:
        peer.send(*(GetState(peer.next_id(), "s") for _ in range(self.window)))
        while not self.stop:
            try:
                message = peer.recv(WAIT)
            except (PeerClosed, OSError):
                return
            if isinstance(message, Close):
                self.closes.append((message.status, message.message))
                if message.message.startswith("event log cannot be written"):
                    self.saw_failure = True
                return
            if not isinstance(message, Response):
                continue
            if message.status == Status.OK:
                self.ok[name].append(message.id)
                if self.saw_failure:
                    self.ok_after_refusal[name].append(message.id)
            elif message.status == Status.INTERNAL:
                self.refusals.append(message.message)
                self.saw_failure = True
            else:
                self.others.append(message)  # stop: a new connection while the owner is gone
            try:
                peer.send(GetState(peer.next_id(), "s"))
            except OSError:
                return


def _owner(address: tuple[str, int]) -> RawPeer:
    owner = RawPeer(address, "owner")
    owner.request(lambda rid: AddState(rid, "s", v(7)))
    return owner


def _wait_for(what: str, condition, daemon, getters: Sequence[_Getter] = ()) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{what} did not happen within {WAIT} s; {_progress(getters)}\n{daemon.stderr()[-4000:]}"
            )
        time.sleep(0.05)


def _ok_count(getters: list[_Getter]) -> int:
    return sum(len(ids) for g in getters for ids in list(g.ok.values()))


def _resumed_count(getters: list[_Getter]) -> int:
    return sum(len(ids) for g in getters for ids in list(g.ok_after_refusal.values()))


def _progress(getters: Sequence[_Getter]) -> str:
    """What each getter saw, for a failure's message."""
    return "; ".join(
        f"{g.base}: {g.connections} connections, {sum(map(len, list(g.ok.values())))} OK, "
        f"{len(g.refusals)} refused, {len(g.closes)} closed, {len(g.others)} other"
        for g in getters
    )


def _stop(getters: list[_Getter]) -> None:
    for g in getters:
        g.stop = True
    for g in getters:
        g.join(WAIT)


def _assert_every_ok_is_logged(getters: list[_Getter], *directories: Path) -> int:
    requests, responses = logged_ids(*directories)
    total = 0
    for g in getters:
        for name, ids in g.ok.items():
            total += len(ids)
            missing_requests = set(ids) - requests[name]
            missing_responses = set(ids) - responses[name]
            assert not missing_requests and not missing_responses, (
                f"{name}: {len(missing_requests)} requests and {len(missing_responses)} answers of "
                f"{len(ids)} answered OK are not in the log"
            )
    return total


def _lines(stderr: str, text: str) -> list[str]:
    return [line for line in stderr.splitlines() if text in line]


def _getters_running(daemon: DaemonProcess) -> tuple[RawPeer, list[_Getter]]:
    """An owner and three getters that have had 200 answers between them; the caller
    stops them (``_stop``, ``owner.close()``)."""
    owner = _owner(daemon.address)
    getters = [_Getter(daemon.address, f"g{i}") for i in range(3)]
    for g in getters:
        g.start()
    _wait_for("200 answers", lambda: _ok_count(getters) > 200, daemon, getters)
    return owner, getters


def _refused_then_resumed(daemon: DaemonProcess, break_log: Callable[[], object]) -> list[_Getter]:
    """Three getters run against an owner; after 200 answers ``break_log()`` takes the
    log directory away; waits for a getter to see the failure (a refusal, or a CLOSE
    for answers lost: the log may resume before any request is refused, when a
    rotation's new segment recreates the directory), then for 100 answers after it;
    stops the getters and the daemon (which must exit 0)."""
    owner, getters = _getters_running(daemon)
    try:
        break_log()
        _wait_for("a refusal or a close for the log", lambda: any(g.saw_failure for g in getters), daemon, getters)
        _wait_for("answers after the resume", lambda: _resumed_count(getters) > 100, daemon, getters)
    finally:
        _stop(getters)
        owner.close()
    assert daemon.stop() == 0
    return getters


def test_always_directory_renamed_refuses_then_resumes(start_jetd, tmp_path):
    """The log directory disappears (renamed away, so what it held can still be read):
    the next segment cannot be created; jetd refuses (INTERNAL), makes the directory
    again within a retry and answers again. Every OK answer is in one of the two
    directories; one ERROR line for the stop, one for the resume."""
    logdir = tmp_path / "log"
    gone = tmp_path / "log.gone"
    daemon = start_jetd("--log-dir", str(logdir), "--log-fsync", "always", "--log-rotate-size", "65536")
    getters = _refused_then_resumed(daemon, lambda: logdir.rename(gone))
    assert all(m.startswith("event log cannot be written") for g in getters for m in g.refusals)
    total = _assert_every_ok_is_logged(getters, gone, logdir)
    assert total > 300
    stderr = daemon.stderr()
    assert len(_lines(stderr, "cannot write (")) == 1, stderr[-4000:]
    assert len(_lines(stderr, "event log: writing again")) == 1, stderr[-4000:]


def test_always_directory_removed_refuses_then_resumes(start_jetd, tmp_path):
    """The log directory removed with its segments: the open segment still takes writes
    that nobody can read (JETLOG.md 6.5 counts that as a failure). Refusals are seen;
    after the resume, every OK answer a connection got after its refusal is in the new
    directory."""
    logdir = tmp_path / "log"
    daemon = start_jetd("--log-dir", str(logdir), "--log-fsync", "always")
    getters = _refused_then_resumed(daemon, lambda: shutil.rmtree(logdir))
    requests, responses = logged_ids(logdir)
    for g in getters:
        for name, ids in g.ok_after_refusal.items():
            assert set(ids) <= requests[name] and set(ids) <= responses[name], name
    stderr = daemon.stderr()
    assert _lines(stderr, "was deleted") and len(_lines(stderr, "cannot write (")) == 1, stderr[-4000:]
    assert len(_lines(stderr, "event log: writing again")) == 1, stderr[-4000:]


@contextlib.contextmanager
def _tmpfs(directory: Path, size: str):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    directory.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode(errors='replace').strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def _fill(path: Path) -> None:
    """Write ``path`` until the file system is full."""
    with open(path, "wb", buffering=0) as stream:
        block = b"\0" * 4096
        with contextlib.suppress(OSError):
            while True:
                stream.write(block)


@pytest.mark.parametrize(
    ("fsync", "option", "mode"),
    [
        ("always", None, "refuse"),
        ("always", "continue", "continue"),
        ("always", "stop", "stop"),
        ("interval", None, "continue"),
        ("interval", "refuse", "refuse"),
    ],
)
def test_full_disk(start_jetd, tmp_path, fsync, option, mode):
    """A full file system, per ``--log-on-error`` (None: the default for ``fsync``):

    - refuse (the default with always): requests are answered INTERNAL; once space is
      back (1 MiB free) the log resumes and answers are OK again;
    - continue (the default with interval): answers go on (nothing durable), the log
      resumes too;
    - stop: every peer gets CLOSE (INTERNAL) and jetd exits 1.

    always with refuse or stop: every OK answer a client got is in the log."""
    disk = tmp_path / "disk"
    with _tmpfs(disk, "4m"):
        logdir = disk / "log"
        daemon = start_jetd(
            "--log-dir", str(logdir), "--log-fsync", fsync, "--log-rotate-size", "262144", "--log-max-bytes", "0",
            *(["--log-on-error", option] if option else []),
        )  # fmt: skip
        try:
            owner, getters = _getters_running(daemon)
            try:
                _fill(disk / "filler")
                _wait_for("the ERROR line", lambda: "cannot write (" in daemon.stderr(), daemon)
                if mode == "refuse":
                    _wait_for("a refusal", lambda: any(g.refusals for g in getters), daemon, getters)
                    before = _ok_count(getters)
                    time.sleep(0.5)
                    assert _ok_count(getters) - before <= 3 * 20, (
                        f"OK answers while the disk is full: {_ok_count(getters) - before}; "
                        f"{_progress(getters)}\n{daemon.stderr()[-4000:]}"
                    )
                if mode == "continue":
                    before = _ok_count(getters)
                    _wait_for("answers while the disk is full", lambda: _ok_count(getters) > before + 200, daemon, getters)
                if mode == "stop":
                    daemon.proc.wait(WAIT)
                    assert daemon.proc.returncode == 1, daemon.stderr()[-4000:]
                else:
                    assert daemon.proc.poll() is None, daemon.stderr()[-4000:]
                    (disk / "filler").unlink()
                    _wait_for("the resume", lambda: "event log: writing again" in daemon.stderr(), daemon)
                    if mode == "refuse":
                        _wait_for("answers after the resume", lambda: _resumed_count(getters) > 100, daemon, getters)
            finally:
                _stop(getters)
                owner.close()
            stderr = daemon.stderr()
            if mode != "stop":
                assert daemon.stop() == 0
                assert len(_lines(stderr, "event log: writing again")) == 1, stderr[-4000:]
            assert len(_lines(stderr, "cannot write (")) == 1, stderr[-4000:]
            assert f"(--log-on-error {mode})" in _lines(stderr, "cannot write (")[0]
            refusals = [m for g in getters for m in g.refusals]
            closes = [c for g in getters for c in g.closes]
            if mode == "refuse":
                assert refusals and all("event log cannot be written" in m for m in refusals), refusals[:5]
            else:
                assert not refusals, refusals[:5]
            if mode == "stop":
                assert closes and all(status == Status.INTERNAL for status, _ in closes), closes
            if fsync == "always" and mode != "continue":
                assert _assert_every_ok_is_logged(getters, logdir) > 200
        finally:
            daemon.stop()


def test_default_log_max_bytes_is_half_the_free_space(start_jetd, tmp_path):
    """JETLOG.md 6.4: without --log-max-bytes, the log keeps at most half the space free
    at start (here a 16 MiB tmpfs), at least one segment; said at start and in --help."""
    disk = tmp_path / "disk"
    with _tmpfs(disk, "16m"):
        daemon = start_jetd("--log-dir", str(disk / "log"), "--log-rotate-size", "1048576")
        try:
            line = _lines(daemon.stderr(), "keeping at most")
            assert line, daemon.stderr()
            kept = int(line[0].split("keeping at most ")[1].split()[0])
            assert 7 * 1024 * 1024 <= kept <= 8 * 1024 * 1024, kept
        finally:
            assert daemon.stop() == 0
    repo = Path(__file__).resolve().parents[2]
    help_text = subprocess.run(
        [sys.executable, "-m", "jetd", "--help"], capture_output=True, text=True, cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}
    ).stdout
    assert "half the space free" in " ".join(help_text.split())
    assert "--log-on-error" in help_text
