/**
 * The official TypeScript client for Tollgate, the durable budgeted AI task service.
 *
 * Zero runtime dependencies: it uses the global `fetch`, `AbortSignal`, `setTimeout` and
 * `crypto.randomUUID`, so it runs on Node ≥ 20, Bun and Deno alike. Every shape comes from
 * the server's OpenAPI document and `GET /v1/kinds` (src/generated/openapi.ts, made by
 * `npm run generate`).
 */
import { AdmissionError, ConnectionError, UnavailableError, WaitTimeoutError, errorFor, } from "./errors.js";
export * from "./errors.js";
export { OPERATIONS, ROUTES_OUTSIDE_OPENAPI } from "./operations.js";
export const TERMINAL_TASK_STATUSES = ["succeeded", "failed", "canceled"];
export const TERMINAL_RUN_STATES = ["succeeded", "failed", "canceled"];
/** A new effect key: 32 hex digits from a random UUID. */
export function newIdempotencyKey() {
    return globalThis.crypto.randomUUID();
}
function sleep(ms, signal) {
    return new Promise((resolve, reject) => {
        if (signal?.aborted) {
            reject(signal.reason);
            return;
        }
        const onAbort = () => {
            clearTimeout(timer);
            reject(signal?.reason);
        };
        const timer = setTimeout(() => {
            signal?.removeEventListener("abort", onAbort);
            resolve();
        }, Math.max(0, ms));
        signal?.addEventListener("abort", onAbort, { once: true });
    });
}
/** A comma-separated list parameter (`status=queued,running`). */
function listParam(value) {
    if (value === undefined)
        return undefined;
    return typeof value === "string" ? value : value.join(",");
}
/** An RFC 3339 instant. */
function timeParam(value) {
    return value instanceof Date ? value.toISOString() : value;
}
function intParam(value) {
    return value === undefined ? undefined : String(value);
}
/** `?wait=` as the server reads it. */
function waitParam(ms) {
    return `${Math.max(0, Math.ceil(ms))}ms`;
}
/** The Tollgate HTTP API, whole. */
export class Tollgate {
    baseUrl;
    apiKey;
    subject;
    fetchImpl;
    maxRetries;
    retryBaseDelayMs;
    retryMaxDelayMs;
    retryAdmission;
    deadlineMs;
    longPollMs;
    constructor(options = {}) {
        this.baseUrl = (options.baseUrl ?? "http://127.0.0.1:8080").replace(/\/+$/, "");
        this.apiKey = options.apiKey;
        this.subject = options.subject;
        this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
        this.maxRetries = options.maxRetries ?? 4;
        this.retryBaseDelayMs = options.retryBaseDelayMs ?? 200;
        this.retryMaxDelayMs = options.retryMaxDelayMs ?? 5000;
        this.retryAdmission = options.retryAdmission ?? false;
        this.deadlineMs = options.deadlineMs ?? 60_000;
        this.longPollMs = options.longPollMs ?? 30_000;
    }
    // ---- tasks ----
    /**
     * Submits a task (`POST /v1/tasks`). The answer's `created` says whether this call created
     * it (`false`: the effect key already named this very task). A different request under a
     * taken key is `ConflictError`; an admission refusal is `AdmissionError`, retried after
     * `Retry-After` when `retryAdmission` is on.
     */
    async submit(submission, options = {}) {
        const { effect_key, ...body } = submission;
        const key = effect_key ?? newIdempotencyKey();
        const answer = await this.request({
            method: "POST",
            path: "/v1/tasks",
            query: { wait: options.waitMs === undefined ? undefined : waitParam(options.waitMs) },
            headers: { "Idempotency-Key": key },
            body,
            idempotent: true,
            options,
        });
        return answer.data;
    }
    /**
     * Submits up to 1,000 tasks at once (`POST /v1/tasks/batch`); each is admitted or refused
     * on its own and reported in order. Items without an `effect_key` get one.
     * Use `batchItemError` to turn a refused item into its typed error.
     */
    async submitBatch(submissions, options = {}) {
        const tasks = submissions.map((s) => ({ ...s, effect_key: s.effect_key ?? newIdempotencyKey() }));
        const answer = await this.request({
            method: "POST",
            path: "/v1/tasks/batch",
            body: { tasks },
            idempotent: true,
            options: { ...options, retryAdmission: false },
        });
        return answer.data;
    }
    /** `GET /v1/tasks/{id}`; `NotFoundError` for a missing task or another app's. */
    async getTask(id, options = {}) {
        const answer = await this.request({
            method: "GET",
            path: `/v1/tasks/${encodeURIComponent(id)}`,
            query: { wait: options.waitMs === undefined ? undefined : waitParam(options.waitMs) },
            idempotent: true,
            options,
        });
        return answer.data;
    }
    /** `GET /v1/tasks?effect_key=…`. */
    async getTaskByEffectKey(effectKey, options = {}) {
        const answer = await this.request({
            method: "GET",
            path: "/v1/tasks",
            query: { effect_key: effectKey },
            idempotent: true,
            options,
        });
        return answer.data;
    }
    /**
     * `GET /v1/tasks`: one page of the app's tasks, newest first. A page may be short (even
     * empty) and still carry `next` (docs/api.md, "Short pages"): `allTasks` follows it.
     */
    async listTasks(query = {}, options = {}) {
        const answer = await this.request({
            method: "GET",
            path: "/v1/tasks",
            query: {
                scope: query.scope,
                status: listParam(query.status),
                kind: query.kind,
                step: query.step,
                source: query.source,
                run_id: query.run_id,
                created_after: timeParam(query.created_after),
                created_before: timeParam(query.created_before),
                limit: intParam(query.limit),
                next: query.next,
            },
            idempotent: true,
            options,
        });
        return answer.data;
    }
    /** Every task `listTasks(query)` selects, page after page (`limit` is the page size). */
    async *allTasks(query = {}, options = {}) {
        for await (const page of this.pages(query.next, (next) => this.listTasks({ ...query, next }, options))) {
            yield* page.tasks;
        }
    }
    /**
     * Waits until the task is terminal, with the server's `?wait=` long-poll (looping while it
     * runs), and returns it. Past `timeoutMs` it throws `WaitTimeoutError` (with the task as
     * last seen); aborting `signal` rejects with its reason. Neither touches the task.
     */
    async wait(task, options = {}) {
        const id = typeof task === "string" ? task : task.id;
        let last = typeof task === "string" ? undefined : task;
        if (last && TERMINAL_TASK_STATUSES.includes(last.status))
            return last;
        const deadline = options.timeoutMs === undefined ? Infinity : Date.now() + options.timeoutMs;
        for (;;) {
            const remaining = deadline - Date.now();
            if (remaining <= 0) {
                last ??= (await this.getTask(id, { signal: options.signal }));
                if (TERMINAL_TASK_STATUSES.includes(last.status))
                    return last;
                throw new WaitTimeoutError(`task ${id} is still ${last.status} after ${options.timeoutMs} ms`, last);
            }
            const poll = Math.min(remaining, this.longPollMs);
            const started = Date.now();
            last = (await this.getTask(id, { waitMs: poll, signal: options.signal }));
            if (TERMINAL_TASK_STATUSES.includes(last.status))
                return last;
            // A server that answered at once (an older one without ?wait= on this route) is
            // polled gently instead of in a busy loop.
            if (Date.now() - started < 50)
                await sleep(Math.min(250, Math.max(0, deadline - Date.now())), options.signal);
        }
    }
    /** Submits, then waits for the end: `submit` + `wait` with one deadline. */
    async run(submission, options = {}) {
        const started = Date.now();
        const task = await this.submit(submission, {
            ...options,
            waitMs: Math.min(options.timeoutMs ?? this.longPollMs, this.longPollMs),
        });
        const timeoutMs = options.timeoutMs === undefined ? undefined : Math.max(0, options.timeoutMs - (Date.now() - started));
        return this.wait(task, { timeoutMs, signal: options.signal });
    }
    /** `POST /v1/tasks/{id}/cancel`: a queued or running task becomes `canceled`; a finished one is unchanged. */
    async cancel(id, options = {}) {
        const answer = await this.request({
            method: "POST",
            path: `/v1/tasks/${encodeURIComponent(id)}/cancel`,
            idempotent: true,
            options,
        });
        return answer.data;
    }
    /** `POST /v1/tasks/release`: the application stored (or discarded) that task's result. */
    async release(args, options = {}) {
        const answer = await this.request({
            method: "POST",
            path: "/v1/tasks/release",
            body: args,
            idempotent: true,
            options,
        });
        return answer.data;
    }
    // ---- scopes ----
    /** One page of the scope's sources that still have unreleased application tasks. */
    async unreleasedSources(scope, query = {}, options = {}) {
        const answer = await this.request({
            method: "GET",
            path: `/v1/scopes/${encodeURIComponent(scope)}/unreleased-sources`,
            query: { step: query.step, after: query.after },
            idempotent: true,
            options,
        });
        return answer.data;
    }
    /** Every unreleased source of the scope, page after page. */
    async *allUnreleasedSources(scope, query = {}, options = {}) {
        let after;
        for (;;) {
            const page = await this.unreleasedSources(scope, { step: query.step, after }, options);
            yield* page.sources;
            if (!page.next)
                return;
            after = page.next;
        }
    }
    /**
     * `GET /v1/scopes`: one page of the app's scopes with admitted tasks still active or an
     * admission in the last 24 h, in name order. A key bound to a subject gets `ForbiddenError`.
     */
    async listScopes(query = {}, options = {}) {
        const answer = await this.request({
            method: "GET",
            path: "/v1/scopes",
            query: { limit: intParam(query.limit), next: query.next },
            idempotent: true,
            options,
        });
        return answer.data;
    }
    /** Every scope `listScopes` lists, page after page. */
    async *allScopes(query = {}, options = {}) {
        for await (const page of this.pages(query.next, (next) => this.listScopes({ ...query, next }, options))) {
            yield* page.scopes;
        }
    }
    /** `GET /v1/scopes/{scope}`: its policy in force and live admission state (any scope: a quiet one shows a full bucket and zeros). */
    async getScope(scope, options = {}) {
        const answer = await this.request({
            method: "GET",
            path: `/v1/scopes/${encodeURIComponent(scope)}`,
            idempotent: true,
            options,
        });
        return answer.data;
    }
    /** `GET /v1/scopes/{scope}/usage`: the scope's spend and model tokens in the 24 h window (SPEC §13). */
    async scopeUsage(scope, options = {}) {
        const answer = await this.request({
            method: "GET",
            path: `/v1/scopes/${encodeURIComponent(scope)}/usage`,
            idempotent: true,
            options,
        });
        return answer.data;
    }
    /** `DELETE /v1/scopes/{scope}/tasks`: deletes the owner's data (of one source when given). */
    async deleteOwnerData(scope, query = {}, options = {}) {
        const answer = await this.request({
            method: "DELETE",
            path: `/v1/scopes/${encodeURIComponent(scope)}/tasks`,
            query: { source: query.source },
            idempotent: true,
            options,
        });
        return answer.data;
    }
    // ---- runs ----
    /**
     * `POST /v1/runs`: a workflow run. Not idempotent on the server, so only a 503 (nothing
     * written) is retried, never a lost connection.
     */
    async createRun(args, options = {}) {
        const answer = await this.request({
            method: "POST",
            path: "/v1/runs",
            body: { scope: args.scope, input: args.input ?? {} },
            idempotent: false,
            options,
        });
        return answer.data;
    }
    /** `GET /v1/runs`: one page of the app's runs, newest first (summaries: `getRun` has input, output and steps). */
    async listRuns(query = {}, options = {}) {
        const answer = await this.request({
            method: "GET",
            path: "/v1/runs",
            query: {
                scope: query.scope,
                state: listParam(query.state),
                pipeline: query.pipeline,
                limit: intParam(query.limit),
                next: query.next,
            },
            idempotent: true,
            options,
        });
        return answer.data;
    }
    /** Every run `listRuns(query)` selects, page after page. */
    async *allRuns(query = {}, options = {}) {
        for await (const page of this.pages(query.next, (next) => this.listRuns({ ...query, next }, options))) {
            yield* page.runs;
        }
    }
    /** `GET /v1/runs/{id}` (with `waitMs`: `?wait=`, answers once terminal or the wait passed). */
    async getRun(id, options = {}) {
        const answer = await this.request({
            method: "GET",
            path: `/v1/runs/${encodeURIComponent(id)}`,
            query: { wait: options.waitMs === undefined ? undefined : waitParam(options.waitMs) },
            idempotent: true,
            options,
        });
        return answer.data;
    }
    /** Waits until the run is terminal (long-poll loop); like `wait` for tasks. */
    async waitRun(run, options = {}) {
        const id = typeof run === "string" ? run : run.id;
        let last = typeof run === "string" ? undefined : run;
        if (last && TERMINAL_RUN_STATES.includes(last.state))
            return last;
        const deadline = options.timeoutMs === undefined ? Infinity : Date.now() + options.timeoutMs;
        for (;;) {
            const remaining = deadline - Date.now();
            if (remaining <= 0) {
                last ??= await this.getRun(id, { signal: options.signal });
                if (TERMINAL_RUN_STATES.includes(last.state))
                    return last;
                throw new WaitTimeoutError(`run ${id} is still ${last.state} after ${options.timeoutMs} ms`, last);
            }
            const started = Date.now();
            last = await this.getRun(id, { waitMs: Math.min(remaining, this.longPollMs), signal: options.signal });
            if (TERMINAL_RUN_STATES.includes(last.state))
                return last;
            if (Date.now() - started < 50)
                await sleep(Math.min(250, Math.max(0, deadline - Date.now())), options.signal);
        }
    }
    /** `POST /v1/runs/{id}/cancel`: cancels the run with its queued and running tasks. */
    async cancelRun(id, options = {}) {
        const answer = await this.request({
            method: "POST",
            path: `/v1/runs/${encodeURIComponent(id)}/cancel`,
            idempotent: true,
            options,
        });
        return answer.data;
    }
    // ---- pipelines ----
    /**
     * `POST /v1/pipelines`: registers a version (`created: false` when the app already had this
     * exact definition). Takes `(name, definition)` or a `{name, definition}` file's content.
     */
    async registerPipeline(nameOrFile, definition, options = {}) {
        const body = typeof nameOrFile === "string" ? { name: nameOrFile, definition } : nameOrFile;
        const answer = await this.request({
            method: "POST",
            path: "/v1/pipelines",
            body,
            idempotent: true, // registering the same definition again changes nothing
            options,
        });
        return answer.data;
    }
    /** `GET /v1/pipelines`: one page of the app's pipelines in name order, each with its versions (newest first). */
    async listPipelines(query = {}, options = {}) {
        const answer = await this.request({
            method: "GET",
            path: "/v1/pipelines",
            query: { limit: intParam(query.limit), next: query.next },
            idempotent: true,
            options,
        });
        return answer.data;
    }
    /** Every pipeline `listPipelines` lists, page after page. */
    async *allPipelines(query = {}, options = {}) {
        for await (const page of this.pages(query.next, (next) => this.listPipelines({ ...query, next }, options))) {
            yield* page.pipelines;
        }
    }
    /** `GET /v1/pipelines/{name}` (the newest version, or `version`). */
    async getPipeline(name, query = {}, options = {}) {
        const answer = await this.request({
            method: "GET",
            path: `/v1/pipelines/${encodeURIComponent(name)}`,
            query: { version: query.version },
            idempotent: true,
            options,
        });
        return answer.data;
    }
    /**
     * `POST /v1/pipelines/{name}/runs`: starts a run, once per `idempotencyKey` (made up when
     * absent and kept across retries, so a retry never starts a second run).
     */
    async startPipeline(name, args, options = {}) {
        const body = { scope: args.scope, input: args.input ?? {} };
        if (args.version !== undefined)
            body.version = args.version;
        const answer = await this.request({
            method: "POST",
            path: `/v1/pipelines/${encodeURIComponent(name)}/runs`,
            query: { wait: args.waitMs === undefined ? undefined : waitParam(args.waitMs) },
            headers: { "Idempotency-Key": args.idempotencyKey ?? newIdempotencyKey() },
            body,
            idempotent: true,
            options,
        });
        return answer.data;
    }
    // ---- discovery and operations ----
    /** `GET /v1/kinds`: each kind's request and output JSON Schemas. */
    async kinds(options = {}) {
        const answer = await this.request({ method: "GET", path: "/v1/kinds", idempotent: true, options });
        return answer.data.kinds;
    }
    /** `GET /v1/models`: the configured models. */
    async models(options = {}) {
        const answer = await this.request({ method: "GET", path: "/v1/models", idempotent: true, options });
        return answer.data.models;
    }
    /** `GET /v1/usage`: the app's spend and model tokens in the 24 h window, all scopes (SPEC §13). A key bound to a subject gets `ForbiddenError`. */
    async usage(options = {}) {
        const answer = await this.request({ method: "GET", path: "/v1/usage", idempotent: true, options });
        return answer.data;
    }
    /** `GET /v1/stats`: the app's queue, throughput, failures, cache hit rate and latency over the last hour. */
    async stats(options = {}) {
        const answer = await this.request({ method: "GET", path: "/v1/stats", idempotent: true, options });
        return answer.data;
    }
    /** `GET /healthz`: `{status: "ok"}` while the process runs. */
    async healthz(options = {}) {
        const answer = await this.request({ method: "GET", path: "/healthz", idempotent: true, anonymous: true, options });
        return answer.data;
    }
    /** `GET /readyz`: `{status: "ready"}`, or `UnavailableError` when the database does not answer (not retried). */
    async readyz(options = {}) {
        const answer = await this.request({
            method: "GET",
            path: "/readyz",
            idempotent: true,
            retry: false,
            anonymous: true,
            options,
        });
        return answer.data;
    }
    // ---- transport ----
    /** A listing's pages, from the one at `first` (a `next` cursor, or the start) to the last. */
    async *pages(first, page) {
        let next = first;
        for (;;) {
            const answer = await page(next);
            yield answer;
            if (!answer.next)
                return;
            next = answer.next;
        }
    }
    url(path, query) {
        const params = new URLSearchParams();
        for (const [k, v] of Object.entries(query ?? {}))
            if (v !== undefined)
                params.set(k, v);
        const qs = params.toString();
        return `${this.baseUrl}${path}${qs ? `?${qs}` : ""}`;
    }
    backoff(attempt) {
        const exp = Math.min(this.retryMaxDelayMs, this.retryBaseDelayMs * 2 ** attempt);
        return exp / 2 + Math.random() * (exp / 2);
    }
    /**
     * One call with its retries: a 503 or (for idempotent calls) a connection error is retried
     * with backoff up to `maxRetries` times; a 429 after its `Retry-After` when the call opted
     * into `retryAdmission`; all within the call's deadline. The body and its idempotency key
     * are the same on every attempt.
     */
    async request(spec) {
        const options = spec.options ?? {};
        const signal = options.signal;
        const retryAdmission = options.retryAdmission ?? this.retryAdmission;
        const deadline = Date.now() + (options.deadlineMs ?? this.deadlineMs);
        const headers = { Accept: "application/json", ...spec.headers };
        if (this.apiKey && !spec.anonymous)
            headers.Authorization = `Bearer ${this.apiKey}`;
        if (this.subject && !spec.anonymous)
            headers["X-Tollgate-Subject"] = this.subject;
        let body;
        if (spec.body !== undefined) {
            headers["Content-Type"] = "application/json";
            body = JSON.stringify(spec.body);
        }
        const url = this.url(spec.path, spec.query);
        const canRetry = spec.retry ?? true;
        let failures = 0;
        for (;;) {
            let response;
            try {
                response = await this.fetchImpl(url, { method: spec.method, headers, body, signal });
            }
            catch (cause) {
                if (signal?.aborted)
                    throw signal.reason;
                const error = new ConnectionError(`cannot reach ${this.baseUrl}: ${String(cause?.message ?? cause)}`, cause);
                const delay = this.backoff(failures);
                if (!canRetry || !spec.idempotent || failures >= this.maxRetries || Date.now() + delay > deadline)
                    throw error;
                failures += 1;
                await sleep(delay, signal);
                continue;
            }
            const text = await response.text();
            if (response.ok) {
                return { status: response.status, data: (text ? JSON.parse(text) : undefined) };
            }
            let detail;
            try {
                detail = JSON.parse(text).error;
            }
            catch {
                detail = undefined;
            }
            const error = errorFor(response.status, detail, response.headers.get("retry-after"));
            if (error instanceof UnavailableError && canRetry) {
                const delay = this.backoff(failures);
                if (failures < this.maxRetries && Date.now() + delay <= deadline) {
                    failures += 1;
                    await sleep(delay, signal);
                    continue;
                }
            }
            if (error instanceof AdmissionError && retryAdmission && canRetry) {
                const delay = (error.retryAfter ?? 1) * 1000;
                if (Date.now() + delay <= deadline) {
                    await sleep(delay, signal);
                    continue;
                }
            }
            throw error;
        }
    }
}
/** The typed error of a refused batch item (`undefined` for a submitted one). */
export function batchItemError(item) {
    if (!item.error)
        return undefined;
    return errorFor(item.status, item.error, null);
}
export default Tollgate;
