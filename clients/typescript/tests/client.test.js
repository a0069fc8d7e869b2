// End to end against a real `tollgate serve` (see server.js): every method of the client.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import { join } from "node:path";

import {
  AdmissionError,
  BadRequestError,
  ConflictError,
  ConnectionError,
  ForbiddenError,
  InvalidRequestError,
  NotFoundError,
  RequestTooLargeError,
  Tollgate,
  UnauthorizedError,
  UnavailableError,
  WaitTimeoutError,
  batchItemError,
  verifyWebhook,
} from "../dist/index.js";
import { ACME_KEY, ALICE_KEY, BETA_KEY, MAX_REQUEST_BYTES, repoRoot, startServer } from "./server.js";

let server;
let acme;
let beta;
let alice;
const unique = (prefix) => `${prefix}-${Math.random().toString(36).slice(2, 10)}`;

before(async () => {
  server = await startServer();
  acme = new Tollgate({ baseUrl: server.baseUrl, apiKey: ACME_KEY });
  beta = new Tollgate({ baseUrl: server.baseUrl, apiKey: BETA_KEY });
  alice = new Tollgate({ baseUrl: server.baseUrl, apiKey: ALICE_KEY });
});

after(async () => {
  await server?.stop();
});

describe("discovery and health", () => {
  test("healthz and readyz", async () => {
    assert.deepEqual(await acme.healthz(), { status: "ok" });
    assert.deepEqual(await acme.readyz(), { status: "ready" });
  });

  test("kinds lists every kind with its schemas", async () => {
    const kinds = await acme.kinds();
    assert.deepEqual(kinds.map((k) => k.kind).sort(), ["chat", "classify", "classify_many", "embed", "extract_data", "generate_text"]);
    for (const k of kinds) {
      assert.equal(typeof k.request_schema, "object");
      assert.equal(typeof k.output_schema, "object");
    }
  });

  test("models lists the configured models", async () => {
    const models = await acme.models();
    const ids = models.map((m) => m.id).sort();
    assert.deepEqual(ids, ["default", "slow"]);
    assert.equal(models.find((m) => m.id === "default").default, true);
    assert.equal(models.find((m) => m.id === "default").provider, "dev");
  });

  test("an unknown key is UnauthorizedError", async () => {
    const stranger = new Tollgate({ baseUrl: server.baseUrl, apiKey: "nobody-0123456789abcdef" });
    await assert.rejects(stranger.kinds(), (e) => e instanceof UnauthorizedError && e.status === 401 && e.code === "unauthorized");
  });
});

describe("every kind completes", () => {
  const scope = unique("kinds");

  test("classify", async () => {
    const task = await acme.run(
      {
        kind: "classify",
        scope,
        step: "label-email",
        source: { id: "msg-981", revision: "v1" },
        request: { input: "Win a free cruise!", labels: ["spam", "ham"] },
      },
      { timeoutMs: 20_000 },
    );
    assert.equal(task.status, "succeeded");
    assert.equal(task.kind, "classify");
    assert.ok(["spam", "ham"].includes(task.output.label));
    assert.equal(task.source.id, "msg-981");
  });

  test("generate_text", async () => {
    const task = await acme.run(
      { kind: "generate_text", scope, request: { prompt: "Write a one-line welcome.", max_output_tokens: 50 } },
      { timeoutMs: 20_000 },
    );
    assert.equal(task.status, "succeeded");
    assert.equal(typeof task.output.text, "string");
    assert.ok(task.usage.output_tokens >= 0);
    // A finished task's events: its answer as one delta, then its end.
    const events = [];
    for await (const e of acme.events(task.id)) events.push(e);
    assert.deepEqual(events.map((e) => e.event), ["delta", "end"]);
    assert.equal(events[0].data.text, task.output.text);
    assert.equal(events[1].data.status, "succeeded");
  });

  test("classify_many", async () => {
    const task = await acme.run(
      {
        kind: "classify_many",
        scope,
        request: {
          items: [
            { id: "a", input: "refund please" },
            { id: "b", input: "love it" },
          ],
          labels: ["complaint", "praise"],
        },
      },
      { timeoutMs: 20_000 },
    );
    assert.equal(task.status, "succeeded");
    assert.deepEqual(task.output.results.map((r) => r.id), ["a", "b"]);
    for (const r of task.output.results) assert.ok(["complaint", "praise"].includes(r.label));
  });

  test("extract_data", async () => {
    const task = await acme.run(
      {
        kind: "extract_data",
        scope,
        request: {
          input: "Invoice 88, total 120.50 EUR",
          schema: {
            type: "object",
            required: ["number", "total"],
            properties: { number: { type: "integer" }, total: { type: "number" } },
          },
        },
      },
      { timeoutMs: 20_000 },
    );
    assert.equal(task.status, "succeeded");
    assert.equal(typeof task.output.number, "number");
    assert.equal(typeof task.output.total, "number");
  });

  test("chat with a tool call", async () => {
    /** @type {import("../dist/index.js").KindRequests["chat"]} */
    const request = {
      messages: [{ role: "user", content: "Weather in Paris?" }],
      tools: [
        {
          type: "function",
          function: {
            name: "get_weather",
            parameters: { type: "object", required: ["city"], properties: { city: { type: "string" } } },
          },
        },
      ],
      tool_choice: "required",
    };
    const task = await acme.run({ kind: "chat", scope, request }, { timeoutMs: 20_000 });
    assert.equal(task.status, "succeeded");
    assert.equal(task.output.finish_reason, "tool_calls");
    const [call] = task.output.tool_calls;
    assert.equal(call.function.name, "get_weather");
    assert.equal(typeof JSON.parse(call.function.arguments).city, "string");
  });

  test("embed", async () => {
    const task = await acme.run(
      {
        kind: "embed",
        scope,
        request: { input: ["refund please", { text: "love it", id: "review-7", revision: "v2" }], dimensions: 8 },
      },
      { timeoutMs: 20_000 },
    );
    assert.equal(task.status, "succeeded");
    assert.equal(task.output.dimensions, 8);
    assert.deepEqual(task.output.embeddings.map((v) => v.length), [8, 8]);
  });
});

