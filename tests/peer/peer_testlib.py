"""Helpers shared by the peer tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Coroutine
from typing import Any
from typing import TypeVar

from peer import PeerAsync

T = TypeVar("T")

TEST_DEADLINE = 20.0


def run(coro: Coroutine[Any, Any, T], deadline: float = TEST_DEADLINE) -> T:
    """Run one async test body on a fresh loop, bounded in time."""

    async def bounded() -> T:
        async with asyncio.timeout(deadline):
            return await coro

    return asyncio.run(bounded())


async def eventually(check: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    """Poll ``check`` until true; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(0.01)


async def settle(awaitable: Awaitable[T]) -> T:
    return await awaitable


@contextlib.asynccontextmanager
async def two_peers(daemon: Any, **options: Any) -> AsyncIterator[tuple[PeerAsync, PeerAsync]]:
    """Two PeerAsync connected to ``daemon`` (an owner and a client), closed on exit."""
    async with await PeerAsync.connect(daemon.host, daemon.port, **options) as first, await PeerAsync.connect(
        daemon.host, daemon.port, **options
    ) as second:
        yield first, second


async def add_stuck_state(owner: PeerAsync, key: str) -> asyncio.Event:
    """Add state ``key`` to ``owner`` with a set handler that never answers; the event
    is set once a set has reached the handler."""
    started = asyncio.Event()

    async def never(value: Any) -> None:
        started.set()
        await asyncio.sleep(30)

    await owner.add_state(key, 0, on_set=never)
    return started
