// jet.js: a jet peer for browsers and Node.js (spec/PROTOCOL.md, protocol 1.1), one ES module.
//
// The codec (Value, encode, Decoder) follows spec/PROTOCOL.md and is checked against every
// vector of spec/vectors/; messages are plain objects with the field names of those
// vectors. The Peer mirrors the Python asyncio peer (peer/aio.py): states, methods,
// set/call/get, fetch with events, queries (PROTOCOL.md 14), typed errors, CLOSE,
// authentication, reconnect with restore. Transports: WebSocket (PROTOCOL.md 13; the
// browser's WebSocket, Node's global one, or the `ws` package) and, in Node.js, TCP
// through `node:net`.
//
// Example:
//   import { Peer, field } from "./jet.js";
//   const peer = await Peer.connect("ws://127.0.0.1:8080/jet", { name: "demo", reconnect: true });
//   const temp = await peer.addState("plant/temp", 21.5, { onSet: (v) => Math.min(v, 30) });
//   console.log(await peer.set("plant/temp", 42));        // 30: the owner clamped it
//   await peer.fetch("plant/", (ev) => console.log(ev.kind, ev.key, ev.value));
//   await peer.fetch({ prefix: "players/", sortBy: "score", descending: true, top: 10,
//                      where: [field("gender").eq("female")] }, (ev) => console.log(ev.rows));

// --- codes (PROTOCOL.md 3, 4, 6, 7, 8) ---------------------------------------------------

/** Frame types (PROTOCOL.md 3). */
export const FrameType = Object.freeze({ REQUEST: 1, RESPONSE: 2, EVENT: 3, INFO: 4 });
/** Functions (PROTOCOL.md 6). */
export const FunctionCode = Object.freeze({
  ADD_STATE: 1, REMOVE_STATE: 2, SET_STATE: 3, NOTIFY_STATE: 4, CALL_METHOD: 5,
  ADD_METHOD: 6, REMOVE_METHOD: 7, FETCH_STATES: 8, UNFETCH: 9, GET_STATE: 10,
  FETCH_QUERY: 0x0b, QUERY_ONCE: 0x0c, // PROTOCOL.md 14 (protocol 1.1)
  AUTHENTICATE: 0x10, // PROTOCOL.md 6.12 (protocol 1.1)
});
/** Event codes (PROTOCOL.md 7). */
export const EventCode = Object.freeze({
  SET_STATE: 0x03, NOTIFY_STATE: 0x04, CALL_METHOD: 0x05,
  FETCH_ADD: 0x81, FETCH_CHANGE: 0x82, FETCH_REMOVE: 0x83,
  FETCH_UNMATCH: 0x84, FETCH_METHOD: 0x85, FETCH_NODE: 0x86, FETCH_WINDOW: 0x87, QUERY_ENTRY: 0x88, // PROTOCOL.md 14.2, 14.4
  CLOSE: 0xf0,
});
/** Status codes (PROTOCOL.md 8). */
export const Status = Object.freeze({
  OK: 0, NOT_FOUND: 1, ALREADY_EXISTS: 2, NOT_OWNER: 3, REJECTED: 4, TIMEOUT: 5, OWNER_GONE: 6,
  MALFORMED: 7, UNKNOWN_FUNCTION: 8, TOO_LARGE: 9, LIMIT_EXCEEDED: 10, WRONG_KIND: 11,
  INTERNAL: 12, OVERLOADED: 13, AUTH_FAILED: 14, NOT_AUTHORIZED: 15, // 14, 15: PROTOCOL.md 15
  INVALID_QUERY: 16, // PROTOCOL.md 14.6
});
/** Value types (PROTOCOL.md 5.3); 0x80..0xFF are application-defined. */
export const ValueType = Object.freeze({
  NONE: 0, BOOL: 1, INT64: 2, FLOAT64: 3, STRING: 4, JSON: 5, BYTES: 6, CBOR: 7, MSGPACK: 8,
});
/** Feature bits of INFO (PROTOCOL.md 4.4). */
export const FEATURE_CONFLATION = 0x1;
/** The daemon answers queries (PROTOCOL.md 14). */
export const FEATURE_QUERIES = 0x2;
/** The daemon enforces permissions (PROTOCOL.md 15). */
export const FEATURE_AUTH_REQUIRED = 0x4;
/** The daemon announces its limits on request; in a peer's INFO: the request (PROTOCOL.md 4.4.1). */
export const FEATURE_LIMITS = 0x8;
export const PROTOCOL_MAJOR = 1;
export const PROTOCOL_MINOR = 2;
export const DEFAULT_MAX_BODY = 1048576;
export const DEFAULT_PORT = 11124;
export const DEFAULT_TIMEOUT = 10000; // ms; longer than jetd's route timeout (5 s)
/** PROTOCOL.md 13.2: at most this many bytes of payload per WebSocket message. */
export const WS_MESSAGE_LIMIT = 1048576;

const HEADER = 5;
const nameOf = (table, code) => Object.keys(table).find((k) => table[k] === code);
const FUNCTION_NAMES = Object.fromEntries(Object.entries(FunctionCode).map(([k, v]) => [v, k]));
const EVENT_NAMES = Object.fromEntries(Object.entries(EventCode).map(([k, v]) => [v, k]));
const STATUS_NAMES = Object.fromEntries(Object.entries(Status).map(([k, v]) => [v, k]));
const MAX_STATUS = 0x10;

/** Query codes (PROTOCOL.md 14.1). */
export const PathOp = Object.freeze({
  STARTS_WITH: 1, ENDS_WITH: 2, CONTAINS: 3, EQUALS: 4, EQUALS_ONE_OF: 5, CONTAINS_ALL_OF: 6,
});
export const FilterOp = Object.freeze({ EQ: 1, NE: 2, LT: 3, LE: 4, GT: 5, GE: 6, IS_TYPE: 7 });
export const SortBy = Object.freeze({ NONE: 0, KEY: 1, VALUE: 2, FIELD: 3 });
/** Type codes of an IS_TYPE operand (PROTOCOL.md 14.1). */
export const TypeCode = Object.freeze({ NULL: 0, BOOL: 1, NUMBER: 2, STRING: 3, BYTES: 4, ARRAY: 5, OBJECT: 6 });
/** FETCH_METHOD / FETCH_NODE actions (PROTOCOL.md 14.2) and QUERY_ENTRY kinds (14.4). */
export const Action = Object.freeze({ ADD: 1, REMOVE: 2 });
export const EntryKind = Object.freeze({ STATE: 1, METHOD: 2, NODE: 3 });
export const QUERY_METHODS = 0x01;
export const QUERY_NODES = 0x02;
export const MATCH_NOT = 0x01;
export const MATCH_IGNORE_CASE = 0x02;
export const SORT_DESCENDING = 0x01;
const invert = (table) => Object.fromEntries(Object.entries(table).map(([k, v]) => [v, k]));
const PATH_OP_NAMES = invert(PathOp);
const FILTER_OP_NAMES = invert(FilterOp);
const SORT_BY_NAMES = invert(SortBy);
const ACTION_NAMES = invert(Action);
const ENTRY_KIND_NAMES = invert(EntryKind);

/** @param {number} status @returns {string} the status's name, or its number in hex. */
export function statusName(status) {
  return STATUS_NAMES[status] ?? `0x${status.toString(16).padStart(2, "0")}`;
}

// --- errors -------------------------------------------------------------------------------

/** Base of every error jet raises. */
export class JetError extends Error {}

/** The other side sent bytes that do not follow the protocol (a decoder error).
 *  `fatal`: the stream cannot be trusted (PROTOCOL.md 9.2, 9.3); `requestId`: the id of a
 *  REQUEST or RESPONSE whose body has at least 4 bytes, else null; `frameType`: the
 *  frame's type name, or its type byte when unknown. */
export class ProtocolError extends JetError {
  /** @param {number} status @param {string} message @param {{fatal?: boolean, requestId?: number|null, frameType?: string|number|null}} [info] */
  constructor(status, message, info = {}) {
    super(`${statusName(status)}: ${message}`);
    this.name = "ProtocolError";
    this.status = status;
    this.reason = message;
    this.fatal = info.fatal ?? false;
    this.requestId = info.requestId ?? null;
    this.frameType = info.frameType ?? null;
  }
}

/** A request did not succeed; `status` is its status (null for a connection closed without
 *  a CLOSE), `reason` the message from the daemon, the owner, or this peer. */
export class PeerError extends JetError {
  /** @param {string} [message] @param {number|null} [status] */
  constructor(message = "", status) {
    const s = status === undefined ? /** @type {any} */ (new.target).defaultStatus : status;
    super(s === null || s === undefined ? message : message ? `${statusName(s)}: ${message}` : statusName(s));
    this.name = new.target.name;
    /** @type {number|null} */
    this.status = s ?? null;
    this.reason = message;
  }
}
PeerError.defaultStatus = Status.INTERNAL;

const errorClass = (name, status) => {
  const cls = { [name]: class extends PeerError {} }[name];
  cls.defaultStatus = status;
  return cls;
};
export const NotFound = errorClass("NotFound", Status.NOT_FOUND);
export const AlreadyExists = errorClass("AlreadyExists", Status.ALREADY_EXISTS);
export const NotOwner = errorClass("NotOwner", Status.NOT_OWNER);
export const Rejected = errorClass("Rejected", Status.REJECTED);
export const Timeout = errorClass("Timeout", Status.TIMEOUT);
export const OwnerGone = errorClass("OwnerGone", Status.OWNER_GONE);
export const Malformed = errorClass("Malformed", Status.MALFORMED);
export const UnknownFunction = errorClass("UnknownFunction", Status.UNKNOWN_FUNCTION);
export const TooLarge = errorClass("TooLarge", Status.TOO_LARGE);
export const LimitExceeded = errorClass("LimitExceeded", Status.LIMIT_EXCEEDED);
export const WrongKind = errorClass("WrongKind", Status.WRONG_KIND);
export const Internal = errorClass("Internal", Status.INTERNAL);
export const Overloaded = errorClass("Overloaded", Status.OVERLOADED);
export const AuthFailed = errorClass("AuthFailed", Status.AUTH_FAILED);
export const NotAuthorized = errorClass("NotAuthorized", Status.NOT_AUTHORIZED);
export const InvalidQuery = errorClass("InvalidQuery", Status.INVALID_QUERY);
/** The connection is closed or lost; `status` is the status of the daemon's CLOSE if it sent one. */
export const ConnectionClosed = errorClass("ConnectionClosed", null);

const BY_STATUS = new Map(
  [NotFound, AlreadyExists, NotOwner, Rejected, Timeout, OwnerGone, Malformed, UnknownFunction,
    TooLarge, LimitExceeded, WrongKind, Internal, Overloaded, AuthFailed, NotAuthorized, InvalidQuery].map((c) => [c.defaultStatus, c]),
);

/** The typed error for a non-OK status (Internal for OK or an unknown byte).
 *  @param {number} status @param {string} [message] @returns {PeerError} */
export function errorForStatus(status, message = "") {
  const cls = BY_STATUS.get(status);
  if (cls) return new cls(message);
  return new Internal(`failure reported with status ${statusName(status)}: ${message}`);
}

// --- values (PROTOCOL.md 5.3) --------------------------------------------------------------

const utf8Encoder = new TextEncoder();
const utf8Strict = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** @param {Uint8Array} bytes @returns {string|null} the text, or null if not valid UTF-8 */
function utf8OrNull(bytes) {
  try {
    return utf8Strict.decode(bytes);
  } catch {
    return null;
  }
}

/** One jet value: a type byte and its data bytes. Use `Value.of(x)` to map from JavaScript
 *  and `value.toJS()` (or a FetchEvent's `value`) to map back. */
export class Value {
  /** @param {number} vtype @param {Uint8Array} [data] */
  constructor(vtype, data = new Uint8Array(0)) {
    this.vtype = vtype;
    this.data = data;
  }

