"""The sync client, end to end against a real ``tollgate serve`` (conftest.py)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pytest

from conftest import ACME_KEY, ALICE_KEY, BETA_KEY, MAX_REQUEST_BYTES, REPO_ROOT, Receiver, Server
from tollgate import (
    ChatRequest,
    AdmissionError,
    BadRequestError,
    ConflictError,
    ConnectionError,
    ForbiddenError,
    InvalidRequestError,
    NotFoundError,
    RequestTooLargeError,
    SourceBody,
    Tollgate,
    UnauthorizedError,
    UnavailableError,
    WaitTimeoutError,
    DeliveryView,
    batch_item,
    batch_item_error,
    verify_webhook,
)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def invoice_file() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REPO_ROOT / "docs/examples/invoice-pipeline.json").read_text())
    return data


@pytest.fixture
def acme(server: Server) -> Iterator[Tollgate]:
    with Tollgate(server.base_url, ACME_KEY) as client:
        yield client


@pytest.fixture
def beta(server: Server) -> Iterator[Tollgate]:
    with Tollgate(server.base_url, BETA_KEY) as client:
        yield client


@pytest.fixture
def alice(server: Server) -> Iterator[Tollgate]:
    with Tollgate(server.base_url, ALICE_KEY) as client:
        yield client


def test_health_kinds_models(acme: Tollgate, server: Server) -> None:
    assert acme.healthz() == {"status": "ok"}
    assert acme.readyz() == {"status": "ready"}
    kinds = acme.kinds()
    assert sorted(k["kind"] for k in kinds) == ["chat", "classify", "classify_many", "embed", "extract_data", "generate_text"]
    models = {m["id"]: m for m in acme.models()}
    assert sorted(models) == ["default", "slow"]
    assert models["default"]["default"] is True
    with Tollgate(server.base_url, "nobody-0123456789abcdef") as stranger:
        with pytest.raises(UnauthorizedError) as e:
            stranger.kinds()
        assert e.value.status == 401 and e.value.code == "unauthorized"


def test_four_kinds_complete(acme: Tollgate) -> None:
    scope = unique("kinds")
    source: SourceBody = {"id": "msg-981", "revision": "v1"}
    classify = acme.run(
        "classify",
        {"input": "Win a free cruise!", "labels": ["spam", "ham"]},
        scope=scope,
        step="label-email",
        source=source,
        timeout=20,
    )
    assert classify["status"] == "succeeded"
    assert classify["output"] and classify["output"]["label"] in ("spam", "ham")
    text = acme.run("generate_text", {"prompt": "Write a one-line welcome.", "max_output_tokens": 50}, scope=scope, timeout=20)
    assert text["status"] == "succeeded" and text["output"] and isinstance(text["output"]["text"], str)
    events = list(acme.events(text["id"]))  # a finished task: its answer, then its end
    assert [e["event"] for e in events] == ["delta", "end"]
    assert events[0]["data"] == {"text": text["output"]["text"]}
    many = acme.run(
        "classify_many",
        {"items": [{"id": "a", "input": "refund please"}, {"id": "b", "input": "love it"}], "labels": ["complaint", "praise"]},
        scope=scope,
        timeout=20,
    )
    assert many["status"] == "succeeded" and many["output"]
    assert [r["id"] for r in many["output"]["results"]] == ["a", "b"]
    extracted = acme.run(
        "extract_data",
        {
            "input": "Invoice 88, total 120.50 EUR",
            "schema": {"type": "object", "required": ["number", "total"],
                       "properties": {"number": {"type": "integer"}, "total": {"type": "number"}}},
        },
        scope=scope,
        timeout=20,
    )
    assert extracted["status"] == "succeeded" and extracted["output"]
    assert isinstance(extracted["output"]["number"], int)
    chat: ChatRequest = {
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [{"type": "function", "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}},
        }}],
        "tool_choice": "required",
    }
    called = acme.run("chat", chat, scope=scope, timeout=20)
    assert called["status"] == "succeeded" and called["output"]
    assert called["output"]["finish_reason"] == "tool_calls"
    call = called["output"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"])["city"], str)
    embedded = acme.run(
        "embed",
        {"input": ["refund please", {"text": "love it", "id": "review-7", "revision": "v2"}], "dimensions": 8},
        scope=scope,
        timeout=20,
    )
    assert embedded["status"] == "succeeded" and embedded["output"]
    assert embedded["output"]["dimensions"] == 8
    assert [len(v) for v in embedded["output"]["embeddings"]] == [8, 8]


def test_idempotency_replay_and_conflict(acme: Tollgate) -> None:
    scope = unique("idem")
    key = unique("label")
    first = acme.submit("classify", {"input": "hello", "labels": ["a", "b"]}, scope=scope, idempotency_key=key)
    assert first["created"] is True and first["effect_key"] == key
    again = acme.submit("classify", {"input": "hello", "labels": ["a", "b"]}, scope=scope, idempotency_key=key)
    assert again["id"] == first["id"] and again["created"] is False
    with pytest.raises(ConflictError) as e:
        acme.submit("classify", {"input": "changed", "labels": ["a", "b"]}, scope=scope, idempotency_key=key)
    assert e.value.status == 409 and e.value.code == "idempotency_key_conflict" and "request" in e.value.message


class LoseFirstAnswer(httpx.BaseTransport):
    """Sends every request; the first one's answer is lost (as if the connection dropped)."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.keys: list[str | None] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.keys.append(request.headers.get("idempotency-key"))
        response = self.inner.handle_request(request)
        if len(self.keys) == 1:
            response.read()
            raise httpx.ReadError("connection reset", request=request)
        return response


