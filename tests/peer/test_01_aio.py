"""PeerAsync against a real jetd over TCP: every call, errors, ordering, timeouts."""

from __future__ import annotations

import asyncio

import pytest
from peer_testlib import add_stuck_state
from peer_testlib import eventually
from peer_testlib import run
from peer_testlib import two_peers

from jetwire import JetError
from jetwire import LocalProtocolError
from jetwire import Status
from jetwire import Value
from jetwire import ValueType
from peer import AlreadyExists
from peer import ConnectionClosed
from peer import EventKind
from peer import FetchEvent
from peer import Internal
from peer import NotFound
from peer import OwnerGone
from peer import PeerAsync
from peer import PeerError
from peer import Rejected
from peer import Timeout
from peer import TooLarge
from peer import WrongKind
from peer import error_for_status
from peer import errors as peer_errors


def test_error_for_every_status():
    for status in Status:
        if status is Status.OK:
            continue
        error = error_for_status(status, "why")
        assert isinstance(error, PeerError) and isinstance(error, JetError)
        assert error.status is status and error.message == "why"
        assert status.name in str(error)
    names = {cls.__name__ for cls in map(type, (error_for_status(s) for s in Status if s))}
    assert len(names) == len(Status) - 1  # one class per status
    assert issubclass(peer_errors.ConnectionClosed, PeerError)


def test_connect_info_and_name(jetd):
    async def body():
        async with await PeerAsync.connect(jetd.host, jetd.port, name="tester") as peer:
            assert peer.info.name == "jetd"
            assert (peer.info.major, peer.info.minor) == (1, 3)
            assert peer.name == "tester"
            assert peer.connected
        assert not peer.connected
        with pytest.raises(ConnectionClosed):
            await peer.get("x")

    run(body())


def test_connect_refused_is_typed():
    async def body():
        with pytest.raises(ConnectionClosed, match="cannot connect"):
            await PeerAsync.connect("127.0.0.1", 1, timeout=2)

    run(body())


def test_owner_adapts_value_notify_before_ok(jetd):
    """PROTOCOL.md 10.3: the requester's fetch sees the change before the set's OK."""

    async def body():
        async with two_peers(jetd) as (owner, client):
            seen_by_owner = []

            def clamp(value):
                seen_by_owner.append(value)
                return min(value, 30.0)

            state = await owner.add_state("plant/temp", 21.5, on_set=clamp)
            events: list[FetchEvent] = []
            fetch = await client.fetch("plant/", events.append)
            # PROTOCOL.md 10.5: the initial add arrives right after the OK.
            await client.get("plant/temp")
            assert [(e.kind, e.key, e.value) for e in events] == [(EventKind.ADD, "plant/temp", 21.5)]
            result = await client.set("plant/temp", 42.0)
            assert result == 30.0
            # The FETCH_CHANGE was received before the OK, so it is there already.
            assert (events[-1].kind, events[-1].value) == (EventKind.CHANGE, 30.0)
            assert seen_by_owner == [42.0]
            assert state.value == 30.0
            assert await client.get("plant/temp") == 30.0
            # Handler returning None keeps the requested value.
            state.on_set = lambda value: None
            assert await client.set("plant/temp", 12.5) == 12.5
            await fetch.unfetch()
            count = len(events)
            await state.notify(1.0)
            await client.get("plant/temp")
            assert len(events) == count  # nothing after unfetch

    run(body())


def test_rejections_and_handler_failures(jetd):
    async def body():
        async with two_peers(jetd) as (owner, client):
            await owner.add_state("ro", 1)

            def refuse(value):
                raise Rejected(f"{value} is out of range")

            def crash(value):
                raise ValueError("boom")

            async def slow_refuse(value):
                await asyncio.sleep(0.01)
                raise Rejected("later")

            await owner.add_state("refuse", 1, on_set=refuse)
            await owner.add_state("crash", 1, on_set=crash)
            await owner.add_state("slow", 1, on_set=slow_refuse)
            await owner.add_state("weird", 1, on_set=lambda v: object())
            with pytest.raises(Rejected, match="read-only") as info:
                await client.set("ro", 2)
            assert info.value.status is Status.REJECTED
            with pytest.raises(Rejected, match="7 is out of range"):
                await client.set("refuse", 7)
            with pytest.raises(Internal, match="ValueError: boom"):
                await client.set("crash", 7)
            with pytest.raises(Rejected, match="later"):
                await client.set("slow", 7)
            with pytest.raises(Internal, match="unmappable"):
                await client.set("weird", 7)
            # Nothing changed, and the owner's connection survived all of it.
            assert [await client.get(k) for k in ("ro", "refuse", "crash", "slow")] == [1, 1, 1, 1]
            assert owner.connected

    run(body())