  /** Map a JavaScript value: null/undefined -> NONE, boolean -> BOOL, bigint -> INT64,
   *  number -> FLOAT64, string -> STRING, Uint8Array/ArrayBuffer -> BYTES, a Value as is,
   *  any other object (array, plain object) -> JSON.
   *  @param {any} x @returns {Value} */
  static of(x) {
    if (x instanceof Value) return x;
    if (x === null || x === undefined) return new Value(ValueType.NONE);
    switch (typeof x) {
      case "boolean":
        return new Value(ValueType.BOOL, Uint8Array.of(x ? 1 : 0));
      case "bigint":
        return Value.int64(x);
      case "number":
        return Value.float64(x);
      case "string":
        return new Value(ValueType.STRING, utf8Encoder.encode(x));
      default:
    }
    if (x instanceof Uint8Array) return new Value(ValueType.BYTES, x);
    if (x instanceof ArrayBuffer) return new Value(ValueType.BYTES, new Uint8Array(x));
    if (typeof x === "object") return Value.json(x);
    throw new TypeError(`no jet mapping for a ${typeof x}`);
  }

  /** @param {bigint|number} n @returns {Value} an INT64 */
  static int64(n) {
    const big = BigInt(n);
    if (big < -(2n ** 63n) || big >= 2n ** 63n) throw new RangeError(`${big} does not fit INT64`);
    const data = new Uint8Array(8);
    new DataView(data.buffer).setBigInt64(0, big);
    return new Value(ValueType.INT64, data);
  }

  /** @param {number} x @returns {Value} a FLOAT64 */
  static float64(x) {
    const data = new Uint8Array(8);
    new DataView(data.buffer).setFloat64(0, x);
    return new Value(ValueType.FLOAT64, data);
  }

  /** @param {any} document @returns {Value} a JSON value (JSON.stringify of `document`) */
  static json(document) {
    const text = JSON.stringify(document);
    if (text === undefined) throw new TypeError("no JSON text for this value");
    return new Value(ValueType.JSON, utf8Encoder.encode(text));
  }

  /** The JavaScript form: null, boolean, bigint (INT64), number, string, the parsed JSON,
   *  Uint8Array (BYTES); CBOR, MSGPACK and application types come back as the Value.
   *  @throws {Malformed} for a JSON value that does not parse */
  toJS() {
    const { vtype, data } = this;
    switch (vtype) {
      case ValueType.NONE:
        return null;
      case ValueType.BOOL:
        return data[0] === 1;
      case ValueType.INT64:
        return new DataView(data.buffer, data.byteOffset, 8).getBigInt64(0);
      case ValueType.FLOAT64:
        return new DataView(data.buffer, data.byteOffset, 8).getFloat64(0);
      case ValueType.STRING:
        return utf8Strict.decode(data);
      case ValueType.JSON: {
        const text = utf8OrNull(data);
        if (text === null) throw new Malformed("JSON value is not valid UTF-8");
        try {
          return JSON.parse(text);
        } catch (e) {
          throw new Malformed(`JSON value does not parse: ${e instanceof Error ? e.message : e}`);
        }
      }
      case ValueType.BYTES:
        return data;
      default:
        return this;
    }
  }

  /** @param {Value} other */
  equals(other) {
    if (!(other instanceof Value) || other.vtype !== this.vtype || other.data.length !== this.data.length) return false;
    return this.data.every((b, i) => b === other.data[i]);
  }

  /** The value's type name: NONE ... MSGPACK, or APPLICATION. */
  get typeName() {
    return this.vtype >= 0x80 ? "APPLICATION" : nameOf(ValueType, this.vtype) ?? "RESERVED";
  }

  toString() {
    try {
      const js = this.toJS();
      if (js instanceof Value || js instanceof Uint8Array) return `${this.typeName}(${this.data.length} bytes)`;
      if (typeof js === "bigint") return `${js}`;
      return this.vtype === ValueType.JSON ? new TextDecoder().decode(this.data) : JSON.stringify(js);
    } catch {
      return `${this.typeName}(invalid)`;
    }
  }
}

/** Why (vtype, data) is not a well-formed value, or null (PROTOCOL.md 5.3). */
function valueProblem(vtype, data) {
  if (vtype >= 0x09 && vtype <= 0x7f) return `reserved value type 0x${vtype.toString(16)}`;
  const width = { 0: 0, 1: 1, 2: 8, 3: 8 }[vtype];
  if (width !== undefined && data.length !== width) return `${nameOf(ValueType, vtype)} value must be ${width} bytes, got ${data.length}`;
  if (vtype === ValueType.BOOL && data[0] > 1) return `BOOL value must be 0x00 or 0x01, got ${data[0]}`;
  if (vtype === ValueType.STRING && utf8OrNull(data) === null) return "STRING value is not valid UTF-8";
  return null;
}

// --- encoding -------------------------------------------------------------------------------

class Writer {
  constructor(size) {
    this.bytes = new Uint8Array(size);
    this.view = new DataView(this.bytes.buffer);
    this.pos = 0;
  }
  u8(n) { this.view.setUint8(this.pos, n); this.pos += 1; }
  u16(n) { this.view.setUint16(this.pos, n); this.pos += 2; }
  u32(n) { this.view.setUint32(this.pos, n); this.pos += 4; }
  raw(b) { this.bytes.set(b, this.pos); this.pos += b.length; }
  str16(b) { this.u16(b.length); this.raw(b); }
  value(v) { this.u8(v.vtype); this.u32(v.data.length); this.raw(v.data); }
}

const textBytes = (s, what) => {
  const b = utf8Encoder.encode(s ?? "");
  if (b.length > 0xffff) throw new TooLarge(`${what} longer than 65535 UTF-8 bytes`);
  return b;
};
const keyBytes = (key) => {
  if (typeof key !== "string" || key.length === 0) throw new TypeError("a key is a non-empty string");
  return textBytes(key, "key");
};
const asValue = (v) => (v instanceof Value ? v : Value.of(v));
const codeOf = (table, x, what) => {
  const code = typeof x === "number" ? x : table[x];
  if (code === undefined || !Number.isInteger(code) || code < 0 || code > 0xff) throw new TypeError(`unknown ${what} ${x}`);
  return code;
};
const u8Of = (n, what) => {
  if (!Number.isInteger(n) || n < 0 || n > 0xff) throw new RangeError(`${what} must be an integer 0..255, got ${n}`);
  return n;
};
const u32Of = (n, what) => {
  if (!Number.isInteger(n) || n < 0 || n > 0xffffffff) throw new RangeError(`${what} must be an integer 0..2**32-1, got ${n}`);
  return n;
};

/** The parts of a Query (PROTOCOL.md 14.1), in the object form of spec/vectors:
 *  `{flags, matchers: [{op, flags, operands}], filters: [{op, flags, field, value}],
 *  sort_by, sort_flags, sort_field, from, to}` (ops by name or code).
 *  @param {any} q @returns {Array<[string, any]>} */
function queryParts(q) {
  const matchers = q.matchers ?? [];
  const filters = q.filters ?? [];
  if (matchers.length > 0xff || filters.length > 0xff) throw new RangeError("a query has at most 255 matchers and 255 filters");
  /** @type {Array<[string, any]>} */
  const parts = [["u8", u8Of(q.flags ?? 0, "query flags")], ["u8", matchers.length]];
  for (const mt of matchers) {
    const operands = mt.operands ?? [];
    if (operands.length > 0xff) throw new RangeError("a path matcher has at most 255 operands");
    parts.push(["u8", codeOf(PathOp, mt.op, "path matcher op")], ["u8", u8Of(mt.flags ?? 0, "matcher flags")], ["u8", operands.length]);
    for (const o of operands) {
      if (typeof o !== "string") throw new TypeError("a matcher operand is a string");
      parts.push(["str16", textBytes(o, "matcher operand")]);
    }
  }
  parts.push(["u8", filters.length]);
  for (const f of filters) {
    parts.push(["u8", codeOf(FilterOp, f.op, "value filter op")], ["u8", u8Of(f.flags ?? 0, "filter flags")],
      ["str16", textBytes(f.field ?? "", "filter field")], ["value", asValue(f.value)]);
  }
  parts.push(["u8", codeOf(SortBy, q.sort_by ?? "NONE", "sort_by")], ["u8", u8Of(q.sort_flags ?? 0, "sort flags")],
    ["str16", textBytes(q.sort_field ?? "", "sort field")], ["u32", u32Of(q.from ?? 0, "from")], ["u32", u32Of(q.to ?? 0, "to")]);
  return parts;
}

/** Encode one message (the object form of spec/vectors) into one frame.
 *  @param {any} m @returns {Uint8Array} */
export function encode(m) {
  /** @type {Array<[string, any]>} */
  const parts = [];
  let type;
  switch (m.type) {
    case "REQUEST": {
      type = FrameType.REQUEST;
      const fn = FunctionCode[m.function];
      if (fn === undefined) throw new TypeError(`unknown function ${m.function}`);
      parts.push(["u32", m.id >>> 0], ["u8", fn]);
      if (fn === FunctionCode.FETCH_STATES) parts.push(["str16", textBytes(m.prefix, "prefix")]);
      else if (fn === FunctionCode.FETCH_QUERY || fn === FunctionCode.QUERY_ONCE) parts.push(...queryParts(m.query));
      else if (fn === FunctionCode.UNFETCH) parts.push(["u32", m.fetch_id]);
      else if (fn === FunctionCode.AUTHENTICATE) {
        parts.push(["str16", keyBytes(m.user)], ["str16", textBytes(m.password ?? "", "password")]);
      } else {
        parts.push(["str16", keyBytes(m.key)]);
        if ([1, 3, 4, 5].includes(fn)) parts.push(["value", asValue(m.value)]);
      }
      break;
    }
    case "RESPONSE": {
      type = FrameType.RESPONSE;
      const status = typeof m.status === "number" ? m.status : Status[m.status];
      parts.push(["u32", m.id >>> 0], ["u8", status]);
      if (status !== Status.OK) parts.push(["str16", textBytes(m.message, "message")]);
      else if (m.payload === "fetch_id") parts.push(["u32", m.fetch_id]);
      else if (m.payload === "value" || (m.payload === undefined && m.value !== undefined)) parts.push(["value", asValue(m.value)]);
      break;
    }
    case "EVENT": {
      type = FrameType.EVENT;
      const code = EventCode[m.code];
      if (code === undefined) throw new TypeError(`unknown event code ${m.code}`);
      parts.push(["u8", code]);
      if (code === EventCode.CLOSE) {
        const status = typeof m.status === "number" ? m.status : Status[m.status];
        parts.push(["u8", status], ["str16", textBytes(m.message, "message")]);
      } else if (code === EventCode.FETCH_METHOD || code === EventCode.FETCH_NODE) {
        parts.push(["u32", u32Of(m.fetch_id, "fetch_id")], ["u8", codeOf(Action, m.action, "action")], ["str16", keyBytes(m.key)]);
      } else if (code === EventCode.FETCH_WINDOW) {
        const entries = m.entries ?? [];
        if (entries.length > 0xffff) throw new RangeError("a FETCH_WINDOW carries at most 65535 entries");
        parts.push(["u32", u32Of(m.fetch_id, "fetch_id")], ["u32", u32Of(m.size, "size")], ["u16", entries.length]);
        for (const e of entries) parts.push(["u32", u32Of(e.index, "index")], ["str16", keyBytes(e.key)], ["value", asValue(e.value)]);
      } else if (code === EventCode.QUERY_ENTRY) {
        parts.push(["u32", u32Of(m.request_id, "request_id")], ["u8", codeOf(EntryKind, m.kind, "entry kind")],
          ["str16", keyBytes(m.key)], ["value", asValue(m.value ?? null)]);
      } else {
        if (code >= 0x81) parts.push(["u32", m.fetch_id]);
        parts.push(["str16", keyBytes(m.key)], ["value", asValue(m.value)]);
      }
      break;
    }
    case "INFO":
      type = FrameType.INFO;
      parts.push(["u8", m.major ?? PROTOCOL_MAJOR], ["u8", m.minor ?? PROTOCOL_MINOR], ["u32", m.max_body ?? DEFAULT_MAX_BODY],
        ["u32", m.features ?? 0], ["str16", textBytes(m.name, "name")]);
      if (m.max_key_length != null || m.route_timeout_ms != null) {
        // PROTOCOL.md 4.4.1: the limits extension, both fields or neither.
        if (m.max_key_length == null || m.route_timeout_ms == null) throw new TypeError("INFO limits need max_key_length and route_timeout_ms");
        parts.push(["u16", m.max_key_length], ["u32", m.route_timeout_ms]);
      }
      break;
    default:
      throw new TypeError(`unknown message type ${m.type}`);
  }
  const size = parts.reduce((n, [kind, x]) => n + ({ u8: 1, u16: 2, u32: 4 }[kind] ?? (kind === "str16" ? 2 + x.length : 5 + x.data.length)), 0);
  if (size > 0xffffffff) throw new TooLarge("body longer than 2**32 - 1 bytes");
  const w = new Writer(HEADER + size);
  w.u8(type);
  w.u32(size);
  for (const [kind, x] of parts) w[kind](x);
  return w.bytes;
}

