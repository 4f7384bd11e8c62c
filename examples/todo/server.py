"""The Todo server of the jet seeds: a Python peer owning the todo list, and a tiny web
server for the browser client page (examples/todo/index.html).

It owns one state per item, ``todo/<id>`` (JSON ``{"id", "title", "done"}``), and the
methods ``todo/add`` (argument: the title; result: the new id), ``todo/remove`` and
``todo/toggle`` (argument: the id). Browsers fetch ``todo/`` and call the methods over
jetd's WebSocket endpoint; every browser sees every change live. Only public APIs of
:class:`peer.PeerAsync` are used.

Run (see README.md)::

    python -m jetd --http-port 8080 --http-origins http://127.0.0.1:8000
    python examples/todo/server.py --jet 127.0.0.1:11124 --http-port 8000 --ws ws://127.0.0.1:8080/jet
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from peer import PeerAsync
from peer import Rejected
from peer import State

HERE = Path(__file__).resolve().parent
LIBRARY = HERE.parent.parent / "js" / "jet.js"
MAX_TITLE = 200


class TodoList:
    """The todo list, owned on the bus."""

    def __init__(self, peer: PeerAsync) -> None:
        self.peer = peer
        self.items: dict[int, State] = {}
        self.next_id = 1

    async def start(self) -> None:
        await self.peer.add_method("todo/add", self.add)
        await self.peer.add_method("todo/remove", self.remove)
        await self.peer.add_method("todo/toggle", self.toggle)

    async def add(self, title: Any) -> int:
        if not isinstance(title, str) or not title.strip():
            raise Rejected("a todo needs a title (a non-empty string)")
        if len(title) > MAX_TITLE:
            raise Rejected(f"a title has at most {MAX_TITLE} characters")
        item_id = self.next_id
        self.next_id += 1
        item = {"id": item_id, "title": title.strip(), "done": False}
        self.items[item_id] = await self.peer.add_state(f"todo/{item_id}", item, on_set=self._on_set(item_id))
        return item_id

    def _on_set(self, item_id: int) -> Any:
        def on_set(value: Any) -> dict[str, Any]:
            # A client may also set an item directly: only title and done may change.
            current = dict(self.items[item_id].value)  # type: ignore[call-overload]
            if not isinstance(value, dict) or set(value) - {"id", "title", "done"}:
                raise Rejected("an item is {title, done}")
            if "done" in value and not isinstance(value["done"], bool):
                raise Rejected("done is true or false")
            current.update({k: value[k] for k in ("title", "done") if k in value})
            return current

        return on_set

    def _item(self, item_id: Any) -> State:
        if not isinstance(item_id, int) or item_id not in self.items:
            raise Rejected(f"no todo {item_id!r}")
        return self.items[item_id]

    async def remove(self, item_id: Any) -> bool:
        state = self._item(item_id)
        del self.items[item_id]
        await state.remove()
        return True

    async def toggle(self, item_id: Any) -> bool:
        state = self._item(item_id)
        item = dict(state.value)  # type: ignore[call-overload]
        item["done"] = not item["done"]
        await state.notify(item)
        return bool(item["done"])


def serve_page(port: int, ws_url: str) -> ThreadingHTTPServer:
    """The client page, the JavaScript library and the page's config, on 127.0.0.1:port."""
    files = {"/": (HERE / "index.html", "text/html; charset=utf-8"),
             "/jet.js": (LIBRARY, "text/javascript; charset=utf-8")}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.partition("?")[0]
            if path == "/config.json":
                body, kind = json.dumps({"jet": ws_url}).encode(), "application/json"
            elif path in files:
                file, kind = files[path]
                body = file.read_bytes()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


async def main() -> int:
    parser = argparse.ArgumentParser(description="The jet Todo server peer and its web page.")
    parser.add_argument("--jet", default="127.0.0.1:11124", help="jetd's TCP address (default 127.0.0.1:11124)")
    parser.add_argument("--http-port", type=int, default=8000, help="port of the client page (default 8000, 0: free)")
    parser.add_argument("--ws", default="ws://127.0.0.1:8080/jet", help="jetd's WebSocket URL, for the page")
    args = parser.parse_args()
    host, _, port = args.jet.rpartition(":")
    peer = await PeerAsync.connect(host, int(port), name="todo-server", reconnect=True)
    todos = TodoList(peer)
    await todos.start()
    web = serve_page(args.http_port, args.ws)
    print(f"todo server: page on http://127.0.0.1:{web.server_address[1]}/ (jetd at {args.jet})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    web.shutdown()
    await peer.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
