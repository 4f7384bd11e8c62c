"""Running jetd: the TCP listener (:mod:`jetd.server`), the HTTP listener for WebSocket
peers and the console (:mod:`jetd.web`, which builds on jetd.server), the event log, and
the signals, from start to a clean stop (PROTOCOL.md 10.9).

Its own module so that jetd.server need not import jetd.web, which imports it (no
import cycle, ARCHITECTURE.md); jetd.web is imported only when ``--http-port`` asks
for it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import TYPE_CHECKING
from typing import Optional

from .access import Access
from .build import build_description
from .build import jet_version
from .config import Config
from .config import ConfigError
from .eventlog import EventLog
from .gcpolicy import DEFAULT_CHECK_INTERVAL
from .gcpolicy import GcPolicy
from .server import Server
from .server import _threadsafe
from .server import _warn_exposed
from .tls import server_context
from .users import UsersFileError

if TYPE_CHECKING:
    from .web import WebListener

__all__ = ["serve"]

log = logging.getLogger("jetd")

# JETLOG.md 6.5: the end of the event log's ERROR line, per --log-on-error.
_ON_ERROR_TEXT = {
    "refuse": "every request is answered INTERNAL (--log-on-error refuse)",
    "continue": "jetd goes on without it, nothing is durable (--log-on-error continue)",
    "stop": "jetd stops (--log-on-error stop)",
}


def _stats(server: Server, collector: GcPolicy) -> str:
    """The counters of the SIGUSR1 and exit lines: the core's, then the listeners' (refused
    connections, TLS handshakes closed for --tls-handshake-timeout, PROTOCOL.md 15.6),
    then the garbage collector's (jetd.gcpolicy)."""
    return (f"{server.daemon.stats.summary()} refused={server.refused_total} "
            f"tls_handshake_timeouts={server.tls_timeouts_total} {collector.summary()}")


def _drive(loop: asyncio.AbstractEventLoop, collector: GcPolicy) -> list[asyncio.TimerHandle]:
    """Call ``collector.tick`` every DEFAULT_CHECK_INTERVAL seconds, as a loop callback of
    its own (between two other callbacks, never inside a slice); returns a one-element
    list holding the pending timer, for cancelling it."""
    handle: list[asyncio.TimerHandle] = []

    def tick() -> None:
        try:
            collector.tick(loop.time())
        except Exception:  # a bug here must not stop the collections for good
            log.exception("internal error in the garbage-collector policy")
        handle[0] = loop.call_later(DEFAULT_CHECK_INTERVAL, tick)

    handle.append(loop.call_later(DEFAULT_CHECK_INTERVAL, tick))
    return handle


async def serve(config: Config, ready: Optional[asyncio.Future[tuple[str, int]]] = None) -> int:
    """Run jetd until SIGTERM or SIGINT; returns the exit code.

    Prints ``jetd listening on HOST:PORT`` as the first stdout line once listening.
    """
    loop = asyncio.get_running_loop()
    try:
        access = Access.load(config.auth) if config.auth is not None else None
        ssl_context = server_context(config)
    except (UsersFileError, ConfigError) as exc:
        print(f"jetd: error: {exc}", file=sys.stderr)
        return 2
    _warn_exposed(config)
    eventlog: Optional[EventLog] = None
    if config.log_dir:
        eventlog = EventLog(
            config.log_dir,
            name=config.name,
            fsync=config.log_fsync,
            rotate_size=config.log_rotate_size,
            max_backlog=config.log_writer_backlog,
            max_bytes=config.log_max_bytes,
            max_age=config.log_max_age,
            on_error=_ON_ERROR_TEXT[config.log_error_policy()],
        )
        eventlog.open()
    server = Server(config, loop, eventlog, access, ssl_context)
    # Issue 33: what $jet/daemon and /metrics tell of the build and the event log.
    server.daemon.metrics.version = jet_version()
    server.daemon.metrics.log_stats = eventlog.stats if eventlog is not None else None
    stop = asyncio.Event()
    exit_code = 0

    def stop_for_log() -> None:  # JETLOG.md 6.5: --log-on-error stop
        nonlocal exit_code
        exit_code = 1
        stop.set()

    server.stop_for_log = stop_for_log
    if eventlog is not None:
        eventlog.signal = _threadsafe(loop, server.log_progress)
    try:
        host, port = await server.start()
    except OSError as exc:
        if eventlog is not None:
            eventlog.close()
        print(f"jetd: cannot listen on {config.host}:{config.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    web: Optional[WebListener] = None
    if config.http_port is not None:  # PROTOCOL.md 13: WebSocket peers and the console
        from .web import start_web  # only when asked for: it brings websockets

        try:
            # The same TLS settings as the TCP listener (jetd.tls): wss and https.
            web, web_line = await start_web(server, server.ssl_context)
        except OSError as exc:
            await server.shutdown()
            if eventlog is not None:
                eventlog.close()
            where = f"{config.http_host or config.host}:{config.http_port}"
            print(f"jetd: cannot listen on {where}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Issue 29: no collection walks the long-lived heap (jetd.gcpolicy); started last,
    # so that what was set up before is frozen. On uvloop only: asyncio's own selector
    # transports hold a bound method of themselves, a cycle per connection that a
    # frozen heap would keep (tests/jetd/test_21_gc_cycles.py).
    collector = GcPolicy()
    if type(loop).__module__.startswith("uvloop"):
        collector.start(loop.time())
    collecting = _drive(loop, collector)
    loop.add_signal_handler(signal.SIGUSR1, lambda: log.info("stats: %s", _stats(server, collector)))
    loop.add_signal_handler(signal.SIGHUP, server.reload_access)
    print(f"jetd listening on {host}:{port}", flush=True)
    log.info(
        "listening on %s:%d (loop %s, %s, event log %s)",
        host,
        port,
        type(loop).__module__.split(".")[0],
        build_description(),
        eventlog.path if eventlog is not None else "off",
    )
    if web is not None:
        print(web_line, flush=True)
        log.info("%s", web_line)
    if server.tls_port is not None:  # --tls-port (after the web line, which readers take second)
        print(f"tls on {host}:{server.tls_port}", flush=True)
        log.info("tls on %s:%d", host, server.tls_port)
    if ready is not None:
        ready.set_result((host, port))
    await stop.wait()
    log.info("shutting down: %d connections", len(server.protocols))
    if web is not None:
        web.close()
    await server.shutdown()
    if eventlog is not None:
        eventlog.close()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP):
        loop.remove_signal_handler(sig)
    collecting[0].cancel()
    log.info("stopped; stats: %s", _stats(server, collector))
    collector.stop()
    return exit_code
