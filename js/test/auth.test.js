// Authentication and permissions (PROTOCOL.md 15) from the JavaScript peer, over TCP and
// WebSocket, against a real jetd started with the conformance users file.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { AuthFailed, FEATURE_AUTH_REQUIRED, NotAuthorized, Peer } from "../jet.js";
import { startJetd, stopJetd } from "./jetd.js";

let jetd;
before(async () => {
  jetd = await startJetd("--auth", "spec/conformance/users.toml", "--auth-failure-delay", "0.05");
});
after(async () => {
  const code = await stopJetd(jetd);
  assert.equal(code, 0, jetd.stderr());
});

for (const transport of ["tcp", "ws"]) {
  describe(`authentication over ${transport}`, () => {
    test("user and password, permissions, a wrong password", async () => {
      const owner = await Peer.connect(jetd[transport], { user: "cf-owner", password: "owner-pw" });
      assert.ok(owner.info.features & FEATURE_AUTH_REQUIRED);
      await owner.addState(`cfauth/public/js-${transport}`, 5);
      const reader = await Peer.connect(jetd[transport], { user: "cf-reader", password: "reader-pw" });
      assert.equal(await reader.get(`cfauth/public/js-${transport}`), 5);
      await assert.rejects(reader.set(`cfauth/public/js-${transport}`, 6),
        (e) => e instanceof NotAuthorized && e.message.includes(`write cfauth/public/js-${transport}`));
      await assert.rejects(Peer.connect(jetd[transport], { user: "cf-reader", password: "nope" }), AuthFailed);
      await reader.close();
      await owner.close();
    });
  });
}
