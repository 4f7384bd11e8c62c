"""Deliberately broken PEER.md agents, built on :class:`peer.tiny.TinyPeer`; the peer
suite must fail each in the cases named (tests/conformance/test_peer_conformance.py).

``python -m tools.conformance.agents.broken MODE HOST PORT``, MODE one of:

- ``late-listeners``: attaches its fetch callback after FETCH_STATES' OK has been handled
  and its set handler after ADD_STATE's OK (the bug issue 17 reports from a JavaScript
  peer): frames in the same TCP segment as the OK are lost or answered NOT_FOUND.
- ``stray-response``: sends a RESPONSE no routed request asked for (PROTOCOL.md 11).
- ``ok-before-notify``: answers a routed set OK before its NOTIFY_STATE (PROTOCOL.md 11).
"""

from __future__ import annotations

import sys
from typing import Any
from typing import Optional

from peer.tiny import ADD_STATE
from peer.tiny import EVENT
from peer.tiny import FETCH_STATES
from peer.tiny import NOTIFY_STATE
from peer.tiny import OK
from peer.tiny import RESPONSE
from peer.tiny import SET_STATE
from peer.tiny import FetchCallback
from peer.tiny import Handler
from peer.tiny import TinyPeer
from peer.tiny import encode_frame
from peer.tiny import to_value

from .peer_tiny import main


class LateListeners(TinyPeer):
    def add_state(self, key: str, value: Any, on_set: Optional[Handler] = None) -> None:
        self._request({"function": ADD_STATE, "key": key, "value": to_value(value)})
        self.on_set[key] = on_set  # too late: a routed set in the OK's segment was answered already

    def fetch(self, prefix: str, callback: FetchCallback, *args: Any, **kwargs: Any) -> int:
        response = self._request({"function": FETCH_STATES, "prefix": prefix}, shape="fetch_id")
        self.fetches[response["fetch_id"]] = callback  # too late: the initial adds went by
        return int(response["fetch_id"])

class StrayResponse(TinyPeer):
    def fetch(self, prefix: str, callback: FetchCallback, *args: Any, **kwargs: Any) -> int:
        fetch_id = super().fetch(prefix, callback, *args, **kwargs)
        self._send(encode_frame({"type": RESPONSE, "id": 0xDEAD, "status": OK}))
        return fetch_id

class OkBeforeNotify(TinyPeer):
    def _serve(self, msg: dict[str, Any]) -> None:
        if msg.get("function", msg.get("code")) != SET_STATE or msg.get("id") is None:
            super()._serve(msg)
            return
        value = msg["value"]
        self._send(encode_frame({"type": RESPONSE, "id": msg["id"], "status": OK, "value": value})
                   + encode_frame({"type": EVENT, "code": NOTIFY_STATE, "key": msg["key"], "value": value}))

MODES: dict[str, type[TinyPeer]] = {
    "late-listeners": LateListeners,
    "stray-response": StrayResponse,
    "ok-before-notify": OkBeforeNotify,
}

if __name__ == "__main__":
    sys.exit(main(sys.argv[2], int(sys.argv[3]), MODES[sys.argv[1]]))
