// The pages. Each takes the page element and the route's arguments, renders into it, and
// may return a refresh function that the app calls every few seconds while it is shown.

import { get, post } from "./api.js";
import { chatView } from "./chat.js";
import { ago, badge, clear, fmt, gauge, h, json, minuteChart, replace, shortId, table, taskCost, time, usd, usdDecimals } from "./dom.js";

const TASK_STATUSES = ["queued", "running", "succeeded", "failed", "canceled"];
const RUN_STATES = ["running", "waiting", "succeeded", "failed", "canceled"];
const KINDS = ["generate_text", "classify", "classify_many", "extract_data", "chat", "embed"];

// An embed's output is its vectors: the page says how many and of what dimension, never
// the floats (thousands of numbers nobody reads).
function embedSummary(output) {
  const n = (output.embeddings || []).length;
  return h("p", { id: "embed-summary" },
    `${fmt(n)} vector${n === 1 ? "" : "s"} of ${fmt(output.dimensions)} dimensions (the numbers are not shown).`);
}

function title(text, ...extra) {
  return h("div", { class: "page-head" }, h("h1", {}, text), ...extra);
}

function stat(label, value, note) {
  return h("div", { class: "stat", dataset: { stat: label } },
    h("div", { class: "stat-value" }, value),
    h("div", { class: "stat-label" }, label),
    note ? h("div", { class: "stat-note muted" }, note) : null);
}

function notice(err) {
  return h("p", { class: "error", role: "alert" }, err.message || String(err));
}

const short = shortId;

/** The view of an address the dashboard cannot read (a malformed or unknown route). */
export function badAddress(page, text) {
  replace(page, title("Not found"),
    h("section", { class: "card", id: "bad-address" },
      h("p", { class: "error", role: "alert" }, "This address is not a page of the dashboard or names no valid id: ",
        h("span", { class: "mono" }, text)),
      h("p", {}, h("a", { href: "#/overview" }, "Back to the overview"))));
}

// ---------------------------------------------------------------- overview

export async function overview(page) {
  const stats = h("div", { class: "stats" });
  const chart = h("div", { class: "chart-wrap" });
  const failures = h("div");
  const recent = h("div");
  replace(page, title("Overview", h("span", { class: "muted live" }, "live · last hour")),
    stats, h("section", { class: "card" }, h("h2", {}, "Finished per minute, last hour"),
      chart, h("div", { class: "legend muted" }, h("span", { class: "key ok" }), "succeeded ", h("span", { class: "key bad" }), "failed or canceled")),
    h("div", { class: "grid2" },
      h("section", { class: "card" }, h("h2", {}, "Failures by code"), failures),
      h("section", { class: "card" }, h("h2", {}, "Latest tasks"), recent)));
  async function refresh() {
    try {
      const s = await get("/v1/stats");
      const rate = s.cache_hit_rate === null ? "—" : `${(s.cache_hit_rate * 100).toFixed(1)}%`;
      const lat = s.latency_ms ? `${fmt(s.latency_ms.p50)} ms` : "—";
      replace(stats,
        stat("Queued", fmt(s.queued), "waiting for a worker"),
        stat("Running", fmt(s.running), "claimed now"),
        stat("Throughput", `${fmt(s.recent_throughput_per_minute)}/min`,
          `last ${s.recent_window_seconds === 60 ? "minute" : `${fmt(s.recent_window_seconds)} s`} · hour average ${fmt(s.throughput_per_minute)}/min · ${fmt(s.succeeded + s.failed + s.canceled)} finished`),
        stat("Succeeded", fmt(s.succeeded), "in the last hour"),
        stat("Failed", fmt(s.failed), s.canceled ? `${fmt(s.canceled)} canceled` : "in the last hour"),
        stat("Cache hit rate", rate, `${fmt(s.cache_hits)} served from cache`),
        stat("Latency p50", lat, s.latency_ms ? `p90 ${fmt(s.latency_ms.p90)} · p99 ${fmt(s.latency_ms.p99)} ms` : "no runs yet"));
      replace(chart, minuteChart(s.per_minute || []));
      replace(failures, table(["Code", "Tasks"],
        s.failures_by_code.map((f) => h("tr", { dataset: { code: f.code } },
          h("td", {}, h("a", { class: "mono", href: `#/tasks?error_code=${encodeURIComponent(f.code)}`, title: `the tasks that ended with ${f.code}` }, f.code)),
          h("td", { class: "num" }, fmt(f.count)))),
        "No failures in the last hour."));
    } catch (e) {
      replace(stats, notice(e));
    }
    try {
      const t = await get("/v1/tasks", { limit: 8 });
      replace(recent, taskTable(t.tasks, true));
    } catch (e) {
      replace(recent, notice(e));
    }
  }
  await refresh();
  return refresh;
}

