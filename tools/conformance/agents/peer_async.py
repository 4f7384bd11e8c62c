"""The PEER.md agent for :class:`peer.PeerAsync`: ``python -m tools.conformance.agents.peer_async HOST PORT``."""

from __future__ import annotations

import asyncio
import json

from peer import PeerAsync
from peer.errors import PeerError

from .peer_sync import status_of
from .script import FETCH_PREFIX
from .script import METHOD_KEY
from .script import STATE_KEY
from .script import TIMEOUT
from .script import requests
from .script import run_agent
from .script import say
from .script import say_event


async def main(host: str, port: int) -> int:
    peer = await PeerAsync.connect(host, port, name="agent-async", timeout=TIMEOUT)
    await peer.add_state(STATE_KEY, 0, on_set=lambda value: value)
    await peer.add_method(METHOD_KEY, lambda args: args)
    await peer.fetch(FETCH_PREFIX, lambda event: say_event(event.kind, event.key, event.value))
    say("ready")
    for name, start in requests(peer):
        try:
            say(f"{name} ok {json.dumps(await start())}")
        except PeerError as exc:
            say(f"{name} error {status_of(exc)}")
    await peer.wait_closed()
    say("closed")
    await peer.close()
    return 0


if __name__ == "__main__":
    run_agent(lambda host, port: asyncio.run(main(host, port)), PeerError, status_of)
