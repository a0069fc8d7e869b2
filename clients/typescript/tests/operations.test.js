// The client covers every operation of the server's OpenAPI document (clients/openapi.json,
// which CI checks is fresh against the live server): src/operations.ts maps each operation
// to the methods that call it, checked here both ways, and each method is called against a
// recording fetch to see that it sends the method and path its entry says.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";

import { OPERATIONS, ROUTES_OUTSIDE_OPENAPI, Tollgate } from "../dist/index.js";
import { repoRoot } from "./server.js";

const HTTP_METHODS = ["get", "put", "post", "delete", "patch", "head", "options", "trace"];
const document = JSON.parse(readFileSync(join(repoRoot, "clients/openapi.json"), "utf8"));
const documented = Object.entries(document.paths).flatMap(([path, item]) =>
  HTTP_METHODS.filter((m) => item[m]).map((m) => `${m.toUpperCase()} ${path}`),
);
const ROUTES = { ...OPERATIONS, ...Object.fromEntries(Object.entries(ROUTES_OUTSIDE_OPENAPI).map(([r, e]) => [r, e.methods])) };

describe("the operation table", () => {
  test("clients/openapi.json has operations to check", () => {
    assert.ok(documented.length >= 20, `only ${documented.length} operations read`);
  });

  test("every documented operation has a client method", () => {
    const missing = documented.filter((op) => !(op in OPERATIONS));
    assert.deepEqual(missing, [], "operations of clients/openapi.json without an entry in src/operations.ts");
    for (const op of documented) assert.ok(OPERATIONS[op].length > 0, `${op} names no method`);
  });

  test("the table names no operation the document lacks", () => {
    const unknown = Object.keys(OPERATIONS).filter((op) => !documented.includes(op));
    assert.deepEqual(unknown, [], "entries of src/operations.ts that clients/openapi.json does not have");
  });

  test("the routes outside the document are not in it, and each says why", () => {
    for (const [route, entry] of Object.entries(ROUTES_OUTSIDE_OPENAPI)) {
      assert.ok(!documented.includes(route), `${route} is in clients/openapi.json now: move it to OPERATIONS`);
      assert.ok(entry.reason.length > 0);
    }
  });

  test("every named method is a method of Tollgate", () => {
    for (const [route, methods] of Object.entries(ROUTES)) {
      for (const name of methods) assert.equal(typeof Tollgate.prototype[name], "function", `${route}: ${name}`);
    }
  });
});

// ---- each method sends its route ----

/** `"GET /v1/tasks/{id}"` → a matcher of a request's method and (encoded) path. */
function matcher(route) {
  const [method, template] = route.split(" ");
  const pattern = template.replace(/[.*+?^$()|[\]\\]/g, "\\$&").replace(/\{[^}]+\}/g, "[^/]+");
  return { route, method, regex: new RegExp(`^${pattern}$`), literal: !template.includes("{") };
}
const MATCHERS = Object.keys(ROUTES).map(matcher);

/** The table's route of a request: a literal path wins over a template (`/v1/tasks/batch`). */
function routeOf(method, path) {
  const hits = MATCHERS.filter((m) => m.method === method && m.regex.test(path));
  return (hits.find((m) => m.literal) ?? hits[0])?.route;
}

const TASK = { id: "t-1", kind: "classify", status: "succeeded", created: true };
const RUN = { id: "r-1", state: "succeeded", scope: "s" };

/** A plausible answer of each route, enough for the client to finish the call. */
function answerFor(route) {
  switch (route) {
    case "GET /v1/tasks":
      return { tasks: [TASK] };
    case "GET /v1/runs":
      return { runs: [] };
    case "GET /v1/pipelines":
      return { pipelines: [] };
    case "GET /v1/scopes":
      return { scopes: [] };
    case "GET /v1/scopes/{scope}/unreleased-sources":
      return { sources: [] };
    case "POST /v1/tasks/batch":
      return { results: [] };
    case "GET /v1/kinds":
      return { kinds: [] };
    case "GET /v1/models":
      return { models: [] };
    case "GET /v1/webhooks":
      return { webhooks: [] };
    case "GET /v1/webhooks/{id}/deliveries":
      return { deliveries: [] };
    case "POST /v1/runs":
    case "GET /v1/runs/{id}":
    case "POST /v1/runs/{id}/cancel":
    case "POST /v1/pipelines/{name}/runs":
      return RUN;
    default:
      return route?.includes("/v1/tasks") ? TASK : { status: "ok" };
  }
}

async function drain(iterable) {
  const items = [];
  for await (const item of iterable) items.push(item);
  return items;
}

const classify = { kind: "classify", scope: "s", request: { input: "x", labels: ["a", "b"] } };

