"""Fixtures shared by the jetd tests over TLS and raw sockets."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jetd.tls_testlib import make_pki


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and client certificates (tls_testlib.make_pki)."""
    return make_pki(tmp_path)


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    """Client sockets of a test, all closed at its end."""
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()
