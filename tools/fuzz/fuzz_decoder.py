"""atheris fuzz harness for the jetwire stream decoder and the event-log reader.

OSS-Fuzz shape: :func:`TestOneInput` takes one input; ``main`` hands it to atheris.

    python -m tools.fuzz.fuzz_decoder --make-corpus corpus/      # seeds from spec/vectors
    python -m tools.fuzz.fuzz_decoder corpus/ -max_total_time=300  # fuzz (needs atheris)
    python -m tools.fuzz.fuzz_decoder --replay corpus/             # run inputs, no atheris

What one input checks:

- fed to a :class:`jetwire.Decoder` in chunks (size and ``max_body`` taken from the
  first two bytes), nothing but :class:`jetwire.RemoteProtocolError` escapes, the
  decoder always makes progress and never buffers more than one frame it waits for;
- every frame it accepts re-encodes to exactly its own bytes (the format is canonical),
  and the construct schema accepts exactly the frames the fast path accepts;
- ``Decoder.messages()`` (inline fast path) and ``Decoder.next_message()`` (careful
  parsers) give the same messages and errors;
- fed to a :class:`jetwire.log.LogReader` (after a valid header, and raw), nothing but
  RemoteProtocolError escapes and the reported offsets tile the input.

atheris is not a dependency of jet: ``pip install atheris`` to fuzz. Without it this
module still imports, builds the corpus and replays inputs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jetwire import Decoder
from jetwire import RemoteProtocolError
from jetwire import decode_body
from jetwire import encode
from jetwire.log import Corruption
from jetwire.log import LogHeader
from jetwire.log import LogReader
from jetwire.log import LogRecord
from jetwire.log import Truncation
from jetwire.log import encode_header
from jetwire.schema import parse_frame

_MAX_BODIES = (0, 16, 64, 1024, 1 << 20)
_LOG_HEADER = encode_header(LogHeader("fuzz", 0))


class HarnessFailure(AssertionError):
    """An invariant of the decoders does not hold for this input."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise HarnessFailure(message)


def _fuzz_decoder(data: bytes, step: int, max_body: int) -> None:
    decoder = Decoder(max_body=max_body)
    calls = 0
    for start in range(0, len(data), step):
        decoder.receive_data(data[start : start + step])
        while True:
            calls += 1
            _check(calls <= 2 * len(data) + 10, "the decoder does not make progress")
            try:
                frame = decoder.next_frame()
            except RemoteProtocolError as exc:
                _check(exc.fatal, "next_frame() raised a non-fatal error")
                return
            if frame is None:
                break
            ftype, body = frame
            raw = bytes((ftype,)) + len(body).to_bytes(4, "big") + body
            try:
                message = decode_body(ftype, body)
            except RemoteProtocolError as fast_error:
                try:
                    parse_frame(raw)
                except RemoteProtocolError:
                    if fast_error.fatal:
                        return
                    continue
                raise HarnessFailure(f"schema accepts a frame the fast path rejects: {raw.hex()}") from None
            _check(encode(message) == raw, f"re-encoding changes the frame {raw.hex()}")
            try:
                parse_frame(raw)
            except RemoteProtocolError:
                raise HarnessFailure(f"schema rejects a frame the fast path accepts: {raw.hex()}") from None
        _check(decoder.buffered <= 5 + max_body + step, "the decoder buffers beyond one frame")
    # messages() parses common frames inline, next_message() through the careful
    # parsers: on the same bytes they must give the same messages and errors.
    _check(
        _outcomes(data, max_body, generator=True) == _outcomes(data, max_body, generator=False),
        "messages() and next_message() disagree",
    )


def _outcomes(data: bytes, max_body: int, *, generator: bool) -> list[object]:
    decoder = Decoder(max_body=max_body)
    decoder.receive_data(data)
    out: list[object] = []
    for _ in range(len(data) + 2):  # each round consumes a frame or ends
        try:
            if generator:
                out.extend(decoder.messages())
                return out
            message = decoder.next_message()
            if message is None:
                return out
            out.append(message)
        except RemoteProtocolError as exc:
            out.append((str(exc), exc.status, exc.fatal, exc.request_id, exc.frame_type))
            if exc.fatal:
                return out
    raise HarnessFailure("the decoder does not make progress")