describe("idempotency", () => {
  test("the same key and request replays the same task", async () => {
    const scope = unique("idem");
    const key = unique("email-label");
    const submission = { kind: "classify", scope, effect_key: key, request: { input: "hello", labels: ["a", "b"] } };
    const first = await acme.submit(submission);
    assert.equal(first.created, true);
    assert.equal(first.effect_key, key);
    const again = await acme.submit(submission);
    assert.equal(again.id, first.id);
    assert.equal(again.created, false);
  });

  test("a different request under the same key is ConflictError", async () => {
    const scope = unique("idem");
    const key = unique("conflict");
    await acme.submit({ kind: "classify", scope, effect_key: key, request: { input: "hello", labels: ["a", "b"] } });
    await assert.rejects(
      acme.submit({ kind: "classify", scope, effect_key: key, request: { input: "changed", labels: ["a", "b"] } }),
      (e) => e instanceof ConflictError && e.status === 409 && e.code === "idempotency_key_conflict" && e.message.includes("request"),
    );
  });

  test("a generated key is kept across the client's retries: a lost answer creates no second task", async () => {
    const scope = unique("retry");
    const keys = [];
    let calls = 0;
    const flaky = async (url, init) => {
      calls += 1;
      keys.push(init.headers["Idempotency-Key"]);
      const response = await fetch(url, init);
      if (calls === 1) throw new TypeError("fetch failed (the answer was lost)");
      return response;
    };
    const client = new Tollgate({ baseUrl: server.baseUrl, apiKey: ACME_KEY, fetch: flaky, retryBaseDelayMs: 10 });
    const task = await client.submit({ kind: "generate_text", scope, request: { prompt: "hi" } });
    assert.equal(calls, 2);
    assert.equal(keys[0], keys[1]);
    assert.equal(task.effect_key, keys[0]);
    // The first attempt created the task; the retry found it.
    assert.equal(task.created, false);
    assert.equal((await acme.getTaskByEffectKey(keys[0])).id, task.id);
  });

  test("a 503 is retried with backoff, then thrown as UnavailableError", async () => {
    let calls = 0;
    const unavailable = async (url, init) => {
      calls += 1;
      if (calls <= 2) {
        return new Response(JSON.stringify({ error: { code: "database_unavailable", message: "down" } }), {
          status: 503,
          headers: { "content-type": "application/json" },
        });
      }
      return fetch(url, init);
    };
    const client = new Tollgate({ baseUrl: server.baseUrl, apiKey: ACME_KEY, fetch: unavailable, retryBaseDelayMs: 10 });
    assert.equal((await client.kinds()).length, 6);
    assert.equal(calls, 3);

    const never = new Tollgate({
      baseUrl: server.baseUrl,
      apiKey: ACME_KEY,
      maxRetries: 1,
      retryBaseDelayMs: 10,
      fetch: async () => new Response(JSON.stringify({ error: { code: "database_unavailable", message: "the database is down" } }), { status: 503 }),
    });
    await assert.rejects(never.models(), (e) => e instanceof UnavailableError && e.code === "database_unavailable" && e.message === "the database is down");
  });

  test("an unreachable server is ConnectionError after the retries", async () => {
    const client = new Tollgate({ baseUrl: "http://127.0.0.1:9", apiKey: ACME_KEY, maxRetries: 2, retryBaseDelayMs: 10 });
    await assert.rejects(client.healthz(), (e) => e instanceof ConnectionError && e.status === 0);
  });
});

