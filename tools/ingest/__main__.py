"""``python -m tools.ingest`` is ``jet-ingest``."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
