// hpu_nb trace viewer: draws what Python sends for the current view (see hpu_nb/traces/lod.py).
// Every name from the trace goes into the page through textContent or canvas fillText, never as markup.

const LABEL_MIN = 120;
const LABEL_MAX = 320;
const ROW_H = 16;
const AXIS_H = 20;
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#e15759", "#bab0ac"];
const MIN_WINDOW_NS = 1000;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function colour(name) {
  let h = 2166136261;
  for (let i = 0; i < name.length; i++) {
    h ^= name.charCodeAt(i);
    h = Math.imul(h, 16777619);
  }
  return PALETTE[(h >>> 0) % PALETTE.length];
}

function fmtNs(ns) {
  const a = Math.abs(ns);
  if (a >= 1e9) return (ns / 1e9).toPrecision(3) + " s";
  if (a >= 1e6) return (ns / 1e6).toPrecision(3) + " ms";
  if (a >= 1e3) return (ns / 1e3).toPrecision(3) + " us";
  return Math.round(ns) + " ns";
}

// The time axis: every tick in the one unit its span reads best in ("0 ms", "2.5 ms", ... not "0 ns" then "ms")
function axisUnit(span) {
  if (span >= 1e9) return [1e9, "s"];
  if (span >= 1e6) return [1e6, "ms"];
  if (span >= 1e3) return [1e3, "us"];
  return [1, "ns"];
}

function fmtAxis(ns, span) {
  const [div, unit] = axisUnit(span);
  const step = span / 4 / div;  // the ticks' spacing, in the unit: as many decimals as it needs
  const digits = step >= 10 ? 0 : step >= 1 ? 1 : step >= 0.1 ? 2 : 3;
  return `${(ns / div).toFixed(digits)} ${unit}`;
}

// An op's name cut in the middle, not at its end: Lightning's "[pl][profile][Strategy]SingleHPUStrategy.training_step"
// and "...validation_step" differ only at the end, so a cut end made their rows look the same.
function middleCut(name, max = 38) {
  if (name.length <= max) return name;
  const head = Math.ceil((max - 1) * 0.4);
  return `${name.slice(0, head)}…${name.slice(name.length - (max - 1 - head))}`;
}

function unpack(model) {
  const meta = model.get("payload_meta") || {};
  const n = meta.n || 0;
  const dv = model.get("payload");
  let bytes = new Uint8Array(0);
  if (dv && dv.byteLength !== undefined) {
    const buf = dv.buffer ? dv.buffer : dv;
    bytes = new Uint8Array(buf, dv.byteOffset || 0, dv.byteLength).slice(); // copy: aligned for typed arrays
  }
  if (bytes.byteLength < n * 23) return { n: 0, meta };
  const b = bytes.buffer;
  return {
    n,
    meta,
    x0: new Float32Array(b, 0, n),
    x1: new Float32Array(b, 4 * n, n),
    dur: new Float32Array(b, 8 * n, n), // the whole span's ns: x0..x1 is only the part in view
    name: new Int32Array(b, 12 * n, n),
    ref: new Int32Array(b, 16 * n, n),
    row: new Uint16Array(b, 20 * n, n),
    flags: new Uint8Array(b, 22 * n, n),
  };
}