// --- decoding -------------------------------------------------------------------------------

class BodyReader {
  /** @param {Uint8Array} body @param {(msg: string) => ProtocolError} fail */
  constructor(body, fail) {
    this.b = body;
    this.v = new DataView(body.buffer, body.byteOffset, body.length);
    this.pos = 0;
    this.fail = fail;
  }
  need(n, what) { if (this.pos + n > this.b.length) throw this.fail(`truncated ${what}`); }
  u8(what) { this.need(1, what); return this.v.getUint8(this.pos++); }
  u16(what) { this.need(2, what); const n = this.v.getUint16(this.pos); this.pos += 2; return n; }
  u32(what) { this.need(4, what); const n = this.v.getUint32(this.pos); this.pos += 4; return n; }
  code(table, what) {
    const c = this.u8(what);
    const name = table[c];
    if (name === undefined) throw this.fail(`unknown ${what} 0x${c.toString(16).padStart(2, "0")}`);
    return name;
  }
  /** A Query filling the rest of the body (PROTOCOL.md 14.1); unknown codes are MALFORMED,
   *  the semantic checks (INVALID_QUERY) are the daemon's. */
  query() {
    const q = { flags: this.u8("query flags"), matchers: [], filters: [] };
    for (let i = this.u8("matcher count"); i > 0; i--) {
      const op = this.code(PATH_OP_NAMES, "path matcher op");
      const flags = this.u8("matcher flags");
      const operands = [];
      for (let n = this.u8("operand count"); n > 0; n--) operands.push(this.str16("matcher operand"));
      q.matchers.push({ op, flags, operands });
    }
    for (let i = this.u8("filter count"); i > 0; i--) {
      const op = this.code(FILTER_OP_NAMES, "value filter op");
      q.filters.push({ op, flags: this.u8("filter flags"), field: this.str16("filter field"), value: this.value() });
    }
    q.sort_by = this.code(SORT_BY_NAMES, "sort_by");
    q.sort_flags = this.u8("sort flags");
    q.sort_field = this.str16("sort field");
    q.from = this.u32("window from");
    q.to = this.u32("window to");
    return q;
  }
  str16(what, nonEmpty = false) {
    this.need(2, `${what} length`);
    const n = this.v.getUint16(this.pos);
    this.pos += 2;
    if (nonEmpty && n === 0) throw this.fail(`empty ${what}`);
    this.need(n, what);
    const text = utf8OrNull(this.b.subarray(this.pos, this.pos + n));
    if (text === null) throw this.fail(`${what} is not valid UTF-8`);
    this.pos += n;
    return text;
  }
  value() {
    this.need(5, "value header");
    const vtype = this.v.getUint8(this.pos);
    const n = this.v.getUint32(this.pos + 1);
    this.pos += 5;
    this.need(n, "value data");
    const data = this.b.slice(this.pos, this.pos + n); // a copy: the stream buffer is reused
    this.pos += n;
    const problem = valueProblem(vtype, data);
    if (problem) throw this.fail(problem);
    return new Value(vtype, data);
  }
  end() { if (this.pos !== this.b.length) throw this.fail(`${this.b.length - this.pos} trailing bytes`); }
}

/** Decode one frame body. @param {number} type @param {Uint8Array} body @returns {any} */
export function decodeBody(type, body) {
  const frameType = nameOf(FrameType, type) ?? type;
  if (type === FrameType.REQUEST || type === FrameType.RESPONSE) {
    if (body.length < 4) {
      // PROTOCOL.md 9.1: no readable id. A REQUEST so short is fatal; a RESPONSE is dropped.
      throw new ProtocolError(Status.MALFORMED, `${frameType} body of ${body.length} bytes has no readable id`,
        { fatal: type === FrameType.REQUEST, frameType });
    }
  }
  let requestId = null;
  const fatal = type === FrameType.EVENT || type === FrameType.INFO;
  const fail = (msg, status = Status.MALFORMED) => new ProtocolError(status, msg, { fatal, requestId, frameType });
  const r = new BodyReader(body, fail);
  if (type === FrameType.REQUEST) {
    requestId = r.u32("id");
    const fn = r.u8("function");
    const name = FUNCTION_NAMES[fn];
    if (!name) throw fail(`unknown function 0x${fn.toString(16)}`, Status.UNKNOWN_FUNCTION);
    const m = { type: "REQUEST", id: requestId, function: name };
    if (fn === FunctionCode.FETCH_STATES) m.prefix = r.str16("prefix");
    else if (fn === FunctionCode.FETCH_QUERY || fn === FunctionCode.QUERY_ONCE) m.query = r.query();
    else if (fn === FunctionCode.UNFETCH) m.fetch_id = r.u32("fetch_id");
    else if (fn === FunctionCode.AUTHENTICATE) {
      m.user = r.str16("user", true);
      m.password = r.str16("password");
    } else {
      m.key = r.str16("key", true);
      if ([1, 3, 4, 5].includes(fn)) m.value = r.value();
    }
    r.end();
    return m;
  }
  if (type === FrameType.RESPONSE) {
    requestId = r.u32("id");
    const status = r.u8("status");
    if (status > MAX_STATUS) throw fail(`unknown status 0x${status.toString(16)}`);
    const m = { type: "RESPONSE", id: requestId, status: STATUS_NAMES[status] };
    if (status !== Status.OK) {
      m.message = r.str16("message");
      r.end();
      return m;
    }
    const rest = body.length - r.pos;
    if (rest === 0) m.payload = "empty";
    else if (rest === 4) { m.payload = "fetch_id"; m.fetch_id = r.u32("fetch_id"); }
    else if (rest >= 5) { m.payload = "value"; m.value = r.value(); r.end(); }
    else throw fail(`OK payload of ${rest} bytes`); // PROTOCOL.md 4.2
    return m;
  }
  if (type === FrameType.EVENT) {
    if (body.length === 0) throw fail("EVENT body is empty");
    const code = r.u8("code");
    const name = EVENT_NAMES[code];
    if (!name) throw fail(`unknown event code 0x${code.toString(16)}`, Status.UNKNOWN_FUNCTION);
    const m = { type: "EVENT", code: name };
    if (code === EventCode.CLOSE) {
      const status = r.u8("status");
      if (status > MAX_STATUS) throw fail(`unknown status 0x${status.toString(16)}`);
      m.status = STATUS_NAMES[status];
      m.message = r.str16("message");
    } else if (code === EventCode.FETCH_METHOD || code === EventCode.FETCH_NODE) {
      m.fetch_id = r.u32("fetch_id");
      m.action = r.code(ACTION_NAMES, "action");
      m.key = r.str16("key", true);
    } else if (code === EventCode.FETCH_WINDOW) {
      m.fetch_id = r.u32("fetch_id");
      m.size = r.u32("size");
      m.entries = [];
      for (let n = r.u16("entry count"); n > 0; n--) {
        m.entries.push({ index: r.u32("entry index"), key: r.str16("key", true), value: r.value() });
      }
    } else if (code === EventCode.QUERY_ENTRY) {
      m.request_id = r.u32("request_id");
      m.kind = r.code(ENTRY_KIND_NAMES, "entry kind");
      m.key = r.str16("key", true);
      m.value = r.value();
    } else {
      if (code >= 0x81) m.fetch_id = r.u32("fetch_id");
      m.key = r.str16("key", true);
      m.value = r.value();
    }
    r.end();
    return m;
  }
  // INFO (PROTOCOL.md 4.4); another major version is fatal (PROTOCOL.md 2).
  const m = { type: "INFO", major: r.u8("major"), minor: r.u8("minor"), max_body: r.u32("max_body"),
    features: r.u32("features"), name: r.str16("name") };
  if (r.pos < r.b.length) {
    // PROTOCOL.md 4.4.1: the limits extension; bytes after the fields known are ignored.
    if (r.b.length - r.pos < 6) throw r.fail(`${r.b.length - r.pos} bytes after the INFO name: the limits extension takes 6`);
    m.max_key_length = r.u16("max_key_length");
    m.route_timeout_ms = r.u32("route_timeout_ms");
  } else r.end();
  if (m.major !== PROTOCOL_MAJOR) throw fail(`unsupported protocol major version ${m.major}`);
  return m;
}

/** The OK payload each function calls for (PROTOCOL.md 4.2, 6); any other: empty. An
 *  empty OK to a "value" function means NONE (10.3). */
const OK_SHAPES = Object.freeze({
  SET_STATE: "value", CALL_METHOD: "value", GET_STATE: "value", FETCH_STATES: "fetch_id", FETCH_QUERY: "fetch_id",
});

/** A stream decoder (PROTOCOL.md 3): feed bytes with `receiveData`, pull messages with
 *  `nextMessage` until it returns null. A bad frame throws a ProtocolError; after a
 *  non-fatal one the frame is skipped, after a fatal one every call throws it again. */
export class Decoder {
  /** @param {{maxBody?: number}} [options] */
  constructor({ maxBody = DEFAULT_MAX_BODY } = {}) {
    this.maxBody = maxBody;
    /** @type {Uint8Array[]} */
    this.chunks = [];
    this.total = 0; // bytes buffered (the first chunk counted from `pos`)
    this.pos = 0; // offset in chunks[0]
    /** @type {ProtocolError|null} */
    this.failed = null;
  }

  /** @param {Uint8Array} data */
  receiveData(data) {
    if (data.length) {
      this.chunks.push(data);
      this.total += data.length;
    }
  }

  /** Make the first `n` buffered bytes contiguous in chunks[0] (from pos). */
  _gather(n) {
    const chunks = this.chunks;
    if (chunks[0].length - this.pos >= n) return;
    const merged = new Uint8Array(n);
    let filled = 0;
    let i = 0;
    let pos = this.pos;
    while (filled < n) {
      const c = chunks[i];
      const take = Math.min(c.length - pos, n - filled);
      merged.set(c.subarray(pos, pos + take), filled);
      filled += take;
      if (pos + take === c.length) {
        i += 1;
        pos = 0;
      } else pos += take;
    }
    const rest = chunks.slice(i);
    if (pos) rest[0] = rest[0].subarray(pos);
    this.chunks = [merged, ...rest];
    this.pos = 0;
  }

  _skip(n) {
    this.total -= n;
    this.pos += n;
    while (this.chunks.length && this.pos >= this.chunks[0].length) {
      this.pos -= this.chunks[0].length;
      this.chunks.shift();
    }
  }

