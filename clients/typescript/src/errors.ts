import type { components } from "./generated/openapi.js";

/** The `error` object of every error answer: `{"error": {code, message, retry_after_s?}}`. */
export type ErrorDetail = components["schemas"]["ErrorDetail"];

/** Every error this client throws. */
export class TollgateError extends Error {
  /** The HTTP status (0 when no answer arrived). */
  readonly status: number;
  /** The server's stable code (`not_found`, `WORKFLOW_AI_RATE_LIMIT`, …), or the client's own. */
  readonly code: string;
  /** The error body as the server sent it, when it sent one. */
  readonly detail: ErrorDetail | undefined;

  constructor(status: number, code: string, message: string, detail?: ErrorDetail, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.status = status;
    this.code = code;
    this.detail = detail;
  }
}

/**
 * 400: `malformed_request` (not JSON, the wrong shape, a bad `?wait=`, filter or cursor, a bad
 * subject header), `ambiguous_request` (a key named twice, a repeated header),
 * `reserved_effect_key` (an effect key in the engine's `run:` or `openai-` namespace).
 */
export class BadRequestError extends TollgateError {}
/** 401 `unauthorized`: no key, or an unknown one. */
export class UnauthorizedError extends TollgateError {}
/** 403 `subject_not_allowed`: the key may not assert that subject, or (scopes, usage, stats, owner deletion) is bound to one. */
export class ForbiddenError extends TollgateError {}
/** 404 `not_found`: missing, or another app's (reported exactly alike). */
export class NotFoundError extends TollgateError {}
/** 409: `idempotency_key_conflict` (the key names a different request), `run_canceled`, `invalid_state`. */
export class ConflictError extends TollgateError {}
/** 413 `request_too_large`: over `server.max_request_bytes` measured on the canonical JSON. */
export class RequestTooLargeError extends TollgateError {}
/** 422: `invalid_request`, `unknown_model`, `budget_not_allowed`, `output_bound_required`. */
export class InvalidRequestError extends TollgateError {}

/**
 * 429: admission refused the task (docs/conformance.md#admission, docs/conformance.md#money-and-tokens), or the app has no waiter or batch slot
 * free. `code` names the limit (`WORKFLOW_AI_RATE_LIMIT`, `WORKFLOW_AI_CAPACITY`,
 * `WORKFLOW_AI_SOURCE_BUDGET`, `WORKFLOW_AI_DAILY_BUDGET`, `WORKFLOW_AI_SPEND_BUDGET`,
 * `WORKFLOW_AI_TOKEN_RATE_LIMIT`, `WORKFLOW_AI_TOO_MANY_WAITERS`,
 * `WORKFLOW_AI_TOO_MANY_BATCHES`); `retryAfter` is the seconds until a retry may succeed,
 * when the server knows it (the rate limit's next token). Nothing was written.
 */
export class AdmissionError extends TollgateError {
  readonly retryAfter: number | undefined;
  constructor(status: number, code: string, message: string, retryAfter: number | undefined, detail?: ErrorDetail) {
    super(status, code, message, detail);
    this.retryAfter = retryAfter;
  }
}

/** 503 `database_unavailable`: nothing was written; retried with backoff before it is thrown. */
export class UnavailableError extends TollgateError {}
/** Any other error status (500 `internal`, 405, …). */
export class ServerError extends TollgateError {}

/** No answer: the connection failed or was reset (retried with backoff before it is thrown). */
export class ConnectionError extends TollgateError {
  constructor(message: string, cause: unknown) {
    super(0, "connection_error", message, undefined, { cause });
  }
}

/**
 * `wait` reached the caller's deadline before the task (or run) was terminal. The task is
 * untouched and still going; `last` is how it looked at the last answer.
 */
export class WaitTimeoutError<T = unknown> extends TollgateError {
  readonly last: T;
  constructor(message: string, last: T) {
    super(0, "wait_timeout", message);
    this.last = last;
  }
}

/** The error class for an error answer. */
export function errorFor(status: number, detail: ErrorDetail | undefined, retryAfterHeader: string | null): TollgateError {
  const code = detail?.code ?? `http_${status}`;
  const message = detail?.message ?? `HTTP ${status}`;
  switch (status) {
    case 400:
      return new BadRequestError(status, code, message, detail);
    case 401:
      return new UnauthorizedError(status, code, message, detail);
    case 403:
      return new ForbiddenError(status, code, message, detail);
    case 404:
      return new NotFoundError(status, code, message, detail);
    case 409:
      return new ConflictError(status, code, message, detail);
    case 413:
      return new RequestTooLargeError(status, code, message, detail);
    case 422:
      return new InvalidRequestError(status, code, message, detail);
    case 429: {
      const header = retryAfterHeader === null ? NaN : Number(retryAfterHeader);
      const retryAfter = detail?.retry_after_s ?? (Number.isFinite(header) ? header : undefined);
      return new AdmissionError(status, code, message, retryAfter ?? undefined, detail);
    }
    case 503:
      return new UnavailableError(status, code, message, detail);
    default:
      return new ServerError(status, code, message, detail);
  }
}