describe("admission", () => {
  const tight = (scope, n) => ({
    kind: "classify",
    scope,
    budget: "tight",
    source: { id: `doc-${n}`, revision: "v1" },
    request: { input: `document ${n}`, labels: ["a", "b"] },
  });

  test("a tight budget refuses with AdmissionError and retry_after; opt-in retry succeeds after the refill", async () => {
    const scope = unique("tight");
    await acme.submit(tight(scope, 1));
    const refusal = await acme.submit(tight(scope, 2)).then(
      () => assert.fail("the second task should be refused"),
      (e) => e,
    );
    assert.ok(refusal instanceof AdmissionError, `got ${refusal}`);
    assert.equal(refusal.status, 429);
    assert.equal(refusal.code, "WORKFLOW_AI_RATE_LIMIT");
    assert.ok(refusal.retryAfter >= 1, `retryAfter ${refusal.retryAfter}`);

    // Within a deadline shorter than Retry-After the refusal is thrown at once.
    const started = Date.now();
    await assert.rejects(acme.submit(tight(scope, 3), { retryAdmission: true, deadlineMs: 200 }), AdmissionError);
    assert.ok(Date.now() - started < 1000);

    // Opted in: waits for the next token and succeeds, under one key.
    const key = unique("after-refill");
    const task = await acme.submit({ ...tight(scope, 4), effect_key: key }, { retryAdmission: true, deadlineMs: 10_000 });
    assert.equal(task.effect_key, key);
    assert.equal(task.created, true);
    assert.equal((await acme.getTaskByEffectKey(key)).id, task.id);
  });

  test("retryAdmission can be the client's default", async () => {
    const scope = unique("tight");
    const patient = new Tollgate({ baseUrl: server.baseUrl, apiKey: ACME_KEY, retryAdmission: true, deadlineMs: 10_000 });
    const a = await patient.submit(tight(scope, 1));
    const b = await patient.submit(tight(scope, 2));
    assert.notEqual(a.id, b.id);
  });
});

describe("waiting and cancellation", () => {
  test("wait times out cleanly with WaitTimeoutError; the task goes on; cancel cancels it", async () => {
    const scope = unique("slow");
    const task = await acme.submit({ kind: "generate_text", scope, model: "slow", request: { prompt: "take your time" } });
    const started = Date.now();
    const timeout = await acme.wait(task, { timeoutMs: 1200 }).then(
      () => assert.fail("a 30 s task cannot finish in 1.2 s"),
      (e) => e,
    );
    const elapsed = Date.now() - started;
    assert.ok(timeout instanceof WaitTimeoutError, `got ${timeout}`);
    assert.ok(elapsed >= 1100 && elapsed < 5000, `waited ${elapsed} ms`);
    assert.equal(timeout.last.id, task.id);
    assert.ok(["queued", "running"].includes(timeout.last.status));

    // Aborting the caller's wait stops the wait, not the task.
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 300);
    await assert.rejects(acme.wait(task.id, { signal: controller.signal }), (e) => e.name === "AbortError");
    assert.ok(["queued", "running"].includes((await acme.getTask(task.id)).status));

    const canceled = await acme.cancel(task.id);
    assert.equal(canceled.status, "canceled");
    assert.equal(canceled.error.code, "WORKFLOW_AI_CANCELED");
    assert.equal((await acme.wait(task.id, { timeoutMs: 5000 })).status, "canceled");
  });

  test("wait returns a finished task, looping over long-polls", async () => {
    const scope = unique("wait");
    const task = await acme.submit({ kind: "generate_text", scope, request: { prompt: "quick" } });
    const done = await acme.wait(task, { timeoutMs: 20_000 });
    assert.equal(done.status, "succeeded");
    assert.equal(done.id, task.id);
    assert.equal((await acme.getTask(task.id, { waitMs: 1000 })).status, "succeeded");
  });
});

