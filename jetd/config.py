"""jetd's settings: one documented dataclass, loaded from defaults, a TOML file and flags.

Precedence: built-in defaults < ``--config FILE`` (TOML, keys named like the fields,
``-`` or ``_`` alike, at the top level or under a ``[jetd]`` table) < command-line flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from dataclasses import dataclass
from dataclasses import fields
from pathlib import Path
from typing import Any
from typing import Optional

from jetwire import DEFAULT_MAX_BODY
from jetwire.log import DEFAULT_MAX_RECORD

# A logged frame: record fixed part (ts_ns, conn_id, kind) + frame header (JETLOG.md 3).
_LOGGED_FRAME_OVERHEAD = 13 + 5

__all__ = [
    "DEFAULT_PORT",
    "Config",
    "ConfigError",
    "build_parser",
    "config_from_args",
]

DEFAULT_HOST = "127.0.0.1"  # never all interfaces unless asked (NOTES.md: node-jet does)
DEFAULT_PORT = 11124  # PROTOCOL.md 3: 11122 is classic JSON Jet, 11123 the bridge
DEFAULT_NAME = "jetd"
DEFAULT_MAX_KEY_LENGTH = 1024  # PROTOCOL.md 10.7
DEFAULT_MAX_CONNECTIONS = 10_000  # PROTOCOL.md 10.7
DEFAULT_MAX_STATES_PER_CONNECTION = 100_000  # PROTOCOL.md 10.7: states and methods
DEFAULT_MAX_FETCHES_PER_CONNECTION = 1_000  # PROTOCOL.md 10.7
DEFAULT_MAX_PENDING_PER_OWNER = 10_000  # PROTOCOL.md 10.7
DEFAULT_ROUTE_TIMEOUT = 5.0  # PROTOCOL.md 10.3, seconds
DEFAULT_SOFT_LIMIT = 4 * 1024 * 1024  # PROTOCOL.md 10.8: conflation starts above it
DEFAULT_HARD_LIMIT = 64 * 1024 * 1024  # PROTOCOL.md 10.8: CLOSE OVERLOADED above it
DEFAULT_SLOW_DEADLINE = 30.0  # PROTOCOL.md 10.8: seconds above the soft limit
DEFAULT_LOG_FSYNC = "interval"  # JETLOG.md 6
DEFAULT_LOG_ROTATE_SIZE = 64 * 1024 * 1024  # JETLOG.md 1
# JETLOG.md 6.4: None (the default) keeps half the space free at start, at least one
# segment (jetd.eventlog.auto_max_bytes); 0 keeps every segment.
DEFAULT_LOG_MAX_BYTES: Optional[int] = None
DEFAULT_LOG_MAX_AGE = 0.0  # JETLOG.md 6.4: seconds; 0 keeps every segment
DEFAULT_LOG_WRITER_BACKLOG = 64 * 1024 * 1024  # JETLOG.md 6.3: input pauses above it
DEFAULT_SHUTDOWN_GRACE = 3.0  # seconds peers get to take their CLOSE before we hang up
DEFAULT_HTTP_PATH = "/jet"  # PROTOCOL.md 13: the WebSocket endpoint
# Hostile peers, input side (PROTOCOL.md 10.7)
DEFAULT_MAX_INPUT_BUFFER = 64 * 1024 * 1024  # unprocessed input, all connections together
DEFAULT_FRAME_TIMEOUT = 10.0  # seconds to complete a frame once it has begun
DEFAULT_FIRST_FRAME_TIMEOUT = 0.0  # seconds to send a first whole frame; 0 = no limit
DEFAULT_HTTP_HANDSHAKE_TIMEOUT = 10.0  # seconds to send a whole HTTP request (PROTOCOL.md 13.1)
# PROTOCOL.md 10.7, 14.5: queries (protocol 1.1)
DEFAULT_MAX_QUERY_SIZE = 16 * 1024
DEFAULT_MAX_QUERY_TERMS = 64
DEFAULT_MAX_WINDOW = 1000
DEFAULT_MAX_FIELD_DEPTH = 16
DEFAULT_AUTH_TIMEOUT = 10.0  # PROTOCOL.md 15.2: seconds to authenticate (no anonymous permissions)
DEFAULT_AUTH_FAILURE_DELAY = 0.5  # PROTOCOL.md 15.2: seconds before each AUTH_FAILED
DEFAULT_AUTH_FAILURE_DELAY_MAX = 30.0  # PROTOCOL.md 15.2: the growing delay per source and user stops here
DEFAULT_AUTH_QUEUE = 64  # PROTOCOL.md 15.2: password checks waiting to run, all connections together
DEFAULT_TLS_HANDSHAKE_TIMEOUT = 10.0  # PROTOCOL.md 15.6: seconds to complete a TLS handshake

FSYNC_POLICIES = ("always", "interval", "never")
LOG_ERROR_POLICIES = ("stop", "refuse", "continue")  # JETLOG.md 6.5
LOOPS = ("auto", "uvloop", "asyncio")


class ConfigError(ValueError):
    """A setting is invalid (bad value, unknown key, unreadable config file)."""


# The settings checked alike by Config.validate (one check a kind, not one a setting).
_AT_LEAST_ONE = (
    "max_connections", "max_states_per_connection", "max_fetches_per_connection", "max_pending_per_owner",
    "soft_limit", "hard_limit", "log_rotate_size", "log_writer_backlog", "max_input_buffer", "max_query_size",
    "max_query_terms", "max_window", "max_field_depth", "auth_queue",
)
_POSITIVE_SECONDS = (
    "route_timeout", "slow_deadline", "frame_timeout", "auth_timeout", "http_handshake_timeout",
    "tls_handshake_timeout",
)
_NOT_NEGATIVE_SECONDS = ("first_frame_timeout", "auth_failure_delay", "shutdown_grace")


@dataclass
class Config:
    """Every setting of jetd.

    Attributes:
        host: address to listen on.
        port: TCP port; 0 picks a free one (printed in the first stdout line).
        name: the daemon's name in its INFO and in event-log headers.
        loop: ``auto`` (uvloop when importable), ``uvloop`` or ``asyncio``.
        max_body: largest frame body accepted, announced in INFO (PROTOCOL.md 3).
        max_key_length: longest key in bytes; longer is TOO_LARGE (PROTOCOL.md 10.7).
        max_connections: beyond it a connection gets INFO then CLOSE LIMIT_EXCEEDED.
        max_states_per_connection: states plus methods one connection may own.
        max_fetches_per_connection: fetches one connection may hold.
        max_pending_per_owner: routed requests pending at one owner.
        route_timeout: seconds before a routed request is answered TIMEOUT.
        soft_limit: bytes queued for a peer above which FETCH_CHANGE events conflate.
        hard_limit: bytes queued for a peer above which it is closed OVERLOADED.
        slow_deadline: seconds a peer may stay above the soft limit before OVERLOADED.
        log_dir: directory of the event log; None keeps no log.
        log_fsync: ``always``, ``interval`` (once a second) or ``never`` (JETLOG.md 6).
        log_events: also record the fetch events sent (off by default: JETLOG.md 4).
        log_rotate_size: segment size that starts a new segment (JETLOG.md 1).
        log_max_bytes: delete the oldest segments while the log directory holds more
            bytes (JETLOG.md 6.4); 0: no limit; None (default): the segments already
            there plus half the space free at start. At least ``log_rotate_size``.
        log_on_error: ``stop``, ``refuse`` or ``continue`` while the event log cannot be
            written (JETLOG.md 6.5); None (default): ``refuse`` with ``always``, else
            ``continue``.
        log_max_age: delete segments last written more than this many seconds ago
            (JETLOG.md 6.4); 0: no limit.
        log_writer_backlog: bytes of records not yet written (and output held for
            them) above which reading from peers pauses until the writer catches up
            (JETLOG.md 6.3).
        log_level: level of the diagnostic log on stderr (INFO, DEBUG, WARNING, ...).
        shutdown_grace: seconds to let peers read their CLOSE before hanging up.
        http_port: port of the HTTP listener (WebSocket peers on ``/jet``, the web
            console on ``/``, PROTOCOL.md 13); None serves no HTTP, 0 picks a free port.
        http_host: address of the HTTP listener; None listens on ``host``.
        http_origins: comma-separated ``Origin`` values a browser page may connect from
            besides the same origin (``*``: any origin); PROTOCOL.md 13.3.
        http_hosts: comma-separated host names (or addresses) a request's ``Host`` may
            name besides the listen address, the localhost names and the hosts of
            ``http_origins`` (``*``: any); PROTOCOL.md 13.3, against DNS rebinding.
        http_handshake_timeout: seconds a connection to the HTTP port has to send its
            whole request; until it is a peer it counts against ``max_connections``.
        metrics_public: serve ``/metrics`` (Prometheus) on the HTTP port to anyone even
            under ``auth`` (without ``auth`` it is served anyway, like ``/registry.json``;
            under ``auth`` without this, only to a user with ``read`` on ``$jet/``).
        max_input_buffer: bytes of received input not yet processed (incomplete frames,
            frames held back while a peer's output drains, and WebSocket frames under
            assembly), all connections together; the connection whose bytes would pass
            it is closed LIMIT_EXCEEDED (PROTOCOL.md 10.7, 13.2).
        frame_timeout: seconds a peer has to complete a frame it has begun sending (a
            WebSocket frame too); then it is closed TIMEOUT (PROTOCOL.md 10.7, 13.2).
        first_frame_timeout: seconds a new connection may stay without sending a
            whole frame before it is closed TIMEOUT; 0 means no limit.
        max_query_size: largest FETCH_QUERY / QUERY_ONCE payload, bytes (TOO_LARGE above).
        max_query_terms: matchers, operands, filters and sort of one query.
        max_window: longest window (to - from + 1) of a sorted query.
        max_field_depth: segments of one field path.
        auth: users file (jetd.users); None: no authentication, every peer may do
            anything (PROTOCOL.md 15). Re-read on SIGHUP.
        auth_timeout: seconds a connection may stay unauthenticated when the
            anonymous entry grants nothing (PROTOCOL.md 15.2).
        auth_failure_delay: seconds before each AUTH_FAILED answer (PROTOCOL.md 15.2).
        auth_failure_delay_max: the most the delay grows to for a source address or a
            user with many recent failures (PROTOCOL.md 15.2).
        auth_queue: password checks that may wait to run, all connections together; a
            source address may hold a quarter of them (PROTOCOL.md 15.2).
        tls_cert: PEM certificate chain of the listener; with ``tls_key`` turns on TLS.
        tls_key: PEM private key of ``tls_cert``.
        tls_client_ca: PEM CA bundle: peers may present a client certificate signed by
            it, whose CN is then their user (PROTOCOL.md 15.6).
        tls_handshake_timeout: seconds a connection to a TLS listener has to complete its
            handshake; until then it counts against ``max_connections`` (PROTOCOL.md 15.6).
        tls_port: with TLS, the jet port for TLS peers; ``port`` then stays plain TCP
            (for peers on this machine beside TLS peers). None: ``port`` speaks TLS.
    """

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    name: str = DEFAULT_NAME
    loop: str = "auto"
    max_body: int = DEFAULT_MAX_BODY
    max_key_length: int = DEFAULT_MAX_KEY_LENGTH
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_states_per_connection: int = DEFAULT_MAX_STATES_PER_CONNECTION
    max_fetches_per_connection: int = DEFAULT_MAX_FETCHES_PER_CONNECTION
    max_pending_per_owner: int = DEFAULT_MAX_PENDING_PER_OWNER
    route_timeout: float = DEFAULT_ROUTE_TIMEOUT
    soft_limit: int = DEFAULT_SOFT_LIMIT
    hard_limit: int = DEFAULT_HARD_LIMIT
    slow_deadline: float = DEFAULT_SLOW_DEADLINE
    log_dir: Optional[str] = None
    log_fsync: str = DEFAULT_LOG_FSYNC
    log_events: bool = False
    log_rotate_size: int = DEFAULT_LOG_ROTATE_SIZE
    log_max_bytes: Optional[int] = DEFAULT_LOG_MAX_BYTES
    log_on_error: Optional[str] = None
    log_max_age: float = DEFAULT_LOG_MAX_AGE
    log_writer_backlog: int = DEFAULT_LOG_WRITER_BACKLOG
    log_level: str = "INFO"
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE
    # The HTTP listener (jetd.web), PROTOCOL.md 13.
    http_port: Optional[int] = None
    http_host: Optional[str] = None
    http_origins: str = ""
    http_hosts: str = ""
    http_handshake_timeout: float = DEFAULT_HTTP_HANDSHAKE_TIMEOUT
    metrics_public: bool = False  # issue 33: /metrics under --auth
    # Hostile peers, input side (PROTOCOL.md 10.7)
    max_input_buffer: int = DEFAULT_MAX_INPUT_BUFFER
    frame_timeout: float = DEFAULT_FRAME_TIMEOUT
    first_frame_timeout: float = DEFAULT_FIRST_FRAME_TIMEOUT
    # queries (PROTOCOL.md 14.5)
    max_query_size: int = DEFAULT_MAX_QUERY_SIZE
    max_query_terms: int = DEFAULT_MAX_QUERY_TERMS
    max_window: int = DEFAULT_MAX_WINDOW
    max_field_depth: int = DEFAULT_MAX_FIELD_DEPTH
    # Security (PROTOCOL.md 15), kept together.
    auth: Optional[str] = None
    auth_timeout: float = DEFAULT_AUTH_TIMEOUT
    auth_failure_delay: float = DEFAULT_AUTH_FAILURE_DELAY
    auth_failure_delay_max: float = DEFAULT_AUTH_FAILURE_DELAY_MAX
    auth_queue: int = DEFAULT_AUTH_QUEUE
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    tls_client_ca: Optional[str] = None
    tls_handshake_timeout: float = DEFAULT_TLS_HANDSHAKE_TIMEOUT
    tls_port: Optional[int] = None

    def validate(self) -> Config:
        """Check every value; returns self.

        Raises:
            ConfigError: naming the first bad setting.
        """
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be 0..65535, got {self.port}")
        if self.http_port is not None and not 0 <= self.http_port <= 65535:
            raise ConfigError(f"http_port must be 0..65535, got {self.http_port}")
        for origin in self.allowed_origins():
            # A browser's Origin is scheme://host[:port], nothing more: an entry with a path,
            # userinfo or no host could never match, and its host would not join the Host list.
            if origin != "*" and (not origin.startswith(("http://", "https://"))
                                  or host_name(origin.partition("://")[2]) is None):
                raise ConfigError(f"http_origins: {origin!r} is not an origin like http://host:port or *")
        for entry in self.allowed_hosts():
            if entry != "*" and entry_host_name(entry) is None:
                raise ConfigError(f"http_hosts: {entry!r} is not a host name or address like jet.lan, 10.0.0.5 or [::1]")
        if not 16 <= self.max_body <= 0xFFFF_FFFF:
            raise ConfigError(f"max_body must be 16..4294967295, got {self.max_body}")
        if self.log_dir is not None and self.max_body + _LOGGED_FRAME_OVERHEAD > DEFAULT_MAX_RECORD:
            # JETLOG.md 3: readers treat a longer record as damage; the log must hold any frame.
            raise ConfigError(
                f"max_body {self.max_body} is too large for the event log: at most "
                f"{DEFAULT_MAX_RECORD - _LOGGED_FRAME_OVERHEAD} with --log-dir"
            )
        if not 1 <= self.max_key_length <= 0xFFFF:
            raise ConfigError(f"max_key_length must be 1..65535, got {self.max_key_length}")
        for name in _AT_LEAST_ONE:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in _POSITIVE_SECONDS:
            if not getattr(self, name) > 0:  # not "<= 0": NaN is refused too
                raise ConfigError(f"{name} must be positive (above 0 seconds), got {getattr(self, name)}")
        for name in _NOT_NEGATIVE_SECONDS:
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.hard_limit < self.soft_limit:
            raise ConfigError(f"hard_limit ({self.hard_limit}) must not be below soft_limit ({self.soft_limit})")
        if self.max_input_buffer < self.max_body + 5:
            raise ConfigError(
                f"max_input_buffer ({self.max_input_buffer}) must hold at least one frame (max_body + 5)"
            )
        if self.auth_failure_delay_max < self.auth_failure_delay:
            raise ConfigError(
                f"auth_failure_delay_max ({self.auth_failure_delay_max}) must not be below "
                f"auth_failure_delay ({self.auth_failure_delay})"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError(
                "--tls-cert and --tls-key go together (tls_cert and tls_key in a --config file): give both, or neither"
            )
        if self.tls_port is not None and (self.tls_cert is None or not 0 <= self.tls_port <= 65535):
            raise ConfigError(f"tls_port needs --tls-cert and --tls-key and must be 0..65535, got {self.tls_port}")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key (tls_client_ca, tls_cert, tls_key)")
        # The event log's retention and backlog (JETLOG.md 6.3, 6.4).
        if self.log_max_bytes is not None and self.log_max_bytes < 0:
            raise ConfigError(f"log_max_bytes must not be negative (0: no limit), got {self.log_max_bytes}")
        if self.log_max_bytes is not None and 0 < self.log_max_bytes < self.log_rotate_size:
            raise ConfigError(
                f"log_max_bytes ({self.log_max_bytes}) must be 0 (no limit) or at least "
                f"log_rotate_size ({self.log_rotate_size}): the segment being written is never deleted"
            )
        if not self.log_max_age >= 0:
            raise ConfigError(f"log_max_age must not be negative (0: no limit), got {self.log_max_age}")
        if self.log_on_error is not None and self.log_on_error not in LOG_ERROR_POLICIES:
            raise ConfigError(f"log_on_error must be one of {', '.join(LOG_ERROR_POLICIES)}, got {self.log_on_error!r}")
        if self.log_fsync not in FSYNC_POLICIES:
            raise ConfigError(f"log_fsync must be one of {', '.join(FSYNC_POLICIES)}, got {self.log_fsync!r}")
        if self.loop not in LOOPS:
            raise ConfigError(f"loop must be one of {', '.join(LOOPS)}, got {self.loop!r}")
        if len(self.name.encode("utf-8")) > 0xFFFF:
            raise ConfigError("name is longer than 65535 UTF-8 bytes")
        return self

    def log_error_policy(self) -> str:
        """JETLOG.md 6.5: ``log_on_error``, or its default for ``log_fsync``: ``refuse``
        with ``always`` (its answers promise durability: none may go out without it),
        ``continue`` otherwise (their answers never waited for the log: a disk problem
        should not become an outage for a setting that chose availability)."""
        if self.log_on_error is not None:
            return self.log_on_error
        return "refuse" if self.log_fsync == "always" else "continue"

    def allowed_origins(self) -> list[str]:
        """``http_origins`` as a list (no trailing slashes, lower case)."""
        return [o.strip().rstrip("/").lower() for o in self.http_origins.split(",") if o.strip()]

    def allowed_hosts(self) -> list[str]:
        """``http_hosts`` as written, one entry per name (blank entries dropped)."""
        return [h.strip() for h in self.http_hosts.split(",") if h.strip()]


def host_name(authority: str) -> Optional[str]:
    """The host of ``authority`` (a ``Host`` header value or an ``--http-hosts`` entry:
    ``name``, ``name:port``, ``[v6]`` or ``[v6]:port``), lower case, without a trailing dot
    or the brackets; None when it is not of that form (RFC 9112 3.2: a 400).

    The port is dropped: against DNS rebinding only the name matters (the attacker picks
    the port too), and the listener's own port is the only one a request can reach."""
    text = authority.strip().lower()
    if text.startswith("["):
        name, bracket, rest = text[1:].partition("]")
        if not bracket or not name or any(c not in "0123456789abcdef:." for c in name):
            return None
    else:
        name, _, port = text.partition(":")
        rest = ":" + port if ":" in text else ""
        name = name[:-1] if name.endswith(".") else name
        if not name or not all(c.isascii() and (c.isalnum() or c in "-._") for c in name):
            return None
    # isdigit() alone takes '¹' (a latin-1 header byte) for a digit, which int() refuses.
    port_text = rest[1:]
    if rest and (not rest.startswith(":") or not (port_text.isascii() and port_text.isdigit()) or int(port_text) > 65535):
        return None
    return name


