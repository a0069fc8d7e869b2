// Builds DOM nodes. Text is only ever set with textContent: API data never becomes HTML.

/** h("div", {class: "x", onclick: fn}, child, "text", [more]) */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else if (name === "class") {
      el.className = value;
    } else if (name === "dataset") {
      Object.assign(el.dataset, value);
    } else if (name === "href") {
      el.setAttribute("href", safeHref(value));
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Only in-page links (#/…) and same-origin paths: never javascript: or data: URLs. */
function safeHref(value) {
  const v = String(value);
  return v.startsWith("#/") || v.startsWith("/") ? v : "#/";
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function replace(el, ...children) {
  clear(el);
  append(el, children);
  return el;
}

/** A JSON value shown as pretty text in a <pre>. */
export function json(value) {
  return h("pre", { class: "json" }, value === undefined ? "—" : JSON.stringify(value, null, 2));
}

export function badge(status) {
  return h("span", { class: `badge s-${String(status).replace(/[^a-z_]/g, "")}` }, status);
}

export function time(text) {
  if (!text) return h("span", { class: "muted" }, "—");
  const d = new Date(text);
  return h("time", { datetime: text, title: text }, isNaN(d) ? text : d.toLocaleString());
}

export function ago(text) {
  if (!text) return "—";
  const s = Math.round((Date.now() - new Date(text).getTime()) / 1000);
  if (!isFinite(s)) return text;
  if (s < 60) return `${Math.max(s, 0)}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
}

/** A gauge: label, "used / limit" and a bar; `value` null shows "not configured". With
 * `reserve`, the value is what is left (a token bucket): low is the warning sign. `format`
 * writes both numbers (dollars for spend). */
export function gauge(label, value, limit, note, reserve = false, format = fmt) {
  const configured = value !== null && value !== undefined;
  const ratio = configured && limit > 0 ? Math.min(value / limit, 1) : 0;
  const fill = h("span", { class: "fill" });
  fill.style.width = `${(ratio * 100).toFixed(1)}%`;
  const pressure = reserve ? 1 - ratio : ratio;
  const level = pressure >= 0.9 ? "high" : pressure >= 0.6 ? "mid" : "low";
  return h(
    "div",
    { class: `gauge ${configured ? level : "off"}`, dataset: { gauge: label } },
    h("div", { class: "gauge-head" },
      h("span", { class: "gauge-label" }, label),
      h("span", { class: "gauge-value" }, configured ? `${format(value)} / ${format(limit)}` : "not configured")),
    h("div", { class: "track", role: "meter", "aria-label": label, "aria-valuemin": 0,
      "aria-valuemax": configured ? limit : 0, "aria-valuenow": configured ? value : 0 }, fill),
    note ? h("div", { class: "gauge-note muted" }, note) : null,
  );
}

export function fmt(n) {
  if (typeof n !== "number") return String(n);
  return Number.isInteger(n) ? n.toLocaleString() : n.toLocaleString(undefined, { maximumFractionDigits: 2 });
}

export function table(headers, rows, empty = "Nothing yet.") {
  if (!rows.length) return h("p", { class: "empty muted" }, empty);
  return h("div", { class: "table-wrap" },
    h("table", {},
      h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col" }, x)))),
      h("tbody", {}, rows)));
}

/** The part of an id that tells ids apart. Task and run ids are time-ordered (UUIDv7):
 * their heads are alike for everything made in the same minutes, their tails are random. */
export function shortId(id) {
  if (!id) return "—";
  const text = String(id);
  return text.length > 12 ? `…${text.slice(-12)}` : text;
}

/** How many decimals a dollar amount needs to show its first significant cents. */
export function usdDecimals(amount) {
  const a = Math.abs(amount);
  if (a === 0 || a >= 1) return 2;
  if (a >= 0.0001) return 4;
  return 6;
}

/** US dollars, every amount of the dashboard written the same way: `$0.0002`, `$1.50`. */
export function usd(amount, decimals = usdDecimals(amount)) {
  if (typeof amount !== "number" || !isFinite(amount)) return "—";
  return `$${amount.toFixed(decimals)}`;
}

/** What a task cost: dollars when priced, "unpriced" when the model has no prices, "—"
 * before any usage (queued, running, or served from the cache). */
export function taskCost(t) {
  if (!t.usage) return h("span", { class: "muted" }, "—");
  if (!t.usage.priced || typeof t.usage.cost_usd !== "number") return h("span", { class: "muted", title: "the model has no prices" }, "unpriced");
  return h("span", { class: "num cost" }, usd(t.usage.cost_usd));
}

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, String(value));
  for (const child of children) if (child) el.append(child);
  return el;
}

/** A small bar chart of tasks finished per minute (succeeded below, failed and canceled
 * stacked on top), oldest minute first; `minutes` is `/v1/stats`' `per_minute`. */
export function minuteChart(minutes) {
  const width = 600;
  const height = 90;
  const gap = 1;
  const bar = width / Math.max(minutes.length, 1);
  const most = Math.max(1, ...minutes.map((m) => m.succeeded + m.failed + m.canceled));
  const y = (n) => (n / most) * (height - 4);
  const bars = minutes.map((m, i) => {
    const bad = m.failed + m.canceled;
    const ok = m.succeeded;
    const x = i * bar;
    const start = new Date(m.start);
    const label = `${isNaN(start) ? m.start : start.toLocaleTimeString()}: ${ok} succeeded, ${m.failed} failed, ${m.canceled} canceled`;
    return svg("g", { class: "minute", "data-succeeded": ok, "data-failed": m.failed, "data-canceled": m.canceled },
      svg("title", {}, document.createTextNode(label)),
      svg("rect", { class: "ok", x: x.toFixed(2), y: (height - y(ok)).toFixed(2), width: Math.max(bar - gap, 1).toFixed(2), height: y(ok).toFixed(2) }),
      svg("rect", { class: "bad", x: x.toFixed(2), y: (height - y(ok) - y(bad)).toFixed(2), width: Math.max(bar - gap, 1).toFixed(2), height: y(bad).toFixed(2) }));
  });
  return svg("svg", { class: "chart", id: "minute-chart", viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", role: "img",
    "aria-label": `tasks finished per minute, the last ${minutes.length} minutes; the tallest bar is ${most}` },
  svg("line", { class: "axis", x1: 0, y1: height - 0.5, x2: width, y2: height - 0.5 }), ...bars);
}
