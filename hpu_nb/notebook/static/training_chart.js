// MemoryMonitor's live chart (anywidget ESM shipped in the hpu_nb package: no CDN, works offline).
// Python sends deltas: {seq, base, reset, points: float64 buffer of FIELDS per point}. The history lives in a
// per-model store (keyed by the model's uid) filled in initialize(), so every view — including one created after a
// page reload — draws the same points. A gap in the sequence asks Python for the whole history.
// Three panels share the batch axis: device memory, training loss, throughput per step (samples/s of each step;
// step time on hover). The summary also gives the wall-clock throughput of the whole run.
// Hovering shows every value at the nearest batch; dashed lines mark epochs; shaded bands are validation.

const SVG = "http://www.w3.org/2000/svg";
const STORES = new Map();
const FIELDS = ["x", "Limit", "InUse", "MaxInUse", "stage", "epoch", "loss", "seconds", "samples", "batches"];
const F = Object.fromEntries(FIELDS.map((name, i) => [name, i]));
const COLORS = { Limit: "#d62728", InUse: "#1f77b4", MaxInUse: "#ff7f0e", loss: "#2ca02c", rate: "#9467bd",
  planned: "#8c564b" };  // planned: MemoryMonitor(plan=...)'s predicted peak (summary.py: PLANNED_COLOUR)
// Each rank's InUse line, as hpu_nb/notebook/memory/svg.py RANK_STYLES (the saved notebook's snapshot): rank 0 a wide
// pale band under the lines, the others narrow dashed lines over it, so ranks with the same memory still read as two
// series (a dashed line inside a band), not as one line.
const RANK_STYLES = [
  { colour: "#17becf", width: 8, dash: "", opacity: 0.4 },
  { colour: "#8c564b", width: 1.8, dash: "6 3", opacity: 1 },
  { colour: "#e377c2", width: 1.8, dash: "2 2", opacity: 1 },
  { colour: "#7f7f7f", width: 1.8, dash: "8 2 2 2", opacity: 1 },
  { colour: "#bcbd22", width: 1.8, dash: "1 3", opacity: 1 },
];
const rankStyle = (r) => (r === 0 ? RANK_STYLES[0] : RANK_STYLES[1 + ((r - 1) % (RANK_STYLES.length - 1))]);

function rankCount(ranks) {
  const inUse = (ranks && ranks.in_use) || [];
  return ranks && ranks.x && ranks.x.length && inUse.length ? inUse[0].length : 0;
}
const W = 640, L = 72, R = 14;
const TITLE = 14;  // each panel's title sits in a row of its own above the plotting area: no line crosses it
const PANELS = [
  { key: "memory", height: 190 + TITLE, title: "device memory" },
  { key: "loss", height: 100 + TITLE, title: "training loss (line: smoothed; dots: each step)" },
  { key: "rate", height: 100 + TITLE, title: "throughput per step, samples/s (line: smoothed; dots: each step)" },
];
// TensorBoard's scalar smoothing: an exponential moving average, debiased so the first steps are not pulled to 0
const SMOOTHING = 0.6;
// the throughput axis ignores spikes, as TensorBoard's "ignore outliers" (hpu_nb/notebook/memory/summary.py's
// robust_top is the same rule): with 5 or more steps its top is Tukey's far-out fence (Q3 + 3 IQR), kept between 1.2 x
// and 2.5 x the median; faster steps are marked at the top edge and counted (one fast step used to flatten every other
// to the floor). The 2.5 x cap: on a loaded machine step times spread (some steps wait for a core), the IQR widens and
// the fence alone went to ~7.5 x the median, the typical step at 12% of the panel; capped, it stays above a third.
const RATE_TOP_MAX = 2.5;  // x the median (hpu_nb/notebook/memory/summary.py: RATE_TOP_MAX)
function robustTop(sorted) {
  const high = sorted[sorted.length - 1];
  if (sorted.length < 5) return high;
  const q1 = quantile(sorted, 0.25), median = quantile(sorted, 0.5), q3 = quantile(sorted, 0.75);
  return Math.min(high, Math.max(Math.min(q3 + 3 * (q3 - q1), RATE_TOP_MAX * median), 1.2 * median));
}

