// The jet web console: a live tree of the bus, by "/" levels (PROTOCOL.md 5.2 convention).
// States and values come from one fetch of every key over the page's own WebSocket
// (/jet): a query fetch with methods (PROTOCOL.md 14) where the daemon answers queries,
// else FETCH_STATES and the methods from /registry.json; owners, which the protocol does
// not tell, from /registry.json (not served under --auth). Under --auth a login form
// connects again as a user (AUTHENTICATE, PROTOCOL.md 15.2).
// Events only touch the model; the DOM is updated once per animation frame, and only
// for rows that are on screen, so 10,000 states and 1,000 changes/s stay cheap.
import {
  FEATURE_AUTH_REQUIRED, FEATURE_QUERIES, NotAuthorized, NotFound, Peer, PeerError, UnknownFunction, Value, ValueType,
  field, key as keyMatcher, value as itself,
} from "/jet.js";
import uPlot from "/vendor/uplot/uPlot.esm.js"; // vendored, MIT (static/vendor/uplot)

const REGISTRY_POLL_MS = 3000;
const MAX_CHILDREN = 1000; // rows rendered under one node; the filter narrows the rest
const MAX_FILTERED = 500;
const PLOT_WINDOW_S = 300; // the plot shows the last 5 minutes of the selected state
const PLOT_MAX_SAMPLES = 20000;
const PLOT_MAX_SERIES = 6; // numeric fields of a JSON object plotted at most
const PLOT_COLOURS = ["#1f6feb", "#c62828", "#2e7d32", "#8e24aa", "#ef6c00", "#00838f"];
const EMPTY_BUS = "Nothing on the bus yet: states and methods appear here, live, as soon as a peer adds them.";

const $ = (id) => document.getElementById(id);
const el = (tag, cls, text) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
};

class TreeNode {
  constructor(name, path, parent) {
    this.name = name;
    this.path = path; // the key this node stands for (a state or method may live here)
    this.parent = parent;
    /** @type {Map<string, TreeNode>} */
    this.children = new Map();
    this.kind = null; // "state" | "method" | null (a level only)
    /** @type {Value|null} */
    this.raw = null;
    this.size = 0; // states and methods in this subtree
    this.expanded = parent === null;
    this.dom = null; // {li, val, rate, count, toggle, ul, owner} while rendered
    // The update rate: a count of changes that decays with RATE_TAU_S (one exp per change,
    // no timer per row), and when the current burst of changes began.
    this.heat = 0;
    this.heatAt = 0;
    this.heatSince = 0;
  }
}

// --- the update rate per key -----------------------------------------------------------
//
// Each change adds 1 to the node's heat, which decays by e^(-t/RATE_TAU_S): in a steady
// stream of r changes/s the heat tends to r·RATE_TAU_S, and divided by what it would be
// after the time the stream has run, it reads r from the first second on. A quiet key's
// rate decays to nothing. Rows show it from one pass a second over the rows on screen.

const RATE_TAU_S = 4;
const RATE_SHOWN_MIN = 0.1; // changes/s below which a row shows no rate

function bump(node, now) {
  const heat = node.heat * Math.exp((node.heatAt - now) / RATE_TAU_S);
  if (heat < 0.01) node.heatSince = now; // a new burst
  node.heat = heat + 1;
  node.heatAt = now;
}

/** Changes per second of `node` at `now` (seconds, performance.now() / 1000). */
function rateOf(node, now) {
  if (node.heat === 0) return 0;
  const heat = node.heat * Math.exp((node.heatAt - now) / RATE_TAU_S);
  const ran = Math.max(1, now - node.heatSince);
  return heat / (RATE_TAU_S * (1 - Math.exp(-ran / RATE_TAU_S)));
}

function rateText(node, now) {
  const r = rateOf(node, now);
  if (r < RATE_SHOWN_MIN) return "";
  return `${r >= 10 ? Math.round(r) : r.toFixed(1)}/s`;
}

/** One pass over the state rows on screen: their rates as text. */
function showRowRates() {
  if ($("tree-pane").hidden) return;
  const now = performance.now() / 1000;
  for (const row of $("tree").querySelectorAll(".node")) {
    const node = model.byKey.get(row.dataset.key);
    if (node?.dom?.rate) {
      const text = rateText(node, now);
      if (node.dom.rate.textContent !== text) node.dom.rate.textContent = text;
    }
  }
}

const model = {
  root: new TreeNode("", "", null),
  /** @type {Map<string, TreeNode>} */
  byKey: new Map(), // keys that are states or methods
  owners: new Map(), // key -> "name@address (#id)"
  states: 0,
  methods: 0,
  changes: 0,
  ownersKnown: false,
  ownersWhy: "owner unknown", // shown while the registry cannot be read
  methodsLive: false, // methods come from the fetch (a query with METHODS), not the registry
};

// --- the model -----------------------------------------------------------------------

function nodeFor(key, create) {
  let node = model.root;
  const parts = key.split("/");
  let path = "";
  for (let i = 0; i < parts.length; i++) {
    path = i === 0 ? parts[0] : `${path}/${parts[i]}`;
    let child = node.children.get(parts[i]);
    if (!child) {
      if (!create) return null;
      child = new TreeNode(parts[i], path, node);
      node.children.set(parts[i], child);
      frame.structure.add(node);
    }
    node = child;
  }
  return node;
}

function setLeaf(key, kind, raw) {
  const node = nodeFor(key, true);
  if (node.kind === null) {
    node.kind = kind;
    for (let n = node; n; n = n.parent) {
      n.size += 1;
      frame.counts.add(n);
    }
    model.byKey.set(key, node);
    if (kind === "state") model.states += 1; else model.methods += 1;
    frame.structure.add(node.parent);
    frame.structure.add(node); // its row changes shape
  }
  node.raw = raw;
  frame.values.add(node);
  return node;
}

