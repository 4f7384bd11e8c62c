"""The JVM-free reader lines of tools/ingest/README.md ("Reading the warehouse") run
as they are written there, on a warehouse jet-ingest wrote, and read what a strict
reader of the logs reads."""

from __future__ import annotations

import os
import re
from pathlib import Path

from rich.console import Console

from tools.ingest.cli import ingest_once
from tools.ingest.synth import BASE_NS
from tools.ingest.synth import write_synthetic_log

README = Path(__file__).resolve().parents[2] / "tools" / "ingest" / "README.md"


def _reader_lines() -> list[str]:
    text = README.read_text()
    section = text[text.index("### Reading the warehouse"):]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    return [line for line in block.group(1).splitlines() if "deltalake" in line]


def test_the_readmes_deltalake_lines_read_the_warehouse(tmp_path: Path) -> None:
    logs, wh = tmp_path / "logs", tmp_path / "wh"
    logs.mkdir()
    n = write_synthetic_log(str(logs / "jet-000.jetlog"), 80, start_ns=BASE_NS)
    assert ingest_once(None, str(logs), wh, console=Console(file=open(os.devnull, "w"))) == n  # noqa: SIM115
    lines = _reader_lines()
    assert len(lines) == 2 and "to_pandas()" in lines[0] and "to_pyarrow_table()" in lines[1], lines
    scope: dict[str, object] = {}
    exec("\n".join(line.replace("WAREHOUSE", str(wh)) for line in lines), scope)
    df, arrow = scope["df"], scope["arrow"]
    assert len(df) == n and arrow.num_rows == n  # type: ignore[arg-type, attr-defined]
    keys = sorted(zip(arrow.column("file").to_pylist(), arrow.column("offset").to_pylist(), strict=True))  # type: ignore[attr-defined]
    from tools.ingest.parse import read_segment

    strict = sorted((str(logs / "jet-000.jetlog"), o) for b in read_segment(str(logs / "jet-000.jetlog"))
                    for o in b.column("offset").to_pylist())
    assert keys == strict
