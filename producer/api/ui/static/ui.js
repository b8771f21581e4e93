// The status page: polls GET /v1/status once a second with the operator key kept in sessionStorage,
// draws it, and flips the critical-only switch with PUT /v1/mode after a confirmation.
// It reads the audit trail (GET /v1/audit) every few polls.
// Every value goes in as text (textContent), never as markup.
"use strict";

const POLL_MS = 1000;
const HISTORY_MS = 5 * 60 * 1000;
const KEY_NAME = "tidegate-operator-key";
const COLOURS = ["#4fa3ff", "#ffb347", "#b38cff", "#5fd3a6", "#ff7eb6", "#c8d45f"];
const NS = "http://www.w3.org/2000/svg";
const AUDIT_EVERY = 5;
const AUDIT_ROWS = 15;

const body = document.body;
const types = body.dataset.types ? body.dataset.types.split(",") : [];
const thresholds = body.dataset.thresholds.split(",").map(Number);
const history = [];
let current = null;
let timer = null;
let polls = 0;

const $ = (id) => document.getElementById(id);

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function clock(at) {
  return at ? new Date(at * 1000).toLocaleTimeString([], { hour12: false }) : "–";
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows.map((cells) => {
    const tr = el("tr");
    for (const cell of cells) tr.append(cell instanceof Node ? cell : el("td", cell));
    return tr;
  }));
}

function levelTag(level) {
  return el("span", level, "tag level-" + level);
}

function showLogin(message) {
  $("board").hidden = true;
  $("login").hidden = false;
  $("logout").hidden = true;
  $("mode-switch").disabled = true;
  $("login-error").textContent = message || "";
}

async function call(method, path, payload) {
  const key = sessionStorage.getItem(KEY_NAME);
  const init = { method, headers: { Authorization: "Bearer " + key } };
  if (payload !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(payload);
  }
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({}));
  if (response.status === 401 || response.status === 403) {
    sessionStorage.removeItem(KEY_NAME);
    stop();
    const detail = data.error && data.error.message ? data.error.message : response.statusText;
    showLogin("Refused (" + response.status + "): " + detail);
    throw new Error("refused");
  }
  if (!response.ok) throw new Error(path + " answered " + response.status);
  return data;
}

function drawLevel(doc) {
  const box = $("level");
  box.className = "level level-" + doc.level;
  $("level-name").textContent = doc.level.toUpperCase();
  const since = doc.level_since ? " since " + clock(doc.level_since) : "";
  $("level-since").textContent = since + (doc.level_source === "monitor" ? "" : " (from depth)");
  $("mode").textContent = doc.mode;
  const button = $("mode-switch");
  button.disabled = false;
  const critical = doc.mode === "critical-only";
  button.classList.toggle("danger", !critical);
  button.textContent = critical
    ? "Back to normal intake"
    : "Protect " + (doc.critical_types.join(" and ") || "critical types") + " only";
  body.classList.toggle("critical-only", critical);
}

function niceStep(raw) {
  const power = 10 ** Math.floor(Math.log10(Math.max(raw, 1)));
  for (const m of [1, 2, 5, 10]) if (m * power >= raw) return m * power;
  return 10 * power;
}

