"""Area 01: accepting connections, INFO first, peer names, the CLI line and flags."""

from __future__ import annotations

import subprocess
import sys

from jetd_testlib import RawPeer

from jetwire import DEFAULT_MAX_BODY
from jetwire import FEATURE_CONFLATION
from jetwire import FEATURE_LIMITS
from jetwire import GetState
from jetwire import Info
from jetwire import Response
from jetwire import Status
from jetwire import encode


def test_info_is_first_frame(jetd):
    with RawPeer(jetd.address, read_info=False) as peer:
        message = peer.recv()
        assert isinstance(message, Info)
        assert message.name == "jetd"
        assert (message.major, message.minor) == (1, 3)
        assert message.max_body == DEFAULT_MAX_BODY
        assert message.features & FEATURE_CONFLATION
        # PROTOCOL.md 4.4: the example INFO of jetd, byte for byte.
        assert encode(message).hex() == "04000000100103001000000000001b0004" + b"jetd".hex()


def test_limits_are_announced_only_to_a_peer_that_asks(start_jetd):
    """PROTOCOL.md 4.4.1: the second INFO, with the limits, answers a peer INFO that set
    LIMITS, before the answer to the request after it; other peers never see it."""
    daemon = start_jetd("--route-timeout", "2.5", "--max-key-length", "300")
    with RawPeer(daemon.address) as asking:
        assert asking.info is not None and asking.info.features & FEATURE_LIMITS
        assert asking.info.max_key_length is None  # the first INFO has no extension
        asking.send(Info("asking", features=FEATURE_LIMITS), GetState(1, "nothing"))
        limits = asking.recv()
        assert isinstance(limits, Info)
        assert (limits.max_key_length, limits.route_timeout_ms) == (300, 2500)
        assert (limits.name, limits.features, limits.minor) == (asking.info.name, asking.info.features, 3)
        answer = asking.recv()
        assert isinstance(answer, Response) and answer.id == 1
    with RawPeer(daemon.address) as old:
        # A 1.0 peer: its INFO has no LIMITS bit, so no INFO with bytes after the name.
        old.send(Info("old-peer", minor=0), GetState(1, "nothing"))
        answer = old.recv()
        assert isinstance(answer, Response) and answer.status == Status.NOT_FOUND


def test_requests_before_reading_info_and_peer_name_in_log(jetd):
    with RawPeer(jetd.address, read_info=False) as peer:
        # PROTOCOL.md 4.4: requests may be sent without waiting for the daemon's INFO.
        peer.send(Info("sensor-7"), GetState(1, "nothing"))
        assert isinstance(peer.recv(), Info)
        response = peer.recv()
        assert response.id == 1 and response.status == Status.NOT_FOUND
    jetd.stop()
    assert "sensor-7" in jetd.stderr()


def test_many_connections_and_ids(jetd):
    peers = [RawPeer(jetd.address, f"p{i}") for i in range(20)]
    for peer in peers:
        assert peer.request(lambda rid: GetState(rid, "x")).status == Status.NOT_FOUND
    for peer in peers:
        peer.close()


def test_port_flag_and_max_body_announced(start_jetd):
    daemon = start_jetd("--max-body", "4096", "--name", "plant-bus")
    with RawPeer(daemon.address) as peer:
        assert peer.info.max_body == 4096
        assert peer.info.name == "plant-bus"


def test_config_file_and_flags_override(start_jetd, tmp_path):
    conf = tmp_path / "jetd.toml"
    conf.write_text('max-body = 2048\nname = "from-file"\n[jetd]\nroute_timeout = 1.5\n')
    daemon = start_jetd("--config", str(conf), "--max-body", "3000")
    with RawPeer(daemon.address) as peer:
        assert peer.info.max_body == 3000  # the flag wins
        assert peer.info.name == "from-file"


def _run_jetd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jetd", *args], capture_output=True, text=True, timeout=30, cwd=str(__import__("pathlib").Path(__file__).parents[2])
    )


def test_bad_settings_exit_with_message(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("max_bodyy = 3\n")
    result = _run_jetd("--host", "127.0.0.1", "--port", "0", "--config", str(bad))
    assert result.returncode == 2 and "unknown setting 'max_bodyy'" in result.stderr
    result = _run_jetd("--host", "127.0.0.1", "--port", "0", "--hard-limit", "10", "--soft-limit", "100")
    assert result.returncode == 2 and "hard_limit" in result.stderr
    result = _run_jetd("--host", "127.0.0.1", "--port", "0", "--log-dir", str(tmp_path), "--max-body", "100000000")
    assert result.returncode == 2 and "too large for the event log" in result.stderr
    result = _run_jetd("--host", "127.0.0.1", "--port", "0", "--log-fsync", "sometimes")
    assert result.returncode == 2 and "invalid choice" in result.stderr
    result = _run_jetd("--help")
    assert result.returncode == 0
    for flag in ("--max-key-length", "--max-connections", "--max-states-per-connection",
                 "--max-fetches-per-connection", "--max-pending-per-owner", "--soft-limit",
                 "--hard-limit", "--slow-deadline", "--route-timeout", "--log-dir", "--log-events"):
        assert flag in result.stdout


def test_port_in_use_is_a_clear_error(jetd):
    result = _run_jetd("--host", "127.0.0.1", "--port", str(jetd.port))
    assert result.returncode == 1
    assert "cannot listen" in result.stderr


def test_half_close_still_gets_its_answers(jetd):
    import socket as socketlib

    owner = RawPeer(jetd.address)
    owner.request(lambda rid: __import__("jetwire").AddState(rid, "k", __import__("jetwire").Value.of(1)))
    peer = RawPeer(jetd.address)
    peer.send(*(GetState(i, "k") for i in range(1, 101)))
    peer.sock.shutdown(socketlib.SHUT_WR)
    answers = peer.recv_n(100)
    assert [a.id for a in answers] == list(range(1, 101)) and all(a.status == Status.OK for a in answers)
    peer.expect_eof()
