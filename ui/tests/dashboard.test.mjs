// The dashboard in a real browser (headless Debian chromium through playwright-core)
// against a real `tollgate serve`: sign-in (and a wrong key's error), tasks appearing
// live, the status filter, a task's detail, a pipeline run's steps, a scope's gauges
// moving after admissions, the CSP (on 404 and 405 answers too), ids that tell tasks
// apart, a cached task's source, the recent throughput and its chart, cancel, cost per
// task, search by effect key, prices, the failure code click-through, the spend gauge's
// dollars, a malformed address and a chat task's conversation and tool calls. Screenshots go to $CARGO_TARGET_DIR/ui-screenshots.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { ACME_KEY, BETA_KEY, GAMMA_KEY, repoRoot, startServer } from "./server.mjs";

const shots = join(process.env.CARGO_TARGET_DIR || join(repoRoot, "target"), "ui-screenshots");
mkdirSync(shots, { recursive: true });
const run = Date.now().toString(36);

let server;
let browser;
let page;

async function api(method, path, body, key = ACME_KEY) {
  const response = await fetch(server.baseUrl + path, {
    method,
    headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  assert.ok(response.status < 300, `${method} ${path}: ${response.status} ${text}`);
  return JSON.parse(text);
}

const submit = (effect_key, extra = {}) => api("POST", "/v1/tasks", {
  kind: "generate_text", scope: `ui-${run}`, effect_key, request: { prompt: `hello ${effect_key}` }, ...extra,
});

async function shot(name) {
  await page.screenshot({ path: join(shots, `${name}.png`), fullPage: true });
}

before(async () => {
  server = await startServer();
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM_PATH || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-dev-shm-usage"],
  });
  page = await browser.newPage({ viewport: { width: 1280, height: 860 } });
  page.on("pageerror", (e) => { pageErrors.push(e); });
});

// Every uncaught error of the page fails the test that caused it.
const pageErrors = [];
function noPageErrors() {
  const errors = pageErrors.splice(0);
  assert.deepEqual(errors.map((e) => String(e)), [], "the page threw");
}

async function signIn(p, key) {
  await p.goto(`${server.baseUrl}/ui`);
  await p.fill("#key", key);
  await p.click("#signin-form button");
  await p.locator("#page[data-page=overview] .stat").first().waitFor();
}

/** A task's status, read from the API until it is one of `wanted`. */
async function until(id, wanted, key = ACME_KEY) {
  for (let i = 0; i < 100; i++) {
    const t = await api("GET", `/v1/tasks/${id}?wait=2s`, undefined, key);
    if (wanted.includes(t.status)) return t;
  }
  throw new Error(`task ${id} never reached ${wanted}`);
}

after(async () => {
  await browser?.close();
  await server?.stop();
});

test("the page is served with a strict CSP and no inline code", async () => {
  const response = await fetch(`${server.baseUrl}/ui`);
  assert.equal(response.status, 200);
  const csp = response.headers.get("content-security-policy");
  assert.match(csp, /default-src 'none'/);
  assert.match(csp, /script-src 'self'/);
  assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval/);
  const html = await response.text();
  assert.doesNotMatch(html, /<script>[^<]/);
  assert.doesNotMatch(html, /https?:\/\//, "no external fonts, scripts or CDNs");
  for (const file of ["app.js", "pages.js", "dom.js", "api.js"]) {
    const js = readFileSync(join(repoRoot, "crates/server/ui", file), "utf8");
    assert.doesNotMatch(js, /innerHTML|outerHTML|insertAdjacentHTML|document\.write/, `${file} renders text only`);
  }
  // A missing file (404) and a wrong method (405) carry the pages' headers too.
  for (const [method, path, status] of [["GET", "/ui", 200], ["GET", "/ui/missing.js", 404], ["POST", "/ui", 405], ["DELETE", "/ui/app.js", 405]]) {
    const answer = await fetch(`${server.baseUrl}${path}`, { method });
    assert.equal(answer.status, status, `${method} ${path}`);
    assert.equal(answer.headers.get("content-security-policy"), csp, `${method} ${path}: the same CSP`);
    assert.equal(answer.headers.get("x-frame-options"), "DENY", `${method} ${path}`);
    assert.equal(answer.headers.get("x-content-type-options"), "nosniff", `${method} ${path}`);
  }
});