def test_methods_and_kinds(jetd):
    async def body():
        async with two_peers(jetd) as (owner, client):
            await owner.add_method("math/double", lambda x: x * 2)

            async def join(args):
                await asyncio.sleep(0)
                return "-".join(args)

            await owner.add_method("text/join", join)
            await owner.add_method("broken", lambda x: 1 / 0)
            await owner.add_state("a/state", {"x": [1, 2]})
            assert await client.call("math/double", 21) == 42
            assert await client.call("text/join", ["a", "b"]) == "a-b"
            assert await client.get("a/state") == {"x": [1, 2]}
            with pytest.raises(Internal, match="ZeroDivisionError"):
                await client.call("broken")
            refused = [
                (WrongKind, lambda: client.call("a/state", 1)),
                (WrongKind, lambda: client.set("math/double", 1)),
                (WrongKind, lambda: client.get("math/double")),
                (NotFound, lambda: client.call("nope")),
                (NotFound, lambda: client.set("nope", 1)),
                (AlreadyExists, lambda: client.add_state("a/state", 1)),
                (AlreadyExists, lambda: client.add_method("math/double", print)),
            ]
            for error, attempt in refused:
                with pytest.raises(error):
                    await attempt()
            with pytest.raises(LocalProtocolError):
                await owner.add_state("a/state", 2)  # owned here already: refused locally
            method = owner._methods["math/double"]
            await method.remove()
            with pytest.raises(NotFound):
                await client.call("math/double", 1)

    run(body())


def test_value_mapping_round_trip(jetd):
    values = [None, True, False, -(2**63), 2**63 - 1, 2.5, "täxt", b"\x00\xff", {"a": [1, None]}, [1, "x"]]
    cbor = Value(ValueType.CBOR, b"\xa1\x61\x74\x01")
    app = Value(0x80, b"\x01\x02")

    async def body():
        async with await PeerAsync.connect(jetd.host, jetd.port) as peer:
            for i, value in enumerate([*values, cbor, app]):
                await peer.add_state(f"v/{i}", value)
                assert await peer.get(f"v/{i}") == value
            assert (await peer.get_raw("v/2")).vtype == ValueType.BOOL
            with pytest.raises(LocalProtocolError):
                peer.set("v/1", object())
            with pytest.raises(LocalProtocolError):
                peer.set("v/1", 2**64)
            with pytest.raises(LocalProtocolError):
                peer.get("")

    run(body())


def test_many_requests_in_flight(jetd):
    async def body():
        async with two_peers(jetd) as (owner, client):
            await owner.add_state("n", 0, on_set=lambda v: v + 1)
            results = await asyncio.gather(*(client.set("n", i) for i in range(2000)))
            assert results == [i + 1 for i in range(2000)]
            gets = await asyncio.gather(*(client.get("n") for _ in range(100)))
            assert set(gets) == {2000}

    run(body())


def test_fetch_iterator_initial_adds_live_and_removes(jetd):
    async def body():
        async with two_peers(jetd) as (owner, client):
            for i in range(200):
                await owner.add_state(f"f/{i:03d}", i)
            await owner.add_state("other", 0)
            seen = []
            async with client.fetch("f/") as fetch:
                async for event in fetch:
                    seen.append((event.kind, event.key, event.value))
                    if len(seen) == 200:
                        break
                # Every initial add, in key byte order (PROTOCOL.md 10.5).
                assert seen == [(EventKind.ADD, f"f/{i:03d}", i) for i in range(200)]
                state = owner._states["f/007"]
                await state.notify(70)
                state.notify_nowait(71)
                await state.remove()
                tail = [await fetch.__anext__() for _ in range(3)]
                assert [(e.kind, e.value) for e in tail] == [
                    (EventKind.CHANGE, 70),
                    (EventKind.CHANGE, 71),
                    (EventKind.REMOVE, 71),
                ]
            assert not fetch.active
            with pytest.raises(StopAsyncIteration):
                await fetch.__anext__()

    run(body())


def test_async_fetch_callback_and_fire_and_forget(jetd):
    async def body():
        async with two_peers(jetd) as (owner, client):
            calls = []
            await owner.add_state("ff/s", 0, on_set=lambda v: v)
            await owner.add_method("ff/m", calls.append)
            events = []

            async def on_event(event):
                await asyncio.sleep(0)
                events.append((event.kind, event.value))

            await client.fetch("ff/", on_event)
            client.set_nowait("ff/s", 5)
            client.call_nowait("ff/m", "hi")
            await eventually(lambda: (EventKind.CHANGE, 5) in events and calls == ["hi"])
            assert events[0] == (EventKind.ADD, 0)
            assert await client.get("ff/s") == 5

    run(body())


