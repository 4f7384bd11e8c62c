"""TLS for jetd's listeners (PROTOCOL.md 15.6), built in one place so that the TCP
listener and (later) the WebSocket listener use the very same settings."""

from __future__ import annotations

import ssl
from typing import Any, Optional

from .config import Config, ConfigError

__all__ = ["certificate_user", "server_context"]


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
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load --tls-cert {config.tls_cert} / --tls-key {config.tls_key}: {exc}") from None
    if config.tls_client_ca is not None:
        try:
            context.load_verify_locations(cafile=config.tls_client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load --tls-client-ca {config.tls_client_ca}: {exc}") from None
        context.verify_mode = ssl.CERT_OPTIONAL
    else:
        context.verify_mode = ssl.CERT_NONE
    return context


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