/** One call of every method the table names. */
const CALLS = {
  submit: (c) => c.submit(classify),
  run: (c) => c.run(classify, { timeoutMs: 1000 }),
  submitBatch: (c) => c.submitBatch([classify]),
  listTasks: (c) => c.listTasks({ scope: "s", status: ["queued", "running"], created_after: new Date(0), limit: 10 }),
  allTasks: (c) => drain(c.allTasks({ scope: "s" })),
  getTaskByEffectKey: (c) => c.getTaskByEffectKey("k/1"),
  getTask: (c) => c.getTask("t/1"),
  wait: (c) => c.wait("t-1", { timeoutMs: 1000 }),
  cancel: (c) => c.cancel("t-1"),
  events: (c) => drain(c.events("t-1")),
  release: (c) => c.release({ effect_key: "k", scope: "s" }),
  listScopes: (c) => c.listScopes({ limit: 5 }),
  allScopes: (c) => drain(c.allScopes()),
  getScope: (c) => c.getScope("team/a"),
  scopeUsage: (c) => c.scopeUsage("team/a"),
  unreleasedSources: (c) => c.unreleasedSources("team/a"),
  allUnreleasedSources: (c) => drain(c.allUnreleasedSources("s")),
  deleteOwnerData: (c) => c.deleteOwnerData("s", { source: "src" }),
  createRun: (c) => c.createRun({ scope: "s" }),
  listRuns: (c) => c.listRuns({ state: ["running", "waiting"], pipeline: "invoice" }),
  allRuns: (c) => drain(c.allRuns()),
  getRun: (c) => c.getRun("r-1"),
  waitRun: (c) => c.waitRun("r-1", { timeoutMs: 1000 }),
  cancelRun: (c) => c.cancelRun("r-1"),
  registerPipeline: (c) => c.registerPipeline("p", { steps: [] }),
  listPipelines: (c) => c.listPipelines(),
  allPipelines: (c) => drain(c.allPipelines()),
  getPipeline: (c) => c.getPipeline("p"),
  startPipeline: (c) => c.startPipeline("p", { scope: "s" }),
  createWebhook: (c) => c.createWebhook({ url: "https://hooks.example.com/t", events: ["task.succeeded"] }),
  listWebhooks: (c) => c.listWebhooks(),
  getWebhook: (c) => c.getWebhook("whe_1"),
  updateWebhook: (c) => c.updateWebhook("whe_1", { enabled: false }),
  deleteWebhook: (c) => c.deleteWebhook("whe_1"),
  listDeliveries: (c) => c.listDeliveries("whe_1", { state: "dead", limit: 5 }),
  replayDelivery: (c) => c.replayDelivery("whe_1", "d/1"),
  kinds: (c) => c.kinds(),
  models: (c) => c.models(),
  usage: (c) => c.usage(),
  stats: (c) => c.stats(),
  healthz: (c) => c.healthz(),
  readyz: (c) => c.readyz(),
};

function recordingClient() {
  const seen = [];
  const fetch = async (url, init) => {
    const { pathname } = new URL(url);
    const route = routeOf(init.method, pathname);
    seen.push({ method: init.method, path: pathname, route });
    return new Response(JSON.stringify(answerFor(route)), { status: 200, headers: { "content-type": "application/json" } });
  };
  return { client: new Tollgate({ baseUrl: "http://tollgate.invalid", apiKey: "k", fetch, maxRetries: 0 }), seen };
}

describe("each method sends its operation", () => {
  for (const [route, methods] of Object.entries(ROUTES)) {
    for (const name of methods) {
      test(`${name} → ${route}`, async () => {
        const call = CALLS[name];
        assert.ok(call, `add a sample call of ${name} to CALLS in tests/operations.test.js`);
        const { client, seen } = recordingClient();
        await call(client);
        assert.ok(seen.length > 0, `${name} sent nothing`);
        for (const request of seen) assert.ok(request.route, `${name} sent ${request.method} ${request.path}, which is no known route`);
        assert.ok(
          seen.some((request) => request.route === route),
          `${name} sent ${seen.map((r) => `${r.method} ${r.path}`).join(", ")}, not ${route}`,
        );
      });
    }
  }

  test("path segments are encoded: a scope with a slash stays one segment", async () => {
    const { client, seen } = recordingClient();
    await client.getScope("team/a");
    assert.deepEqual(seen.map((r) => r.path), ["/v1/scopes/team%2Fa"]);
  });

  test("listing filters go in the query as the server reads them", async () => {
    const urls = [];
    const client = new Tollgate({
      baseUrl: "http://tollgate.invalid",
      fetch: async (url) => {
        urls.push(new URL(url));
        return new Response(JSON.stringify({ tasks: [], runs: [] }), { status: 200 });
      },
    });
    await client.listTasks({ scope: "s", status: ["queued", "running"], kind: "classify", created_after: new Date(Date.UTC(2026, 0, 2)), limit: 7, next: "c" });
    assert.deepEqual(Object.fromEntries(urls[0].searchParams), {
      scope: "s",
      status: "queued,running",
      kind: "classify",
      created_after: "2026-01-02T00:00:00.000Z",
      limit: "7",
      next: "c",
    });
    await client.listRuns({ state: "waiting" });
    assert.deepEqual(Object.fromEntries(urls[1].searchParams), { state: "waiting" });
  });
});