test("a wrong key shows a clear sign-in error", async () => {
  await page.goto(`${server.baseUrl}/ui`);
  await page.fill("#key", "not-a-key-of-this-server");
  await page.click("#signin-form button");
  const error = page.locator("#signin-error");
  await error.waitFor({ state: "visible" });
  assert.match(await error.textContent(), /Sign-in failed: the server does not know this API key/);
  assert.equal(await page.evaluate(() => sessionStorage.getItem("tollgate.apiKey")), null);
  await shot("signin-error");
});

test("signing in shows the overview of the key's app", async () => {
  await submit(`warm-${run}`, { }).then((t) => api("GET", `/v1/tasks/${t.id}?wait=10s`));
  await page.fill("#key", ACME_KEY);
  await page.click("#signin-form button");
  await page.locator("#page[data-page=overview] .stat").first().waitFor();
  assert.equal(await page.evaluate(() => sessionStorage.getItem("tollgate.apiKey")), ACME_KEY);
  assert.equal(await page.evaluate(() => localStorage.length), 0, "the key is never kept beyond the tab");
  await page.locator('[data-stat="Succeeded"] .stat-value', { hasText: /^[1-9]/ }).waitFor();
  await shot("overview");
});

test("submitted tasks appear, live; another app's never do", async () => {
  const theirs = await api("POST", "/v1/tasks", {
    kind: "generate_text", scope: `ui-${run}`, effect_key: `beta-${run}`, request: { prompt: "beta's" },
  }, BETA_KEY);
  const first = await submit(`a-${run}`);
  await page.goto(`${server.baseUrl}/ui#/tasks`);
  await page.locator(`tr[data-task="${first.id}"]`).waitFor();
  // Live refresh: a task submitted while the page is open shows up without a reload.
  const later = await submit(`b-${run}`);
  await page.locator(`tr[data-task="${later.id}"]`).waitFor({ timeout: 15_000 });
  assert.equal(await page.locator(`tr[data-task="${theirs.id}"]`).count(), 0);
  await shot("tasks");
});

test("the status filter narrows the list", async () => {
  const slow = await submit(`slow-${run}`, { model: "slow" });
  await api("POST", `/v1/tasks/${slow.id}/cancel`);
  await page.goto(`${server.baseUrl}/ui#/tasks`);
  await page.check('input[name=status][value=canceled]');
  await page.click("#task-filters button[type=submit]");
  await page.locator(`tr[data-task="${slow.id}"]`).waitFor();
  const statuses = await page.locator("#task-results tr[data-status]").evaluateAll((rows) => rows.map((r) => r.dataset.status));
  assert.ok(statuses.length >= 1);
  assert.deepEqual([...new Set(statuses)], ["canceled"]);
  assert.match(page.url(), /status=canceled/);
  await shot("tasks-canceled");
});