def entry_host_name(entry: str) -> Optional[str]:
    """The host of an ``--http-hosts`` entry or a listen address, as :func:`host_name`
    reads it; a bare IPv6 address (``::1``) may also be given without its brackets."""
    text = entry.strip()
    bare_ipv6 = not text.startswith("[") and text.count(":") > 1
    return host_name(f"[{text}]" if bare_ipv6 else text)


_FIELDS = {f.name: f for f in fields(Config)}
_HELP = {
    "host": f"address to listen on (default {DEFAULT_HOST})",
    "port": f"TCP port, 0 for a free one (default {DEFAULT_PORT})",
    "name": f"name announced in INFO and the event log (default {DEFAULT_NAME})",
    "loop": "event loop: auto (uvloop when importable), uvloop or asyncio (default auto)",
    "max_body": f"largest frame body accepted, bytes (default {DEFAULT_MAX_BODY})",
    "max_key_length": f"longest key, bytes (default {DEFAULT_MAX_KEY_LENGTH})",
    "max_connections": f"connections accepted at once (default {DEFAULT_MAX_CONNECTIONS})",
    "max_states_per_connection": f"states and methods per connection (default {DEFAULT_MAX_STATES_PER_CONNECTION})",
    "max_fetches_per_connection": f"fetches per connection (default {DEFAULT_MAX_FETCHES_PER_CONNECTION})",
    "max_pending_per_owner": f"routed requests pending at one owner (default {DEFAULT_MAX_PENDING_PER_OWNER})",
    "route_timeout": f"seconds before a routed request is answered TIMEOUT (default {DEFAULT_ROUTE_TIMEOUT:g})",
    "soft_limit": f"bytes queued for a peer above which changes conflate (default {DEFAULT_SOFT_LIMIT})",
    "hard_limit": f"bytes queued for a peer above which it is closed OVERLOADED (default {DEFAULT_HARD_LIMIT})",
    "slow_deadline": f"seconds a peer may stay above the soft limit (default {DEFAULT_SLOW_DEADLINE:g})",
    "log_dir": "write the event log (spec/JETLOG.md) into this directory",
    "log_fsync": (
        "event-log fsync policy: always (an answer leaves only once its records are synced), "
        "interval (once a second, default) or never (spec/JETLOG.md 6)"
    ),
    "log_events": "also record the fetch events sent in the event log",
    "log_rotate_size": f"event-log segment size that starts a new segment (default {DEFAULT_LOG_ROTATE_SIZE})",
    "log_max_bytes": (
        "delete the oldest event-log segments while the directory holds more bytes; 0: no limit "
        "(default: the segments already there plus half the space free on its file system at start, "
        "at least --log-rotate-size, so that peers' traffic cannot fill the disk)"
    ),
    "log_on_error": (
        "when the event log cannot be written (disk full, directory removed): refuse (every request "
        "answered INTERNAL), continue (without the log) or stop (exit 1); jetd retries the log every "
        "2 s and logs when it stops and resumes (default: refuse with --log-fsync always, else continue)"
    ),
    "log_max_age": "delete event-log segments last written more than this many seconds ago (default 0: no limit)",
    "log_writer_backlog": (
        f"bytes of event-log records not yet written above which jetd stops reading from peers "
        f"until the writer catches up (default {DEFAULT_LOG_WRITER_BACKLOG})"
    ),
    "log_level": "diagnostic log level on stderr (default INFO)",
    "shutdown_grace": f"seconds peers get to read their CLOSE on shutdown (default {DEFAULT_SHUTDOWN_GRACE:g})",
    "http_port": "serve WebSocket peers (/jet) and the web console (/) on this HTTP port, 0 for a free one",
    "http_host": "address of the HTTP listener (default: --host)",
    "http_origins": "comma-separated browser origins allowed besides the same origin, or * for any",
    "http_hosts": (
        "comma-separated host names a request's Host header may name besides the listen address, "
        "localhost, 127.0.0.1, [::1] and the hosts of --http-origins (against DNS rebinding); * allows any "
        "and turns that protection off"
    ),
    "http_handshake_timeout": (
        f"seconds a connection to the HTTP port has to send its request (default {DEFAULT_HTTP_HANDSHAKE_TIMEOUT:g})"
    ),
    "metrics_public": (
        "serve /metrics (Prometheus text format) on the HTTP port to anyone under --auth too; without "
        "--auth it is served anyway, and under --auth without this flag only to HTTP Basic credentials of a "
        "user with read on $jet/ (401 without them, 403 with others)"
    ),
    "max_input_buffer": ("bytes of unprocessed input, WebSocket frames under assembly included, all connections "
                         f"together (default {DEFAULT_MAX_INPUT_BUFFER})"),
    "frame_timeout": f"seconds a peer has to complete a frame it began, jet or WebSocket (default {DEFAULT_FRAME_TIMEOUT:g})",
    "first_frame_timeout": "seconds a new connection may go without a whole frame (default 0: no limit)",
    "max_query_size": f"largest query payload, bytes (default {DEFAULT_MAX_QUERY_SIZE})",
    "max_query_terms": f"matchers, operands, filters and sort of one query (default {DEFAULT_MAX_QUERY_TERMS})",
    "max_window": f"longest window of a sorted query (default {DEFAULT_MAX_WINDOW})",
    "max_field_depth": f"segments of one field path (default {DEFAULT_MAX_FIELD_DEPTH})",
    "auth": "users file: require authentication and enforce permissions (re-read on SIGHUP)",
    "auth_timeout": f"seconds to authenticate when anonymous peers may do nothing (default {DEFAULT_AUTH_TIMEOUT:g})",
    "auth_failure_delay": (
        f"seconds before each AUTH_FAILED answer (default {DEFAULT_AUTH_FAILURE_DELAY:g}); after the 5th "
        "failure within 10 minutes from one source address (IPv6: /64), or for one user, it doubles with "
        "each further failure, and until it has passed no password of that address is checked, nor one "
        "of that user from an address that has failed too (PROTOCOL.md 15.2)"
    ),
    "auth_failure_delay_max": (
        f"the most that growing delay reaches, seconds (default {DEFAULT_AUTH_FAILURE_DELAY_MAX:g})"
    ),
    "auth_queue": (
        f"password checks that may wait to run (default {DEFAULT_AUTH_QUEUE}; one source address may hold "
        "a quarter); an AUTHENTICATE beyond that is answered OVERLOADED after --auth-failure-delay, unchecked. "
        "Checks run one per core but one (at least 1, at most 2), each on one thread"
    ),
    "tls_cert": "PEM certificate (chain) of the listener: TLS on (with --tls-key)",
    "tls_key": "PEM private key of --tls-cert",
    "tls_client_ca": "PEM CA bundle for client certificates; a verified certificate's CN is the user",
    "tls_handshake_timeout": (
        f"seconds a connection to a TLS port (jet or --http-port) has to complete its handshake; until then it "
        f"counts against --max-connections, after it is closed (default {DEFAULT_TLS_HANDSHAKE_TIMEOUT:g})"
    ),
    "tls_port": ("with --tls-cert: TLS peers on this jet port (0 for a free one, printed as 'tls on HOST:PORT'), "
                 "and --port stays plain TCP; without it --port speaks TLS"),
}