describe("tasks: batch, reads, release, scopes", () => {
  test("batch: each item admitted or refused on its own", async () => {
    const scope = unique("batch");
    const answer = await acme.submitBatch([
      { kind: "classify", scope, request: { input: "one", labels: ["x", "y"] } },
      { kind: "generate_text", scope, effect_key: "batch-own-key-" + scope, request: { prompt: "two" } },
      { kind: "classify", scope, request: { input: "three", labels: [] } },
    ]);
    assert.deepEqual(answer.results.map((r) => r.status), [201, 201, 422]);
    assert.equal(answer.results[1].task.effect_key, "batch-own-key-" + scope);
    assert.equal(batchItemError(answer.results[0]), undefined);
    const error = batchItemError(answer.results[2]);
    assert.ok(error instanceof InvalidRequestError);
    assert.equal(error.code, "invalid_request");
    const done = await acme.wait(answer.results[0].task, { timeoutMs: 20_000 });
    assert.equal(done.status, "succeeded");
  });

  test("get, get by effect key, release, unreleased sources and owner deletion", async () => {
    const scope = unique("scope");
    const tasks = [];
    for (const source of ["s1", "s2", "s3"]) {
      tasks.push(
        await acme.run(
          { kind: "classify", scope, effect_key: `${scope}-${source}`, source: { id: source, revision: "v1" }, request: { input: source, labels: ["p", "q"] } },
          { timeoutMs: 20_000 },
        ),
      );
    }
    assert.equal((await acme.getTask(tasks[0].id)).effect_key, `${scope}-s1`);
    assert.equal((await acme.getTaskByEffectKey(`${scope}-s2`)).id, tasks[1].id);

    const page = await acme.unreleasedSources(scope);
    assert.deepEqual(page.sources.map((s) => s.source), ["s1", "s2", "s3"]);
    assert.deepEqual(await acme.release({ effect_key: `${scope}-s1`, scope }), { released: true });
    const all = [];
    for await (const s of acme.allUnreleasedSources(scope)) all.push(s.source);
    assert.deepEqual(all, ["s2", "s3"]);
    await assert.rejects(acme.release({ effect_key: "no-such-key", scope }), NotFoundError);

    assert.deepEqual(await acme.deleteOwnerData(scope, { source: "s2" }), { deleted: 1 });
    await assert.rejects(acme.getTask(tasks[1].id), NotFoundError);
    assert.deepEqual(await acme.deleteOwnerData(scope), { deleted: 2 });
    await assert.rejects(acme.getTaskByEffectKey(`${scope}-s3`), (e) => e instanceof NotFoundError && e.code === "not_found");
  });

  test("422 and 413 are distinct classes carrying the server's message", async () => {
    const scope = unique("bad");
    await assert.rejects(
      acme.submit({ kind: "classify", scope, model: "nope", request: { input: "x", labels: ["a"] } }),
      (e) => e instanceof InvalidRequestError && e.status === 422 && e.code === "unknown_model" && e.message.length > 0,
    );
    await assert.rejects(
      acme.submit({ kind: "summarize", scope, request: {} }),
      (e) => e instanceof InvalidRequestError && e.code === "invalid_request" && e.message.includes("summarize"),
    );
    await assert.rejects(
      acme.submit({ kind: "generate_text", scope, request: { prompt: "x".repeat(MAX_REQUEST_BYTES + 10) } }),
      (e) => e instanceof RequestTooLargeError && e.status === 413 && e.code === "request_too_large",
    );
  });
});

