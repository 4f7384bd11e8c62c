"""jetd: the jet daemon (spec/PROTOCOL.md), a sans-IO core in a thin uvloop server.

- :mod:`jetd.core`: :class:`~jetd.core.Daemon`, the sans-IO core, testable without
  sockets: the connection life cycle and the frame dispatcher, composed of one part per
  responsibility (ARCHITECTURE.md): :mod:`jetd.registry` (states and methods),
  :mod:`jetd.routes` (routing and timeouts), :mod:`jetd.subscriptions` (fetches,
  fan-out, slow consumers), :mod:`jetd.querying` (queries), :mod:`jetd.access` (users,
  permissions, authentication: PROTOCOL.md 15), :mod:`jetd.scheduler` (sliced work),
  :mod:`jetd.base` (output, closing), :mod:`jetd.frames` (frame layouts).
- :mod:`jetd.server`: the asyncio/uvloop protocol, per-turn flushing, flow control.
- :mod:`jetd.launch`: ``serve()``, running the listeners, the event log and the signals.
- :mod:`jetd.users`: the users file and ``jetd user add|del|list``.
- :mod:`jetd.tls`: the listeners' SSLContext (one place for TCP and WebSocket).
- :mod:`jetd.config`: every setting, with defaults, TOML file and flags.
- :mod:`jetd.eventlog`: the event log of spec/JETLOG.md.

Run it with ``python -m jetd`` (default port 11124, see ``--help``).
"""

from __future__ import annotations

# First, before any module of this package: with JET_PURE_PYTHON=1 a compiled install's
# core runs from source (jetwire/_pure.py).
import jetwire._pure  # noqa: F401

from .config import DEFAULT_PORT
from .config import Config
from .config import ConfigError
from .core import Connection
from .core import Daemon

__all__ = ["DEFAULT_PORT", "Config", "ConfigError", "Connection", "Daemon"]
