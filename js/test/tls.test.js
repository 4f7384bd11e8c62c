// TLS (PROTOCOL.md 15.6) from the JavaScript peer in Node.js: tls:// and wss:// against a
// real jetd started with --tls-cert and --tls-key (a CA and a certificate for 127.0.0.1
// made by the Python tests' PKI helper with the cryptography package).
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { ConnectionClosed, Peer } from "../jet.js";
import { startJetd, stopJetd } from "./jetd.js";

const repo = fileURLToPath(new URL("../../", import.meta.url));
const dir = mkdtempSync(join(tmpdir(), "jet-tls-"));
let pki;
let jetd;

before(async () => {
  const made = execFileSync(process.env.JET_PYTHON ?? "python3", ["-c", [
    "import json, sys", "from pathlib import Path", "from tests.jetd.tls_testlib import make_pki",
    "print(json.dumps({k: str(v) for k, v in make_pki(Path(sys.argv[1])).items()}))",
  ].join("\n"), dir], { cwd: repo, env: { ...process.env, PYTHONPATH: repo } });
  pki = JSON.parse(made.toString());
  jetd = await startJetd("--tls-cert", pki.server, "--tls-key", pki["server-key"]);
});
after(async () => {
  const code = await stopJetd(jetd);
  rmSync(dir, { recursive: true, force: true });
  assert.equal(code, 0, jetd.stderr());
});

test("tls:// and wss:// with the daemon's CA; refused without it", async () => {
  assert.match(jetd.ws, /^wss:/);
  const ca = readFileSync(pki.ca);
  const owner = await Peer.connect(jetd.tcp.replace("tcp://", "tls://"), { tls: { ca } });
  const state = await owner.addState("tls/x", 1n, { onSet: (v) => v * 2n });
  const client = await Peer.connect(jetd.ws, { tls: { ca } });
  assert.equal(await client.set("tls/x", 21n), 42n);
  assert.equal(await owner.get("tls/x"), 42n);
  await assert.rejects(Peer.connect(jetd.tcp.replace("tcp://", "tls://"), { timeout: 5000 }), ConnectionClosed);
  await assert.rejects(Peer.connect(jetd.ws, { tls: {}, timeout: 5000 }), ConnectionClosed);
  await state.remove();
  await client.close();
  await owner.close();
});
