"""Every route of the HTTP API as a :class:`Call` (shared by the sync and async clients)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping, Sequence
from urllib.parse import quote

from ._calls import LONG_POLL_SLACK, Call, clean, new_idempotency_key, wait_param
from ._generated import (
    BatchAnswer,
    DeletedAnswer,
    DeliveryStateName,
    DeliveryView,
    KindName,
    KindView,
    ModelView,
    PipelinePageView,
    PipelineView,
    ReleaseAnswer,
    RunPageView,
    RunStateName,
    RunView,
    ScopePageView,
    ScopeView,
    SourceBody,
    StatsView,
    TaskPageView,
    TaskStatusName,
    TaskView,
    UnreleasedPageView,
    UsageReportView,
    WebhookEventName,
    WebhookPatchBody,
    WebhookView,
)


def _seg(text: str) -> str:
    return quote(text, safe="")


def _wait_query(wait: float | None) -> dict[str, str]:
    return {} if wait is None else {"wait": wait_param(wait)}


def _wait_timeout(wait: float | None) -> float | None:
    return None if wait is None else wait + LONG_POLL_SLACK


def _list_param(value: str | Sequence[str] | None) -> str | None:
    """A comma-separated list parameter (``status=queued,running``)."""
    if value is None or isinstance(value, str):
        return value
    return ",".join(value)


def _time_param(value: str | datetime | None) -> str | None:
    """An RFC 3339 instant; a ``datetime`` must carry its time zone."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"a naive datetime names no instant: {value!r} (give it a tzinfo)")
        return value.isoformat()
    return value


def _int_param(value: int | None) -> str | None:
    return None if value is None else str(value)


def _page_query(limit: int | None, next: str | None) -> dict[str, str]:
    return clean({"limit": _int_param(limit), "next": next})


