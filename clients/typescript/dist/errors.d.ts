import type { components } from "./generated/openapi.js";
/** The `error` object of every error answer: `{"error": {code, message, retry_after_s?}}`. */
export type ErrorDetail = components["schemas"]["ErrorDetail"];
/** Every error this client throws. */
export declare class TollgateError extends Error {
    /** The HTTP status (0 when no answer arrived). */
    readonly status: number;
    /** The server's stable code (`not_found`, `WORKFLOW_AI_RATE_LIMIT`, …), or the client's own. */
    readonly code: string;
    /** The error body as the server sent it, when it sent one. */
    readonly detail: ErrorDetail | undefined;
    constructor(status: number, code: string, message: string, detail?: ErrorDetail, options?: {
        cause?: unknown;
    });
}
/**
 * 400: `malformed_request` (not JSON, the wrong shape, a bad `?wait=`, filter or cursor, a bad
 * subject header), `ambiguous_request` (a key named twice, a repeated header),
 * `reserved_effect_key` (an effect key in the engine's `run:` or `openai-` namespace).
 */
export declare class BadRequestError extends TollgateError {
}
/** 401 `unauthorized`: no key, or an unknown one. */
export declare class UnauthorizedError extends TollgateError {
}
/** 403 `subject_not_allowed`: the key may not assert that subject, or (scopes, usage, stats, owner deletion) is bound to one. */
export declare class ForbiddenError extends TollgateError {
}
/** 404 `not_found`: missing, or another app's (reported exactly alike). */
export declare class NotFoundError extends TollgateError {
}
/** 409: `idempotency_key_conflict` (the key names a different request), `run_canceled`, `invalid_state`. */
export declare class ConflictError extends TollgateError {
}
/** 413 `request_too_large`: over `server.max_request_bytes` measured on the canonical JSON. */
export declare class RequestTooLargeError extends TollgateError {
}
/** 422: `invalid_request`, `unknown_model`, `budget_not_allowed`, `output_bound_required`. */
export declare class InvalidRequestError extends TollgateError {
}
/**
 * 429: admission refused the task (SPEC §4, §13), or the app has no waiter or batch slot
 * free. `code` names the limit (`WORKFLOW_AI_RATE_LIMIT`, `WORKFLOW_AI_CAPACITY`,
 * `WORKFLOW_AI_SOURCE_BUDGET`, `WORKFLOW_AI_DAILY_BUDGET`, `WORKFLOW_AI_SPEND_BUDGET`,
 * `WORKFLOW_AI_TOKEN_RATE_LIMIT`, `WORKFLOW_AI_TOO_MANY_WAITERS`,
 * `WORKFLOW_AI_TOO_MANY_BATCHES`); `retryAfter` is the seconds until a retry may succeed,
 * when the server knows it (the rate limit's next token). Nothing was written.
 */
export declare class AdmissionError extends TollgateError {
    readonly retryAfter: number | undefined;
    constructor(status: number, code: string, message: string, retryAfter: number | undefined, detail?: ErrorDetail);
}
/** 503 `database_unavailable`: nothing was written; retried with backoff before it is thrown. */
export declare class UnavailableError extends TollgateError {
}
/** Any other error status (500 `internal`, 405, …). */
export declare class ServerError extends TollgateError {
}
/** No answer: the connection failed or was reset (retried with backoff before it is thrown). */
export declare class ConnectionError extends TollgateError {
    constructor(message: string, cause: unknown);
}
/**
 * `wait` reached the caller's deadline before the task (or run) was terminal. The task is
 * untouched and still going; `last` is how it looked at the last answer.
 */
export declare class WaitTimeoutError<T = unknown> extends TollgateError {
    readonly last: T;
    constructor(message: string, last: T);
}
/** The error class for an error answer. */
export declare function errorFor(status: number, detail: ErrorDetail | undefined, retryAfterHeader: string | null): TollgateError;
