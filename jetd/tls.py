"""TLS for jetd's listeners (PROTOCOL.md 15.6), built in one place so that the TCP
listener and (later) the WebSocket listener use the very same settings.

The loop's own SSL protocol (uvloop's or asyncio's, both with ``ssl.MemoryBIO``) does the
TLS; :class:`TlsInput` sits between it and the socket, so that jetd sees every byte a
TLS peer sends before the SSL layer holds it (issue 29: one input budget, TLS included).
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Callable
from typing import Any
from typing import Optional
from typing import cast

from .config import Config
from .config import ConfigError

__all__ = ["TLS_READ_CHUNK", "TlsInput", "certificate_user", "pem_problem", "server_context", "ssl_protocol",
           "tls_buffered"]

# Bytes read from a TLS socket at a time, and the SSL layer's read-buffer limit once the
# handshake is done (the loops' defaults are 256 KiB each). While jetd does not read a
# peer, the SSL layer still reads its socket up to this limit: the ciphertext a peer can
# park in jetd then is at most about twice this, and charged to the input budget
# (PROTOCOL.md 10.7); the rest waits in the kernel, as over TCP.
TLS_READ_CHUNK = 64 * 1024


def server_context(config: Config) -> Optional[ssl.SSLContext]:
    """The listener's SSLContext from ``--tls-cert/--tls-key[/--tls-client-ca]``, or None
    without TLS.

    TLS 1.2 at least. With a client CA, a client certificate is optional (peers without
    one authenticate with a password) but verified when present: the handshake fails on
    a certificate the CA did not sign.

    Raises:
        ConfigError: a file that cannot be read, a key that does not match the
            certificate, a CA file that holds no certificate.
    """
    if config.tls_cert is None or config.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except ssl.SSLError as exc:
        raise ConfigError(
            f"cannot load the TLS certificate: {pem_problem(exc, config.tls_cert, config.tls_key)}"
        ) from None
    except OSError as exc:
        flag, name = next(((flag, path) for flag, path in (("--tls-cert", config.tls_cert), ("--tls-key", config.tls_key))
                           if not os.access(path, os.R_OK)), ("--tls-cert/--tls-key", exc.filename))
        raise ConfigError(f"cannot read {flag} {name}: {exc.strerror or exc}") from None
    if config.tls_client_ca is not None:
        try:
            context.load_verify_locations(cafile=config.tls_client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load --tls-client-ca {config.tls_client_ca}: {exc}") from None
        context.verify_mode = ssl.CERT_OPTIONAL
    else:
        context.verify_mode = ssl.CERT_NONE
    return context


def pem_problem(exc: ssl.SSLError, cert_path: str, key_path: str, cert_flag: str = "--tls-cert",
                key_flag: str = "--tls-key") -> str:
    """What ``load_cert_chain`` failed on, in words: OpenSSL says ``[SSL] PEM lib`` both
    for a key given as the certificate and for a file that is not PEM at all."""
    if exc.reason == "KEY_VALUES_MISMATCH":
        return f"{key_flag} {key_path} is not the key of the certificate in {cert_flag} {cert_path}"
    cert_text, key_text = _pem_head(cert_path), _pem_head(key_path)
    if "CERTIFICATE-----" not in cert_text:
        held = "a private key" if "PRIVATE KEY-----" in cert_text else "no PEM certificate"
        return f"{cert_flag} {cert_path} holds {held}: it takes the certificate (-----BEGIN CERTIFICATE-----)"
    if "PRIVATE KEY-----" not in key_text and "PRIVATE KEY-----" not in cert_text:
        held = "a certificate" if "CERTIFICATE-----" in key_text else "no PEM private key"
        return f"{key_flag} {key_path} holds {held}: it takes the private key (-----BEGIN PRIVATE KEY-----)"
    if "ENCRYPTED" in key_text:
        return f"{key_flag} {key_path} is encrypted: give a key without a passphrase"
    return f"{exc.reason or exc}"


def _pem_head(path: str) -> str:
    try:
        with open(path, "rb") as source:
            return source.read(1 << 16).decode("ascii", "replace")
    except OSError:
        return ""


def certificate_user(ssl_object: Any) -> Optional[str]:
    """The common name (CN) of the verified client certificate of a TLS connection, or
    None (no TLS, no certificate, no CN). Only verified certificates reach here: an
    unverifiable one fails the handshake (:func:`server_context`)."""
    if ssl_object is None:
        return None
    cert = ssl_object.getpeercert()
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for name, value in rdn:
            if name == "commonName" and isinstance(value, str) and value:
                return value
    return None


def ssl_protocol(loop: asyncio.AbstractEventLoop, app_protocol: asyncio.BaseProtocol, context: ssl.SSLContext,
                 waiter: asyncio.Future[Any], handshake_timeout: float) -> asyncio.BufferedProtocol:
    """The server side of TLS for ``app_protocol``, made the way ``loop`` makes it for
    ``connect_accepted_socket(ssl=...)`` (uvloop's SSLProtocol on a uvloop loop, asyncio's
    otherwise): ``waiter`` gets the handshake's outcome."""
    protocol_class: Any
    try:
        import uvloop
        import uvloop.loop
    except ImportError:
        uvloop = None  # type: ignore[assignment]
    if uvloop is not None and isinstance(loop, uvloop.Loop):
        protocol_class = cast(Any, uvloop.loop).SSLProtocol
    else:
        from asyncio import sslproto

        protocol_class = sslproto.SSLProtocol
    return cast(asyncio.BufferedProtocol, protocol_class(loop, app_protocol, context, waiter, server_side=True,
                                                         ssl_handshake_timeout=handshake_timeout))


class TlsInput(asyncio.BufferedProtocol):
    """The socket's protocol under a TLS connection: hands what it reads to the loop's
    SSL protocol (``inner``), at most :data:`TLS_READ_CHUNK` at a time, and tells jetd.

    ``admit(nbytes)`` is asked before the SSL layer gets bytes the peer sent; False
    aborts the connection (a close: PROTOCOL.md 15.6, never plaintext) and drops them.
    ``settled()`` is called after the SSL layer took them (and handed any plaintext on).
    """

    def __init__(self, inner: asyncio.BufferedProtocol, admit: Callable[[int], bool],
                 settled: Callable[[], None]) -> None:
        self.inner = inner
        self.admit = admit
        self.settled = settled
        self.transport: Optional[asyncio.Transport] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.inner.connection_made(transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        buffer = memoryview(self.inner.get_buffer(TLS_READ_CHUNK))
        return buffer[:TLS_READ_CHUNK]

    def buffer_updated(self, nbytes: int) -> None:
        if not self.admit(nbytes):
            if self.transport is not None:
                self.transport.abort()
            return
        self.inner.buffer_updated(nbytes)
        self.settled()

    def eof_received(self) -> Optional[bool]:
        return self.inner.eof_received()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


def tls_buffered(transport: asyncio.BaseTransport) -> int:
    """Ciphertext the SSL layer of a TLS ``transport`` holds, not yet decrypted (its
    incoming MemoryBIO)."""
    return int(cast(Any, transport).get_read_buffer_size())
