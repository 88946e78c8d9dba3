// MemoryMonitor's live chart (anywidget ESM, shipped in the hpu_nb package: no CDN, works offline).
// Python sends deltas: {seq, base, reset, points: [[x, Limit, InUse, MaxInUse, stage], ...]}. The history lives
// in a per-model store (keyed by the model's uid) filled in initialize(), so every view — including one created
// after a page reload — draws the same points. A gap in the sequence asks Python for the whole history.

const SVG = "http://www.w3.org/2000/svg";
const STORES = new Map();
const COLORS = { Limit: "#d62728", InUse: "#1f77b4", MaxInUse: "#ff7f0e" };
const COLUMN = { Limit: 1, InUse: 2, MaxInUse: 3 };

function formatBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = Math.abs(n);
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  const sign = n < 0 ? "-" : "";
  return i === 0 ? `${sign}${v.toFixed(0)} B` : `${sign}${v.toFixed(v >= 100 ? 0 : v >= 10 ? 1 : 2)} ${units[i]}`;
}

function storeFor(model) {
  const uid = model.get("uid");
  let store = STORES.get(uid);
  if (!store) {
    store = { points: [], seq: -1, listeners: new Set() };
    STORES.set(uid, store);
  }
  return store;
}

// Points arrive as one binary buffer of float64, five numbers per point (x, Limit, InUse, MaxInUse, stage).
function decodePoints(points) {
  if (Array.isArray(points)) return points;
  if (!points) return [];
  const view = points instanceof DataView ? points : new DataView(points.buffer || points);
  const flat = new Float64Array(view.buffer.slice(view.byteOffset, view.byteOffset + view.byteLength));
  const out = [];
  for (let i = 0; i + 5 <= flat.length; i += 5) out.push([flat[i], flat[i + 1], flat[i + 2], flat[i + 3], flat[i + 4]]);
  return out;
}

// Returns true when a gap was seen (a delta we never got): the caller then asks for a full sync.
function applyDelta(store, delta) {
  if (!delta || typeof delta.seq !== "number" || delta.seq === store.seq) return false;
  const points = decodePoints(delta.points);
  if (delta.reset) {
    store.points = points;
    store.seq = delta.seq;
    return false;
  }
  const gap = delta.base !== store.seq;
  for (const p of points) store.points.push(p);
  store.seq = delta.seq;
  return gap;
}