def _fuzz_log(data: bytes, step: int) -> None:
    for prefix in (_LOG_HEADER, b""):
        reader = LogReader(max_record=4096)
        stream = prefix + data
        items: list[object] = []
        try:
            for start in range(0, len(stream), step):
                reader.feed(stream[start : start + step])
                items.extend(reader.items())
            reader.feed_eof()
            items.extend(reader.items())
        except RemoteProtocolError:
            continue
        # Records, damage and truncation reports cover the file after its header,
        # in order and without gaps or overlaps.
        position = items[0].size if items and isinstance(items[0], LogHeader) else 0
        for item in items[1:]:
            if isinstance(item, LogRecord):
                _check(item.offset == position, f"record at {item.offset}, expected {position}")
                position += 10 + 13 + len(item.data)
            elif isinstance(item, Corruption):
                _check(item.offset == position and item.length > 0, "corruption report out of place")
                position += item.length
            elif isinstance(item, Truncation):
                _check(item.offset == position, "truncation report out of place")
                position += item.present
        _check(position == len(stream), f"reports end at {position} of {len(stream)}")


def TestOneInput(data: bytes) -> None:  # the name OSS-Fuzz and atheris expect
    """Run every check on one input; raise only for a real defect."""
    if len(data) < 2:
        return
    step = 1 + data[0] % 64
    max_body = _MAX_BODIES[data[1] % len(_MAX_BODIES)]
    body = data[2:]
    _fuzz_decoder(body, step, max_body)
    _fuzz_log(body, step)


def make_corpus(directory: Path) -> int:
    """Write one seed per vector (frames and log files) into ``directory``; returns the
    number written. Each seed is prefixed with the two control bytes TestOneInput reads
    (whole-ish chunks, default maximum body)."""
    from tools.vectors import load

    directory.mkdir(parents=True, exist_ok=True)
    count = 0
    sources = [
        ("valid", load("frames-valid.json")["vectors"]),
        ("invalid", load("frames-invalid.json")["vectors"]),
        ("incomplete", load("frames-invalid.json")["incomplete"]),
        ("jetlog", load("jetlog.json")["files"]),
        ("jetlog-invalid", load("jetlog.json")["invalid_files"]),
    ]
    for group, vectors in sources:
        for vector in vectors:
            raw = bytes.fromhex(vector["hex"])
            if len(raw) > 8192:
                continue  # libFuzzer's default -max_len is 4096; keep seeds small
            if group.startswith("jetlog"):
                # The harness puts its own header first; also seed the body alone.
                raw = raw[len(_LOG_HEADER) :] if raw.startswith(_LOG_HEADER) else raw
            (directory / f"{group}-{vector['name']}").write_bytes(bytes((63, 4)) + raw)
            count += 1
    return count


def replay(paths: list[Path]) -> int:
    """Run TestOneInput on every file under ``paths``; returns the number of failures."""
    failures = 0
    files = [f for p in paths for f in (sorted(p.rglob("*")) if p.is_dir() else [p]) if f.is_file()]
    for path in files:
        try:
            TestOneInput(path.read_bytes())
        except Exception as exc:  # report every defect, not just the first
            failures += 1
            print(f"FAIL {path}: {type(exc).__name__}: {exc}", file=sys.stderr)
    print(f"replayed {len(files)} inputs, {failures} failures")
    return failures


def main(argv: list[str] | None = None) -> int:
    """Command line: make the corpus, replay inputs, or hand over to atheris."""
    args = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="jetwire decoder fuzz harness", add_help=True)
    parser.add_argument("--make-corpus", type=Path, metavar="DIR", help="write seeds from spec/vectors")
    parser.add_argument("--replay", type=Path, nargs="+", metavar="PATH", help="run inputs without atheris")
    known, rest = parser.parse_known_args(args)
    if known.make_corpus:
        print(f"wrote {make_corpus(known.make_corpus)} seeds to {known.make_corpus}")
        return 0
    if known.replay:
        return 1 if replay(known.replay) else 0
    try:
        import atheris
    except ImportError:
        print("atheris is not installed (pip install atheris); skipping the fuzz run. "
              "--make-corpus and --replay work without it.")
        return 0
    # Coverage feedback: instrument the bytecode of everything loaded (jetwire above all).
    atheris.instrument_all()
    atheris.Setup([sys.argv[0], *rest], TestOneInput)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