test("a task opens with its request, output, timestamps, worker and attempts", async () => {
  const t = await submit(`detail-${run}`);
  await api("GET", `/v1/tasks/${t.id}?wait=10s`);
  await page.goto(`${server.baseUrl}/ui#/tasks`);
  await page.click(`tr[data-task="${t.id}"] a`);
  await page.locator("#task-id", { hasText: t.id }).waitFor();
  const text = await page.locator("#page").textContent();
  for (const label of ["Request", "Output", "Attempts", "Claimed", "Last heartbeat", "Finished", "Worker"]) {
    assert.ok(text.includes(label), `shows ${label}`);
  }
  assert.ok(text.includes(`hello detail-${run}`), "shows the request");
  // Its one attempt: the deployment it went to and how it ended.
  const attempt = page.locator('tr[data-outcome="succeeded"]');
  await attempt.waitFor();
  assert.match(await attempt.textContent(), /dev\//);
  await shot("task");
});

test("an embed task shows its vectors' count and dimension, not its floats", async () => {
  const t = await api("POST", "/v1/tasks", {
    kind: "embed", scope: `ui-${run}`, effect_key: `embed-${run}`,
    request: { input: ["first text", "second text", "third text"], dimensions: 12 },
  });
  const done = await until(t.id, ["succeeded"]);
  await page.goto(`${server.baseUrl}/ui#/tasks/${t.id}`);
  const summary = page.locator("#embed-summary");
  await summary.waitFor();
  assert.match(await summary.textContent(), /3 vectors of 12 dimensions/);
  const output = await page.locator("#page").textContent();
  const float = String(done.output.embeddings[0][0]);
  assert.ok(!output.includes(float), "no vector component is shown");
  noPageErrors();
});

test("a pipeline run shows its steps, each with its state and task", async () => {
  const file = JSON.parse(readFileSync(join(repoRoot, "docs/examples/invoice-pipeline.json"), "utf8"));
  await api("POST", "/v1/pipelines", file);
  const started = await api("POST", `/v1/pipelines/${file.name}/runs`, {
    scope: `ui-${run}`,
    input: { text: "ACME Corp invoice, total 120.50 EUR", invoice_id: `inv-${run}`, revision: "1" },
  });
  await api("GET", `/v1/runs/${started.id}?wait=15s`);
  await page.goto(`${server.baseUrl}/ui#/runs`);
  await page.click(`tr[data-run="${started.id}"] a`);
  await page.locator("#dag .step").first().waitFor();
  for (const key of ["extract", "category", "summary"]) {
    await page.locator(`#dag .step[data-step="${key}"][data-status="succeeded"]`).waitFor({ timeout: 15_000 });
    assert.equal(await page.locator(`#dag .step[data-step="${key}"] a`).count(), 1, `${key} links its task`);
  }
  assert.equal(await page.locator("#dag .layer").count(), 3, "three layers: extract → category → summary");
  await shot("pipeline-run");
});

test("a scope's gauges move after admissions", async () => {
  const scope = `gauges-${run}`;
  await page.goto(`${server.baseUrl}/ui#/scopes/${scope}`);
  const sources = page.locator('[data-gauge="Sources"] .gauge-value');
  await sources.waitFor();
  assert.equal(await sources.textContent(), "0 / 100");
  assert.equal(await page.locator('[data-gauge="Bucket"] .gauge-value').textContent(), "40 / 40");
  assert.match(await page.locator('[data-gauge="Spend"]').textContent(), /not configured/);
  for (let i = 0; i < 5; i++) {
    await api("POST", "/v1/tasks", {
      kind: "generate_text", scope, effect_key: `${scope}-${i}`, request: { prompt: `p${i}` },
      source: { id: `doc-${i % 3}`, revision: "1" }, step: `step-${i}`,
    });
  }
  await page.locator('[data-gauge="Sources"] .gauge-value', { hasText: "3 / 100" }).waitFor({ timeout: 15_000 });
  const bucket = await page.locator('[data-gauge="Bucket"] .gauge-value').textContent();
  assert.match(bucket, /^3[0-9] \/ 40$/, `the bucket went down: ${bucket}`);
  assert.equal(await page.locator('[data-gauge="Steps"] .gauge-value').textContent(), "2 / 10");
  await shot("scope");
  await page.goto(`${server.baseUrl}/ui#/scopes`);
  await page.locator(`.scope[data-scope="${scope}"]`).waitFor();
  await shot("scopes");
});

test("models and the phone layout", async () => {
  await page.goto(`${server.baseUrl}/ui#/models`);
  await page.locator("#page[data-page=models] table").waitFor();
  assert.match(await page.locator("#page").textContent(), /dev-1/);
  await shot("models");
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto(`${server.baseUrl}/ui#/tasks`);
  await page.locator("#task-results tr[data-task]").first().waitFor();
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth > window.innerWidth + 1);
  assert.equal(overflow, false, "no sideways scrolling of the page on a phone");
  await shot("phone-tasks");
  await page.goto(`${server.baseUrl}/ui#/overview`);
  await page.locator("#page[data-page=overview] .stat").first().waitFor();
  await shot("phone-overview");
  await page.setViewportSize({ width: 1280, height: 860 });
});

test("task ids in a list tell tasks apart (their random tails, not their common time heads)", async () => {
  const made = [];
  for (let i = 0; i < 3; i++) made.push(await submit(`ids-${i}-${run}`));
  await page.goto(`${server.baseUrl}/ui#/tasks`);
  const shown = [];
  for (const t of made) {
    const link = page.locator(`tr[data-task="${t.id}"] a.task-id`);
    await link.waitFor();
    const text = await link.textContent();
    assert.equal(text, `…${t.id.slice(-12)}`, "the id's tail");
    assert.equal(await link.getAttribute("title"), t.id, "the whole id on hover");
    shown.push(text);
  }
  assert.equal(new Set(shown).size, shown.length, `distinct: ${shown}`);
  noPageErrors();
});

