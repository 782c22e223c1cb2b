// twinkle's runs dashboard: reads GET /api/v1/dashboard (runs, checkpoints, samplers, the live
// queue) and GET /api/v1/dashboard/steps?run=ID (a run's per-step metrics) with the key kept in
// sessionStorage, and draws the curves as SVG. No framework, nothing from another origin.
"use strict";

const KEY_ITEM = "twinkle-api-key";
const REFRESH_MS = 5000;
const MAX_CURVES = 24;          // runs whose curves load at once; the others on demand
const SVG_NS = "http://www.w3.org/2000/svg";

const chosen = new Map();       // run id -> "kind\u0000metric" the user picked
const wanted = new Set();       // runs beyond MAX_CURVES whose curve was asked for
let timer = null;

// ---- the key ----

// A key in the URL fragment (#key=tml-...) moves to sessionStorage and leaves the address bar.
function keyFromFragment() {
  const m = /(?:^#|&)key=([^&]*)/.exec(location.hash);
  if (!m) return;
  try {
    sessionStorage.setItem(KEY_ITEM, decodeURIComponent(m[1]));
  } catch (e) { /* storage refused: the login form asks */ }
  history.replaceState(null, "", location.pathname + location.search);
}

function apiKey() {
  try { return sessionStorage.getItem(KEY_ITEM); } catch (e) { return null; }
}

// ---- small DOM helpers (text only: every value from the server goes in as text) ----

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function show(id, on) { document.getElementById(id).hidden = !on; }

function fmtTime(unix) {
  if (unix === null || unix === undefined) return "";
  return new Date(unix * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}

function fmtDuration(s) {
  if (s === null || s === undefined) return "never";
  if (s <= 0) return "expired";
  const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
  return d ? `${d}d ${h}h` : h ? `${h}h ${m}m` : m ? `${m}m` : `${Math.ceil(s)}s`;
}

function fmtNum(v) {
  if (v === null || v === undefined) return "—";
  if (v === 0) return "0";
  const a = Math.abs(v);
  return a >= 1e5 || a < 1e-3 ? v.toExponential(3) : String(Number(v.toPrecision(5)));
}

// ---- the API ----

async function api(path) {
  const r = await fetch(path, { headers: { "X-API-Key": apiKey() || "" }, cache: "no-store" });
  let body = null;
  try { body = await r.json(); } catch (e) { /* not JSON */ }
  if (!r.ok) {
    const err = new Error((body && (body.error || body.detail)) || `HTTP ${r.status}`);
    err.status = r.status;
    throw err;
  }
  return body;
}

// ---- curves ----

// Every (kind, metric) a run's series hold, forward_backward's loss first.
function seriesChoices(steps) {
  const out = [];
  for (const s of steps.series)
    for (const m of Object.keys(s.metrics)) out.push({ kind: s.kind, metric: m, key: s.kind + "\u0000" + m });
  const rank = (c) => (c.kind === "forward_backward" ? 0 : c.kind === "forward" ? 1 : 2) * 10 +
                      (c.metric === "loss:sum" ? 0 : 1);
  out.sort((a, b) => rank(a) - rank(b));
  return out;
}

// An SVG line chart of one metric against the optimizer step; null values (non-finite) are gaps.
function drawCurve(runId, series, metric) {
  const W = 600, H = 210, L = 58, R = 12, T = 12, B = 30;
  const ys = series.metrics[metric] || [], xs = series.step;
  const pts = [];
  for (let i = 0; i < ys.length; i++) if (ys[i] !== null && Number.isFinite(ys[i])) pts.push([xs[i], ys[i], i]);
  const chart = svg("svg", { class: "curve", viewBox: `0 0 ${W} ${H}`, role: "img",
                             "data-run": runId, "data-kind": series.kind, "data-metric": metric,
                             "data-points": String(pts.length) });
  const title = svg("title");
  title.textContent = `${series.kind} ${metric}: ${pts.length} points`;
  chart.append(title);
  chart.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  chart.append(svg("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  if (!pts.length) {
    const t = svg("text", { x: L + 10, y: T + 20 });
    t.textContent = "no finite values";
    chart.append(t);
    return chart;
  }
  let x0 = Math.min(...pts.map((p) => p[0])), x1 = Math.max(...pts.map((p) => p[0]));
  let y0 = Math.min(...pts.map((p) => p[1])), y1 = Math.max(...pts.map((p) => p[1]));
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { const d = Math.abs(y0) * 0.05 || 1; y0 -= d; y1 += d; }
  const px = (x) => (L + (x - x0) / (x1 - x0) * (W - L - R)).toFixed(1);
  const py = (y) => (H - B - (y - y0) / (y1 - y0) * (H - T - B)).toFixed(1);
  for (let k = 0; k <= 4; k++) {
    const yv = y0 + (y1 - y0) * k / 4, yy = py(yv);
    if (k) chart.append(svg("line", { class: "grid", x1: L + 1, y1: yy, x2: W - R, y2: yy }));
    const t = svg("text", { x: L - 4, y: Number(yy) + 3, "text-anchor": "end" });
    t.textContent = fmtNum(yv);
    chart.append(t);
  }
  for (const [xv, anchor] of [[x0, "start"], [x1, "end"]]) {
    const t = svg("text", { x: px(xv), y: H - B + 14, "text-anchor": anchor });
    t.textContent = String(Math.round(xv));
    chart.append(t);
  }
  const xl = svg("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle" });
  xl.textContent = "optimizer step";
  chart.append(xl);
  // one polyline per run of consecutive finite values
  let seg = [], prev = -2;
  const flush = () => {
    if (seg.length) chart.append(svg("polyline", { class: "line", points: seg.join(" ") }));
    if (seg.length === 1) {
      const [cx, cy] = seg[0].split(",");
      chart.append(svg("circle", { class: "dot", cx, cy, r: 2.5 }));
    }
    seg = [];
  };
  for (const [xv, yv, i] of pts) {
    if (i !== prev + 1) flush();
    seg.push(`${px(xv)},${py(yv)}`);
    prev = i;
  }
  flush();
  return chart;
}

function renderCurve(box, run, steps) {
  box.replaceChildren();
  const choices = seriesChoices(steps);
  if (!choices.length) {
    box.append(el("p", { class: "empty" }, "no steps recorded yet"));
    return;
  }
  let pick = choices.find((c) => c.key === chosen.get(run.id)) || choices[0];
  const select = el("select", { "aria-label": "metric" });
  for (const c of choices) {
    const o = el("option", { value: c.key }, `${c.kind} · ${c.metric}`);
    if (c.key === pick.key) o.selected = true;
    select.append(o);
  }
  const series = steps.series.find((s) => s.kind === pick.kind);
  const vals = series.metrics[pick.metric];
  const last = vals.length ? vals[vals.length - 1] : null;
  const chartBox = el("div", {}, drawCurve(run.id, series, pick.metric));
  select.addEventListener("change", () => {
    chosen.set(run.id, select.value);
    renderCurve(box, run, steps);
  });
  box.append(el("div", { class: "controls" }, select,
                el("span", { class: "last" }, `last ${fmtNum(last)} · ${series.points} points`)),
             chartBox);
}

// ---- the sections ----

function renderRuns(data, stepsById) {
  const box = document.getElementById("runs");
  box.replaceChildren();
  document.getElementById("runs-count").textContent =
    data.runs.length < data.runs_total ? `(newest ${data.runs.length} of ${data.runs_total})` : `(${data.runs_total})`;
  if (!data.runs.length) {
    box.append(el("p", { class: "empty" }, "no training runs yet"));
    return;
  }
  const grid = el("div", { class: "runs" });
  data.runs.forEach((run, i) => {
    const card = el("article", { class: "run", "data-run": run.id, "data-tenant": run.tenant });
    card.append(el("h3", {}, run.id));
    const meta = el("div", { class: "meta" });
    if (data.admin) meta.append(el("span", { class: "tenant" }, run.tenant));
    meta.append(el("span", { class: "state-" + run.state }, run.state),
                el("span", {}, `${run.base_model} · rank ${run.lora_rank}`),
                el("span", {}, `created ${fmtTime(run.created)}`),
                el("span", {}, `last request ${fmtTime(run.last_request)}`));
    if (run.running || run.waiting) meta.append(el("span", {}, `queue: ${run.running} running, ${run.waiting} waiting`));
    card.append(meta);
    const curveBox = el("div", { class: "curve-box" });
    const steps = stepsById.get(run.id);
    if (steps instanceof Error) curveBox.append(el("p", { class: "error" }, steps.message));
    else if (steps) renderCurve(curveBox, run, steps);
    else {
      const b = el("button", { type: "button" }, "show curve");
      b.addEventListener("click", () => { wanted.add(run.id); refresh(); });
      curveBox.append(b);
    }
    card.append(curveBox);
    grid.append(card);
  });
  box.append(grid);
}

function table(headers, rows) {
  const t = el("table");
  t.append(el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h)))));
  const body = el("tbody");
  for (const r of rows) body.append(r);
  t.append(body);
  return t;
}

