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
 * `reserve`, the value is what is left (a token bucket): low is the warning sign. */
export function gauge(label, value, limit, note, reserve = false) {
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
      h("span", { class: "gauge-value" }, configured ? `${fmt(value)} / ${fmt(limit)}` : "not configured")),
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