test("a cached task says it was served from the cache and links the task it copied", async () => {
  const scope = `cache-${run}`;
  const body = (effect_key) => ({ kind: "generate_text", scope, effect_key, source: { id: "doc", revision: "1" },
    request: { prompt: "the same prompt twice" } });
  const first = await api("POST", "/v1/tasks", body(`first-${run}`));
  await until(first.id, ["succeeded"]);
  const copy = await api("POST", "/v1/tasks", body(`copy-${run}`));
  assert.equal(copy.cached, true, "the second submission is a cache hit");
  assert.equal(copy.cached_from, first.id, "the API names the task it copied");
  await page.goto(`${server.baseUrl}/ui#/tasks/${copy.id}`);
  const note = page.locator("#cache-note");
  await note.waitFor();
  assert.match(await note.textContent(), /Served from the cache/);
  assert.doesNotMatch(await page.locator("#page").textContent(), /Not claimed yet/);
  assert.equal(await page.locator("#cached-from").textContent(), first.id);
  await shot("task-cached");
  await page.click("#cached-from");
  await page.locator("#task-id", { hasText: first.id }).waitFor();
  assert.equal(await page.locator("#cache-note").count(), 0, "the original ran: no cache note");
  noPageErrors();
});

test("throughput is the last minute's rate, with a per-minute chart", async () => {
  // Three waves of ten (the scope's concurrency limit is 20), all within seconds.
  for (let wave = 0; wave < 3; wave++) {
    const made = await Promise.all(Array.from({ length: 10 }, (_, i) => submit(`burst-${wave}-${i}-${run}`)));
    await Promise.all(made.map((t) => until(t.id, ["succeeded"])));
  }
  const stats = await api("GET", "/v1/stats");
  assert.equal(stats.recent_window_seconds, 60);
  assert.equal(stats.per_minute.length, 60);
  await page.goto(`${server.baseUrl}/ui#/overview`);
  const value = page.locator('[data-stat="Throughput"] .stat-value');
  await value.waitFor();
  const rate = Number((await value.textContent()).replace(/[^0-9.]/g, ""));
  assert.ok(rate >= 30, `30 tasks finished within the last minute: ${rate}/min, not the hour's average`);
  assert.match(await page.locator('[data-stat="Throughput"] .stat-note').textContent(), /last minute/);
  const bars = page.locator("#minute-chart .minute");
  assert.equal(await bars.count(), 60, "one bar a minute over the hour");
  const last = Number(await bars.last().getAttribute("data-succeeded"));
  assert.ok(last >= 30, `the newest minute holds the burst: ${last}`);
  assert.ok(Number(await bars.last().locator("rect.ok").getAttribute("height")) > 0);
  await shot("overview-throughput");
  noPageErrors();
});

test("a queued or running task can be canceled from its page, after a confirmation", async () => {
  const slow = await submit(`cancel-me-${run}`, { model: "slow" });
  await page.goto(`${server.baseUrl}/ui#/tasks/${slow.id}`);
  const button = page.locator("#cancel-task");
  await button.waitFor();
  page.once("dialog", (d) => d.dismiss());
  await button.click();
  await page.waitForTimeout(300);
  const kept = await api("GET", `/v1/tasks/${slow.id}`);
  assert.ok(["queued", "running"].includes(kept.status), `declining keeps it: ${kept.status}`);
  page.once("dialog", (d) => d.accept());
  await button.click();
  await page.locator(".page-head .badge.s-canceled").waitFor();
  assert.equal((await api("GET", `/v1/tasks/${slow.id}`)).status, "canceled");
  assert.equal(await page.locator("#cancel-task").count(), 0, "a canceled task has no cancel button");
  await shot("task-canceled");
  // A finished task never offers it.
  const done = await submit(`done-${run}`);
  await until(done.id, ["succeeded"]);
  await page.goto(`${server.baseUrl}/ui#/tasks/${done.id}`);
  await page.locator("#task-id", { hasText: done.id }).waitFor();
  assert.equal(await page.locator("#cancel-task").count(), 0);
  noPageErrors();
});

test("a failure code on the overview opens the tasks that ended with it", async () => {
  const slow = await submit(`fail-code-${run}`, { model: "slow" });
  await api("POST", `/v1/tasks/${slow.id}/cancel`);
  const code = (await until(slow.id, ["canceled"])).error.code;
  await page.goto(`${server.baseUrl}/ui#/overview`);
  const link = page.locator(`tr[data-code="${code}"] a`);
  await link.waitFor();
  await link.click();
  await page.locator(`tr[data-task="${slow.id}"]`).waitFor();
  assert.match(page.url(), new RegExp(`error_code=${code}`));
  const statuses = await page.locator("#task-results tr[data-status]").evaluateAll((rows) => rows.map((r) => r.dataset.status));
  assert.ok(statuses.every((s) => s === "failed" || s === "canceled"), `only tasks that ended with ${code}: ${statuses}`);
  assert.equal(await page.locator("input[name=error_code]").inputValue(), code);
  noPageErrors();
});