function renderCheckpoints(data) {
  const box = document.getElementById("checkpoints");
  box.replaceChildren();
  document.getElementById("ckpts-count").textContent =
    data.checkpoints.length < data.checkpoints_total
      ? `(newest ${data.checkpoints.length} of ${data.checkpoints_total})` : `(${data.checkpoints_total})`;
  if (!data.checkpoints.length) {
    box.append(el("p", { class: "empty" }, "no checkpoints"));
    return;
  }
  const heads = ["path", "type", "size", "created", "expires", "TTL left", "published"];
  if (data.admin) heads.splice(1, 0, "tenant");
  box.append(table(heads, data.checkpoints.map((c) => {
    const soon = c.ttl_seconds_left !== null && c.ttl_seconds_left < 3600;
    const cells = [el("td", { class: "mono" }, c.tinker_path), el("td", {}, c.type),
                   el("td", { class: "num" }, fmtBytes(c.size_bytes)), el("td", {}, fmtTime(c.created)),
                   el("td", {}, c.expires_at ? fmtTime(c.expires_at) : "never"),
                   el("td", { class: soon ? "soon" : "" }, fmtDuration(c.ttl_seconds_left)),
                   el("td", {}, c.public ? "yes" : "no")];
    if (data.admin) cells.splice(1, 0, el("td", {}, c.tenant));
    return el("tr", { "data-path": c.tinker_path }, ...cells);
  })));
}

