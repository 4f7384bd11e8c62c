"""Defaults shared by the peers and the ``jet`` command line, in a module that imports
nothing (``jet`` reads them before it knows whether it needs asyncio)."""

DEFAULT_PORT = 11124  # PROTOCOL.md 3
DEFAULT_TIMEOUT = 10.0  # seconds; longer than jetd's default route timeout (5 s)