class _VersionAction(argparse.Action):
    """``--version``: jet's version and which build runs (jetd.build), read when asked."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        from jetwire.codes import PROTOCOL_MAJOR
        from jetwire.codes import PROTOCOL_MINOR

        from .build import build_description
        from .build import jet_version

        print(f"jetd {jet_version()}, protocol {PROTOCOL_MAJOR}.{PROTOCOL_MINOR}, {build_description()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The ``jetd`` command line: ``--config FILE`` plus one flag per setting."""
    parser = argparse.ArgumentParser(
        prog="jetd",
        description="jet daemon: the binary Jet object bus (spec/PROTOCOL.md).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "The first line on stdout is 'jetd listening on HOST:PORT'; with --http-port the\n"
            "second is 'web on http://HOST:PORT/' (WebSocket peers on /jet, the console on /).\n"
            "SIGTERM or SIGINT: CLOSE (OK, 'shutting down') to every peer, event log flushed,\n"
            "exit 0.\n"
            "SIGUSR1 logs the counters; SIGHUP re-reads the --auth users file. Exit codes:\n"
            "0 clean stop, 1 cannot listen or write the event log, 2 bad settings.\n"
            "`jetd user add|del|list FILE ...` edits a users file (jetd user --help).\n\n"
            "Config file (TOML), keys named like the flags:\n"
            "  [jetd]\n  port = 11124\n  max-body = 1048576\n  log-dir = \"/var/log/jetd\"\n"
        ),
    )
    parser.add_argument("--version", action=_VersionAction, help="the version, and whether the hot path is compiled")
    parser.add_argument("--config", metavar="FILE", help="TOML file with settings (flags override it)")
    for name, f in _FIELDS.items():
        flag = "--" + name.replace("_", "-")
        if f.type in ("bool", bool):
            parser.add_argument(flag, action="store_true", default=None, help=_HELP[name])
            continue
        kind: Any = {"int": int, "Optional[int]": int, "float": float}.get(str(f.type), str)
        choices = {"log_fsync": FSYNC_POLICIES, "log_on_error": LOG_ERROR_POLICIES, "loop": LOOPS}.get(name)
        parser.add_argument(flag, type=kind, default=None, choices=choices, metavar=name.upper(), help=_HELP[name])
    return parser