test("a task is found by its effect key", async () => {
  const t = await submit(`find-me-${run}`);
  await page.goto(`${server.baseUrl}/ui#/tasks`);
  await page.fill("#effect-key", `find-me-${run}`);
  await page.click("#effect-key-search button");
  await page.locator("#task-id", { hasText: t.id }).waitFor();
  await page.goto(`${server.baseUrl}/ui#/tasks`);
  await page.fill("#effect-key", `beta-${run}`);
  await page.click("#effect-key-search button");
  const answer = page.locator("#effect-key-answer");
  await answer.waitFor({ state: "visible" });
  assert.match(await answer.textContent(), /No task of this app has the effect key/, "another app's key finds nothing");
  noPageErrors();
});

test("costs per task and the spend gauge read in dollars alike", async () => {
  // acme's default model has no prices: its tasks say so.
  const free = await submit(`free-${run}`);
  await until(free.id, ["succeeded"]);
  await page.goto(`${server.baseUrl}/ui#/tasks/${free.id}`);
  await page.locator("#task-cost", { hasText: "unpriced" }).waitFor();
  // gamma works with a priced model under a $0.01 daily limit.
  const gamma = await browser.newPage({ viewport: { width: 1280, height: 860 } });
  gamma.on("pageerror", (e) => { pageErrors.push(e); });
  const scope = `spend-${run}`;
  const made = [];
  for (let i = 0; i < 2; i++) {
    made.push(await api("POST", "/v1/tasks", { kind: "generate_text", scope, model: "priced", effect_key: `priced-${i}-${run}`,
      source: { id: `doc-${i}`, revision: "1" }, request: { prompt: `what does this cost, ${i}?` } }, GAMMA_KEY));
  }
  const done = [];
  for (const t of made) done.push(await until(t.id, ["succeeded"], GAMMA_KEY));
  const dollars = (n) => `$${n.toFixed(n >= 1 ? 2 : n >= 0.0001 ? 4 : 6)}`;
  await signIn(gamma, GAMMA_KEY);
  await gamma.goto(`${server.baseUrl}/ui#/tasks?scope=${scope}`);
  for (const t of done) {
    assert.ok(t.usage.cost_usd > 0, "priced");
    const cell = gamma.locator(`tr[data-task="${t.id}"] .cost`);
    await cell.waitFor();
    assert.equal(await cell.textContent(), dollars(t.usage.cost_usd));
  }
  await gamma.goto(`${server.baseUrl}/ui#/tasks/${done[0].id}`);
  await gamma.locator("#task-cost", { hasText: dollars(done[0].usage.cost_usd) }).waitFor();
  await gamma.goto(`${server.baseUrl}/ui#/scopes/${scope}`);
  const value = gamma.locator('[data-gauge="Spend"] .gauge-value');
  await value.waitFor();
  const text = await value.textContent();
  const m = text.match(/^\$(0\.\d{4}) \/ \$0\.0100$/);
  assert.ok(m, `spend and limit in dollars, one precision: ${text}`);
  assert.ok(Number(m[1]) > 0, text);
  assert.ok((await gamma.locator('[data-gauge="Spend"] .gauge-note').textContent()).startsWith(`$${m[1]} `), "the note's amount is the gauge's");
  await gamma.screenshot({ path: join(shots, "scope-spend.png"), fullPage: true });
  await gamma.close();
  noPageErrors();
});

test("the models page shows each model's prices, cache writes included", async () => {
  await page.goto(`${server.baseUrl}/ui#/models`);
  const priced = page.locator('tr[data-model="priced"]');
  await priced.waitFor();
  const cells = await priced.locator("td").allTextContents();
  for (const price of ["$2.50", "$10.00", "$1.25", "$3.75"]) assert.ok(cells.includes(price), `${price} in ${cells}`);
  assert.match(await page.locator('tr[data-model="default"]').textContent(), /unpriced/);
  await shot("models-prices");
  noPageErrors();
});

