"""Reports of a conformance run: console text, JSON, JUnit XML and a self-contained HTML page."""

from __future__ import annotations

import argparse
import html
import json
import xml.etree.ElementTree as ET
from collections import Counter
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from typing import Optional
from typing import Protocol
from typing import TextIO

from .runner import FAILED
from .runner import INFORMATIONAL
from .runner import NON_STRICT
from .runner import OK
from .runner import OUTCOMES
from .runner import SKIPPED
from .runner import CaseResult
from .runner import ExchangeEntry
from .runner import RunConfig

__all__ = [
    "EXCHANGE_HEAD",
    "EXCHANGE_TAIL",
    "TEXT_MAX",
    "add_report_options",
    "capped_exchange",
    "summary_counts",
    "summary_line",
    "write_case_list",
    "write_console",
    "write_html",
    "write_json",
    "write_junit",
    "write_report_files",
]

# Transcript caps (issue 17): one informational case (slow consumers) logs hundreds of
# frames of 128 KiB each, which made a full run's reports ~50 MB. Every report keeps the
# head and the tail of each transcript and of each long line, and says how much was cut.
EXCHANGE_HEAD = 60  # first entries of a transcript kept
EXCHANGE_TAIL = 40  # last entries kept
TEXT_MAX = 1000  # characters of one entry's text (or one string in expected/received) kept
_TEXT_TAIL = 200  # of which from the end


def _cap_text(text: str, limit: int = TEXT_MAX) -> str:
    if len(text) <= limit:
        return text
    head = limit - _TEXT_TAIL
    return f"{text[:head]} ...[{len(text) - head - _TEXT_TAIL} characters cut]... {text[-_TEXT_TAIL:]}"


def _cap_strings(value: Any) -> Any:
    """``value`` with every long string in it capped (expected/received descriptions)."""
    if isinstance(value, str):
        return _cap_text(value)
    if isinstance(value, list):
        return [_cap_strings(item) for item in value]
    if isinstance(value, dict):
        return {key: _cap_strings(item) for key, item in value.items()}
    return value


def capped_exchange(result: CaseResult) -> tuple[list[ExchangeEntry], int]:
    """The transcript of ``result`` as reports show it: at most ``EXCHANGE_HEAD`` +
    ``EXCHANGE_TAIL`` entries, each text capped at ``TEXT_MAX`` characters. Returns the
    entries and how many were left out (a note entry in their place says so)."""
    entries = result.exchange
    cut = max(0, len(entries) - EXCHANGE_HEAD - EXCHANGE_TAIL)
    if cut:
        middle = entries[EXCHANGE_HEAD]
        note = ExchangeEntry(middle.time, "-", "note", f"... {cut} entries cut from this transcript "
                             f"({len(entries)} in all; the first {EXCHANGE_HEAD} and last {EXCHANGE_TAIL} are shown)")
        entries = [*entries[:EXCHANGE_HEAD], note, *entries[-EXCHANGE_TAIL:]]
    shown = [entry if len(entry.text) <= TEXT_MAX else
             ExchangeEntry(entry.time, entry.conn, entry.direction, _cap_text(entry.text), entry.hex)
             for entry in entries]
    return shown, cut


def summary_counts(results: list[CaseResult], strict: bool) -> tuple[int, int, int]:
    """(passed, failed, skipped): OK, INFORMATIONAL and (unless strict) NON-STRICT pass."""
    failed = sum(result.counts_as_failure(strict) for result in results)
    skipped = sum(result.outcome == SKIPPED for result in results)
    return len(results) - failed - skipped, failed, skipped


def summary_line(results: list[CaseResult], strict: bool) -> str:
    """The last line of every run: ``conformance: N passed, N failed, N skipped``."""
    passed, failed, skipped = summary_counts(results, strict)
    return f"conformance: {passed} passed, {failed} failed, {skipped} skipped"


def _top_section(section: str) -> str:
    return section.split(".")[0]


def section_summary(results: list[CaseResult]) -> dict[str, Counter[str]]:
    """Outcome counts per section (``4.4``, ``10.3``...), in section order."""
    per: dict[str, Counter[str]] = defaultdict(Counter)
    for result in sorted(results, key=lambda r: r.case.section_key()):
        per[result.case.section][result.outcome] += 1
    return per