function svgNode(tag, attrs, text) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function drawChart() {
  // Drawn in the chart's own pixels (viewBox = its size), so the scale's text is never stretched.
  const svg = $("chart");
  const width = svg.clientWidth || 600, height = svg.clientHeight || 200;
  svg.setAttribute("viewBox", "0 0 " + width + " " + height);
  const left = 52, right = 14, top = 12, bottom = 26;
  const plotW = width - left - right, plotH = height - top - bottom;
  const now = Date.now();
  while (history.length && history[0].at < now - HISTORY_MS) history.shift();
  const highest = Math.max(thresholds[2] * 1.2, ...history.map((h) => h.total));
  const step = niceStep(highest / 4);
  const peak = Math.ceil(highest / step) * step;
  const x = (at) => left + plotW - ((now - at) / HISTORY_MS) * plotW;
  const y = (v) => top + plotH - (v / peak) * plotH;
  const nodes = [];
  for (let v = 0; v <= peak; v += step) {
    nodes.push(svgNode("line", { x1: left, x2: left + plotW, y1: y(v), y2: y(v), class: "grid" }));
    nodes.push(svgNode("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end", class: "tick" }, v));
  }
  const minutes = HISTORY_MS / 60000;
  for (let m = 0; m <= minutes; m++) {
    const at = left + plotW - (m / minutes) * plotW;
    nodes.push(svgNode("line", { x1: at, x2: at, y1: top + plotH, y2: top + plotH + 4, class: "axis" }));
    nodes.push(svgNode("text", { x: at, y: height - 6, "text-anchor": m === 0 ? "end" : "middle", class: "tick" },
      m === 0 ? "now" : "−" + m + " min"));
  }
  nodes.push(svgNode("line", { x1: left, x2: left, y1: top, y2: top + plotH, class: "axis" }));
  nodes.push(svgNode("line", { x1: left, x2: left + plotW, y1: top + plotH, y2: top + plotH, class: "axis" }));
  nodes.push(svgNode("text", { x: 12, y: top + plotH / 2, "text-anchor": "middle", class: "tick",
    transform: "rotate(-90 12 " + (top + plotH / 2) + ")" }, "tickets queued"));
  ["yellow", "orange", "red"].forEach((name, i) => {
    const at = y(thresholds[i]);
    nodes.push(svgNode("line", { x1: left, x2: left + plotW, y1: at, y2: at, class: "threshold level-" + name }));
    nodes.push(svgNode("text", { x: left + 4, y: at - 3, class: "tick threshold-label" }, name + " > " + thresholds[i]));
  });
  const series = [["total", (h) => h.total, "#e8e8e8"]].concat(
    types.map((t, i) => [t, (h) => h.byType[t] || 0, COLOURS[i % COLOURS.length]]));
  for (const [name, value, colour] of series) {
    nodes.push(svgNode("polyline", {
      points: history.map((h) => x(h.at).toFixed(1) + "," + y(value(h)).toFixed(1)).join(" "),
      stroke: colour, class: name === "total" ? "series total" : "series", "data-type": name,
    }));
  }
  svg.replaceChildren(...nodes);
}

function drawTypes(doc) {
  fill($("types").tBodies[0], types.map((t, i) => {
    const name = el("td");
    const swatch = el("span", "", "swatch");
    swatch.style.background = COLOURS[i % COLOURS.length];
    name.append(swatch, t);
    const depth = doc.depth_by_type[t] || 0;
    const cap = doc.caps[t];
    return [name, depth, cap, (doc.oldest_wait_seconds[t] || 0).toFixed(1) + " s"];
  }));
  $("depth").textContent = doc.depth;
  $("inflight").textContent = doc.inflight;
  $("drain").textContent = doc.drain_rate === null ? "–" : doc.drain_rate.toFixed(1) + "/s";
  $("desired").textContent = doc.desired_workers === null ? "–" : doc.desired_workers + " workers";
  const mib = (b) => (b / 1024 ** 2).toFixed(0) + " MiB";
  const used = doc.redis_used_memory;
  $("memory").textContent = used === null ? "unknown"
    : mib(used) + (doc.redis_memory_budget ? " of " + mib(doc.redis_memory_budget) : "")
      + (doc.memory_guard ? " · guard on: non-critical intake shed" : "");
  $("memory").classList.toggle("alert", Boolean(doc.memory_guard));
}

function drawTransitions(doc) {
  const items = doc.transitions.map((e) => {
    const li = el("li");
    li.append(el("time", clock(Number(e.at))), " ", levelTag(e.from), " → ", levelTag(e.to),
      el("span", " depth " + e.depth, "dim"));
    return li;
  });
  if (!items.length) items.push(el("li", "none recorded", "dim"));
  $("transitions").replaceChildren(...items);
}

