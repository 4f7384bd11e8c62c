"""The one error tree of jet (after h11's ``_util.py``)."""

from __future__ import annotations

from .codes import Status

__all__ = ["JetError", "LocalProtocolError", "ProtocolError", "RemoteProtocolError"]



class JetError(Exception):
    """Base of every error raised by jet."""


class ProtocolError(JetError):
    """A violation of spec/PROTOCOL.md.

    Attributes:
        status: the :class:`Status` a daemon answers (or closes) with.
        message: human-readable reason.
    """

    def __init__(self, message: str, status: Status = Status.MALFORMED) -> None:
        super().__init__(message)
        self.message = message
        self.status = Status(status)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, {self.status.name})"


class LocalProtocolError(ProtocolError):
    """You tried to build or send something the spec forbids (API misuse)."""


class RemoteProtocolError(ProtocolError):
    """The other side sent bytes that are not valid jet.

    Attributes:
        request_id: the id of the REQUEST or RESPONSE the bad frame carried, when it
            was readable (PROTOCOL.md 9.1: then the sender gets an error RESPONSE and
            the connection stays up), else ``None``.
        frame_type: the frame's type byte when the header was readable, else ``None``.
        fatal: True when the receiver must send CLOSE with ``status`` and close the
            connection: an unknown frame type or a body over the maximum (PROTOCOL.md
            9.2), a bad INFO or one of another major version (2, 9.2), a REQUEST body
            too short to hold an id (9.1), a bad EVENT or unknown event code (9.3). The
            :class:`~jetwire.Decoder` then reads nothing more. False when the bad frame
            was skipped whole and decoding may go on: a REQUEST with a readable id is
            answered with ``status`` (9.1), a bad RESPONSE is answered or dropped (9.3).
        resumable: True when the bad frame was consumed whole: its header was sound
            (a known type, a length within the maximum), so its length says where the
            next frame begins and the stream can be resynchronised there. Always True
            when ``fatal`` is False. A fatal error can be resumable too (a bad EVENT or
            INFO body, a REQUEST too short for its id): a daemon still closes the
            connection, but a tool that only reads (a dump) may decode on, with
            ``Decoder(latch_fatal=False)``. False when the frame boundary is lost (an
            unknown frame type, a body over the maximum; PROTOCOL.md 9.2): nothing after
            it can be framed.
    """

    def __init__(
        self,
        message: str,
        status: Status = Status.MALFORMED,
        *,
        request_id: int | None = None,
        frame_type: int | None = None,
        fatal: bool = False,
        resumable: bool | None = None,
    ) -> None:
        super().__init__(message, status)
        self.request_id = request_id
        self.frame_type = frame_type
        self.fatal = fatal
        # A non-fatal error was skipped whole by definition; a fatal one is resumable
        # only when the raiser says the frame boundary held.
        self.resumable: bool = (not fatal) if resumable is None else (resumable or not fatal)