  /** @returns {any|null} the next message, or null until more bytes arrive */
  nextMessage() {
    if (this.failed) throw this.failed;
    if (this.total < HEADER) return null;
    this._gather(HEADER);
    const c = this.chunks[0];
    const view = new DataView(c.buffer, c.byteOffset + this.pos, HEADER);
    const type = view.getUint8(0);
    const length = view.getUint32(1);
    if (type < 1 || type > 4) {
      this.failed = new ProtocolError(Status.MALFORMED, `unknown frame type 0x${type.toString(16)}`, { fatal: true, frameType: type });
      throw this.failed;
    }
    if (length > this.maxBody) {
      // PROTOCOL.md 3: checked from the 5 header bytes, before any body is buffered.
      this.failed = new ProtocolError(Status.TOO_LARGE, `body of ${length} bytes exceeds max_body ${this.maxBody}`,
        { fatal: true, frameType: nameOf(FrameType, type) });
      throw this.failed;
    }
    if (this.total < HEADER + length) return null;
    this._gather(HEADER + length);
    const frame = this.chunks[0];
    const body = frame.subarray(this.pos + HEADER, this.pos + HEADER + length);
    this._skip(HEADER + length);
    try {
      return decodeBody(type, body);
    } catch (e) {
      if (e instanceof ProtocolError && e.fatal) this.failed = e;
      throw e;
    }
  }
}

// --- transports -------------------------------------------------------------------------------

const isNode = typeof process !== "undefined" && !!process.versions?.node;

/** A byte link: `send`, `close`, and callbacks `ondata`, `onclose(reason)`. What arrives
 *  before the peer attaches its callbacks (the daemon's INFO can come in the same read as
 *  the handshake's end) is kept and handed over by `attach`. */
class Link {
  constructor() {
    /** @type {Array<Uint8Array|null>} */
    const early = [];
    let closedWith = null;
    /** @type {(data: Uint8Array|null) => void} */
    this.ondata = (data) => early.push(data);
    /** @type {(reason: string) => void} */
    this.onclose = (reason) => { closedWith = reason; };
    this.closed = false;
    this._early = () => [early, closedWith];
  }
  /** @param {(data: Uint8Array|null) => void} ondata @param {(reason: string) => void} onclose */
  attach(ondata, onclose) {
    const [early, closedWith] = this._early();
    this.ondata = ondata;
    this.onclose = onclose;
    for (const data of early) ondata(data);
    if (closedWith !== null) onclose(closedWith);
  }
}

class WebSocketLink extends Link {
  /** @param {any} ws */
  constructor(ws) {
    super();
    this.ws = ws;
    ws.binaryType = "arraybuffer";
    ws.onmessage = (event) => {
      if (typeof event.data === "string") {
        // PROTOCOL.md 13.4: a text message is not jet.
        this.textMessage = true;
        this.ondata(null);
        return;
      }
      this.ondata(new Uint8Array(event.data));
    };
    ws.onclose = (event) => {
      this.closed = true;
      this.onclose(`WebSocket closed (${event.code}${event.reason ? ` ${event.reason}` : ""})`);
    };
    ws.onerror = () => {};
  }
  /** @param {Uint8Array} data */
  send(data) {
    if (this.closed || this.ws.readyState !== 1) return;
    for (let at = 0; at < data.length; at += WS_MESSAGE_LIMIT) {
      this.ws.send(data.subarray(at, at + WS_MESSAGE_LIMIT)); // PROTOCOL.md 13.2
    }
  }
  close() {
    if (this.ws.readyState <= 1) this.ws.close(1000);
  }
  abort() {
    if (typeof this.ws.terminate === "function") this.ws.terminate();
    else this.close();
  }
  /** Bytes the WebSocket has not sent yet. */
  buffered() {
    return this.ws.bufferedAmount ?? 0;
  }
  /** A WebSocket has no drain event: a short wait. */
  drained() {
    return new Promise((resolve) => setTimeout(resolve, 5));
  }
}

class TcpLink extends Link {
  constructor(socket) {
    super();
    this.socket = socket;
    socket.setNoDelay(true);
    socket.on("data", (buf) => this.ondata(new Uint8Array(buf.buffer, buf.byteOffset, buf.length)));
    socket.on("error", (e) => { this.error = e; });
    socket.on("close", () => {
      this.closed = true;
      this.onclose(this.error ? `connection lost: ${this.error.message}` : "connection closed");
    });
  }
  send(data) {
    if (!this.closed) this.socket.write(data);
  }
  close() {
    // PROTOCOL.md 7.3: half-close, then read until the daemon closes (or a few seconds).
    this.socket.end();
    setTimeout(() => this.socket.destroy(), 3000).unref?.();
  }
  abort() {
    this.socket.destroy();
  }
  buffered() {
    return this.socket.writableLength;
  }
  drained() {
    return new Promise((resolve) => {
      const done = () => { this.socket.off("drain", done); this.socket.off("close", done); resolve(); };
      this.socket.on("drain", done);
      this.socket.on("close", done);
    });
  }
}

/** @param {boolean} [needOptions] Node.js with TLS options: only the `ws` package takes them.
 *  @returns {Promise<any>} the WebSocket class of this runtime */
async function webSocketClass(needOptions = false) {
  if (globalThis.WebSocket && !(isNode && needOptions)) return globalThis.WebSocket;
  try {
    const mod = await import("ws");
    return mod.WebSocket ?? mod.default;
  } catch {
    throw new ConnectionClosed(needOptions
      ? "TLS options for wss:// in Node.js need the `ws` package"
      : "no WebSocket in this runtime: install the `ws` package");
  }
}

/** Open a link to `address`: "ws://...", "wss://...", "tcp://host:port", "tls://host:port"
 *  or {host, port, tls}; `options.tls` (Node.js) holds what `tls.connect` takes (ca, cert,
 *  key, servername, rejectUnauthorized) for tls:// and wss:// (PROTOCOL.md 15.6). */
async function openLink(address, options, timeoutMs) {
  const deadline = (promise, what, abort) => new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      abort();
      reject(new Timeout(`${what}: no connection within ${timeoutMs / 1000} s`));
    }, timeoutMs);
    promise.then((v) => { clearTimeout(timer); resolve(v); }, (e) => { clearTimeout(timer); reject(e); });
  });
  const tlsOptions = options.tls && typeof options.tls === "object" ? options.tls : {};
  if (typeof address === "string" && /^wss?:\/\//.test(address)) {
    const withOptions = isNode && (!!options.tls || !!options.origin);
    const WS = await webSocketClass(withOptions);
    const ws = isNode && (withOptions || !globalThis.WebSocket)
      ? new WS(address, "jet", { ...tlsOptions, ...(options.origin ? { origin: options.origin } : {}) })
      : new WS(address, "jet");
    const opened = new Promise((resolve, reject) => {
      ws.onopen = () => resolve(new WebSocketLink(ws));
      ws.onerror = (e) => reject(new ConnectionClosed(`cannot connect to ${address}${e?.message ? `: ${e.message}` : ""}`));
      ws.onclose = (e) => reject(new ConnectionClosed(`cannot connect to ${address} (${e.code})`));
    });
    return deadline(opened, address, () => (typeof ws.terminate === "function" ? ws.terminate() : ws.close()));
  }
  let host;
  let port;
  let secure = !!options.tls;
  if (typeof address === "string") {
    const m = /^(?:(tcp|tls):\/\/)?\[?([^\]]+?)\]?:(\d+)$/.exec(address);
    if (!m) throw new TypeError(`not a jet address: ${address} (ws://..., wss://..., tcp://host:port or tls://host:port)`);
    [host, port] = [m[2], Number(m[3])];
    secure ||= m[1] === "tls";
  } else {
    ({ host = "127.0.0.1", port = DEFAULT_PORT } = address ?? {});
    secure ||= !!address?.tls;
  }
  if (!isNode) throw new TypeError("TCP needs Node.js; browsers connect with ws:// or wss://");
  const net = secure ? await import("node:tls") : await import("node:net");
  let socket;
  const opened = new Promise((resolve, reject) => {
    socket = secure
      ? net.connect({ host, port, servername: /^[\d.]+$|:/.test(host) ? undefined : host, ...tlsOptions })
      : net.connect({ host, port });
    socket.once(secure ? "secureConnect" : "connect", () => resolve(new TcpLink(socket)));
    socket.once("error", (e) => reject(new ConnectionClosed(`cannot connect to ${host}:${port}: ${e.message}`)));
  });
  return deadline(opened, `${host}:${port}`, () => socket.destroy());
}

// --- queries (PROTOCOL.md 14) -----------------------------------------------------------------
//
// The builders mirror peer/query.py: `key.endsWith("/temp")` is a path matcher,
// `field("score").ge(10)` and `value.gt(30)` are value filters, and a query spec is a plain
// object: {prefix, match, where, sortBy, descending, top, window, methods, nodes}.

/** A path matcher (PROTOCOL.md 14.1), from `key.*`: `m.not()` negates it, `m.ignoreCase()`
 *  folds case. */
export class Matcher {
  /** @param {keyof typeof PathOp} op @param {string[]} operands @param {number} [flags] */
  constructor(op, operands, flags = 0) {
    for (const o of operands) {
      if (typeof o !== "string") throw new TypeError(`a ${op} operand is a string, got ${typeof o}`);
    }
    this.op = op;
    this.operands = Object.freeze([...operands]);
    this.flags = flags;
    Object.freeze(this);
  }
  /** @returns {Matcher} the negation: it holds where this one fails */
  not() { return new Matcher(this.op, this.operands, this.flags ^ MATCH_NOT); }
  /** @returns {Matcher} the same test after Unicode case folding of key and operands */
  ignoreCase() { return new Matcher(this.op, this.operands, this.flags | MATCH_IGNORE_CASE); }
}

/** `key`: the path matchers (PROTOCOL.md 14.1); ANDed when a query has several. */
export const key = Object.freeze({
  /** @param {string} text */ startsWith: (text) => new Matcher("STARTS_WITH", [text]),
  /** @param {string} text */ endsWith: (text) => new Matcher("ENDS_WITH", [text]),
  /** @param {string} text */ contains: (text) => new Matcher("CONTAINS", [text]),
  /** @param {string} text */ equals: (text) => new Matcher("EQUALS", [text]),
  /** @param {...string} texts */ equalsOneOf: (...texts) => new Matcher("EQUALS_ONE_OF", texts),
  /** @param {...string} texts */ containsAllOf: (...texts) => new Matcher("CONTAINS_ALL_OF", texts),
});

/** A value filter (PROTOCOL.md 14.1), from `field(path).*` or `value.*`. */
export class ValueFilter {
  /** @param {keyof typeof FilterOp} op @param {Value} operand @param {string} field */
  constructor(op, operand, field) {
    this.op = op;
    this.flags = 0;
    this.field = field;
    this.value = operand;
    Object.freeze(this);
  }
}

const TYPE_NAMES = Object.freeze({ null: 0, bool: 1, number: 2, string: 3, bytes: 4, array: 5, object: 6 });

/** The value at a field path (`field("address.city")`), or the value itself (`value`):
 *  its comparisons build ValueFilters. Operands map as in `Value.of`: a JavaScript number
 *  is a FLOAT64 (1 and 1.0 compare equal on the daemon), a bigint an INT64. */