def write_console(results: list[CaseResult], config: RunConfig, out: TextIO, verbose: bool = False) -> None:
    """One line per case, the details of every case not OK, a per-section table and the
    summary line (always last)."""
    for result in results:
        case = result.case
        out.write(f"{result.outcome:<13} {case.section:<6} {case.id:<44} {result.duration:6.2f}s  {case.title}\n")
        if result.outcome == SKIPPED and not verbose:
            # Why a case did not run is shown without -v (issue 17): a skip hides coverage.
            out.write(f"{'':21}skipped: {result.reason}\n")
    problems = [r for r in results if r.outcome in (FAILED, NON_STRICT) or (verbose and r.outcome != OK)]
    for result in problems:
        case = result.case
        out.write(f"\n--- {result.outcome}: {case.id} (PROTOCOL.md {case.section}, {case.requirement})\n")
        out.write(f"    spec: {case.quote}\n")
        out.write(f"    why:  {result.reason}\n")
        for expected in result.expected:
            out.write(f"    expected: {json.dumps(expected, ensure_ascii=False)}\n")
        for received in result.received:
            decoded = received.get("decoded")
            shown = (json.dumps(_cap_strings(decoded), ensure_ascii=False) if decoded is not None
                     else received.get("error"))
            out.write(f"    received: {shown}\n")
            if received.get("hex"):
                out.write(f"              hex {received['hex']}\n")
    out.write("\nper section:\n")
    out.write(f"  {'section':<8}" + "".join(f"{name:>14}" for name in OUTCOMES) + "\n")
    for section, counts in section_summary(results).items():
        out.write(f"  {section:<8}" + "".join(f"{counts.get(name, 0):>14}" for name in OUTCOMES) + "\n")
    totals = Counter(result.outcome for result in results)
    out.write(f"  {'all':<8}" + "".join(f"{totals.get(name, 0):>14}" for name in OUTCOMES) + "\n")
    if config.strict:
        out.write("(--strict: NON-STRICT counts as failed)\n")
    out.write(summary_line(results, config.strict) + "\n")


def report_json(results: list[CaseResult], config: RunConfig) -> dict[str, Any]:
    """The whole run as one JSON document."""
    passed, failed, skipped = summary_counts(results, config.strict)
    return {
        "daemon": config.label(),
        "config": {
            "timeout": config.timeout,
            "route_timeout": config.route_timeout,
            "strict": config.strict,
            "variables": config.variables,
        },
        "summary": {
            "passed": passed,
            "failed": failed,
            "skipped": skipped,
            "outcomes": dict(Counter(result.outcome for result in results)),
            "sections": {section: dict(counts) for section, counts in section_summary(results).items()},
        },
        "transcript_caps": {"head_entries": EXCHANGE_HEAD, "tail_entries": EXCHANGE_TAIL, "text_chars": TEXT_MAX},
        "cases": [_case_json(result) for result in results],
    }


def _case_json(result: CaseResult) -> dict[str, Any]:
    data = result.to_json()
    entries, cut = capped_exchange(result)
    data["exchange"] = [entry.to_json() for entry in entries]
    data["exchange_entries"] = len(result.exchange)
    data["exchange_entries_cut"] = cut
    data["expected"] = _cap_strings(data["expected"])
    data["received"] = _cap_strings(data["received"])
    return data


