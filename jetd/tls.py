"""TLS for jetd's listeners (PROTOCOL.md 15.6), built in one place so that the TCP
listener and (later) the WebSocket listener use the very same settings."""

from __future__ import annotations

import os
import ssl
from typing import Any
from typing import Optional

from .config import Config
from .config import ConfigError

__all__ = ["certificate_user", "pem_problem", "server_context"]


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
