"""Area 14, file descriptors (issue 12 item 6, PROTOCOL.md 10.7): with a descriptor limit
below max_connections, jetd warns at start, and each connection it cannot keep gets INFO
then CLOSE LIMIT_EXCEEDED, and a log line, instead of vanishing."""

from __future__ import annotations

import os
import time
from pathlib import Path

from jetd_testlib import PeerClosed
from jetd_testlib import RawPeer

from jetwire import Close
from jetwire import GetState
from jetwire import Status

FD_LIMIT = 64
REPO = Path(__file__).resolve().parents[2]


def test_connections_beyond_the_fd_limit_are_told_and_logged(start_jetd, tmp_path):
    # The daemon starts with soft = hard = 64 descriptors (it cannot raise them).
    (tmp_path / "sitecustomize.py").write_text(
        f"import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, ({FD_LIMIT}, {FD_LIMIT}))\n"
    )
    daemon = start_jetd(env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"})
    peers = []
    for i in range(FD_LIMIT + 16):
        try:
            peers.append(RawPeer(daemon.address))  # sends nothing: its close is clean
        except (PeerClosed, ConnectionError) as exc:
            raise AssertionError(f"connection {i} dropped without a CLOSE: {exc!r}") from None
    time.sleep(0.3)  # a refused one has its CLOSE right after its INFO
    kept, refused = [], []
    for i, peer in enumerate(peers):
        try:
            message = peer.recv(timeout=0.02)
        except AssertionError:  # nothing: it was kept
            kept.append(peer)
            continue
        assert isinstance(message, Close) and message.status == Status.LIMIT_EXCEEDED, message
        assert "out of file descriptors" in message.message, message
        refused.append(i)
        peer.close()
    assert len(kept) >= FD_LIMIT // 2 and refused, (len(kept), refused)
    # The kept ones work.
    assert kept[-1].request(lambda rid: GetState(rid, "x")).status == Status.NOT_FOUND
    for peer in kept:
        peer.close()
    daemon.stop()
    log = daemon.stderr()
    assert f"file descriptor limit {FD_LIMIT}" in log
    assert "refused" in log and "out of file descriptors" in log
