"""The JavaScript peer library's own tests (js/test, Node's test runner) from pytest, so
that `make test` and CI run them: npm ci (from the lockfile) when js/node_modules is
missing, then `node --test` against real jetd processes started from this checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

JS = Path(__file__).resolve().parent.parent.parent / "js"


def test_javascript_peer_library() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the JavaScript peer library (js/) was not tested")
    env = {**os.environ, "JET_PYTHON": sys.executable}
    if not (JS / "node_modules" / "ws").is_dir():
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("node is installed but npm is not: cannot install js/ dev dependencies")
        ci = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=JS, env=env, capture_output=True,
                            text=True, timeout=300)
        assert ci.returncode == 0, f"npm ci failed:\n{ci.stdout}\n{ci.stderr}"
    run = subprocess.run([node, "--test", "test/"], cwd=JS, env=env, capture_output=True, text=True, timeout=170)
    summary = "\n".join(line for line in run.stdout.splitlines() if line.startswith("# "))
    print(summary)
    assert run.returncode == 0, f"node --test failed:\n{run.stdout[-20000:]}\n{run.stderr[-5000:]}"
    assert "# fail 0" in run.stdout and "# pass 0" not in run.stdout, summary
