// The Peer against a real jetd (python -m jetd from this repository), over TCP and over
// WebSocket: every role, every value type, typed errors, fetch ordering and CLOSE.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import {
  AlreadyExists, ConnectionClosed, Internal, NotFound, Peer, Rejected, Status, Value, WrongKind,
} from "../jet.js";

import { startJetd, stopJetd } from "./jetd.js";

let jetd;
before(async () => { jetd = await startJetd(); });
after(async () => { assert.equal(await stopJetd(jetd), 0, jetd.stderr()); });

for (const transport of ["tcp", "ws"]) {
  describe(`over ${transport}`, () => {
    let owner;
    let client;
    const ns = `${transport}/`;
    before(async () => {
      owner = await Peer.connect(jetd.tcp, { name: "owner" });
      client = await Peer.connect(jetd[transport], { name: `client-${transport}` });
    });
    after(async () => { await owner.close(); await client.close(); });

    test("a routed set: the owner adapts it, fetchers see the change before the OK", async () => {
      const state = await owner.addState(`${ns}temp`, 21.5, { onSet: (v) => Math.min(v, 30) });
      const events = [];
      const fetch = await client.fetch(ns, (ev) => events.push([ev.kind, ev.key, ev.value]));
      assert.deepEqual(events, [["add", `${ns}temp`, 21.5]]); // the initial add came with the OK
      assert.equal(await client.set(`${ns}temp`, 42), 30);
      assert.deepEqual(events.at(-1), ["change", `${ns}temp`, 30]); // PROTOCOL.md 10.3
      assert.equal(state.value, 30);
      assert.equal(await client.get(`${ns}temp`), 30);
      await state.notify(12.25);
      assert.equal(await client.get(`${ns}temp`), 12.25);
      await state.remove();
      assert.deepEqual(events.at(-1), ["remove", `${ns}temp`, 12.25]);
      await fetch.unfetch();
    });

    test("initial adds in the same read as the OK are never lost", async () => {
      const many = [];
      for (let i = 0; i < 300; i++) many.push(owner.addState(`${ns}many/${String(i).padStart(3, "0")}`, BigInt(i)));
      const states = await Promise.all(many);
      const keys = [];
      const fetch = await client.fetch(`${ns}many/`, (ev) => keys.push(ev.key));
      // The OK and all 300 adds left the daemon in one write; the fetch id was registered
      // while that read was decoded, so every add is here by the time the OK resolves... or
      // at the latest within the same turn's later reads.
      await client.get(`${ns}many/000`); // answered after every initial add (PROTOCOL.md 10.1)
      assert.equal(keys.length, 300);
      assert.deepEqual(keys, [...keys].sort());
      await fetch.unfetch();
      await Promise.all(states.map((s) => s.remove()));
    });

    test("a fetch iterated with for await", async () => {
      const state = await owner.addState(`${ns}iter`, "a", { onSet: (v) => v });
      const fetch = await client.fetch(`${ns}iter`);
      const seen = [];
      const reader = (async () => {
        for await (const ev of fetch) {
          seen.push(`${ev.kind}:${ev.value}`);
          if (seen.length === 3) break;
        }
      })();
      await client.set(`${ns}iter`, "b");
      await state.notify("c");
      await reader;
      assert.deepEqual(seen, ["add:a", "change:b", "change:c"]);
      await state.remove();
    });

    test("every value type travels both ways", async () => {
      const values = [
        null, true, false, -(2n ** 63n), 2n ** 63n - 1n, 9007199254740993n, 22.5, -0, Infinity, NaN,
        "grüße 🌍", { a: [1, 2.5, null, true], b: "é" }, [1, "x"], Uint8Array.of(0, 1, 255),
        new Value(0x80, Uint8Array.of(9, 9)), new Value(7, Uint8Array.of(0xf6)),
      ];
      const echo = await owner.addMethod(`${ns}echo`, (arg) => arg);
      const state = await owner.addState(`${ns}any`, null, { onSet: () => undefined });
      for (const value of values) {
        const same = (got) => {
          if (value instanceof Value) return assert.ok(value.equals(got), `${value}`);
          if (value instanceof Uint8Array) return assert.deepEqual(Array.from(got), Array.from(value));
          if (typeof value === "object" && value !== null) return assert.deepEqual(got, value);
          return assert.ok(Object.is(got, value), `${String(value)} -> ${String(got)}`);
        };
        same(await client.call(`${ns}echo`, value));
        same(await client.set(`${ns}any`, value));
        same(await client.get(`${ns}any`));
        same((await client.getRaw(`${ns}any`)).toJS());
      }
      await echo.remove();
      await state.remove();
    });

    test("errors are typed", async () => {
      const ro = await owner.addState(`${ns}ro`, 1n);
      const picky = await owner.addState(`${ns}picky`, 1n, {
        onSet: (v) => { if (v < 0n) throw new Rejected("must be >= 0"); return v; },
      });
      const broken = await owner.addMethod(`${ns}broken`, () => { throw new TypeError("oops"); });
      await assert.rejects(client.set(`${ns}nope`, 1), NotFound);
      await assert.rejects(client.set(`${ns}ro`, 2n), (e) => e instanceof Rejected && /read-only/.test(e.message));
      await assert.rejects(client.set(`${ns}picky`, -1n), (e) => e instanceof Rejected && e.reason === "must be >= 0");
      assert.equal(await client.set(`${ns}picky`, 5n), 5n);
      await assert.rejects(client.call(`${ns}picky`), WrongKind);
      await assert.rejects(client.get(`${ns}broken`), WrongKind);
      await assert.rejects(client.call(`${ns}broken`), (e) => e instanceof Internal && /TypeError: oops/.test(e.message));
      await assert.rejects(client.addState(`${ns}ro`, 0), (e) => e instanceof AlreadyExists && e.status === Status.ALREADY_EXISTS);
      await Promise.all([ro.remove(), picky.remove(), broken.remove()]);
    });

    test("an async fetch callback gets events one at a time, in order; nextBatch; drain", async () => {
      const state = await owner.addState(`${ns}slowcb`, 0n);
      const log = [];
      let running = 0;
      const fetch = await client.fetch(`${ns}slowcb`, async (ev) => {
        running += 1;
        assert.equal(running, 1, "two events handled at once");
        await new Promise((r) => setTimeout(r, 5));
        log.push(ev.value);
        running -= 1;
        if (ev.value === 3n) throw new Error("a failing callback does not stop the next events");
      });
      for (let i = 1n; i <= 5n; i++) state.notifyNowait(i);
      await owner.drain();
      await new Promise((resolve) => { const poll = () => (log.length === 6 ? resolve() : setTimeout(poll, 5)); poll(); });
      assert.deepEqual(log, [0n, 1n, 2n, 3n, 4n, 5n]);
      await fetch.unfetch();
      const iterated = await client.fetch(`${ns}slowcb`);
      await client.get(`${ns}slowcb`);
      state.notifyNowait(6n);
      state.notifyNowait(7n);
      await owner.drain();
      await client.get(`${ns}slowcb`);
      let batch = [];
      while (batch.length < 3) batch = batch.concat(await iterated.nextBatch());
      assert.deepEqual(batch.map((e) => [e.kind, e.value]), [["add", 5n], ["change", 6n], ["change", 7n]]);
      await iterated.unfetch();
      assert.deepEqual(await iterated.nextBatch(), []);
      await state.remove();
    });

    test("async handlers and fire-and-forget", async () => {
      const slow = await owner.addMethod(`${ns}later`, async (x) => {
        await new Promise((r) => setTimeout(r, 20));
        return x * 2;
      });
      const seen = [];
      const target = await owner.addState(`${ns}ff`, 0, { onSet: async (v) => v + 1 });
      const fetch = await client.fetch(`${ns}ff`, (ev) => seen.push(ev.value));
      assert.equal(await client.call(`${ns}later`, 21), 42);
      client.setNowait(`${ns}ff`, 10);
      await new Promise((resolve) => { const poll = () => (seen.includes(11) ? resolve() : setTimeout(poll, 5)); poll(); });
      await fetch.unfetch();
      await Promise.all([slow.remove(), target.remove()]);
    });
  });
}

test("CLOSE: a daemon shutting down closes its peers with status OK", async () => {
  const own = await startJetd();
  const tcp = await Peer.connect(own.tcp);
  const ws = await Peer.connect(own.ws);
  const pending = ws.call("nothing/here/yet", 1).catch((e) => e);
  await pending;
  const code = await stopJetd(own);
  assert.equal(code, 0, own.stderr());
  for (const peer of [tcp, ws]) {
    const closed = await peer.closed;
    assert.ok(closed instanceof ConnectionClosed);
    assert.equal(closed.status, Status.OK);
    assert.match(closed.message, /shutting down/);
    await assert.rejects(peer.get("x"), ConnectionClosed);
  }
});

test("a refused origin fails the connection", async () => {
  await assert.rejects(Peer.connect(jetd.ws, { origin: "http://evil.example" }), ConnectionClosed);
});