export class Field {
  /** @param {string} path */
  constructor(path) { this.path = path; Object.freeze(this); }
  /** @param {any} x */ eq(x) { return new ValueFilter("EQ", Value.of(x), this.path); }
  /** @param {any} x */ ne(x) { return new ValueFilter("NE", Value.of(x), this.path); }
  /** @param {any} x */ lt(x) { return new ValueFilter("LT", Value.of(x), this.path); }
  /** @param {any} x */ le(x) { return new ValueFilter("LE", Value.of(x), this.path); }
  /** @param {any} x */ gt(x) { return new ValueFilter("GT", Value.of(x), this.path); }
  /** @param {any} x */ ge(x) { return new ValueFilter("GE", Value.of(x), this.path); }
  /** @param {"null"|"bool"|"number"|"string"|"bytes"|"array"|"object"} name */
  isType(name) {
    const code = TYPE_NAMES[name];
    if (code === undefined) throw new TypeError(`unknown type ${JSON.stringify(name)}; one of ${Object.keys(TYPE_NAMES).join(", ")}`);
    return new ValueFilter("IS_TYPE", Value.int64(code), this.path);
  }
}

/** The value at `path` inside a JSON, CBOR or MessagePack state (`tags.0`).
 *  @param {string} path @returns {Field} */
export function field(path) {
  if (typeof path !== "string" || !path) throw new TypeError("a field path is a non-empty string; use `value` for the value itself");
  return new Field(path);
}

/** The state's value itself, for filters: `value.gt(30)`, `value.isType("number")`. */
export const value = new Field("");

/**
 * @typedef {object} QuerySpec What a query selects (PROTOCOL.md 14.1).
 * @property {string} [prefix] a STARTS_WITH matcher
 * @property {Matcher[]} [match] more path matchers (`key.*`)
 * @property {ValueFilter[]} [where] value filters (`field(...)`, `value`)
 * @property {string} [sortBy] "key", "value" or a field path
 * @property {boolean} [descending]
 * @property {number} [top] the window 1..top
 * @property {[number, number]} [window] the window [from, to], 1-based, inclusive
 * @property {boolean} [methods] include method entries
 * @property {boolean} [nodes] include node entries
 */

const SPEC_KEYS = new Set(["prefix", "match", "where", "sortBy", "descending", "top", "window", "methods", "nodes"]);

/** The wire form of a query (as in spec/vectors, what `encode` takes) for a QuerySpec or a
 *  prefix. A sort without a window is the top 1000 (jetd's default max_window).
 *  @param {QuerySpec|string} [spec] @returns {any}
 *  @throws {TypeError} for an unknown option, a matcher or filter not built by `key`,
 *    `field` or `value`, both top and window, or a window without a sort */
export function buildQuery(spec = {}) {
  if (typeof spec === "string") spec = { prefix: spec };
  if (spec === null || typeof spec !== "object") throw new TypeError("a query is a prefix or an object");
  for (const name of Object.keys(spec)) {
    if (!SPEC_KEYS.has(name)) throw new TypeError(`unknown query option ${JSON.stringify(name)}; known: ${[...SPEC_KEYS].join(", ")}`);
  }
  const prefix = spec.prefix ?? "";
  if (typeof prefix !== "string") throw new TypeError("prefix is a string");
  const matchers = prefix ? [{ op: "STARTS_WITH", flags: 0, operands: [prefix] }] : [];
  for (const m of spec.match ?? []) {
    if (!(m instanceof Matcher)) throw new TypeError("match takes path matchers such as key.endsWith('/temp')");
    matchers.push({ op: m.op, flags: m.flags, operands: [...m.operands] });
  }
  const filters = [];
  for (const f of spec.where ?? []) {
    if (!(f instanceof ValueFilter)) throw new TypeError("where takes value filters such as field('score').ge(10)");
    filters.push({ op: f.op, flags: 0, field: f.field, value: f.value });
  }
  let window = spec.window;
  if (spec.top !== undefined && window !== undefined) throw new TypeError("give top or window, not both");
  if (spec.top !== undefined) window = [1, spec.top];
  let sortBy = "NONE";
  let sortField = "";
  if (spec.sortBy !== undefined) {
    if (spec.sortBy === "key") sortBy = "KEY";
    else if (spec.sortBy === "value") sortBy = "VALUE";
    else if (typeof spec.sortBy === "string" && spec.sortBy) [sortBy, sortField] = ["FIELD", spec.sortBy];
    else throw new TypeError("sortBy is \"key\", \"value\" or a field path");
    window = window ?? [1, 1000];
  } else if (window !== undefined || spec.descending) {
    throw new TypeError("top, window and descending need sortBy");
  }
  const [from, to] = window ?? [0, 0];
  return {
    flags: (spec.methods ? QUERY_METHODS : 0) | (spec.nodes ? QUERY_NODES : 0),
    matchers, filters, sort_by: sortBy, sort_flags: spec.descending ? SORT_DESCENDING : 0, sort_field: sortField, from, to,
  };
}

/** True if a wire query is a FETCH_STATES prefix in disguise (a 1.0 daemon answers it).
 *  @param {any} q */
function isPlainPrefix(q) {
  return !q.filters.length && q.sort_by === "NONE" && !q.flags && q.matchers.length <= 1
    && q.matchers.every((m) => m.op === "STARTS_WITH" && !m.flags);
}

// --- the peer ---------------------------------------------------------------------------------

const NONE = new Value(ValueType.NONE);

/** One row of a sorted fetch's window: its 1-based `index` in the whole order, `key`,
 *  `raw` as received, `value` mapped to JavaScript when read. */
export class WindowRow {
  /** @param {number} index @param {string} key @param {Value} raw */
  constructor(index, key, raw) {
    this.index = index;
    this.key = key;
    this.raw = raw;
  }
  get value() {
    return this.raw.toJS();
  }
}

/** One entry of a one-shot query (PROTOCOL.md 14.4): `kind` "state", "method" or "node";
 *  `raw` is NONE for methods and nodes. */
export class QueryResult {
  /** @param {"state"|"method"|"node"} kind @param {string} key @param {Value} raw */
  constructor(kind, key, raw) {
    this.kind = kind;
    this.key = key;
    this.raw = raw;
  }
  get value() {
    return this.raw.toJS();
  }
}

/**
 * @typedef {"add"|"change"|"remove"|"unmatch"|"window"|"method_add"|"method_remove"|"node_add"|"node_remove"} EventKind
 * What a fetch event says happened (PROTOCOL.md 7.2, 14.2). An entry leaves an unsorted
 * fetch for one of two reasons: "remove" (the state is gone) or "unmatch" (it is still
 * there, with the new value `value`, but no longer matches the query's filters).
 */

/** One fetch event: `kind` (EventKind), `key`, and the value: `raw` as received, `value`
 *  mapped to JavaScript when read (throws Malformed for bad JSON). A "window" event (a
 *  sorted fetch) has `rows`, the whole window after the update in index order, and
 *  `changes`, the rows the daemon listed (the positions whose key or value changed). */
export class FetchEvent {
  /** @param {EventKind} kind @param {string} key @param {Value} raw
   *  @param {WindowRow[]|null} [rows] @param {WindowRow[]|null} [changes] */
  constructor(kind, key, raw, rows = null, changes = null) {
    this.kind = kind;
    this.key = key;
    this.raw = raw;
    /** @type {WindowRow[]|null} */
    this.rows = rows;
    /** @type {WindowRow[]|null} */
    this.changes = changes;
  }
  get value() {
    return this.raw.toJS();
  }
  /** Why an entry left the fetch: "removed" (kind "remove") or "unmatched" (kind
   *  "unmatch"); null for the other kinds. */
  get reason() {
    return this.kind === "remove" ? "removed" : this.kind === "unmatch" ? "unmatched" : null;
  }
}

/** @type {Record<string, EventKind>} */
const KINDS = { FETCH_ADD: "add", FETCH_CHANGE: "change", FETCH_REMOVE: "remove", FETCH_UNMATCH: "unmatch" };
/** @type {Record<string, EventKind>} */
const KEY_EVENT_KINDS = {
  "FETCH_METHOD ADD": "method_add", "FETCH_METHOD REMOVE": "method_remove",
  "FETCH_NODE ADD": "node_add", "FETCH_NODE REMOVE": "node_remove",
};
const LEAVING = new Set(["remove", "unmatch", "method_remove", "node_remove"]);

/** A state this peer owns (from `peer.addState`). */
export class State {
  /** @param {Peer} peer @param {string} key @param {Value} raw @param {((value: any) => any)|undefined} onSet */
  constructor(peer, key, raw, onSet) {
    this.peer = peer;
    this.key = key;
    this.raw = raw;
    this.onSet = onSet;
    this.removed = false;
    /** Why a reconnect could not add it again (AlreadyExists: another peer took the key). */
    this.restoreError = null;
  }
  /** The current value (as last added or notified), mapped to JavaScript. */
  get value() {
    return this.raw.toJS();
  }
  /** Announce a new complete value (NOTIFY_STATE, PROTOCOL.md 6.4). @returns {Promise<void>} */
  notify(value, { timeout } = {}) {
    this._live();
    this.raw = Value.of(value);
    return this.peer._request({ function: "NOTIFY_STATE", key: this.key, value: this.raw }, () => undefined, timeout);
  }
  /** Announce a new value as a fire-and-forget EVENT (PROTOCOL.md 7.1). */
  notifyNowait(value) {
    this._live();
    this.raw = Value.of(value);
    this.peer._sendEvent({ type: "EVENT", code: "NOTIFY_STATE", key: this.key, value: this.raw });
  }
  /** Remove the state (REMOVE_STATE, PROTOCOL.md 6.2). */
  async remove({ timeout } = {}) {
    this._live();
    this.removed = true;
    this.peer._states.delete(this.key);
    await this.peer._request({ function: "REMOVE_STATE", key: this.key }, () => undefined, timeout);
  }
  _live() {
    if (this.removed) throw new JetError(`state ${this.key} was removed`);
  }
}

/** A method this peer owns (from `peer.addMethod`). */
export class Method {
  /** @param {Peer} peer @param {string} key @param {(args: any) => any} handler */
  constructor(peer, key, handler) {
    this.peer = peer;
    this.key = key;
    this.handler = handler;
    this.removed = false;
    /** Why a reconnect could not add it again (AlreadyExists: another peer took the key). */
    this.restoreError = null;
  }
  /** Remove the method (REMOVE_METHOD, PROTOCOL.md 6.7). */
  async remove({ timeout } = {}) {
    if (this.removed) throw new JetError(`method ${this.key} was removed`);
    this.removed = true;
    this.peer._methods.delete(this.key);
    await this.peer._request({ function: "REMOVE_METHOD", key: this.key }, () => undefined, timeout);
  }
}

/** A fetch (from `peer.fetch`): events go to its callback, or, without one, to its async
 *  iterator (`for await (const event of fetch)`). A sorted fetch keeps its window in `rows`. */
export class Fetch {
  /** @param {Peer} peer @param {string} prefix @param {((event: FetchEvent) => void)|undefined} onEvent
   *  @param {number} maxQueue @param {any} [query] the wire query (FETCH_QUERY), or null (FETCH_STATES of prefix) */
  constructor(peer, prefix, onEvent, maxQueue, query = null) {
    this.peer = peer;
    this.prefix = prefix;
    this.query = query;
    this.onEvent = onEvent;
    /** @type {number|null} */
    this.fetchId = null;
    this.active = false;
    /** A sorted fetch's window, kept from FETCH_WINDOW (PROTOCOL.md 14.2), in index order.
     *  @type {WindowRow[]} */
    this.rows = [];
    /** @type {FetchEvent[]} */
    this._queue = [];
    this._maxQueue = maxQueue;
    /** @type {(() => void)|null} */
    this._waiter = null;
    this._busy = false; // an async callback has not finished with its event
    /** @type {any} */
    this._end = null;
    // Kept only with reconnect: what the application has been told, so that a restored
    // fetch reports the difference (the initial adds have no end marker; the restore's
    // barrier request gives one, see Peer._restore).
    /** @type {Map<string, Value>|null} */
    this._known = peer.reconnect ? new Map() : null;
    /** @type {Set<string>|null} */
    this._restoreSeen = null;
  }

  get _label() {
    return this.query ? "query" : JSON.stringify(this.prefix);
  }

