"""``python -m peer`` runs the ``jet`` command line."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