function dropLeaf(key, kind) {
  const node = model.byKey.get(key);
  if (!node || node.kind !== kind) return;
  model.byKey.delete(key);
  if (kind === "state") model.states -= 1; else model.methods -= 1;
  node.kind = null;
  node.raw = null;
  for (let n = node; n; n = n.parent) {
    n.size -= 1;
    frame.counts.add(n);
  }
  // Prune levels left empty.
  let n = node;
  while (n.parent && n.size === 0 && n.children.size === 0) {
    n.parent.children.delete(n.name);
    frame.structure.add(n.parent);
    n.dom = null;
    n = n.parent;
  }
  frame.structure.add(n);
}

// --- batching per animation frame ------------------------------------------------------

const frame = {
  values: new Set(),
  structure: new Set(),
  counts: new Set(),
  flashing: [],
  scheduled: false,
  filterChanged: false,
};

function schedule() {
  if (!frame.scheduled) {
    frame.scheduled = true;
    requestAnimationFrame(render);
  }
}

function onEvent(ev) {
  if (ev.key.startsWith(OPS_PREFIX)) return; // the daemon's own states: the Peers and Daemon views
  model.changes += 1;
  if (ev.key === plot.key && ev.kind === "change") plot.updates.push(performance.now()); // every one: no frame conflation
  switch (ev.kind) {
    case "remove": case "unmatch": dropLeaf(ev.key, "state"); break;
    case "method_add": setLeaf(ev.key, "method", null); break;
    case "method_remove": dropLeaf(ev.key, "method"); break;
    default: {
      const node = setLeaf(ev.key, "state", ev.raw);
      if (ev.kind === "change") bump(node, performance.now() / 1000);
    }
  }
  schedule();
}

let filter = "";
let sortedCache = null;

function render() {
  frame.scheduled = false;
  for (const e of frame.flashing) e.classList.remove("flash");
  frame.flashing = [];
  const structural = frame.structure.size > 0;
  if (structural) sortedCache = null;
  if (filter) {
    if (structural || frame.filterChanged) renderFiltered();
  } else if (frame.filterChanged) {
    dropFiltered();
    renderChildren(model.root, $("tree"));
  } else {
    for (const node of frame.structure) {
      if (node === model.root) renderChildren(model.root, $("tree"));
      else if (node.dom) refreshRow(node);
    }
  }
  frame.filterChanged = false;
  for (const node of frame.counts) {
    if (node.dom) node.dom.count.textContent = node.children.size ? String(node.size) : "";
  }
  for (const node of frame.values) {
    if (node.dom && node.dom.val) {
      node.dom.val.textContent = show(node.raw);
      node.dom.val.classList.add("flash");
      frame.flashing.push(node.dom.val);
    }
    if (node === selected) showDetail(node.path, false);
  }
  frame.values.clear();
  frame.structure.clear();
  frame.counts.clear();
  $("counts").textContent = `${model.states} states · ${model.methods}${model.ownersKnown || model.methodsLive ? "" : "?"} methods`;
  showEmpty();
  if (ops.dirty) renderOps();
  if (frame.flashing.length) schedule(); // one more frame takes the highlight off
}

/** The plain-language empty state, while the unfiltered tree is empty after a fetch. */
function showEmpty() {
  const more = $("more");
  const empty = fetched && !filter && model.byKey.size === 0;
  if (empty && !more.textContent) more.textContent = EMPTY_BUS;
  else if (!empty && more.textContent === EMPTY_BUS) more.textContent = "";
}

function show(raw) {
  if (!raw) return "";
  const text = raw.toString();
  return text.length > 200 ? `${text.slice(0, 200)}…` : text;
}

function ownerOf(key) {
  return model.owners.get(key) ?? (model.ownersKnown ? "" : model.ownersWhy);
}

function makeItem(node) {
  const li = el("li");
  const row = el("div", "node");
  row.dataset.key = node.path;
  const toggle = el("span", "toggle");
  const name = el("span", "name", node.name === "" ? "(empty)" : node.name);
  name.title = node.path;
  row.append(toggle, name);
  const dom = { li, row, toggle, val: null, rate: null, count: el("span", "count"), ul: null, owner: null };
  node.dom = dom;
  fillRow(node);
  row.addEventListener("click", () => {
    if (node.children.size) {
      node.expanded = !node.expanded;
      refreshRow(node);
    }
    if (node.kind) select(node.path);
  });
  li.append(row);
  return li;
}

function fillRow(node) {
  const dom = node.dom;
  const row = dom.row;
  while (row.children.length > 2) row.lastChild.remove();
  dom.toggle.textContent = node.children.size ? (node.expanded ? "▾" : "▸") : "";
  if (node.kind === "method") row.append(el("span", "badge method", "method"));
  dom.val = null;
  dom.rate = null;
  if (node.kind === "state") {
    row.append(el("span", "badge", node.raw ? node.raw.typeName.toLowerCase() : ""));
    dom.val = el("span", "val", show(node.raw));
    dom.rate = el("span", "rate", rateText(node, performance.now() / 1000));
    dom.rate.title = "changes per second";
    row.append(dom.val, dom.rate);
  }
  dom.count.textContent = node.children.size ? String(node.size) : "";
  row.append(dom.count);
  if (node.kind) row.append(el("span", "owner", ownerOf(node.path)));
  row.classList.toggle("selected", node === selected);
}

function refreshRow(node) {
  fillRow(node);
  const dom = node.dom;
  if (node.expanded && node.children.size) {
    if (!dom.ul) {
      dom.ul = el("ul");
      dom.li.append(dom.ul);
    }
    renderChildren(node, dom.ul);
  } else if (dom.ul) {
    dom.ul.remove();
    dom.ul = null;
    forget(node);
  }
}

function forget(node) {
  for (const child of node.children.values()) {
    if (child.dom) {
      child.dom = null;
      forget(child);
    }
  }
}

function renderChildren(node, ul) {
  forget(node);
  const names = [...node.children.keys()].sort();
  const items = [];
  for (const name of names.slice(0, MAX_CHILDREN)) {
    const child = node.children.get(name);
    const li = makeItem(child);
    if (child.expanded && child.children.size) {
      child.dom.ul = el("ul");
      li.append(child.dom.ul);
      renderChildren(child, child.dom.ul);
    }
    items.push(li);
  }
  if (names.length > MAX_CHILDREN) items.push(el("li", "hint", `… ${names.length - MAX_CHILDREN} more: filter by prefix`));
  ul.replaceChildren(...items);
}