function smoothed(values) {
  let last = 0, n = 0;
  return values.map((v) => {
    if (!Number.isFinite(v)) return NaN;
    n += 1;
    last = last * SMOOTHING + (1 - SMOOTHING) * v;
    return last / (1 - Math.pow(SMOOTHING, n));
  });
}

function quantile(sorted, q) {
  const pos = (sorted.length - 1) * q;
  const lo = Math.floor(pos), hi = Math.ceil(pos);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

// the same format as hpu_nb's format_bytes (the summary, the messages): one figure reads the same everywhere
function formatBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = Math.abs(n);
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  const sign = n < 0 ? "-" : "";
  return i === 0 ? `${sign}${v.toFixed(0)} B` : `${sign}${v.toFixed(2)} ${units[i]}`;
}

function fmt(v, digits = 3) {
  if (!Number.isFinite(v)) return "—";
  return Math.abs(v) >= 1000 ? v.toFixed(0) : v.toPrecision(digits);
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

function decodePoints(points) {
  if (Array.isArray(points)) return points;
  if (!points) return [];
  const view = points instanceof DataView ? points : new DataView(points.buffer || points);
  const flat = new Float64Array(view.buffer.slice(view.byteOffset, view.byteOffset + view.byteLength));
  const n = FIELDS.length;
  const out = [];
  for (let i = 0; i + n <= flat.length; i += n) out.push(Array.from(flat.subarray(i, i + n)));
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

function node(tag, attrs = {}, parent = null, ns = null) {
  const e = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

function text(parent, attrs, content) {
  const t = node("text", attrs, parent, SVG);
  t.textContent = content;
  return t;
}

function rate(p) {
  return p[F.batches] > 0 && p[F.seconds] > 0 ? p[F.samples] / p[F.seconds] : NaN;
}

function niceBytesStep(span) {
  const raw = span / 4;
  const mag = Math.pow(1024, Math.floor(Math.log(Math.max(raw, 1)) / Math.log(1024)));
  const r = raw / mag;
  const steps = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];
  return (steps.find((s) => r <= s) || 1024) * mag;
}

function pathOf(points, sx, sy, value) {
  let d = "";
  let pen = false;
  for (let i = 0; i < points.length; i += 1) {
    const p = points[i];
    const v = value(p, i);
    if (!Number.isFinite(v)) { pen = false; continue; }
    d += `${pen ? "L" : "M"}${sx(p[F.x]).toFixed(1)},${sy(v).toFixed(1)}`;
    pen = true;
  }
  return d;
}

function drawChart(svg, store, model, scaleMode) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const pts = store.points;
  const oom = model.get("oom") || {};
  const ranks = model.get("ranks") || {};
  svg.setAttribute("data-npoints", String(pts.length));
  svg.setAttribute("data-seq", String(store.seq));
  const H = PANELS.reduce((h, p) => h + p.height, 0) + 26;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const w = W - L - R;
  const layout = {};
  let y = 6;
  for (const panel of PANELS) {
    layout[panel.key] = { top: y + TITLE, h: panel.height - 16 - TITLE };
    y += panel.height;
  }
  if (pts.length === 0) {
    const m = layout.memory;
    node("rect", { x: L, y: m.top, width: w, height: m.h, class: "hpu-tc-plot" }, svg, SVG);
    text(svg, { x: L + w / 2, y: m.top + m.h / 2, "text-anchor": "middle", class: "hpu-tc-empty" },
      "waiting for the first batch…");
    return null;
  }
  const x0 = pts[0][F.x];
  const x1 = Math.max(pts[pts.length - 1][F.x], oom.x || 0, x0 + 1);
  const sx = (x) => L + (w * (x - x0)) / (x1 - x0);
  // shared decorations: panel frames, validation bands, epoch lines
  const bands = [];
  let start = null;
  for (let i = 0; i <= pts.length; i += 1) {
    const isEval = i < pts.length && pts[i][F.stage] !== 0;
    if (isEval && start === null) start = pts[i][F.x];
    if (!isEval && start !== null) { bands.push([start, pts[i - 1][F.x]]); start = null; }
  }
  const epochs = [];
  for (let i = 1; i < pts.length; i += 1) {
    if (pts[i][F.epoch] !== pts[i - 1][F.epoch]) epochs.push([pts[i][F.x], pts[i][F.epoch]]);
  }
  const scales = {};
  for (const panel of PANELS) {
    const { top, h } = layout[panel.key];
    node("rect", { x: L, y: top, width: w, height: h, class: "hpu-tc-plot" }, svg, SVG);
    for (const [a, b] of bands) {
      node("rect", { x: sx(a), y: top, width: Math.max(sx(b) - sx(a), 2), height: h, class: "hpu-tc-eval" }, svg, SVG);
    }
    for (const [ex, epoch] of epochs) {
      node("line", { x1: sx(ex), x2: sx(ex), y1: top, y2: top + h, class: "hpu-tc-epoch" }, svg, SVG);
      if (panel.key === "memory") text(svg, { x: sx(ex) + 3, y: top + h - 4, class: "hpu-tc-epoch-label" }, `epoch ${epoch}`);
    }
    text(svg, { x: L, y: top - 4, class: "hpu-tc-panel-title" }, panel.title);
  }
  // memory
  {
    const { top, h } = layout.memory;
    const limit = pts[pts.length - 1][F.Limit];
    let peak = 0;
    for (const p of pts) peak = Math.max(peak, p[F.MaxInUse], p[F.InUse]);
    for (const row of ranks.max_in_use || []) for (const v of row) peak = Math.max(peak, v);
    if (oom.in_use !== undefined) peak = Math.max(peak, oom.in_use + (oom.requested || 0));
    const planned = model.get("planned") || {};
    if (planned.peak !== undefined) peak = Math.max(peak, planned.peak);
    const showLimit = scaleMode === "limit" || (scaleMode === "auto" && (oom.x !== undefined || peak >= 0.05 * limit));
    const ymax = Math.max(showLimit ? Math.max(limit, peak) : peak, 1) * 1.1;
    const sy = (v) => top + h * (1 - v / ymax);
    scales.memory = sy;
    const step = niceBytesStep(ymax);
    for (let v = 0; v <= ymax; v += step) {
      node("line", { x1: L, x2: L + w, y1: sy(v), y2: sy(v), class: "hpu-tc-grid" }, svg, SVG);
      text(svg, { x: L - 6, y: sy(v) + 4, "text-anchor": "end", class: "hpu-tc-tick" }, formatBytes(v));
    }
    const rx = ranks.x || [];
    const inUse = ranks.in_use || [];
    const rankLine = (r) => {
      const d = rx.map((x, i) => `${i ? "L" : "M"}${sx(x).toFixed(1)},${sy(inUse[i][r]).toFixed(1)}`).join("");
      const style = rankStyle(r);
      node("path", { d, class: "hpu-tc-rank", stroke: style.colour, "stroke-width": style.width,
        "stroke-opacity": style.opacity, "stroke-dasharray": style.dash || "none", "data-series": `rank${r}` },
      svg, SVG);
    };
    const nRanks = rankCount(ranks);
    // rank 0's InUse / MaxInUse are the sampled lines (every batch); the other ranks' InUse come from the gathers:
    // one line, and one legend entry, per rank and series
    const series = showLimit ? ["Limit", "MaxInUse", "InUse"] : ["MaxInUse", "InUse"];
    for (const name of series) {
      node("path", { d: pathOf(pts, sx, sy, (p) => p[F[name]]), class: `hpu-tc-line hpu-tc-${name}`,
        stroke: COLORS[name], "data-series": name }, svg, SVG);
    }
    for (let r = 1; r < nRanks; r += 1) rankLine(r);  // over them
    if (planned.peak !== undefined) {  // the plan's predicted peak: a reference beside the measured MaxInUse
      node("line", { x1: L, x2: L + w, y1: sy(planned.peak), y2: sy(planned.peak), class: "hpu-tc-planned",
        stroke: COLORS.planned, "stroke-dasharray": "8,4", "data-series": "planned" }, svg, SVG);
      text(svg, { x: L + 4, y: sy(planned.peak) - 4, fill: COLORS.planned, class: "hpu-tc-tick" },
        `planned peak ${formatBytes(planned.peak)} (estimate)`);
    }
    if (!showLimit) {
      text(svg, { x: L + w, y: top - 4, "text-anchor": "end", class: "hpu-tc-offscale" },
        `Limit ${formatBytes(limit)} off scale (peak ${(100 * peak / limit).toFixed(2)}% of it)`);
    }
    if (oom.x !== undefined) {
      const x = sx(oom.x);
      node("line", { x1: x, x2: x, y1: sy(oom.in_use), y2: Math.max(sy(oom.in_use + (oom.requested || 0)), top),
        class: "hpu-tc-oom-bar" }, svg, SVG);
      const over = oom.in_use + (oom.requested || 0) - oom.limit;
      text(svg, { x: x - 6, y: top + 26, "text-anchor": "end", class: "hpu-tc-oom" }, oom.requested
        ? `OOM: ${formatBytes(oom.in_use)} in use + ${formatBytes(oom.requested)} asked, ${formatBytes(Math.max(over, 0))} over`
        : "OOM: Limit hit");
    }
  }
  // loss and throughput
  for (const [key, value, colour, label] of [["loss", (p) => p[F.loss], COLORS.loss, (v) => fmt(v)],
    ["rate", rate, COLORS.rate, (v) => fmt(v)]]) {
    const { top, h } = layout[key];
    const values = pts.map(value).filter(Number.isFinite);
    if (!values.length) {
      text(svg, { x: L + w / 2, y: top + h / 2 + 4, "text-anchor": "middle", class: "hpu-tc-empty" },
        key === "loss" ? "no loss yet (training_step returns it)" : "no timed training batch yet");
      continue;
    }
    const sorted = [...values].sort((a, b) => a - b);
    const low = sorted[0], high = sorted[sorted.length - 1];
    // the rate's axis ignores spikes (robustTop): they are marked, not scaled to
    const top95 = key === "rate" ? robustTop(sorted) : high;
    const pad = (top95 - low) * 0.1 || Math.abs(top95) * 0.1 || 1;
    // the rate's axis starts at 0: a step at half the speed reads as half the height (a flat run stays mid-panel)
    const lo = key === "rate" ? 0 : low - pad;
    const hi = top95 + pad;
    const sy = (v) => top + h * (1 - (Math.min(v, hi) - lo) / (hi - lo));
    scales[key] = sy;
    const ticks = key === "rate" ? [0, quantile(sorted, 0.5), top95] : [low, high];
    for (const v of ticks) {  // the data's own minimum and maximum (the rate: 0, its median and its axis top)
      node("line", { x1: L, x2: L + w, y1: sy(v), y2: sy(v), class: "hpu-tc-grid" }, svg, SVG);
      text(svg, { x: L - 6, y: sy(v) + 4, "text-anchor": "end", class: "hpu-tc-tick" }, label(v));
    }
    const raw = pts.map(value);
    const dots = node("g", { class: "hpu-tc-raw", fill: colour, "data-series": `${key}-raw` }, svg, SVG);
    let spikes = 0;
    raw.forEach((v, i) => {
      if (!Number.isFinite(v)) return;
      const cx = sx(pts[i][F.x]).toFixed(1);
      if (v > hi) {  // off scale: a mark at the top edge
        spikes += 1;
        node("path", { d: `M${cx},${top + 1}l-3.5,6h7z`, class: "hpu-tc-spike", fill: colour }, dots, SVG);
      } else {
        node("circle", { cx, cy: sy(v).toFixed(1), r: 1.6 }, dots, SVG);
      }
    });
    const smooth = smoothed(raw);
    node("path", { d: pathOf(pts, sx, sy, (p, i) => smooth[i]), class: "hpu-tc-line", stroke: colour,
      "data-series": key }, svg, SVG);
    svg.setAttribute(`data-${key}-top`, String(hi));
    svg.setAttribute(`data-${key}-offscale`, String(spikes));
    if (spikes) {
      text(svg, { x: L + w, y: top - 4, "text-anchor": "end", class: "hpu-tc-offscale" },
        `▲ ${spikes} step${spikes === 1 ? "" : "s"} off scale (fastest ${label(high)})`);
    }
  }
  text(svg, { x: L, y: H - 6, class: "hpu-tc-tick" }, `batch ${x0}`);
  text(svg, { x: L + w, y: H - 6, "text-anchor": "end", class: "hpu-tc-tick" }, `${x1}`);
  return { sx, x0, x1, w, H, layout, scales };
}

function drawCounters(table, model) {
  const current = model.get("current") || {};
  const oom = model.get("oom") || {};
  while (table.firstChild) table.removeChild(table.firstChild);
  const bytesKeys = new Set(["Limit", "InUse", "MaxInUse", "MaxAllocSize"]);
  const rows = Object.entries(current).filter(([k]) => !(oom.x !== undefined && k === "InUse"));
  if (oom.x !== undefined) {
    // one source for the chart, the message and this table: the figures of the error itself
    rows.unshift(["InUse at OOM", oom.in_use], ["asked at OOM", oom.requested || 0]);
    rows.unshift(["Limit", oom.limit]);
  }
  const seen = new Set();
  for (const [k, v] of rows) {
    if (seen.has(k)) continue;
    seen.add(k);
    const tr = node("tr", {}, table);
    const th = node("td", { class: "hpu-tc-key" }, tr);
    const colour = COLORS[k] || (k === "InUse at OOM" ? COLORS.InUse : null);
    if (colour) node("span", { class: "hpu-tc-swatch", style: `background:${colour}` }, th);
    th.appendChild(document.createTextNode(k));
    const td = node("td", { class: "hpu-tc-val", "data-key": k }, tr);
    td.textContent = bytesKeys.has(k) || k.endsWith("at OOM") ? formatBytes(v) : String(v);
  }
  const planned = model.get("planned") || {};
  if (planned.peak !== undefined) {
    for (const [k, v, cls] of [["planned peak (estimate)", formatBytes(planned.peak), "hpu-tc-planned-row"],
      [planned.mfu_label, planned.mfu === null || planned.mfu === undefined ? "after the first timed step"
        : `${(100 * planned.mfu).toPrecision(3)}%`, "hpu-tc-mfu"]]) {
      const tr = node("tr", { class: cls, title: planned.label }, table);
      node("td", { class: "hpu-tc-key" }, tr).textContent = k;
      node("td", { class: "hpu-tc-val" }, tr).textContent = v;
    }
  }
  if (current.Limit !== undefined && current.MaxInUse !== undefined) {
    const tr = node("tr", { class: "hpu-tc-headroom" }, table);
    node("td", { class: "hpu-tc-key" }, tr).textContent = "headroom";
    node("td", { class: "hpu-tc-val" }, tr).textContent =
      oom.x !== undefined ? "none (OOM)" : formatBytes(current.Limit - current.MaxInUse);
  }
}

// One entry per line drawn, one per rank and series: on several cards InUse / MaxInUse are rank 0's (sampled every
// batch) and every other rank has its InUse entry (gathered).
function drawLegend(legend, ranks, planned) {
  while (legend.firstChild) legend.removeChild(legend.firstChild);
  const nRanks = rankCount(ranks);
  const rank0 = nRanks ? "rank 0 " : "";
  const item = (name, series) => node("span", { class: "hpu-tc-legend-item", "data-series": series }, legend);
  for (const [name, series, colour, cls] of [[`${rank0}InUse`, "InUse", COLORS.InUse, ""],
    [`${rank0}MaxInUse`, "MaxInUse", COLORS.MaxInUse, ""], ["Limit", "Limit", COLORS.Limit, " dashed"]]) {
    const entry = item(name, series);
    node("span", { class: `hpu-tc-swatch${cls}`, style: `background:${colour}` }, entry);
    entry.appendChild(document.createTextNode(name));
  }
  if (planned.peak !== undefined) {
    const entry = item("planned peak (estimate)", "planned");
    entry.setAttribute("title", planned.label);
    node("span", { class: "hpu-tc-swatch dashed", style: `background:${COLORS.planned}` }, entry);
    entry.appendChild(document.createTextNode("planned peak (estimate)"));
  }
  for (let r = 1; r < nRanks; r += 1) {
    const style = rankStyle(r);
    const entry = item(`rank ${r} InUse`, `rank${r}`);
    entry.setAttribute("title", `rank ${r}'s InUse, gathered every log_every_n_steps training steps`);
    const swatch = node("svg", { width: 20, height: 8, class: "hpu-tc-rank-swatch" }, entry, SVG);
    node("line", { x1: 0, y1: 4, x2: 20, y2: 4, stroke: style.colour, "stroke-width": style.width,
      "stroke-opacity": style.opacity, "stroke-dasharray": style.dash || "none" }, swatch, SVG);
    entry.appendChild(document.createTextNode(`rank ${r} InUse`));
  }
  for (const [name, series, colour, cls] of [["training loss", "loss", COLORS.loss, ""],
    ["samples/s per step", "rate", COLORS.rate, ""], ["epoch boundary", "epoch", "#999", " dotted"],
    ["validation", "validation", "#9467bd", " band"]]) {
    const entry = item(name, series);
    node("span", { class: `hpu-tc-swatch${cls}`, style: `background:${colour}` }, entry);
    entry.appendChild(document.createTextNode(name));
  }
}

function nearest(points, x) {
  let lo = 0, hi = points.length - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (points[mid][F.x] < x) lo = mid + 1; else hi = mid;
  }
  if (lo > 0 && Math.abs(points[lo - 1][F.x] - x) < Math.abs(points[lo][F.x] - x)) lo -= 1;
  return lo;
}

