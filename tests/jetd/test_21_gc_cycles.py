"""jetd's normal life makes no reference cycles (issue 29, jetd.gcpolicy): the policy
freezes what survives a collection, and a frozen object that later becomes cyclic
garbage is freed only by the hourly full collection. So: a real daemon (the TCP and
WebSocket listeners, ``--auth``, in this process on jetd's own loop) serves a churn of
peers in another process (tests/jetd/gc21_churn.py: states added and removed, plain and
sorted-window fetches, routed requests answered, timed out and left to an owner that
goes away, GETs, UNFETCH, a wrong password, TCP and WebSocket peers); once they are all
gone, a collection must find no unreachable object the churn made.

The objects that existed before the churn (and one warm-up round) are frozen, so only
what the churn made is looked at. A cycle found here is named by the types it holds.
The cycles it found, now broken: a WebSocket peer's shell and its framing transport
(jetd.web.WebSocketTransport held the shell), and every compiled query (its ``base`` was
itself, jetd.query.CompiledQuery)."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from jetd.access import Access
from jetd.config import Config
from jetd.server import Server
from jetd.server import new_event_loop
from jetd.users import Grants
from jetd.users import User
from jetd.users import UsersFile

CHURN = Path(__file__).resolve().parent / "gc21_churn.py"
REPO = Path(__file__).resolve().parents[2]
CHURN_TIMEOUT = 240.0
ROUNDS = 3


def _users(path: Path) -> Path:
    """Anonymous peers may do anything; ``alice`` has a cheap argon2id hash (the wrong
    password is checked by the real check, in the daemon's thread pool)."""
    from argon2 import PasswordHasher

    users = UsersFile()
    users.anonymous = Grants(own=[""], read=[""], write=[""])
    users.users["alice"] = User(password=PasswordHasher(time_cost=1, memory_cost=1024).hash("secret"), read=[""])
    users.save(path)
    return path


async def _churn(address: tuple[str, int], web: tuple[str, int], rounds: int) -> None:
    cmd = [sys.executable, str(CHURN), address[0], str(address[1]), web[0], str(web[1]), str(rounds)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + CHURN_TIMEOUT
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"the churn took over {CHURN_TIMEOUT} s")
            await asyncio.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        out = proc.communicate()[0]
    assert proc.returncode == 0, out.decode(errors="replace")


async def _cycles_after_churn(users: Path) -> tuple[int, Counter[str]]:
    loop = asyncio.get_running_loop()
    config = Config(host="127.0.0.1", port=0, http_port=0, auth=str(users), route_timeout=1.0)
    server = Server(config, loop, None, Access.load(str(users)), None)
    address = await server.start()
    from jetd.web import start_web

    web, line = await start_web(server, None)
    host, _, port = line.removeprefix("web on http://").rstrip("/").rpartition(":")
    try:
        await _churn(address, (host, int(port)), 1)  # warm-up: caches, the check threads
        await _settle(server)
        gc.collect()
        gc.freeze()
        await _churn(address, (host, int(port)), ROUNDS)
        await _settle(server)
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            found = gc.collect()
            kinds = Counter(type(o).__qualname__ for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        return found, kinds
    finally:
        gc.unfreeze()
        web.close()
        await server.shutdown()


async def _settle(server: Server) -> None:
    """Until every peer's connection is gone from the daemon (bounded)."""
    deadline = time.monotonic() + 30
    while (server.protocols or server.http_waiting) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not server.protocols and not server.http_waiting
    await asyncio.sleep(0.3)  # the lingering closes, the check threads' callbacks


def test_no_cyclic_garbage_after_churn(tmp_path: Path) -> None:
    """On uvloop, jetd's loop. (asyncio's own selector transports keep a bound method of
    themselves, a cycle per connection; jetd.launch runs the policy only on uvloop.)"""
    users = _users(tmp_path / "users.toml")
    loop = new_event_loop("uvloop")
    try:
        found, kinds = loop.run_until_complete(_cycles_after_churn(users))
    finally:
        loop.close()
    assert found == 0, f"{found} objects in reference cycles after the churn: {kinds.most_common(25)}"
