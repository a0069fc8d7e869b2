"""The sync (:class:`Tollgate`) and async (:class:`AsyncTollgate`) clients."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar, Union

from typing_extensions import Unpack

import anyio
import httpx

from . import _api
from ._calls import (
    TERMINAL_RUN_STATES,
    TERMINAL_TASK_STATUSES,
    Attempts,
    Call,
    RetryPolicy,
    answer,
    request_args,
)
from ._generated import (
    BatchAnswer,
    ChatRequest,
    ClassifyManyRequest,
    ClassifyRequest,
    DeletedAnswer,
    DeliveryStateName,
    DeliveryView,
    EmbedRequest,
    ExtractDataRequest,
    GenerateTextRequest,
    Kind,
    KindName,
    KindView,
    ModelView,
    PipelinePageView,
    PipelineSummaryView,
    PipelineView,
    ReleaseAnswer,
    RunPageView,
    RunStateName,
    RunSummaryView,
    RunView,
    ScopePageView,
    ScopeView,
    SourceBody,
    StatsView,
    TaskPageView,
    TaskStatusName,
    TaskView,
    UnreleasedPageView,
    UnreleasedSourceView,
    UsageReportView,
    WebhookEventName,
    WebhookPatchBody,
    WebhookView,
)
from ._sse import SseLines, TaskStreamEvent
from .errors import ConnectionError, TollgateError, WaitTimeoutError

T = TypeVar("T")

#: Any kind's request object (``GET /v1/kinds`` has their JSON Schemas).
KindRequest = Union[
    GenerateTextRequest, ClassifyRequest, ClassifyManyRequest, ExtractDataRequest, ChatRequest,
    EmbedRequest,
]

DEFAULT_BASE_URL = "http://127.0.0.1:8080"
#: Longest single ``?wait=`` a ``wait`` sends (the server caps it at ``server.max_wait``).
DEFAULT_LONG_POLL = 30.0


class _Base:
    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        subject: str | None,
        max_retries: int,
        retry_base_delay: float,
        retry_max_delay: float,
        retry_admission: bool,
        deadline: float,
        long_poll: float,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._subject = subject
        self._policy = RetryPolicy(
            max_retries=max_retries,
            base_delay=retry_base_delay,
            max_delay=retry_max_delay,
            retry_admission=retry_admission,
            deadline=deadline,
        )
        self._long_poll = long_poll


def _submit_call(
    kind: Kind | str,
    request: Mapping[str, Any],
    scope: str | None,
    run_id: str | None,
    source: SourceBody | None,
    step: str | None,
    model: str | None,
    budget: str | None,
    idempotency_key: str | None,
    wait: float | None,
    priority: int | None = None,
) -> Call[TaskView]:
    body = _api.submission_body(
        kind, request, scope=scope, run_id=run_id, source=source, step=step, model=model,
        budget=budget, priority=priority,
    )
    return _api.submit(body, idempotency_key, wait)


def batch_item(
    kind: Kind | str,
    request: Mapping[str, Any],
    *,
    scope: str | None = None,
    run_id: str | None = None,
    source: SourceBody | None = None,
    step: str | None = None,
    model: str | None = None,
    budget: str | None = None,
    effect_key: str | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    """One item of :meth:`Tollgate.submit_batch` (a ``POST /v1/tasks`` body). ``priority``:
    0-9, default 5 (docs/conformance.md#priority: higher starts first within a scope, with ageing)."""
    return _api.submission_body(
        kind,
        request,
        scope=scope,
        run_id=run_id,
        source=source,
        step=step,
        model=model,
        budget=budget,
        effect_key=effect_key,
        priority=priority,
    )



class Tollgate(_Base):
    """The Tollgate HTTP API, whole, over a blocking ``httpx.Client``.

    503s and connection errors of idempotent calls are retried with backoff; 429 admission
    refusals are raised as :class:`~tollgate.AdmissionError`, or retried after their
    ``Retry-After`` when ``retry_admission`` is on — within ``deadline`` seconds per call.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        api_key: str | None = None,
        *,
        subject: str | None = None,
        max_retries: int = 4,
        retry_base_delay: float = 0.2,
        retry_max_delay: float = 5.0,
        retry_admission: bool = False,
        deadline: float = 60.0,
        long_poll: float = DEFAULT_LONG_POLL,
        timeout: float = 30.0,
        http_client: httpx.Client | None = None,
    ) -> None:
        super().__init__(
            base_url, api_key, subject, max_retries, retry_base_delay, retry_max_delay,
            retry_admission, deadline, long_poll,
        )  # fmt: skip
        self._http = http_client or httpx.Client(base_url=self.base_url, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Tollgate:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _send(
        self, call: Call[T], retry_admission: bool | None = None, deadline: float | None = None
    ) -> T:
        attempts = Attempts(self._policy, call, retry_admission, deadline)
        args = request_args(call, self._api_key, self._subject)
        while True:
            try:
                response = self._http.request(**args)
            except httpx.TransportError as e:
                delay = attempts.after_connection_error(
                    ConnectionError(f"cannot reach {self.base_url}: {e!r}")
                )
                time.sleep(delay)
                continue
            try:
                return answer(call, response)
            except TollgateError as error:
                delay = attempts.after_error(error)  # raises it when it is not retried
            time.sleep(delay)

    # ---- tasks ----

    def submit(
        self,
        kind: Kind,
        request: KindRequest,
        *,
        scope: str | None = None,
        run_id: str | None = None,
        source: SourceBody | None = None,
        step: str | None = None,
        model: str | None = None,
        budget: str | None = None,
        priority: int | None = None,
        idempotency_key: str | None = None,
        wait: float | None = None,
        retry_admission: bool | None = None,
        deadline: float | None = None,
    ) -> TaskView:
        """``POST /v1/tasks``. Without ``idempotency_key`` one is made and kept across this
        call's retries, so a retry never creates a second task. ``wait`` (seconds) holds the
        answer until the task is terminal (``?wait=``)."""
        call = _submit_call(
            kind, request, scope, run_id, source, step, model, budget, idempotency_key, wait, priority
        )
        return self._send(call, retry_admission, deadline)

    def submit_batch(self, items: Sequence[Mapping[str, Any]]) -> BatchAnswer:
        """``POST /v1/tasks/batch``: up to 1,000 items (see :func:`tollgate.batch_item`), each
        admitted or refused on its own; items without ``effect_key`` get one."""
        return self._send(_api.submit_batch(items), retry_admission=False)

    def get_task(self, task_id: str, *, wait: float | None = None) -> TaskView:
        """``GET /v1/tasks/{id}`` (``wait``: ``?wait=``); :class:`~tollgate.NotFoundError` for a
        missing task or another app's."""
        return self._send(_api.get_task(task_id, wait))

    def get_task_by_effect_key(self, effect_key: str) -> TaskView:
        """``GET /v1/tasks?effect_key=…``."""
        return self._send(_api.get_task_by_effect_key(effect_key))

    def list_tasks(
        self,
        *,
        scope: str | None = None,
        status: TaskStatusName | Sequence[TaskStatusName] | None = None,
        kind: KindName | None = None,
        step: str | None = None,
        source: str | None = None,
        run_id: str | None = None,
        created_after: str | datetime | None = None,
        created_before: str | datetime | None = None,
        error_code: str | None = None,
        limit: int | None = None,
        next: str | None = None,
    ) -> TaskPageView:
        """``GET /v1/tasks``: one page of the app's tasks, newest first; the filters narrow
        together (``status``: one or several; ``created_after`` inclusive and
        ``created_before`` exclusive, RFC 3339 strings or aware datetimes; ``error_code``: tasks
        that ended with it). A page may be
        short, even empty, and still carry ``next`` (docs/api.md, "Short pages"):
        :meth:`iter_tasks` follows it."""
        return self._send(
            _api.list_tasks(
                scope=scope, status=status, kind=kind, step=step, source=source, run_id=run_id,
                created_after=created_after, created_before=created_before, error_code=error_code,
                limit=limit, next=next,
            )  # fmt: skip
        )

    def iter_tasks(
        self,
        *,
        scope: str | None = None,
        status: TaskStatusName | Sequence[TaskStatusName] | None = None,
        kind: KindName | None = None,
        step: str | None = None,
        source: str | None = None,
        run_id: str | None = None,
        created_after: str | datetime | None = None,
        created_before: str | datetime | None = None,
        error_code: str | None = None,
        limit: int | None = None,
        next: str | None = None,
    ) -> Iterator[TaskView]:
        """Every task :meth:`list_tasks` selects, page after page (``limit``: the page size)."""
        while True:
            page = self.list_tasks(
                scope=scope, status=status, kind=kind, step=step, source=source, run_id=run_id,
                created_after=created_after, created_before=created_before, error_code=error_code,
                limit=limit, next=next,
            )  # fmt: skip
            yield from page["tasks"]
            next = page.get("next")
            if not next:
                return

    def wait(self, task: TaskView | str, *, timeout: float | None = None) -> TaskView:
        """Waits until the task is terminal, looping over the server's ``?wait=`` long-poll.
        Past ``timeout`` seconds it raises :class:`~tollgate.WaitTimeoutError` (the task goes
        on; ``last`` holds it as last seen)."""
        task_id = task if isinstance(task, str) else task["id"]
        last = None if isinstance(task, str) else task
        if last is not None and last["status"] in TERMINAL_TASK_STATUSES:
            return last
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = self._long_poll if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                last = last or self.get_task(task_id)
                if last["status"] in TERMINAL_TASK_STATUSES:
                    return last
                raise WaitTimeoutError(
                    f"task {task_id} is still {last['status']} after {timeout} s", last
                )
            started = time.monotonic()
            last = self.get_task(task_id, wait=min(remaining, self._long_poll))
            if last["status"] in TERMINAL_TASK_STATUSES:
                return last
            if time.monotonic() - started < 0.05:  # a server without ?wait= on this route
                time.sleep(min(0.25, max(0.0, remaining)))

    def run(
        self,
        kind: Kind,
        request: KindRequest,
        *,
        scope: str | None = None,
        run_id: str | None = None,
        source: SourceBody | None = None,
        step: str | None = None,
        model: str | None = None,
        budget: str | None = None,
        idempotency_key: str | None = None,
        timeout: float | None = None,
        retry_admission: bool | None = None,
        deadline: float | None = None,
    ) -> TaskView:
        """Submits and waits for the end (:meth:`submit` then :meth:`wait`, one ``timeout``)."""
        started = time.monotonic()
        first = min(timeout, self._long_poll) if timeout is not None else self._long_poll
        task = self.submit(
            kind, request, scope=scope, run_id=run_id, source=source, step=step, model=model,
            budget=budget, idempotency_key=idempotency_key, wait=first, retry_admission=retry_admission,
            deadline=deadline,
        )  # fmt: skip
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
        return self.wait(task, timeout=left)

    def cancel(self, task_id: str) -> TaskView:
        """``POST /v1/tasks/{id}/cancel``: a queued or running task becomes ``canceled``."""
        return self._send(_api.cancel(task_id))

    def events(self, task_id: str) -> Iterator[TaskStreamEvent]:
        """``GET /v1/tasks/{id}/events``: the task's output as the provider sends it
        (``delta`` events), ``restart`` when it starts over, and last ``end`` with the task
        (docs/api.md, "Streaming a task"). Stopping early changes nothing about the task."""
        call = _api.task_events(task_id)
        args = request_args(call, self._api_key, self._subject)
        args["timeout"] = httpx.Timeout(None, connect=10.0)  # open until the task ends
        with self._http.stream(**args) as response:
            if not response.is_success:
                response.read()
                answer(call, response)  # raises the typed error
            lines = SseLines()
            for line in response.iter_lines():
                event = lines.line(line)
                if event is not None:
                    yield event
            last = lines.flush()
            if last is not None:
                yield last

    def release(self, effect_key: str, scope: str) -> ReleaseAnswer:
        """``POST /v1/tasks/release``: the application stored (or discarded) that task's result."""
        return self._send(_api.release(effect_key, scope))

    # ---- scopes ----

    def unreleased_sources(
        self, scope: str, *, step: str | None = None, after: str | None = None
    ) -> UnreleasedPageView:
        """One page of the scope's sources with unreleased application tasks."""
        return self._send(_api.unreleased_sources(scope, step, after))

    def iter_unreleased_sources(
        self, scope: str, *, step: str | None = None
    ) -> Iterator[UnreleasedSourceView]:
        """Every unreleased source of the scope, page after page."""
        after: str | None = None
        while True:
            page = self.unreleased_sources(scope, step=step, after=after)
            yield from page["sources"]
            after = page.get("next")
            if not after:
                return

    def list_scopes(self, *, limit: int | None = None, next: str | None = None) -> ScopePageView:
        """``GET /v1/scopes``: one page of the app's scopes with admitted tasks still active or
        an admission in the last 24 h, in name order (a key bound to a subject:
        :class:`~tollgate.ForbiddenError`)."""
        return self._send(_api.list_scopes(limit, next))

    def iter_scopes(self, *, limit: int | None = None, next: str | None = None) -> Iterator[ScopeView]:
        """Every scope :meth:`list_scopes` lists, page after page."""
        while True:
            page = self.list_scopes(limit=limit, next=next)
            yield from page["scopes"]
            next = page.get("next")
            if not next:
                return

    def get_scope(self, scope: str) -> ScopeView:
        """``GET /v1/scopes/{scope}``: its policy in force and live admission state (any
        scope: a quiet one shows a full bucket and zeros)."""
        return self._send(_api.get_scope(scope))

    def scope_usage(self, scope: str) -> UsageReportView:
        """``GET /v1/scopes/{scope}/usage``: the scope's spend and model tokens in the 24 h
        window (docs/conformance.md#money-and-tokens)."""
        return self._send(_api.scope_usage(scope))

    def delete_owner_data(self, scope: str, *, source: str | None = None) -> DeletedAnswer:
        """``DELETE /v1/scopes/{scope}/tasks``: deletes the owner's data (of one source)."""
        return self._send(_api.delete_owner_data(scope, source))

    # ---- runs ----

    def create_run(self, scope: str, input: Any = None) -> RunView:
        """``POST /v1/runs`` (not idempotent: only a 503 is retried)."""
        return self._send(_api.create_run(scope, input))

    def list_runs(
        self,
        *,
        scope: str | None = None,
        state: RunStateName | Sequence[RunStateName] | None = None,
        pipeline: str | None = None,
        limit: int | None = None,
        next: str | None = None,
    ) -> RunPageView:
        """``GET /v1/runs``: one page of the app's runs, newest first (summaries:
        :meth:`get_run` has input, output and steps)."""
        return self._send(
            _api.list_runs(scope=scope, state=state, pipeline=pipeline, limit=limit, next=next)
        )

    def iter_runs(
        self,
        *,
        scope: str | None = None,
        state: RunStateName | Sequence[RunStateName] | None = None,
        pipeline: str | None = None,
        limit: int | None = None,
        next: str | None = None,
    ) -> Iterator[RunSummaryView]:
        """Every run :meth:`list_runs` selects, page after page."""
        while True:
            page = self.list_runs(scope=scope, state=state, pipeline=pipeline, limit=limit, next=next)
            yield from page["runs"]
            next = page.get("next")
            if not next:
                return

    def get_run(self, run_id: str, *, wait: float | None = None) -> RunView:
        """``GET /v1/runs/{id}`` (``wait``: ``?wait=``)."""
        return self._send(_api.get_run(run_id, wait))

    def wait_run(self, run: RunView | str, *, timeout: float | None = None) -> RunView:
        """Waits until the run is terminal; like :meth:`wait`."""
        run_id = run if isinstance(run, str) else run["id"]
        last = None if isinstance(run, str) else run
        if last is not None and last["state"] in TERMINAL_RUN_STATES:
            return last
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = self._long_poll if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                last = last or self.get_run(run_id)
                if last["state"] in TERMINAL_RUN_STATES:
                    return last
                raise WaitTimeoutError(f"run {run_id} is still {last['state']} after {timeout} s", last)
            started = time.monotonic()
            last = self.get_run(run_id, wait=min(remaining, self._long_poll))
            if last["state"] in TERMINAL_RUN_STATES:
                return last
            if time.monotonic() - started < 0.05:
                time.sleep(min(0.25, max(0.0, remaining)))

    def cancel_run(self, run_id: str) -> RunView:
        """``POST /v1/runs/{id}/cancel``: cancels the run and its queued and running tasks."""
        return self._send(_api.cancel_run(run_id))

    # ---- pipelines ----

    def register_pipeline(self, name: str, definition: Mapping[str, Any]) -> PipelineView:
        """``POST /v1/pipelines`` (``created`` false when the app had this definition)."""
        return self._send(_api.register_pipeline(name, definition))

    def list_pipelines(self, *, limit: int | None = None, next: str | None = None) -> PipelinePageView:
        """``GET /v1/pipelines``: one page of the app's pipelines in name order, each with its
        versions (newest first)."""
        return self._send(_api.list_pipelines(limit, next))

    def iter_pipelines(
        self, *, limit: int | None = None, next: str | None = None
    ) -> Iterator[PipelineSummaryView]:
        """Every pipeline :meth:`list_pipelines` lists, page after page."""
        while True:
            page = self.list_pipelines(limit=limit, next=next)
            yield from page["pipelines"]
            next = page.get("next")
            if not next:
                return

    def get_pipeline(self, name: str, *, version: str | None = None) -> PipelineView:
        """``GET /v1/pipelines/{name}``: the newest version, or ``version``."""
        return self._send(_api.get_pipeline(name, version))

    def start_pipeline(
        self,
        name: str,
        scope: str,
        input: Any = None,
        *,
        version: str | None = None,
        idempotency_key: str | None = None,
        wait: float | None = None,
    ) -> RunView:
        """``POST /v1/pipelines/{name}/runs``: starts a run once per ``idempotency_key`` (made
        up when absent and kept across retries)."""
        return self._send(_api.start_pipeline(name, scope, input, version, idempotency_key, wait))

    # ---- webhooks ----

    def create_webhook(
        self,
        url: str,
        events: Sequence[WebhookEventName],
        *,
        description: str | None = None,
        enabled: bool | None = None,
        secret: str | None = None,
        budget_thresholds: Sequence[float] | None = None,
    ) -> WebhookView:
        """``POST /v1/webhooks``: a webhook endpoint, with its signing secret (made when
        ``secret`` is absent). ``budget_thresholds``: the shares of a USD limit
        ``budget.threshold`` is sent for (default ``[0.8]``). Not idempotent: only a 503 is
        retried. A key bound to a subject: :class:`~tollgate.ForbiddenError`; an address the
        operator did not allow: :class:`~tollgate.InvalidRequestError`."""
        return self._send(
            _api.create_webhook(url, events, description, enabled, secret, budget_thresholds)
        )

    def list_webhooks(self) -> list[WebhookView]:
        """``GET /v1/webhooks``: the app's endpoints, oldest first (without their secrets)."""
        return self._send(_api.list_webhooks())

    def get_webhook(self, webhook_id: str) -> WebhookView:
        """``GET /v1/webhooks/{id}``: one endpoint, with its secret;
        :class:`~tollgate.NotFoundError` for a missing one or another app's."""
        return self._send(_api.get_webhook(webhook_id))

    def update_webhook(self, webhook_id: str, **changes: Unpack[WebhookPatchBody]) -> WebhookView:
        """``PATCH /v1/webhooks/{id}``: replaces each field given (``url``, ``events``,
        ``budget_thresholds``, ``description`` — ``None`` clears it —, ``enabled``, ``secret``). An endpoint from the
        configuration file is read-only: :class:`~tollgate.ConflictError`."""
        return self._send(_api.update_webhook(webhook_id, changes))

    def delete_webhook(self, webhook_id: str) -> None:
        """``DELETE /v1/webhooks/{id}``: deletes the endpoint and its deliveries (one from the
        configuration file: :class:`~tollgate.ConflictError`)."""
        self._send(_api.delete_webhook(webhook_id))

    def list_deliveries(
        self, webhook_id: str, *, state: DeliveryStateName | None = None, limit: int | None = None
    ) -> list[DeliveryView]:
        """``GET /v1/webhooks/{id}/deliveries``: the endpoint's deliveries, newest first
        (``limit`` 1–500, default 50)."""
        return self._send(_api.list_deliveries(webhook_id, state, limit))

    def replay_delivery(self, webhook_id: str, delivery_id: str) -> DeliveryView:
        """``POST /v1/webhooks/{id}/deliveries/{delivery}/replay``: a new pending delivery of
        the same event (same ``webhook-id``), due now. Each call makes one: only a 503 is
        retried."""
        return self._send(_api.replay_delivery(webhook_id, delivery_id))

    # ---- discovery and operations ----

    def kinds(self) -> list[KindView]:
        """``GET /v1/kinds``: each kind's request and output JSON Schemas."""
        return self._send(_api.kinds())

    def models(self) -> list[ModelView]:
        """``GET /v1/models``."""
        return self._send(_api.models())

    def usage(self) -> UsageReportView:
        """``GET /v1/usage``: the app's spend and model tokens in the 24 h window, all scopes
        (docs/conformance.md#cost-reservation; a key bound to a subject: :class:`~tollgate.ForbiddenError`)."""
        return self._send(_api.app_usage())

    def stats(self) -> StatsView:
        """``GET /v1/stats``: the app's queue, throughput, failures, cache hit rate and latency
        over the last hour."""
        return self._send(_api.stats())

    def healthz(self) -> dict[str, str]:
        """``GET /healthz``."""
        return self._send(_api.healthz())

    def readyz(self) -> dict[str, str]:
        """``GET /readyz`` (:class:`~tollgate.UnavailableError` at once when not ready)."""
        return self._send(_api.readyz())


class AsyncTollgate(_Base):
    """The same API over ``httpx.AsyncClient`` (asyncio or trio). Cancelling a coroutine
    (``asyncio`` task cancellation, a timeout scope) stops the call or wait, never the task."""

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        api_key: str | None = None,
        *,
        subject: str | None = None,
        max_retries: int = 4,
        retry_base_delay: float = 0.2,
        retry_max_delay: float = 5.0,
        retry_admission: bool = False,
        deadline: float = 60.0,
        long_poll: float = DEFAULT_LONG_POLL,
        timeout: float = 30.0,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(
            base_url, api_key, subject, max_retries, retry_base_delay, retry_max_delay,
            retry_admission, deadline, long_poll,
        )  # fmt: skip
        self._http = http_client or httpx.AsyncClient(base_url=self.base_url, timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncTollgate:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _send(
        self, call: Call[T], retry_admission: bool | None = None, deadline: float | None = None
    ) -> T:
        attempts = Attempts(self._policy, call, retry_admission, deadline)
        args = request_args(call, self._api_key, self._subject)
        while True:
            try:
                response = await self._http.request(**args)
            except httpx.TransportError as e:
                delay = attempts.after_connection_error(
                    ConnectionError(f"cannot reach {self.base_url}: {e!r}")
                )
                await anyio.sleep(delay)
                continue
            try:
                return answer(call, response)
            except TollgateError as error:
                delay = attempts.after_error(error)  # raises it when it is not retried
            await anyio.sleep(delay)

    # ---- tasks ----

    async def submit(
        self,
        kind: Kind,
        request: KindRequest,
        *,
        scope: str | None = None,
        run_id: str | None = None,
        source: SourceBody | None = None,
        step: str | None = None,
        model: str | None = None,
        budget: str | None = None,
        priority: int | None = None,
        idempotency_key: str | None = None,
        wait: float | None = None,
        retry_admission: bool | None = None,
        deadline: float | None = None,
    ) -> TaskView:
        """See :meth:`Tollgate.submit`."""
        call = _submit_call(
            kind, request, scope, run_id, source, step, model, budget, idempotency_key, wait, priority
        )
        return await self._send(call, retry_admission, deadline)

    async def submit_batch(self, items: Sequence[Mapping[str, Any]]) -> BatchAnswer:
        """See :meth:`Tollgate.submit_batch`."""
        return await self._send(_api.submit_batch(items), retry_admission=False)

    async def get_task(self, task_id: str, *, wait: float | None = None) -> TaskView:
        return await self._send(_api.get_task(task_id, wait))

    async def get_task_by_effect_key(self, effect_key: str) -> TaskView:
        return await self._send(_api.get_task_by_effect_key(effect_key))

    async def list_tasks(
        self,
        *,
        scope: str | None = None,
        status: TaskStatusName | Sequence[TaskStatusName] | None = None,
        kind: KindName | None = None,
        step: str | None = None,
        source: str | None = None,
        run_id: str | None = None,
        created_after: str | datetime | None = None,
        created_before: str | datetime | None = None,
        error_code: str | None = None,
        limit: int | None = None,
        next: str | None = None,
    ) -> TaskPageView:
        """``GET /v1/tasks``: one page of the app's tasks, newest first; the filters narrow
        together (``status``: one or several; ``created_after`` inclusive and
        ``created_before`` exclusive, RFC 3339 strings or aware datetimes; ``error_code``: tasks
        that ended with it). A page may be
        short, even empty, and still carry ``next`` (docs/api.md, "Short pages"):
        :meth:`iter_tasks` follows it."""
        return await self._send(
            _api.list_tasks(
                scope=scope, status=status, kind=kind, step=step, source=source, run_id=run_id,
                created_after=created_after, created_before=created_before, error_code=error_code,
                limit=limit, next=next,
            )  # fmt: skip
        )

    async def iter_tasks(
        self,
        *,
        scope: str | None = None,
        status: TaskStatusName | Sequence[TaskStatusName] | None = None,
        kind: KindName | None = None,
        step: str | None = None,
        source: str | None = None,
        run_id: str | None = None,
        created_after: str | datetime | None = None,
        created_before: str | datetime | None = None,
        error_code: str | None = None,
        limit: int | None = None,
        next: str | None = None,
    ) -> AsyncIterator[TaskView]:
        """Every task :meth:`list_tasks` selects, page after page (``limit``: the page size)."""
        while True:
            page = await self.list_tasks(
                scope=scope, status=status, kind=kind, step=step, source=source, run_id=run_id,
                created_after=created_after, created_before=created_before, error_code=error_code,
                limit=limit, next=next,
            )  # fmt: skip
            for item in page["tasks"]:
                yield item
            next = page.get("next")
            if not next:
                return

    async def wait(self, task: TaskView | str, *, timeout: float | None = None) -> TaskView:
        """See :meth:`Tollgate.wait`; cancelling the awaiting coroutine stops the wait only."""
        task_id = task if isinstance(task, str) else task["id"]
        last = None if isinstance(task, str) else task
        if last is not None and last["status"] in TERMINAL_TASK_STATUSES:
            return last
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = self._long_poll if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                last = last or await self.get_task(task_id)
                if last["status"] in TERMINAL_TASK_STATUSES:
                    return last
                raise WaitTimeoutError(
                    f"task {task_id} is still {last['status']} after {timeout} s", last
                )
            started = time.monotonic()
            last = await self.get_task(task_id, wait=min(remaining, self._long_poll))
            if last["status"] in TERMINAL_TASK_STATUSES:
                return last
            if time.monotonic() - started < 0.05:
                await anyio.sleep(min(0.25, max(0.0, remaining)))

    async def run(
        self,
        kind: Kind,
        request: KindRequest,
        *,
        scope: str | None = None,
        run_id: str | None = None,
        source: SourceBody | None = None,
        step: str | None = None,
        model: str | None = None,
        budget: str | None = None,
        idempotency_key: str | None = None,
        timeout: float | None = None,
        retry_admission: bool | None = None,
        deadline: float | None = None,
    ) -> TaskView:
        """See :meth:`Tollgate.run`."""
        started = time.monotonic()
        first = min(timeout, self._long_poll) if timeout is not None else self._long_poll
        task = await self.submit(
            kind, request, scope=scope, run_id=run_id, source=source, step=step, model=model,
            budget=budget, idempotency_key=idempotency_key, wait=first, retry_admission=retry_admission,
            deadline=deadline,
        )  # fmt: skip
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
        return await self.wait(task, timeout=left)

    async def events(self, task_id: str) -> AsyncIterator[TaskStreamEvent]:
        """:meth:`Tollgate.events`."""
        call = _api.task_events(task_id)
        args = request_args(call, self._api_key, self._subject)
        args["timeout"] = httpx.Timeout(None, connect=10.0)  # open until the task ends
        async with self._http.stream(**args) as response:
            if not response.is_success:
                await response.aread()
                answer(call, response)  # raises the typed error
            lines = SseLines()
            async for line in response.aiter_lines():
                event = lines.line(line)
                if event is not None:
                    yield event
            last = lines.flush()
            if last is not None:
                yield last

    async def cancel(self, task_id: str) -> TaskView:
        return await self._send(_api.cancel(task_id))

    async def release(self, effect_key: str, scope: str) -> ReleaseAnswer:
        return await self._send(_api.release(effect_key, scope))

    # ---- scopes ----

    async def unreleased_sources(
        self, scope: str, *, step: str | None = None, after: str | None = None
    ) -> UnreleasedPageView:
        return await self._send(_api.unreleased_sources(scope, step, after))

    async def iter_unreleased_sources(
        self, scope: str, *, step: str | None = None
    ) -> AsyncIterator[UnreleasedSourceView]:
        after: str | None = None
        while True:
            page = await self.unreleased_sources(scope, step=step, after=after)
            for source in page["sources"]:
                yield source
            after = page.get("next")
            if not after:
                return

    async def list_scopes(self, *, limit: int | None = None, next: str | None = None) -> ScopePageView:
        """``GET /v1/scopes``: one page of the app's scopes with admitted tasks still active or
        an admission in the last 24 h, in name order (a key bound to a subject:
        :class:`~tollgate.ForbiddenError`)."""
        return await self._send(_api.list_scopes(limit, next))

    async def iter_scopes(self, *, limit: int | None = None, next: str | None = None) -> AsyncIterator[ScopeView]:
        """Every scope :meth:`list_scopes` lists, page after page."""
        while True:
            page = await self.list_scopes(limit=limit, next=next)
            for item in page["scopes"]:
                yield item
            next = page.get("next")
            if not next:
                return

    async def get_scope(self, scope: str) -> ScopeView:
        """``GET /v1/scopes/{scope}``: its policy in force and live admission state (any
        scope: a quiet one shows a full bucket and zeros)."""
        return await self._send(_api.get_scope(scope))

    async def scope_usage(self, scope: str) -> UsageReportView:
        """``GET /v1/scopes/{scope}/usage``: the scope's spend and model tokens in the 24 h
        window (docs/conformance.md#money-and-tokens)."""
        return await self._send(_api.scope_usage(scope))

    async def delete_owner_data(self, scope: str, *, source: str | None = None) -> DeletedAnswer:
        return await self._send(_api.delete_owner_data(scope, source))

    # ---- runs ----

    async def create_run(self, scope: str, input: Any = None) -> RunView:
        return await self._send(_api.create_run(scope, input))

    async def list_runs(
        self,
        *,
        scope: str | None = None,
        state: RunStateName | Sequence[RunStateName] | None = None,
        pipeline: str | None = None,
        limit: int | None = None,
        next: str | None = None,
    ) -> RunPageView:
        """``GET /v1/runs``: one page of the app's runs, newest first (summaries:
        :meth:`get_run` has input, output and steps)."""
        return await self._send(
            _api.list_runs(scope=scope, state=state, pipeline=pipeline, limit=limit, next=next)
        )

    async def iter_runs(
        self,
        *,
        scope: str | None = None,
        state: RunStateName | Sequence[RunStateName] | None = None,
        pipeline: str | None = None,
        limit: int | None = None,
        next: str | None = None,
    ) -> AsyncIterator[RunSummaryView]:
        """Every run :meth:`list_runs` selects, page after page."""
        while True:
            page = await self.list_runs(scope=scope, state=state, pipeline=pipeline, limit=limit, next=next)
            for item in page["runs"]:
                yield item
            next = page.get("next")
            if not next:
                return

    async def get_run(self, run_id: str, *, wait: float | None = None) -> RunView:
        return await self._send(_api.get_run(run_id, wait))

    async def wait_run(self, run: RunView | str, *, timeout: float | None = None) -> RunView:
        run_id = run if isinstance(run, str) else run["id"]
        last = None if isinstance(run, str) else run
        if last is not None and last["state"] in TERMINAL_RUN_STATES:
            return last
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = self._long_poll if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                last = last or await self.get_run(run_id)
                if last["state"] in TERMINAL_RUN_STATES:
                    return last
                raise WaitTimeoutError(f"run {run_id} is still {last['state']} after {timeout} s", last)
            started = time.monotonic()
            last = await self.get_run(run_id, wait=min(remaining, self._long_poll))
            if last["state"] in TERMINAL_RUN_STATES:
                return last
            if time.monotonic() - started < 0.05:
                await anyio.sleep(min(0.25, max(0.0, remaining)))

    async def cancel_run(self, run_id: str) -> RunView:
        return await self._send(_api.cancel_run(run_id))

    # ---- pipelines ----

    async def register_pipeline(self, name: str, definition: Mapping[str, Any]) -> PipelineView:
        return await self._send(_api.register_pipeline(name, definition))

    async def list_pipelines(self, *, limit: int | None = None, next: str | None = None) -> PipelinePageView:
        """``GET /v1/pipelines``: one page of the app's pipelines in name order, each with its
        versions (newest first)."""
        return await self._send(_api.list_pipelines(limit, next))

    async def iter_pipelines(
        self, *, limit: int | None = None, next: str | None = None
    ) -> AsyncIterator[PipelineSummaryView]:
        """Every pipeline :meth:`list_pipelines` lists, page after page."""
        while True:
            page = await self.list_pipelines(limit=limit, next=next)
            for item in page["pipelines"]:
                yield item
            next = page.get("next")
            if not next:
                return

    async def get_pipeline(self, name: str, *, version: str | None = None) -> PipelineView:
        return await self._send(_api.get_pipeline(name, version))

    async def start_pipeline(
        self,
        name: str,
        scope: str,
        input: Any = None,
        *,
        version: str | None = None,
        idempotency_key: str | None = None,
        wait: float | None = None,
    ) -> RunView:
        return await self._send(
            _api.start_pipeline(name, scope, input, version, idempotency_key, wait)
        )

    # ---- webhooks ----

    async def create_webhook(
        self,
        url: str,
        events: Sequence[WebhookEventName],
        *,
        description: str | None = None,
        enabled: bool | None = None,
        secret: str | None = None,
        budget_thresholds: Sequence[float] | None = None,
    ) -> WebhookView:
        """``POST /v1/webhooks``: a webhook endpoint, with its signing secret (made when
        ``secret`` is absent; ``budget_thresholds`` default ``[0.8]``). Not idempotent: only a
        503 is retried."""
        return await self._send(
            _api.create_webhook(url, events, description, enabled, secret, budget_thresholds)
        )

    async def list_webhooks(self) -> list[WebhookView]:
        """``GET /v1/webhooks``: the app's endpoints, oldest first (without their secrets)."""
        return await self._send(_api.list_webhooks())

    async def get_webhook(self, webhook_id: str) -> WebhookView:
        """``GET /v1/webhooks/{id}``: one endpoint, with its secret."""
        return await self._send(_api.get_webhook(webhook_id))

    async def update_webhook(
        self, webhook_id: str, **changes: Unpack[WebhookPatchBody]
    ) -> WebhookView:
        """``PATCH /v1/webhooks/{id}``: replaces each field given (``description=None``
        clears it)."""
        return await self._send(_api.update_webhook(webhook_id, changes))

    async def delete_webhook(self, webhook_id: str) -> None:
        """``DELETE /v1/webhooks/{id}``: deletes the endpoint and its deliveries."""
        await self._send(_api.delete_webhook(webhook_id))

    async def list_deliveries(
        self, webhook_id: str, *, state: DeliveryStateName | None = None, limit: int | None = None
    ) -> list[DeliveryView]:
        """``GET /v1/webhooks/{id}/deliveries``: the endpoint's deliveries, newest first."""
        return await self._send(_api.list_deliveries(webhook_id, state, limit))

    async def replay_delivery(self, webhook_id: str, delivery_id: str) -> DeliveryView:
        """``POST /v1/webhooks/{id}/deliveries/{delivery}/replay``: a new pending delivery of
        the same event, due now (only a 503 is retried)."""
        return await self._send(_api.replay_delivery(webhook_id, delivery_id))

    # ---- discovery and operations ----

    async def kinds(self) -> list[KindView]:
        return await self._send(_api.kinds())

    async def models(self) -> list[ModelView]:
        return await self._send(_api.models())

    async def usage(self) -> UsageReportView:
        """``GET /v1/usage``: the app's spend and model tokens in the 24 h window, all scopes
        (docs/conformance.md#cost-reservation; a key bound to a subject: :class:`~tollgate.ForbiddenError`)."""
        return await self._send(_api.app_usage())

    async def stats(self) -> StatsView:
        """``GET /v1/stats``: the app's queue, throughput, failures, cache hit rate and latency
        over the last hour."""
        return await self._send(_api.stats())

    async def healthz(self) -> dict[str, str]:
        return await self._send(_api.healthz())

    async def readyz(self) -> dict[str, str]:
        return await self._send(_api.readyz())