describe("runs and pipelines", () => {
  test("a workflow run: create, get, cancel", async () => {
    const scope = unique("run");
    const run = await acme.createRun({ scope, input: { order: 7 } });
    assert.equal(run.scope, scope);
    assert.deepEqual(run.input, { order: 7 });
    const child = await acme.submit({ kind: "generate_text", run_id: run.id, model: "slow", request: { prompt: "in a run" } });
    assert.equal(child.run_id, run.id);
    assert.equal((await acme.getRun(run.id)).id, run.id);
    const canceled = await acme.cancelRun(run.id);
    assert.equal(canceled.state, "canceled");
    assert.equal((await acme.waitRun(run.id, { timeoutMs: 5000 })).state, "canceled");
    assert.equal((await acme.wait(child.id, { timeoutMs: 5000 })).status, "canceled");
  });

  test("the invoice pipeline: register, get, start once per key, run to the end", async () => {
    const file = JSON.parse(readFileSync(join(repoRoot, "docs/examples/invoice-pipeline.json"), "utf8"));
    const registered = await acme.registerPipeline(file);
    assert.equal(registered.name, "invoice");
    const again = await acme.registerPipeline(file.name, file.definition);
    assert.equal(again.version, registered.version);
    assert.equal(again.created, false);
    const read = await acme.getPipeline("invoice");
    assert.equal(read.version, registered.version);
    assert.equal((await acme.getPipeline("invoice", { version: registered.version })).version, registered.version);

    const scope = unique("pipe");
    const input = { invoice_id: "inv-117", revision: "v1", text: "INVOICE 2026-117 from Nimbus Cloud GmbH. Total due: 1,234.50 EUR." };
    const key = unique("inv-117-intake");
    const run = await acme.startPipeline("invoice", { scope, input, idempotencyKey: key });
    assert.equal(run.pipeline.name, "invoice");
    const replay = await acme.startPipeline("invoice", { scope, input, idempotencyKey: key });
    assert.equal(replay.id, run.id);
    await assert.rejects(acme.startPipeline("invoice", { scope, input: { ...input, revision: "v2" }, idempotencyKey: key }), ConflictError);

    const done = await acme.waitRun(run, { timeoutMs: 30_000 });
    assert.equal(done.state, "succeeded", JSON.stringify(done));
    assert.deepEqual(Object.keys(done.output).sort(), ["category", "currency", "summary", "total", "vendor"]);
    assert.deepEqual(done.pipeline.steps.map((s) => [s.key, s.status]), [
      ["extract", "succeeded"],
      ["category", "succeeded"],
      ["summary", "succeeded"],
    ]);

    const waited = await acme.startPipeline("invoice", { scope: unique("pipe"), input, waitMs: 20_000 });
    assert.equal(waited.state, "succeeded");

    await assert.rejects(acme.getPipeline("no-such-pipeline"), NotFoundError);
    await assert.rejects(
      acme.startPipeline("invoice", { scope, input: { text: "no id" } }),
      (e) => e instanceof InvalidRequestError && e.message.includes("invoice_id"),
    );
  });
});