def _coerce(name: str, value: Any) -> Any:
    kind = str(_FIELDS[name].type)
    try:
        if kind == "bool":
            if not isinstance(value, bool):
                raise TypeError
            return value
        if kind in ("int", "Optional[int]"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError
            return value
        if kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError
            return float(value)
        if not isinstance(value, str):
            raise TypeError
        return value
    except TypeError:
        raise ConfigError(f"{name} must be of type {kind.replace('Optional[', '').rstrip(']')}, got {value!r}") from None


def load_toml(path: str) -> dict[str, Any]:
    """Read a TOML config file into field names and values.

    Raises:
        ConfigError: unreadable file, invalid TOML, unknown key or wrong type.
    """
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    if isinstance(data.get("jetd"), dict):
        data = {**{k: v for k, v in data.items() if k != "jetd"}, **data["jetd"]}
    settings: dict[str, Any] = {}
    for raw_key, value in data.items():
        name = raw_key.replace("-", "_")
        if name not in _FIELDS:
            raise ConfigError(f"config file {path}: unknown setting {raw_key!r}")
        settings[name] = _coerce(name, value)
    return settings


def config_from_args(argv: Optional[list[str]] = None) -> Config:
    """Parse the command line (and the ``--config`` file it names) into a Config.

    Raises:
        ConfigError: for a bad config file or value.
        SystemExit: for bad flags (argparse prints the usage).
    """
    args = build_parser().parse_args(argv)
    settings: dict[str, Any] = {}
    if args.config:
        settings.update(load_toml(args.config))
    for name in _FIELDS:
        value = getattr(args, name)
        if value is not None:
            settings[name] = value
    return dataclasses.replace(Config(), **settings).validate()
