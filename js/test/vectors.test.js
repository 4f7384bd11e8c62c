// Every vector of spec/vectors/ (frames-valid.json, frames-invalid.json): decoded whole,
// split in two at every offset and one byte at a time, and encoded back.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Decoder, ProtocolError, Status, Value, encode } from "../jet.js";

const dir = fileURLToPath(new URL("../../spec/vectors/", import.meta.url));
const valid = JSON.parse(readFileSync(`${dir}frames-valid.json`, "utf8"));
const invalid = JSON.parse(readFileSync(`${dir}frames-invalid.json`, "utf8"));

const fromHex = (hex) => Uint8Array.from(hex.match(/../g) ?? [], (b) => parseInt(b, 16));
const toHex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");

/** The vector JSON of a decoded message (normative fields; readings checked separately),
 *  Values nested in queries and window entries included. */
function toJson(m) {
  if (m instanceof Value) return { vtype: m.vtype, hex: toHex(m.data) };
  if (Array.isArray(m)) return m.map(toJson);
  if (m === null || typeof m !== "object") return m;
  return Object.fromEntries(Object.entries(m).map(([k, v]) => [k, toJson(v)]));
}

function normative(message) {
  if (Array.isArray(message)) return message.map(normative);
  if (message === null || typeof message !== "object") return message;
  const out = {};
  for (const [k, v] of Object.entries(message)) {
    out[k] = k === "value" ? { vtype: v.vtype, hex: v.hex } : normative(v);
  }
  return out;
}

function fromJson(message) {
  if (Array.isArray(message)) return message.map(fromJson);
  if (message === null || typeof message !== "object") return message;
  const out = {};
  for (const [k, v] of Object.entries(message)) {
    out[k] = k === "value" ? new Value(v.vtype, fromHex(v.hex)) : fromJson(v);
  }
  return out;
}

/** Python's repr of a float, as the vectors write it. */
function pyRepr(x) {
  if (Number.isNaN(x)) return "nan";
  if (x === Infinity) return "inf";
  if (x === -Infinity) return "-inf";
  if (Object.is(x, -0)) return "-0.0";
  if (Number.isInteger(x) && Math.abs(x) < 1e16) return `${x}.0`;
  return String(x).replace(/e\+?/, "e+").replace("e+-", "e-");
}

function checkReading(value, expected) {
  if (expected.type === "JSON") {
    // The codec carries JSON without parsing it; converting a bad one raises Malformed.
    assert.equal(new TextDecoder().decode(value.data), expected.text);
    let parsed = true;
    try { JSON.parse(expected.text); } catch { parsed = false; }
    if (parsed) assert.deepEqual(value.toJS(), JSON.parse(expected.text));
    else assert.throws(() => value.toJS(), { name: "Malformed" });
    return;
  }
  const js = value.toJS();
  if ("int" in expected) assert.equal(js, BigInt(expected.int));
  if ("bool" in expected) assert.equal(js, expected.bool);
  if ("float" in expected) {
    // spec/vectors/README.md: ECMAScript's Number::toString, but "-0" for negative zero.
    const want = expected.float === "-0" ? -0 : Number(expected.float);
    assert.ok(Object.is(js, want), `${js} vs ${expected.float} (${pyRepr(js)})`);
    assert.equal(Object.is(js, -0) ? "-0" : String(js), expected.float);
  }
  if ("text" in expected && expected.type === "STRING") assert.equal(js, expected.text);
  if (expected.type === "BYTES") assert.ok(js instanceof Uint8Array);
}

function decodeAll(chunks, maxBody) {
  const decoder = new Decoder({ maxBody });
  const messages = [];
  for (const chunk of chunks) {
    decoder.receiveData(chunk);
    for (let m = decoder.nextMessage(); m !== null; m = decoder.nextMessage()) messages.push(m);
  }
  return messages;
}

function splits(bytes) {
  const ways = [[bytes], Array.from(bytes, (b) => Uint8Array.of(b))];
  // Splitting at every offset is quadratic: large vectors (65 KiB keys) are split at every
  // offset near both ends and every 4999th in between (tests/codec: every 997th).
  for (let i = 1; i < bytes.length; i++) {
    if (bytes.length > 4096 && i > 16 && i < bytes.length - 16 && i % 4999) continue;
    ways.push([bytes.subarray(0, i), bytes.subarray(i)]);
  }
  return ways;
}