function renderSamplers(data) {
  const box = document.getElementById("samplers");
  box.replaceChildren();
  if (!data.samplers.length) {
    box.append(el("p", { class: "empty" }, "no sampling sessions"));
    return;
  }
  const heads = ["session", "base model", "weights"];
  if (data.admin) heads.splice(1, 0, "tenant");
  box.append(table(heads, data.samplers.map((s) => {
    const cells = [el("td", { class: "mono" }, s.id), el("td", {}, s.base_model),
                   el("td", { class: "mono" }, s.model_path || (s.adapter ? "snapshot of a run" : "base model"))];
    if (data.admin) cells.splice(1, 0, el("td", {}, s.tenant));
    return el("tr", {}, ...cells);
  })));
}

function renderQueue(data) {
  const box = document.getElementById("queue");
  box.replaceChildren();
  const q = data.queue;
  if (data.admin)
    box.append(el("p", {}, `sampling requests queued or running: ${q.sample_requests} (limit ${q.sample_queue_limit})`));
  if (!q.runs.length) {
    box.append(el("p", { class: "empty" }, "no training operations queued"));
    return;
  }
  const heads = ["run", "running", "waiting for an earlier seq_id", "next seq_id"];
  if (data.admin) heads.splice(1, 0, "tenant");
  box.append(table(heads, q.runs.map((r) => {
    const cells = [el("td", { class: "mono" }, r.run_id), el("td", { class: "num" }, r.running),
                   el("td", { class: "num" }, r.waiting), el("td", { class: "num" }, r.next_seq)];
    if (data.admin) cells.splice(1, 0, el("td", {}, r.tenant));
    return el("tr", {}, ...cells);
  })));
}

// ---- the page's states ----

function showLogin(message) {
  clearTimeout(timer);
  document.body.dataset.state = "login";
  show("login-section", true);
  show("content", false);
  show("logout", false);
  document.getElementById("who").textContent = "";
  const e = document.getElementById("error");
  e.textContent = message || "";
  e.hidden = !message;
}

async function refresh() {
  clearTimeout(timer);
  if (!apiKey()) {
    showLogin();
    return;
  }
  try {
    const data = await api("/api/v1/dashboard");
    const stepsById = new Map();
    await Promise.all(data.runs.map(async (run, i) => {
      if (i >= MAX_CURVES && !wanted.has(run.id)) return;
      try {
        stepsById.set(run.id, await api("/api/v1/dashboard/steps?run=" + encodeURIComponent(run.id)));
      } catch (e) {
        stepsById.set(run.id, e);
      }
    }));
    show("login-section", false);
    show("error", false);
    show("content", true);
    show("logout", true);
    document.getElementById("who").textContent =
      data.admin ? `admin (${data.tenant}): every tenant` : `tenant ${data.tenant}`;
    renderRuns(data, stepsById);
    renderQueue(data);
    renderCheckpoints(data);
    renderSamplers(data);
    document.getElementById("updated").textContent = "updated " + fmtTime(data.time);
    document.body.dataset.state = "ready";
    document.body.dataset.admin = data.admin ? "1" : "0";
  } catch (e) {
    if (e.status === 401) {
      try { sessionStorage.removeItem(KEY_ITEM); } catch (x) { /* nothing kept */ }
      showLogin("That key was not accepted: " + e.message);
      return;
    }
    document.body.dataset.state = "error";
    const err = document.getElementById("error");
    err.textContent = "Could not load the dashboard: " + e.message;
    err.hidden = false;
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

document.getElementById("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const input = document.getElementById("key");
  try { sessionStorage.setItem(KEY_ITEM, input.value.trim()); } catch (e) { /* see showLogin */ }
  input.value = "";
  refresh();
});

document.getElementById("logout").addEventListener("click", () => {
  try { sessionStorage.removeItem(KEY_ITEM); } catch (e) { /* nothing kept */ }
  showLogin();
});

keyFromFragment();
refresh();