def test_generated_key_kept_across_retries(server: Server, acme: Tollgate) -> None:
    transport = LoseFirstAnswer()
    http = httpx.Client(base_url=server.base_url, transport=transport)
    with Tollgate(server.base_url, ACME_KEY, http_client=http, retry_base_delay=0.01) as client:
        task = client.submit("generate_text", {"prompt": "hi"}, scope=unique("retry"))
    assert len(transport.keys) == 2 and transport.keys[0] == transport.keys[1] == task["effect_key"]
    assert task["created"] is False  # the first attempt created it; the retry found it
    assert acme.get_task_by_effect_key(task["effect_key"])["id"] == task["id"]


def test_503_retried_then_raised(server: Server) -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls <= 2:
            return httpx.Response(503, json={"error": {"code": "database_unavailable", "message": "down"}})
        return httpx.Response(200, json={"kinds": []})

    http = httpx.Client(base_url=server.base_url, transport=httpx.MockTransport(handler))
    with Tollgate(server.base_url, ACME_KEY, http_client=http, retry_base_delay=0.01) as client:
        assert client.kinds() == []
    assert calls == 3

    always = httpx.Client(
        base_url=server.base_url,
        transport=httpx.MockTransport(
            lambda r: httpx.Response(503, json={"error": {"code": "database_unavailable", "message": "the database is down"}})
        ),
    )
    with Tollgate(server.base_url, ACME_KEY, http_client=always, max_retries=1, retry_base_delay=0.01) as client:
        with pytest.raises(UnavailableError) as e:
            client.models()
    assert e.value.code == "database_unavailable" and e.value.message == "the database is down"


def test_unreachable_is_connection_error() -> None:
    with Tollgate("http://127.0.0.1:9", ACME_KEY, max_retries=2, retry_base_delay=0.01) as client:
        with pytest.raises(ConnectionError):
            client.healthz()


def tight(client: Tollgate, scope: str, n: int, **kw: Any) -> Any:
    return client.submit(
        "classify",
        {"input": f"document {n}", "labels": ["a", "b"]},
        scope=scope,
        budget="tight",
        source={"id": f"doc-{n}", "revision": "v1"},
        **kw,
    )


def test_admission_refusal_and_opt_in_retry(acme: Tollgate, server: Server) -> None:
    scope = unique("tight")
    tight(acme, scope, 1)
    with pytest.raises(AdmissionError) as e:
        tight(acme, scope, 2)
    assert e.value.status == 429 and e.value.code == "WORKFLOW_AI_RATE_LIMIT"
    assert e.value.retry_after is not None and e.value.retry_after >= 1

    started = time.monotonic()
    with pytest.raises(AdmissionError):
        tight(acme, scope, 3, retry_admission=True, deadline=0.2)
    assert time.monotonic() - started < 1

    key = unique("after-refill")
    task = tight(acme, scope, 4, retry_admission=True, deadline=10, idempotency_key=key)
    assert task["effect_key"] == key and task["created"] is True
    assert acme.get_task_by_effect_key(key)["id"] == task["id"]

    with Tollgate(server.base_url, ACME_KEY, retry_admission=True, deadline=10) as patient:
        scope = unique("tight")
        a, b = tight(patient, scope, 1), tight(patient, scope, 2)
        assert a["id"] != b["id"]


