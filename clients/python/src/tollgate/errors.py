"""The errors the client raises, one class per kind of answer (docs/api.md, Errors)."""

from __future__ import annotations

from typing import Generic, TypeVar

from ._generated import ErrorDetail

T = TypeVar("T")


class TollgateError(Exception):
    """Every error this client raises.

    ``status`` is the HTTP status (0 when no answer arrived), ``code`` the server's stable
    code (``not_found``, ``WORKFLOW_AI_RATE_LIMIT``, …) and ``message`` its message.
    """

    def __init__(
        self, status: int, code: str, message: str, detail: ErrorDetail | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status}, code={self.code!r}, message={self.message!r})"


class BadRequestError(TollgateError):
    """400: ``malformed_request`` (not JSON, the wrong shape, a bad ``?wait=``, filter or
    cursor, a bad subject), ``ambiguous_request`` (a key named twice, a repeated header),
    ``reserved_effect_key`` (an effect key in the engine's ``run:`` or ``openai-`` namespace)."""


class UnauthorizedError(TollgateError):
    """401 ``unauthorized``: no key, or an unknown one."""


class ForbiddenError(TollgateError):
    """403 ``subject_not_allowed``: the key may not assert that subject, or (scopes, usage,
    stats, owner deletion) is bound to one."""


class NotFoundError(TollgateError):
    """404 ``not_found``: missing, or another app's (reported exactly alike)."""


class ConflictError(TollgateError):
    """409: ``idempotency_key_conflict`` (the key names a different request), ``run_canceled``, ``invalid_state``."""


class RequestTooLargeError(TollgateError):
    """413 ``request_too_large``: over ``server.max_request_bytes`` measured on the canonical JSON."""


class InvalidRequestError(TollgateError):
    """422: ``invalid_request``, ``unknown_model``, ``budget_not_allowed``, ``output_bound_required``."""


class AdmissionError(TollgateError):
    """429: admission refused the task (docs/conformance.md#admission, docs/conformance.md#money-and-tokens), or the app has no waiter or batch slot
    free; nothing was written.

    ``code`` names the limit (``WORKFLOW_AI_RATE_LIMIT``, ``WORKFLOW_AI_CAPACITY``,
    ``WORKFLOW_AI_SOURCE_BUDGET``, ``WORKFLOW_AI_DAILY_BUDGET``, ``WORKFLOW_AI_SPEND_BUDGET``,
    ``WORKFLOW_AI_TOKEN_RATE_LIMIT``, ``WORKFLOW_AI_TOO_MANY_WAITERS``,
    ``WORKFLOW_AI_TOO_MANY_BATCHES``); ``retry_after`` is the seconds until a retry may
    succeed, when the server knows it.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        retry_after: float | None,
        detail: ErrorDetail | None = None,
    ) -> None:
        super().__init__(status, code, message, detail)
        self.retry_after = retry_after


class UnavailableError(TollgateError):
    """503 ``database_unavailable``: nothing was written; retried with backoff before it is raised."""


class ServerError(TollgateError):
    """Any other error status (500 ``internal``, 405, …)."""


class ConnectionError(TollgateError):  # noqa: A001 - the client's own, exported as tollgate.ConnectionError
    """No answer: the connection failed or was reset (retried with backoff before it is raised)."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "connection_error", message)


class WaitTimeoutError(TollgateError, Generic[T]):
    """``wait`` reached the caller's deadline first. The task (or run) is untouched and goes on;
    ``last`` is how it looked at the last answer."""

    def __init__(self, message: str, last: T) -> None:
        super().__init__(0, "wait_timeout", message)
        self.last = last


_BY_STATUS: dict[int, type[TollgateError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    413: RequestTooLargeError,
    422: InvalidRequestError,
    503: UnavailableError,
}


def error_for(status: int, detail: ErrorDetail | None, retry_after_header: str | None) -> TollgateError:
    """The error for an error answer."""
    code = detail["code"] if detail else f"http_{status}"
    message = detail["message"] if detail else f"HTTP {status}"
    if status == 429:
        retry_after: float | None = None
        if detail and detail.get("retry_after_s") is not None:
            retry_after = float(detail["retry_after_s"] or 0)
        elif retry_after_header is not None:
            try:
                retry_after = float(retry_after_header)
            except ValueError:
                retry_after = None
        return AdmissionError(status, code, message, retry_after, detail)
    cls = _BY_STATUS.get(status, ServerError)
    return cls(status, code, message, detail)
