"""``python -m tools.chaos``: see :mod:`tools.chaos`."""

from .cli import main

raise SystemExit(main())
