// reconnect: true against a real jetd restarted on the same ports (PROTOCOL.md 11.4), over
// TCP and over WebSocket: states (current values), methods and fetches are restored, a
// fetch goes on and reports only the difference, requests in flight fail with
// ConnectionClosed, requests made during the outage wait for the restore, and a key taken
// meanwhile marks the handle lost.
import { test } from "node:test";
import assert from "node:assert/strict";
import { AlreadyExists, ConnectionClosed, Peer, Status } from "../jet.js";
import { startJetd, stopJetd } from "./jetd.js";

/** Restart on the same ports as `jetd`. */
const restart = (jetd) => startJetd("--port", jetd.tcp.split(":").at(-1), "--http-port", new URL(jetd.ws).port);

async function eventually(check, what, ms = 10000) {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) throw new Error(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

const fast = { reconnect: true, reconnectMinDelay: 20, reconnectMaxDelay: 200 };

for (const transport of ["tcp", "ws"]) {
  test(`over ${transport}: a daemon restart restores states, methods and fetches`, async () => {
    let jetd = await startJetd();
    const app = await Peer.connect(jetd[transport], { name: "app", ...fast });
    const lost = [];
    app.ondisconnect = (e) => lost.push(e);
    const state = await app.addState("app/setpoint", 10, { onSet: (v) => Math.max(v, 0) });
    await app.addMethod("app/echo", (x) => ["echo", x]);
    const events = [];
    await app.fetch("app/", (ev) => events.push([ev.kind, ev.key, ev.value]));
    const iterated = await app.fetch({ prefix: "ext/", where: [] });
    const iterator = iterated[Symbol.asyncIterator]();
    const board = await app.fetch({ prefix: "ext/", sortBy: "key", top: 5 });
    const hang = await Peer.connect(jetd.tcp);
    await hang.addMethod("hang/forever", () => new Promise(() => {}));
    const other = await Peer.connect(jetd.tcp);
    await other.addState("app/foreign", "before");
    await other.addState("ext/x", 1);
    assert.equal((await iterator.next()).value.key, "ext/x");
    await other.close();
    await eventually(() => events.some((e) => e[0] === "remove" && e[1] === "app/foreign"), "foreign removed");
    await state.notify(12); // the value the restore must bring back
    const inFlight = app.call("hang/forever", 1).then(() => "answered", (e) => e);

    assert.equal(await stopJetd(jetd), 0, jetd.stderr());
    assert.ok(await inFlight instanceof ConnectionClosed, "a request in flight fails at once");
    assert.equal((await inFlight).status, Status.OK); // the daemon's CLOSE (shutting down)
    await eventually(() => !app.connected, "link down");
    const duringOutage = app.get("app/setpoint"); // waits for the restore
    jetd = await restart(jetd);
    try {
      assert.equal(await duringOutage, 12);
      await eventually(() => app.reconnects === 1 && app.connected, "reconnected");
      assert.equal(lost.length, 1);
      const client = await Peer.connect(jetd.tcp);
      assert.equal(await client.get("app/setpoint"), 12);
      assert.deepEqual(await client.call("app/echo", 5), ["echo", 5]);
      assert.equal(await client.set("app/setpoint", -4), 0); // the handler still runs
      assert.equal(state.value, 0);
      await client.addState("app/new", "after");
      await client.addState("ext/y", 2);
      await eventually(() => events.some((e) => e[0] === "add" && e[1] === "app/new"), "add after restart");
      // The iterator goes on across the restart: ext/x went with the old daemon.
      const gone = (await iterator.next()).value;
      assert.deepEqual([gone.kind, gone.key], ["remove", "ext/x"]);
      const added = (await iterator.next()).value;
      assert.deepEqual([added.kind, added.key, added.value], ["add", "ext/y", 2]);
      await eventually(() => board.rows.map((r) => r.key).join() === "ext/y", "the window restored");
      // Own state added again with the value the fetch had seen: no second add.
      assert.equal(events.filter((e) => e[0] === "add" && e[1] === "app/setpoint").length, 1);
      assert.ok(events.some((e) => e[0] === "change" && e[1] === "app/setpoint" && e[2] === 0));
      await client.close();
      await hang.close();
      await app.close();
      assert.equal(app.connected, false);
      assert.ok((await app.closed) instanceof ConnectionClosed);
    } finally {
      assert.equal(await stopJetd(jetd), 0, jetd.stderr());
    }
  });
}

test("a key taken during the outage marks the handle lost; the rest is restored", async () => {
  let jetd = await startJetd();
  const app = await Peer.connect(jetd.ws, { reconnect: true, reconnectMinDelay: 1500, reconnectMaxDelay: 1500 });
  const state = await app.addState("c/x", "mine", { onSet: (v) => v });
  await app.addState("c/kept", 1);
  assert.equal(await stopJetd(jetd), 0, jetd.stderr());
  jetd = await restart(jetd);
  try {
    // The app waits at least 0.75 s before reconnecting: another peer is faster.
    const other = await Peer.connect(jetd.tcp);
    await other.addState("c/x", "theirs", { onSet: (v) => `theirs:${v}` });
    await eventually(() => app.reconnects === 1, "reconnect");
    assert.ok(state.removed);
    assert.ok(state.restoreError instanceof AlreadyExists);
    assert.equal(await app.set("c/x", "v"), "theirs:v"); // served by the other owner
    assert.equal(await app.get("c/kept"), 1);
    await other.close();
    await app.close();
  } finally {
    assert.equal(await stopJetd(jetd), 0, jetd.stderr());
  }
});

test("without reconnect, a lost daemon ends the peer for good", async () => {
  const jetd = await startJetd();
  const peer = await Peer.connect(jetd.tcp);
  assert.equal(await stopJetd(jetd), 0, jetd.stderr());
  assert.ok((await peer.closed) instanceof ConnectionClosed);
  await assert.rejects(peer.get("x"), ConnectionClosed);
  assert.equal(peer.reconnects, 0);
});

test("with reconnect, a first connection that fails is not retried", async () => {
  const jetd = await startJetd("--auth", "spec/conformance/users.toml", "--auth-failure-delay", "0.05");
  try {
    await assert.rejects(Peer.connect(jetd.tcp, { ...fast, user: "cf-reader", password: "nope" }), /AUTH_FAILED/);
    await new Promise((r) => setTimeout(r, 300)); // several reconnect delays
    assert.doesNotMatch(jetd.stderr(), /open #2/); // no second connection was made
  } finally {
    assert.equal(await stopJetd(jetd), 0, jetd.stderr());
  }
});