function meter(fraction) {
  const td = el("td");
  if (fraction === null) { td.textContent = "–"; return td; }
  const bar = el("span", "", "meter");
  const fillBar = el("span", "", fraction > 0.85 ? "hot" : fraction > 0.6 ? "warm" : "cool");
  fillBar.style.width = Math.round(Math.min(fraction, 1) * 100) + "%";
  bar.append(fillBar);
  td.append(bar, " " + Math.round(fraction * 100) + "%");
  return td;
}

function concurrency(worker) {
  // The adaptive throttle's limit while in force, and what binds the next claim.
  const limit = worker.concurrency_limit === null || worker.concurrency_limit === undefined
    ? "" : String(worker.concurrency_limit);
  const bound = worker.bound ? "bound by " + worker.bound.replaceAll("_", " ") : "";
  if (limit && bound) return limit + " (" + bound + ")";
  return limit || bound || "–";
}

function drawWorkers(doc) {
  const dash = (v) => (v === null || v === undefined ? "–" : v);
  const gib = (b) => (b === null ? "–" : (b / 1024 ** 3).toFixed(1) + " GiB");
  fill($("workers").tBodies[0], doc.workers.map((w) => [
    w.worker_id, w.gpu, dash(w.state), dash(w.inflight), dash(w.batch_limit), concurrency(w),
    meter(w.kv_usage), gib(w.gpu_free_bytes),
  ]));
  $("workers-alive").textContent = doc.workers_alive + " alive";
}

function drawSheds(doc) {
  const rows = Object.entries(doc.sheds.by_code).map(([code, n]) => [code, n]);
  if (!rows.length) rows.push([el("td", "none", "dim"), ""]);
  fill($("sheds").tBodies[0], rows);
  $("sheds-window").textContent = "last " + Math.round(doc.sheds.window_seconds / 60) + " minutes";
}

function drawState(id, state) {
  const list = $(id);
  if (!state) { list.replaceChildren(el("dd", "not configured", "dim")); return; }
  const nodes = [];
  for (const [k, v] of Object.entries(state)) {
    nodes.push(el("dt", k), el("dd", typeof v === "object" ? JSON.stringify(v) : v));
  }
  list.replaceChildren(...nodes);
}

const LEVEL_WORDS = {
  closed: "closed: normal",
  instant: "instant: errors in the last second",
  sustained: "sustained: sent to the fallback",
  deep: "deep: a person is paged",
};

function phaseWords(b) {
  if (b.phase === "open") return "open: refusing, retry in " + Math.ceil(b.retry_after) + " s";
  if (b.phase === "half_open") return "half-open: probing";
  return "closed: taking work";
}

function drawBreakers(breakers) {
  const tbody = $("breakers").tBodies[0];
  const entries = Object.entries(breakers || {});
  if (!entries.length) {
    const td = el("td", "no endpoint recorded yet", "dim");
    td.colSpan = 5;
    fill(tbody, [[td]]);
    return;
  }
  fill(tbody, entries.map(([endpoint, b]) => {
    const name = el("td", endpoint);
    if (b.role && b.role !== "primary") name.append(el("span", " (" + b.role + ")", "dim"));
    const level = el("td");
    level.append(el("span", LEVEL_WORDS[b.level] || b.level, "tag breaker-" + b.level));
    const rates = b.error_rates || {}, counts = b.requests || {};
    // A window with no request has no rate: "–", not a reassuring 0%.
    const percent = (w) => (counts[w] ? Math.round(rates[w] * 100) + "%" : "–");
    const rate = el("td", ["instant", "sustained", "deep"].map(percent).join(" · "));
    rate.title = ["instant", "sustained", "deep"].map((w) => (counts[w] || 0) + " requests").join(" · ");
    return [name, level, phaseWords(b), rate, b.since ? clock(b.since) : "never tripped"];
  }));
}

function shown(value) {
  if (value === null || value === undefined) return "–";
  return typeof value === "object" ? JSON.stringify(value) : String(value);
}

