"""14-security, issue 30: what a peer learns about keys it may not read (PROTOCOL.md
15.3), in the sans-IO core, and a password that a reload replaces while its check is
queued (PROTOCOL.md 15.2, 15.5).

One rule: a request on a key the connection may not read is answered NOT_AUTHORIZED with
the same message whether the key is a state, a method or missing; ``own`` and ``write``
take effect only on keys the connection may also read."""

from __future__ import annotations

from jetd.access import CHECKS_AT_ONCE
from jetd.access import Access
from jetd.connection import Connection
from jetd.users import Grants
from jetd.users import User
from jetd.users import UsersFile
from jetwire import AddMethod
from jetwire import AddState
from jetwire import Authenticate
from jetwire import CallMethod
from jetwire import GetState
from jetwire import Message
from jetwire import NotifyState
from jetwire import RemoveMethod
from jetwire import RemoveState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from tests.jetd.test_14_access_core import Harness
from tests.jetd.test_14_access_core import cheap_hash

KEYS = ("secret/a", "secret/nope", "secret/m")  # a state, no key, a method


def _access(owner_password: str = "o") -> Access:
    users = UsersFile()
    users.anonymous = Grants(read=["pub/"])
    users.users["owner"] = User(password=cheap_hash(owner_password), own=[""], read=[""], write=[""])
    users.users["viewer"] = User(password=cheap_hash("v"), read=["pub/"], write=["pub/"])
    # may own and write secret/ but not read it
    users.users["blind"] = User(password=cheap_hash("b"), own=["secret/", "pub/"], read=["pub/"],
                                   write=["secret/", "pub/"])
    return Access(users)


def _setup() -> tuple[Harness, Connection]:
    h = Harness(_access())
    owner = h.connect()
    h.login(owner, "owner", "o")
    h.send(owner, AddState(1, "secret/a", Value.of(42.0)), AddMethod(2, "secret/m"))
    assert h.recv(owner) == [Response(1), Response(2)]
    return h, owner


def _answers(h: Harness, conn: Connection, make: type[Message], value: bool) -> list[tuple[Status, str]]:
    """The answer to ``make`` for each of KEYS, with the key in its message replaced by KEY."""
    answers = []
    for rid, key in enumerate(KEYS, 100):
        request = make(rid, key, Value.of(1.0)) if value else make(rid, key)  # type: ignore[call-arg]
        h.send(conn, request)
        [answer] = h.recv(conn)
        assert isinstance(answer, Response) and answer.id == rid
        answers.append((answer.status, (answer.message or "").replace(key, "KEY")))
    return answers


FUNCTIONS: list[tuple[type[Message], bool]] = [
    (NotifyState, True), (RemoveState, False), (RemoveMethod, False),
    (SetState, True), (CallMethod, True), (GetState, False),
]


def test_unreadable_keys_get_one_answer_anonymous_or_logged_in() -> None:
    h, owner = _setup()
    anonymous, viewer = h.connect(), h.connect()
    h.login(viewer, "viewer", "v")
    for conn in (anonymous, viewer):
        for make, value in FUNCTIONS:
            answers = _answers(h, conn, make, value)
            assert answers[0][0] == Status.NOT_AUTHORIZED, (make.__name__, answers)
            assert answers == [answers[0]] * 3, (make.__name__, answers)
    assert h.recv(owner) == []  # nothing reached the owner


