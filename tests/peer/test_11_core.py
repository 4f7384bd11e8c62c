"""The sans-IO peer core (peer/core.py) on its own: no socket, no loop, the clock passed in."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import jetwire
from jetwire.codes import Action
from jetwire.codes import EntryKind
from peer import core
from peer.errors import Malformed
from peer.errors import NotFound
from peer.errors import PeerError
from peer.errors import Rejected
from peer.errors import Timeout
from peer.errors import TooLarge

# --- RequestTable: ids ------------------------------------------------------------------


def test_ids_count_up_wrap_at_u32_and_skip_requests_in_flight() -> None:
    table: core.RequestTable[str] = core.RequestTable(10.0)
    assert [table.open(name, core.convert_empty, 0.0) for name in "abc"] == [1, 2, 3]
    assert table.last_id == 3
    table.pop(2)
    table._last_id = 0xFFFF_FFFE
    assert table.open("d", core.convert_empty, 0.0) == 0xFFFF_FFFF
    assert table.open("e", core.convert_empty, 0.0) == 0  # PROTOCOL.md 5: 0 is valid once wrapped
    assert table.open("f", core.convert_empty, 0.0) == 2  # 1 and 3 are still in flight
    assert table.open("g", core.convert_empty, 0.0) == 4
    assert len(table) == 6 and 1 in table and 5 not in table


def test_a_timeout_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError):
        core.RequestTable(0.0)


# --- RequestTable: deadlines ------------------------------------------------------------


def test_default_timeout_sets_the_timer_once_and_expires_in_order() -> None:
    table: core.RequestTable[str] = core.RequestTable(5.0)
    assert table.timer_at is None
    table.open("first", core.convert_empty, 100.0)
    assert table.timer_at == 105.0  # the shell arms its timer
    table.open("second", core.convert_empty, 101.0)
    table.open("third", core.convert_empty, 102.0)
    assert table.timer_at == 105.0  # later deadlines: the timer stays
    assert table.expire(104.9) == ([], 105.0)
    expired, next_at = table.expire(106.0)
    assert [waiter for waiter, _ in expired] == ["first", "second"]
    assert all(isinstance(error, Timeout) for _, error in expired)
    assert expired[0][1].message == "no response within 5 s (peer timeout)"
    assert next_at == 107.0 and table.timer_at == 107.0
    assert list(table.pending) == [3]


def test_answered_requests_do_not_expire_and_do_not_hold_the_timer() -> None:
    table: core.RequestTable[str] = core.RequestTable(5.0)
    table.open("first", core.convert_empty, 0.0)
    table.open("second", core.convert_empty, 1.0)
    assert table.answer(jetwire.Response(1)) == ("first", True, None)
    # The timer fires at 5.0 for an answered request: nothing fails, it moves on to 6.0.
    assert table.expire(5.0) == ([], 6.0)
    expired, next_at = table.expire(6.0)
    assert [waiter for waiter, _ in expired] == ["second"] and next_at is None
    assert table.timer_at is None
    table.open("third", core.convert_empty, 7.0)
    assert table.timer_at == 12.0  # no timer armed: arm again


def test_an_own_timeout_earlier_than_the_timer_moves_it_and_names_its_delay() -> None:
    table: core.RequestTable[str] = core.RequestTable(30.0)
    table.open("default", core.convert_empty, 0.0)
    assert table.timer_at == 30.0
    table.open("short", core.convert_empty, 0.0, timeout=0.25)
    assert table.timer_at == 0.25
    table.open("long", core.convert_empty, 0.0, timeout=60.0)
    assert table.timer_at == 0.25
    expired, next_at = table.expire(0.5)
    assert [(waiter, error.message) for waiter, error in expired] == [
        ("short", "no response within 0.25 s (peer timeout)")
    ]
    assert next_at == 30.0
    expired, next_at = table.expire(61.0)
    assert sorted(waiter for waiter, _ in expired) == ["default", "long"]
    assert next_at is None and len(table) == 0


def test_answered_own_timeout_requests_do_not_pile_up() -> None:
    table: core.RequestTable[int] = core.RequestTable(5.0)
    for number in range(10_000):
        rid = table.open(number, core.convert_empty, float(number), timeout=1000.0)
        table.answer(jetwire.Response(rid))
    assert len(table) == 0
    assert len(table._by_time) <= 64 + 2  # compacted as it grew


def test_a_reused_id_expires_the_new_request_not_the_old_deadline() -> None:
    table: core.RequestTable[str] = core.RequestTable(5.0)
    rid = table.open("old", core.convert_empty, 0.0)
    assert table.pop(rid) is not None
    table._last_id = rid - 1
    assert table.open("new", core.convert_empty, 4.0) == rid
    assert table.expire(5.0) == ([], 9.0)  # the old deadline of this id fails nothing
    assert [waiter for waiter, _ in table.expire(9.0)[0]] == ["new"]


def test_take_all_empties_the_table_and_disarms() -> None:
    table: core.RequestTable[str] = core.RequestTable(5.0)
    table.open("a", core.convert_empty, 0.0)
    table.open("b", core.convert_empty, 0.0, timeout=1.0)
    assert sorted(table.take_all()) == ["a", "b"]
    assert len(table) == 0 and table.timer_at is None
    assert table.expire(100.0) == ([], None)


# --- RequestTable: answers --------------------------------------------------------------


def test_answers_decode_to_results_or_typed_errors() -> None:
    table: core.RequestTable[str] = core.RequestTable(5.0)
    assert table.open("set", core.convert_value, 0.0) == 1
    assert table.open("set2", core.convert_value, 0.0) == 2
    assert table.open("add", core.convert_empty, 0.0) == 3
    assert table.open("fetch", core.convert_fetch_id, 0.0) == 4
    assert table.open("get", core.convert_raw, 0.0) == 5
    assert table.answer(jetwire.Response(1, value=jetwire.Value.of(21.5))) == ("set", True, 21.5)
    waiter, ok, error = table.answer(jetwire.Response(2, jetwire.Status.NOT_FOUND, message="no state x")) or (None, None, None)
    assert waiter == "set2" and ok is False
    assert isinstance(error, NotFound) and error.message == "no state x"
    waiter, ok, error = table.answer(jetwire.Response(3, value=jetwire.Value.of(1))) or (None, None, None)
    assert ok is False and isinstance(error, Malformed)  # PROTOCOL.md 11.1: wrong shape
    assert table.answer(jetwire.Response(4, fetch_id=9)) == ("fetch", True, 9)
    assert table.answer(jetwire.Response(5)) == ("get", True, jetwire.Value.of(None))
    assert table.answer(jetwire.Response(5)) is None  # late: unknown id
    assert len(table) == 0


def test_converters_refuse_the_wrong_shape() -> None:
    with pytest.raises(Malformed):
        core.convert_value(jetwire.Response(1, fetch_id=3))
    with pytest.raises(Malformed):
        core.convert_raw(jetwire.Response(1, fetch_id=3))
    with pytest.raises(Malformed):
        core.convert_fetch_id(jetwire.Response(1))
    with pytest.raises(Malformed):
        core.convert_fetch_id(jetwire.Response(1, value=jetwire.Value.of(1), fetch_id=3))
    assert core.convert_value(jetwire.Response(1)) is None  # PROTOCOL.md 6.3: empty OK to a set is core.NONE
    with pytest.raises(Malformed):  # a JSON value that does not parse
        core.convert_value(jetwire.Response(1, value=jetwire.Value(0x05, b"{nope")))


# --- messages into events ---------------------------------------------------------------


def test_fetch_events_name_their_fetch_kind_key_and_value() -> None:
    one = jetwire.Value.of(1)
    assert core.fetch_event(jetwire.FetchAdd(4, "a", one)) == (4, core.EventKind.ADD, "a", one)
    assert core.fetch_event(jetwire.FetchChange(4, "a", one)) == (4, core.EventKind.CHANGE, "a", one)
    assert core.fetch_event(jetwire.FetchRemove(4, "a", one)) == (4, core.EventKind.REMOVE, "a", one)
    assert core.fetch_event(jetwire.FetchMethod(5, Action.ADD, "m")) == (5, core.EventKind.METHOD_ADD, "m", core.NONE)
    assert core.fetch_event(jetwire.FetchNode(5, Action.REMOVE, "n/")) == (5, core.EventKind.NODE_REMOVE, "n/", core.NONE)
    assert core.fetch_event(jetwire.SetState(1, "a", one)) is None
    assert core.fetch_event(jetwire.FetchWindow(4, 0)) is None
    entry = jetwire.QueryEntry(9, EntryKind.METHOD, "m", core.NONE)
    assert core.query_result(entry) == core.QueryResult("method", "m", core.NONE)


def test_a_sorted_window_grows_updates_and_shrinks() -> None:
    window = core.SortedWindow(start=3)
    a, b, c = jetwire.Value.of("a"), jetwire.Value.of("b"), jetwire.Value.of("c")
    rows = window.apply(jetwire.FetchWindow(1, 2, (jetwire.WindowEntry(3, "k/a", a), jetwire.WindowEntry(4, "k/b", b))))
    assert rows == (core.WindowRow(3, "k/a", a), core.WindowRow(4, "k/b", b))
    # Only index 4 changes; an index outside the window is ignored, never a crash.
    rows = window.apply(jetwire.FetchWindow(1, 2, (jetwire.WindowEntry(4, "k/c", c), jetwire.WindowEntry(99, "k/x", a))))
    assert rows == (core.WindowRow(3, "k/a", a), core.WindowRow(4, "k/c", c))
    assert window.apply(jetwire.FetchWindow(1, 1)) == (core.WindowRow(3, "k/a", a),)
    grown = window.apply(jetwire.FetchWindow(1, 3))
    assert grown[1:] == (core.WindowRow(4, "", core.NONE), core.WindowRow(5, "", core.NONE))  # not yet listed
    window.clear()
    assert window.rows == []


def test_known_entries_report_only_the_difference_after_a_restore() -> None:
    known = core.KnownEntries()
    one, two = jetwire.Value.of(1), jetwire.Value.of(2)
    assert known.note(core.EventKind.ADD, "a", one) is core.EventKind.ADD
    assert known.note(core.EventKind.ADD, "b", one) is core.EventKind.ADD
    assert known.note(core.EventKind.ADD, "c", one) is core.EventKind.ADD
    assert known.note(core.EventKind.REMOVE, "c", one) is core.EventKind.REMOVE
    assert known.end_restore() == []  # no restore under way
    known.begin_restore()
    assert known.note(core.EventKind.ADD, "a", one) is None  # known, unchanged: say nothing
    assert known.note(core.EventKind.ADD, "b", two) is core.EventKind.CHANGE
    assert known.note(core.EventKind.ADD, "d", one) is core.EventKind.ADD
    assert known.note(core.EventKind.WINDOW, "", core.NONE) is core.EventKind.WINDOW
    assert known.end_restore() == []  # a, b, d were all announced again
    known.begin_restore()
    known.note(core.EventKind.ADD, "b", two)
    assert known.end_restore() == [("a", one), ("d", one)]


# --- owner answers ----------------------------------------------------------------------


def handler_that_refuses(value: object) -> None:
    raise Rejected("too hot")


def test_error_answers(caplog: pytest.LogCaptureFixture) -> None:
    assert core.error_answer(7, Rejected("too hot")) == jetwire.Response(7, jetwire.Status.REJECTED, message="too hot")
    with caplog.at_level(logging.ERROR, logger="peer"):
        answer = core.error_answer(8, ZeroDivisionError("x" * 5000), handler_that_refuses)
    assert answer is not None and answer.status is jetwire.Status.INTERNAL
    assert answer.message.startswith("handler_that_refuses failed: ZeroDivisionError: xxx")
    assert len(answer.message) == core.MAX_ERROR_MESSAGE
    assert "handler_that_refuses failed" in caplog.text
    # A PeerError that carries OK is no answer to an error: INTERNAL.
    ok_error = PeerError("odd", jetwire.Status.OK)
    assert (core.error_answer(9, ok_error) or jetwire.Response(0)).status is jetwire.Status.INTERNAL
    assert core.error_answer(None, Rejected("no")) is None  # PROTOCOL.md 7.1: an EVENT gets nothing


@pytest.mark.parametrize("obj", [0, -1, 2**63 - 1, -(2**63), 1.5, float("inf"), "s", None, True, [1]])
def test_as_value_fast_path_equals_value_of(obj: Any) -> None:
    assert core.as_value(obj) == jetwire.Value.of(obj)


@pytest.mark.parametrize("obj", [2**63, -(2**63) - 1, object(), {"x": float("nan")}])
def test_as_value_refuses_what_has_no_mapping_with_a_typed_error(obj: Any) -> None:
    with pytest.raises(jetwire.LocalProtocolError):
        jetwire.Value.of(obj)
    with pytest.raises(jetwire.LocalProtocolError):
        core.as_value(obj)


# --- the daemon's frames ----------------------------------------------------------------


def test_info_checks() -> None:
    assert core.unsupported_version(jetwire.Info("jetd")) is None
    assert core.unsupported_version(jetwire.Info("jetd", major=jetwire.PROTOCOL_MAJOR + 1, minor=3)) == (
        f"unsupported protocol version {jetwire.PROTOCOL_MAJOR + 1}.3"
    )
    # PROTOCOL.md 4.4.1: a 1.2 daemon's first INFO has jetwire.FEATURE_LIMITS but no limits yet.
    assert core.limits_follow(jetwire.Info("jetd", features=jetwire.FEATURE_LIMITS))
    assert not core.limits_follow(jetwire.Info("jetd", features=jetwire.FEATURE_LIMITS, max_key_length=1024, route_timeout_ms=5000))
    assert not core.limits_follow(jetwire.Info("jetd"))  # a 1.0/1.1 daemon: this INFO is all there is


def test_what_a_peer_answers_to_frames_it_does_not_serve() -> None:
    refusal = core.refuse_unexpected(jetwire.GetState(5, "x"))
    assert refusal == jetwire.Response(5, jetwire.Status.UNKNOWN_FUNCTION, message="a peer serves only set and call")
    assert core.refuse_unexpected(jetwire.FetchAdd(1, "a", core.NONE)) is None  # no id: nothing to answer
    bad = jetwire.RemoteProtocolError("x" * 3000, jetwire.Status.MALFORMED, request_id=9, frame_type=jetwire.FrameType.REQUEST)
    answer = core.answer_bad_request(bad)
    assert answer is not None and answer.id == 9 and answer.status is jetwire.Status.MALFORMED
    assert len(answer.message) == core.MAX_ERROR_MESSAGE
    fatal = jetwire.RemoteProtocolError("short", request_id=9, frame_type=jetwire.FrameType.REQUEST, fatal=True)
    assert core.answer_bad_request(fatal) is None  # PROTOCOL.md 9.2: the link closes instead
    response = jetwire.RemoteProtocolError("bad", request_id=9, frame_type=jetwire.FrameType.RESPONSE)
    assert core.answer_bad_request(response) is None  # 9.3: a bad RESPONSE is not answered


def test_a_body_above_the_daemons_max_body_is_refused_before_sending() -> None:
    message = jetwire.SetState(1, "k", jetwire.Value.of("x" * 100))
    frame = core.encode_checked(message, None)  # no INFO yet: nothing to check against
    assert core.encode_checked(message, jetwire.Info("jetd", max_body=len(frame) - jetwire.HEADER_SIZE)) == frame
    with pytest.raises(TooLarge, match="exceeds the daemon's max_body"):
        core.encode_checked(message, jetwire.Info("jetd", max_body=len(frame) - jetwire.HEADER_SIZE - 1))
