"""jetdump: a Wireshark-style decoder of jet traffic, a live tap, and stats.

Inputs: pcap/pcapng captures from files or pipes (``-``, or stdin when no input is
given; TCP reassembled per direction; jet streams found by port, or when either direction
starts with an INFO or a plausible frame), live capture (``-i IFACE`` through dumpcap or
tcpdump), jet event-log segments (a file, a directory or a glob), raw bytes of one
direction (``--raw FILE``) and hex (``--hex``); live, ``jetdump tap --listen PORT
--upstream HOST:PORT``.

Output: one summary line per frame (default), the field tree with byte offsets (``-V``),
a hex dump (``-x``), JSON (``--json``), statistics (``--stats``). Exit status: 0, or 1
when an input could not be read at all, 2 on a usage error, 3 when event-log input was
damaged (a segment with a damaged header skipped, or damaged records) but decoded around.

JSON output (``--json``), one object per line; these names are stable:

  record         "frame" or "note"
  frame          frame number from 1 over the whole input (stable under filters)
  kind           "frame", "malformed" or "truncated"
  time           seconds since the first packet/record (null for raw and hex input)
  timestamp      seconds since the Unix epoch (null for raw and hex input)
  stream         connection number (captures: as Wireshark's tcp.stream; logs: conn id)
  direction      0 from the side that opened the connection (peer), 1 towards it
  src, dst       sender and receiver ("host:port", or "cN" / daemon name for logs)
  packet         captures: the number (from 1, as in Wireshark) of the packet that
                 completed the frame
  stream_offset  byte offset of the frame in its direction (logs: the record's offset)
  size           bytes of the frame present, header included
  type           REQUEST, RESPONSE, EVENT or INFO (0xNN if unknown)
  length         the header's body length
  id             request id (REQUEST, RESPONSE)
  function       REQUEST function name
  code           EVENT code name (SET_STATE, FETCH_CHANGE, CLOSE, ...)
  entry_kind     QUERY_ENTRY's entry kind: STATE, METHOD or NODE (PROTOCOL.md 14.4);
                 ``kind`` always stays the record's kind
  status         RESPONSE or CLOSE status name
  key, key_length, prefix, prefix_length, message, message_length, fetch_id
  value_type     value type name (0xNN for application types)
  value_length   the value's data length
  value          the value decoded where its type allows: null, bool, int, float
                 ("NaN"/"Infinity"/"-Infinity"), text, parsed JSON; absent for BYTES,
                 CBOR, MSGPACK, application types and undecodable data
  value_hex      the value's data bytes in hex
  major, minor, max_body, features, name, name_length   INFO fields
  user, user_length, password_length   AUTHENTICATE fields
  password       always "********": jetdump never shows a password (PROTOCOL.md 6.12)
  offsets        {field: [byte offset in the frame, length]} for every field present
  request        for a RESPONSE whose request is in view: {frame, function, key}
  rtt_ms         milliseconds from that request to this response (null if untimed)
  error          why a frame is malformed or truncated
  bytes          hex of a malformed/truncated frame, as much as was present (at most
                 256 bytes from a header that lost the frame boundary)
  announced      bytes a truncated frame's header announced (header included)
  schema_error   the construct schema rejects a frame the fast codec accepted (a bug)
  note, text     for notes: their kind (gap, resync, stopped, not-jet, snaplen,
                 capture-truncated, log-damage, log-truncated, conn-open, conn-close, route,
                 dropped, ...) and their text; a gap note also has the ``packet`` that
                 showed the loss
"""

from __future__ import annotations

# First, before any module of this package: with JET_PURE_PYTHON=1 a compiled install's
# capture, dissector, packets and events modules run from source (jetwire/_pure.py).
import jetwire._pure  # noqa: F401