// ---------------------------------------------------------------- tasks

function taskTable(tasks, compact = false) {
  const headers = compact ? ["Task", "Status", "Kind", "Cost", "Created"] : ["Task", "Status", "Kind", "Step", "Scope", "Source", "Cost", "Created", "Worker"];
  return table(headers, tasks.map((t) => {
    const link = h("a", { href: `#/tasks/${encodeURIComponent(t.id)}`, class: "mono task-id", title: t.id }, short(t.id));
    const status = [badge(t.status), t.cached ? h("span", { class: "badge s-cached", title: "served from the cache" }, "cached") : null];
    const cells = compact
      ? [link, status, t.kind, taskCost(t), ago(t.created_at)]
      : [link, status, t.kind, t.step, t.scope, t.source ? t.source.id : "—", taskCost(t), ago(t.created_at), t.worker || "—"];
    return h("tr", { dataset: { task: t.id, status: t.status } }, cells.map((c) => h("td", {}, c)));
  }), "No tasks match.");
}

function field(label, input) {
  return h("label", { class: "field" }, h("span", {}, label), input);
}

function toIso(local) {
  if (!local) return undefined;
  const d = new Date(local);
  return isNaN(d) ? undefined : d.toISOString();
}

export async function tasks(page, _args, query) {
  const form = h("form", { class: "filters", id: "task-filters" });
  const input = (name, placeholder) => h("input", { name, placeholder, value: query.get(name) || "", spellcheck: "false" });
  const wanted = (query.get("status") || "").split(",").filter(Boolean);
  const statusBoxes = TASK_STATUSES.map((s) =>
    h("label", { class: "check" }, h("input", { type: "checkbox", name: "status", value: s, checked: wanted.includes(s) }), s));
  const kind = h("select", { name: "kind" }, h("option", { value: "" }, "any kind"),
    KINDS.map((k) => h("option", { value: k, selected: query.get("kind") === k }, k)));
  const after = h("input", { name: "created_after", type: "datetime-local" });
  const before = h("input", { name: "created_before", type: "datetime-local" });
  const live = h("input", { type: "checkbox", id: "live", checked: true });
  form.append(
    h("fieldset", { class: "statuses" }, h("legend", {}, "Status"), statusBoxes),
    h("div", { class: "row" },
      field("Scope", input("scope", "any")), field("Kind", kind), field("Step", input("step", "any")),
      field("Source", input("source", "any")), field("Run id", input("run_id", "any")),
      field("Error code", input("error_code", "any")),
      field("Created after", after), field("Created before", before)),
    h("div", { class: "row actions" },
      h("button", { type: "submit" }, "Apply"),
      h("button", { type: "button", class: "quiet", onclick: () => { location.hash = "#/tasks"; } }, "Clear"),
      h("label", { class: "check" }, live, "Live refresh")));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const data = new FormData(form);
    const q = new URLSearchParams();
    for (const name of ["scope", "kind", "step", "source", "run_id", "error_code"]) {
      const v = String(data.get(name) || "").trim();
      if (v) q.set(name, v);
    }
    const statuses = data.getAll("status");
    if (statuses.length) q.set("status", statuses.join(","));
    const a = toIso(data.get("created_after"));
    const b = toIso(data.get("created_before"));
    if (a) q.set("created_after", a);
    if (b) q.set("created_before", b);
    location.hash = `#/tasks?${q}`;
  });
  const results = h("div", { id: "task-results" });
  const pager = h("div", { class: "pager" });
  replace(page, title("Tasks"), effectKeySearch(), h("section", { class: "card" }, form), h("section", { class: "card" }, results, pager));

  const params = {};
  for (const name of ["scope", "status", "kind", "step", "source", "run_id", "created_after", "created_before", "error_code"]) {
    if (query.get(name)) params[name] = query.get(name);
  }
  const cursors = [undefined];
  async function load() {
    const next = cursors[cursors.length - 1];
    try {
      const answer = await get("/v1/tasks", { ...params, limit: 25, next });
      replace(results, taskTable(answer.tasks));
      replace(pager,
        h("button", { type: "button", class: "quiet", disabled: cursors.length === 1, onclick: () => { cursors.pop(); load(); } }, "← Newer"),
        h("span", { class: "muted" }, `page ${cursors.length}`),
        h("button", { type: "button", class: "quiet", id: "older", disabled: !answer.next, onclick: () => { cursors.push(answer.next); load(); } }, "Older →"));
    } catch (e) {
      replace(results, notice(e));
      clear(pager);
    }
  }
  await load();
  // Live refresh keeps the first page current; older pages stay still while read.
  return () => (live.checked && cursors.length === 1 ? load() : undefined);
}

