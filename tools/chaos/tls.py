"""Issue 29's TLS handshake attack: many TCP connections to a TLS port that never send a
ClientHello, while a real TLS peer tries to get in (PROTOCOL.md 10.7, 15.6).

Reported at fe08211: 300 idle handshakes took all 256 descriptors for asyncio's 60 s, and
the real peer was refused with INFO and CLOSE in plaintext (its client saw
WRONG_VERSION_NUMBER). Printed: descriptors and connections jetd held, how each idle
connection ended (the TLS alert at once, a close after the handshake timeout, plaintext
jet bytes, still open) and when, and what the real TLS peer got during the flood and after.
"""

from __future__ import annotations

import datetime
import os
import select
import socket
import ssl
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Optional

from jetwire import Decoder
from jetwire import GetState
from jetwire import Info
from jetwire import Response
from jetwire import encode

from .harness import Daemon
from .harness import Target
from .harness import watched

Row = dict[str, object]

ALERT = b"\x15\x03\x03\x00\x02\x02\x50"  # jetd's refusal on a TLS port (PROTOCOL.md 15.6)
PEER_TIMEOUT = 30.0
DEFAULT_HANDSHAKE_TIMEOUT = 10.0  # jetd's --tls-handshake-timeout


def self_signed(workdir: Path) -> tuple[Path, Path]:
    """A certificate and key for 127.0.0.1 in ``workdir`` (made once per run)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    cert_path, key_path = workdir / "chaos-tls-cert.pem", workdir / "chaos-tls-key.pem"
    if cert_path.exists():
        return cert_path, key_path
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def real_tls_peer(address: tuple[str, int]) -> str:
    """One TLS peer (no certificate check: any jetd with TLS): ``got in`` when its
    handshake, INFO and one GET_STATE answer came through, else what stopped it."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection(address, timeout=PEER_TIMEOUT) as raw, \
                context.wrap_socket(raw, server_hostname=address[0]) as sock:
            decoder = Decoder(max_body=1 << 24)
            sent = False
            while True:
                data = sock.recv(65536)
                if not data:
                    return "EOF after the handshake"
                decoder.receive_data(data)
                for message in decoder.messages():
                    if isinstance(message, Info) and not sent:
                        sock.sendall(encode(GetState(1, "chaos/tls")))
                        sent = True
                    elif isinstance(message, Response):
                        return "got in"
                    else:
                        return f"refused inside TLS: {type(message).__name__} {getattr(message, 'status', '')}"
    except ssl.SSLError as exc:
        return f"refused: {exc.reason or exc}"
    except OSError as exc:
        return f"refused: {type(exc).__name__}"


def _fds(pid: Optional[int]) -> Optional[int]:
    if pid is None:
        return None
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _ending(got: bytes) -> str:
    if got == ALERT:
        return "TLS alert, close"
    if not got:
        return "closed, no byte"
    return "plaintext bytes" if got[:1] != b"\x15" else "other TLS record"


def tls_handshakes(target: Target, connections: int = 300, window: float = 20.0, nofile: int = 256,
                   handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT) -> Row:
    """ISSUE 29: ``connections`` idle handshakes (no ClientHello) against jetd's TLS port
    (started here with a self-signed certificate under RLIMIT_NOFILE ``nofile`` and
    ``--tls-handshake-timeout`` when not the default, or the ``--connect`` one, which must
    speak TLS), watched for ``window`` seconds or until all ended; a real TLS peer tries
    1 s into the flood and again at the end."""
    row: Row = {}
    own = target.connect is None
    args: tuple[str, ...] = ()
    if own:
        cert, key = self_signed(target.workdir)
        args = ("--tls-cert", str(cert), "--tls-key", str(key))
        if handshake_timeout != DEFAULT_HANDSHAKE_TIMEOUT:  # (so that a jetd without the flag runs it too)
            args += ("--tls-handshake-timeout", f"{handshake_timeout:g}")
    with target.daemon(*args, nofile=nofile if own else None) as daemon, watched(daemon, row, health=False):
        row["outcome"] = _flood(daemon, connections, window)
    return row