test("a malformed address shows a clear view instead of breaking the page", async () => {
  await page.goto(`${server.baseUrl}/ui#/overview`);
  await page.locator("#page[data-page=overview] .stat").first().waitFor();
  await page.goto(`${server.baseUrl}/ui#/tasks/%E0%A4%A`);
  const view = page.locator("#bad-address");
  await view.waitFor();
  assert.match(await view.textContent(), /not a page of the dashboard or names no valid id/);
  assert.match(await view.textContent(), /%E0%A4%A/);
  noPageErrors();
  // The dashboard still works from there.
  await page.click("#nav a[data-page=tasks]");
  await page.locator("#task-results").waitFor();
  await shot("bad-address");
  noPageErrors();
});

test("the webhooks page lists endpoints and deliveries, and replays a delivery", async () => {
  // Signed in by the tests before it when the file runs whole; alone, it signs in.
  await page.goto(`${server.baseUrl}/ui`);
  if (await page.locator("#key").isVisible()) await signIn(page, ACME_KEY);
  // A name that never resolves: its delivery fails and stays pending, with the reason.
  const endpoint = await api("POST", "/v1/webhooks", { url: "https://hooks.invalid/tollgate", events: ["task.succeeded"] });
  assert.match(endpoint.secret, /^whsec_/);
  const task = await submit(`hook-${run}`);
  await until(task.id, ["succeeded"]);
  await page.goto(`${server.baseUrl}/ui#/webhooks/${encodeURIComponent(endpoint.id)}`);
  await page.locator(`#webhook-endpoints tr[data-webhook="${endpoint.id}"]`).waitFor();
  const rows = page.locator("#webhook-deliveries tr[data-delivery]");
  await rows.first().waitFor();
  assert.equal(await rows.count(), 1);
  assert.match(await rows.first().textContent(), /task\.succeeded/);
  await page.locator("#webhook-deliveries button.replay").first().click();
  await page.waitForFunction(() => document.querySelectorAll("#webhook-deliveries tr[data-delivery]").length === 2);
  const deliveries = await api("GET", `/v1/webhooks/${endpoint.id}/deliveries`);
  assert.equal(deliveries.deliveries.length, 2);
  assert.equal(deliveries.deliveries[0].event_id, deliveries.deliveries[1].event_id, "a replay sends the same event");
  assert.ok(deliveries.deliveries.some((d) => d.replay_of));
  // Another app sees none of it.
  assert.deepEqual((await api("GET", "/v1/webhooks", undefined, BETA_KEY)).webhooks, []);
  await shot("webhooks");
  noPageErrors();
});

test("a chat task shows its conversation, its tools and the tool calls of its answer", async () => {
  // Signed in by the tests before it when the file runs whole; alone, it signs in.
  await page.goto(`${server.baseUrl}/ui`);
  if (await page.locator("#key").isVisible()) await signIn(page, ACME_KEY);
  const t = await api("POST", "/v1/tasks", {
    kind: "chat", scope: `ui-${run}`, effect_key: `chat-${run}`,
    request: {
      messages: [{ role: "system", content: "Be brief." }, { role: "user", content: `Weather in Paris? ${run}` }],
      tools: [{ type: "function", function: { name: "get_weather", description: "The weather in a city",
        parameters: { type: "object", required: ["city"], properties: { city: { type: "string" } } } } }],
      tool_choice: "required",
    },
  });
  await until(t.id, ["succeeded"]);
  await page.goto(`${server.baseUrl}/ui#/tasks/${encodeURIComponent(t.id)}`);
  await page.locator("#chat-view").waitFor();
  const view = await page.locator("#chat-view").textContent();
  for (const text of ["Conversation", "Be brief.", `Weather in Paris? ${run}`, "Tools", "The weather in a city", "tool choice: required"]) {
    assert.ok(view.includes(text), `shows ${text}`);
  }
  // The answer's call: the tool's name and its arguments, parsed and indented.
  const answer = await page.locator("#chat-answer").textContent();
  assert.ok(answer.includes("calls") && answer.includes("get_weather"), answer);
  assert.match(answer, /\{\n  "city": ""\n\}/);
  assert.ok(view.includes("finish reason: tool_calls"));
  noPageErrors();
  await shot("chat-task");
});

test("signing out forgets the key", async () => {
  await page.click("#signout");
  await page.locator("#signin").waitFor({ state: "visible" });
  assert.equal(await page.evaluate(() => sessionStorage.getItem("tollgate.apiKey")), null);
});