def test_own_and_write_without_read_tell_nothing() -> None:
    """ADD_STATE/ADD_METHOD where the peer may own but not read, and SET_STATE/CALL_METHOD
    where it may write but not read: the same NOT_AUTHORIZED (naming ``read``) for a key
    that is taken, free or a method, and the owner's value never comes back."""
    h, owner = _setup()
    blind = h.connect()
    h.login(blind, "blind", "b")
    for make, value in [(AddState, True), (AddMethod, False), (SetState, True), (CallMethod, True),
                        (NotifyState, True), (RemoveState, False), (RemoveMethod, False)]:
        answers = _answers(h, blind, make, value)
        assert answers == [(Status.NOT_AUTHORIZED, "not authorized: read KEY")] * 3, (make.__name__, answers)
    assert h.recv(owner) == []
    # Fire-and-forget: dropped, as for a key outside write (nothing reaches the owner).
    h.send(blind, SetState(None, "secret/a", Value.of(1.0)), CallMethod(None, "secret/m", Value.of(1.0)))
    assert h.recv(owner) == [] and h.recv(blind) == []
    # Where it may also read, own and write work as before.
    h.send(blind, AddState(1, "pub/x", Value.of(1.0)), SetState(2, "pub/x", Value.of(2.0)))
    replies = h.recv(blind)
    assert replies[0] == Response(1) and isinstance(replies[1], SetState)  # routed to itself


def test_owners_and_readers_still_learn_what_they_may() -> None:
    """The rule hides nothing from a peer that may read the key, or that owns it."""
    h, owner = _setup()
    h.send(owner, RemoveMethod(3, "secret/a"), NotifyState(4, "secret/m", Value.of(1.0)),
           RemoveState(5, "secret/nope"), AddState(6, "secret/a", Value.of(1.0)))
    assert [(a.status, a.message) for a in h.recv(owner)] == [  # type: ignore[attr-defined]
        (Status.WRONG_KIND, "the key is a state"), (Status.WRONG_KIND, "the key is a method"),
        (Status.NOT_FOUND, "no such state"), (Status.ALREADY_EXISTS, "the key is taken"),
    ]
    other = h.connect()
    h.login(other, "owner", "o")  # may read everything, owns nothing
    h.send(other, NotifyState(7, "secret/a", Value.of(1.0)), RemoveState(8, "secret/nope"))
    assert [a.status for a in h.recv(other)] == [Status.NOT_OWNER, Status.NOT_FOUND]  # type: ignore[attr-defined]


def test_a_reload_fails_the_checks_in_flight_of_a_changed_user() -> None:
    """PROTOCOL.md 15.2: a password is checked against the users file in force when the
    check completes; a reload that changes or removes the user fails the check."""
    h = Harness(_access())
    changed, removed, kept = h.connect(), h.connect(), h.connect()
    h.send(changed, Authenticate(1, "owner", "o"))
    h.send(removed, Authenticate(2, "viewer", "v"))
    h.send(kept, Authenticate(3, "blind", "b"))
    # The checks that started (CHECKS_AT_ONCE of them; the third waits in the queue) ran
    # against the old file ...
    checked = [(job(), done) for job, done in h.jobs]
    h.jobs.clear()
    assert [ok for ok, _ in checked] == [True] * min(3, CHECKS_AT_ONCE)
    reloaded = _access(owner_password="new").users
    del reloaded.users["viewer"]
    old = h.daemon.auth.access
    assert old is not None
    reloaded.users["blind"].password = old.users.users["blind"].password  # unchanged
    h.daemon.set_access(Access(reloaded), h.now)  # ... and a reload came before they report
    for ok, done in checked:
        done(ok)
    h.work()
    while h.jobs:  # the check that waited starts now, asked under the file in force before
        started = list(h.jobs)
        h.jobs.clear()
        for job, done in started:
            done(job())
        h.work()
    h.tick(1.0)  # past the failure delay
    assert h.recv(changed) == [Response(1, Status.AUTH_FAILED, message="authentication failed")]
    assert h.recv(removed) == [Response(2, Status.AUTH_FAILED, message="authentication failed")]
    assert h.recv(kept) == [Response(3)]
    assert changed.user is None and removed.user is None and kept.user == "blind"
    # The new password works.
    h.login(changed, "owner", "new")


def test_own_and_write_outside_read_are_named_when_the_file_loads() -> None:
    assert _access().partly_ineffective() == [
        "user blind: own 'secret/' takes effect only on keys it may also read",
        "user blind: write 'secret/' takes effect only on keys it may also read",
    ]