describe("listings, scopes, usage and stats", () => {
  const ids = (items) => items.map((item) => item.id);
  const collect = async (iterable) => {
    const items = [];
    for await (const item of iterable) items.push(item);
    return items;
  };

  test("tasks: pages, filters, the iterator, another app's and a subject's view", async () => {
    const scope = unique("list");
    const before = new Date(Date.now() - 1000);
    const done = [];
    for (const source of ["s1", "s2", "s3"]) {
      done.push(
        await acme.run(
          { kind: "classify", scope, step: "label", source: { id: source, revision: "v1" }, request: { input: source, labels: ["p", "q"] } },
          { timeoutMs: 20_000 },
        ),
      );
    }
    const text = await acme.run({ kind: "generate_text", scope, request: { prompt: "hello" } }, { timeoutMs: 20_000 });
    const newestFirst = [text.id, ...ids(done).reverse()];

    const first = await acme.listTasks({ scope, limit: 3 });
    assert.deepEqual(ids(first.tasks), newestFirst.slice(0, 3));
    assert.equal(typeof first.next, "string");
    const second = await acme.listTasks({ scope, limit: 3, next: first.next });
    assert.deepEqual(ids(second.tasks), newestFirst.slice(3));
    assert.equal(second.next, undefined);
    assert.deepEqual(ids(await collect(acme.allTasks({ scope, limit: 1 }))), newestFirst);

    assert.deepEqual(ids((await acme.listTasks({ scope, kind: "classify", step: "label" })).tasks), newestFirst.slice(1));
    assert.deepEqual(ids((await acme.listTasks({ scope, source: "s2" })).tasks), [done[1].id]);
    assert.deepEqual((await acme.listTasks({ scope, status: ["queued", "running"] })).tasks, []);
    assert.equal((await acme.listTasks({ scope, status: "succeeded" })).tasks.length, 4);
    assert.equal((await acme.listTasks({ scope, created_after: before, created_before: new Date(Date.now() + 60_000) })).tasks.length, 4);
    assert.deepEqual((await acme.listTasks({ scope, created_after: new Date(Date.now() + 60_000) })).tasks, []);

    await assert.rejects(acme.listTasks({ scope, limit: 0 }), (e) => e instanceof BadRequestError && e.status === 400 && e.code === "malformed_request");
    await assert.rejects(acme.listTasks({ next: "not-a-cursor" }), BadRequestError);
    assert.deepEqual((await beta.listTasks({ scope })).tasks, []);

    const mine = await alice.submit({ kind: "generate_text", scope, request: { prompt: "alice's" } });
    assert.deepEqual(ids((await alice.listTasks({ scope })).tasks), [mine.id]);
    assert.equal((await acme.listTasks({ scope })).tasks.length, 5);
  });

  test("runs and pipelines: pages, filters and iterators", async () => {
    const scope = unique("list-runs");
    const plain = await acme.createRun({ scope, input: { n: 1 } });
    const other = await acme.createRun({ scope, input: { n: 2 } });
    await acme.cancelRun(other.id);
    const file = JSON.parse(readFileSync(join(repoRoot, "docs/examples/invoice-pipeline.json"), "utf8"));
    const name = unique("invoice-list");
    const registered = await acme.registerPipeline(name, file.definition);
    const piped = await acme.startPipeline(name, {
      scope,
      input: { invoice_id: "inv-9", revision: "v1", text: "INVOICE 9 from Nimbus. Total due: 10.00 EUR." },
      waitMs: 20_000,
    });

    const runs = await acme.listRuns({ scope });
    assert.deepEqual(ids(runs.runs), [piped.id, other.id, plain.id]);
    assert.equal(runs.next, undefined);
    assert.deepEqual(runs.runs[0].pipeline, { name, version: registered.version });
    assert.equal(runs.runs[2].pipeline, null);
    assert.deepEqual(ids((await acme.listRuns({ scope, state: "canceled" })).runs), [other.id]);
    assert.deepEqual(ids((await acme.listRuns({ scope, state: ["running", "waiting"] })).runs), [plain.id]);
    assert.deepEqual(ids((await acme.listRuns({ scope, pipeline: name })).runs), [piped.id]);
    const page = await acme.listRuns({ scope, limit: 2 });
    assert.equal(page.runs.length, 2);
    assert.equal(typeof page.next, "string");
    assert.deepEqual(ids(await collect(acme.allRuns({ scope, limit: 1 }))), [piped.id, other.id, plain.id]);
    assert.deepEqual((await beta.listRuns({ scope })).runs, []);

    const second = unique("invoice-list");
    await acme.registerPipeline(second, file.definition);
    const pipelines = await collect(acme.allPipelines({ limit: 1 }));
    const names = pipelines.map((p) => p.name);
    assert.deepEqual(names, [...names].sort(), "name order");
    assert.ok(names.includes(name) && names.includes(second), names.join(", "));
    assert.deepEqual(
      pipelines.find((p) => p.name === name).versions.map((v) => v.version),
      [registered.version],
    );
    const onePage = await acme.listPipelines({ limit: 1 });
    assert.equal(onePage.pipelines.length, 1);
    assert.equal(typeof onePage.next, "string");
    assert.ok(!(await collect(beta.allPipelines())).some((p) => p.name === name));
  });

  test("scopes, usage and stats; a subject-bound key is ForbiddenError", async () => {
    const scope = unique("scope-state");
    await acme.run({ kind: "classify", scope, source: { id: "a", revision: "v1" }, request: { input: "a", labels: ["p", "q"] } }, { timeoutMs: 20_000 });
    await acme.run({ kind: "classify", scope, source: { id: "b", revision: "v1" }, request: { input: "b", labels: ["p", "q"] } }, { timeoutMs: 20_000 });

    const state = await acme.getScope(scope);
    assert.equal(state.scope, scope);
    assert.equal(state.policy.name, "standard");
    assert.equal(state.admissions_in_window, 2);
    assert.equal(state.sources_in_window, 2);
    assert.equal(state.active, 0);
    const quiet = await acme.getScope(unique("quiet"));
    assert.equal(quiet.admissions_in_window, 0);
    assert.equal(quiet.bucket_tokens, quiet.policy.burst);
    assert.equal((await beta.getScope(scope)).admissions_in_window, 0);

    const scopes = await collect(acme.allScopes({ limit: 2 }));
    assert.ok(scopes.some((s) => s.scope === scope && s.admissions_in_window === 2));
    const names = scopes.map((s) => s.scope);
    assert.deepEqual(names, [...names].sort(), "name order");
    assert.ok((await acme.listScopes({ limit: 1 })).scopes.length === 1);
    assert.ok(!(await collect(beta.allScopes())).some((s) => s.scope === scope));

    const scoped = await acme.scopeUsage(scope);
    assert.equal(scoped.scope, scope);
    for (const field of ["settled_usd", "reserved_usd", "overrun_usd", "saved_usd"]) assert.equal(typeof scoped[field], "number", field);
    assert.equal(scoped.reserved_tokens, 0);
    const whole = await acme.usage();
    assert.equal(whole.scope ?? null, null);
    assert.ok(whole.settled_tokens >= scoped.settled_tokens);

    const stats = await acme.stats();
    assert.equal(stats.source, "database");
    assert.equal(stats.window_seconds, 3600);
    assert.ok(stats.succeeded >= 2, `succeeded ${stats.succeeded}`);
    assert.ok(Array.isArray(stats.failures_by_code));

    for (const call of [() => alice.getScope(scope), () => alice.listScopes(), () => alice.scopeUsage(scope), () => alice.usage(), () => alice.stats()]) {
      await assert.rejects(call(), (e) => e instanceof ForbiddenError && e.status === 403 && e.code === "subject_not_allowed");
    }
  });
});