let filtered = []; // rows of the filtered list: their nodes' dom is dropped on the next redraw

function dropFiltered() {
  for (const node of filtered) node.dom = null;
  filtered = [];
}

function renderFiltered() {
  forget(model.root);
  dropFiltered();
  if (!sortedCache) sortedCache = [...model.byKey.keys()].sort();
  const matches = search.keys
    ? sortedCache.filter((k) => search.keys.has(k))
    : sortedCache.filter((k) => k.startsWith(filter));
  const items = matches.slice(0, MAX_FILTERED).map((key) => {
    const node = model.byKey.get(key);
    filtered.push(node);
    const li = makeItem(node);
    li.querySelector(".name").textContent = key;
    li.querySelector(".toggle").textContent = "";
    return li;
  });
  $("tree").replaceChildren(...items);
  $("more").textContent = matches.length > MAX_FILTERED
    ? `${matches.length - MAX_FILTERED} more keys match: narrow the search`
    : search.error ?? (matches.length ? ""
      : OPS_PREFIX.startsWith(filter.slice(0, OPS_PREFIX.length)) && filter.startsWith("$")
        ? "the daemon's own states ($jet/) are in the Peers and Daemon views"
        : search.keys ? "no key matches this query" : "no key starts with this prefix");
}

// --- details, set and call ----------------------------------------------------------------

let selected = null;
let peer = null;

function select(key) {
  const before = selected;
  selected = model.byKey.get(key) ?? null;
  if (before?.dom) before.dom.row.classList.remove("selected");
  if (selected?.dom) selected.dom.row.classList.add("selected");
  showDetail(key, true);
}

function showDetail(key, fresh) {
  const pane = $("view"); // the "call any method by key" form beside it stays
  const node = model.byKey.get(key);
  let view = pane.querySelector(".view");
  if (fresh || !view) {
    view = el("div", "view");
    view.append($("detail-template").content.cloneNode(true));
    pane.replaceChildren(view);
    const form = view.querySelector("form.act");
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      act(key, form, view.querySelector(".answer"));
    });
    view.querySelector(".copy-key").addEventListener("click", (e) => copyText(key, e.target));
    view.querySelector(".copy-value").addEventListener("click", (e) => copyText(view.querySelector(".value").textContent, e.target));
  }
  const kind = node ? node.kind : "method?";
  view.querySelector(".key").textContent = key;
  view.querySelector(".kind").textContent = node ? kind : "unknown (not a fetched state; calling it as a method)";
  view.querySelector(".owner").textContent = ownerOf(key) || "—";
  view.querySelector(".vtype").textContent = node?.raw ? node.raw.typeName : "—";
  view.querySelector(".value").textContent = node?.raw ? shown(node.raw) : "—";
  if (fresh) resetPlot(key, view);
  if (node?.kind === "state" && node.raw) samplePlot(node.raw);
  showRate();
  view.querySelector(".copy-value").hidden = !node?.raw;
  // "auto" sends a state's own type (an int state gets INT64), a method's argument as a JSON literal.
  view.querySelector("option[value=auto]").textContent = kind === "state" && node?.raw
    ? `as the state (${node.raw.typeName.toLowerCase()})` : "auto (JSON literal)";
  view.querySelector(".what").textContent = kind === "state" ? "Set the state to" : "Call the method with";
  view.querySelector("form.act button").textContent = kind === "state" ? "Set" : "Call";
  view.dataset.kind = kind;
}

// --- the plot of the selected state (uPlot) ----------------------------------------------------
//
// Samples are taken from the moment a state is selected, one per rendered frame at most
// (what the fetch delivers, conflated by the frame), and kept for PLOT_WINDOW_S.

const RATE_WINDOW_MS = 10000; // the update rate of the selected state: changes in the last 10 s
const plot = { key: null, figure: null, chart: null, names: [], times: [], columns: [], resize: null, updates: [], rate: null };

/** The numbers in a value: {"value": x} for a number, the numeric fields of a JSON
 *  object (at most PLOT_MAX_SERIES), or null when there is nothing to plot. */
function numbersOf(raw) {
  let js;
  try {
    js = raw.vtype === ValueType.INT64 || raw.vtype === ValueType.FLOAT64 || raw.vtype === ValueType.JSON ? raw.toJS() : null;
  } catch {
    return null;
  }
  if (typeof js === "bigint") return new Map([["value", Number(js)]]);
  if (typeof js === "number") return Number.isFinite(js) ? new Map([["value", js]]) : new Map([["value", null]]);
  if (js !== null && typeof js === "object" && !Array.isArray(js)) {
    const fields = Object.entries(js).filter(([, x]) => typeof x === "number").slice(0, PLOT_MAX_SERIES);
    return fields.length ? new Map(fields) : null;
  }
  return null;
}

function resetPlot(key, view) {
  if (plot.chart) plot.chart.destroy();
  if (plot.resize) plot.resize.disconnect();
  Object.assign(plot, { key, figure: view.querySelector("figure.plot"), chart: null, names: [], times: [], columns: [],
    resize: null, updates: [], rate: view.querySelector(".rate") });
  showRate();
}

/** Changes of the selected state per second, over the last RATE_WINDOW_MS (or since it
 *  was selected, when that is shorter). */
function showRate() {
  if (!plot.rate) return;
  const now = performance.now();
  let drop = 0;
  while (drop < plot.updates.length && plot.updates[drop] < now - RATE_WINDOW_MS) drop++;
  plot.updates.splice(0, drop);
  const node = model.byKey.get(plot.key);
  if (node?.kind !== "state") {
    plot.rate.textContent = "—";
    return;
  }
  const n = plot.updates.length;
  plot.rate.textContent = `${n} change${n === 1 ? "" : "s"} in the last ${RATE_WINDOW_MS / 1000} s (${(n / (RATE_WINDOW_MS / 1000)).toFixed(1)}/s)`;
}

