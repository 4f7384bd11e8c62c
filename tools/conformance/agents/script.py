"""The agent script of spec/conformance/PEER.md, shared by the Python agents: the keys
and values it uses, its two requests and the lines it prints. ``tools.conformance.peer``
(the suite, playing the daemon) checks against the same constants."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

STATE_KEY = "agent/state"
METHOD_KEY = "agent/echo"
FETCH_PREFIX = "data/"
SET_KEY, SET_VALUE = "data/x", 7
CALL_KEY, CALL_ARG = "data/echo", "x" * 100
TIMEOUT = 10  # the agent's own request timeout (PEER.md)


def say(line: str) -> None:
    print(line, flush=True)


def say_event(kind: object, key: str, value: Any) -> None:
    say(f"event {kind} {key} {json.dumps(value)}")


def requests(peer: Any) -> list[tuple[str, Callable[[], Any]]]:
    """The script's requests in order, as (name, start): ``start()`` sends it and
    returns its result (an awaitable for the asyncio peer)."""
    return [("set", lambda: peer.set(SET_KEY, SET_VALUE)), ("call", lambda: peer.call(CALL_KEY, CALL_ARG))]


def run_requests(peer: Any, error: type[Exception], status_of: Callable[[Any], str]) -> None:
    """The requests of a blocking peer, one line each: ``NAME ok RESULT`` or
    ``NAME error STATUS`` for an ``error`` raised."""
    for name, start in requests(peer):
        try:
            say(f"{name} ok {json.dumps(start())}")
        except error as exc:
            say(f"{name} error {status_of(exc)}")


def run_agent(main: Callable[[str, int], int], error: type[Exception], status_of: Callable[[Any], str]) -> None:
    """``main(HOST, PORT)`` from the command line; an ``error`` escaping it prints
    ``error STATUS TEXT`` and exits 1."""
    try:
        sys.exit(main(sys.argv[1], int(sys.argv[2])))
    except error as exc:
        say(f"error {status_of(exc)} {exc}")
        sys.exit(1)
