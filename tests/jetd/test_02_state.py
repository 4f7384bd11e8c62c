"""Area 02: ADD/REMOVE/NOTIFY/GET of states, ownership and statuses (PROTOCOL.md 6, 10.2, 10.4)."""

from __future__ import annotations

from jetd_testlib import RawPeer
from jetd_testlib import fetching
from jetd_testlib import v

from jetwire import AddMethod
from jetwire import AddState
from jetwire import FetchChange
from jetwire import GetState
from jetwire import NotifyState
from jetwire import RemoveMethod
from jetwire import RemoveState
from jetwire import Status
from jetwire import Value
from jetwire import ValueType


def test_add_get_notify_remove(jetd):
    owner = RawPeer(jetd.address, "owner")
    assert owner.request(lambda rid: AddState(rid, "plant/temp", v(21))).status == Status.OK
    assert owner.request(lambda rid: GetState(rid, "plant/temp")).value == v(21)
    assert owner.request(lambda rid: NotifyState(rid, "plant/temp", v(22.5))).status == Status.OK
    assert owner.request(lambda rid: GetState(rid, "plant/temp")).value == v(22.5)
    # Event form updates the cache too.
    owner.send(NotifyState(None, "plant/temp", v("hot")))
    assert owner.request(lambda rid: GetState(rid, "plant/temp")).value == v("hot")
    assert owner.request(lambda rid: RemoveState(rid, "plant/temp")).status == Status.OK
    assert owner.request(lambda rid: GetState(rid, "plant/temp")).status == Status.NOT_FOUND


def test_values_carried_opaquely(jetd):
    owner = RawPeer(jetd.address)
    values = [
        Value(ValueType.JSON, b"{not json"),
        Value(ValueType.CBOR, b"\xa1\x01\x02"),
        Value(ValueType.MSGPACK, b"\x93\x01\x02\x03"),
        Value(0x80, b"\x00\xff" * 100),
        Value(ValueType.BYTES, b""),
        Value(ValueType.NONE),
        v(True),
        v(-(2**63)),
    ]
    for i, value in enumerate(values):
        assert owner.request(lambda rid, i=i, value=value: AddState(rid, f"k{i}", value)).ok
        assert owner.request(lambda rid, i=i: GetState(rid, f"k{i}")).value == value


def test_ownership_and_statuses(jetd):
    owner = RawPeer(jetd.address)
    other = RawPeer(jetd.address)
    owner.request(lambda rid: AddState(rid, "s", v(1)))
    owner.request(lambda rid: AddMethod(rid, "m"))
    assert other.request(lambda rid: AddState(rid, "s", v(2))).status == Status.ALREADY_EXISTS
    assert other.request(lambda rid: AddState(rid, "m", v(2))).status == Status.ALREADY_EXISTS
    assert other.request(lambda rid: AddMethod(rid, "s")).status == Status.ALREADY_EXISTS
    assert other.request(lambda rid: NotifyState(rid, "s", v(2))).status == Status.NOT_OWNER
    assert other.request(lambda rid: RemoveState(rid, "s")).status == Status.NOT_OWNER
    assert other.request(lambda rid: RemoveState(rid, "nope")).status == Status.NOT_FOUND
    assert other.request(lambda rid: RemoveState(rid, "m")).status == Status.WRONG_KIND
    assert other.request(lambda rid: NotifyState(rid, "m", v(1))).status == Status.WRONG_KIND
    assert other.request(lambda rid: NotifyState(rid, "zz", v(1))).status == Status.NOT_FOUND
    assert other.request(lambda rid: GetState(rid, "m")).status == Status.WRONG_KIND
    assert other.request(lambda rid: RemoveMethod(rid, "s")).status == Status.WRONG_KIND
    assert other.request(lambda rid: RemoveMethod(rid, "m")).status == Status.NOT_OWNER
    # A bad notify from someone else left the cache alone.
    assert other.request(lambda rid: GetState(rid, "s")).value == v(1)
    # After removal the key is free for anyone.
    assert owner.request(lambda rid: RemoveState(rid, "s")).ok
    assert other.request(lambda rid: AddState(rid, "s", v(3))).ok


def test_notify_same_value_still_changes(jetd):
    owner, f, fid = fetching(jetd.address, "same", 1, "same")
    owner.send(NotifyState(None, "same", v(1)), NotifyState(None, "same", v(1)))
    assert f.recv_n(2) == [FetchChange(fid, "same", v(1))] * 2


def test_notify_event_errors_are_dropped_not_fatal(jetd):
    owner = RawPeer(jetd.address)
    other = RawPeer(jetd.address)
    owner.request(lambda rid: AddState(rid, "s", v(1)))
    other.send(NotifyState(None, "s", v(9)), NotifyState(None, "missing", v(9)))
    assert other.request(lambda rid: GetState(rid, "s")).value == v(1)
