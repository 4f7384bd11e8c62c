"""peer.Peer (blocking, thread-safe) against a real jetd."""

from __future__ import annotations

import concurrent.futures
import gc
import os
import threading

import pytest

from jetwire import LocalProtocolError
from peer import ConnectionClosed
from peer import EventKind
from peer import Internal
from peer import NotFound
from peer import Peer
from peer import Rejected


def _open_fds() -> int:
    gc.collect()  # sockets of earlier tests that only await collection are not ours
    return len(os.listdir("/proc/self/fd"))


def test_blocking_api_and_futures(jetd):
    with Peer(jetd.host, jetd.port, name="owner") as owner, Peer(jetd.host, jetd.port) as client:
        assert owner.info.name == "jetd" and owner.name == "owner"
        state = owner.add_state("s/temp", 20, on_set=lambda v: min(v, 25))
        owner.add_method("s/add", lambda args: sum(args))
        assert client.set("s/temp", 99) == 25
        assert state.value == 25
        assert client.get("s/temp") == 25
        assert client.call("s/add", [1, 2, 3]) == 6
        futures = [client.set_future("s/temp", i) for i in range(20)]
        assert [f.result(5) for f in futures] == list(range(20))
        assert isinstance(client.get_future("s/temp"), concurrent.futures.Future)
        assert client.call_future("s/add", [2, 2]).result(5) == 4
        with pytest.raises(NotFound):
            client.get("missing")
        with pytest.raises(NotFound):
            client.get_future("missing").result(5)
        readonly = owner.add_state_future("s/ro", "x").result(5)
        with pytest.raises(Rejected):
            client.set("s/ro", "y")
        state.notify(3)
        state.notify_nowait(4)
        assert client.get("s/temp") in (3, 4)
        readonly.remove()
        with pytest.raises(NotFound):
            client.get("s/ro")
        with pytest.raises(LocalProtocolError):
            client.set_nowait("s/temp", object())
        with pytest.raises(LocalProtocolError):
            state.notify_nowait(object())
        with pytest.raises(LocalProtocolError):
            client.set("s/temp", object())


def test_fetch_iterator_and_callback(jetd):
    with Peer(jetd.host, jetd.port) as owner, Peer(jetd.host, jetd.port) as client:
        for i in range(5):
            owner.add_state(f"it/{i}", i)
        with client.fetch("it/") as fetch:
            first = [fetch.next(timeout=5) for _ in range(5)]
            assert [(e.kind, e.key) for e in first] == [(EventKind.ADD, f"it/{i}") for i in range(5)]
            with pytest.raises(TimeoutError):
                fetch.next(timeout=0.05)
            owner.add_state("it/new", "n")
            event = next(iter(fetch))
            assert (event.kind, event.key, event.value) == (EventKind.ADD, "it/new", "n")
        assert not fetch.active
        assert list(fetch) == []  # ended: iteration stops at once
        threads = []
        got = []
        done = threading.Event()

        def on_event(event):
            threads.append(threading.current_thread().name)
            got.append(event.key)
            if len(got) == 6:
                done.set()

        cb = client.fetch("it/", on_event)
        assert done.wait(5)
        cb.unfetch()
        assert set(threads) == {client._thread.name} and threads[0].startswith("jet-peer")


def test_handlers_run_on_peer_thread_and_blocking_inside_is_refused(jetd):
    with Peer(jetd.host, jetd.port) as owner, Peer(jetd.host, jetd.port) as client:
        where = []

        def handler(value):
            where.append(threading.current_thread())
            return owner.get("h/other")  # blocking on its own thread: refused

        def good(value):
            # The future variant is fine from a handler (not waited on here).
            owner.set_future("h/other", value)
            return value

        owner.add_state("h/other", 0, on_set=lambda v: v)
        owner.add_state("h/bad", 0, on_set=handler)
        owner.add_state("h/good", 0, on_set=good)
        with pytest.raises(Internal, match="deadlock"):
            client.set("h/bad", 1)
        assert where == [owner._thread]
        assert client.set("h/good", 7) == 7


def test_many_threads_at_once(jetd):
    with Peer(jetd.host, jetd.port) as owner, Peer(jetd.host, jetd.port) as shared:
        owner.add_method("t/id", lambda x: x)
        for t in range(8):
            owner.add_state(f"t/{t}", 0, on_set=lambda v: v)
        errors = []

        def worker(t):
            try:
                for i in range(60):
                    assert shared.set(f"t/{t}", i) == i
                    assert shared.call("t/id", [t, i]) == [t, i]
                    assert shared.get(f"t/{t}") == i
            except Exception as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == []
        assert [shared.get(f"t/{t}") for t in range(8)] == [59] * 8


def test_close_joins_thread_and_leaks_nothing(jetd):
    Peer(jetd.host, jetd.port).close()  # warm-up: lazy imports, loop internals
    threads_before = threading.active_count()
    fds_before = _open_fds()
    for _ in range(5):
        peer = Peer(jetd.host, jetd.port)
        peer.add_state("leak/x", 1)
        fetch = peer.fetch("leak/")
        assert fetch.next(timeout=5).key == "leak/x"
        peer.close()
        peer.close()  # idempotent
        assert not peer._thread.is_alive()
    assert threading.active_count() == threads_before
    assert _open_fds() <= fds_before
    with pytest.raises(ConnectionClosed):
        peer.get("leak/x")
    with pytest.raises(ConnectionClosed):
        peer.set_future("leak/x", 1).result(1)


def test_failed_connect_leaks_nothing():
    threads_before = threading.active_count()
    fds_before = _open_fds()
    with pytest.raises(ConnectionClosed):
        Peer("127.0.0.1", 1, timeout=2)
    assert threading.active_count() == threads_before
    assert _open_fds() <= fds_before


def test_close_from_another_thread_fails_pending(start_jetd):
    daemon = start_jetd()
    with Peer(daemon.host, daemon.port) as owner:
        release = threading.Event()
        entered = threading.Event()

        def stuck(value):
            entered.set()
            release.wait(5)  # blocks the owner's thread on purpose
            return value

        owner.add_state("c/stuck", 0, on_set=stuck)
        client = Peer(daemon.host, daemon.port)
        pending = client.set_future("c/stuck", 1)
        assert entered.wait(5)
        client.close()
        with pytest.raises(ConnectionClosed):
            pending.result(5)
        release.set()
    assert client.wait_closed(0.1)
