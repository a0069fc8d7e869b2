/**
 * Every operation of the server's `/openapi.json` (`clients/openapi.json`), as
 * `"METHOD /path"`, with the client methods that call it. tests/operations.test.js checks it
 * both ways against the committed document — no operation missing, none unknown — and calls
 * each method to see that it sends that method and path, so a new route cannot go without
 * a method. The compiler checks that each name is a method of `Tollgate`.
 */
export declare const OPERATIONS: {
    readonly "POST /v1/tasks": readonly ["submit", "run"];
    readonly "POST /v1/tasks/batch": readonly ["submitBatch"];
    readonly "GET /v1/tasks": readonly ["listTasks", "allTasks", "getTaskByEffectKey"];
    readonly "GET /v1/tasks/{id}": readonly ["getTask", "wait"];
    readonly "POST /v1/tasks/{id}/cancel": readonly ["cancel"];
    readonly "POST /v1/tasks/release": readonly ["release"];
    readonly "GET /v1/scopes": readonly ["listScopes", "allScopes"];
    readonly "GET /v1/scopes/{scope}": readonly ["getScope"];
    readonly "GET /v1/scopes/{scope}/usage": readonly ["scopeUsage"];
    readonly "GET /v1/scopes/{scope}/unreleased-sources": readonly ["unreleasedSources", "allUnreleasedSources"];
    readonly "DELETE /v1/scopes/{scope}/tasks": readonly ["deleteOwnerData"];
    readonly "POST /v1/runs": readonly ["createRun"];
    readonly "GET /v1/runs": readonly ["listRuns", "allRuns"];
    readonly "GET /v1/runs/{id}": readonly ["getRun", "waitRun"];
    readonly "POST /v1/runs/{id}/cancel": readonly ["cancelRun"];
    readonly "POST /v1/pipelines": readonly ["registerPipeline"];
    readonly "GET /v1/pipelines": readonly ["listPipelines", "allPipelines"];
    readonly "GET /v1/pipelines/{name}": readonly ["getPipeline"];
    readonly "POST /v1/pipelines/{name}/runs": readonly ["startPipeline"];
    readonly "GET /v1/kinds": readonly ["kinds"];
    readonly "GET /v1/models": readonly ["models"];
    readonly "GET /v1/usage": readonly ["usage"];
    readonly "GET /v1/stats": readonly ["stats"];
};
/**
 * The server's routes that `/openapi.json` does not describe, with the methods that call
 * them or why the client has none. The test checks that none of them is in the document
 * (one that moves into it must move to `OPERATIONS`).
 */
export declare const ROUTES_OUTSIDE_OPENAPI: {
    readonly "GET /healthz": {
        readonly methods: readonly ["healthz"];
        readonly reason: "liveness probe, no key";
    };
    readonly "GET /readyz": {
        readonly methods: readonly ["readyz"];
        readonly reason: "readiness probe, no key";
    };
    readonly "GET /openapi.json": {
        readonly methods: readonly [];
        readonly reason: "the document itself: the client's types are generated from it";
    };
    readonly "GET /metrics": {
        readonly methods: readonly [];
        readonly reason: "Prometheus text for a scraper, server-wide; stats() is the app's own figures as JSON";
    };
    readonly "GET /ui": {
        readonly methods: readonly [];
        readonly reason: "the dashboard's static files, for a browser";
    };
    readonly "POST /openai/v1/chat/completions": {
        readonly methods: readonly [];
        readonly reason: "the OpenAI-compatible door: the official openai SDK covers it (docs/openai.md)";
    };
    readonly "GET /openai/v1/models": {
        readonly methods: readonly [];
        readonly reason: "the OpenAI-compatible door: the official openai SDK covers it (docs/openai.md)";
    };
    readonly "GET /openai/v1/models/{id}": {
        readonly methods: readonly [];
        readonly reason: "the OpenAI-compatible door: the official openai SDK covers it (docs/openai.md)";
    };
};