function el(tag, attrs = {}, parent = null, ns = null) {
  const node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function niceStep(span) {
  const raw = span / 4;
  const mag = Math.pow(1024, Math.floor(Math.log(Math.max(raw, 1)) / Math.log(1024)));
  const r = raw / mag;
  const step = r <= 1 ? 1 : r <= 2 ? 2 : r <= 4 ? 4 : r <= 8 ? 8 : r <= 16 ? 16 : r <= 32 ? 32 : r <= 64 ? 64 :
    r <= 128 ? 128 : r <= 256 ? 256 : 512;
  return step * mag;
}

function drawChart(svg, store, model, scaleMode) {
  const W = 620, H = 240, L = 72, R = 12, T = 12, B = 28;
  const w = W - L - R, h = H - T - B;
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const pts = store.points;
  const oom = model.get("oom") || {};
  svg.setAttribute("data-npoints", String(pts.length));
  svg.setAttribute("data-seq", String(store.seq));
  el("rect", { x: L, y: T, width: w, height: h, class: "hpu-mem-plot" }, svg, SVG);
  if (pts.length === 0) {
    const t = el("text", { x: L + w / 2, y: T + h / 2, "text-anchor": "middle", class: "hpu-mem-empty" }, svg, SVG);
    t.textContent = "waiting for the first batch…";
    return;
  }
  const limit = pts[pts.length - 1][1];
  let top = 0;
  for (const p of pts) top = Math.max(top, p[3], p[2]);
  if (oom.in_use !== undefined) top = Math.max(top, oom.in_use + (oom.requested || 0));
  const showLimit = scaleMode === "limit" || (scaleMode === "auto" && (oom.x !== undefined || top >= 0.05 * limit));
  const ymax = Math.max(showLimit ? Math.max(limit, top) : top, 1) * 1.08;
  const x0 = pts[0][0];
  const x1 = Math.max(pts[pts.length - 1][0], oom.x || 0, x0 + 1);
  const sx = (x) => L + (w * (x - x0)) / (x1 - x0);
  const sy = (y) => T + h * (1 - y / ymax);
  const step = niceStep(ymax);
  for (let y = 0; y <= ymax; y += step) {
    el("line", { x1: L, x2: L + w, y1: sy(y), y2: sy(y), class: "hpu-mem-grid" }, svg, SVG);
    const t = el("text", { x: L - 6, y: sy(y) + 4, "text-anchor": "end", class: "hpu-mem-tick" }, svg, SVG);
    t.textContent = formatBytes(y);
  }
  const xl = el("text", { x: L, y: H - 8, class: "hpu-mem-tick" }, svg, SVG);
  xl.textContent = `batch ${x0}`;
  const xr = el("text", { x: L + w, y: H - 8, "text-anchor": "end", class: "hpu-mem-tick" }, svg, SVG);
  xr.textContent = `${x1}`;
  // validation / test / predict stretches are shaded so the eye sees where the train loop paused
  let start = null;
  for (let i = 0; i <= pts.length; i += 1) {
    const isEval = i < pts.length && pts[i][4] !== 0;
    if (isEval && start === null) start = pts[i][0];
    if (!isEval && start !== null) {
      const end = pts[i - 1][0];
      el("rect", { x: sx(start), y: T, width: Math.max(sx(end) - sx(start), 2), height: h, class: "hpu-mem-eval" },
        svg, SVG);
      start = null;
    }
  }
  const series = showLimit ? ["Limit", "MaxInUse", "InUse"] : ["MaxInUse", "InUse"];
  for (const name of series) {
    const col = COLUMN[name];
    const d = pts.map((p, i) => `${i ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[col]).toFixed(1)}`).join("");
    el("path", { d, class: `hpu-mem-line hpu-mem-${name}`, stroke: COLORS[name], "data-series": name }, svg, SVG);
  }
  if (!showLimit) {
    const t = el("text", { x: L + 8, y: T + 14, class: "hpu-mem-offscale" }, svg, SVG);
    t.textContent = `Limit ${formatBytes(limit)} is off scale (peak is ${(100 * top / limit).toFixed(2)}% of it)`;
  }
  if (oom.x !== undefined) {
    const x = sx(oom.x);
    const yTop = Math.max(sy(oom.in_use + (oom.requested || 0)), T);
    el("line", { x1: x, x2: x, y1: sy(oom.in_use), y2: yTop, class: "hpu-mem-oom-bar" }, svg, SVG);
    const t = el("text", { x: x - 6, y: T + 14, "text-anchor": "end", class: "hpu-mem-oom" }, svg, SVG);
    const over = oom.in_use + (oom.requested || 0) - limit;
    t.textContent = oom.requested
      ? `OOM: asked for ${formatBytes(oom.requested)}, ${formatBytes(Math.max(over, 0))} over the Limit`
      : "OOM: Limit hit";
  }
}

function drawCounters(table, model) {
  const current = model.get("current") || {};
  while (table.firstChild) table.removeChild(table.firstChild);
  const bytesKeys = new Set(["Limit", "InUse", "MaxInUse", "MaxAllocSize"]);
  for (const [k, v] of Object.entries(current)) {
    const tr = el("tr", {}, table);
    const th = el("td", { class: "hpu-mem-key" }, tr);
    if (COLORS[k]) el("span", { class: "hpu-mem-swatch", style: `background:${COLORS[k]}` }, th);
    th.appendChild(document.createTextNode(k));
    const td = el("td", { class: "hpu-mem-val", "data-key": k }, tr);
    td.textContent = bytesKeys.has(k) ? formatBytes(v) : String(v);
  }
  if (current.Limit !== undefined && current.MaxInUse !== undefined) {
    const oom = model.get("oom") || {};
    const tr = el("tr", { class: "hpu-mem-headroom" }, table);
    el("td", { class: "hpu-mem-key" }, tr).textContent = "headroom";
    el("td", { class: "hpu-mem-val" }, tr).textContent =
      oom.x !== undefined ? "none (OOM)" : formatBytes(current.Limit - current.MaxInUse);
  }
}

function initialize({ model }) {
  const store = storeFor(model);
  applyDelta(store, model.get("delta"));
  const first = model.get("delta");
  if (!first || !first.reset) model.send({ type: "sync" });
  const onDelta = () => {
    if (applyDelta(store, model.get("delta"))) model.send({ type: "sync" });
    for (const fn of store.listeners) fn();
  };
  model.on("change:delta", onDelta);
  return () => model.off("change:delta", onDelta);
}

function render({ model, el: root }) {
  const store = storeFor(model);
  let scaleMode = "auto";
  root.classList.add("hpu-mem");
  const head = el("div", { class: "hpu-mem-head" }, root);
  const title = el("span", { class: "hpu-mem-title" }, head);
  const badge = el("span", { class: "hpu-mem-badge" }, head);
  const status = el("span", { class: "hpu-mem-status" }, head);
  const scaleBtn = el("button", { class: "hpu-mem-scale", title: "y axis: fit the data, or always show the Limit" },
    head);
  const body = el("div", { class: "hpu-mem-body" }, root);
  const svg = el("svg", { viewBox: "0 0 620 240", class: "hpu-mem-chart", role: "img" }, body, SVG);
  const side = el("div", { class: "hpu-mem-side" }, body);
  const table = el("table", { class: "hpu-mem-counters" }, side);
  const legend = el("div", { class: "hpu-mem-legend" }, root);
  for (const name of ["InUse", "MaxInUse", "Limit"]) {
    const item = el("span", { class: "hpu-mem-legend-item" }, legend);
    el("span", { class: "hpu-mem-swatch", style: `background:${COLORS[name]}` }, item);
    item.appendChild(document.createTextNode(name));
  }
  const note = el("div", { class: "hpu-mem-summary" }, root);

  let frame = null;
  const redraw = () => {
    if (frame !== null) return;
    frame = requestAnimationFrame(() => {
      frame = null;
      try {
        title.textContent = `Device memory — ${model.get("device_label")}`;
        badge.textContent = model.get("is_emulated") ? "emulated" : "Gaudi";
        badge.className = `hpu-mem-badge ${model.get("is_emulated") ? "emulated" : "real"}`;
        const st = model.get("status");
        const stage = model.get("stage");
        status.textContent = `${stage ? stage + ": " : ""}${st}`;
        status.className = `hpu-mem-status hpu-mem-status-${st}`;
        scaleBtn.textContent = scaleMode === "auto" ? "y: auto" : "y: limit";
        drawChart(svg, store, model, scaleMode);
        drawCounters(table, model);
        const oom = model.get("oom") || {};
        note.textContent = oom.message ? `Out of memory: ${oom.message}` : model.get("summary");
        note.classList.toggle("hpu-mem-summary-oom", Boolean(oom.message));
        root.setAttribute("data-status", st);
      } catch (err) {
        note.textContent = `chart error: ${err}`;
      }
    });
  };
  scaleBtn.addEventListener("click", () => {
    scaleMode = scaleMode === "auto" ? "limit" : "auto";
    redraw();
  });
  store.listeners.add(redraw);
  const traits = "change:current change:status change:stage change:oom change:summary change:device_label";
  model.on(traits, redraw);
  redraw();
  return () => {
    store.listeners.delete(redraw);
    model.off(traits, redraw);
    if (frame !== null) cancelAnimationFrame(frame);
  };
}

export default { initialize, render };
