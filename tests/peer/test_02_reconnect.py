"""reconnect=True: a daemon restart on the same port restores states, methods, fetches."""

from __future__ import annotations

import asyncio

from peer_testlib import eventually
from peer_testlib import run

from peer import AlreadyExists
from peer import EventKind
from peer import Peer
from peer import PeerAsync
from tests.conftest import restartable_port


def test_daemon_restart_restores_everything(start_jetd):
    first = start_jetd("--port", str(restartable_port()))  # restarted on the same port
    port = first.port

    async def body():
        app = await PeerAsync.connect(
            first.host, port, name="app", reconnect=True, reconnect_min_delay=0.02, reconnect_max_delay=0.2
        )
        state = await app.add_state("app/setpoint", 10, on_set=lambda v: max(v, 0))
        await app.add_method("app/echo", lambda x: ["echo", x])
        callback_events = []
        await app.fetch("app/", lambda e: callback_events.append((e.kind, e.key, e.value)))
        iterator = app.fetch("ext/")
        await iterator
        # Something another peer owns, seen by the fetch before the restart.
        other = await PeerAsync.connect(first.host, port)
        await other.add_state("app/foreign", "before")
        await other.add_state("ext/x", 1)
        await state.notify(11)
        await eventually(lambda: ("change", "app/setpoint", 11) in callback_events)
        assert (await iterator.__anext__()).key == "ext/x"
        await other.close()
        await eventually(lambda: ("remove", "app/foreign", "before") in callback_events)
        await state.notify(12)  # the value the restore must bring back

        await asyncio.get_running_loop().run_in_executor(None, first.stop)
        second = await asyncio.get_running_loop().run_in_executor(None, start_jetd, "--port", str(port))
        assert second.port == port
        await eventually(lambda: app.reconnects == 1 and app.connected, timeout=10, what="reconnect")

        async with await PeerAsync.connect(second.host, port) as client:
            assert await client.get("app/setpoint") == 12
            assert await client.call("app/echo", 5) == ["echo", 5]
            assert await client.set("app/setpoint", -4) == 0  # the handler still runs
            assert state.value == 0
            await client.add_state("app/new", "after")
            await client.add_state("ext/y", 2)
            await eventually(lambda: ("add", "app/new", "after") in callback_events)
            # The iterator goes on across the restart.
            event = await asyncio.wait_for(iterator.__anext__(), 5)
            assert (event.kind, event.key) == (EventKind.REMOVE, "ext/x")  # gone with the old daemon
            event = await asyncio.wait_for(iterator.__anext__(), 5)
            assert (event.kind, event.key, event.value) == (EventKind.ADD, "ext/y", 2)
        # Own state re-added after the restart with the same value: no duplicate add.
        assert callback_events.count(("add", "app/setpoint", 10)) == 1
        assert ("change", "app/setpoint", 0) in callback_events
        await app.close()

    run(body(), deadline=40)


def test_requests_during_outage_wait_for_restore(start_jetd):
    first = start_jetd("--port", str(restartable_port()))  # restarted on the same port
    port = first.port

    async def body():
        app = await PeerAsync.connect(first.host, port, reconnect=True, reconnect_min_delay=0.02, timeout=8)
        await app.add_state("x", 1)
        await asyncio.get_running_loop().run_in_executor(None, first.stop)
        await eventually(lambda: not app.connected)
        pending = app.get("x")  # queued while the daemon is away
        await asyncio.get_running_loop().run_in_executor(None, start_jetd, "--port", str(port))
        assert await pending == 1
        await app.close()

    run(body(), deadline=30)


def test_sync_peer_reconnects(start_jetd):
    first = start_jetd("--port", str(restartable_port()))  # restarted on the same port
    port = first.port
    peer = Peer(first.host, port, reconnect=True, reconnect_min_delay=0.02)
    try:
        peer.add_state("s", "v")
        first.stop()
        start_jetd("--port", str(port))
        assert peer.get("s", timeout=8) == "v"
        assert peer.reconnects == 1
    finally:
        peer.close()


def test_key_taken_during_outage_marks_state_lost(start_jetd):
    first = start_jetd("--port", str(restartable_port()))  # restarted on the same port
    port = first.port

    async def body():
        app = await PeerAsync.connect(first.host, port, reconnect=True, reconnect_min_delay=1.0)
        state = await app.add_state("c/x", "mine", on_set=lambda v: v)
        await app.add_state("c/kept", 1)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, first.stop)
        second = await loop.run_in_executor(None, start_jetd, "--port", str(port))
        # The app waits at least 0.5 s before reconnecting: someone else is faster.
        async with await PeerAsync.connect(second.host, port) as other:
            await other.add_state("c/x", "theirs", on_set=lambda v: f"theirs:{v}")
            await eventually(lambda: app.reconnects == 1, timeout=10, what="reconnect")
            assert state.removed
            assert isinstance(state.restore_error, AlreadyExists)
            assert await app.set("c/x", "v") == "theirs:v"  # served by the other owner
            assert await app.get("c/kept") == 1  # the rest was restored
        await app.close()

    run(body(), deadline=30)