function render({ model, el: root }) {
  root.classList.add("hpu-trace");
  const head = el("div", "hpu-trace-head");
  const title = el("b", "hpu-trace-title");
  const note = el("span", "hpu-trace-note");
  head.append(title, note);

  const bar = el("div", "hpu-trace-bar");
  const stepSel = el("select", "hpu-trace-steps");
  const search = el("input", "hpu-trace-search");
  search.type = "search";
  search.placeholder = "search op name";
  const reset = el("button", "hpu-trace-reset", "Zoom out");
  const status = el("span", "hpu-trace-status");
  bar.append(stepSel, search, reset, status);

  const body = el("div", "hpu-trace-body");
  const scroller = el("div", "hpu-trace-scroll");
  const canvas = el("canvas", "hpu-trace-canvas");
  const tip = el("div", "hpu-trace-tip"); // in the root, not the scroller: never clipped by the scroll box
  scroller.append(canvas);
  const side = el("div", "hpu-trace-side");
  const matches = el("div", "hpu-trace-matches");
  const table = el("table", "hpu-trace-ops");
  side.append(matches, table);
  body.append(scroller, side);

  const details = el("div", "hpu-trace-details");
  const error = el("div", "hpu-trace-error");
  root.append(head, bar, body, details, error, tip);

  let LABEL_W = LABEL_MIN;
  function measureLabels() {
    // the label column is as wide as the longest track label (within bounds); longer ones get a tooltip
    const ctx = canvas.getContext("2d");
    ctx.font = "10px sans-serif";
    let widest = 0;
    for (const r of model.get("rows") || []) widest = Math.max(widest, ctx.measureText(r.label).width);
    LABEL_W = Math.round(Math.min(LABEL_MAX, Math.max(LABEL_MIN, widest + 12)));
    root.setAttribute("data-label-w", String(LABEL_W));
  }
  measureLabels();

  let data = unpack(model);
  let view = (model.get("view") || [0, model.get("duration")]).slice();
  let sendTimer = null;
  let selected = -1;

  function plotWidth() {
    return Math.max(100, (scroller.clientWidth || 900) - LABEL_W - 4);
  }

  function sendView() {
    clearTimeout(sendTimer);
    sendTimer = setTimeout(() => {
      model.set("view", [view[0], view[1]]);
      model.set("width", Math.round(plotWidth()));
      model.save_changes();
    }, 80);
  }

  function hideTip() {
    tip.style.display = "none";
  }

  // the step picker shows a step only while the view is that step's window; any other view is "all steps"
  let stepView = null;
  function syncStepPicker() {
    const same = stepView && Math.abs(stepView[0] - view[0]) < 1 && Math.abs(stepView[1] - view[1]) < 1;
    if (!same) {
      stepView = null;
      stepSel.value = "-1";
    }
    root.setAttribute("data-step", stepSel.value);
  }

  function setView(t0, t1) {
    const dur = model.get("duration");
    let w = Math.max(MIN_WINDOW_NS, Math.min(t1 - t0, dur));
    t0 = Math.max(0, Math.min(t0, dur - w));
    view = [t0, t0 + w];
    hideTip();
    syncStepPicker();
    draw();
    sendView();
  }

  // item x (pixels of the payload's window) -> pixels of the local view (instant feedback while Python answers)
  function toX(px, meta, w) {
    const t = meta.t0 + (px * (meta.t1 - meta.t0)) / meta.width;
    return LABEL_W + ((t - view[0]) / (view[1] - view[0])) * w;
  }

  function draw() {
    const rows = model.get("rows") || [];
    const w = plotWidth();
    const cssW = LABEL_W + w;
    const cssH = AXIS_H + rows.length * ROW_H + 4;
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(cssW * dpr);
    canvas.height = Math.round(cssH * dpr);
    canvas.style.width = cssW + "px";
    canvas.style.height = cssH + "px";
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, cssW, cssH);
    ctx.font = "10px sans-serif";
    ctx.textBaseline = "middle";
    // track bands and labels
    let lastTrack = -1;
    let band = 0;
    rows.forEach((r, i) => {
      if (r.track !== lastTrack) {
        band++;
        lastTrack = r.track;
        ctx.fillStyle = "#333";
        ctx.save();
        ctx.beginPath();
        ctx.rect(0, AXIS_H + i * ROW_H, LABEL_W - 4, ROW_H);
        ctx.clip();
        ctx.fillText(r.label, 2, AXIS_H + i * ROW_H + ROW_H / 2);
        ctx.restore();
      }
      ctx.fillStyle = band % 2 ? "rgba(0,0,0,0.03)" : "rgba(0,0,0,0.07)";
      ctx.fillRect(LABEL_W, AXIS_H + i * ROW_H, w, ROW_H);
    });
    // axis
    ctx.fillStyle = "#555";
    for (let k = 0; k <= 4; k++) {
      const x = LABEL_W + (w * k) / 4;
      ctx.textAlign = k === 0 ? "left" : k === 4 ? "right" : "center";
      ctx.fillText(fmtAxis(view[0] + ((view[1] - view[0]) * k) / 4, view[1] - view[0]), x, AXIS_H / 2);
    }
    ctx.textAlign = "left";
    // items
    const d = data;
    const names = (d.meta && d.meta.names) || {};
    for (let i = 0; i < d.n; i++) {
      let xa = toX(d.x0[i], d.meta, w);
      let xb = toX(d.x1[i], d.meta, w);
      if (xb < LABEL_W || xa > LABEL_W + w) continue;
      xa = Math.max(xa, LABEL_W);
      xb = Math.min(xb, LABEL_W + w);
      const y = AXIS_H + d.row[i] * ROW_H + 1;
      const merged = d.flags[i] & 1;
      const nm = d.name[i] >= 0 ? names[d.name[i]] || "" : "";
      ctx.globalAlpha = merged ? 0.55 : 1;
      ctx.fillStyle = nm ? colour(nm) : "#999";
      ctx.fillRect(xa, y, Math.max(xb - xa, 0.7), ROW_H - 2);
      ctx.globalAlpha = 1;
      if (d.flags[i] & 2) {
        ctx.strokeStyle = "#d00";
        ctx.lineWidth = 1.5;
        ctx.strokeRect(xa, y, Math.max(xb - xa, 1), ROW_H - 2);
      }
      if (!merged && d.ref[i] === selected) {
        ctx.strokeStyle = "#000";
        ctx.lineWidth = 2;
        ctx.strokeRect(xa, y, Math.max(xb - xa, 1), ROW_H - 2);
      }
      if (!merged && xb - xa > 30 && nm) {
        ctx.save();
        ctx.beginPath();
        ctx.rect(xa + 1, y, xb - xa - 2, ROW_H - 2);
        ctx.clip();
        ctx.fillStyle = "#fff";
        ctx.fillText(nm, xa + 2, y + (ROW_H - 2) / 2);
        ctx.restore();
      }
    }
    const m = d.meta || {};
    status.textContent =
      `${(m.spans_in_view || 0).toLocaleString()} spans in view, ${(m.n || 0).toLocaleString()} drawn ` +
      `(${(m.merged || 0).toLocaleString()} merged blocks), ${((m.bytes || 0) / 1024).toFixed(1)} KiB sent`;
  }

  function hit(ev) {
    const r = canvas.getBoundingClientRect();
    const x = ev.clientX - r.left;
    const y = ev.clientY - r.top;
    const row = Math.floor((y - AXIS_H) / ROW_H);
    const w = plotWidth();
    const d = data;
    let best = -1;
    for (let i = 0; i < d.n; i++) {
      if (d.row[i] !== row) continue;
      const xa = toX(d.x0[i], d.meta, w);
      const xb = Math.max(toX(d.x1[i], d.meta, w), xa + 1);
      if (x >= xa - 1 && x <= xb + 1) best = i;
    }
    return { i: best, x, y, w };
  }

  function timeAt(x, w) {
    return view[0] + ((x - LABEL_W) / w) * (view[1] - view[0]);
  }

  canvas.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const r = canvas.getBoundingClientRect();
    const w = plotWidth();
    const x = Math.max(LABEL_W, ev.clientX - r.left);
    const t = timeAt(x, w);
    const f = Math.exp(ev.deltaY * 0.002);
    setView(t - (t - view[0]) * f, t + (view[1] - t) * f);
  }, { passive: false });

  let drag = null;
  canvas.addEventListener("mousedown", (ev) => {
    drag = { x: ev.clientX, v: view.slice(), moved: false };
  });
  function onMove(ev) {
    if (drag) {
      const dx = ev.clientX - drag.x;
      if (Math.abs(dx) > 3) drag.moved = true;
      if (drag.moved) {
        const dt = (-dx / plotWidth()) * (drag.v[1] - drag.v[0]);
        setView(drag.v[0] + dt, drag.v[1] + dt);
      }
      return;
    }
    if (ev.target !== canvas) return hideTip();
    const h = hit(ev);
    let text = null;
    if (h.x < LABEL_W) {
      const rows = model.get("rows") || [];
      const r = rows[Math.floor((h.y - AXIS_H) / ROW_H)];
      if (r) text = `${r.label} (depth ${r.depth}, ${r.kind})`;
    } else if (h.i >= 0) {
      const d = data;
      const names = d.meta.names || {};
      const nm = d.name[h.i] >= 0 ? names[d.name[h.i]] || "" : "";
      const visible = ((d.x1[h.i] - d.x0[h.i]) * (d.meta.t1 - d.meta.t0)) / d.meta.width;
      const whole = d.dur[h.i];
      const part = whole > visible * 1.001 + 1 ? ` (${fmtNs(visible)} of it in view)` : "";
      text = d.flags[h.i] & 1 ? `${d.ref[h.i]} spans merged (longest: ${nm}, ${fmtNs(whole)}); click to zoom in`
        : `${nm}: ${fmtNs(whole)}${part}; click for details`;
    }
    if (text === null) return hideTip();
    tip.textContent = text;
    tip.style.display = "block";
    // placed in the widget's own box, flipped to the left near the right edge
    const rootBox = root.getBoundingClientRect();
    const tipW = tip.offsetWidth;
    let left = ev.clientX - rootBox.left + 12;
    if (left + tipW > rootBox.width) left = Math.max(0, ev.clientX - rootBox.left - tipW - 12);
    tip.style.left = left + "px";
    tip.style.top = (ev.clientY - rootBox.top + 14) + "px";
  }
  function onUp(ev) {
    if (!drag) return;
    const wasDrag = drag.moved;
    drag = null;
    if (wasDrag) return;
    const h = hit(ev);
    if (h.i < 0) return;
    const d = data;
    if (d.flags[h.i] & 1) {
      // a merged block: zoom into it
      const t0 = d.meta.t0 + (d.x0[h.i] * (d.meta.t1 - d.meta.t0)) / d.meta.width;
      const t1 = d.meta.t0 + (d.x1[h.i] * (d.meta.t1 - d.meta.t0)) / d.meta.width;
      const pad = Math.max(t1 - t0, MIN_WINDOW_NS) * 2;
      setView(t0 - pad, t1 + pad);
    } else {
      selected = d.ref[h.i];
      model.set("selected", selected);
      model.save_changes();
      draw();
    }
  }
  window.addEventListener("mousemove", onMove);
  window.addEventListener("mouseup", onUp);
  canvas.addEventListener("mouseleave", hideTip);
  scroller.addEventListener("scroll", hideTip);

  reset.addEventListener("click", () => setView(0, model.get("duration")));

  function fillSteps() {
    stepSel.replaceChildren();
    const all = el("option", "", "all steps");
    all.value = "-1";
    stepSel.append(all);
    (model.get("steps") || []).forEach((s, i) => {
      const o = el("option", "", `step #${s[0]} (${fmtNs(s[2] - s[1])})`);
      o.value = String(i);
      stepSel.append(o);
    });
  }
  stepSel.addEventListener("change", () => {
    const k = Number(stepSel.value);
    const steps = model.get("steps") || [];
    if (k < 0 || !steps[k]) return setView(0, model.get("duration"));
    const [, a, b] = steps[k];
    const pad = (b - a) * 0.02;
    const dur = model.get("duration");
    const w = Math.max(MIN_WINDOW_NS, Math.min(b - a + 2 * pad, dur));
    const t0 = Math.max(0, Math.min(a - pad, dur - w));
    stepView = [t0, t0 + w];
    setView(stepView[0], stepView[1]);
  });

  let searchTimer = null;
  search.addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => {
      model.set("query", search.value);
      model.save_changes();
    }, 250);
  });

  function useQuery(name) {
    search.value = name;
    model.set("query", name);
    model.save_changes();
  }

  function fillOps() {
    table.replaceChildren();
    const hr = el("tr");
    ["op (in view)", "calls", "total", "self"].forEach((h) => hr.append(el("th", "", h)));
    table.append(hr);
    (model.get("ops") || []).forEach(([name, calls, total, self]) => {
      const tr = el("tr");
      tr.title = "search for this op";
      const cell = el("td", "hpu-trace-name", middleCut(name));
      cell.title = name; // the whole (server-bounded) name when the column cuts it
      tr.append(cell, el("td", "", String(calls)), el("td", "", fmtNs(total)), el("td", "", fmtNs(self)));
      tr.addEventListener("click", () => useQuery(name));
      table.append(tr);
    });
  }

  function fillMatches() {
    matches.replaceChildren();
    const list = model.get("matches") || [];
    if (!model.get("query")) return;
    matches.append(el("div", "hpu-trace-mhead", list.length ? `${list.length} matching ops` : "no matching op"));
    list.forEach(([name, calls, total]) => {
      const row = el("div", "hpu-trace-match", `${name}: ${calls} calls, ${fmtNs(total)}`);
      row.addEventListener("click", () => useQuery(name));
      matches.append(row);
    });
  }

  function fillDetails() {
    const d = model.get("details") || {};
    details.replaceChildren();
    if (!d.rows) {
      details.append(el("div", "hpu-trace-hint", "click a span for its details"));
      return;
    }
    const t = el("table", "hpu-trace-detail-table");
    for (const [label, value] of d.rows) {
      const tr = el("tr");
      tr.append(el("th", "", label), el("td", "", value));
      t.append(tr);
    }
    details.append(t);
  }

  function fillHead() {
    title.textContent = model.get("title");
    note.textContent = model.get("note") || "";
    note.style.display = model.get("note") ? "inline-block" : "none";
    error.textContent = model.get("error") || "";
  }

  model.on("change:payload_meta", () => {
    data = unpack(model);
    draw();
  });
  model.on("change:payload", () => {
    data = unpack(model);
    draw();
  });
  model.on("change:ops", fillOps);
  model.on("change:matches", fillMatches);
  model.on("change:details", fillDetails);
  model.on("change:error", fillHead);
  model.on("change:steps", fillSteps);
  model.on("change:rows", () => {
    measureLabels();
    draw();
  });
  model.on("change:payload_meta", hideTip);

  fillHead();
  fillSteps();
  fillOps();
  fillMatches();
  fillDetails();
  draw();
  // tell Python our real width once we are laid out
  requestAnimationFrame(() => {
    draw();
    sendView();
  });
  let lastWidth = 0;
  const ro = typeof ResizeObserver !== "undefined" ? new ResizeObserver(() => {
    const w = Math.round(plotWidth());
    if (w === lastWidth) return;
    lastWidth = w;
    draw();
    sendView();
  }) : null;
  if (ro) ro.observe(scroller);
  return () => {
    if (ro) ro.disconnect();
    window.removeEventListener("mousemove", onMove);
    window.removeEventListener("mouseup", onUp);
    clearTimeout(sendTimer);
    clearTimeout(searchTimer);
  };
}

export default { render };
