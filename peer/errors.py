"""Typed errors of the jet peers: one class per status of PROTOCOL.md 8.

Every error a peer raises for a failed request is a :class:`PeerError`, which derives
from :class:`jetwire.JetError`, so ``except jetwire.JetError`` catches everything jet
raises. Each subclass fixes its ``status``; :func:`error_for_status` turns a status and
message received from the daemon (or from an owner, passed through) into the matching
exception.

Owners may raise these from their handlers too: ``raise Rejected("must be >= 0")``
answers the routed request with status REJECTED and that message (PROTOCOL.md 10.3).
"""

from __future__ import annotations

from typing import ClassVar
from typing import Optional

from jetwire import JetError
from jetwire import Status

__all__ = [
    "AlreadyExists",
    "ConnectionClosed",
    "Internal",
    "InvalidQuery",
    "LimitExceeded",
    "Malformed",
    "NotFound",
    "NotJetDaemon",
    "NotOwner",
    "Overloaded",
    "OwnerGone",
    "PeerError",
    "Rejected",
    "Timeout",
    "TooLarge",
    "UnknownFunction",
    "WrongKind",
    "describe_tls_failure",
    "error_for_status",
]


class PeerError(JetError):
    """Base of every error a peer raises for a request that did not succeed.

    Attributes:
        status: the :class:`jetwire.Status` of the failure (None only for a
            :class:`ConnectionClosed` that was not announced by a CLOSE).
        message: the human-readable reason (from the daemon, the owner, or the peer).
    """

    default_status: ClassVar[Optional[Status]] = Status.INTERNAL

    def __init__(self, message: str = "", status: Optional[Status] = None) -> None:
        self.status: Optional[Status] = status if status is not None else self.default_status
        self.message = message
        label = self.status.name if self.status is not None else type(self).__name__
        super().__init__(f"{label}: {message}" if message else label)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class NotFound(PeerError):
    """No state or method with that key, or no such fetch (NOT_FOUND)."""

    default_status = Status.NOT_FOUND


class AlreadyExists(PeerError):
    """The key is taken by a state or a method (ALREADY_EXISTS)."""

    default_status = Status.ALREADY_EXISTS


class NotOwner(PeerError):
    """Only the owner may notify or remove (NOT_OWNER)."""

    default_status = Status.NOT_OWNER


class Rejected(PeerError):
    """The owner refused the set or call (REJECTED). Raise it from a handler to refuse."""

    default_status = Status.REJECTED


class Timeout(PeerError):
    """No answer in time (TIMEOUT): from the daemon's route timeout, or the peer's own
    request timeout (the message says which)."""

    default_status = Status.TIMEOUT


class OwnerGone(PeerError):
    """The owner disconnected before answering (OWNER_GONE)."""

    default_status = Status.OWNER_GONE


class Malformed(PeerError):
    """A frame or body did not follow the protocol (MALFORMED)."""

    default_status = Status.MALFORMED


class UnknownFunction(PeerError):
    """Unknown function or event code (UNKNOWN_FUNCTION)."""

    default_status = Status.UNKNOWN_FUNCTION


class TooLarge(PeerError):
    """A body above the receiver's ``max_body`` or a key above its key limit (TOO_LARGE)."""

    default_status = Status.TOO_LARGE


class LimitExceeded(PeerError):
    """A configured limit of the daemon was reached (LIMIT_EXCEEDED)."""

    default_status = Status.LIMIT_EXCEEDED


class WrongKind(PeerError):
    """Set/get/notify on a method, call on a state, remove of the other kind (WRONG_KIND)."""

    default_status = Status.WRONG_KIND


class Internal(PeerError):
    """The daemon (or an owner's handler) failed (INTERNAL)."""

    default_status = Status.INTERNAL


class Overloaded(PeerError):
    """The consumer could not keep up (OVERLOADED)."""

    default_status = Status.OVERLOADED