def test_wait_times_out_cleanly_and_cancel(acme: Tollgate) -> None:
    task = acme.submit("generate_text", {"prompt": "take your time"}, scope=unique("slow"), model="slow")
    started = time.monotonic()
    with pytest.raises(WaitTimeoutError) as e:
        acme.wait(task, timeout=1.2)
    elapsed = time.monotonic() - started
    assert 1.1 <= elapsed < 5, elapsed
    assert e.value.last["id"] == task["id"] and e.value.last["status"] in ("queued", "running")
    assert acme.get_task(task["id"])["status"] in ("queued", "running")
    canceled = acme.cancel(task["id"])
    assert canceled["status"] == "canceled"
    assert canceled["error"] and canceled["error"]["code"] == "WORKFLOW_AI_CANCELED"
    assert acme.wait(task["id"], timeout=5)["status"] == "canceled"


def test_wait_until_done(acme: Tollgate) -> None:
    task = acme.submit("generate_text", {"prompt": "quick"}, scope=unique("wait"))
    assert acme.wait(task, timeout=20)["status"] == "succeeded"
    assert acme.get_task(task["id"], wait=1)["status"] == "succeeded"


def test_priority_is_sent_and_checked(acme: Tollgate) -> None:
    scope = unique("prio")
    task = acme.submit("generate_text", {"prompt": "urgent"}, scope=scope, priority=9)
    assert task.get("priority") == 9
    item = batch_item("generate_text", {"prompt": "later"}, scope=scope, priority=0)
    results = acme.submit_batch([item])["results"]
    low = results[0].get("task")
    assert low and low.get("priority") == 0
    with pytest.raises(InvalidRequestError) as e:
        acme.submit("generate_text", {"prompt": "x"}, scope=scope, priority=10)
    assert e.value.status == 422 and "priority" in e.value.message


def test_batch(acme: Tollgate) -> None:
    scope = unique("batch")
    answer = acme.submit_batch([
        batch_item("classify", {"input": "one", "labels": ["x", "y"]}, scope=scope),
        batch_item("generate_text", {"prompt": "two"}, scope=scope, effect_key=f"own-{scope}"),
        batch_item("classify", {"input": "three", "labels": []}, scope=scope),
    ])
    results = answer["results"]
    assert [r["status"] for r in results] == [201, 201, 422]
    second = results[1].get("task")
    assert second and second["effect_key"] == f"own-{scope}"
    assert batch_item_error(results[0]) is None
    error = batch_item_error(results[2])
    assert isinstance(error, InvalidRequestError) and error.code == "invalid_request"
    first = results[0].get("task")
    assert first and acme.wait(first, timeout=20)["status"] == "succeeded"


def test_reads_release_scopes(acme: Tollgate) -> None:
    scope = unique("scope")
    tasks = [
        acme.run("classify", {"input": s, "labels": ["p", "q"]}, scope=scope, idempotency_key=f"{scope}-{s}",
                 source={"id": s, "revision": "v1"}, timeout=20)
        for s in ("s1", "s2", "s3")
    ]
    assert acme.get_task(tasks[0]["id"])["effect_key"] == f"{scope}-s1"
    assert acme.get_task_by_effect_key(f"{scope}-s2")["id"] == tasks[1]["id"]
    assert [s["source"] for s in acme.unreleased_sources(scope)["sources"]] == ["s1", "s2", "s3"]
    assert acme.release(f"{scope}-s1", scope) == {"released": True}
    assert [s["source"] for s in acme.iter_unreleased_sources(scope)] == ["s2", "s3"]
    with pytest.raises(NotFoundError):
        acme.release("no-such-key", scope)
    assert acme.delete_owner_data(scope, source="s2") == {"deleted": 1}
    with pytest.raises(NotFoundError):
        acme.get_task(tasks[1]["id"])
    assert acme.delete_owner_data(scope) == {"deleted": 2}
    with pytest.raises(NotFoundError) as e:
        acme.get_task_by_effect_key(f"{scope}-s3")
    assert e.value.code == "not_found"


