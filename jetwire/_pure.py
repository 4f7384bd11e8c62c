"""``JET_PURE_PYTHON=1`` when importing: run the ``.py`` source of the modules that a
compiled install has compiled (issue 19), without reinstalling, to compare the two builds
or to rule the compiled one out when debugging. At install time the same variable makes
``pip install .`` build no extension at all (setup.py).

Importing this module installs the finder (``jetwire`` imports it first; ``jetd`` and
``tools.jetdump`` import it before their own modules). Without the variable, or in an
install that has no extension, nothing changes. This module itself is never compiled.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Optional

if TYPE_CHECKING:  # kept off the import path: every jet command imports this module
    from importlib.machinery import ModuleSpec
    from types import ModuleType

__all__ = ["COMPILED_MODULES", "FORCED"]

FORCED = os.environ.get("JET_PURE_PYTHON", "") not in ("", "0")

# The modules setup.py compiles (its HOT list, tied to this one by a test): the codec's
# frame splitter and decoder; the daemon's sans-IO core (receive, route, fan-out) with
# the parts it calls; jetdump's per-packet path (capture reading, reassembly, dissector);
# the event-log reader's walk along the records.
COMPILED_MODULES = (
    "jetwire.codec",
    "jetd.frames",
    "jetd.connection",
    "jetd.base",
    "jetd.registry",
    "jetd.routes",
    "jetd.subscriptions",
    "jetd.query",
    "jetd.querying",
    "jetd.access",
    "jetd.core",
    "tools.jetdump.packets",
    "tools.jetdump.capture",
    "tools.jetdump.dissector",
    "tools.jetdump.events",
    "tools.ingest.chain",
)


class _SourceFirst:
    """A meta-path finder that finds a compiled module's ``.py`` file ahead of the
    extension module beside it (the import system's own order puts extensions first)."""

    @staticmethod
    def find_spec(name: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[ModuleSpec]:
        if name not in COMPILED_MODULES or not path:
            return None
        import importlib.util

        leaf = name.rpartition(".")[2]
        for entry in path:
            source = os.path.join(entry, leaf + ".py")
            if os.path.isfile(source):
                return importlib.util.spec_from_file_location(name, source)
        return None


if FORCED:
    sys.meta_path.insert(0, _SourceFirst())