/** docs/conformance.md#listings: one task by its effect key (`GET /v1/tasks?effect_key=`, as `tollgate task
 * get --effect-key` asks), opened on its page. */
function effectKeySearch() {
  const key = h("input", { name: "effect_key", id: "effect-key", placeholder: "the exact effect key", spellcheck: "false", required: true });
  const answer = h("p", { id: "effect-key-answer", role: "status", hidden: true });
  const form = h("form", { class: "row", id: "effect-key-search" }, field("Find a task by effect key", key),
    h("button", { type: "submit" }, "Find"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const wanted = key.value.trim();
    if (!wanted) return;
    answer.hidden = true;
    try {
      const t = await get("/v1/tasks", { effect_key: wanted });
      location.hash = `#/tasks/${encodeURIComponent(t.id)}`;
    } catch (e) {
      answer.hidden = false;
      answer.className = "error";
      answer.textContent = e.status === 404 ? `No task of this app has the effect key “${wanted}”.` : e.message;
    }
  });
  return h("section", { class: "card" }, form, answer);
}

// ---------------------------------------------------------------- task detail

function dl(pairs) {
  return h("dl", { class: "facts" }, pairs.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v ?? "—")]));
}

/** Cancel (docs/conformance.md#lifecycle) for a queued or running task: asks first, then shows the new state. */
function cancelButton(t, done) {
  const problem = h("p", { class: "error", role: "alert", hidden: true });
  const button = h("button", { type: "button", class: "danger", id: "cancel-task", onclick: async () => {
    if (!window.confirm(`Cancel task ${t.id}? A queued task never runs; a running one is stopped.`)) return;
    button.disabled = true;
    try {
      await post(`/v1/tasks/${encodeURIComponent(t.id)}/cancel`);
      await done();
    } catch (e) {
      button.disabled = false;
      problem.hidden = false;
      problem.textContent = `Cancel failed: ${e.message}`;
    }
  } }, "Cancel task");
  return h("span", { class: "cancel" }, button, problem);
}

/** Where a task served from the cache got its result. */
function cacheNote(t) {
  return h("section", { class: "card cache-note", id: "cache-note" },
    h("p", {}, "Served from the cache: no worker ran this task and it cost nothing. Its output was copied from task ",
      t.cached_from
        ? h("a", { href: `#/tasks/${encodeURIComponent(t.cached_from)}`, class: "mono", id: "cached-from" }, t.cached_from)
        : h("span", { class: "muted" }, "(not recorded)"),
      "."));
}