def test_422_and_413(acme: Tollgate) -> None:
    scope = unique("bad")
    with pytest.raises(InvalidRequestError) as e:
        acme.submit("classify", {"input": "x", "labels": ["a"]}, scope=scope, model="nope")
    assert e.value.status == 422 and e.value.code == "unknown_model" and e.value.message
    with pytest.raises(InvalidRequestError) as e:
        acme.submit("summarize", {"input": "x", "labels": ["a"]}, scope=scope)  # type: ignore[arg-type]
    assert e.value.code == "invalid_request" and "summarize" in e.value.message
    with pytest.raises(RequestTooLargeError) as too_large:
        acme.submit("generate_text", {"prompt": "x" * (MAX_REQUEST_BYTES + 10)}, scope=scope)
    assert too_large.value.status == 413 and too_large.value.code == "request_too_large"


def test_workflow_run(acme: Tollgate) -> None:
    scope = unique("run")
    run = acme.create_run(scope, {"order": 7})
    assert run["scope"] == scope and run["input"] == {"order": 7}
    child = acme.submit("generate_text", {"prompt": "in a run"}, run_id=run["id"], model="slow")
    assert child.get("run_id") == run["id"]
    assert acme.get_run(run["id"])["id"] == run["id"]
    assert acme.cancel_run(run["id"])["state"] == "canceled"
    assert acme.wait_run(run["id"], timeout=5)["state"] == "canceled"
    assert acme.wait(child["id"], timeout=5)["status"] == "canceled"


def test_invoice_pipeline(acme: Tollgate) -> None:
    file = invoice_file()
    registered = acme.register_pipeline(file["name"], file["definition"])
    again = acme.register_pipeline(file["name"], file["definition"])
    assert again["version"] == registered["version"] and again["created"] is False
    assert acme.get_pipeline("invoice")["version"] == registered["version"]
    assert acme.get_pipeline("invoice", version=registered["version"])["name"] == "invoice"

    scope = unique("pipe")
    data = {"invoice_id": "inv-117", "revision": "v1", "text": "INVOICE 2026-117 from Nimbus Cloud GmbH. Total due: 1,234.50 EUR."}
    key = unique("intake")
    run = acme.start_pipeline("invoice", scope, data, idempotency_key=key)
    assert acme.start_pipeline("invoice", scope, data, idempotency_key=key)["id"] == run["id"]
    with pytest.raises(ConflictError):
        acme.start_pipeline("invoice", scope, {**data, "revision": "v2"}, idempotency_key=key)
    done = acme.wait_run(run, timeout=30)
    assert done["state"] == "succeeded", done
    output = done.get("output")
    assert output and sorted(output) == ["category", "currency", "summary", "total", "vendor"]
    pipeline = done.get("pipeline")
    assert pipeline and [(s["key"], s["status"]) for s in pipeline["steps"]] == [
        ("extract", "succeeded"), ("category", "succeeded"), ("summary", "succeeded"),
    ]
    assert acme.start_pipeline("invoice", unique("pipe"), data, wait=20)["state"] == "succeeded"
    with pytest.raises(NotFoundError):
        acme.get_pipeline("no-such-pipeline")
    with pytest.raises(InvalidRequestError) as e:
        acme.start_pipeline("invoice", scope, {"text": "no id"})
    assert "invoice_id" in e.value.message