def submission_body(
    kind: str,
    request: Mapping[str, Any],
    *,
    scope: str | None,
    run_id: str | None,
    source: SourceBody | None,
    step: str | None,
    model: str | None,
    budget: str | None,
    effect_key: str | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": kind, "request": dict(request)}
    for name, value in (
        ("scope", scope),
        ("run_id", run_id),
        ("source", dict(source) if source is not None else None),
        ("step", step),
        ("model", model),
        ("budget", budget),
        ("effect_key", effect_key),
        ("priority", priority),
    ):
        if value is not None:
            body[name] = value
    return body


def submit(body: dict[str, Any], idempotency_key: str | None, wait: float | None) -> Call[TaskView]:
    # The key is chosen once, here: every retry of this call sends the same one.
    key = idempotency_key or new_idempotency_key()
    return Call(
        "POST",
        "/v1/tasks",
        query=_wait_query(wait),
        body=body,
        headers={"Idempotency-Key": key},
        timeout=_wait_timeout(wait),
    )


def submit_batch(items: Sequence[Mapping[str, Any]]) -> Call[BatchAnswer]:
    tasks = [
        {**item, "effect_key": item.get("effect_key") or new_idempotency_key()} for item in items
    ]
    return Call("POST", "/v1/tasks/batch", body={"tasks": tasks})


def get_task(task_id: str, wait: float | None = None) -> Call[TaskView]:
    return Call(
        "GET",
        f"/v1/tasks/{_seg(task_id)}",
        query=_wait_query(wait),
        timeout=_wait_timeout(wait),
    )


def get_task_by_effect_key(effect_key: str) -> Call[TaskView]:
    return Call("GET", "/v1/tasks", query={"effect_key": effect_key})


def list_tasks(
    *,
    scope: str | None,
    status: TaskStatusName | Sequence[TaskStatusName] | None,
    kind: KindName | None,
    step: str | None,
    source: str | None,
    run_id: str | None,
    created_after: str | datetime | None,
    created_before: str | datetime | None,
    error_code: str | None,
    limit: int | None,
    next: str | None,
) -> Call[TaskPageView]:
    query = clean(
        {
            "scope": scope,
            "status": _list_param(status),
            "kind": kind,
            "step": step,
            "source": source,
            "run_id": run_id,
            "created_after": _time_param(created_after),
            "created_before": _time_param(created_before),
            "error_code": error_code,
        }
    )
    return Call("GET", "/v1/tasks", query={**query, **_page_query(limit, next)})


def cancel(task_id: str) -> Call[TaskView]:
    return Call("POST", f"/v1/tasks/{_seg(task_id)}/cancel")


def task_events(task_id: str) -> Call[None]:
    return Call(
        "GET", f"/v1/tasks/{_seg(task_id)}/events", headers={"Accept": "text/event-stream"}
    )


def release(effect_key: str, scope: str) -> Call[ReleaseAnswer]:
    return Call("POST", "/v1/tasks/release", body={"effect_key": effect_key, "scope": scope})


def unreleased_sources(
    scope: str, step: str | None, after: str | None
) -> Call[UnreleasedPageView]:
    return Call(
        "GET",
        f"/v1/scopes/{_seg(scope)}/unreleased-sources",
        query=clean({"step": step, "after": after}),
    )


def list_scopes(limit: int | None, next: str | None) -> Call[ScopePageView]:
    return Call("GET", "/v1/scopes", query=_page_query(limit, next))


def get_scope(scope: str) -> Call[ScopeView]:
    return Call("GET", f"/v1/scopes/{_seg(scope)}")


def scope_usage(scope: str) -> Call[UsageReportView]:
    return Call("GET", f"/v1/scopes/{_seg(scope)}/usage")


def delete_owner_data(scope: str, source: str | None) -> Call[DeletedAnswer]:
    return Call("DELETE", f"/v1/scopes/{_seg(scope)}/tasks", query=clean({"source": source}))


def create_run(scope: str, input: Any) -> Call[RunView]:
    # Not idempotent on the server: only a 503 (nothing written) is retried.
    return Call(
        "POST",
        "/v1/runs",
        body={"scope": scope, "input": {} if input is None else input},
        idempotent=False,
    )


def list_runs(
    *,
    scope: str | None,
    state: RunStateName | Sequence[RunStateName] | None,
    pipeline: str | None,
    limit: int | None,
    next: str | None,
) -> Call[RunPageView]:
    query = clean({"scope": scope, "state": _list_param(state), "pipeline": pipeline})
    return Call("GET", "/v1/runs", query={**query, **_page_query(limit, next)})


def get_run(run_id: str, wait: float | None = None) -> Call[RunView]:
    return Call(
        "GET", f"/v1/runs/{_seg(run_id)}", query=_wait_query(wait), timeout=_wait_timeout(wait)
    )


def cancel_run(run_id: str) -> Call[RunView]:
    return Call("POST", f"/v1/runs/{_seg(run_id)}/cancel")


def register_pipeline(name: str, definition: Mapping[str, Any]) -> Call[PipelineView]:
    # Registering the same definition again changes nothing: safe to retry.
    return Call("POST", "/v1/pipelines", body={"name": name, "definition": dict(definition)})


def list_pipelines(limit: int | None, next: str | None) -> Call[PipelinePageView]:
    return Call("GET", "/v1/pipelines", query=_page_query(limit, next))


def get_pipeline(name: str, version: str | None) -> Call[PipelineView]:
    return Call("GET", f"/v1/pipelines/{_seg(name)}", query=clean({"version": version}))


def start_pipeline(
    name: str,
    scope: str,
    input: Any,
    version: str | None,
    idempotency_key: str | None,
    wait: float | None,
) -> Call[RunView]:
    body: dict[str, Any] = {"scope": scope, "input": {} if input is None else input}
    if version is not None:
        body["version"] = version
    return Call(
        "POST",
        f"/v1/pipelines/{_seg(name)}/runs",
        query=_wait_query(wait),
        body=body,
        headers={"Idempotency-Key": idempotency_key or new_idempotency_key()},
        timeout=_wait_timeout(wait),
    )


def create_webhook(
    url: str,
    events: Sequence[WebhookEventName],
    description: str | None,
    enabled: bool | None,
    secret: str | None,
    budget_thresholds: Sequence[float] | None = None,
) -> Call[WebhookView]:
    body: dict[str, Any] = {"url": url, "events": list(events)}
    for name, value in (("description", description), ("enabled", enabled), ("secret", secret)):
        if value is not None:
            body[name] = value
    if budget_thresholds is not None:
        body["budget_thresholds"] = list(budget_thresholds)
    # Each call creates an endpoint: only a 503 (nothing written) is retried.
    return Call("POST", "/v1/webhooks", body=body, idempotent=False)


def list_webhooks() -> Call[list[WebhookView]]:
    return Call("GET", "/v1/webhooks", unwrap="webhooks")


def get_webhook(webhook_id: str) -> Call[WebhookView]:
    return Call("GET", f"/v1/webhooks/{_seg(webhook_id)}")


def update_webhook(webhook_id: str, changes: WebhookPatchBody) -> Call[WebhookView]:
    # Setting the same fields again changes nothing: safe to retry.
    return Call("PATCH", f"/v1/webhooks/{_seg(webhook_id)}", body=dict(changes))


def delete_webhook(webhook_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/webhooks/{_seg(webhook_id)}")


def list_deliveries(
    webhook_id: str, state: DeliveryStateName | None, limit: int | None
) -> Call[list[DeliveryView]]:
    return Call(
        "GET",
        f"/v1/webhooks/{_seg(webhook_id)}/deliveries",
        query=clean({"state": state, "limit": _int_param(limit)}),
        unwrap="deliveries",
    )


def replay_delivery(webhook_id: str, delivery_id: str) -> Call[DeliveryView]:
    # Each call makes a new delivery: only a 503 (nothing written) is retried.
    return Call(
        "POST",
        f"/v1/webhooks/{_seg(webhook_id)}/deliveries/{_seg(delivery_id)}/replay",
        idempotent=False,
    )


def kinds() -> Call[list[KindView]]:
    return Call("GET", "/v1/kinds", unwrap="kinds")


def models() -> Call[list[ModelView]]:
    return Call("GET", "/v1/models", unwrap="models")


def app_usage() -> Call[UsageReportView]:
    return Call("GET", "/v1/usage")


def stats() -> Call[StatsView]:
    return Call("GET", "/v1/stats")


def healthz() -> Call[dict[str, str]]:
    return Call("GET", "/healthz", anonymous=True)


def readyz() -> Call[dict[str, str]]:
    return Call("GET", "/readyz", anonymous=True, retry=False)
