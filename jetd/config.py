"""jetd's settings: one documented dataclass, loaded from defaults, a TOML file and flags.

Precedence: built-in defaults < ``--config FILE`` (TOML, keys named like the fields,
``-`` or ``_`` alike, at the top level or under a ``[jetd]`` table) < command-line flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

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
DEFAULT_LOG_MAX_BYTES = 0  # JETLOG.md 6.4: 0 keeps every segment
DEFAULT_LOG_MAX_AGE = 0.0  # JETLOG.md 6.4: seconds; 0 keeps every segment
DEFAULT_LOG_WRITER_BACKLOG = 64 * 1024 * 1024  # JETLOG.md 6.3: input pauses above it
DEFAULT_SHUTDOWN_GRACE = 3.0  # seconds peers get to take their CLOSE before we hang up

FSYNC_POLICIES = ("always", "interval", "never")
LOOPS = ("auto", "uvloop", "asyncio")


class ConfigError(ValueError):
    """A setting is invalid (bad value, unknown key, unreadable config file)."""


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
            bytes (JETLOG.md 6.4); 0: no limit. At least ``log_rotate_size``.
        log_max_age: delete segments last written more than this many seconds ago
            (JETLOG.md 6.4); 0: no limit.
        log_writer_backlog: bytes of records not yet written (and output held for
            them) above which reading from peers pauses until the writer catches up
            (JETLOG.md 6.3).
        log_level: level of the diagnostic log on stderr (INFO, DEBUG, WARNING, ...).
        shutdown_grace: seconds to let peers read their CLOSE before hanging up.
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
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES
    log_max_age: float = DEFAULT_LOG_MAX_AGE
    log_writer_backlog: int = DEFAULT_LOG_WRITER_BACKLOG
    log_level: str = "INFO"
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE

    def validate(self) -> Config:
        """Check every value; returns self.

        Raises:
            ConfigError: naming the first bad setting.
        """
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be 0..65535, got {self.port}")
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
        for name in (
            "max_connections",
            "max_states_per_connection",
            "max_fetches_per_connection",
            "max_pending_per_owner",
            "soft_limit",
            "hard_limit",
            "log_rotate_size",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.hard_limit < self.soft_limit:
            raise ConfigError(f"hard_limit ({self.hard_limit}) must not be below soft_limit ({self.soft_limit})")
        for name in ("route_timeout", "slow_deadline"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be above 0 seconds, got {getattr(self, name)}")
        if self.shutdown_grace < 0:
            raise ConfigError(f"shutdown_grace must not be negative, got {self.shutdown_grace}")
        # The event log's retention and backlog (JETLOG.md 6.3, 6.4).
        if self.log_writer_backlog < 1:
            raise ConfigError(f"log_writer_backlog must be at least 1, got {self.log_writer_backlog}")
        if self.log_max_bytes < 0:
            raise ConfigError(f"log_max_bytes must not be negative (0: no limit), got {self.log_max_bytes}")
        if 0 < self.log_max_bytes < self.log_rotate_size:
            raise ConfigError(
                f"log_max_bytes ({self.log_max_bytes}) must be 0 (no limit) or at least "
                f"log_rotate_size ({self.log_rotate_size}): the segment being written is never deleted"
            )
        if not self.log_max_age >= 0:
            raise ConfigError(f"log_max_age must not be negative (0: no limit), got {self.log_max_age}")
        if self.log_fsync not in FSYNC_POLICIES:
            raise ConfigError(f"log_fsync must be one of {', '.join(FSYNC_POLICIES)}, got {self.log_fsync!r}")
        if self.loop not in LOOPS:
            raise ConfigError(f"loop must be one of {', '.join(LOOPS)}, got {self.loop!r}")
        if len(self.name.encode("utf-8")) > 0xFFFF:
            raise ConfigError("name is longer than 65535 UTF-8 bytes")
        return self


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
    "log_max_bytes": "delete the oldest event-log segments while the directory holds more bytes (default 0: no limit)",
    "log_max_age": "delete event-log segments last written more than this many seconds ago (default 0: no limit)",
    "log_writer_backlog": (
        f"bytes of event-log records not yet written above which jetd stops reading from peers "
        f"until the writer catches up (default {DEFAULT_LOG_WRITER_BACKLOG})"
    ),
    "log_level": "diagnostic log level on stderr (default INFO)",
    "shutdown_grace": f"seconds peers get to read their CLOSE on shutdown (default {DEFAULT_SHUTDOWN_GRACE:g})",
}


def build_parser() -> argparse.ArgumentParser:
    """The ``jetd`` command line: ``--config FILE`` plus one flag per setting."""
    parser = argparse.ArgumentParser(
        prog="jetd",
        description="jet daemon: the binary Jet object bus (spec/PROTOCOL.md).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "The first line on stdout is 'jetd listening on HOST:PORT'. SIGTERM or SIGINT:\n"
            "CLOSE (OK, 'shutting down') to every peer, event log flushed, exit 0.\n"
            "SIGUSR1 logs the counters. Exit codes: 0 clean stop, 1 cannot listen or\n"
            "write the event log, 2 bad settings.\n\n"
            "Config file (TOML), keys named like the flags:\n"
            "  [jetd]\n  port = 11124\n  max-body = 1048576\n  log-dir = \"/var/log/jetd\"\n"
        ),
    )
    parser.add_argument("--config", metavar="FILE", help="TOML file with settings (flags override it)")
    for name, f in _FIELDS.items():
        flag = "--" + name.replace("_", "-")
        if f.type in ("bool", bool):
            parser.add_argument(flag, action="store_true", default=None, help=_HELP[name])
            continue
        kind: Any = {"int": int, "float": float}.get(str(f.type), str)
        choices = {"log_fsync": FSYNC_POLICIES, "loop": LOOPS}.get(name)
        parser.add_argument(flag, type=kind, default=None, choices=choices, metavar=name.upper(), help=_HELP[name])
    return parser


def _coerce(name: str, value: Any) -> Any:
    kind = str(_FIELDS[name].type)
    try:
        if kind == "bool":
            if not isinstance(value, bool):
                raise TypeError
            return value
        if kind == "int":
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
        raise ConfigError(f"{name} must be of type {kind.replace('Optional[str]', 'str')}, got {value!r}") from None


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