def test_list_tasks(acme: Tollgate, beta: Tollgate, alice: Tollgate) -> None:
    scope = unique("list")
    before = datetime.now(timezone.utc) - timedelta(seconds=1)
    done = [
        acme.run("classify", {"input": s, "labels": ["p", "q"]}, scope=scope, step="label",
                 source={"id": s, "revision": "v1"}, timeout=20)
        for s in ("s1", "s2", "s3")
    ]  # fmt: skip
    text = acme.run("generate_text", {"prompt": "hello"}, scope=scope, timeout=20)
    newest_first = [text["id"], *(t["id"] for t in reversed(done))]

    first = acme.list_tasks(scope=scope, limit=3)
    assert [t["id"] for t in first["tasks"]] == newest_first[:3]
    assert "next" in first
    second = acme.list_tasks(scope=scope, limit=3, next=first["next"])
    assert [t["id"] for t in second["tasks"]] == newest_first[3:]
    assert "next" not in second
    assert [t["id"] for t in acme.iter_tasks(scope=scope, limit=1)] == newest_first

    assert [t["id"] for t in acme.list_tasks(scope=scope, kind="classify", step="label")["tasks"]] == newest_first[1:]
    assert [t["id"] for t in acme.list_tasks(scope=scope, source="s2")["tasks"]] == [done[1]["id"]]
    assert acme.list_tasks(scope=scope, status=["queued", "running"])["tasks"] == []
    assert len(acme.list_tasks(scope=scope, status="succeeded")["tasks"]) == 4
    later = datetime.now(timezone.utc) + timedelta(minutes=1)
    assert len(acme.list_tasks(scope=scope, created_after=before, created_before=later)["tasks"]) == 4
    assert acme.list_tasks(scope=scope, created_after=later)["tasks"] == []

    with pytest.raises(BadRequestError) as e:
        acme.list_tasks(scope=scope, limit=0)
    assert e.value.status == 400 and e.value.code == "malformed_request"
    with pytest.raises(BadRequestError):
        acme.list_tasks(next="not-a-cursor")
    assert beta.list_tasks(scope=scope)["tasks"] == []

    mine = alice.submit("generate_text", {"prompt": "alice's"}, scope=scope)
    assert [t["id"] for t in alice.list_tasks(scope=scope)["tasks"]] == [mine["id"]]
    assert len(acme.list_tasks(scope=scope)["tasks"]) == 5


def test_list_runs_and_pipelines(acme: Tollgate, beta: Tollgate) -> None:
    scope = unique("list-runs")
    plain = acme.create_run(scope, {"n": 1})
    other = acme.create_run(scope, {"n": 2})
    acme.cancel_run(other["id"])
    definition = invoice_file()["definition"]
    name = unique("invoice-list")
    registered = acme.register_pipeline(name, definition)
    data = {"invoice_id": "inv-9", "revision": "v1", "text": "INVOICE 9 from Nimbus. Total due: 10.00 EUR."}
    piped = acme.start_pipeline(name, scope, data, wait=20)

    runs = acme.list_runs(scope=scope)
    assert [r["id"] for r in runs["runs"]] == [piped["id"], other["id"], plain["id"]]
    assert "next" not in runs
    assert runs["runs"][0]["pipeline"] == {"name": name, "version": registered["version"]}
    assert runs["runs"][2]["pipeline"] is None
    assert [r["id"] for r in acme.list_runs(scope=scope, state="canceled")["runs"]] == [other["id"]]
    assert [r["id"] for r in acme.list_runs(scope=scope, state=["running", "waiting"])["runs"]] == [plain["id"]]
    assert [r["id"] for r in acme.list_runs(scope=scope, pipeline=name)["runs"]] == [piped["id"]]
    page = acme.list_runs(scope=scope, limit=2)
    assert len(page["runs"]) == 2 and "next" in page
    assert [r["id"] for r in acme.iter_runs(scope=scope, limit=1)] == [piped["id"], other["id"], plain["id"]]
    assert beta.list_runs(scope=scope)["runs"] == []

    second = unique("invoice-list")
    acme.register_pipeline(second, definition)
    pipelines = list(acme.iter_pipelines(limit=1))
    names = [p["name"] for p in pipelines]
    assert names == sorted(names)
    assert name in names and second in names
    assert [v["version"] for p in pipelines if p["name"] == name for v in p["versions"]] == [registered["version"]]
    one = acme.list_pipelines(limit=1)
    assert len(one["pipelines"]) == 1 and "next" in one
    assert name not in [p["name"] for p in beta.iter_pipelines()]


