/**
 * The official TypeScript client for Tollgate, the durable budgeted AI task service.
 *
 * Zero runtime dependencies: it uses the global `fetch`, `AbortSignal`, `setTimeout` and
 * `crypto.randomUUID`, so it runs on Node ≥ 20, Bun and Deno alike. Every shape comes from
 * the server's OpenAPI document and `GET /v1/kinds` (src/generated/openapi.ts, made by
 * `npm run generate`).
 */
import type { components } from "./generated/openapi.js";
import { TollgateError } from "./errors.js";
export * from "./errors.js";
export { OPERATIONS, ROUTES_OUTSIDE_OPENAPI } from "./operations.js";
export type { components, paths, operations } from "./generated/openapi.js";
type Schemas = components["schemas"];
/** The four task kinds. */
export type Kind = Schemas["Kind"];
/** Each kind's request object (its JSON Schema is `GET /v1/kinds`). */
export interface KindRequests {
    generate_text: Schemas["GenerateTextRequest"];
    classify: Schemas["ClassifyRequest"];
    classify_many: Schemas["ClassifyManyRequest"];
    extract_data: Schemas["ExtractDataRequest"];
}
/** Each kind's output, once the task succeeded. `extract_data`'s is valid against the request's schema. */
export interface KindOutputs {
    generate_text: Schemas["GenerateTextOutput"];
    classify: Schemas["ClassifyOutput"];
    classify_many: Schemas["ClassifyManyOutput"];
    extract_data: unknown;
}
export type TaskStatus = "queued" | "running" | "succeeded" | "failed" | "canceled";
export type RunState = "running" | "waiting" | "succeeded" | "failed" | "canceled";
export type StepStatus = "pending" | "queued" | "running" | "succeeded" | "failed" | "canceled";
export type SourceBody = Schemas["SourceBody"];
export type TaskErrorView = Schemas["TaskErrorView"];
export type Usage = Schemas["UsageView"];
/** A task (SPEC §11) of kind `K`. */
export type Task<K extends Kind = Kind> = Omit<Schemas["TaskView"], "kind" | "status" | "output"> & {
    kind: K;
    status: TaskStatus;
    /** The kind's output, once `succeeded`. */
    output?: KindOutputs[K] | null;
};
/** A submission: a `POST /v1/tasks` body whose `request` is typed by its `kind`. */
export type Submission<K extends Kind = Kind> = Omit<Schemas["SubmitBody"], "kind" | "request"> & {
    kind: K;
    request: KindRequests[K];
    /**
     * The effect key (sent as `Idempotency-Key`). When absent the client makes one
     * (`crypto.randomUUID()`) and keeps it across its own retries, so a retry never creates a
     * second task. Pass your own to make the call safe across your process restarts too.
     */
    effect_key?: string | null;
};
export type BatchItem = Omit<Schemas["BatchItem"], "task"> & {
    task?: Task | null;
};
export type BatchAnswer = {
    results: BatchItem[];
};
export type UnreleasedPage = Schemas["UnreleasedPageView"];
export type UnreleasedSource = Schemas["UnreleasedSourceView"];
export type Deleted = Schemas["DeletedAnswer"];
export type StepView = Omit<Schemas["StepView"], "status" | "output"> & {
    status: StepStatus;
    output?: unknown;
};
export type PipelineProgress = Omit<Schemas["PipelineProgressView"], "steps"> & {
    steps: StepView[];
};
export type Run = Omit<Schemas["RunView"], "state" | "input" | "output" | "pipeline"> & {
    state: RunState;
    input: unknown;
    output?: unknown;
    /** For a pipeline run: its version and each step. */
    pipeline?: PipelineProgress | null;
};
/** A pipeline definition: `{description?, steps: [...], output: {...}}` (docs/pipelines.md). */
export type PipelineDefinition = {
    description?: string;
    steps: unknown[];
    output?: Record<string, string>;
} & Record<string, unknown>;
export type Pipeline = Omit<Schemas["PipelineView"], "definition"> & {
    definition: PipelineDefinition;
};
export type KindInfo = Omit<Schemas["KindView"], "kind" | "request_schema" | "output_schema"> & {
    kind: Kind;
    request_schema: Record<string, unknown>;
    output_schema: Record<string, unknown>;
};
export type Model = Schemas["ModelView"];
/** A page of `GET /v1/tasks` (newest first; pages carry no `request`). */
export type TaskPage = {
    tasks: Task[];
    next?: string;
};
/** A run in a listing (`getRun` has its input, output and steps). */
export type RunSummary = Omit<Schemas["RunSummaryView"], "state"> & {
    state: RunState;
};
/** A page of `GET /v1/runs` (newest first). */
export type RunPage = {
    runs: RunSummary[];
    next?: string;
};
/** A pipeline with its versions, newest first. */
export type PipelineSummary = Schemas["PipelineSummaryView"];
/** A page of `GET /v1/pipelines` (in name order). */
export type PipelinePage = Schemas["PipelinePageView"];
/** A scope's policy in force and its live admission state (`GET /v1/scopes/{scope}`). */
export type Scope = Schemas["ScopeView"];
/** A page of `GET /v1/scopes` (in name order). */
export type ScopePage = Schemas["ScopePageView"];
/** Spend and model tokens in the 24 h window, of a scope or of the whole app (SPEC §13). */
export type UsageReport = Schemas["UsageReportView"];
/** The app's tasks now and over the last hour (`GET /v1/stats`). */
export type Stats = Schemas["StatsView"];
/** One page of a listing: `limit` (1–500, default 50) and the previous page's `next`. */
export interface PageQuery {
    limit?: number;
    /** The `next` of the previous page, passed back unchanged (opaque). */
    next?: string;
}
/** `GET /v1/tasks` filters; they narrow together. */
export interface TaskListQuery extends PageQuery {
    scope?: string;
    /** One status or several (sent comma-separated). */
    status?: TaskStatus | readonly TaskStatus[];
    kind?: Kind;
    step?: string;
    /** A source id. */
    source?: string;
    run_id?: string;
    /** Inclusive; an RFC 3339 string or a `Date`. */
    created_after?: string | Date;
    /** Exclusive; an RFC 3339 string or a `Date`. */
    created_before?: string | Date;
}
/** `GET /v1/runs` filters. */
export interface RunListQuery extends PageQuery {
    scope?: string;
    /** One state or several (sent comma-separated). */
    state?: RunState | readonly RunState[];
    /** A pipeline name. */
    pipeline?: string;
}
export declare const TERMINAL_TASK_STATUSES: readonly TaskStatus[];
export declare const TERMINAL_RUN_STATES: readonly RunState[];
export interface ClientOptions {
    /** Default `http://127.0.0.1:8080`. */
    baseUrl?: string;
    /** Sent as `Authorization: Bearer <apiKey>`. */
    apiKey?: string;
    /** Sent as `X-Tollgate-Subject` (only keys with `may_assert_subject` may). */
    subject?: string;
    /** A `fetch` to use instead of the global one. */
    fetch?: typeof fetch;
    /** Retries of a 503 or a connection error, with exponential backoff and jitter (default 4). */
    maxRetries?: number;
    /** First backoff delay in ms (default 200); doubles up to `retryMaxDelayMs` (default 5000). */
    retryBaseDelayMs?: number;
    retryMaxDelayMs?: number;
    /** Retry 429 admission refusals after `Retry-After` (default false: throw `AdmissionError`). */
    retryAdmission?: boolean;
    /** Overall deadline of one call's retries, in ms (default 60000). */
    deadlineMs?: number;
    /** Longest single `?wait=` long-poll a `wait` sends, in ms (default 30000; the server caps it at `server.max_wait`). */
    longPollMs?: number;
}
/** Per-call options. */
export interface CallOptions {
    /** Aborts the call (and its retries and waits); the server-side task is not touched. */
    signal?: AbortSignal;
    /** Overrides the client's `retryAdmission` for this call. */
    retryAdmission?: boolean;
    /** Overrides the client's `deadlineMs` for this call's retries. */
    deadlineMs?: number;
}
export interface SubmitOptions extends CallOptions {
    /** Ask the server to hold the answer until the task is terminal, up to this many ms (`?wait=`). */
    waitMs?: number;
}
export interface WaitOptions {
    /** Give up after this many ms with `WaitTimeoutError` (default: wait as long as it takes). */
    timeoutMs?: number;
    /** Stops waiting (rejects with the signal's reason); the task goes on. */
    signal?: AbortSignal;
}
/** A new effect key: 32 hex digits from a random UUID. */
export declare function newIdempotencyKey(): string;
/** The Tollgate HTTP API, whole. */
export declare class Tollgate {
    readonly baseUrl: string;
    private readonly apiKey;
    private readonly subject;
    private readonly fetchImpl;
    private readonly maxRetries;
    private readonly retryBaseDelayMs;
    private readonly retryMaxDelayMs;
    private readonly retryAdmission;
    private readonly deadlineMs;
    private readonly longPollMs;
    constructor(options?: ClientOptions);
    /**
     * Submits a task (`POST /v1/tasks`). The answer's `created` says whether this call created
     * it (`false`: the effect key already named this very task). A different request under a
     * taken key is `ConflictError`; an admission refusal is `AdmissionError`, retried after
     * `Retry-After` when `retryAdmission` is on.
     */
    submit<K extends Kind>(submission: Submission<K>, options?: SubmitOptions): Promise<Task<K>>;
    /**
     * Submits up to 1,000 tasks at once (`POST /v1/tasks/batch`); each is admitted or refused
     * on its own and reported in order. Items without an `effect_key` get one.
     * Use `batchItemError` to turn a refused item into its typed error.
     */
    submitBatch(submissions: Submission[], options?: CallOptions): Promise<BatchAnswer>;
    /** `GET /v1/tasks/{id}`; `NotFoundError` for a missing task or another app's. */
    getTask(id: string, options?: CallOptions & {
        waitMs?: number;
    }): Promise<Task>;
    /** `GET /v1/tasks?effect_key=…`. */
    getTaskByEffectKey(effectKey: string, options?: CallOptions): Promise<Task>;
    /**
     * `GET /v1/tasks`: one page of the app's tasks, newest first. A page may be short (even
     * empty) and still carry `next` (docs/api.md, "Short pages"): `allTasks` follows it.
     */
    listTasks(query?: TaskListQuery, options?: CallOptions): Promise<TaskPage>;
    /** Every task `listTasks(query)` selects, page after page (`limit` is the page size). */
    allTasks(query?: TaskListQuery, options?: CallOptions): AsyncGenerator<Task>;
    /**
     * Waits until the task is terminal, with the server's `?wait=` long-poll (looping while it
     * runs), and returns it. Past `timeoutMs` it throws `WaitTimeoutError` (with the task as
     * last seen); aborting `signal` rejects with its reason. Neither touches the task.
     */
    wait<K extends Kind = Kind>(task: Task<K> | string, options?: WaitOptions): Promise<Task<K>>;
    /** Submits, then waits for the end: `submit` + `wait` with one deadline. */
    run<K extends Kind>(submission: Submission<K>, options?: SubmitOptions & WaitOptions): Promise<Task<K>>;
    /** `POST /v1/tasks/{id}/cancel`: a queued or running task becomes `canceled`; a finished one is unchanged. */
    cancel(id: string, options?: CallOptions): Promise<Task>;
    /** `POST /v1/tasks/release`: the application stored (or discarded) that task's result. */
    release(args: {
        effect_key: string;
        scope: string;
    }, options?: CallOptions): Promise<{
        released: boolean;
    }>;
    /** One page of the scope's sources that still have unreleased application tasks. */
    unreleasedSources(scope: string, query?: {
        step?: string;
        after?: string;
    }, options?: CallOptions): Promise<UnreleasedPage>;
    /** Every unreleased source of the scope, page after page. */
    allUnreleasedSources(scope: string, query?: {
        step?: string;
    }, options?: CallOptions): AsyncGenerator<UnreleasedSource>;
    /**
     * `GET /v1/scopes`: one page of the app's scopes with admitted tasks still active or an
     * admission in the last 24 h, in name order. A key bound to a subject gets `ForbiddenError`.
     */
    listScopes(query?: PageQuery, options?: CallOptions): Promise<ScopePage>;
    /** Every scope `listScopes` lists, page after page. */
    allScopes(query?: PageQuery, options?: CallOptions): AsyncGenerator<Scope>;
    /** `GET /v1/scopes/{scope}`: its policy in force and live admission state (any scope: a quiet one shows a full bucket and zeros). */
    getScope(scope: string, options?: CallOptions): Promise<Scope>;
    /** `GET /v1/scopes/{scope}/usage`: the scope's spend and model tokens in the 24 h window (SPEC §13). */
    scopeUsage(scope: string, options?: CallOptions): Promise<UsageReport>;
    /** `DELETE /v1/scopes/{scope}/tasks`: deletes the owner's data (of one source when given). */
    deleteOwnerData(scope: string, query?: {
        source?: string;
    }, options?: CallOptions): Promise<Deleted>;
    /**
     * `POST /v1/runs`: a workflow run. Not idempotent on the server, so only a 503 (nothing
     * written) is retried, never a lost connection.
     */
    createRun(args: {
        scope: string;
        input?: unknown;
    }, options?: CallOptions): Promise<Run>;
    /** `GET /v1/runs`: one page of the app's runs, newest first (summaries: `getRun` has input, output and steps). */
    listRuns(query?: RunListQuery, options?: CallOptions): Promise<RunPage>;
    /** Every run `listRuns(query)` selects, page after page. */
    allRuns(query?: RunListQuery, options?: CallOptions): AsyncGenerator<RunSummary>;
    /** `GET /v1/runs/{id}` (with `waitMs`: `?wait=`, answers once terminal or the wait passed). */
    getRun(id: string, options?: CallOptions & {
        waitMs?: number;
    }): Promise<Run>;
    /** Waits until the run is terminal (long-poll loop); like `wait` for tasks. */
    waitRun(run: Run | string, options?: WaitOptions): Promise<Run>;
    /** `POST /v1/runs/{id}/cancel`: cancels the run with its queued and running tasks. */
    cancelRun(id: string, options?: CallOptions): Promise<Run>;
    /**
     * `POST /v1/pipelines`: registers a version (`created: false` when the app already had this
     * exact definition). Takes `(name, definition)` or a `{name, definition}` file's content.
     */
    registerPipeline(nameOrFile: string | {
        name: string;
        definition: PipelineDefinition;
    }, definition?: PipelineDefinition, options?: CallOptions): Promise<Pipeline>;
    /** `GET /v1/pipelines`: one page of the app's pipelines in name order, each with its versions (newest first). */
    listPipelines(query?: PageQuery, options?: CallOptions): Promise<PipelinePage>;
    /** Every pipeline `listPipelines` lists, page after page. */
    allPipelines(query?: PageQuery, options?: CallOptions): AsyncGenerator<PipelineSummary>;
    /** `GET /v1/pipelines/{name}` (the newest version, or `version`). */
    getPipeline(name: string, query?: {
        version?: string;
    }, options?: CallOptions): Promise<Pipeline>;
    /**
     * `POST /v1/pipelines/{name}/runs`: starts a run, once per `idempotencyKey` (made up when
     * absent and kept across retries, so a retry never starts a second run).
     */
    startPipeline(name: string, args: {
        scope: string;
        input?: unknown;
        version?: string;
        idempotencyKey?: string;
        waitMs?: number;
    }, options?: CallOptions): Promise<Run>;
    /** `GET /v1/kinds`: each kind's request and output JSON Schemas. */
    kinds(options?: CallOptions): Promise<KindInfo[]>;
    /** `GET /v1/models`: the configured models. */
    models(options?: CallOptions): Promise<Model[]>;
    /** `GET /v1/usage`: the app's spend and model tokens in the 24 h window, all scopes (SPEC §13). A key bound to a subject gets `ForbiddenError`. */
    usage(options?: CallOptions): Promise<UsageReport>;
    /** `GET /v1/stats`: the app's queue, throughput, failures, cache hit rate and latency over the last hour. */
    stats(options?: CallOptions): Promise<Stats>;
    /** `GET /healthz`: `{status: "ok"}` while the process runs. */
    healthz(options?: CallOptions): Promise<{
        status: string;
    }>;
    /** `GET /readyz`: `{status: "ready"}`, or `UnavailableError` when the database does not answer (not retried). */
    readyz(options?: CallOptions): Promise<{
        status: string;
    }>;
    /** A listing's pages, from the one at `first` (a `next` cursor, or the start) to the last. */
    private pages;
    private url;
    private backoff;
    /**
     * One call with its retries: a 503 or (for idempotent calls) a connection error is retried
     * with backoff up to `maxRetries` times; a 429 after its `Retry-After` when the call opted
     * into `retryAdmission`; all within the call's deadline. The body and its idempotency key
     * are the same on every attempt.
     */
    private request;
}
/** The typed error of a refused batch item (`undefined` for a submitted one). */
export declare function batchItemError(item: BatchItem): TollgateError | undefined;
export default Tollgate;