describe("tenancy", () => {
  test("another app's key gets NotFoundError for tasks, runs and pipelines", async () => {
    const scope = unique("tenant");
    const key = unique("acme-only");
    const task = await acme.submit({ kind: "generate_text", scope, effect_key: key, request: { prompt: "private" } });
    const run = await acme.createRun({ scope });
    await acme.registerPipeline(JSON.parse(readFileSync(join(repoRoot, "docs/examples/invoice-pipeline.json"), "utf8")));

    await assert.rejects(beta.getTask(task.id), (e) => e instanceof NotFoundError && e.status === 404);
    await assert.rejects(beta.getTaskByEffectKey(key), NotFoundError);
    await assert.rejects(beta.wait(task.id, { timeoutMs: 1000 }), NotFoundError);
    await assert.rejects(beta.cancel(task.id), NotFoundError);
    await assert.rejects(beta.release({ effect_key: key, scope }), NotFoundError);
    await assert.rejects(beta.getRun(run.id), NotFoundError);
    await assert.rejects(beta.cancelRun(run.id), NotFoundError);
    await assert.rejects(beta.getPipeline("invoice"), NotFoundError);
    assert.deepEqual(await beta.deleteOwnerData(scope), { deleted: 0 });
    assert.equal((await acme.getTask(task.id)).id, task.id);
  });
});

/** A webhook receiver on 127.0.0.1: answers 200 and keeps each request's headers and raw body. */
async function startReceiver() {
  const received = [];
  const waiters = [];
  const http = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      received.push({ headers: req.headers, body: Buffer.concat(chunks).toString("utf8") });
      res.writeHead(200).end();
      for (const w of waiters.splice(0)) w();
    });
  });
  await new Promise((r) => http.listen(0, "127.0.0.1", r));
  /** Resolves to the received requests once `pred` holds of them (10 s at most). */
  async function until(pred) {
    const deadline = Date.now() + 10_000;
    while (!pred(received)) {
      if (Date.now() > deadline) throw new Error(`receiver: condition not met, got ${received.length} requests`);
      await new Promise((r) => {
        waiters.push(r);
        setTimeout(r, 200);
      });
    }
    return received;
  }
  return { url: `http://127.0.0.1:${http.address().port}/hook`, until, close: () => new Promise((r) => http.close(r)) };
}