export async function task(page, [id]) {
  async function render() {
    const t = await get(`/v1/tasks/${encodeURIComponent(id)}`);
    const usage = t.usage ? `${fmt(t.usage.input_tokens)} in · ${fmt(t.usage.output_tokens)} out` : "—";
    replace(page,
      title("Task", badge(t.status), t.cached ? h("span", { class: "badge s-cached" }, "served from cache") : null,
        ["queued", "running"].includes(t.status) ? cancelButton(t, render) : null),
      t.cached ? cacheNote(t) : null,
      h("section", { class: "card" }, dl([
        ["Id", h("span", { class: "mono", id: "task-id" }, t.id)],
        ["Effect key", h("span", { class: "mono" }, t.effect_key)],
        ["Kind", t.kind], ["Step", t.step], ["Model", t.model],
        ["Scope", h("a", { href: `#/scopes/${encodeURIComponent(t.scope)}` }, t.scope)],
        ["Source", t.source ? `${t.source.id} @ ${t.source.revision}` : "—"],
        ["Run", t.run_id ? h("a", { href: `#/runs/${encodeURIComponent(t.run_id)}`, class: "mono" }, t.run_id) : "—"],
        ["Subject", t.subject ? `${t.subject.type}:${t.subject.id}` : "—"],
        ["Created", time(t.created_at)], ["Claimed", time(t.claimed_at)],
        ["Last heartbeat", time(t.heartbeat_at)], ["Finished", time(t.completed_at)],
        ["Worker", t.worker || "—"], ["Usage", usage], ["Cost", h("span", { id: "task-cost" }, taskCost(t))],
      ])),
      t.error ? h("section", { class: "card" }, h("h2", {}, "Error"),
        h("p", { class: "mono error-code" }, t.error.code), h("p", {}, t.error.message)) : null,
      h("section", { class: "card" }, h("h2", {}, "Attempts"), table(["#", "Deployment", "Started", "Ended", "Outcome", "Usage", "Cost", "Error"],
        (t.attempts || []).map((a) => h("tr", { dataset: { outcome: a.outcome } }, [a.n, a.deployment, time(a.started_at), time(a.ended_at), a.outcome,
          a.usage ? `${fmt(a.usage.input_tokens)} / ${fmt(a.usage.output_tokens)}` : "—", a.cost_usd === null ? "—" : `$${a.cost_usd.toFixed(6)}`,
          a.error ? a.error.code : "—"].map((c) => h("td", {}, c)))),
        t.cached ? "None: served from the cache." : t.status === "queued" ? "None yet." : "None: it ended before its first call.")),
      t.kind === "chat" ? chatView(t) : null,
      h("div", { class: "grid2" },
        h("section", { class: "card" }, h("h2", {}, "Request"), json(t.request)),
        h("section", { class: "card" }, h("h2", {}, "Output"), t.output === null ? h("p", { class: "muted" }, "No output yet.")
          : t.kind === "embed" ? embedSummary(t.output) : json(t.output))));
    return t;
  }
  try {
    const t = await render();
    return () => (["queued", "running"].includes(t.status) ? render() : undefined);
  } catch (e) {
    replace(page, title("Task"), notice(e));
    return undefined;
  }
}

// ---------------------------------------------------------------- runs

export async function runs(page, _args, query) {
  const form = h("form", { class: "filters" });
  const scope = h("input", { name: "scope", placeholder: "any", value: query.get("scope") || "" });
  const pipeline = h("input", { name: "pipeline", placeholder: "any", value: query.get("pipeline") || "" });
  const state = h("select", { name: "state" }, h("option", { value: "" }, "any state"),
    RUN_STATES.map((s) => h("option", { value: s, selected: query.get("state") === s }, s)));
  form.append(h("div", { class: "row" }, field("Scope", scope), field("Pipeline", pipeline), field("State", state),
    h("button", { type: "submit" }, "Apply")));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [k, el] of [["scope", scope], ["pipeline", pipeline], ["state", state]]) if (el.value.trim()) q.set(k, el.value.trim());
    location.hash = `#/runs?${q}`;
  });
  const list = h("div");
  const pipes = h("div");
  replace(page, title("Runs"), h("section", { class: "card" }, form),
    h("section", { class: "card" }, list),
    h("section", { class: "card" }, h("h2", {}, "Pipelines"), pipes));
  const params = {};
  for (const k of ["scope", "pipeline", "state"]) if (query.get(k)) params[k] = query.get(k);
  async function refresh() {
    try {
      const r = await get("/v1/runs", { ...params, limit: 50 });
      replace(list, table(["Run", "State", "Pipeline", "Scope", "Created", "Updated"], r.runs.map((run) =>
        h("tr", { dataset: { run: run.id } }, [
          h("a", { href: `#/runs/${encodeURIComponent(run.id)}`, class: "mono", title: run.id }, short(run.id)),
          badge(run.state), run.pipeline ? run.pipeline.name : h("span", { class: "muted" }, "workflow"),
          run.scope, ago(run.created_at), ago(run.updated_at)].map((c) => h("td", {}, c)))), "No runs match."));
    } catch (e) {
      replace(list, notice(e));
    }
    try {
      const p = await get("/v1/pipelines", { limit: 100 });
      replace(pipes, table(["Pipeline", "Versions", "Newest"], p.pipelines.map((x) => h("tr", {}, [
        h("a", { href: `#/runs?pipeline=${encodeURIComponent(x.name)}` }, x.name),
        fmt(x.versions.length), x.versions[0] ? h("span", { class: "mono", title: x.versions[0].version }, short(x.versions[0].version)) : "—",
      ].map((c) => h("td", {}, c)))), "No pipelines registered."));
    } catch (e) {
      replace(pipes, notice(e));
    }
  }
  await refresh();
  return refresh;
}