  /** PROTOCOL.md 14.2: set the listed positions, cut to `size`; deliver the whole window. */
  _applyWindow(m) {
    const start = this.query.from;
    const rows = this.rows;
    for (let i = rows.length; i < m.size; i++) rows.push(new WindowRow(start + i, "", NONE));
    const changes = [];
    for (const entry of m.entries) {
      const row = new WindowRow(entry.index, entry.key, entry.value);
      changes.push(row);
      const position = entry.index - start;
      if (position >= 0 && position < m.size) rows[position] = row;
    }
    rows.length = m.size;
    this._deliver("window", "", NONE, [...rows], changes);
  }

  /** @param {EventKind} kind @param {string} key @param {Value} raw */
  _deliver(kind, key, raw, rows = null, changes = null) {
    const known = kind === "window" ? null : this._known;
    if (known) {
      if (this._restoreSeen && (kind === "add" || kind === "method_add" || kind === "node_add")) {
        // A restored fetch announces again what the application already knows.
        this._restoreSeen.add(`${kind[0]}:${key}`);
        const old = known.get(`${kind[0]}:${key}`);
        if (old !== undefined && old.equals(raw)) return;
        if (old !== undefined) kind = "change";
      }
      const id = `${kind === "change" || kind === "remove" || kind === "unmatch" ? "a" : kind[0]}:${key}`;
      if (LEAVING.has(kind)) known.delete(id);
      else known.set(id, raw);
    }
    const event = new FetchEvent(kind, key, raw, rows, changes);
    if (this.onEvent && !this._busy) {
      this._run(event);
      return;
    }
    // Iterated, or an async callback still busy: queued, within the bound.
    if (this._queue.length >= this._maxQueue) {
      // A consumer this far behind would make memory grow without bound.
      this.peer._dropFetch(this);
      this._finish(new Overloaded(`fetch ${this._label}: consumer fell ${this._maxQueue} events behind`));
      return;
    }
    this._queue.push(event);
    this._wake();
  }

  /** Pass one event to the callback; an async one (it returns a promise) gets the next
   *  event only when it is done, so that events are handled one at a time, in order. */
  _run(event) {
    const failed = (e) => console.error(`jet: fetch ${this._label}: callback failed on ${event.kind} ${event.key}:`, e);
    let outcome;
    try {
      outcome = this.onEvent(event);
    } catch (e) {
      failed(e);
      return;
    }
    if (!outcome || typeof outcome.then !== "function") return;
    this._busy = true;
    const next = () => {
      this._busy = false;
      if (this._queue.length && !this._end) this._run(/** @type {FetchEvent} */ (this._queue.shift()));
    };
    outcome.then(next, (e) => { failed(e); next(); });
  }

  /** Iterator mode: wait for at least one event and return every event queued.
   *  @returns {Promise<FetchEvent[]>} an empty array once the fetch ended normally
   *  @throws {PeerError} ConnectionClosed or Overloaded when it ended in failure */
  async nextBatch() {
    if (this.onEvent) throw new JetError("this fetch delivers to its callback");
    while (!this._queue.length) {
      if (this._end) {
        if (this._end === "done") return [];
        throw this._end;
      }
      await new Promise((resolve) => { this._waiter = resolve; });
    }
    return this._queue.splice(0);
  }

  _wake() {
    const waiter = this._waiter;
    this._waiter = null;
    if (waiter) waiter();
  }

  _finish(reason) {
    this.active = false;
    if (!this._end) this._end = reason;
    this.peer._fetchObjects.delete(this);
    this._wake();
  }

  /** End the fetch (UNFETCH, PROTOCOL.md 6.9); no event is delivered after this call.
   *  While the peer reconnects there is nothing to end on the daemon's side. */
  async unfetch({ timeout } = {}) {
    if (!this.active) throw new JetError(`fetch ${this._label} is not active`);
    const fetchId = this.fetchId;
    this._finish("done");
    if (this.peer._fetches.get(fetchId) !== this) return;
    this.peer._fetches.delete(fetchId);
    if (!this.peer._ready) return;
    await this.peer._request({ function: "UNFETCH", fetch_id: fetchId }, () => undefined, timeout);
  }

  async *[Symbol.asyncIterator]() {
    if (this.onEvent) throw new JetError("this fetch delivers to its callback");
    for (;;) {
      if (this._queue.length) {
        yield /** @type {FetchEvent} */ (this._queue.shift());
        continue;
      }
      if (this._end) {
        if (this._end === "done") return;
        throw this._end;
      }
      await new Promise((resolve) => { this._waiter = resolve; });
    }
  }
}

