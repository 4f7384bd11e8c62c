"""Area 05: methods: ADD/REMOVE_METHOD, CALL routed with result passthrough (PROTOCOL.md 6.5-6.7)."""

from __future__ import annotations

from jetd_testlib import RawPeer
from jetd_testlib import v

from jetwire import AddMethod
from jetwire import AddState
from jetwire import CallMethod
from jetwire import FetchStates
from jetwire import RemoveMethod
from jetwire import Response
from jetwire import Status
from jetwire import Value
from jetwire import ValueType


def test_call_routed_and_result_passed_through(jetd):
    owner = RawPeer(jetd.address, "svc")
    caller = RawPeer(jetd.address, "caller")
    assert owner.request(lambda rid: AddMethod(rid, "reset")).ok
    caller.send(CallMethod(12, "reset", Value(ValueType.JSON, b"[1,2]")))
    routed = owner.recv()
    assert isinstance(routed, CallMethod) and routed.value == Value(ValueType.JSON, b"[1,2]")
    owner.send(Response(routed.id, Status.OK, Value(ValueType.CBOR, b"\x01")))
    assert caller.recv() == Response(12, Status.OK, Value(ValueType.CBOR, b"\x01"))
    caller.send(CallMethod(13, "reset", Value(ValueType.NONE)))
    routed = owner.recv()
    owner.send(Response(routed.id, Status.REJECTED, message="busy"))
    assert caller.recv() == Response(13, Status.REJECTED, message="busy")


def test_call_ok_with_wrong_shape_is_malformed(jetd):
    owner = RawPeer(jetd.address)
    caller = RawPeer(jetd.address)
    owner.request(lambda rid: AddMethod(rid, "m"))
    caller.send(CallMethod(1, "m", v(None)))
    routed = owner.recv()
    owner.send(Response(routed.id, Status.OK, fetch_id=4))  # 4-byte OK: a fetch_id shape
    answer = caller.recv()
    assert answer.id == 1 and answer.status == Status.MALFORMED
    # The owner stays connected and keeps serving.
    caller.send(CallMethod(2, "m", v(None)))
    routed = owner.recv()
    owner.send(Response(routed.id, Status.OK, v(7)))
    assert caller.recv() == Response(2, Status.OK, v(7))


def test_method_errors(jetd):
    owner = RawPeer(jetd.address)
    caller = RawPeer(jetd.address)
    owner.request(lambda rid: AddMethod(rid, "m"))
    owner.request(lambda rid: AddState(rid, "s", v(1)))
    assert caller.request(lambda rid: CallMethod(rid, "nope", v(1))).status == Status.NOT_FOUND
    assert caller.request(lambda rid: CallMethod(rid, "s", v(1))).status == Status.WRONG_KIND
    assert caller.request(lambda rid: AddMethod(rid, "m")).status == Status.ALREADY_EXISTS
    assert caller.request(lambda rid: RemoveMethod(rid, "m")).status == Status.NOT_OWNER
    assert caller.request(lambda rid: RemoveMethod(rid, "x")).status == Status.NOT_FOUND
    assert owner.request(lambda rid: RemoveMethod(rid, "m")).ok
    assert caller.request(lambda rid: CallMethod(rid, "m", v(1))).status == Status.NOT_FOUND


def test_methods_are_never_fetched(jetd):
    owner = RawPeer(jetd.address)
    owner.request(lambda rid: AddMethod(rid, "a/m"))
    f = RawPeer(jetd.address)
    f.request(lambda rid: FetchStates(rid, ""))
    owner.request(lambda rid: AddMethod(rid, "a/n"))
    f.nothing_within(0.2)


def test_call_event_forwarded_as_event(jetd):
    owner = RawPeer(jetd.address)
    caller = RawPeer(jetd.address)
    owner.request(lambda rid: AddMethod(rid, "fire"))
    caller.send(CallMethod(None, "fire", v("go")))
    assert owner.recv() == CallMethod(None, "fire", v("go"))