function hoverText(p, stages, emulated, ranks) {
  const nRanks = rankCount(ranks);
  const lines = [`batch ${p[F.x]} · epoch ${p[F.epoch]} · ${stages[p[F.stage]] || "?"}`,
    `InUse ${formatBytes(p[F.InUse])} · MaxInUse ${formatBytes(p[F.MaxInUse])} · Limit ${formatBytes(p[F.Limit])}` +
    (nRanks ? " (rank 0)" : "")];
  if (nRanks) {  // the gathered ranks at the nearest gathered batch
    let i = 0;
    for (let j = 1; j < ranks.x.length; j += 1) {
      if (Math.abs(ranks.x[j] - p[F.x]) < Math.abs(ranks.x[i] - p[F.x])) i = j;
    }
    const each = ranks.in_use[i].map((v, r) => `rank ${r} ${formatBytes(v)}`).join(" · ");
    lines.push(`InUse at batch ${ranks.x[i]}: ${each}`);
  }
  if (Number.isFinite(p[F.loss])) lines.push(`loss ${fmt(p[F.loss], 4)}`);
  if (p[F.batches] > 0 && p[F.seconds] > 0) {
    lines.push(`step time ${(1000 * p[F.seconds] / p[F.batches]).toFixed(1)} ms · ` +
      `${fmt(p[F.batches] / p[F.seconds])} steps/s · ${fmt(rate(p))} samples/s` +
      (p[F.batches] > 1 ? ` (mean of ${p[F.batches]} batches)` : ""));
  }
  if (emulated) lines.push("emulated Gaudi: CPU time, host memory");
  return lines.join("\n");
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
  let geometry = null;
  root.classList.add("hpu-tc");
  const head = node("div", { class: "hpu-tc-head" }, root);
  const title = node("span", { class: "hpu-tc-title" }, head);
  const badge = node("span", { class: "hpu-tc-badge" }, head);
  const status = node("span", { class: "hpu-tc-status" }, head);
  const scaleBtn = node("button", { class: "hpu-tc-scale", title: "memory axis: fit the data, or always show the Limit" },
    head);
  const body = node("div", { class: "hpu-tc-body" }, root);
  const holder = node("div", { class: "hpu-tc-holder" }, body);
  const svg = node("svg", { class: "hpu-tc-chart", role: "img" }, holder, SVG);
  const tip = node("div", { class: "hpu-tc-tip" }, holder);
  const side = node("div", { class: "hpu-tc-side" }, body);
  const table = node("table", { class: "hpu-tc-counters" }, side);
  const legend = node("div", { class: "hpu-tc-legend" }, root);
  const note = node("div", { class: "hpu-tc-summary" }, root);

  let frame = null;
  const redraw = () => {
    if (frame !== null) return;
    frame = requestAnimationFrame(() => {
      frame = null;
      try {
        const emulated = model.get("is_emulated");
        title.textContent = `Training on ${model.get("device_label")}`;
        badge.textContent = emulated ? "emulated" : "Gaudi";
        badge.className = `hpu-tc-badge ${emulated ? "emulated" : "real"}`;
        const st = model.get("status");
        const stage = model.get("stage");
        status.textContent = `${stage ? stage + ": " : ""}${st === "stopped" ? "stopped by you" : st}`;
        status.className = `hpu-tc-status hpu-tc-status-${st}`;
        scaleBtn.textContent = scaleMode === "auto" ? "memory axis: auto" : "memory axis: Limit";
        geometry = drawChart(svg, store, model, scaleMode);
        drawCounters(table, model);
        drawLegend(legend, model.get("ranks"), model.get("planned") || {});
        const oom = model.get("oom") || {};
        note.textContent = oom.message ? `Out of memory: ${oom.message}` : model.get("summary");
        note.classList.toggle("hpu-tc-summary-oom", Boolean(oom.message));
        root.setAttribute("data-status", st);
      } catch (err) {
        note.textContent = `chart error: ${err}`;
      }
    });
  };
  const hover = (ev) => {
    const pts = store.points;
    if (!geometry || !pts.length) { tip.style.display = "none"; return; }
    const box = svg.getBoundingClientRect();
    const scale = box.width / W;
    const x = (ev.clientX - box.left) / scale;
    if (x < L || x > W - R) { tip.style.display = "none"; return; }
    const xv = geometry.x0 + ((x - L) / geometry.w) * (geometry.x1 - geometry.x0);
    const p = pts[nearest(pts, xv)];
    let cursor = svg.querySelector(".hpu-tc-cursor");
    if (!cursor) cursor = node("line", { class: "hpu-tc-cursor" }, svg, SVG);
    const cx = geometry.sx(p[F.x]);
    cursor.setAttribute("x1", cx); cursor.setAttribute("x2", cx);
    cursor.setAttribute("y1", 6); cursor.setAttribute("y2", geometry.H - 20);
    tip.textContent = hoverText(p, model.get("stages") || [], model.get("is_emulated"), model.get("ranks"));
    tip.style.display = "block";
    const hb = holder.getBoundingClientRect();
    let left = ev.clientX - hb.left + 14;
    if (left + tip.offsetWidth > hb.width) left = Math.max(0, ev.clientX - hb.left - tip.offsetWidth - 14);
    tip.style.left = `${left}px`;
    tip.style.top = `${Math.max(0, ev.clientY - hb.top - 10)}px`;
    root.setAttribute("data-hover-batch", String(p[F.x]));
  };
  const leave = () => {
    tip.style.display = "none";
    const cursor = svg.querySelector(".hpu-tc-cursor");
    if (cursor) cursor.remove();
  };
  svg.addEventListener("mousemove", hover);
  svg.addEventListener("mouseleave", leave);
  scaleBtn.addEventListener("click", () => {
    scaleMode = scaleMode === "auto" ? "limit" : "auto";
    redraw();
  });
  store.listeners.add(redraw);
  const traits = "change:current change:status change:stage change:oom change:summary change:device_label change:ranks change:planned";
  model.on(traits, redraw);
  redraw();
  return () => {
    store.listeners.delete(redraw);
    model.off(traits, redraw);
    svg.removeEventListener("mousemove", hover);
    svg.removeEventListener("mouseleave", leave);
    if (frame !== null) cancelAnimationFrame(frame);
  };
}

export default { initialize, render };
