// Queries from the JavaScript peer (PROTOCOL.md 14) against a real jetd, over TCP and over
// WebSocket: a live sorted window (the scoreboard), filters over the whole life of a fetch,
// methods and nodes, one-shot queries, typed errors.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import {
  FEATURE_QUERIES, InvalidQuery, LimitExceeded, Peer, buildQuery, field, key, value,
} from "../jet.js";
import { startJetd, stopJetd } from "./jetd.js";

let jetd;
before(async () => { jetd = await startJetd(); });
after(async () => {
  const code = await stopJetd(jetd);
  assert.equal(code, 0, jetd.stderr());
});

/** The next event of an iterated fetch, or a failure after `ms`. */
async function next(iterator, ms = 5000) {
  let timer;
  const timeout = new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`no event within ${ms} ms`)), ms); });
  try {
    const { value: event, done } = await Promise.race([iterator.next(), timeout]);
    assert.ok(!done, "the fetch ended");
    return event;
  } finally {
    clearTimeout(timer);
  }
}

const player = (i, score = i) => ({ name: `p${i}`, gender: i % 2 ? "female" : "male", score });

for (const transport of ["tcp", "ws"]) {
  describe(`queries over ${transport}`, () => {
    let owner;
    let fan;
    const ns = `q${transport}/`;
    before(async () => {
      owner = await Peer.connect(jetd.tcp, { name: "owner" });
      fan = await Peer.connect(jetd[transport], { name: `fan-${transport}` });
      assert.ok(fan.info.features & FEATURE_QUERIES);
    });
    after(async () => { await owner.close(); await fan.close(); });

    test("the scoreboard: a sorted, filtered window stays live, as rows and as changes", async () => {
      const players = [];
      for (let i = 0; i < 8; i++) players.push(await owner.addState(`${ns}players/p${i}`, player(i)));
      const board = await fan.fetch({
        prefix: `${ns}players/`, where: [field("gender").eq("female")], sortBy: "score", descending: true, top: 3,
      });
      assert.ok(board.query, "a query fetch (FETCH_QUERY)");
      const events = board[Symbol.asyncIterator]();
      const first = await next(events);
      assert.equal(first.kind, "window");
      assert.deepEqual(first.rows.map((r) => [r.index, r.key, r.value.score]),
        [[1, `${ns}players/p7`, 7], [2, `${ns}players/p5`, 5], [3, `${ns}players/p3`, 3]]);
      assert.equal(first.changes.length, 3);
      await players[1].notify(player(1, 100)); // p1 enters at the top, p3 drops out
      const update = await next(events);
      assert.deepEqual(update.rows.map((r) => r.key), [`${ns}players/p1`, `${ns}players/p7`, `${ns}players/p5`]);
      assert.deepEqual(update.changes.map((r) => r.index), [1, 2, 3]); // every shifted position
      assert.deepEqual(board.rows.map((r) => r.value.score), [100, 7, 5]);
      await players[7].notify(player(7, 4)); // p7 drops below p5: positions 2 and 3 change
      const swap = await next(events);
      assert.deepEqual(swap.changes.map((r) => [r.index, r.key]), [[2, `${ns}players/p5`], [3, `${ns}players/p7`]]);
      assert.deepEqual(swap.rows.map((r) => r.key), [`${ns}players/p1`, `${ns}players/p5`, `${ns}players/p7`]);
      await players[5].remove(); // the window shrinks... and p3 comes back in
      const shrink = await next(events);
      assert.deepEqual(shrink.rows.map((r) => r.key), [`${ns}players/p1`, `${ns}players/p7`, `${ns}players/p3`]);
      await board.unfetch();
      // The same query once: the window in order.
      const once = await fan.query({ prefix: `${ns}players/`, sortBy: "score", top: 2 });
      assert.deepEqual(once.map((r) => [r.kind, r.key, r.value.score]),
        [["state", `${ns}players/p0`, 0], ["state", `${ns}players/p2`, 2]]);
      await Promise.all(players.filter((p) => !p.removed).map((p) => p.remove()));
    });

    test("a filter holds for the life of the fetch: add, change, unmatch, remove with their reasons", async () => {
      const temp = await owner.addState(`${ns}plant/a/temp`, 10);
      const other = await owner.addState(`${ns}plant/a/pressure`, 99);
      const seen = [];
      const hot = await fan.fetch({ prefix: `${ns}plant/`, match: [key.endsWith("/temp")], where: [value.gt(30)] },
        (ev) => seen.push([ev.kind, ev.key, ev.value, ev.reason]));
      await temp.notify(35);
      await temp.notify(40);
      await other.notify(100); // not a /temp key: never seen
      await temp.notify(20);
      await temp.notify(50);
      await temp.remove();
      await fan.get(`${ns}plant/a/pressure`); // answered after every event above (PROTOCOL.md 10.1)
      const k = `${ns}plant/a/temp`;
      assert.deepEqual(seen, [
        ["add", k, 35, null], ["change", k, 40, null], ["unmatch", k, 20, "unmatched"],
        ["add", k, 50, null], ["remove", k, 50, "removed"],
      ]);
      await hot.unfetch();
      await other.remove();
    });

    test("methods and nodes: fetched as they come and go, and listed once", async () => {
      const temp = await owner.addState(`${ns}m/line1/temp`, 21);
      const reset = await owner.addMethod(`${ns}m/line1/reset`, () => null);
      const seen = [];
      const tree = await fan.fetch({ match: [key.startsWith(`${ns.toUpperCase()}M/`).ignoreCase()], methods: true, nodes: true },
        (ev) => seen.push([ev.kind, ev.key]));
      await fan.get(`${ns}m/line1/temp`);
      assert.deepEqual(seen, [
        ["node_add", `${ns}m/line1`], ["method_add", `${ns}m/line1/reset`], ["add", `${ns}m/line1/temp`],
      ]);
      const once = await fan.query({ prefix: `${ns}m`, methods: true, nodes: true });
      assert.deepEqual(once.map((e) => [e.kind, e.key]), [
        ["node", `${ns}m`], ["node", `${ns}m/line1`],
        ["method", `${ns}m/line1/reset`], ["state", `${ns}m/line1/temp`],
      ]);
      assert.equal(once[3].value, 21);
      assert.equal(once[2].value, null);
      assert.deepEqual(await fan.query({ match: [key.startsWith(`${ns}m/`), key.contains("temp").not()] }), []);
      assert.equal((await fan.query({ match: [key.startsWith(`${ns}m/`), key.contains("temp")] })).length, 1);
      seen.length = 0;
      await reset.remove();
      await temp.remove();
      await fan.get(`${ns}nothing`).catch(() => {});
      assert.deepEqual(seen, [
        ["method_remove", `${ns}m/line1/reset`], ["remove", `${ns}m/line1/temp`], ["node_remove", `${ns}m/line1`],
      ]);
      await tree.unfetch();
    });

    test("errors are typed: INVALID_QUERY, LIMIT_EXCEEDED, and a spec that does not hold together", async () => {
      await assert.rejects(fan.query({ where: [field("a").eq(1)], methods: true }),
        (e) => e instanceof InvalidQuery && /METHODS|filters/i.test(e.message));
      await assert.rejects(fan.fetch({ where: [value.eq(NaN)] }), InvalidQuery);
      await assert.rejects(fan.fetch({ sortBy: "key", window: [1, 100000] }), LimitExceeded);
      await assert.rejects(fan.fetch({ window: [1, 3] }), TypeError); // no sort
      await assert.rejects(fan.query({ top: 3, window: [1, 3], sortBy: "key" }), TypeError);
      await assert.rejects(fan.query({ where: ["score > 3"] }), TypeError);
      await assert.rejects(fan.query({ prefx: "x" }), /unknown query option "prefx"/);
      assert.throws(() => value.isType("date"), TypeError);
      assert.throws(() => field(""), TypeError);
      assert.equal(await fan.get(`${ns}still/open`).catch((e) => e.constructor.name), "NotFound"); // the connection stays open
    });

    test("a plain prefix, as a string or a spec, is FETCH_STATES", async () => {
      const state = await owner.addState(`${ns}plain/x`, "x");
      const seen = [];
      const a = await fan.fetch(`${ns}plain/`, (ev) => seen.push(ev.key));
      const b = await fan.fetch({ prefix: `${ns}plain/` }, (ev) => seen.push(ev.key));
      assert.equal(a.query, null);
      assert.equal(b.query, null);
      await fan.get(`${ns}plain/x`);
      assert.deepEqual(seen, [`${ns}plain/x`, `${ns}plain/x`]);
      await Promise.all([a.unfetch(), b.unfetch(), state.remove()]);
    });
  });
}

test("buildQuery gives the wire form of spec/vectors (the scoreboard of PROTOCOL.md 14.1)", () => {
  assert.deepEqual(buildQuery({ prefix: "players/", where: [field("gender").eq("female")], sortBy: "score", descending: true, top: 10 }), {
    flags: 0,
    matchers: [{ op: "STARTS_WITH", flags: 0, operands: ["players/"] }],
    filters: [{ op: "EQ", flags: 0, field: "gender", value: field("gender").eq("female").value }],
    sort_by: "FIELD", sort_flags: 1, sort_field: "score", from: 1, to: 10,
  });
  assert.deepEqual(buildQuery({ sortBy: "key" }).to, 1000);
  assert.equal(buildQuery({ match: [key.equalsOneOf("a", "b").not().ignoreCase()] }).matchers[0].flags, 3);
});
