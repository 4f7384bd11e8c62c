"""14-security, issue 29: password checks may not take every core from the event loop.

argon2-cffi's ``PasswordHasher.verify`` computes a hash's lanes (4 at the default cost)
on as many threads, so one check took both cores of a 2-core machine. jetd computes a
check on one thread (``jetd.users.verify_password``, same parameters, same result) and
runs one check fewer than there are cores (``jetd.access.checks_at_once``)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from argon2 import PasswordHasher

from jetd.access import CHECKS_AT_ONCE
from jetd.access import CHECKS_AT_ONCE_MAX
from jetd.access import PasswordChecks
from jetd.access import checks_at_once
from jetd.access import usable_cores
from jetd.users import User
from jetd.users import UsersFile
from jetd.users import verify_password
from jetwire import Authenticate
from jetwire import Response
from jetwire import Status
from tests.conftest import DaemonProcess
from tests.jetd.jetd_testlib import RawPeer

CHEAP = [
    {"time_cost": 1, "memory_cost": 1024, "parallelism": 1},
    {"time_cost": 2, "memory_cost": 2048, "parallelism": 4},
    {"time_cost": 1, "memory_cost": 4096, "parallelism": 3, "salt_len": 8, "hash_len": 16},
]


@pytest.mark.parametrize("settings", CHEAP)
def test_verify_password_agrees_with_argon2_cffi(settings: dict[str, int]) -> None:
    hasher = PasswordHasher(**settings)
    for password in ["right", "", "é\x00ü", "x" * 1000]:
        stored = hasher.hash(password)
        assert verify_password(stored, password) is True
        assert hasher.verify(stored, password)
        for wrong in ["wrong", password + " ", password[:-1]]:
            if wrong != password:
                assert verify_password(stored, wrong) is False


def test_verify_password_at_the_default_cost() -> None:
    stored = PasswordHasher().hash("alice-pw")  # m=65536, t=3, p=4: what jetd user add writes
    assert verify_password(stored, "alice-pw") is True
    assert verify_password(stored, "alice-pW") is False


@pytest.mark.parametrize("stored", [
    "",
    "garbage",
    "$argon2i$v=19$m=1024,t=1,p=1$c29tZXNhbHQ$aGFzaGhhc2hoYXNoaGFzaA",  # argon2i, not argon2id
    "$argon2id$v=19$m=1024,t=1,p=1$!!!!$aGFzaGhhc2hoYXNoaGFzaA",  # not base64
    "$argon2id$v=19$m=1,t=1,p=4$c29tZXNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaA",  # memory below 8 per lane
])
def test_verify_password_refuses_what_is_not_an_argon2id_hash(stored: str) -> None:
    with pytest.raises(ValueError):
        verify_password(stored, "x")


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's per-thread /proc")
def test_a_check_runs_on_one_thread() -> None:
    """Reproduces issue 29: PasswordHasher.verify started a thread per lane (seen: 4 more
    threads at once at the default cost); verify_password starts none."""
    stored = PasswordHasher().hash("pw")  # 4 lanes
    seen: list[int] = []
    checking = threading.Thread(target=lambda: [verify_password(stored, "wrong") for _ in range(3)])
    before = _threads()
    checking.start()
    while checking.is_alive():
        seen.append(_threads())
        time.sleep(0.0005)
    checking.join()
    assert seen and max(seen) <= before + 1, (before, sorted(set(seen)))


def test_one_core_is_left_to_the_loop() -> None:
    assert [checks_at_once(cores) for cores in (1, 2, 3, 4, 64)] == [1, 1, 2, 2, CHECKS_AT_ONCE_MAX]
    assert checks_at_once(usable_cores()) == CHECKS_AT_ONCE
    with pytest.raises(ValueError):
        PasswordChecks(8, 0.5, 30.0, at_once=0)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's per-thread /proc")
def test_jetd_checks_on_as_many_threads_as_run_at_once(start_jetd: Callable[..., DaemonProcess],
                                                         tmp_path: Path) -> None:
    """End to end: while wrong passwords (argon2id at its default cost) are checked,
    jetd has at most CHECKS_AT_ONCE threads more than before its first check."""
    users = UsersFile()
    users.users["alice"] = User(password=PasswordHasher().hash("alice-pw"), read=["p/"])
    path = tmp_path / "users.toml"
    users.save(path)
    daemon = start_jetd("--auth", str(path), "--auth-failure-delay", "0")
    task = Path(f"/proc/{daemon.proc.pid}/task")
    before = len(list(task.iterdir()))
    seen: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            seen.append(len(list(task.iterdir())))
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    peers = [RawPeer(daemon.address) for _ in range(4)]
    sampler.start()
    try:
        for peer in peers:
            peer.send(Authenticate(1, "alice", "wrong"))
        for peer in peers:
            assert peer.recv(timeout=120) == Response(1, Status.AUTH_FAILED, message="authentication failed")
        with RawPeer(daemon.address) as alice:
            assert alice.request(lambda rid: Authenticate(rid, "alice", "alice-pw"), timeout=120).status == Status.OK
    finally:
        done.set()
        sampler.join()
        for peer in peers:
            peer.close()
    assert seen and max(seen) <= before + CHECKS_AT_ONCE, (before, sorted(set(seen)))
