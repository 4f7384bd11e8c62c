"""PROTOCOL.md 4.4.1: our peers ask a 1.2 daemon for its limits and show them; against a
daemon that does not announce them they connect as before."""

from __future__ import annotations

import asyncio
import socket
import threading

from jetwire import FEATURE_LIMITS
from jetwire import Decoder
from jetwire import Info
from jetwire import encode
from peer import Peer
from peer import PeerAsync


def test_peer_learns_the_daemons_limits(start_jetd):
    daemon = start_jetd("--route-timeout", "3", "--max-key-length", "200")
    with Peer(daemon.host, daemon.port) as peer:
        info = peer.info
        assert (info.max_key_length, info.route_timeout_ms) == (200, 3000)
        assert info.features & FEATURE_LIMITS and info.minor == 3

    async def main() -> Info:
        peer = await PeerAsync.connect(daemon.host, daemon.port)
        try:
            return peer.info
        finally:
            await peer.close()

    assert asyncio.run(main()).route_timeout_ms == 3000


def test_peer_connects_to_a_daemon_without_limits():
    """A 1.1 daemon: an INFO without LIMITS; the peer must not wait for a second one."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    seen: list[Info] = []

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(encode(Info("old-jetd", 1 << 20, 0x3, minor=1)))
            decoder = Decoder()
            decoder.receive_data(conn.recv(4096))
            first = decoder.next_message()
            assert isinstance(first, Info)
            seen.append(first)
            conn.recv(4096)  # until the peer closes

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with Peer("127.0.0.1", port, timeout=5) as peer:
            assert peer.info.name == "old-jetd" and peer.info.max_key_length is None
    finally:
        thread.join(10)
        server.close()
    assert seen and seen[0].features & FEATURE_LIMITS  # the peer asked; the daemon ignored it