function samplePlot(raw) {
  const numbers = numbersOf(raw);
  if (!plot.figure || (!numbers && !plot.chart)) return;
  const now = Date.now() / 1000;
  if (!plot.chart) {
    plot.names = [...numbers.keys()];
    plot.columns = plot.names.map(() => []);
    plot.figure.hidden = false;
    const chartEl = plot.figure.querySelector(".chart");
    plot.chart = new uPlot({
      width: Math.max(200, chartEl.clientWidth),
      height: 160,
      legend: { show: plot.names.length > 1 },
      cursor: { drag: { x: false, y: false } },
      // One sample has no time span (uPlot would show 1000 days after it): the minute before it.
      scales: { x: { time: true, range: (u, min, max) => (plot.times.length === 1 ? [plot.times[0] - 60, plot.times[0] + 1] : [min, max]) } },
      series: [{}, ...plot.names.map((name, i) => ({ label: name, stroke: PLOT_COLOURS[i], width: 1.5, points: { show: true, size: 4 } }))],
    }, [[], ...plot.columns], chartEl);
    plot.resize = new ResizeObserver(() => plot.chart?.setSize({ width: Math.max(200, chartEl.clientWidth), height: 160 }));
    plot.resize.observe(chartEl);
  }
  plot.times.push(now);
  plot.names.forEach((name, i) => plot.columns[i].push(numbers?.get(name) ?? null));
  let drop = 0;
  while (drop < plot.times.length - 1 && (plot.times[drop] < now - PLOT_WINDOW_S || plot.times.length - drop > PLOT_MAX_SAMPLES)) drop++;
  if (drop) {
    plot.times.splice(0, drop);
    for (const column of plot.columns) column.splice(0, drop);
  }
  plot.chart.setData([plot.times, ...plot.columns]);
  const span = plot.times.length > 1 ? ` over ${Math.round(now - plot.times[0])} s` : "";
  plot.figure.querySelector(".plot-stats").textContent = plot.names.map((name, i) => {
    const xs = plot.columns[i].filter((x) => x !== null);
    if (!xs.length) return `${name}: —`;
    const last = plot.columns[i].at(-1);
    return `${name}: last ${last ?? "—"} · min ${Math.min(...xs)} · max ${Math.max(...xs)}`;
  }).join("; ") + ` (${plot.times.length} sample${plot.times.length === 1 ? "" : "s"}${span})`;
}

/** A value as the detail pane shows it: JSON documents indented, the rest as in the tree. */
function shown(raw) {
  if (raw.vtype !== ValueType.JSON) return raw.toString();
  const text = raw.toString();
  try {
    JSON.parse(text);
  } catch {
    return text; // shown as it came
  }
  return prettyJSON(text);
}

/** Indent a valid JSON text by two spaces, as JSON.stringify(x, null, 2) would, but from
 *  the text itself: numbers beyond 2^53 keep every digit. */
function prettyJSON(text) {
  let out = "";
  let depth = 0;
  const newline = (n) => `\n${"  ".repeat(n)}`;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      let j = i + 1;
      while (text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
      out += text.slice(i, j + 1);
      i = j;
    } else if (c === "{" || c === "[") {
      let j = i + 1;
      while (/\s/.test(text[j])) j++;
      if (text[j] === (c === "{" ? "}" : "]")) {
        out += c + text[j];
        i = j;
      } else {
        depth += 1;
        out += c + newline(depth);
      }
    } else if (c === "}" || c === "]") {
      depth -= 1;
      out += newline(depth) + c;
    } else if (c === ",") {
      out += `,${newline(depth)}`;
    } else if (c === ":") {
      out += ": ";
    } else if (!/\s/.test(c)) {
      out += c;
    }
  }
  return out;
}

/** Copy to the clipboard (the Clipboard API needs a secure context: 127.0.0.1 and
 *  localhost are, http://jet.lan is not, so fall back to a selection). */