/** Steps in layers: a step sits one layer after its deepest dependency. */
function layers(steps, deps) {
  const depth = new Map();
  const visit = (key, seen = new Set()) => {
    if (depth.has(key)) return depth.get(key);
    if (seen.has(key)) return 0;
    seen.add(key);
    const d = Math.max(-1, ...(deps.get(key) || []).map((k) => visit(k, seen))) + 1;
    depth.set(key, d);
    return d;
  };
  steps.forEach((s) => visit(s.key));
  const out = [];
  for (const s of steps) (out[depth.get(s.key)] ||= []).push(s);
  return out.filter(Boolean);
}

export async function run(page, [id]) {
  async function render() {
    const r = await get(`/v1/runs/${encodeURIComponent(id)}`);
    const parts = [title(r.pipeline ? `Pipeline run · ${r.pipeline.name}` : "Workflow run", badge(r.state)),
      h("section", { class: "card" }, dl([
        ["Id", h("span", { class: "mono" }, r.id)], ["Scope", r.scope],
        ["Pipeline version", r.pipeline ? h("span", { class: "mono" }, r.pipeline.version) : "—"],
        ["Created", time(r.created_at)], ["Updated", time(r.updated_at)],
        ["Waiting on", r.waiting_on ? h("a", { href: `#/tasks/${encodeURIComponent(r.waiting_on)}`, class: "mono" }, r.waiting_on) : "—"],
        ["Cancel requested", r.cancel_requested ? "yes" : "no"],
      ]))];
    if (r.pipeline) {
      let deps = new Map();
      try {
        const p = await get(`/v1/pipelines/${encodeURIComponent(r.pipeline.name)}`, { version: r.pipeline.version });
        for (const s of (p.definition && p.definition.steps) || []) deps.set(s.key, Array.isArray(s.depends_on) ? s.depends_on : []);
      } catch (e) {
        deps = new Map();
      }
      const dag = h("div", { class: "dag", id: "dag" }, layers(r.pipeline.steps, deps).map((layer, i) =>
        h("div", { class: "layer" }, h("div", { class: "layer-label muted" }, i === 0 ? "start" : `then`),
          layer.map((s) => h("div", { class: `step s-${s.status}`, dataset: { step: s.key, status: s.status } },
            h("div", { class: "step-head" }, h("strong", {}, s.key), badge(s.status)),
            h("div", { class: "muted" }, s.kind, s.attempts > 1 ? ` · ${s.attempts} attempts` : ""),
            (deps.get(s.key) || []).length ? h("div", { class: "needs muted" }, `after ${(deps.get(s.key) || []).join(", ")}`) : null,
            s.task_id ? h("a", { href: `#/tasks/${encodeURIComponent(s.task_id)}`, class: "mono" }, `task ${short(s.task_id)}`) : h("span", { class: "muted" }, "no task yet"),
            s.error ? h("div", { class: "error" }, s.error.code) : null)))));
      parts.push(h("section", { class: "card" }, h("h2", {}, "Steps"), dag));
    }
    parts.push(h("div", { class: "grid2" },
      h("section", { class: "card" }, h("h2", {}, "Input"), json(r.input)),
      h("section", { class: "card" }, h("h2", {}, r.error ? "Error" : "Output"), r.error ? json(r.error) : json(r.output))));
    replace(page, ...parts);
    return r;
  }
  try {
    const r = await render();
    return () => (["running", "waiting"].includes(r.state) ? render() : undefined);
  } catch (e) {
    replace(page, title("Run"), notice(e));
    return undefined;
  }
}

// ---------------------------------------------------------------- scopes

function scopeGauges(s) {
  const p = s.policy;
  return h("div", { class: "gauges" },
    gauge("Bucket", Math.floor(s.bucket_tokens), p.burst, `tokens left · refills ${fmt(p.tasks_per_minute)}/min`, true),
    gauge("Concurrency", s.active, p.scope_concurrent, "admitted tasks queued or running"),
    gauge("Sources", s.sources_in_window, p.sources_per_24_hours, "distinct sources, last 24 h"),
    gauge("Steps", s.busiest_source_steps, p.max_steps_per_source, `busiest source · ${fmt(s.steps_in_window)} steps in all`),
    spendGauge(s));
}