def test_scopes_usage_and_stats(acme: Tollgate, beta: Tollgate, alice: Tollgate) -> None:
    scope = unique("scope-state")
    for source in ("a", "b"):
        acme.run("classify", {"input": source, "labels": ["p", "q"]}, scope=scope,
                 source={"id": source, "revision": "v1"}, timeout=20)  # fmt: skip

    state = acme.get_scope(scope)
    assert state["scope"] == scope and state["policy"]["name"] == "standard"
    assert state["admissions_in_window"] == 2 and state["sources_in_window"] == 2 and state["active"] == 0
    quiet = acme.get_scope(unique("quiet"))
    assert quiet["admissions_in_window"] == 0 and quiet["bucket_tokens"] == quiet["policy"]["burst"]
    assert beta.get_scope(scope)["admissions_in_window"] == 0

    scopes = list(acme.iter_scopes(limit=2))
    assert any(s["scope"] == scope and s["admissions_in_window"] == 2 for s in scopes)
    assert [s["scope"] for s in scopes] == sorted(s["scope"] for s in scopes)
    assert len(acme.list_scopes(limit=1)["scopes"]) == 1
    assert scope not in [s["scope"] for s in beta.iter_scopes()]

    scoped = acme.scope_usage(scope)
    assert scoped.get("scope") == scope
    for field in ("settled_usd", "reserved_usd", "overrun_usd", "saved_usd"):
        assert isinstance(scoped[field], (int, float)), field
    assert scoped["reserved_tokens"] == 0
    whole = acme.usage()
    assert whole.get("scope") is None
    assert whole["settled_tokens"] >= scoped["settled_tokens"]

    stats = acme.stats()
    assert stats["source"] == "database" and stats["window_seconds"] == 3600
    assert stats["succeeded"] >= 2
    assert isinstance(stats["failures_by_code"], list)

    for call in (
        lambda: alice.get_scope(scope),
        lambda: alice.list_scopes(),
        lambda: alice.scope_usage(scope),
        lambda: alice.usage(),
        lambda: alice.stats(),
    ):
        with pytest.raises(ForbiddenError) as forbidden:
            call()
        assert forbidden.value.status == 403 and forbidden.value.code == "subject_not_allowed"


def test_another_apps_key_gets_not_found(acme: Tollgate, beta: Tollgate) -> None:
    scope = unique("tenant")
    key = unique("acme-only")
    task = acme.submit("generate_text", {"prompt": "private"}, scope=scope, idempotency_key=key)
    run = acme.create_run(scope)
    file = invoice_file()
    acme.register_pipeline(file["name"], file["definition"])
    for attempt in (
        lambda: beta.get_task(task["id"]),
        lambda: beta.get_task_by_effect_key(key),
        lambda: beta.wait(task["id"], timeout=1),
        lambda: beta.cancel(task["id"]),
        lambda: beta.release(key, scope),
        lambda: beta.get_run(run["id"]),
        lambda: beta.cancel_run(run["id"]),
        lambda: beta.get_pipeline("invoice"),
    ):
        with pytest.raises(NotFoundError) as e:
            attempt()
        assert e.value.status == 404
    assert beta.delete_owner_data(scope) == {"deleted": 0}
    assert acme.get_task(task["id"])["id"] == task["id"]


def test_webhook_endpoints(acme: Tollgate, beta: Tollgate, alice: Tollgate) -> None:
    created = acme.create_webhook("http://127.0.0.1:9/crud", ["run.finished"], description="crud")
    assert created["id"].startswith("whe_")
    assert created.get("secret", "").startswith("whsec_")
    assert created["events"] == ["run.finished"]
    assert created["enabled"] is True and created["from_config"] is False
    assert acme.get_webhook(created["id"]).get("secret") == created.get("secret")
    listed = [w for w in acme.list_webhooks() if w["id"] == created["id"]]
    assert len(listed) == 1 and listed[0]["url"] == "http://127.0.0.1:9/crud"
    assert "secret" not in listed[0], "listings carry no secrets"

    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    updated = acme.update_webhook(
        created["id"], enabled=False, events=["task.failed", "task.canceled"], description=None, secret=secret
    )
    assert updated["enabled"] is False
    assert sorted(updated["events"]) == ["task.canceled", "task.failed"]
    assert updated["description"] is None
    assert acme.get_webhook(created["id"]).get("secret") == secret
    assert acme.update_webhook(created["id"], url="http://127.0.0.1:9/other")["url"] == "http://127.0.0.1:9/other"
    assert acme.list_deliveries(created["id"], state="pending", limit=10) == []
    assert created["budget_thresholds"] == [0.8], "the default"
    budget = acme.create_webhook(
        "http://127.0.0.1:9/budget", ["budget.threshold"], budget_thresholds=[1.0, 0.5]
    )
    assert budget["budget_thresholds"] == [0.5, 1.0]
    assert acme.update_webhook(budget["id"], budget_thresholds=[0.9])["budget_thresholds"] == [0.9]
    with pytest.raises(InvalidRequestError):
        acme.create_webhook("http://127.0.0.1:9/budget", ["budget.threshold"], budget_thresholds=[1.5])
    acme.delete_webhook(budget["id"])

    with pytest.raises(InvalidRequestError):
        acme.create_webhook("https://10.0.0.1/x", ["task.failed"])
    with pytest.raises(InvalidRequestError):
        acme.create_webhook("https://hooks.example.com/x", [])
    with pytest.raises(InvalidRequestError):
        acme.update_webhook(created["id"], secret="whsec_c2hvcnQ=")
    with pytest.raises(NotFoundError) as not_found:
        beta.get_webhook(created["id"])
    assert not_found.value.status == 404
    with pytest.raises(NotFoundError):
        beta.update_webhook(created["id"], enabled=True)
    with pytest.raises(NotFoundError):
        beta.delete_webhook(created["id"])
    with pytest.raises(NotFoundError):
        beta.list_deliveries(created["id"])
    assert created["id"] not in [w["id"] for w in beta.list_webhooks()]
    with pytest.raises(ForbiddenError):
        alice.list_webhooks()
    with pytest.raises(ForbiddenError):
        alice.create_webhook("https://hooks.example.com/x", ["task.failed"])

    assert acme.delete_webhook(created["id"]) is None  # type: ignore[func-returns-value]
    with pytest.raises(NotFoundError):
        acme.get_webhook(created["id"])
    with pytest.raises(NotFoundError):
        acme.delete_webhook(created["id"])