class InvalidQuery(PeerError):
    """The daemon cannot run the query (INVALID_QUERY, PROTOCOL.md 14.6)."""

    default_status = Status.INVALID_QUERY
class AuthFailed(PeerError):
    """Unknown user or wrong password (AUTH_FAILED, PROTOCOL.md 15.2)."""

    default_status = Status.AUTH_FAILED


class NotAuthorized(PeerError):
    """Outside this connection's permissions, or not authenticated (NOT_AUTHORIZED,
    PROTOCOL.md 15.3); the message names the permission and the key."""

    default_status = Status.NOT_AUTHORIZED


class ConnectionClosed(PeerError):
    """The connection is closed (or was lost) before the request could complete.

    ``status`` is the status of the daemon's CLOSE when it sent one (OK for a clean
    shutdown), else None.
    """

    default_status = None


class NotJetDaemon(ConnectionClosed):
    """The server is not a jet daemon: its first bytes cannot begin the INFO that a
    daemon sends at once (PROTOCOL.md 4.4), it closed without a word, or it sent
    nothing within the INFO wait.

    Attributes:
        seen: the first bytes it sent (empty if none).
        tls: True if those bytes are TLS records, or if it closed without a word when
            the peer spoke plain TCP (what a TLS listener does): connect with TLS.
    """

    def __init__(self, message: str = "", seen: bytes = b"", tls: bool = False) -> None:
        super().__init__(message)
        self.seen = seen
        self.tls = tls


def describe_tls_failure(exc: BaseException, host: str) -> str:
    """A TLS handshake failure (an :class:`ssl.SSLError`) said so that the user knows
    what to do: the OpenSSL reason names the symptom, not the cause."""
    reason = str(getattr(exc, "reason", "") or "")
    verify = str(getattr(exc, "verify_message", "") or "")
    if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "UNKNOWN_PROTOCOL",
                  "HTTP_REQUEST", "UNEXPECTED_RECORD", "WRONG_SSL_VERSION", "UNSUPPORTED_PROTOCOL"):
        return (f"the server did not speak TLS ({reason}): it is a plain (non-TLS) port; "
                "connect without TLS, or to the daemon's TLS port")
    if reason == "CERTIFICATE_VERIFY_FAILED":
        if "mismatch" in verify or "match" in verify:
            return (f"TLS: the daemon's certificate is not valid for {host} ({verify}): its subjectAltName "
                    "must name this host name or IP address")
        return (f"TLS: the daemon's certificate could not be verified ({verify or reason}): give the CA "
                "that signed it (jet --ca FILE; ssl.create_default_context(cafile=FILE))")
    if reason.startswith("TLSV1_ALERT") or reason.startswith("SSLV3_ALERT"):
        return f"TLS: the daemon refused the handshake ({reason}): a client certificate it does not accept?"
    return f"TLS: {reason or exc}"


_BY_STATUS: dict[Status, type[PeerError]] = {
    cls.default_status: cls
    for cls in (
        NotFound,
        AlreadyExists,
        NotOwner,
        Rejected,
        Timeout,
        OwnerGone,
        Malformed,
        UnknownFunction,
        TooLarge,
        LimitExceeded,
        WrongKind,
        Internal,
        Overloaded,
        InvalidQuery,
        AuthFailed,
        NotAuthorized,
    )
}


def error_for_status(status: int, message: str = "") -> PeerError:
    """Build the exception matching a non-OK ``status``.

    Args:
        status: a status byte (PROTOCOL.md 8) other than OK.
        message: the reason carried by the response or CLOSE.

    Returns:
        An instance of the matching subclass (:class:`Internal` for OK or an unknown
        byte, which a conforming sender never uses for a failure).
    """
    try:
        code = Status(status)
    except ValueError:
        return Internal(f"unknown status 0x{status:02X}: {message}")
    cls = _BY_STATUS.get(code)
    if cls is None:
        return Internal(f"failure reported with status {code.name}: {message}")
    return cls(message)
