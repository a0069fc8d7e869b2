/**
 * The official TypeScript client for Tollgate, the durable budgeted AI task service.
 *
 * Zero runtime dependencies: it uses the global `fetch`, `AbortSignal`, `setTimeout` and
 * `crypto.randomUUID`, so it runs on Node ≥ 20, Bun and Deno alike. Every shape comes from
 * the server's OpenAPI document and `GET /v1/kinds` (src/generated/openapi.ts, made by
 * `npm run generate`).
 */

import type { components } from "./generated/openapi.js";
import {
  AdmissionError,
  ConnectionError,
  TollgateError,
  UnavailableError,
  WaitTimeoutError,
  errorFor,
  type ErrorDetail,
} from "./errors.js";

export * from "./errors.js";
export { verifyWebhook, WebhookVerificationError } from "./webhook.js";
export type { WebhookEvent, WebhookHeaders } from "./webhook.js";
export { OPERATIONS, ROUTES_OUTSIDE_OPENAPI } from "./operations.js";
export type { components, paths, operations } from "./generated/openapi.js";

type Schemas = components["schemas"];

/** The task kinds. */
export type Kind = Schemas["Kind"];

/** Each kind's request object (its JSON Schema is `GET /v1/kinds`). */
export interface KindRequests {
  generate_text: Schemas["GenerateTextRequest"];
  classify: Schemas["ClassifyRequest"];
  classify_many: Schemas["ClassifyManyRequest"];
  extract_data: Schemas["ExtractDataRequest"];
  chat: Schemas["ChatRequest"];
  embed: Schemas["EmbedRequest"];
}

/** Each kind's output, once the task succeeded. `extract_data`'s is valid against the request's schema. */
export interface KindOutputs {
  generate_text: Schemas["GenerateTextOutput"];
  classify: Schemas["ClassifyOutput"];
  classify_many: Schemas["ClassifyManyOutput"];
  extract_data: unknown;
  chat: Schemas["ChatOutput"];
  embed: Schemas["EmbedOutput"];
}

export type TaskStatus = "queued" | "running" | "succeeded" | "failed" | "canceled";
export type RunState = "running" | "waiting" | "succeeded" | "failed" | "canceled";
export type StepStatus = "pending" | "queued" | "running" | "succeeded" | "failed" | "canceled";

export type SourceBody = Schemas["SourceBody"];
export type TaskErrorView = Schemas["TaskErrorView"];
export type Usage = Schemas["UsageView"];
/**
 * One event of `GET /v1/tasks/{id}/events` (docs/api.md, "Streaming a task"): `delta` (a
 * piece of the output), `restart` (the deltas so far are void), and last `end` (the task).
 */
export type TaskStreamEvent =
  | { event: "delta"; data: Schemas["TaskDeltaEvent"] }
  | { event: "restart"; data: Schemas["TaskRestartEvent"] }
  | { event: "end"; data: Task };

/** A task (docs/conformance.md#http-shapes) of kind `K`. */
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

export type BatchItem = Omit<Schemas["BatchItem"], "task"> & { task?: Task | null };
export type BatchAnswer = { results: BatchItem[] };
export type UnreleasedPage = Schemas["UnreleasedPageView"];
export type UnreleasedSource = Schemas["UnreleasedSourceView"];
export type Deleted = Schemas["DeletedAnswer"];
export type StepView = Omit<Schemas["StepView"], "status" | "output"> & { status: StepStatus; output?: unknown };
export type PipelineProgress = Omit<Schemas["PipelineProgressView"], "steps"> & { steps: StepView[] };
export type Run = Omit<Schemas["RunView"], "state" | "input" | "output" | "pipeline"> & {
  state: RunState;
  input: unknown;
  output?: unknown;
  /** For a pipeline run: its version and each step. */
  pipeline?: PipelineProgress | null;
};
/** A pipeline definition: `{description?, steps: [...], output: {...}}` (docs/pipelines.md). */
export type PipelineDefinition = { description?: string; steps: unknown[]; output?: Record<string, string> } & Record<string, unknown>;
export type Pipeline = Omit<Schemas["PipelineView"], "definition"> & { definition: PipelineDefinition };
export type KindInfo = Omit<Schemas["KindView"], "kind" | "request_schema" | "output_schema"> & {
  kind: Kind;
  request_schema: Record<string, unknown>;
  output_schema: Record<string, unknown>;
};
export type Model = Schemas["ModelView"];

