"""What both clients share: each API call as data (method, path, query, body, headers, whether
a lost connection may be retried), the answer's error mapping, and the retry policy."""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Mapping, TypeVar, cast

import httpx

from ._generated import ErrorDetail
from .errors import AdmissionError, TollgateError, UnavailableError, error_for

T = TypeVar("T")

TERMINAL_TASK_STATUSES = frozenset({"succeeded", "failed", "canceled"})
TERMINAL_RUN_STATES = frozenset({"succeeded", "failed", "canceled"})

#: Extra seconds a long-poll's HTTP read may take beyond its ``?wait=``.
LONG_POLL_SLACK = 15.0


def new_idempotency_key() -> str:
    """A new effect key (a random UUID)."""
    return str(uuid.uuid4())


def wait_param(seconds: float) -> str:
    """``?wait=`` as the server reads it."""
    return f"{max(0, int(seconds * 1000 + 0.999))}ms"


@dataclass
class Call(Generic[T]):
    """One HTTP call of the API."""

    method: Literal["GET", "POST", "PATCH", "DELETE"]
    path: str
    query: dict[str, str] = field(default_factory=dict)
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    #: A lost connection may be retried: a read, or a write carrying an idempotency key.
    idempotent: bool = True
    #: Retries allowed at all (readyz: no).
    retry: bool = True
    #: No Authorization header (operations endpoints).
    anonymous: bool = False
    #: The HTTP timeout of this call, when it long-polls.
    timeout: float | None = None
    #: The answer's part this call returns (``kinds`` for ``GET /v1/kinds``, …).
    unwrap: str | None = None


@dataclass
class RetryPolicy:
    """How a call is retried: 503s and (idempotent) connection errors with exponential backoff
    and jitter; 429s after ``Retry-After`` only when ``retry_admission``; all within ``deadline``
    seconds."""

    max_retries: int = 4
    base_delay: float = 0.2
    max_delay: float = 5.0
    retry_admission: bool = False
    deadline: float = 60.0

    def backoff(self, failures: int) -> float:
        exp: float = min(self.max_delay, self.base_delay * (2**failures))
        return exp / 2 + random.random() * exp / 2


class Attempts:
    """The retry loop's state for one call: ``next_delay`` says how long to sleep before the
    next attempt, or raises the error."""

    def __init__(
        self,
        policy: RetryPolicy,
        call: Call[Any],
        retry_admission: bool | None,
        deadline: float | None,
    ) -> None:
        self.policy = policy
        self.call = call
        self.retry_admission = (
            policy.retry_admission if retry_admission is None else retry_admission
        )
        self.deadline = time.monotonic() + (policy.deadline if deadline is None else deadline)
        self.failures = 0

    def after_connection_error(self, error: TollgateError) -> float:
        delay = self.policy.backoff(self.failures)
        if (
            not self.call.retry
            or not self.call.idempotent
            or self.failures >= self.policy.max_retries
            or time.monotonic() + delay > self.deadline
        ):
            raise error
        self.failures += 1
        return delay

    def after_error(self, error: TollgateError) -> float:
        if isinstance(error, UnavailableError) and self.call.retry:
            delay = self.policy.backoff(self.failures)
            if self.failures < self.policy.max_retries and time.monotonic() + delay <= self.deadline:
                self.failures += 1
                return delay
        if isinstance(error, AdmissionError) and self.retry_admission and self.call.retry:
            delay = error.retry_after if error.retry_after is not None else 1.0
            if time.monotonic() + delay <= self.deadline:
                return delay
        raise error


def request_args(
    call: Call[Any], api_key: str | None, subject: str | None
) -> dict[str, Any]:
    """The arguments of ``httpx.Client.request`` for a call."""
    headers = {"Accept": "application/json", **call.headers}
    if api_key and not call.anonymous:
        headers["Authorization"] = f"Bearer {api_key}"
    if subject and not call.anonymous:
        headers["X-Tollgate-Subject"] = subject
    args: dict[str, Any] = {
        "method": call.method,
        "url": call.path,
        "params": call.query or None,
        "headers": headers,
    }
    if call.body is not None:
        headers["Content-Type"] = "application/json"
        args["content"] = json.dumps(call.body).encode()
    if call.timeout is not None:
        args["timeout"] = httpx.Timeout(call.timeout, connect=10.0)
    return args


def answer(call: Call[T], response: httpx.Response) -> T:
    """The call's result from a 2xx answer; raises the typed error for any other."""
    if response.is_success:
        data: Any = response.json() if response.content else None
        if call.unwrap is not None and isinstance(data, dict):
            data = data[call.unwrap]
        return cast(T, data)
    detail: ErrorDetail | None = None
    try:
        parsed = response.json()
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
            detail = cast(ErrorDetail, parsed["error"])
    except ValueError:
        detail = None
    raise error_for(response.status_code, detail, response.headers.get("retry-after"))


def clean(query: Mapping[str, str | None]) -> dict[str, str]:
    return {k: v for k, v in query.items() if v is not None}