def deliveries_of(client: Tollgate, endpoint: str, event_id: str, delivered: set[str] | None = None) -> list[DeliveryView]:
    """The endpoint's deliveries of the event, once each id in ``delivered`` (or any, when
    None) is delivered."""
    deadline = time.monotonic() + 10
    while True:
        found = [d for d in client.list_deliveries(endpoint) if d["event_id"] == event_id]
        done = {d["id"] for d in found if d["state"] == "delivered"}
        if (done and delivered is None) or (delivered is not None and delivered <= done):
            return found
        assert time.monotonic() < deadline, found
        time.sleep(0.1)


def test_webhook_delivered_signed_and_replayed(acme: Tollgate, beta: Tollgate, receiver: Receiver) -> None:
    endpoint = acme.create_webhook(receiver.url, ["task.succeeded"])
    secret = endpoint.get("secret", "")
    task = acme.run("classify", {"input": "Win a free cruise!", "labels": ["spam", "ham"]}, scope=unique("hooks"), timeout=30)
    assert task["status"] == "succeeded"
    event_id = f"evt_{task['id']}"

    (first,) = receiver.wait_for(event_id, 1)
    event = verify_webhook(secret, first.headers, first.body)
    assert event["type"] == "task.succeeded" and event["id"] == event_id
    assert event["data"]["task_id"] == task["id"]

    (delivered,) = [d for d in deliveries_of(acme, endpoint["id"], event_id) if d["state"] == "delivered"]
    assert delivered["endpoint_id"] == endpoint["id"]
    assert delivered["event_type"] == "task.succeeded"
    assert delivered["response_code"] == 200
    assert delivered["attempts"] >= 1 and delivered["replay_of"] is None
    assert delivered["id"] in [d["id"] for d in acme.list_deliveries(endpoint["id"], state="delivered")]
    assert delivered["id"] not in [d["id"] for d in acme.list_deliveries(endpoint["id"], state="dead")]

    replay = acme.replay_delivery(endpoint["id"], delivered["id"])
    assert replay["id"] != delivered["id"]
    assert replay["replay_of"] == delivered["id"]
    assert replay["event_id"] == event_id and replay["state"] == "pending"
    again = receiver.wait_for(event_id, 2)
    assert again[1].body == first.body, "a replay sends the same event"
    verify_webhook(secret, again[1].headers, again[1].body)
    deliveries_of(acme, endpoint["id"], event_id, {delivered["id"], replay["id"]})

    with pytest.raises(NotFoundError):
        acme.replay_delivery(endpoint["id"], "no-such-delivery")
    with pytest.raises(NotFoundError):
        beta.replay_delivery(endpoint["id"], delivered["id"])
    acme.delete_webhook(endpoint["id"])