/** A page of `GET /v1/tasks` (newest first; pages carry no `request`). */
export type TaskPage = { tasks: Task[]; next?: string };
/** A run in a listing (`getRun` has its input, output and steps). */
export type RunSummary = Omit<Schemas["RunSummaryView"], "state"> & { state: RunState };
/** A page of `GET /v1/runs` (newest first). */
export type RunPage = { runs: RunSummary[]; next?: string };
/** A pipeline with its versions, newest first. */
export type PipelineSummary = Schemas["PipelineSummaryView"];
/** A page of `GET /v1/pipelines` (in name order). */
export type PipelinePage = Schemas["PipelinePageView"];
/** A scope's policy in force and its live admission state (`GET /v1/scopes/{scope}`). */
export type Scope = Schemas["ScopeView"];
/** A page of `GET /v1/scopes` (in name order). */
export type ScopePage = Schemas["ScopePageView"];
/** Spend and model tokens in the 24 h window, of a scope or of the whole app (docs/conformance.md#cost-usage). */
export type UsageReport = Schemas["UsageReportView"];
/** The app's tasks now and over the last hour (`GET /v1/stats`). */
export type Stats = Schemas["StatsView"];
/** An event type a webhook endpoint may receive (docs/webhooks.md#events). */
export type WebhookEventName = Schemas["WebhookEventName"];
/** A webhook endpoint; `secret` only on creation and from `getWebhook`, not in listings. */
export type Webhook = Schemas["WebhookView"];
/** A `POST /v1/webhooks` body: `{url, events, description?, enabled?, secret?}`. */
export type WebhookCreate = Schemas["WebhookBody"];
/** A `PATCH /v1/webhooks/{id}` body: each field given replaces that field (`description: null` clears it). */
export type WebhookUpdate = Schemas["WebhookPatchBody"];
/** Where a delivery stands: `pending`, `delivered` or `dead`. */
export type DeliveryState = Schemas["DeliveryStateName"];
/** One delivery of an event to an endpoint. */
export type WebhookDelivery = Schemas["DeliveryView"];

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
  /** Only tasks that ended with this error code (as `stats().failures_by_code` counts them). */
  error_code?: string;
}

/** `GET /v1/runs` filters. */
export interface RunListQuery extends PageQuery {
  scope?: string;
  /** One state or several (sent comma-separated). */
  state?: RunState | readonly RunState[];
  /** A pipeline name. */
  pipeline?: string;
}

export const TERMINAL_TASK_STATUSES: readonly TaskStatus[] = ["succeeded", "failed", "canceled"];
export const TERMINAL_RUN_STATES: readonly RunState[] = ["succeeded", "failed", "canceled"];

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

interface RequestSpec {
  method: "GET" | "POST" | "PATCH" | "DELETE";
  path: string;
  query?: Record<string, string | undefined>;
  body?: unknown;
  headers?: Record<string, string>;
  /** A connection error may be retried: the request is a read or carries an idempotency key. */
  idempotent: boolean;
  /** Retries allowed at all (readyz: no). */
  retry?: boolean;
  /** No `Authorization` header (operations endpoints). */
  anonymous?: boolean;
  options?: CallOptions;
}

interface Answer<T> {
  status: number;
  data: T;
}