const fnName = (handler) => handler?.name || "handler";
const MAX_ERROR_MESSAGE = 1000;
const DRAIN_LOW_WATER = 64 * 1024; // bytes a link may still hold when drain() returns
/** A key no peer can own: its GET_STATE answer marks the end of a restore's initial adds. */
const BARRIER_KEY = "\u0000peer/restore-barrier";
export const DEFAULT_RECONNECT_MIN_DELAY = 50; // ms
export const DEFAULT_RECONNECT_MAX_DELAY = 2000; // ms
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * @typedef {object} PeerOptions
 * @property {string} [name] this peer's name in the daemon's logs (default "peer")
 * @property {number} [timeout] milliseconds: the connection, and the default per request
 * @property {number} [maxBody] the largest body this peer accepts (announced in its INFO)
 * @property {number} [fetchQueue] events a fetch iterated with `for await` may fall behind
 * @property {string} [origin] the Origin header to send (Node's `ws` only)
 * @property {object|boolean} [tls] Node.js: TLS for tcp addresses (as tls://), and the
 *   options of `tls.connect` (ca, cert, key, servername, rejectUnauthorized) for tls:// and wss://
 * @property {string} [user] AUTHENTICATE as this user right after connecting (PROTOCOL.md 15.2)
 * @property {string} [password] its password (default empty)
 * @property {boolean} [reconnect] after a link loss, reconnect and restore (see Peer.connect)
 * @property {number} [reconnectMinDelay] milliseconds before the first attempt (default 50)
 * @property {number} [reconnectMaxDelay] the longest wait between attempts (default 2000)
 */

/** A jet peer: owner, client and fetcher on one connection. Create it with `Peer.connect`. */
export class Peer {
  /** @param {any} address @param {PeerOptions} options */
  constructor(address, options) {
    this.address = address;
    this._options = options;
    /** @type {any} */
    this._link = null;
    this.name = options.name ?? "peer";
    this.timeout = options.timeout ?? DEFAULT_TIMEOUT;
    this.maxBody = options.maxBody ?? DEFAULT_MAX_BODY;
    this.fetchQueue = options.fetchQueue ?? 100000;
    this.user = options.user;
    this.reconnect = options.reconnect ?? false;
    this.reconnectMinDelay = options.reconnectMinDelay ?? DEFAULT_RECONNECT_MIN_DELAY;
    this.reconnectMaxDelay = options.reconnectMaxDelay ?? DEFAULT_RECONNECT_MAX_DELAY;
    /** Completed reconnections. */
    this.reconnects = 0;
    this._decoder = new Decoder({ maxBody: this.maxBody });
    /** @type {Map<number, {resolve: Function, reject: Function, convert: Function, timer: any}>} */
    this._pending = new Map();
    this._nextId = 0;
    /** @type {Map<string, State>} */
    this._states = new Map();
    /** @type {Map<string, Method>} */
    this._methods = new Map();
    /** @type {Map<number, Fetch>} */
    this._fetches = new Map();
    /** Every active fetch, for restore. @type {Set<Fetch>} */
    this._fetchObjects = new Set();
    /** QUERY_ONCE request id -> its entries so far. @type {Map<number, QueryResult[]>} */
    this._queryResults = new Map();
    /** @type {Uint8Array[]} */
    this._out = [];
    this._outSize = 0;
    /** @type {any} */
    this._closedError = null;
    this._closing = false;
    this._ready = true; // false while a reconnect is restoring
    this._reconnecting = false;
    this._established = false; // the first connection succeeded
    /** Requests (id) and events (-1) made while reconnecting. @type {Array<[number, Uint8Array]>} */
    this._backlog = [];
    /** The daemon's CLOSE on the current connection, if it sent one: {status, message}. */
    this.closeReason = null;
    this.info = null;
    /** Called once with a ConnectionClosed when the connection ends for good. */
    this.onclose = null;
    /** With reconnect: called with a ConnectionClosed when the link is lost and a
     *  reconnect begins, and with no argument by `onreconnect` once restored. */
    this.ondisconnect = null;
    this.onreconnect = null;
    this._infoWait = null;
    /** Resolves with the ConnectionClosed error when the connection ends for good. */
    this.closed = new Promise((resolve) => { this._resolveClosed = resolve; });
  }

  /** Connect to a daemon, send this peer's INFO, wait for the daemon's.
   *
   *  With `reconnect: true`, a lost link (the daemon restarted, the network broke, a CLOSE)
   *  is reconnected with exponential backoff and jitter, and the peer restores itself as
   *  jet's PeerAsync does (PROTOCOL.md 11.4): it authenticates again, re-adds its states
   *  (with their current values) and methods, and fetches again; a fetch goes on across
   *  the reconnect, reporting only the difference (a state added again with the value the
   *  application saw gives no event; one gone meanwhile gives "remove"). Requests in
   *  flight when the link drops fail with ConnectionClosed (whether the daemon carried
   *  them out is unknown); requests made while reconnecting wait for the restore, within
   *  their timeout. A state or method another peer took meanwhile is marked `removed`
   *  with its `restoreError` (AlreadyExists). The first connection must succeed.
   *
   *  @param {string|{host?: string, port?: number}} [address] "ws://host:port/jet",
   *    "wss://...", "tcp://host:port" (Node.js) or {host, port}; in a browser the default is
   *    the /jet endpoint of the page's own server.
   *  @param {PeerOptions} [options]
   *  @returns {Promise<Peer>}
   *  @throws {ConnectionClosed|Timeout|Malformed|AuthFailed} */
  static async connect(address, options = {}) {
    if (address === undefined && typeof location !== "undefined") {
      address = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/jet`;
    }
    const peer = new Peer(address, options);
    await peer._open();
    peer._established = true; // from now on a lost link is reconnected (with reconnect)
    return peer;
  }

  /** Open a link, exchange INFO, authenticate; the link becomes the current one. */
  async _open() {
    const peer = this;
    const timeout = this.timeout;
    const link = await openLink(this.address, this._options, timeout);
    if (this._closing) {
      link.abort();
      throw this._closedErr();
    }
    this._link = link;
    this._decoder = new Decoder({ maxBody: this.maxBody });
    this._out = [];
    this._outSize = 0;
    this.closeReason = null;
    const info = new Promise((resolve, reject) => { peer._infoWait = { resolve, reject }; });
    link.attach((data) => this._onData(link, data), (reason) => this._onLinkLost(link, reason));
    // PROTOCOL.md 4.4: our INFO first; requests may follow without waiting.
    // FEATURE_LIMITS asks a 1.2 daemon for its limits (4.4.1).
    peer._send(encode({ type: "INFO", name: peer.name, max_body: peer.maxBody, features: FEATURE_LIMITS }));
    const timer = setTimeout(() => peer._infoWait?.reject(new Timeout(`no INFO within ${timeout / 1000} s`)), timeout);
    try {
      peer.info = await info;
    } catch (e) {
      link.abort();
      throw e;
    } finally {
      clearTimeout(timer);
    }
    if (this.user !== undefined) {
      try {
        await this._request({ function: "AUTHENTICATE", user: this.user, password: this._options.password ?? "" },
          () => undefined, timeout, true);
      } catch (e) {
        link.abort();
        throw e;
      }
    }
  }

  /** True while a link is up and (after a reconnect) restored. */
  get connected() {
    return !this._closedError && this._ready && !!this._link && !this._link.closed;
  }

  // --- sending ------------------------------------------------------------------------------

  /** Queue a frame for the current link; `link`, when given, is the one the frame answers
   *  (an answer for a lost link is never sent on the next: PROTOCOL.md 11.4). */
  _send(frame, link = this._link) {
    if (!link || link !== this._link || link.closed) return;
    if (!this._out.length) queueMicrotask(() => this._flush()); // one write per turn
    this._out.push(frame);
    this._outSize += frame.length;
  }

  _flush() {
    const out = this._out;
    if (!out.length || !this._link) return;
    this._out = [];
    const size = this._outSize;
    this._outSize = 0;
    if (out.length === 1) return this._link.send(out[0]);
    const joined = new Uint8Array(size);
    let at = 0;
    for (const f of out) { joined.set(f, at); at += f.length; }
    this._link.send(joined);
  }

  _frame(message) {
    const frame = encode(message);
    if (this.info && frame.length - HEADER > this.info.max_body) {
      throw new TooLarge(`body of ${frame.length - HEADER} bytes exceeds the daemon's max_body ${this.info.max_body}`);
    }
    return frame;
  }

  _closedErr() {
    const e = this._closedError;
    return new ConnectionClosed(e ? e.reason : "peer closed", e ? e.status : null);
  }

  /** Whether a frame can go out now (else, with reconnect, it waits in the backlog). */
  _live(restoring) {
    return (restoring || this._ready) && !!this._link && !this._link.closed;
  }

  /** Send a REQUEST; its handler is registered before the frame is queued, and `convert`
   *  runs synchronously when the response is decoded (so a fetch is live for the events
   *  that follow its OK in the same read). `restoring`: part of (re)connecting, sent
   *  before the restore is complete. */
  _request(fields, convert, timeout, restoring = false) {
    if (this._closedError) return Promise.reject(this._closedErr());
    let id = this._nextId;
    do { id = (id + 1) >>> 0; } while (this._pending.has(id));
    this._nextId = id;
    let frame;
    try {
      frame = this._frame({ type: "REQUEST", id, ...fields });
    } catch (e) {
      return Promise.reject(e);
    }
    return new Promise((resolve, reject) => {
      const ms = timeout ?? this.timeout;
      const timer = setTimeout(() => {
        if (this._pending.delete(id)) reject(new Timeout(`no response within ${ms / 1000} s (peer timeout)`));
      }, ms);
      this._pending.set(id, { resolve, reject, convert, timer, fn: fields.function });
      if (this._live(restoring)) this._send(frame);
      else this._backlog.push([id, frame]); // made while reconnecting: sent after the restore
    });
  }

  _sendEvent(message) {
    if (this._closedError) throw this._closedErr();
    const frame = this._frame(message);
    // PROTOCOL.md 7.1: fire-and-forget; while reconnecting it waits for the restore.
    if (this._live(false)) this._send(frame);
    else this._backlog.push([-1, frame]);
  }

  /** Wait until the link has handed what was sent to the network (use it when pipelining
   *  very many requests or `*Nowait` events without awaiting them). */
  async drain() {
    this._flush();
    const link = this._link;
    while (link && !link.closed && link.buffered() > DRAIN_LOW_WATER) await link.drained();
  }

  // --- client role ----------------------------------------------------------------------------

  /** Ask the owner of state `key` to take `value` (SET_STATE, PROTOCOL.md 6.3).
   *  @returns {Promise<any>} the value now in effect, as the owner answered */
  set(key, value, { timeout } = {}) {
    return this._request({ function: "SET_STATE", key, value: Value.of(value) }, convertValue, timeout);
  }
  /** Fire-and-forget set (PROTOCOL.md 7.1). */
  setNowait(key, value) {
    this._sendEvent({ type: "EVENT", code: "SET_STATE", key, value: Value.of(value) });
  }
  /** Call method `key` (CALL_METHOD, PROTOCOL.md 6.5). @returns {Promise<any>} its result */
  call(key, args = null, { timeout } = {}) {
    return this._request({ function: "CALL_METHOD", key, value: Value.of(args) }, convertValue, timeout);
  }
  /** Fire-and-forget call (PROTOCOL.md 7.1). */
  callNowait(key, args = null) {
    this._sendEvent({ type: "EVENT", code: "CALL_METHOD", key, value: Value.of(args) });
  }
  /** The daemon's cached value of state `key` (GET_STATE, PROTOCOL.md 6.10). */
  get(key, { timeout } = {}) {
    return this._request({ function: "GET_STATE", key }, convertValue, timeout);
  }
  /** Like `get`, but resolves to the Value unmapped. */
  getRaw(key, { timeout } = {}) {
    return this._request({ function: "GET_STATE", key }, (m) => m.value ?? new Value(ValueType.NONE), timeout);
  }

  /** Fetch every state whose key starts with `prefix` (FETCH_STATES, PROTOCOL.md 6.8), or,
   *  given a QuerySpec, what the query selects (FETCH_QUERY, protocol 1.1, PROTOCOL.md
   *  14.3): `{prefix, match: [key.endsWith("/temp"), key.contains("x").not()],
   *  where: [field("gender").eq("female"), value.gt(3)], sortBy: "key"|"value"|field path,
   *  descending, top: N | window: [from, to], methods, nodes}`.
   *
   *  Events (FetchEvent): "add", "change", "remove"; a filtered fetch also "unmatch" (the
   *  state stopped matching); methods and nodes "method_add", "method_remove", "node_add",
   *  "node_remove"; a sorted fetch "window", whose `rows` are the whole window in index
   *  order (also kept in `fetch.rows`) and `changes` the rows the daemon listed.
   *
   *  With `onEvent` every FetchEvent is passed to it, in order; without, iterate the Fetch
   *  with `for await`. Resolves once the daemon's OK is in; the initial events that follow
   *  the OK are never missed.
   *  @param {string|QuerySpec} [prefix] @param {(event: FetchEvent) => void} [onEvent]
   *  @param {{timeout?: number}} [options]
   *  @returns {Promise<Fetch>}
   *  @throws {TypeError} a query spec that does not hold together (synchronously checked)
   *  @throws {InvalidQuery|LimitExceeded|TooLarge|UnknownFunction|Timeout|ConnectionClosed} */
  async fetch(prefix = "", onEvent = undefined, { timeout } = {}) {
    const query = buildQuery(prefix);
    const plain = isPlainPrefix(query);
    const fetch = new Fetch(this, plain ? query.matchers[0]?.operands[0] ?? "" : "", onEvent, this.fetchQueue,
      plain ? null : query);
    return this._startFetch(fetch, timeout, false);
  }

  /** Answer a query once (QUERY_ONCE, PROTOCOL.md 14.4; what node-jet 2 called `get`):
   *  the matching entries in order (byte order of key, nodes first; or the sort's window).
   *  @param {string|QuerySpec} [spec] as for `fetch` @param {{timeout?: number}} [options]
   *  @returns {Promise<QueryResult[]>}
   *  @throws {TypeError} a query spec that does not hold together
   *  @throws {InvalidQuery|LimitExceeded|TooLarge|UnknownFunction|Timeout|ConnectionClosed} */
  async query(spec = {}, { timeout } = {}) {
    const query = buildQuery(spec);
    const results = this._queryResults;
    let rid = -1;
    const answer = this._request({ function: "QUERY_ONCE", query }, (m) => results.get(m.id) ?? [], timeout);
    rid = this._nextId;
    results.set(rid, []);
    try {
      return await answer;
    } finally {
      results.delete(rid);
    }
  }

  /** Send the fetch's request; its OK makes it live before the next frame is decoded. */
  _startFetch(fetch, timeout, restoring) {
    const activate = (m) => {
      if (m.payload !== "fetch_id") throw new Malformed("FETCH answered OK without a fetch_id");
      fetch.fetchId = m.fetch_id;
      if (!fetch._end) {
        fetch.active = true;
        this._fetches.set(m.fetch_id, fetch); // synchronously, before the next frame is decoded
        this._fetchObjects.add(fetch);
      }
      return fetch;
    };
    if (fetch.query) {
      fetch.rows = []; // a restored sorted fetch starts with its whole window again
      return this._request({ function: "FETCH_QUERY", query: fetch.query }, activate, timeout, restoring);
    }
    return this._request({ function: "FETCH_STATES", prefix: fetch.prefix }, activate, timeout, restoring);
  }

  _dropFetch(fetch) {
    this._fetchObjects.delete(fetch);
    if (this._fetches.get(fetch.fetchId) === fetch) {
      this._fetches.delete(fetch.fetchId);
      if (this._ready) this._request({ function: "UNFETCH", fetch_id: fetch.fetchId }, () => undefined).catch(() => {});
    }
  }

  // --- owner role -----------------------------------------------------------------------------

  /** Add a state owned by this peer (ADD_STATE, PROTOCOL.md 6.1).
   *  @param {string} key @param {any} value its initial value
   *  @param {{onSet?: (value: any) => any, timeout?: number}} [options] onSet gets the requested
   *    value (mapped) and returns the value to keep (undefined keeps the requested one;
   *    may be async); it throws Rejected (or any PeerError) to refuse. Without onSet the
   *    state is read-only: sets are REJECTED.
   *  @returns {Promise<State>} */
  async addState(key, value, { onSet, timeout } = {}) {
    if (this._states.has(key) || this._methods.has(key)) throw new JetError(`this peer already owns ${key}`);
    const state = new State(this, key, Value.of(value), onSet);
    this._states.set(key, state);
    try {
      await this._request({ function: "ADD_STATE", key, value: state.raw }, () => undefined, timeout);
    } catch (e) {
      if (this._states.get(key) === state) this._states.delete(key);
      throw e;
    }
    return state;
  }

  /** Add a method owned by this peer (ADD_METHOD, PROTOCOL.md 6.6). The handler gets the
   *  argument (mapped) and returns the result (may be async); errors as for onSet.
   *  @returns {Promise<Method>} */
  async addMethod(key, handler, { timeout } = {}) {
    if (this._states.has(key) || this._methods.has(key)) throw new JetError(`this peer already owns ${key}`);
    const method = new Method(this, key, handler);
    this._methods.set(key, method);
    try {
      await this._request({ function: "ADD_METHOD", key }, () => undefined, timeout);
    } catch (e) {
      if (this._methods.get(key) === method) this._methods.delete(key);
      throw e;
    }
    return method;
  }

  async _serve(link, m) {
    // A routed SET_STATE or CALL_METHOD (REQUEST, or EVENT when fire-and-forget), answered
    // on the link it came from.
    const rid = m.type === "REQUEST" ? m.id : null;
    const isSet = m.function === "SET_STATE" || m.code === "SET_STATE";
    const owned = isSet ? this._states.get(m.key) : this._methods.get(m.key);
    if (!owned) return this._answerError(link, rid, new NotFound(`this peer owns no ${isSet ? "state" : "method"} ${m.key}`));
    const handler = isSet ? owned.onSet : owned.handler;
    if (!handler) return this._answerError(link, rid, new Rejected(`state ${m.key} is read-only`));
    let outcome;
    try {
      outcome = handler(m.value.toJS());
      if (outcome && typeof outcome.then === "function") outcome = await outcome;
    } catch (e) {
      return this._answerError(link, rid, e, handler);
    }
    let value;
    try {
      value = isSet && outcome === undefined ? m.value : Value.of(outcome);
    } catch (e) {
      return this._answerError(link, rid, new Internal(`${fnName(handler)} returned an unmappable value: ${e.message}`));
    }
    if (this._closedError || link !== this._link) return undefined;
    if (isSet) {
      if (owned.removed) return this._answerError(link, rid, new NotFound(`state ${m.key} was removed`));
      owned.raw = value;
      // PROTOCOL.md 10.3, 11: NOTIFY_STATE with the complete new value, then OK with it.
      this._send(encode({ type: "EVENT", code: "NOTIFY_STATE", key: m.key, value }), link);
    }
    if (rid !== null) this._send(encode({ type: "RESPONSE", id: rid, status: "OK", payload: "value", value }), link);
    return undefined;
  }

  _answerError(link, rid, error, handler) {
    let status;
    let text;
    if (error instanceof PeerError && error.status !== null && error.status !== Status.OK) {
      [status, text] = [error.status, error.reason];
    } else {
      // A handler that crashes is INTERNAL (a bug at the owner), not REJECTED.
      status = Status.INTERNAL;
      text = `${fnName(handler)} failed: ${error?.name ?? "Error"}: ${error?.message ?? error}`;
      console.error(`jet: ${text}`);
    }
    if (rid === null || this._closedError) return;
    this._send(encode({ type: "RESPONSE", id: rid, status, message: text.slice(0, MAX_ERROR_MESSAGE) }), link);
  }

  // --- receiving ------------------------------------------------------------------------------

  _onData(link, data) {
    if (link !== this._link) return;
    if (data === null) {
      // PROTOCOL.md 13.4: a text message from the daemon.
      return this._fatal(Status.MALFORMED, "text messages are not jet: frames travel in binary messages");
    }
    const decoder = this._decoder;
    decoder.receiveData(data);
    for (;;) {
      if (this._closedError || link !== this._link || link.closed) return;
      let m;
      try {
        m = decoder.nextMessage();
      } catch (e) {
        if (!(e instanceof ProtocolError)) throw e;
        this._onBadFrame(e);
        continue;
      }
      if (m === null) return;
      this._dispatch(link, m);
    }
  }

  _dispatch(link, m) {
    if (!link.seenInfo) {
      // PROTOCOL.md 11.1: the daemon's first frame is INFO; anything else is fatal.
      if (m.type !== "INFO") return this._fatal(Status.MALFORMED, `the daemon's first frame is ${m.type}, not INFO`);
      link.seenInfo = true;
    }
    if (m.type === "EVENT") {
      const kind = KINDS[m.code];
      if (kind) {
        this._fetches.get(m.fetch_id)?._deliver(kind, m.key, m.value);
      } else if (m.code === "FETCH_WINDOW") {
        const fetch = this._fetches.get(m.fetch_id);
        if (fetch?.query) fetch._applyWindow(m);
      } else if (m.code === "FETCH_METHOD" || m.code === "FETCH_NODE") {
        this._fetches.get(m.fetch_id)?._deliver(KEY_EVENT_KINDS[`${m.code} ${m.action}`], m.key, NONE);
      } else if (m.code === "QUERY_ENTRY") {
        this._queryResults.get(m.request_id)?.push(new QueryResult(m.kind.toLowerCase(), m.key, m.value));
      } else if (m.code === "CLOSE") {
        this.closeReason = { status: Status[m.status], message: m.message };
        link.close();
        this._onLinkLost(link, `daemon closed the connection: ${m.status} ${m.message}`);
      } else if (m.code === "SET_STATE" || m.code === "CALL_METHOD") {
        this._serve(link, m);
      }
      return;
    }
    if (m.type === "RESPONSE") {
      const entry = this._pending.get(m.id);
      if (!entry) return; // late (after our timeout): dropped
      this._pending.delete(m.id);
      clearTimeout(entry.timer);
      if (m.status !== "OK") return entry.reject(errorForStatus(Status[m.status], m.message));
      const shape = OK_SHAPES[entry.fn] ?? "empty";
      if (m.payload !== shape && !(shape === "value" && m.payload === "empty")) {
        // PROTOCOL.md 11.1: a RESPONSE of the wrong shape fails the request.
        return entry.reject(new Malformed(`an OK with ${m.payload} where ${entry.fn} calls for ${shape}`));
      }
      try {
        entry.resolve(entry.convert(m));
      } catch (e) {
        entry.reject(e);
      }
      return;
    }
    if (m.type === "REQUEST") {
      if (m.function === "SET_STATE" || m.function === "CALL_METHOD") this._serve(link, m);
      else this._send(encode({ type: "RESPONSE", id: m.id, status: "UNKNOWN_FUNCTION", message: "a peer serves only set and call" }));
      return;
    }
    // INFO: the first one completes the connection; a later one replaces it. A first one
    // that announces LIMITS without them: the answer to our INFO, with them, follows (4.4.1).
    if (this._infoWait && (m.features & FEATURE_LIMITS) && m.max_key_length === undefined) return;
    if (this._infoWait) {
      this._infoWait.resolve(m);
      this._infoWait = null;
    } else {
      this.info = m;
    }
  }

  _onBadFrame(e) {
    if (e.fatal || e.requestId === null) {
      if (e.frameType === "RESPONSE" && !e.fatal) return; // no readable id: dropped
      return this._fatal(e.status, `the daemon sent a bad frame: ${e.reason}`);
    }
    if (e.frameType === "RESPONSE") {
      const entry = this._pending.get(e.requestId);
      if (entry) {
        this._pending.delete(e.requestId);
        clearTimeout(entry.timer);
        entry.reject(new Malformed(`malformed response: ${e.reason}`));
      }
    } else if (e.frameType === "REQUEST") {
      // PROTOCOL.md 9.1, from the owner's side: answer and keep going.
      this._send(encode({ type: "RESPONSE", id: e.requestId, status: e.status, message: e.reason.slice(0, MAX_ERROR_MESSAGE) }));
    }
  }

  _fatal(status, message) {
    const link = this._link;
    if (this._closedError || !link) return;
    this._send(encode({ type: "EVENT", code: "CLOSE", status, message: message.slice(0, MAX_ERROR_MESSAGE) }));
    this._flush();
    link.close();
    this._onLinkLost(link, `connection closed: ${message}`);
  }

  /** The link `link` is gone: PROTOCOL.md 11.4 from the peer's side. */
  _onLinkLost(link, reason) {
    if (link !== this._link || this._closedError) return;
    const status = this.closeReason ? this.closeReason.status : null;
    this._out = [];
    const pending = this._pending;
    this._pending = new Map();
    for (const entry of pending.values()) {
      clearTimeout(entry.timer);
      entry.reject(new ConnectionClosed(reason, status));
    }
    this._infoWait?.reject(new ConnectionClosed(reason, status));
    this._infoWait = null;
    if (this._closing || this._reconnecting) return; // closing, or lost during a restore: the loop tries again
    if (this.reconnect && this._established) {
      this._ready = false;
      this._reconnecting = true;
      this._callback("ondisconnect", new ConnectionClosed(reason, status));
      this._reconnectLoop();
      return;
    }
    this._finalize(reason, status);
  }

  /** The connection ended for good. */
  _finalize(reason, status) {
    const error = new ConnectionClosed(reason, status);
    this._closedError = error;
    this._out = [];
    for (const entry of this._pending.values()) {
      clearTimeout(entry.timer);
      entry.reject(new ConnectionClosed(reason, status));
    }
    this._pending.clear();
    this._backlog = [];
    this._infoWait?.reject(error);
    this._infoWait = null;
    for (const fetch of [...this._fetchObjects]) fetch._finish(new ConnectionClosed(reason, status));
    this._fetchObjects.clear();
    this._fetches.clear();
    this._resolveClosed(error);
    this._callback("onclose", error);
  }

  _callback(name, arg) {
    const callback = this[name];
    if (typeof callback !== "function") return;
    try {
      callback(arg);
    } catch (e) {
      console.error(`jet: ${name} failed:`, e);
    }
  }

  // --- losing and restoring the link ----------------------------------------------------------

  async _reconnectLoop() {
    let delay = this.reconnectMinDelay;
    try {
      while (!this._closing) {
        await sleep(delay * (0.5 + Math.random() / 2));
        delay = Math.min(delay * 2, this.reconnectMaxDelay);
        if (this._closing) return;
        try {
          await this._open();
          await this._restore();
        } catch (e) {
          if (!(e instanceof JetError)) console.error("jet: reconnect failed:", e);
          this._link?.abort();
          continue;
        }
        if (this._closing) return;
        this.reconnects += 1;
        this._ready = true;
        const backlog = this._backlog;
        this._backlog = [];
        for (const [id, frame] of backlog) {
          if (id < 0 || this._pending.has(id)) this._send(frame);
        }
        this._callback("onreconnect");
        return;
      }
    } finally {
      this._reconnecting = false;
    }
  }

  /** Re-add states (current values) and methods, re-fetch, in one pipelined batch. */
  async _restore() {
    /** @type {Array<[State|Method, Promise<any>]>} */
    const owned = [];
    for (const state of this._states.values()) {
      owned.push([state, this._request({ function: "ADD_STATE", key: state.key, value: state.raw }, () => undefined, undefined, true)]);
    }
    for (const method of this._methods.values()) {
      owned.push([method, this._request({ function: "ADD_METHOD", key: method.key }, () => undefined, undefined, true)]);
    }
    this._fetches.clear();
    const fetches = [...this._fetchObjects];
    const waits = fetches.map((fetch) => {
      fetch._restoreSeen = fetch._known ? new Set() : null;
      return this._startFetch(fetch, undefined, true);
    });
    // The barrier's answer comes after every initial event of the fetches above
    // (PROTOCOL.md 10.1: one connection's frames are processed and answered in order).
    const barrier = this._request({ function: "GET_STATE", key: BARRIER_KEY }, () => null, undefined, true)
      .then(() => null, (e) => e); // handled now: it may fail while the others are awaited
    const results = await Promise.allSettled([...owned.map(([, p]) => p), ...waits]);
    const barrierError = await barrier;
    if (barrierError && !(barrierError instanceof NotFound || barrierError instanceof NotAuthorized)) throw barrierError;
    results.forEach((result, i) => {
      if (result.status === "fulfilled") return;
      if (result.reason instanceof ConnectionClosed) throw result.reason;
      if (i < owned.length) {
        // Typically ALREADY_EXISTS: another peer took the key while we were away.
        const handle = owned[i][0];
        console.error(`jet: could not restore ${handle.key} after reconnecting: ${result.reason.message}`);
        handle.removed = true;
        handle.restoreError = result.reason;
        if (handle instanceof State) this._states.delete(handle.key);
        else this._methods.delete(handle.key);
      } else {
        fetches[i - owned.length]._finish(result.reason);
      }
    });
    for (const fetch of fetches) {
      const seen = fetch._restoreSeen;
      fetch._restoreSeen = null;
      if (!fetch._known || !seen || !fetch.active) continue;
      for (const [id, raw] of [...fetch._known]) {
        if (seen.has(id)) continue;
        const kind = id[0] === "a" ? "remove" : id[0] === "m" ? "method_remove" : "node_remove";
        fetch._deliver(kind, id.slice(2), raw);
      }
    }
  }

  /** Close the connection: CLOSE (OK) to the daemon (PROTOCOL.md 7.3), pending requests
   *  fail with ConnectionClosed, fetch iterators end; no reconnect follows. Idempotent. */
  async close() {
    const link = this._link;
    if (!this._closedError) {
      this._closing = true;
      if (link && !link.closed) {
        this._send(encode({ type: "EVENT", code: "CLOSE", status: "OK", message: "peer closing" }));
        this._flush();
      }
      for (const fetch of [...this._fetchObjects]) fetch._finish("done");
      this._finalize("peer closed", null);
      link?.close();
    }
    if (link && !link.closed) {
      await Promise.race([
        new Promise((resolve) => {
          const previous = link.onclose;
          link.onclose = (r) => { previous(r); resolve(); };
        }),
        new Promise((resolve) => setTimeout(resolve, 3000)),
      ]);
      if (!link.closed) link.abort();
    }
  }
}

function convertValue(m) {
  // PROTOCOL.md 6.3: an empty OK to a set means NONE.
  return m.value === undefined ? null : m.value.toJS();
}
