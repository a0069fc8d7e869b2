"""Every route of the HTTP API as a :class:`Call` (shared by the sync and async clients)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence
from urllib.parse import quote

from ._calls import LONG_POLL_SLACK, Call, clean, new_idempotency_key, wait_param
from ._generated import (
    BatchAnswer,
    DeletedAnswer,
    KindView,
    ModelView,
    PipelineView,
    ReleaseAnswer,
    RunView,
    SourceBody,
    TaskView,
    UnreleasedPageView,
)


def _seg(text: str) -> str:
    return quote(text, safe="")


def _wait_query(wait: float | None) -> dict[str, str]:
    return {} if wait is None else {"wait": wait_param(wait)}


def _wait_timeout(wait: float | None) -> float | None:
    return None if wait is None else wait + LONG_POLL_SLACK


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


def cancel(task_id: str) -> Call[TaskView]:
    return Call("POST", f"/v1/tasks/{_seg(task_id)}/cancel")


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


def get_run(run_id: str, wait: float | None = None) -> Call[RunView]:
    return Call(
        "GET", f"/v1/runs/{_seg(run_id)}", query=_wait_query(wait), timeout=_wait_timeout(wait)
    )


def cancel_run(run_id: str) -> Call[RunView]:
    return Call("POST", f"/v1/runs/{_seg(run_id)}/cancel")


def register_pipeline(name: str, definition: Mapping[str, Any]) -> Call[PipelineView]:
    # Registering the same definition again changes nothing: safe to retry.
    return Call("POST", "/v1/pipelines", body={"name": name, "definition": dict(definition)})


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


def kinds() -> Call[list[KindView]]:
    return Call("GET", "/v1/kinds", unwrap="kinds")


def models() -> Call[list[ModelView]]:
    return Call("GET", "/v1/models", unwrap="models")


def healthz() -> Call[dict[str, str]]:
    return Call("GET", "/healthz", anonymous=True)


def readyz() -> Call[dict[str, str]]:
    return Call("GET", "/readyz", anonymous=True, retry=False)