/** A new effect key: 32 hex digits from a random UUID. */
export function newIdempotencyKey(): string {
  return globalThis.crypto.randomUUID();
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
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
function listParam(value: string | readonly string[] | undefined): string | undefined {
  if (value === undefined) return undefined;
  return typeof value === "string" ? value : value.join(",");
}

/** An RFC 3339 instant. */
function timeParam(value: string | Date | undefined): string | undefined {
  return value instanceof Date ? value.toISOString() : value;
}

function intParam(value: number | undefined): string | undefined {
  return value === undefined ? undefined : String(value);
}

/** `?wait=` as the server reads it. */
function waitParam(ms: number): string {
  return `${Math.max(0, Math.ceil(ms))}ms`;
}

/** The Tollgate HTTP API, whole. */
export class Tollgate {
  readonly baseUrl: string;
  private readonly apiKey: string | undefined;
  private readonly subject: string | undefined;
  private readonly fetchImpl: typeof fetch;
  private readonly maxRetries: number;
  private readonly retryBaseDelayMs: number;
  private readonly retryMaxDelayMs: number;
  private readonly retryAdmission: boolean;
  private readonly deadlineMs: number;
  private readonly longPollMs: number;

  constructor(options: ClientOptions = {}) {
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
  async submit<K extends Kind>(submission: Submission<K>, options: SubmitOptions = {}): Promise<Task<K>> {
    const { effect_key, ...body } = submission;
    const key = effect_key ?? newIdempotencyKey();
    const answer = await this.request<Task<K>>({
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
  async submitBatch(submissions: Submission[], options: CallOptions = {}): Promise<BatchAnswer> {
    const tasks = submissions.map((s) => ({ ...s, effect_key: s.effect_key ?? newIdempotencyKey() }));
    const answer = await this.request<BatchAnswer>({
      method: "POST",
      path: "/v1/tasks/batch",
      body: { tasks },
      idempotent: true,
      options: { ...options, retryAdmission: false },
    });
    return answer.data;
  }

  /** `GET /v1/tasks/{id}`; `NotFoundError` for a missing task or another app's. */
  async getTask(id: string, options: CallOptions & { waitMs?: number } = {}): Promise<Task> {
    const answer = await this.request<Task>({
      method: "GET",
      path: `/v1/tasks/${encodeURIComponent(id)}`,
      query: { wait: options.waitMs === undefined ? undefined : waitParam(options.waitMs) },
      idempotent: true,
      options,
    });
    return answer.data;
  }

  /** `GET /v1/tasks?effect_key=…`. */
  async getTaskByEffectKey(effectKey: string, options: CallOptions = {}): Promise<Task> {
    const answer = await this.request<Task>({
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
  async listTasks(query: TaskListQuery = {}, options: CallOptions = {}): Promise<TaskPage> {
    const answer = await this.request<TaskPage>({
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
        error_code: query.error_code,
        limit: intParam(query.limit),
        next: query.next,
      },
      idempotent: true,
      options,
    });
    return answer.data;
  }

  /** Every task `listTasks(query)` selects, page after page (`limit` is the page size). */
  async *allTasks(query: TaskListQuery = {}, options: CallOptions = {}): AsyncGenerator<Task> {
    for await (const page of this.pages(query.next, (next) => this.listTasks({ ...query, next }, options))) {
      yield* page.tasks;
    }
  }

  /**
   * Waits until the task is terminal, with the server's `?wait=` long-poll (looping while it
   * runs), and returns it. Past `timeoutMs` it throws `WaitTimeoutError` (with the task as
   * last seen); aborting `signal` rejects with its reason. Neither touches the task.
   */
  async wait<K extends Kind = Kind>(task: Task<K> | string, options: WaitOptions = {}): Promise<Task<K>> {
    const id = typeof task === "string" ? task : task.id;
    let last: Task<K> | undefined = typeof task === "string" ? undefined : task;
    if (last && TERMINAL_TASK_STATUSES.includes(last.status)) return last;
    const deadline = options.timeoutMs === undefined ? Infinity : Date.now() + options.timeoutMs;
    for (;;) {
      const remaining = deadline - Date.now();
      if (remaining <= 0) {
        last ??= (await this.getTask(id, { signal: options.signal })) as Task<K>;
        if (TERMINAL_TASK_STATUSES.includes(last.status)) return last;
        throw new WaitTimeoutError(`task ${id} is still ${last.status} after ${options.timeoutMs} ms`, last);
      }
      const poll = Math.min(remaining, this.longPollMs);
      const started = Date.now();
      last = (await this.getTask(id, { waitMs: poll, signal: options.signal })) as Task<K>;
      if (TERMINAL_TASK_STATUSES.includes(last.status)) return last;
      // A server that answered at once (an older one without ?wait= on this route) is
      // polled gently instead of in a busy loop.
      if (Date.now() - started < 50) await sleep(Math.min(250, Math.max(0, deadline - Date.now())), options.signal);
    }
  }

  /** Submits, then waits for the end: `submit` + `wait` with one deadline. */
  async run<K extends Kind>(submission: Submission<K>, options: SubmitOptions & WaitOptions = {}): Promise<Task<K>> {
    const started = Date.now();
    const task = await this.submit(submission, {
      ...options,
      waitMs: Math.min(options.timeoutMs ?? this.longPollMs, this.longPollMs),
    });
    const timeoutMs = options.timeoutMs === undefined ? undefined : Math.max(0, options.timeoutMs - (Date.now() - started));
    return this.wait(task, { timeoutMs, signal: options.signal });
  }

  /**
   * `GET /v1/tasks/{id}/events`: the task's output as the provider sends it (`delta`),
   * `restart` when it starts over, and last `end` with the task. Stopping early (`break`,
   * an abort) changes nothing about the task.
   */
  async *events(id: string, options: { signal?: AbortSignal } = {}): AsyncGenerator<TaskStreamEvent> {
    const headers: Record<string, string> = { Accept: "text/event-stream" };
    if (this.apiKey) headers.Authorization = `Bearer ${this.apiKey}`;
    if (this.subject) headers["X-Tollgate-Subject"] = this.subject;
    const url = this.url(`/v1/tasks/${encodeURIComponent(id)}/events`, undefined);
    const response = await this.fetchImpl(url, { method: "GET", headers, signal: options.signal });
    if (!response.ok) {
      const text = await response.text();
      let detail: ErrorDetail | undefined;
      try {
        detail = (JSON.parse(text) as { error?: ErrorDetail }).error;
      } catch {
        detail = undefined;
      }
      throw errorFor(response.status, detail, response.headers.get("retry-after"));
    }
    if (!response.body) return;
    let name = "message";
    let data: string[] = [];
    // A blank line ends an event; `:` lines are comments (keep-alives).
    const line = (text: string): TaskStreamEvent | undefined => {
      if (text === "") {
        const event = data.length ? ({ event: name, data: JSON.parse(data.join("\n")) } as TaskStreamEvent) : undefined;
        name = "message";
        data = [];
        return event;
      }
      if (text.startsWith(":")) return undefined;
      const colon = text.indexOf(":");
      const field = colon < 0 ? text : text.slice(0, colon);
      let value = colon < 0 ? "" : text.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") name = value;
      else if (field === "data") data.push(value);
      return undefined;
    };
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        for (let end = buffer.indexOf("\n"); end >= 0; end = buffer.indexOf("\n")) {
          const event = line(buffer.slice(0, end).replace(/\r$/, ""));
          buffer = buffer.slice(end + 1);
          if (event) yield event;
        }
      }
      const last = (buffer ? line(buffer) : undefined) ?? line("");
      if (last) yield last;
    } finally {
      reader.cancel().catch(() => undefined);
    }
  }

  /** `POST /v1/tasks/{id}/cancel`: a queued or running task becomes `canceled`; a finished one is unchanged. */
  async cancel(id: string, options: CallOptions = {}): Promise<Task> {
    const answer = await this.request<Task>({
      method: "POST",
      path: `/v1/tasks/${encodeURIComponent(id)}/cancel`,
      idempotent: true,
      options,
    });
    return answer.data;
  }

  /** `POST /v1/tasks/release`: the application stored (or discarded) that task's result. */
  async release(args: { effect_key: string; scope: string }, options: CallOptions = {}): Promise<{ released: boolean }> {
    const answer = await this.request<Schemas["ReleaseAnswer"]>({
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
  async unreleasedSources(scope: string, query: { step?: string; after?: string } = {}, options: CallOptions = {}): Promise<UnreleasedPage> {
    const answer = await this.request<UnreleasedPage>({
      method: "GET",
      path: `/v1/scopes/${encodeURIComponent(scope)}/unreleased-sources`,
      query: { step: query.step, after: query.after },
      idempotent: true,
      options,
    });
    return answer.data;
  }

  /** Every unreleased source of the scope, page after page. */
  async *allUnreleasedSources(scope: string, query: { step?: string } = {}, options: CallOptions = {}): AsyncGenerator<UnreleasedSource> {
    let after: string | undefined;
    for (;;) {
      const page = await this.unreleasedSources(scope, { step: query.step, after }, options);
      yield* page.sources;
      if (!page.next) return;
      after = page.next;
    }
  }

  /**
   * `GET /v1/scopes`: one page of the app's scopes with admitted tasks still active or an
   * admission in the last 24 h, in name order. A key bound to a subject gets `ForbiddenError`.
   */
  async listScopes(query: PageQuery = {}, options: CallOptions = {}): Promise<ScopePage> {
    const answer = await this.request<ScopePage>({
      method: "GET",
      path: "/v1/scopes",
      query: { limit: intParam(query.limit), next: query.next },
      idempotent: true,
      options,
    });
    return answer.data;
  }

  /** Every scope `listScopes` lists, page after page. */
  async *allScopes(query: PageQuery = {}, options: CallOptions = {}): AsyncGenerator<Scope> {
    for await (const page of this.pages(query.next, (next) => this.listScopes({ ...query, next }, options))) {
      yield* page.scopes;
    }
  }

  /** `GET /v1/scopes/{scope}`: its policy in force and live admission state (any scope: a quiet one shows a full bucket and zeros). */
  async getScope(scope: string, options: CallOptions = {}): Promise<Scope> {
    const answer = await this.request<Scope>({
      method: "GET",
      path: `/v1/scopes/${encodeURIComponent(scope)}`,
      idempotent: true,
      options,
    });
    return answer.data;
  }

  /** `GET /v1/scopes/{scope}/usage`: the scope's spend and model tokens in the 24 h window (docs/conformance.md#cost-usage). */
  async scopeUsage(scope: string, options: CallOptions = {}): Promise<UsageReport> {
    const answer = await this.request<UsageReport>({
      method: "GET",
      path: `/v1/scopes/${encodeURIComponent(scope)}/usage`,
      idempotent: true,
      options,
    });
    return answer.data;
  }

  /** `DELETE /v1/scopes/{scope}/tasks`: deletes the owner's data (of one source when given). */
  async deleteOwnerData(scope: string, query: { source?: string } = {}, options: CallOptions = {}): Promise<Deleted> {
    const answer = await this.request<Deleted>({
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
  async createRun(args: { scope: string; input?: unknown }, options: CallOptions = {}): Promise<Run> {
    const answer = await this.request<Run>({
      method: "POST",
      path: "/v1/runs",
      body: { scope: args.scope, input: args.input ?? {} },
      idempotent: false,
      options,
    });
    return answer.data;
  }

  /** `GET /v1/runs`: one page of the app's runs, newest first (summaries: `getRun` has input, output and steps). */
  async listRuns(query: RunListQuery = {}, options: CallOptions = {}): Promise<RunPage> {
    const answer = await this.request<RunPage>({
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
  async *allRuns(query: RunListQuery = {}, options: CallOptions = {}): AsyncGenerator<RunSummary> {
    for await (const page of this.pages(query.next, (next) => this.listRuns({ ...query, next }, options))) {
      yield* page.runs;
    }
  }

  /** `GET /v1/runs/{id}` (with `waitMs`: `?wait=`, answers once terminal or the wait passed). */
  async getRun(id: string, options: CallOptions & { waitMs?: number } = {}): Promise<Run> {
    const answer = await this.request<Run>({
      method: "GET",
      path: `/v1/runs/${encodeURIComponent(id)}`,
      query: { wait: options.waitMs === undefined ? undefined : waitParam(options.waitMs) },
      idempotent: true,
      options,
    });
    return answer.data;
  }

  /** Waits until the run is terminal (long-poll loop); like `wait` for tasks. */
  async waitRun(run: Run | string, options: WaitOptions = {}): Promise<Run> {
    const id = typeof run === "string" ? run : run.id;
    let last: Run | undefined = typeof run === "string" ? undefined : run;
    if (last && TERMINAL_RUN_STATES.includes(last.state)) return last;
    const deadline = options.timeoutMs === undefined ? Infinity : Date.now() + options.timeoutMs;
    for (;;) {
      const remaining = deadline - Date.now();
      if (remaining <= 0) {
        last ??= await this.getRun(id, { signal: options.signal });
        if (TERMINAL_RUN_STATES.includes(last.state)) return last;
        throw new WaitTimeoutError(`run ${id} is still ${last.state} after ${options.timeoutMs} ms`, last);
      }
      const started = Date.now();
      last = await this.getRun(id, { waitMs: Math.min(remaining, this.longPollMs), signal: options.signal });
      if (TERMINAL_RUN_STATES.includes(last.state)) return last;
      if (Date.now() - started < 50) await sleep(Math.min(250, Math.max(0, deadline - Date.now())), options.signal);
    }
  }

  /** `POST /v1/runs/{id}/cancel`: cancels the run with its queued and running tasks. */
  async cancelRun(id: string, options: CallOptions = {}): Promise<Run> {
    const answer = await this.request<Run>({
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
  async registerPipeline(
    nameOrFile: string | { name: string; definition: PipelineDefinition },
    definition?: PipelineDefinition,
    options: CallOptions = {},
  ): Promise<Pipeline> {
    const body = typeof nameOrFile === "string" ? { name: nameOrFile, definition } : nameOrFile;
    const answer = await this.request<Pipeline>({
      method: "POST",
      path: "/v1/pipelines",
      body,
      idempotent: true, // registering the same definition again changes nothing
      options,
    });
    return answer.data;
  }

  /** `GET /v1/pipelines`: one page of the app's pipelines in name order, each with its versions (newest first). */
  async listPipelines(query: PageQuery = {}, options: CallOptions = {}): Promise<PipelinePage> {
    const answer = await this.request<PipelinePage>({
      method: "GET",
      path: "/v1/pipelines",
      query: { limit: intParam(query.limit), next: query.next },
      idempotent: true,
      options,
    });
    return answer.data;
  }

  /** Every pipeline `listPipelines` lists, page after page. */
  async *allPipelines(query: PageQuery = {}, options: CallOptions = {}): AsyncGenerator<PipelineSummary> {
    for await (const page of this.pages(query.next, (next) => this.listPipelines({ ...query, next }, options))) {
      yield* page.pipelines;
    }
  }

  /** `GET /v1/pipelines/{name}` (the newest version, or `version`). */
  async getPipeline(name: string, query: { version?: string } = {}, options: CallOptions = {}): Promise<Pipeline> {
    const answer = await this.request<Pipeline>({
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
  async startPipeline(
    name: string,
    args: { scope: string; input?: unknown; version?: string; idempotencyKey?: string; waitMs?: number },
    options: CallOptions = {},
  ): Promise<Run> {
    const body: Record<string, unknown> = { scope: args.scope, input: args.input ?? {} };
    if (args.version !== undefined) body.version = args.version;
    const answer = await this.request<Run>({
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

  // ---- webhooks ----

  /**
   * `POST /v1/webhooks`: a webhook endpoint, with its signing secret (made when `secret` is
   * absent). Not idempotent on the server, so only a 503 (nothing written) is retried, never
   * a lost connection. A key bound to a subject gets `ForbiddenError`; an internal or
   * non-`https` address the operator did not allow is `InvalidRequestError`.
   */
  async createWebhook(body: WebhookCreate, options: CallOptions = {}): Promise<Webhook> {
    const answer = await this.request<Webhook>({
      method: "POST",
      path: "/v1/webhooks",
      body,
      idempotent: false,
      options,
    });
    return answer.data;
  }

  /** `GET /v1/webhooks`: the app's endpoints, oldest first (without their secrets). */
  async listWebhooks(options: CallOptions = {}): Promise<Webhook[]> {
    const answer = await this.request<Schemas["WebhookListView"]>({ method: "GET", path: "/v1/webhooks", idempotent: true, options });
    return answer.data.webhooks;
  }

  /** `GET /v1/webhooks/{id}`: one endpoint, with its secret; `NotFoundError` for a missing one or another app's. */
  async getWebhook(id: string, options: CallOptions = {}): Promise<Webhook> {
    const answer = await this.request<Webhook>({
      method: "GET",
      path: `/v1/webhooks/${encodeURIComponent(id)}`,
      idempotent: true,
      options,
    });
    return answer.data;
  }

  /**
   * `PATCH /v1/webhooks/{id}`: replaces each field given (`description: null` clears it).
   * An endpoint from the configuration file is read-only: `ConflictError`.
   */
  async updateWebhook(id: string, changes: WebhookUpdate, options: CallOptions = {}): Promise<Webhook> {
    const answer = await this.request<Webhook>({
      method: "PATCH",
      path: `/v1/webhooks/${encodeURIComponent(id)}`,
      body: changes,
      idempotent: true, // setting the same fields again changes nothing
      options,
    });
    return answer.data;
  }

  /** `DELETE /v1/webhooks/{id}`: deletes the endpoint and its deliveries (one from the configuration file: `ConflictError`). */
  async deleteWebhook(id: string, options: CallOptions = {}): Promise<void> {
    await this.request<undefined>({
      method: "DELETE",
      path: `/v1/webhooks/${encodeURIComponent(id)}`,
      idempotent: true,
      options,
    });
  }

  /** `GET /v1/webhooks/{id}/deliveries`: the endpoint's deliveries, newest first (`limit` 1–500, default 50). */
  async listDeliveries(
    id: string,
    query: { state?: DeliveryState; limit?: number } = {},
    options: CallOptions = {},
  ): Promise<WebhookDelivery[]> {
    const answer = await this.request<Schemas["DeliveryListView"]>({
      method: "GET",
      path: `/v1/webhooks/${encodeURIComponent(id)}/deliveries`,
      query: { state: query.state, limit: intParam(query.limit) },
      idempotent: true,
      options,
    });
    return answer.data.deliveries;
  }

  /**
   * `POST /v1/webhooks/{id}/deliveries/{delivery}/replay`: a new pending delivery of the same
   * event (same `webhook-id`), due now — of any delivery, delivered, pending or dead. Each call
   * makes one, so only a 503 (nothing written) is retried, never a lost connection.
   */
  async replayDelivery(id: string, delivery: string, options: CallOptions = {}): Promise<WebhookDelivery> {
    const answer = await this.request<WebhookDelivery>({
      method: "POST",
      path: `/v1/webhooks/${encodeURIComponent(id)}/deliveries/${encodeURIComponent(delivery)}/replay`,
      idempotent: false,
      options,
    });
    return answer.data;
  }

  // ---- discovery and operations ----

  /** `GET /v1/kinds`: each kind's request and output JSON Schemas. */
  async kinds(options: CallOptions = {}): Promise<KindInfo[]> {
    const answer = await this.request<{ kinds: KindInfo[] }>({ method: "GET", path: "/v1/kinds", idempotent: true, options });
    return answer.data.kinds;
  }

  /** `GET /v1/models`: the configured models. */
  async models(options: CallOptions = {}): Promise<Model[]> {
    const answer = await this.request<Schemas["ModelsAnswer"]>({ method: "GET", path: "/v1/models", idempotent: true, options });
    return answer.data.models;
  }

  /** `GET /v1/usage`: the app's spend and model tokens in the 24 h window, all scopes (docs/conformance.md#cost-usage). A key bound to a subject gets `ForbiddenError`. */
  async usage(options: CallOptions = {}): Promise<UsageReport> {
    const answer = await this.request<UsageReport>({ method: "GET", path: "/v1/usage", idempotent: true, options });
    return answer.data;
  }

  /** `GET /v1/stats`: the app's queue, throughput, failures, cache hit rate and latency over the last hour. */
  async stats(options: CallOptions = {}): Promise<Stats> {
    const answer = await this.request<Stats>({ method: "GET", path: "/v1/stats", idempotent: true, options });
    return answer.data;
  }

  /** `GET /healthz`: `{status: "ok"}` while the process runs. */
  async healthz(options: CallOptions = {}): Promise<{ status: string }> {
    const answer = await this.request<{ status: string }>({ method: "GET", path: "/healthz", idempotent: true, anonymous: true, options });
    return answer.data;
  }

  /** `GET /readyz`: `{status: "ready"}`, or `UnavailableError` when the database does not answer (not retried). */
  async readyz(options: CallOptions = {}): Promise<{ status: string }> {
    const answer = await this.request<{ status: string }>({
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
  private async *pages<P extends { next?: string | null }>(
    first: string | undefined,
    page: (next: string | undefined) => Promise<P>,
  ): AsyncGenerator<P> {
    let next = first;
    for (;;) {
      const answer = await page(next);
      yield answer;
      if (!answer.next) return;
      next = answer.next;
    }
  }

  private url(path: string, query: Record<string, string | undefined> | undefined): string {
    const params = new URLSearchParams();
    for (const [k, v] of Object.entries(query ?? {})) if (v !== undefined) params.set(k, v);
    const qs = params.toString();
    return `${this.baseUrl}${path}${qs ? `?${qs}` : ""}`;
  }

  private backoff(attempt: number): number {
    const exp = Math.min(this.retryMaxDelayMs, this.retryBaseDelayMs * 2 ** attempt);
    return exp / 2 + Math.random() * (exp / 2);
  }

  /**
   * One call with its retries: a 503 or (for idempotent calls) a connection error is retried
   * with backoff up to `maxRetries` times; a 429 after its `Retry-After` when the call opted
   * into `retryAdmission`; all within the call's deadline. The body and its idempotency key
   * are the same on every attempt.
   */
  private async request<T>(spec: RequestSpec): Promise<Answer<T>> {
    const options = spec.options ?? {};
    const signal = options.signal;
    const retryAdmission = options.retryAdmission ?? this.retryAdmission;
    const deadline = Date.now() + (options.deadlineMs ?? this.deadlineMs);
    const headers: Record<string, string> = { Accept: "application/json", ...spec.headers };
    if (this.apiKey && !spec.anonymous) headers.Authorization = `Bearer ${this.apiKey}`;
    if (this.subject && !spec.anonymous) headers["X-Tollgate-Subject"] = this.subject;
    let body: string | undefined;
    if (spec.body !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(spec.body);
    }
    const url = this.url(spec.path, spec.query);
    const canRetry = spec.retry ?? true;
    let failures = 0;
    for (;;) {
      let response: Response;
      try {
        response = await this.fetchImpl(url, { method: spec.method, headers, body, signal });
      } catch (cause) {
        if (signal?.aborted) throw signal.reason;
        const error = new ConnectionError(`cannot reach ${this.baseUrl}: ${String((cause as Error)?.message ?? cause)}`, cause);
        const delay = this.backoff(failures);
        if (!canRetry || !spec.idempotent || failures >= this.maxRetries || Date.now() + delay > deadline) throw error;
        failures += 1;
        await sleep(delay, signal);
        continue;
      }
      const text = await response.text();
      if (response.ok) {
        return { status: response.status, data: (text ? JSON.parse(text) : undefined) as T };
      }
      let detail: ErrorDetail | undefined;
      try {
        detail = (JSON.parse(text) as { error?: ErrorDetail }).error;
      } catch {
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
export function batchItemError(item: BatchItem): TollgateError | undefined {
  if (!item.error) return undefined;
  return errorFor(item.status, item.error, null);
}

export default Tollgate;
