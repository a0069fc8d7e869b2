import type { Tollgate } from "./index.js";

type Method = keyof Tollgate;

/**
 * Every operation of the server's `/openapi.json` (`clients/openapi.json`), as
 * `"METHOD /path"`, with the client methods that call it. tests/operations.test.js checks it
 * both ways against the committed document — no operation missing, none unknown — and calls
 * each method to see that it sends that method and path, so a new route cannot go without
 * a method. The compiler checks that each name is a method of `Tollgate`.
 */
export const OPERATIONS = {
  // tasks
  "POST /v1/tasks": ["submit", "run"],
  "POST /v1/tasks/batch": ["submitBatch"],
  "GET /v1/tasks": ["listTasks", "allTasks", "getTaskByEffectKey"],
  "GET /v1/tasks/{id}": ["getTask", "wait"],
  "POST /v1/tasks/{id}/cancel": ["cancel"],
  "GET /v1/tasks/{id}/events": ["events"],
  "POST /v1/tasks/release": ["release"],
  // scopes
  "GET /v1/scopes": ["listScopes", "allScopes"],
  "GET /v1/scopes/{scope}": ["getScope"],
  "GET /v1/scopes/{scope}/usage": ["scopeUsage"],
  "GET /v1/scopes/{scope}/unreleased-sources": ["unreleasedSources", "allUnreleasedSources"],
  "DELETE /v1/scopes/{scope}/tasks": ["deleteOwnerData"],
  // runs
  "POST /v1/runs": ["createRun"],
  "GET /v1/runs": ["listRuns", "allRuns"],
  "GET /v1/runs/{id}": ["getRun", "waitRun"],
  "POST /v1/runs/{id}/cancel": ["cancelRun"],
  // pipelines
  "POST /v1/pipelines": ["registerPipeline"],
  "GET /v1/pipelines": ["listPipelines", "allPipelines"],
  "GET /v1/pipelines/{name}": ["getPipeline"],
  "POST /v1/pipelines/{name}/runs": ["startPipeline"],
  // webhooks
  "POST /v1/webhooks": ["createWebhook"],
  "GET /v1/webhooks": ["listWebhooks"],
  "GET /v1/webhooks/{id}": ["getWebhook"],
  "PATCH /v1/webhooks/{id}": ["updateWebhook"],
  "DELETE /v1/webhooks/{id}": ["deleteWebhook"],
  "GET /v1/webhooks/{id}/deliveries": ["listDeliveries"],
  "POST /v1/webhooks/{id}/deliveries/{delivery}/replay": ["replayDelivery"],
  // discovery
  "GET /v1/kinds": ["kinds"],
  "GET /v1/models": ["models"],
  "GET /v1/usage": ["usage"],
  "GET /v1/stats": ["stats"],
} as const satisfies Record<string, readonly Method[]>;

/**
 * The server's routes that `/openapi.json` does not describe, with the methods that call
 * them or why the client has none. The test checks that none of them is in the document
 * (one that moves into it must move to `OPERATIONS`).
 */
export const ROUTES_OUTSIDE_OPENAPI = {
  "GET /healthz": { methods: ["healthz"], reason: "liveness probe, no key" },
  "GET /readyz": { methods: ["readyz"], reason: "readiness probe, no key" },
  "GET /openapi.json": { methods: [], reason: "the document itself: the client's types are generated from it" },
  "GET /metrics": { methods: [], reason: "Prometheus text for a scraper, server-wide; stats() is the app's own figures as JSON" },
  "GET /ui": { methods: [], reason: "the dashboard's static files, for a browser" },
  "POST /openai/v1/chat/completions": { methods: [], reason: "the OpenAI-compatible door: the official openai SDK covers it (docs/openai.md)" },
  "GET /openai/v1/models": { methods: [], reason: "the OpenAI-compatible door: the official openai SDK covers it (docs/openai.md)" },
  "GET /openai/v1/models/{id}": { methods: [], reason: "the OpenAI-compatible door: the official openai SDK covers it (docs/openai.md)" },
} as const satisfies Record<string, { methods: readonly Method[]; reason: string }>;