test("valid vectors decode, in any chunking, and encode back byte for byte", () => {
  assert.ok(valid.vectors.length >= 100);
  for (const v of valid.vectors) {
    const bytes = fromHex(v.hex);
    for (const chunks of splits(bytes)) {
      const messages = decodeAll(chunks, v.max_body ?? valid.default_max_body);
      assert.equal(messages.length, 1, v.name);
      assert.deepEqual(toJson(messages[0]), normative(v.message), v.name);
    }
    const decoded = decodeAll([bytes], v.max_body ?? valid.default_max_body)[0];
    if (v.message.value) checkReading(decoded.value, v.message.value);
    (v.message.entries ?? []).forEach((e, i) => checkReading(decoded.entries[i].value, e.value));
    (v.message.query?.filters ?? []).forEach((f, i) => checkReading(decoded.query.filters[i].value, f.value));
    assert.equal(toHex(encode(fromJson(v.message))), v.hex, `encode ${v.name}`);
  }
});

test("all valid vectors fed as one stream decode in order", () => {
  const all = valid.vectors.map((v) => fromHex(v.hex));
  const joined = new Uint8Array(all.reduce((n, b) => n + b.length, 0));
  let at = 0;
  for (const b of all) { joined.set(b, at); at += b.length; }
  const messages = decodeAll([joined.subarray(0, 7), joined.subarray(7, 999), joined.subarray(999)], 1 << 30);
  assert.equal(messages.length, valid.vectors.length);
});

test("invalid vectors fail on their first frame with the given error, in any chunking", () => {
  for (const v of invalid.vectors) {
    const bytes = fromHex(v.hex);
    for (const chunks of splits(bytes)) {
      const decoder = new Decoder({ maxBody: v.max_body ?? invalid.default_max_body });
      let error = null;
      try {
        for (const chunk of chunks) {
          decoder.receiveData(chunk);
          const m = decoder.nextMessage();
          assert.equal(m, null, `${v.name}: a message before the error`);
        }
      } catch (e) {
        error = e;
      }
      assert.ok(error instanceof ProtocolError, `${v.name}: ${error}`);
      assert.equal(error.status, Status[v.error.status], `${v.name}: ${error.message}`);
      assert.equal(error.fatal, v.error.fatal, v.name);
      assert.equal(error.requestId, v.error.request_id, v.name);
      assert.equal(error.frameType, v.error.frame_type, v.name);
      if (error.fatal) assert.throws(() => decoder.nextMessage(), ProtocolError, `${v.name}: stays failed`);
    }
  }
});

test("incomplete inputs produce nothing and no error", () => {
  for (const v of invalid.incomplete) {
    for (const chunks of splits(fromHex(v.hex))) {
      assert.deepEqual(decodeAll(chunks, invalid.default_max_body), [], v.name);
    }
  }
});

test("values map to JavaScript and back", () => {
  const cases = [
    [null, 0], [true, 1], [false, 1], [-(2n ** 63n), 2], [2n ** 63n - 1n, 2], [22.5, 3], [-0, 3],
    ["grüße", 4], [{ a: [1, 2] }, 5], [Uint8Array.of(0, 255), 6],
  ];
  for (const [js, vtype] of cases) {
    const value = Value.of(js);
    assert.equal(value.vtype, vtype);
    const back = value.toJS();
    if (js instanceof Uint8Array) assert.deepEqual(Array.from(back), Array.from(js));
    else if (typeof js === "object" && js !== null) assert.deepEqual(back, js);
    else assert.ok(Object.is(back, js), `${js}`);
  }
  assert.throws(() => Value.of(2n ** 63n), RangeError);
  assert.throws(() => new Value(5, new TextEncoder().encode("{bad")).toJS(), { name: "Malformed" });
  const cbor = new Value(7, Uint8Array.of(0xf6));
  assert.equal(cbor.toJS(), cbor);
});