async function pollAudit() {
  // GET /v1/audit may be absent (an older API): the panel says so and the rest of the page is unharmed.
  const tbody = $("audit").tBodies[0];
  const note = (text) => { const td = el("td", text, "dim"); td.colSpan = 5; fill(tbody, [[td]]); };
  let response;
  try {
    response = await fetch("/v1/audit", { headers: { Authorization: "Bearer " + sessionStorage.getItem(KEY_NAME) } });
  } catch (error) {
    note("audit trail unreachable: " + error.message);
    return;
  }
  if (response.status === 404) { note("no audit trail on this API (GET /v1/audit answered 404)"); return; }
  if (!response.ok) { note("audit trail unavailable: GET /v1/audit answered " + response.status); return; }
  const data = await response.json().catch(() => ({}));
  const entries = Array.isArray(data.entries) ? data.entries.slice(0, AUDIT_ROWS) : [];
  if (!entries.length) { note("no operator action recorded yet"); return; }
  fill(tbody, entries.map((e) => [
    el("td", clock(Number(e.time))), shown(e.actor), shown(e.action), shown(e.target),
    shown(e.before) + " → " + shown(e.after),
  ]));
}

function draw(doc) {
  current = doc;
  if (doc.history.length) {
    // The acting monitor's samples: the same on every replica and after a reload.
    history.length = 0;
    for (const h of doc.history) {
      const total = Object.values(h.depth_by_type).reduce((a, b) => a + b, 0);
      history.push({ at: h.at * 1000, total, byType: h.depth_by_type });
    }
  }
  // This poll's figures, so the chart reaches "now" even between the monitor's samples.
  history.push({ at: doc.generated_at * 1000, total: doc.depth, byType: doc.depth_by_type });
  drawLevel(doc);
  drawChart();
  drawTypes(doc);
  drawTransitions(doc);
  drawWorkers(doc);
  drawSheds(doc);
  drawBreakers(doc.breakers);
  drawState("rollout", doc.rollout);
  $("refreshed").textContent = "refreshed " + clock(doc.generated_at);
  $("refreshed").classList.remove("stale");
}

async function poll() {
  try {
    draw(await call("GET", "/v1/status"));
    if (polls++ % AUDIT_EVERY === 0) await pollAudit();
  } catch (error) {
    if (error.message !== "refused") {
      $("refreshed").textContent = "refresh failed: " + error.message;
      $("refreshed").classList.add("stale");
    }
  }
}

function start() {
  polls = 0;
  $("login").hidden = true;
  $("board").hidden = false;
  $("logout").hidden = false;
  stop();
  poll();
  timer = setInterval(poll, POLL_MS);
}

function stop() {
  if (timer !== null) clearInterval(timer);
  timer = null;
}

function askToSwitch() {
  if (!current) return;
  const target = current.mode === "critical-only" ? "normal" : "critical-only";
  $("confirm-text").textContent = target === "critical-only"
    ? "Admit only " + (current.critical_types.join(" and ") || "critical") +
      " tickets? Every other ticket will be refused with 429 until intake is set back to normal."
    : "Set intake back to normal? Every ticket type will be admitted again.";
  $("confirm").dataset.target = target;
  $("confirm").showModal();
}

async function switchMode() {
  const target = $("confirm").dataset.target;
  try {
    await call("PUT", "/v1/mode", { mode: target });
  } catch (error) {
    if (error.message !== "refused") $("refreshed").textContent = "mode change failed: " + error.message;
    return;
  }
  polls = 0;  // the switch is an audited action: show it at once
  poll();
}

$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY_NAME, $("key").value.trim());
  $("key").value = "";
  start();
});
$("logout").addEventListener("click", () => { sessionStorage.removeItem(KEY_NAME); stop(); showLogin(""); });
$("mode-switch").addEventListener("click", askToSwitch);
$("confirm").addEventListener("close", () => { if ($("confirm").returnValue === "ok") switchMode(); });

if (sessionStorage.getItem(KEY_NAME)) start(); else showLogin("");
