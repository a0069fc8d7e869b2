// The dashboard in a real browser (headless Debian chromium through playwright-core)
// against a real `tollgate serve`: sign-in (and a wrong key's error), tasks appearing
// live, the status filter, a task's detail, a pipeline run's steps, a scope's gauges
// moving after admissions, the CSP. Screenshots go to $CARGO_TARGET_DIR/ui-screenshots.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { ACME_KEY, BETA_KEY, repoRoot, startServer } from "./server.mjs";

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
  page.on("pageerror", (e) => { throw e; });
});

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
  await shot("task");
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

test("signing out forgets the key", async () => {
  await page.click("#signout");
  await page.locator("#signin").waitFor({ state: "visible" });
  assert.equal(await page.evaluate(() => sessionStorage.getItem("tollgate.apiKey")), null);
});