def _flood(daemon: Daemon, connections: int, window: float) -> str:
    base = _fds(daemon.pid)
    started = time.monotonic()
    socks: list[socket.socket] = []
    failed = 0
    for _ in range(connections):
        try:
            sock = socket.create_connection(daemon.address, timeout=5)
        except OSError:
            failed += 1
            continue
        sock.setblocking(False)
        socks.append(sock)
    opened = time.monotonic() - started
    got: dict[socket.socket, bytes] = {sock: b"" for sock in socks}
    ended: dict[socket.socket, float] = {}
    peak = _fds(daemon.pid)
    during: Optional[str] = None
    deadline = started + window
    try:
        while time.monotonic() < deadline and len(ended) < len(socks):
            if during is None and time.monotonic() - started >= 1.0:
                during = real_tls_peer(daemon.address)
            for sock in _read_ready([sock for sock in socks if sock not in ended], got, 0.2):
                ended[sock] = time.monotonic() - started
            fds = _fds(daemon.pid)
            if fds is not None and (peak is None or fds > peak):
                peak = fds
        if during is None:
            during = real_tls_peer(daemon.address)
        after = real_tls_peer(daemon.address)
    finally:
        for sock in socks:
            sock.close()
    endings = Counter(_ending(got[sock]) for sock in ended)
    endings["still open"] = len(socks) - len(ended)
    if failed:
        endings["connect failed"] = failed
    times = sorted(at for sock, at in ended.items() if not got[sock])  # closed without a byte: the time-out
    when = (f"closed without a byte at p50 {statistics.median(times):.1f} s, max {times[-1]:.1f} s" if times
            else "none closed without a byte")
    held = f"jetd descriptors {base} before, peak {peak}" if base is not None else "descriptors not watched (no pid)"
    shown = ", ".join(f"{n} {what}" for what, n in endings.most_common() if n)
    return (f"{len(socks)} idle handshakes opened in {opened:.1f} s; {held}; {shown}; {when}; "
            f"real TLS peer during: {during}; after {time.monotonic() - started:.0f} s: {after}")


def huge_client_hello(size: int = 100 * 1024, announced: int = 120_000) -> bytes:
    """The first ``size`` bytes of a ClientHello announcing ``announced`` bytes (under
    OpenSSL's own limit, 131,396, so that OpenSSL waits for the rest), in 16 KiB
    handshake records: bytes a TLS layer holds for the handshake timeout unless they
    are charged to an input budget (issue 29)."""
    body = (b"\x01" + announced.to_bytes(3, "big") + b"\x03\x03" + bytes(announced - 2))[:size]
    return b"".join(b"\x16\x03\x01" + len(body[at:at + 16384]).to_bytes(2, "big") + body[at:at + 16384]
                    for at in range(0, len(body), 16384))


def _read_ready(live: list[socket.socket], got: dict[socket.socket, bytes], wait: float) -> list[socket.socket]:
    """One read of each of ``live`` that is ready within ``wait``, appended to ``got``;
    returns those that ended (EOF or an error)."""
    ended: list[socket.socket] = []
    for sock in select.select(live, [], [], wait)[0]:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            continue
        except OSError:
            data = b""
        if data:
            got[sock] += data
        else:
            ended.append(sock)
    return ended


def tls_endings(socks: list[socket.socket], timeout: float) -> Counter[str]:
    """How each connection to a TLS port ended within ``timeout`` (see ``_ending``)."""
    got: dict[socket.socket, bytes] = {sock: b"" for sock in socks}
    ended: set[socket.socket] = set()
    deadline = time.monotonic() + timeout
    while len(ended) < len(socks) and time.monotonic() < deadline:
        ended.update(_read_ready([sock for sock in socks if sock not in ended], got, 0.1))
    endings = Counter(_ending(got[sock]) for sock in ended)
    endings["still open"] = len(socks) - len(ended)
    return endings
