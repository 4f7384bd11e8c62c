// The PEER.md agent for the JavaScript peer (js/jet.js):
//   node tools/conformance/agents/peer_js.mjs HOST PORT
// JET_JS_MODULE=/path/to/jet.js picks another copy of the library (default: this
// checkout's js/jet.js).
import { pathToFileURL } from "node:url";

const modulePath = process.env.JET_JS_MODULE
  ? pathToFileURL(process.env.JET_JS_MODULE).href
  : new URL("../../../js/jet.js", import.meta.url).href;
const { Peer, PeerError, statusName } = await import(modulePath);

const say = (line) => process.stdout.write(line + "\n");
const show = (v) => (typeof v === "bigint" ? v.toString() : JSON.stringify(v ?? null));
const statusOf = (e) => (e instanceof PeerError && e.status != null ? statusName(e.status) : e?.name ?? "ERROR");

const [host, port] = process.argv.slice(-2);
let peer;
try {
  peer = await Peer.connect({ host, port: Number(port) }, { name: "agent-js", timeout: 10000 });
} catch (e) {
  say(`error ${statusOf(e)} ${e.message}`);
  process.exit(1);
}
try {
  await peer.addState("agent/state", 0n, { onSet: (v) => v });
  await peer.addMethod("agent/echo", (args) => args);
  await peer.fetch("data/", (ev) => say(`event ${ev.kind} ${ev.key} ${show(ev.value)}`));
  say("ready");
  for (const [name, start] of [["set", () => peer.set("data/x", 7n)], ["call", () => peer.call("data/echo", "x".repeat(100))]]) {
    try {
      say(`${name} ok ${show(await start())}`);
    } catch (e) {
      say(`${name} error ${statusOf(e)}`);
    }
  }
} catch (e) {
  say(`error ${statusOf(e)} ${e.message}`);
}
await peer.closed.catch(() => undefined);
say("closed");
process.exit(0);