/** docs/conformance.md#cost-usage: settled plus reserved spend against the policy's USD limit; without one
 * the gauge is "not configured" and its note still shows what the window holds. */
function spendGauge(s) {
  const p = s.policy;
  const spent = s.cost ? s.cost.spent_micros / 1e6 : 0;
  const tokens = s.cost ? s.cost.tokens : 0;
  // One precision for the spend, the limit and the note: amounts read alike side by side.
  const decimals = Math.max(usdDecimals(spent), p.usd_per_24_hours ? usdDecimals(p.usd_per_24_hours) : 2);
  const money = (n) => usd(n, decimals);
  const held = `${money(spent)} · ${fmt(tokens)} tokens, settled + reserved, 24 h`;
  return p.usd_per_24_hours
    ? gauge("Spend", spent, p.usd_per_24_hours, held, false, money)
    : gauge("Spend", null, 0, `no USD limit · ${held}`);
}

function scopeCard(s, link = true) {
  return h("section", { class: "card scope", dataset: { scope: s.scope } },
    h("div", { class: "scope-head" },
      link ? h("a", { href: `#/scopes/${encodeURIComponent(s.scope)}` }, h("h2", {}, s.scope)) : h("h2", {}, s.scope),
      h("span", { class: "muted" }, `policy ${s.policy.name} · ${fmt(s.admissions_in_window)} admissions in 24 h · last ${ago(s.last_admitted_at)}`)),
    scopeGauges(s));
}

export async function scopes(page) {
  const lookup = h("form", { class: "row" }, field("Open a scope", h("input", { name: "scope", placeholder: "scope name" })),
    h("button", { type: "submit" }, "Open"));
  lookup.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const v = String(new FormData(lookup).get("scope") || "").trim();
    if (v) location.hash = `#/scopes/${encodeURIComponent(v)}`;
  });
  const list = h("div", { id: "scope-list" });
  replace(page, title("Scopes", h("span", { class: "muted live" }, "active in the last 24 h")), h("section", { class: "card" }, lookup), list);
  async function refresh() {
    try {
      const answer = await get("/v1/scopes", { limit: 100 });
      replace(list, answer.scopes.length ? answer.scopes.map((s) => scopeCard(s)) : h("p", { class: "card muted" }, "No scope admitted a task in the last 24 hours."));
    } catch (e) {
      replace(list, notice(e));
    }
  }
  await refresh();
  return refresh;
}

export async function scope(page, [name]) {
  const body = h("div");
  const recent = h("div");
  replace(page, title("Scope"), body, h("section", { class: "card" }, h("h2", {}, "Latest tasks"), recent));
  async function refresh() {
    try {
      replace(body, scopeCard(await get(`/v1/scopes/${encodeURIComponent(name)}`), false));
      replace(recent, taskTable((await get("/v1/tasks", { scope: name, limit: 10 })).tasks));
    } catch (e) {
      replace(body, notice(e));
    }
  }
  await refresh();
  return refresh;
}

// ---------------------------------------------------------------- models

export async function models(page) {
  try {
    const m = await get("/v1/models");
    const price = (x, field) => (x.prices ? h("span", { class: "num" }, usd(x.prices[field])) : h("span", { class: "muted" }, "unpriced"));
    replace(page, title("Models"), h("section", { class: "card" }, table(["Id", "Provider", "Model", "Input $/M tokens", "Output $/M tokens", "Cached input $/M tokens", "Cache write $/M tokens", "Config hash", ""],
      m.models.map((x) => h("tr", { dataset: { model: x.id } }, [h("span", { class: "mono" }, x.id), x.provider, x.model,
        price(x, "input_usd_per_million"), price(x, "output_usd_per_million"), price(x, "cached_input_usd_per_million"),
        price(x, "cache_write_input_usd_per_million"),
        h("span", { class: "mono", title: x.config_hash }, short(x.config_hash)), x.default ? h("span", { class: "badge s-default" }, "default") : ""].map((c) => h("td", {}, c))))),
      h("p", { class: "muted" }, "Prices in US dollars per million tokens, as configured ([models.<id>.prices]); an unpriced model's costs are unknown.")));
  } catch (e) {
    replace(page, title("Models"), notice(e));
  }
  return undefined;
}