def test_timeouts_daemon_and_peer(start_jetd):
    daemon = start_jetd("--route-timeout", "0.3")

    async def body():
        async with await PeerAsync.connect(daemon.host, daemon.port) as owner, await PeerAsync.connect(
            daemon.host, daemon.port
        ) as client:

            async def sleepy(value):
                await asyncio.sleep(1.0)
                return value

            await owner.add_state("slow", 0, on_set=sleepy)
            with pytest.raises(Timeout) as info:
                await client.set("slow", 1)
            assert "peer timeout" not in info.value.message  # the daemon's TIMEOUT
            with pytest.raises(Timeout, match="peer timeout"):
                await client.set("slow", 1, timeout=0.1)
            # The late answers are dropped; the connection keeps working.
            assert await client.get("slow") == 0

    run(body())


def test_owner_gone_during_set(jetd):
    async def body():
        owner = await PeerAsync.connect(jetd.host, jetd.port)
        started = await add_stuck_state(owner, "gone")
        async with await PeerAsync.connect(jetd.host, jetd.port) as client:
            pending = client.set("gone", 1)
            await started.wait()
            await owner.close()
            with pytest.raises(OwnerGone):
                await pending
            with pytest.raises(NotFound):
                await client.get("gone")

    run(body())


def test_daemon_shutdown_fails_pending_and_ends_iterators(start_jetd):
    daemon = start_jetd()

    async def body():
        owner = await PeerAsync.connect(daemon.host, daemon.port)
        client = await PeerAsync.connect(daemon.host, daemon.port)
        started = await add_stuck_state(owner, "k")
        fetch = await client.fetch("k")
        assert (await fetch.__anext__()).kind is EventKind.ADD
        pending = client.set("k", 1)
        await started.wait()
        await asyncio.get_running_loop().run_in_executor(None, daemon.stop)
        with pytest.raises((ConnectionClosed, OwnerGone)):
            await pending
        with pytest.raises(ConnectionClosed):
            async for _ in fetch:
                pass
        await client.wait_closed()
        with pytest.raises(ConnectionClosed, match="shutting down") as info:
            await client.get("k")
        assert info.value.status is Status.OK  # PROTOCOL.md 10.9: CLOSE(OK) on shutdown
        await owner.close()
        await client.close()

    run(body())


def test_too_large_is_refused_locally(start_jetd):
    daemon = start_jetd("--max-body", "1000")

    async def body():
        async with await PeerAsync.connect(daemon.host, daemon.port) as peer:
            assert peer.info.max_body == 1000
            with pytest.raises(TooLarge):
                peer.set("k", "x" * 2000)
            await peer.add_state("k", "x" * 900)
            assert await peer.get("k") == "x" * 900

    run(body())


def test_runs_on_uvloop(jetd):
    """The application's loop is used as is; uvloop transports differ from asyncio's."""
    uvloop = pytest.importorskip("uvloop")

    async def body():
        assert "uvloop" in type(asyncio.get_running_loop()).__module__
        async with await PeerAsync.connect(jetd.host, jetd.port, timeout=5) as peer:
            await peer.add_state("uv/x", 1, on_set=lambda v: v * 2)
            assert await peer.set("uv/x", 4) == 8
            fetch = await peer.fetch("uv/")
            assert (await fetch.__anext__()).value == 8

    uvloop.run(asyncio.wait_for(body(), 20))


def test_default_timeout_expires_in_order(start_jetd):
    """Requests on the peer's default timeout fail on time, answered ones never do."""
    daemon = start_jetd("--route-timeout", "5")

    async def body():
        async with await PeerAsync.connect(daemon.host, daemon.port, timeout=0.3) as owner, await PeerAsync.connect(
            daemon.host, daemon.port, timeout=0.3
        ) as client:

            async def sleepy(value):
                await asyncio.sleep(2)

            await owner.add_state("t/slow", 0, on_set=sleepy)
            await owner.add_state("t/fast", 0, on_set=lambda v: v)
            loop = asyncio.get_running_loop()
            start = loop.time()
            slow = [client.set("t/slow", i) for i in range(3)]
            fast = [client.set("t/fast", i) for i in range(50)]
            assert await asyncio.gather(*fast) == list(range(50))
            for future in slow:
                with pytest.raises(Timeout, match="peer timeout"):
                    await future
            assert 0.25 < loop.time() - start < 1.5
            assert await client.get("t/fast") == 49  # still usable after timeouts

    run(body())