def write_json(results: list[CaseResult], config: RunConfig, path: Path) -> None:
    """Write :func:`report_json` to ``path``."""
    path.write_text(json.dumps(report_json(results, config), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def add_report_options(parser: argparse.ArgumentParser) -> None:
    """The options both suites' command lines share: the report files, --list and -v."""
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the full results as JSON")
    parser.add_argument("--junit", type=Path, metavar="FILE", help="write JUnit XML")
    parser.add_argument("--html", type=Path, metavar="FILE", help="write a self-contained HTML report")
    parser.add_argument("--list", action="store_true", help="list the selected cases and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="details of every case that is not OK")


def write_report_files(
    results: list[CaseResult], config: RunConfig, *, json_path: Optional[Path], junit_path: Optional[Path],
    html_path: Optional[Path],
) -> None:
    """Write each report a path is given for (the ``--json``, ``--junit`` and ``--html``
    options of both suites)."""
    if json_path:
        write_json(results, config, json_path)
    if junit_path:
        write_junit(results, config, junit_path)
    if html_path:
        write_html(results, config, html_path)


class ListedCase(Protocol):
    """What ``--list`` shows of a case: a daemon case or a peer case."""

    @property
    def section(self) -> str: ...
    @property
    def requirement(self) -> str: ...
    @property
    def id(self) -> str: ...
    @property
    def title(self) -> str: ...


def write_case_list(cases: Sequence[ListedCase], out: TextIO) -> None:
    """``--list``: section, requirement, id and title of each case, then the count."""
    for case in cases:
        print(f"{case.section:<6} {case.requirement:<13} {case.id:<44} {case.title}", file=out)
    print(f"{len(cases)} case(s)", file=out)


def _exchange_text(result: CaseResult) -> str:
    lines = []
    for entry in capped_exchange(result)[0]:
        arrow = {"send": "->", "recv": "<-", "note": "  ", "fail": "!!"}.get(entry.direction, "  ")
        lines.append(f"{entry.time:8.4f} {entry.conn:>6} {arrow} {entry.text}")
        if entry.hex:
            lines.append(f"{'':17}  {entry.hex}")
    return "\n".join(lines)


def write_junit(results: list[CaseResult], config: RunConfig, path: Path) -> None:
    """JUnit XML: one testsuite per case group, one testcase per case."""
    root = ET.Element("testsuites", name="jet-conformance")
    groups: dict[str, list[CaseResult]] = defaultdict(list)
    for result in results:
        groups[result.case.group].append(result)
    for group, members in groups.items():
        failures = sum(r.counts_as_failure(config.strict) for r in members)
        suite = ET.SubElement(
            root,
            "testsuite",
            name=group,
            tests=str(len(members)),
            failures=str(failures),
            errors="0",
            skipped=str(sum(r.outcome == SKIPPED for r in members)),
            time=f"{sum(r.duration for r in members):.3f}",
        )
        for result in members:
            case = result.case
            testcase = ET.SubElement(
                suite, "testcase", classname=f"conformance.{group}", name=case.id, time=f"{result.duration:.3f}"
            )
            ET.SubElement(testcase, "properties")
            props = testcase.find("properties")
            assert props is not None
            for name, value in (("section", case.section), ("requirement", case.requirement),
                                ("outcome", result.outcome)):
                ET.SubElement(props, "property", name=name, value=value)
            if result.counts_as_failure(config.strict):
                failure = ET.SubElement(testcase, "failure", message=result.reason, type=result.outcome)
                details = [f"PROTOCOL.md {case.section}: {case.quote}", result.reason]
                details += [f"expected: {json.dumps(_cap_strings(e), ensure_ascii=False)}" for e in result.expected]
                details += [f"received: {json.dumps(_cap_strings(r), ensure_ascii=False)}" for r in result.received]
                failure.text = "\n".join(details)
            elif result.outcome == SKIPPED:
                ET.SubElement(testcase, "skipped", message=result.reason)
            ET.SubElement(testcase, "system-out").text = _exchange_text(result)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}table{border-collapse:collapse;width:100%}
th,td{border-bottom:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f4f4f4;position:sticky;top:0}
tr.case{cursor:pointer}tr.case:hover{background:#f8f8ff}
.OK{color:#176c17;font-weight:600}.FAILED{color:#b00;font-weight:600}
.NON-STRICT{color:#b36b00;font-weight:600}.INFORMATIONAL{color:#246;font-weight:600}
.SKIPPED{color:#777;font-weight:600}
pre{background:#f7f7f7;padding:6px;overflow-x:auto;font-size:12px;margin:4px 0}
tr.detail td{background:#fcfcfc}.quote{font-style:italic;color:#444}
#controls{margin:1em 0}#controls label{margin-right:1em}
.summary td,.summary th{text-align:right}.summary td:first-child{text-align:left}
"""

_JS = """
function applyFilter(){
  var q=document.getElementById('q').value.toLowerCase();
  var on={};document.querySelectorAll('input.oc').forEach(function(b){on[b.value]=b.checked;});
  document.querySelectorAll('tr.case').forEach(function(r){
    var show=on[r.dataset.outcome]&&r.textContent.toLowerCase().indexOf(q)>=0;
    r.style.display=show?'':'none';
    var d=document.getElementById(r.dataset.detail);
    if(!show){d.style.display='none';}
  });
}
function toggle(r){var d=document.getElementById(r.dataset.detail);
  d.style.display=d.style.display==='none'?'':'none';}
"""


def write_html(results: list[CaseResult], config: RunConfig, path: Path) -> None:
    """One self-contained page (inline CSS and JS, nothing fetched): a summary per
    section, a filterable results table, and each case expandable to its exchange."""
    esc = html.escape
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>jet conformance</title>",
        f"<style>{_CSS}</style><script>{_JS}</script></head><body>",
        f"<h1>jet conformance: {esc(config.label())}</h1>",
        f"<p><b>{esc(summary_line(results, config.strict))}</b> &middot; route timeout "
        f"{config.route_timeout:g} s &middot; step timeout {config.timeout:g} s"
        f"{' &middot; strict' if config.strict else ''}</p>",
        "<table class='summary'><tr><th>section</th>" + "".join(f"<th>{o}</th>" for o in OUTCOMES) + "</tr>",
    ]
    for section, counts in section_summary(results).items():
        parts.append(
            f"<tr><td>{esc(section)}</td>"
            + "".join(f"<td class='{o if counts.get(o) else ''}'>{counts.get(o, 0)}</td>" for o in OUTCOMES)
            + "</tr>"
        )
    parts.append("</table>")
    parts.append("<div id='controls'><input id='q' placeholder='filter: id, section, text' "
                 "oninput='applyFilter()' size='40'> ")
    for outcome in OUTCOMES:
        parts.append(f"<label><input type='checkbox' class='oc' value='{outcome}' checked "
                     f"onchange='applyFilter()'> <span class='{outcome}'>{outcome}</span></label>")
    parts.append("</div><table><tr><th>outcome</th><th>section</th><th>case</th><th>level</th>"
                 "<th>title</th><th>time</th></tr>")
    for number, result in enumerate(results):
        case = result.case
        detail_id = f"d{number}"
        parts.append(
            f"<tr class='case' data-outcome='{result.outcome}' data-detail='{detail_id}' onclick='toggle(this)'>"
            f"<td class='{result.outcome}'>{result.outcome}</td><td>{esc(case.section)}</td>"
            f"<td>{esc(case.id)}</td><td>{esc(case.requirement)}</td><td>{esc(case.title)}</td>"
            f"<td>{result.duration:.2f}s</td></tr>"
        )
        body = [f"<p class='quote'>PROTOCOL.md {esc(case.section)}: &ldquo;{esc(case.quote)}&rdquo;</p>"]
        if case.notes:
            body.append(f"<p>{esc(case.notes)}</p>")
        if result.reason:
            body.append(f"<p><b>{esc(result.reason)}</b></p>")
        for expected in result.expected:
            body.append(f"<pre>expected: {esc(json.dumps(_cap_strings(expected), ensure_ascii=False))}</pre>")
        for received in result.received:
            body.append(f"<pre>received: {esc(json.dumps(_cap_strings(received), ensure_ascii=False))}</pre>")
        body.append(f"<p>source {esc(case.source)}, key namespace <code>{esc(result.namespace)}</code></p>")
        body.append(f"<pre>{esc(_exchange_text(result))}</pre>")
        parts.append(f"<tr class='detail' id='{detail_id}' style='display:none'><td colspan='6'>"
                     + "".join(body) + "</td></tr>")
    parts.append("</table></body></html>\n")
    path.write_text("".join(parts), encoding="utf-8")


# Keep the outcome names importable from here for report consumers.
OUTCOME_NAMES = (OK, NON_STRICT, FAILED, INFORMATIONAL, SKIPPED)
