"""TLS material for the jetd tests: a throw-away PKI and a client context."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path
from typing import Any


def make_pki(tmp: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and client certificates (CN boiler; one from
    another CA), made with the cryptography package."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    out: dict[str, Path] = {}

    def key_pem(key: Any, name: str) -> None:
        out[name] = tmp / f"{name}.pem"
        out[name].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))

    def cert(name: str, cn: str, key: Any, issuer_key: Any, issuer: Any, *, ca: bool = False,
             san: Any = None) -> x509.Certificate:
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer or subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san is not None:
            builder = builder.add_extension(san, critical=False)
        made = builder.sign(issuer_key, hashes.SHA256())
        out[name] = tmp / f"{name}.pem"
        out[name].write_bytes(made.public_bytes(serialization.Encoding.PEM))
        return made

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = cert("ca", "jet test CA", ca_key, ca_key, None, ca=True)
    other_key = ec.generate_private_key(ec.SECP256R1())
    other = cert("other-ca", "other CA", other_key, other_key, None, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    key_pem(server_key, "server-key")
    cert("server", "127.0.0.1", server_key, ca_key, ca.subject,
         san=x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]))
    client_key = ec.generate_private_key(ec.SECP256R1())
    key_pem(client_key, "client-key")
    cert("client", "boiler", client_key, ca_key, ca.subject)
    cert("rogue", "boiler", client_key, other_key, other.subject)
    return out


def client_context(pki: dict[str, Path], cert: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    if cert is not None:
        context.load_cert_chain(str(pki[cert]), str(pki["client-key"]))
    return context