async function copyText(text, button) {
  let done = false;
  try {
    await navigator.clipboard.writeText(text);
    done = true;
  } catch {
    const area = el("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "offscreen";
    document.body.append(area);
    area.select();
    done = document.execCommand("copy");
    area.remove();
  }
  const label = button.textContent;
  button.textContent = done ? "Copied" : "Copy failed";
  setTimeout(() => { button.textContent = label; }, 1500);
}

/** The text typed in a Set as the state's own type (`vtype`). */
function asStateType(text, vtype) {
  const t = text.trim();
  switch (vtype) {
    case ValueType.INT64:
      if (!/^[+-]?\d+$/.test(t)) throw new Error(`the state is INT64 and ${JSON.stringify(t)} is not an integer (choose a type to send another)`);
      return Value.int64(BigInt(t));
    case ValueType.FLOAT64: return parseInput(text, "float64");
    case ValueType.BOOL: return parseInput(text, "bool");
    case ValueType.STRING: {
      // "text" or text: a JSON string literal is unquoted, anything else is the text itself.
      try {
        const parsed = JSON.parse(t);
        if (typeof parsed === "string") return parsed;
      } catch { /* the text itself */ }
      return text;
    }
    case ValueType.JSON: return parseInput(text, "json");
    default: return parseInput(text, "literal");
  }
}

/** The value typed in the form, as the chosen type (`auto`: a state's own type). */
function parseInput(text, as, vtype = null) {
  if (as === "auto" && vtype !== null) return asStateType(text, vtype);
  switch (as) {
    case "none": return null;
    case "string": return text;
    case "int64": return Value.int64(BigInt(text.trim()));
    case "float64": {
      const x = Number(text);
      if (text.trim() === "" || Number.isNaN(x) && text.trim().toLowerCase() !== "nan") throw new Error(`not a number: ${text}`);
      return Value.float64(x);
    }
    case "bool": {
      const t = text.trim().toLowerCase();
      if (t !== "true" && t !== "false") throw new Error("a bool is true or false");
      return t === "true";
    }
    case "json": JSON.parse(text); return new Value(ValueType.JSON, new TextEncoder().encode(text));
    default: {
      if (text.trim() === "") return null;
      const parsed = JSON.parse(text); // numbers go as FLOAT64, objects and arrays as JSON
      return parsed;
    }
  }
}

async function act(key, form, answer) {
  answer.className = "answer";
  answer.textContent = "…";
  let value;
  try {
    const node = model.byKey.get(key);
    const vtype = node?.kind === "state" && node.raw ? node.raw.vtype : null;
    value = parseInput(form.elements.text.value, form.elements.as.value, vtype);
  } catch (e) {
    answer.className = "answer error";
    answer.textContent = `cannot read the value: ${e.message}`;
    return;
  }
  const isState = model.byKey.get(key)?.kind === "state";
  try {
    const result = isState ? await peer.set(key, value) : await peer.call(key, value);
    answer.className = "answer ok";
    answer.textContent = `OK: ${Value.of(result).toString()}`;
  } catch (e) {
    answer.className = "answer error";
    answer.textContent = e instanceof PeerError ? e.message : String(e); // "STATUS: reason"
    if (e instanceof NotAuthorized) {
      // PROTOCOL.md 15.3: the daemon names the permission and the key; say who lacks it.
      const why = el("span", "why", user
        ? `Logged in as ${user}, which lacks that permission: log in as another user.`
        : "Not logged in: log in as a user with that permission.");
      answer.append(why);
    }
  }
}

// --- the registry (methods and owners) ------------------------------------------------------

async function pollRegistry() {
  try {
    const response = await fetch("/registry.json", { cache: "no-store" });
    if (response.status === 403) {
      // PROTOCOL.md 15.3: under --auth the daemon tells no owner to anyone.
      model.ownersWhy = "owner not shown under --auth";
      throw new Error("403");
    }
    if (!response.ok) throw new Error(String(response.status));
    const doc = await response.json();
    const label = (id) => {
      const p = doc.peers[id];
      return p ? `${p.name || "-"}@${p.address} (#${id})` : `#${id}`;
    };
    const owners = new Map();
    for (const [key, id] of doc.states) owners.set(key, label(id));
    const methods = new Set();
    for (const [key, id] of doc.methods) {
      owners.set(key, label(id));
      methods.add(key);
    }
    if (!model.methodsLive) {
      for (const [key, node] of model.byKey) if (node.kind === "method" && !methods.has(key)) dropLeaf(key, "method");
      for (const key of methods) if (!model.byKey.has(key)) setLeaf(key, "method", null);
    }
    const changed = owners.size !== model.owners.size || [...owners].some(([k, v]) => model.owners.get(k) !== v);
    model.owners = owners;
    model.ownersKnown = true;
    if (changed) frame.filterChanged = true; // owners are drawn in rows: redraw what is shown
    schedule();
  } catch {
    model.ownersKnown = false;
  }
}


// --- the Peers view and the Daemon panel ($jet/, PROTOCOL.md 16) -----------------------------
//
// The daemon publishes its own figures as states under $jet/, which no peer can own:
// $jet/daemon (cumulative counters and gauges, at most once a second) and
// $jet/peers/<connection id> (one per connection). The console fetches them apart from
// the tree and shows them here; rates are the counters' differences between two samples.
// A daemon without them (older than issue 33), or a user who may not read $jet/, gets a
// plain "not available" line.

const FEATURE_DAEMON_STATES = 0x10; // INFO: the daemon publishes $jet/ (PROTOCOL.md 16, protocol 1.3)
const OPS_PREFIX = "$jet/";
const OPS_DAEMON = "$jet/daemon";
const OPS_PEERS = "$jet/peers/";
const OPS_RATES = ["frames_in", "frames_out", "bytes_in", "bytes_out", "routed"];
// The daemon republishes $jet/daemon once a second while a figure other than the uptime
// changes: nothing for this long means the counters stood still.
const OPS_STILL_MS = 3000;

const ops = {
  fetch: null,
  /** @type {Map<string, any>} connection id -> its $jet/peers/ document */
  peers: new Map(),
  daemon: null, // the last $jet/daemon document
  previous: null, // the one before it, for rates: {at, doc}
  sampledAt: 0,
  receivedAt: 0,
  rates: null, // {frames_in: per second, ...} from the last two samples
  fetchWhy: "", // why $jet/ cannot be fetched ("" while it is or may be)
  daemonWhy: "", // why $jet/daemon is not there
  dirty: false,
};

function jsOf(raw) {
  try {
    const js = raw.toJS();
    return js !== null && typeof js === "object" && !Array.isArray(js) ? js : null;
  } catch {
    return null;
  }
}

function onOpsEvent(ev) {
  if (ev.key === OPS_DAEMON) {
    if (ev.kind === "remove") {
      ops.daemon = null;
    } else {
      const doc = jsOf(ev.raw);
      const at = typeof doc?.uptime_s === "number" ? doc.uptime_s : performance.now() / 1000;
      if (doc && ops.daemon) {
        const dt = at - ops.sampledAt;
        if (dt > 0) {
          ops.rates = {};
          for (const name of OPS_RATES) {
            const d = Number(doc[name]) - Number(ops.daemon[name]);
            ops.rates[name] = Number.isFinite(d) && d >= 0 ? d / dt : null; // a restart counts from 0 again
          }
        } else if (dt < 0) {
          ops.rates = null; // the daemon restarted
        }
      }
      ops.daemon = doc;
      ops.sampledAt = at;
      ops.receivedAt = performance.now();
      if (doc) ops.daemonWhy = "";
    }
  } else if (ev.key.startsWith(OPS_PEERS)) {
    const id = ev.key.slice(OPS_PEERS.length);
    const doc = ev.kind === "remove" ? null : jsOf(ev.raw);
    if (doc) ops.peers.set(id, doc); else ops.peers.delete(id);
  }
  ops.dirty = true;
  schedule();
}

function resetOps() {
  if (ops.fetch) ops.fetch.unfetch().catch(() => {});
  Object.assign(ops, { fetch: null, peers: new Map(), daemon: null, sampledAt: 0, receivedAt: 0, rates: null, fetchWhy: "", daemonWhy: "", dirty: true });
}

const NOT_READABLE = "Not available: this user may not read the daemon's own states ($jet/).";
const NO_PEERS = "No peer listed yet: the daemon lists them within a second, unless this user may not read $jet/peers/.";
const NOT_PUBLISHED = "Not available: this daemon does not publish its own states ($jet/, protocol 1.3).";

/** Fetch $jet/ on `p` and find out whether the daemon publishes it to this user. */
async function startOps(p, mine) {
  resetOps();
  if (!(p.info.features & FEATURE_DAEMON_STATES)) {
    ops.fetchWhy = NOT_PUBLISHED;
    ops.dirty = true;
    schedule();
    return;
  }
  try {
    const fetch = await p.fetch(OPS_PREFIX, onOpsEvent);
    if (mine !== generation) {
      fetch.unfetch().catch(() => {});
      return;
    }
    ops.fetch = fetch;
  } catch (e) {
    if (mine !== generation) return;
    ops.fetchWhy = e instanceof NotAuthorized ? NOT_READABLE : `Not available: ${e.message}`;
    ops.dirty = true;
    schedule();
    return;
  }
  await checkOps(p, mine);
}

/** Whether $jet/daemon exists (answered after the fetch's initial adds, PROTOCOL.md 10.5). */
async function checkOps(p, mine) {
  try {
    await p.getRaw(OPS_DAEMON);
    if (mine === generation) ops.daemonWhy = "";
  } catch (e) {
    if (mine !== generation) return;
    if (e instanceof NotFound) ops.daemonWhy = NOT_PUBLISHED;
    else if (e instanceof NotAuthorized) ops.daemonWhy = NOT_READABLE;
    else ops.daemonWhy = `Not available: ${e.message}`;
  }
  ops.dirty = true;
  schedule();
}

/** Rates fall to 0 when $jet/daemon has not changed for OPS_STILL_MS. */
function stillOps() {
  if (!ops.rates || performance.now() - ops.receivedAt < OPS_STILL_MS) return;
  if (Object.values(ops.rates).every((r) => r === 0)) return;
  for (const name of OPS_RATES) ops.rates[name] = 0;
  ops.dirty = true;
  schedule();
}

let view = "tree";

function showView(name) {
  view = name;
  for (const tab of $("views").querySelectorAll("button")) tab.setAttribute("aria-selected", String(tab.dataset.view === name));
  $("tree-pane").hidden = name !== "tree";
  $("peers-pane").hidden = name !== "peers";
  $("daemon-pane").hidden = name !== "daemon";
  ops.dirty = true;
  schedule();
  if (name === "tree") showRowRates();
}

const count = (x) => (typeof x === "number" ? x.toLocaleString("en-US") : "—");
function bytes(x) {
  if (typeof x !== "number") return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (x >= 1024 && i < units.length - 1) { x /= 1024; i++; }
  return `${i ? x.toFixed(x < 10 ? 1 : 0) : Math.round(x)} ${units[i]}`;
}
const plural = (x, noun) => `${count(x)} ${noun}${x === 1 ? "" : "s"}`;
const ms = (x) => (typeof x === "number" ? `${x < 10 ? x.toFixed(2) : x.toFixed(1)} ms` : "—");
function perSecond(name, format = (x) => x.toFixed(x < 10 ? 1 : 0)) {
  const r = ops.rates?.[name];
  return typeof r === "number" ? `${format(r)}/s` : "—";
}
function duration(s) {
  if (typeof s !== "number") return "—";
  const d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24, m = Math.floor(s / 60) % 60;
  if (d) return `${d} d ${h} h`;
  if (h) return `${h} h ${m} min`;
  if (m) return `${m} min ${Math.floor(s % 60)} s`;
  return `${Math.floor(s)} s`;
}

function renderOps() {
  ops.dirty = false;
  $("views").querySelector("[data-view=peers] .n").textContent = ops.peers.size ? `(${ops.peers.size})` : "";
  if (view === "peers") renderPeers();
  else if (view === "daemon") renderDaemon();
}

function renderPeers() {
  const pane = $("peers-pane");
  // This console is a peer itself: an empty list means none is published or readable.
  pane.querySelector(".unavailable").textContent = ops.fetchWhy
    || (ops.peers.size ? "" : ops.daemonWhy === NOT_PUBLISHED ? NOT_PUBLISHED
      : ops.fetch ? NO_PEERS : "connecting…");
  const peers = [...ops.peers.entries()].sort(([a, x], [b, y]) =>
    String(x.name ?? "").localeCompare(String(y.name ?? "")) || Number(a) - Number(b));
  // Which key lists are unfolded is read from the page, not from their toggle events: a
  // click opens one at once, its toggle event is a later task, maybe after this redraw.
  const unfolded = new Set([...$("peers").querySelectorAll(".peer")]
    .filter((card) => card.querySelector("details")?.open).map((card) => card.dataset.id));
  $("peers").replaceChildren(...peers.map(([id, p]) => {
    const card = el("article", "peer");
    card.dataset.id = id;
    const title = el("h3");
    title.append(el("span", "pname", p.name || "(no name)"), el("span", "id", `#${p.id ?? id}`));
    if (p.transport) title.append(el("span", "tag", String(p.transport)));
    if (p.paused) title.append(el("span", "tag paused", "paused"));
    const dl = el("dl");
    const row = (name, value) => dl.append(el("dt", null, name), value instanceof Node ? value : el("dd", null, value));
    row("address", p.address ?? "—");
    row("user", p.user ?? "anonymous");
    row("owns", `${plural(p.states, "state")}, ${plural(p.methods, "method")}`);
    row("fetches", count(p.fetches));
    row("queued", bytes(p.queued_bytes));
    const owned = Array.isArray(p.owned) ? p.owned : [];
    if (owned.length) {
      // The daemon lists the first 20 keys a peer owns; shown folded, each opens its detail.
      const dd = el("dd", "owned");
      const list = el("details");
      const total = (Number(p.states) || 0) + (Number(p.methods) || 0);
      list.open = unfolded.has(id);
      list.append(el("summary", null, total > owned.length ? `first ${owned.length} of ${count(total)}` : `all ${owned.length}`));
      for (const key of owned) {
        const a = el("a", null, String(key));
        a.href = "#";
        a.title = String(key);
        a.addEventListener("click", (e) => {
          e.preventDefault();
          select(String(key));
        });
        list.append(a);
      }
      dd.append(list);
      row("keys", dd);
    }
    card.append(title, dl);
    return card;
  }));
}

function renderDaemon() {
  const d = ops.daemon;
  $("daemon-pane").querySelector(".unavailable").textContent = ops.fetchWhy || ops.daemonWhy
    || (d ? "" : "waiting for the daemon's figures…");
  if (!d) {
    $("daemon").replaceChildren();
    return;
  }
  const c = d.connections ?? {};
  const total = ["tcp", "tls", "websocket"].reduce((n, t) => n + (Number(c[t]) || 0), 0);
  const groups = [
    ["Connections", [
      ["connections", `${count(total)} (tcp ${count(c.tcp)}, tls ${count(c.tls)}, websocket ${count(c.websocket)})`, "connections"],
      ["authenticated", count(d.authenticated), "authenticated"],
      ["auth failures", count(d.auth_failures), "", d.auth_failures > 0],
    ]],
    ["Bus", [
      ["states", count(d.states)],
      ["methods", count(d.methods)],
      ["fetches", count(d.fetches)],
      ["query groups", count(d.query_groups)],
    ]],
    ["Traffic", [
      ["frames in", perSecond("frames_in"), "frames-in"],
      ["frames out", perSecond("frames_out"), "frames-out"],
      ["bytes in", perSecond("bytes_in", bytes)],
      ["bytes out", perSecond("bytes_out", bytes)],
    ]],
    ["Routing", [
      ["routed", perSecond("routed"), "routed"],
      // PROTOCOL.md 16.2: over the routes answered in the last second, 0 when none
      ["route p50 / p99", d.route_p99_ms ? `${ms(d.route_p50_ms)} / ${ms(d.route_p99_ms)}` : "— (no route in the last second)", "route-latency"],
      ["timeouts", count(d.route_timeouts), "", d.route_timeouts > 0],
      ["owners gone", count(d.owners_gone)],
    ]],
    ["Slow peers", [
      ["pauses", count(d.slow_pauses)],
      ["closes", count(d.slow_closes), "", d.slow_closes > 0],
      ["budget closes", count(d.budget_closes), "", d.budget_closes > 0],
    ]],
    ["Event log and process", [
      ["log", bytes(d.log_bytes)],
      ["fsync p99", d.fsync_p99_ms ? ms(d.fsync_p99_ms) : "— (not measured)"],
      ["fsync errors", count(d.fsync_errors), "", d.fsync_errors > 0],
      ["memory (RSS)", bytes(d.rss_bytes)],
      ["uptime", duration(d.uptime_s), "uptime"],
      ["version", d.version ?? "—"],
    ]],
  ];
  $("daemon").replaceChildren(...groups.map(([name, rows]) => {
    const section = el("section");
    const dl = el("dl");
    for (const [label, value, id, bad] of rows) {
      const dd = el("dd", bad ? "bad" : null, value);
      if (id) dd.dataset.figure = id;
      dl.append(el("dt", null, label), dd);
    }
    section.append(el("h3", null, name), dl);
    return section;
  }));
}

// --- connection and login ------------------------------------------------------------------

let user = null; // the user this console is logged in as (null: anonymous)
let fetched = false; // the current connection's fetch of every key has answered
let generation = 0; // connections replaced by a login or logout are not restarted

function setStatus(text, cls) {
  const s = $("status");
  s.textContent = text;
  s.className = `status ${cls}`;
}

function resetModel() {
  model.root = new TreeNode("", "", null);
  model.byKey.clear();
  model.states = model.methods = 0;
  model.methodsLive = false;
  selected = null;
  frame.filterChanged = true;
  frame.structure.add(model.root);
  schedule();
}

/** Fetch every key: states and methods with a query where the daemon answers queries
 *  (and this user may run one: PROTOCOL.md 15.3 asks read of every key), else states. */
async function fetchAll(p) {
  if (p.info.features & FEATURE_QUERIES) {
    try {
      await p.fetch({ methods: true }, onEvent);
      model.methodsLive = true;
      return;
    } catch (e) {
      if (!(e instanceof NotAuthorized || e instanceof UnknownFunction)) throw e;
    }
  }
  await p.fetch("", onEvent);
}

/** Connect (as `credentials.user`, or anonymously) and fetch; returns false when the
 *  daemon refused, with the reason shown. */
async function start(credentials = null) {
  const mine = ++generation;
  // A login leaves the badge alone until it succeeds: the connection it shows stays live.
  if (!credentials) setStatus("connecting…", "connecting");
  let next;
  try {
    // reconnect: a daemon restart keeps the tree; the restored fetch reports what changed.
    next = await Peer.connect(undefined, { name: "web-console", reconnect: true, ...(credentials ?? {}) });
  } catch (e) {
    if (mine !== generation) return false;
    if (credentials) {
      // AUTH_FAILED (or the connection failed): keep what is shown, say why in the form.
      $("login").querySelector(".error").textContent = e instanceof PeerError ? e.message : String(e);
      generation -= 1;
      return false;
    }
    setStatus(`cannot connect: ${e.message}`, "closed");
    setTimeout(() => { if (mine === generation) start(); }, 2000);
    return false;
  }
  if (mine !== generation) {
    next.close();
    return false;
  }
  const previous = peer;
  peer = next;
  user = credentials ? credentials.user : null;
  if (previous) previous.close();
  fetched = false;
  resetModel();
  resetOps();
  const authRequired = !!(next.info.features & FEATURE_AUTH_REQUIRED);
  $("login").hidden = !authRequired || user !== null;
  $("logout").hidden = user === null;
  $("login").querySelector(".error").textContent = "";
  next.ondisconnect = (e) => {
    if (mine === generation) setStatus(`reconnecting… (${e.message})`, "connecting");
  };
  next.onreconnect = () => {
    if (mine !== generation) return;
    setStatus(user ? `live as ${user}` : authRequired ? "live (anonymous)" : "live", "open");
    pollRegistry();
    // The restored $jet/ fetch reports what changed; but the daemon may be another
    // version now: start over if its INFO says otherwise.
    if (ops.fetch && next.info.features & FEATURE_DAEMON_STATES) checkOps(next, mine);
    else startOps(next, mine);
  };
  next.closed.then((e) => {
    if (mine !== generation) return; // replaced on purpose
    setStatus(`closed: ${e.message}`, "closed");
    setTimeout(() => { if (mine === generation) start(credentials); }, 2000); // start over, fresh model
  });
  try {
    await fetchAll(next);
  } catch (e) {
    if (mine !== generation) return false;
    if (e instanceof NotAuthorized) {
      // PROTOCOL.md 15.2: nothing is readable without a login; the daemon would close an
      // idle anonymous connection at its auth timeout anyway.
      generation += 1;
      next.close();
      $("more").textContent = `${e.name}: ${e.message}. Log in above.`;
      setStatus("log in: authentication required", "closed");
      $("login").hidden = false;
      return false;
    }
    setStatus(`fetch failed: ${e.message}`, "closed");
    return false;
  }
  $("more").textContent = "";
  fetched = true;
  schedule(); // the empty state, if nothing came
  setStatus(user ? `live as ${user}` : authRequired ? "live (anonymous)" : "live", "open");
  if ($("search").value.trim()) runSearch($("search").value);
  pollRegistry();
  startOps(next, mine);
  return true;
}

$("login").addEventListener("submit", async (e) => {
  e.preventDefault();
  const form = e.target;
  form.querySelector(".error").textContent = "";
  form.querySelector("button").disabled = true;
  try {
    const ok = await start({ user: form.elements.user.value, password: form.elements.password.value });
    if (ok) form.elements.password.value = "";
  } finally {
    form.querySelector("button").disabled = false;
  }
});
$("logout").addEventListener("click", () => {
  start();
});
// --- search: a key prefix locally, or a live query (PROTOCOL.md 14) ---------------------------
//
// "plant/" filters the keys already shown by prefix, at once. Words that a prefix cannot
// say make the search a query fetch of the daemon, kept live while it is shown:
// "*temp" (the key contains "temp"), "-test" (it does not), "score>=10", "gender==\"f\"",
// "value<0" (value filters: == != < <= > >=, a JSON literal or a bare word as a string).

const search = {
  /** @type {Set<string>|null} keys that match the query search, kept by its fetch */
  keys: null,
  fetch: null,
  error: null,
  generation: 0,
};
const FILTER_WORD = /^([^=!<>]+?)\s*(==|!=|<=|>=|<|>)\s*(.+)$/;
const FILTER_METHOD = { "==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge" };

/** A search text as a QuerySpec, or null when it is a plain prefix.
 *  @throws {Error} for a word it cannot read */
function parseSearch(text) {
  const words = text.trim().split(/\s+/).filter(Boolean);
  let prefix = "";
  const match = [];
  const where = [];
  for (const word of words) {
    const f = FILTER_WORD.exec(word);
    if (f) {
      // "v>>3" must not become v > the string ">3": an operand never starts with an operator.
      if (/^[=!<>]/.test(f[3])) throw new Error(`${word}: ${JSON.stringify(f[3])} after ${f[2]} is not a value`);
      let operand;
      try { operand = JSON.parse(f[3]); } catch { operand = f[3]; }
      if (operand !== null && typeof operand === "object") throw new Error(`${word}: compare with a number, string, bool or null`);
      const target = f[1] === "value" ? itself : field(f[1]);
      where.push(target[FILTER_METHOD[f[2]]](operand));
    } else if (word.startsWith("*")) {
      match.push(keyMatcher.contains(word.slice(1)));
    } else if (word.startsWith("-") && word.length > 1) {
      match.push(keyMatcher.contains(word.slice(1)).not());
    } else if (!prefix) {
      prefix = word;
    } else {
      throw new Error(`${word}: one prefix only (use *text for "contains")`);
    }
  }
  return match.length || where.length ? { prefix, match, where } : null;
}

async function runSearch(text) {
  const mine = ++search.generation;
  if (search.fetch) {
    const old = search.fetch;
    search.fetch = null;
    old.unfetch().catch(() => {});
  }
  search.keys = null;
  search.error = null;
  let spec = null;
  try {
    spec = parseSearch(text);
  } catch (e) {
    search.keys = new Set();
    search.error = `cannot read the search: ${e.message}`;
  }
  if (spec) {
    if (!peer || !(peer.info.features & FEATURE_QUERIES)) {
      search.keys = new Set();
      search.error = "this daemon answers no queries: search by key prefix";
    } else {
      const keys = new Set();
      search.keys = keys;
      try {
        const fetch = await peer.fetch(spec, (ev) => {
          if (ev.kind === "add" || ev.kind === "change") keys.add(ev.key);
          else keys.delete(ev.key);
          frame.structure.add(model.root);
          schedule();
        });
        if (mine !== search.generation) fetch.unfetch().catch(() => {});
        else search.fetch = fetch;
      } catch (e) {
        if (mine === search.generation) search.error = e instanceof PeerError ? `${e.name}: ${e.message}` : String(e);
      }
    }
  }
  if (mine !== search.generation) return;
  filter = text.trim();
  frame.filterChanged = true;
  schedule();
}

$("search").addEventListener("input", (e) => {
  $("more").textContent = "";
  runSearch(e.target.value);
});
$("call-any").addEventListener("submit", (e) => {
  e.preventDefault();
  select(e.target.elements.key.value);
});
setInterval(pollRegistry, REGISTRY_POLL_MS);
setInterval(showRate, 1000); // the rate falls when changes stop
setInterval(() => {
  showRowRates(); // the rows' rates too: one pass over the rows on screen
  stillOps();
}, 1000);
for (const tab of $("views").querySelectorAll("button")) tab.addEventListener("click", () => showView(tab.dataset.view));
window.jetConsole = { model, ops, showRowRates, get peer() { return peer; }, get user() { return user; } }; // for the curious (and the tests)
start();
