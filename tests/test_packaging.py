"""The package as a user installs it: a wheel built from this checkout, installed into a
fresh virtual environment, must bring its console scripts, its data (the conformance
cases, the Wireshark dissector) and run them without the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CASES = sorted(p.name for p in (REPO / "spec" / "conformance").glob("*.json"))


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(wheel, venv) with the wheel installed; dependencies come from this interpreter."""
    work = tmp_path_factory.mktemp("packaging")
    # Pure Python: what is checked here is the package's data; tests/compiled builds the
    # compiled wheel.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(work), str(REPO)],
        check=True, capture_output=True, timeout=300, env={**os.environ, "JET_PURE_PYTHON": "1"},
    )
    [wheel] = work.glob("jet-*.whl")
    env = work / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env)
    # --ignore-installed: the jet that this interpreter has (an editable install, seen
    # through the system site-packages) must not count as already installed.
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "-q", "--no-deps",
         "--no-index", "--ignore-installed", str(wheel)],
        check=True, capture_output=True, timeout=120, env=_clean_env(),
    )
    return wheel, env


@pytest.mark.timeout(300)
def test_wheel_carries_the_cases_and_the_dissector(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    data = sorted(Path(n).name for n in names if "/data/share/jet/conformance/" in n and n.endswith(".json"))
    assert data == CASES
    assert "tools/wireshark/jet.lua" in names
    assert all(f"{pkg}/py.typed" in names for pkg in ("jetwire", "jetd", "peer"))
    # The console and its vendored plot library, with the library's licence (issue 33).
    assert {"jetd/static/console.js", "jetd/static/vendor/uplot/uPlot.esm.js", "jetd/static/vendor/uplot/uPlot.min.css",
            "jetd/static/vendor/uplot/LICENSE"} <= set(names)


@pytest.mark.timeout(300)
def test_installed_conformance_runner_finds_its_cases_outside_the_checkout(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    _, env = installed
    python = env / "bin" / "python"
    # Nothing from this process's environment may point back at the checkout (the Spark
    # session helper, for one, puts the repository on PYTHONPATH).
    clean = _clean_env()
    where = subprocess.run(
        [str(python), "-c", "import json, tools.conformance.cases as c;"
         "print(json.dumps([c.__file__, str(c.default_case_dir())]))"],
        cwd=tmp_path, env=clean, check=True, capture_output=True, text=True, timeout=60,
    )
    module, case_dir = json.loads(where.stdout)
    assert Path(module).is_relative_to(env), module  # the installed copy, not the checkout
    assert Path(case_dir) == env / "share" / "jet" / "conformance"
    listed = subprocess.run([str(env / "bin" / "jet-conformance"), "--list"], cwd=tmp_path, env=clean,
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    total = sum(len(json.loads((REPO / "spec" / "conformance" / name).read_text())["cases"]) for name in CASES)
    assert listed.stdout.splitlines()[-1] == f"{total} case(s)"