def test_slow_async_callback_ends_with_overloaded(jetd, caplog):
    async def body():
        release = asyncio.Event()
        seen = []

        async def stuck(event):
            seen.append(event.key)
            await release.wait()  # never returns while events pile up

        async with await PeerAsync.connect(jetd.host, jetd.port, fetch_queue=5) as peer:
            for i in range(30):
                await peer.add_state(f"cb/{i:02d}", i)
            fetch = await peer.fetch("cb/", stuck)
            await peer.get("cb/00")  # every initial add has arrived by now
            assert not fetch.active  # ended instead of queueing 30 events
            assert len(seen) <= 6
            assert "fell 5 events behind" in caplog.text
            release.set()
            assert await peer.get("cb/29") == 29  # the connection is fine

    run(body())


def test_slow_iterator_consumer_ends_with_overloaded(jetd):
    async def body():
        async with await PeerAsync.connect(jetd.host, jetd.port, fetch_queue=10) as peer:
            for i in range(30):
                await peer.add_state(f"o/{i:02d}", i)
            fetch = await peer.fetch("o/")
            await peer.get("o/00")  # every initial add has arrived by now
            got = []
            with pytest.raises(peer_errors.Overloaded, match="fell 10 events behind"):
                async for event in fetch:
                    got.append(event.key)
            assert got == [f"o/{i:02d}" for i in range(10)]  # delivered before the error
            assert not fetch.active
            assert await peer.get("o/29") == 29  # the connection is fine

    run(body())


def test_undecodable_json_value_is_reported_on_access(jetd):
    async def body():
        async with await PeerAsync.connect(jetd.host, jetd.port) as peer:
            await peer.add_state("j/bad", Value(ValueType.JSON, b"{nope"))
            with pytest.raises(peer_errors.Malformed, match="JSON"):
                await peer.get("j/bad")
            assert (await peer.get_raw("j/bad")).data == b"{nope"
            fetch = await peer.fetch("j/")
            event = await fetch.__anext__()
            assert event.raw.data == b"{nope"
            with pytest.raises(peer_errors.Malformed):
                _ = event.value

    run(body())


async def _garbage_server(*frames: bytes):
    """A TCP server on 127.0.0.1 that sends fixed frames (0.1 s apart) and records what
    it receives: jetd never sends bad frames, so this is how a peer gets fed garbage."""
    received = bytearray()

    async def handle(reader, writer):
        for frame in frames:
            writer.write(frame)
            await writer.drain()
            await asyncio.sleep(0.1)
        while chunk := await reader.read(4096):
            received.extend(chunk)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], received


def test_peer_closes_on_a_fatal_frame_from_the_daemon():
    from jetwire import Info
    from jetwire import encode

    async def body():
        # PROTOCOL.md 9.2: an unknown frame type is fatal.
        server, port, received = await _garbage_server(encode(Info("fake")), b"\x09\x00\x00\x00\x00")
        async with server:
            peer = await PeerAsync.connect("127.0.0.1", port, timeout=2)
            with pytest.raises(ConnectionClosed):
                await peer.get("x")
            await eventually(lambda: b"\xf0\x07" in received, what="CLOSE MALFORMED sent")
            await peer.close()

    run(body())


def test_connect_refuses_another_major_version():
    from jetwire import Info
    from jetwire import encode

    async def body():
        server, port, received = await _garbage_server(encode(Info("future", major=2)))
        async with server:
            with pytest.raises(peer_errors.Malformed, match="version 2"):
                await PeerAsync.connect("127.0.0.1", port, timeout=2)
            await eventually(lambda: b"\xf0\x07" in received, what="CLOSE MALFORMED sent")

    run(body())


def test_fast_value_path_equals_value_of():
    from hypothesis import given
    from hypothesis import settings
    from hypothesis import strategies as st

    from peer.aio import _as_value

    @settings(max_examples=300, deadline=None)
    @given(st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.text(), st.booleans()))
    def check(obj):
        assert _as_value(obj) == Value.of(obj)
        assert type(_as_value(obj)) is Value

    check()
    for edge in (float("inf"), float("-inf"), -0.0):
        assert _as_value(edge).data == Value.of(edge).data
    assert _as_value(float("nan")).vtype == ValueType.FLOAT64
    with pytest.raises(LocalProtocolError):
        _as_value(2**63)
