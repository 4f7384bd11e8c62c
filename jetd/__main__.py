"""``jetd`` / ``python -m jetd``: run the daemon (see ``jetd --help``)."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Optional

from .config import ConfigError
from .config import config_from_args
from .launch import serve
from .server import new_event_loop


def main(argv: Optional[list[str]] = None) -> int:
    """Parse the command line, run jetd until SIGTERM/SIGINT, return the exit code.

    ``jetd user add|del|list ...`` edits a users file instead (jetd.users).

    Exit codes: 0 after a clean shutdown, 1 if it cannot listen or write its event log,
    2 for bad settings (a users file or TLS file that does not load included).
    """
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["user"]:
        from .users import main as user_main

        return user_main(args[1:])
    try:
        config = config_from_args(argv)
    except ConfigError as exc:
        print(f"jetd: error: {exc}", file=sys.stderr)
        return 2
    level = getattr(logging, config.log_level.upper(), None)
    if not isinstance(level, int):
        print(f"jetd: error: unknown log level {config.log_level!r}", file=sys.stderr)
        return 2
    logging.basicConfig(stream=sys.stderr, level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        loop = new_event_loop(config.loop)
    except ImportError:
        print("jetd: error: --loop uvloop, but uvloop is not installed", file=sys.stderr)
        return 2
    try:
        with asyncio.Runner(loop_factory=lambda: loop) as runner:
            return runner.run(serve(config))
    except OSError as exc:
        print(f"jetd: error: {exc.strerror or exc}: {getattr(exc, 'filename', '') or ''}".rstrip(": "), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