async function deliveryOf(client, endpoint, eventId, pred) {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const found = (await client.listDeliveries(endpoint)).filter((d) => d.event_id === eventId);
    if (pred(found)) return found;
    if (Date.now() > deadline) throw new Error(`deliveries of ${eventId}: ${JSON.stringify(found)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe("webhooks", () => {
  test("create, get, list, update, delete; a subject's key and another app's get errors", async () => {
    const created = await acme.createWebhook({ url: "http://127.0.0.1:9/crud", events: ["run.finished"], description: "crud" });
    assert.match(created.id, /^whe_/);
    assert.match(created.secret, /^whsec_/);
    assert.deepEqual(created.events, ["run.finished"]);
    assert.equal(created.enabled, true);
    assert.equal(created.from_config, false);

    const read = await acme.getWebhook(created.id);
    assert.equal(read.secret, created.secret);
    const listed = (await acme.listWebhooks()).find((w) => w.id === created.id);
    assert.equal(listed.url, "http://127.0.0.1:9/crud");
    assert.equal(listed.secret, undefined, "listings carry no secrets");

    const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const updated = await acme.updateWebhook(created.id, { enabled: false, events: ["task.failed", "task.canceled"], description: null, secret });
    assert.equal(updated.enabled, false);
    assert.deepEqual([...updated.events].sort(), ["task.canceled", "task.failed"]);
    assert.equal(updated.description, null);
    assert.equal((await acme.getWebhook(created.id)).secret, secret);
    assert.equal((await acme.updateWebhook(created.id, { url: "http://127.0.0.1:9/other" })).url, "http://127.0.0.1:9/other");
    assert.deepEqual(await acme.listDeliveries(created.id, { state: "pending", limit: 10 }), []);

    await assert.rejects(acme.createWebhook({ url: "https://10.0.0.1/x", events: ["task.failed"] }), InvalidRequestError);
    await assert.rejects(acme.createWebhook({ url: "https://hooks.example.com/x", events: [] }), InvalidRequestError);
    await assert.rejects(acme.updateWebhook(created.id, { secret: "whsec_c2hvcnQ=" }), InvalidRequestError);
    await assert.rejects(beta.getWebhook(created.id), (e) => e instanceof NotFoundError && e.status === 404);
    await assert.rejects(beta.updateWebhook(created.id, { enabled: true }), NotFoundError);
    await assert.rejects(beta.deleteWebhook(created.id), NotFoundError);
    await assert.rejects(beta.listDeliveries(created.id), NotFoundError);
    assert.ok(!(await beta.listWebhooks()).some((w) => w.id === created.id));
    await assert.rejects(alice.listWebhooks(), (e) => e instanceof ForbiddenError && e.status === 403);
    await assert.rejects(alice.createWebhook({ url: "https://hooks.example.com/x", events: ["task.failed"] }), ForbiddenError);

    assert.equal(await acme.deleteWebhook(created.id), undefined);
    await assert.rejects(acme.getWebhook(created.id), NotFoundError);
    await assert.rejects(acme.deleteWebhook(created.id), NotFoundError);
    assert.ok(!(await acme.listWebhooks()).some((w) => w.id === created.id));
  });

  test("a finished task is delivered signed, listed as delivered, and replayed", async () => {
    const receiver = await startReceiver();
    try {
      const endpoint = await acme.createWebhook({ url: receiver.url, events: ["task.succeeded"] });
      const task = await acme.run(
        { kind: "classify", scope: unique("hooks"), request: { input: "Win a free cruise!", labels: ["spam", "ham"] } },
        { timeoutMs: 30_000 },
      );
      assert.equal(task.status, "succeeded");
      const eventId = `evt_${task.id}`;
      const ofTask = (rs) => rs.filter((r) => r.headers["webhook-id"] === eventId);

      const [first] = ofTask(await receiver.until((rs) => ofTask(rs).length >= 1));
      const event = await verifyWebhook(endpoint.secret, first.headers, first.body);
      assert.equal(event.type, "task.succeeded");
      assert.equal(event.id, eventId);
      assert.equal(event.data.task_id, task.id);

      const [delivered] = await deliveryOf(acme, endpoint.id, eventId, (ds) => ds.some((d) => d.state === "delivered"));
      assert.equal(delivered.endpoint_id, endpoint.id);
      assert.equal(delivered.event_type, "task.succeeded");
      assert.equal(delivered.response_code, 200);
      assert.ok(delivered.attempts >= 1);
      assert.equal(delivered.replay_of, null);
      assert.ok((await acme.listDeliveries(endpoint.id, { state: "delivered" })).some((d) => d.id === delivered.id));
      assert.ok(!(await acme.listDeliveries(endpoint.id, { state: "dead" })).some((d) => d.id === delivered.id));

      const replay = await acme.replayDelivery(endpoint.id, delivered.id);
      assert.notEqual(replay.id, delivered.id);
      assert.equal(replay.replay_of, delivered.id);
      assert.equal(replay.event_id, eventId);
      assert.equal(replay.state, "pending");
      const again = ofTask(await receiver.until((rs) => ofTask(rs).length >= 2));
      assert.equal(again[1].body, first.body, "a replay sends the same event");
      await verifyWebhook(endpoint.secret, again[1].headers, again[1].body);
      await deliveryOf(acme, endpoint.id, eventId, (ds) => ds.some((d) => d.id === replay.id && d.state === "delivered"));

      await assert.rejects(acme.replayDelivery(endpoint.id, "no-such-delivery"), NotFoundError);
      await assert.rejects(beta.replayDelivery(endpoint.id, delivered.id), NotFoundError);
      await acme.deleteWebhook(endpoint.id);
    } finally {
      await receiver.close();
    }
  });
});
