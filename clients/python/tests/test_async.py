"""The async client, end to end against a real ``tollgate serve`` (conftest.py)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from conftest import ACME_KEY, ALICE_KEY, BETA_KEY, REPO_ROOT, Receiver, Server
from tollgate import (
    AdmissionError,
    AsyncTollgate,
    ConflictError,
    ForbiddenError,
    InvalidRequestError,
    NotFoundError,
    UnavailableError,
    WaitTimeoutError,
    batch_item,
    batch_item_error,
    verify_webhook,
)

pytestmark = pytest.mark.anyio


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def acme(server: Server) -> AsyncIterator[AsyncTollgate]:
    async with AsyncTollgate(server.base_url, ACME_KEY) as client:
        yield client


@pytest.fixture
async def beta(server: Server) -> AsyncIterator[AsyncTollgate]:
    async with AsyncTollgate(server.base_url, BETA_KEY) as client:
        yield client


async def test_discovery(acme: AsyncTollgate) -> None:
    assert await acme.healthz() == {"status": "ok"}
    assert await acme.readyz() == {"status": "ready"}
    assert len(await acme.kinds()) == 6
    assert {m["id"] for m in await acme.models()} == {"default", "slow"}


async def test_four_kinds_in_parallel(acme: AsyncTollgate) -> None:
    scope = unique("kinds")
    tasks = await asyncio.gather(
        acme.run("classify", {"input": "Win a free cruise!", "labels": ["spam", "ham"]}, scope=scope,
                 source={"id": "msg-1", "revision": "v1"}, timeout=20),
        acme.run("generate_text", {"prompt": "hello"}, scope=scope, timeout=20),
        acme.run("classify_many", {"items": [{"id": "a", "input": "x"}], "labels": ["p", "q"]}, scope=scope, timeout=20),
        acme.run("extract_data", {"input": "total 3", "schema": {"type": "object", "required": ["total"],
                 "properties": {"total": {"type": "number"}}}}, scope=scope, timeout=20),
        acme.run("embed", {"input": "hello", "dimensions": 4}, scope=scope, timeout=20),
    )
    assert [t["status"] for t in tasks] == ["succeeded"] * 5
    assert [t["kind"] for t in tasks] == ["classify", "generate_text", "classify_many", "extract_data", "embed"]
    # A finished task's events: its answer as one delta, then its end.
    events = [e async for e in acme.events(tasks[1]["id"])]
    assert [e["event"] for e in events] == ["delta", "end"]
    assert events[0]["data"] == {"text": tasks[1]["output"]["text"]}
    assert events[1]["data"]["status"] == "succeeded"


async def test_replay_conflict_and_kept_key(acme: AsyncTollgate, server: Server) -> None:
    scope = unique("idem")
    key = unique("k")
    first = await acme.submit("generate_text", {"prompt": "a"}, scope=scope, idempotency_key=key)
    again = await acme.submit("generate_text", {"prompt": "a"}, scope=scope, idempotency_key=key)
    assert again["id"] == first["id"] and again["created"] is False
    with pytest.raises(ConflictError) as e:
        await acme.submit("generate_text", {"prompt": "b"}, scope=scope, idempotency_key=key)
    assert e.value.code == "idempotency_key_conflict"

    keys: list[str | None] = []
    inner = httpx.AsyncHTTPTransport()

    class LoseFirst(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            keys.append(request.headers.get("idempotency-key"))
            response = await inner.handle_async_request(request)
            if len(keys) == 1:
                await response.aread()
                raise httpx.ReadError("connection reset", request=request)
            return response

    http = httpx.AsyncClient(base_url=server.base_url, transport=LoseFirst())
    async with AsyncTollgate(server.base_url, ACME_KEY, http_client=http, retry_base_delay=0.01) as client:
        task = await client.submit("generate_text", {"prompt": "hi"}, scope=scope)
    assert keys[0] == keys[1] == task["effect_key"] and task["created"] is False


async def test_503_retried(server: Server) -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(503, json={"error": {"code": "database_unavailable", "message": "down"}})

    http = httpx.AsyncClient(base_url=server.base_url, transport=httpx.MockTransport(handler))
    async with AsyncTollgate(server.base_url, ACME_KEY, http_client=http, max_retries=2, retry_base_delay=0.01) as c:
        with pytest.raises(UnavailableError):
            await c.kinds()
    assert calls == 3


async def test_admission_and_opt_in_retry(acme: AsyncTollgate) -> None:
    scope = unique("tight")

    async def tight(n: int, **kw: Any) -> Any:
        return await acme.submit("classify", {"input": f"doc {n}", "labels": ["a", "b"]}, scope=scope,
                                 budget="tight", source={"id": f"doc-{n}", "revision": "v1"}, **kw)

    await tight(1)
    with pytest.raises(AdmissionError) as e:
        await tight(2)
    assert e.value.code == "WORKFLOW_AI_RATE_LIMIT" and (e.value.retry_after or 0) >= 1
    task = await tight(3, retry_admission=True, deadline=10)
    assert task["created"] is True


async def test_wait_timeout_cancellation_and_cancel(acme: AsyncTollgate) -> None:
    task = await acme.submit("generate_text", {"prompt": "slow"}, scope=unique("slow"), model="slow")
    started = time.monotonic()
    with pytest.raises(WaitTimeoutError) as e:
        await acme.wait(task, timeout=1.2)
    assert 1.1 <= time.monotonic() - started < 5
    assert e.value.last["status"] in ("queued", "running")

    # Cancelling the caller's wait (asyncio) stops waiting, not the task.
    waiter = asyncio.ensure_future(acme.wait(task["id"]))
    await asyncio.sleep(0.3)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(acme.wait(task["id"]), 0.3)
    assert (await acme.get_task(task["id"]))["status"] in ("queued", "running")

    canceled = await acme.cancel(task["id"])
    assert canceled["status"] == "canceled"
    assert (await acme.wait(task["id"], timeout=5))["status"] == "canceled"


async def test_batch_reads_release_scopes(acme: AsyncTollgate) -> None:
    scope = unique("scope")
    answer = await acme.submit_batch([
        batch_item("classify", {"input": "s1", "labels": ["p", "q"]}, scope=scope, source={"id": "s1", "revision": "v1"},
                   effect_key=f"{scope}-s1"),
        batch_item("classify", {"input": "s2", "labels": ["p", "q"]}, scope=scope, source={"id": "s2", "revision": "v1"}),
        batch_item("classify", {"input": "bad", "labels": []}, scope=scope),
    ])
    assert [r["status"] for r in answer["results"]] == [201, 201, 422]
    assert isinstance(batch_item_error(answer["results"][2]), InvalidRequestError)
    first = await acme.get_task_by_effect_key(f"{scope}-s1")
    assert (await acme.wait(first["id"], timeout=20))["status"] == "succeeded"
    assert [s["source"] async for s in acme.iter_unreleased_sources(scope)] == ["s1", "s2"]
    assert (await acme.unreleased_sources(scope, after="s1"))["sources"][0]["source"] == "s2"
    assert await acme.release(f"{scope}-s1", scope) == {"released": True}
    assert await acme.delete_owner_data(scope) == {"deleted": 2}
    with pytest.raises(NotFoundError):
        await acme.get_task(first["id"])


async def test_runs_and_pipeline(acme: AsyncTollgate, beta: AsyncTollgate) -> None:
    scope = unique("run")
    run = await acme.create_run(scope, {"x": 1})
    assert (await acme.get_run(run["id"]))["id"] == run["id"]
    assert (await acme.cancel_run(run["id"]))["state"] == "canceled"
    assert (await acme.wait_run(run, timeout=5))["state"] == "canceled"

    file = json.loads((REPO_ROOT / "docs/examples/invoice-pipeline.json").read_text())
    registered = await acme.register_pipeline(file["name"], file["definition"])
    assert (await acme.get_pipeline("invoice"))["version"] == registered["version"]
    data = {"invoice_id": "inv-9", "revision": "v1", "text": "INVOICE from Nimbus Cloud GmbH. Total 10 EUR."}
    started = await acme.start_pipeline("invoice", scope, data, idempotency_key=unique("start"))
    done = await acme.wait_run(started["id"], timeout=30)
    assert done["state"] == "succeeded", done

    with pytest.raises(NotFoundError):
        await beta.get_run(done["id"])
    with pytest.raises(NotFoundError):
        await beta.get_pipeline("invoice")
    with pytest.raises(NotFoundError):
        await beta.get_task((done.get("pipeline") or {"steps": [{"task_id": "x"}]})["steps"][0]["task_id"] or "x")


async def test_listings_scopes_usage_stats(acme: AsyncTollgate, server: Server) -> None:
    scope = unique("alist")
    done = [
        await acme.run("classify", {"input": s, "labels": ["p", "q"]}, scope=scope,
                       source={"id": s, "revision": "v1"}, timeout=20)
        for s in ("s1", "s2")
    ]  # fmt: skip
    newest_first = [done[1]["id"], done[0]["id"]]
    page = await acme.list_tasks(scope=scope, limit=1)
    assert [t["id"] for t in page["tasks"]] == newest_first[:1] and "next" in page
    assert [t["id"] async for t in acme.iter_tasks(scope=scope, limit=1)] == newest_first
    assert (await acme.list_tasks(scope=scope, status=["failed", "canceled"]))["tasks"] == []

    run = await acme.create_run(scope)
    assert [r["id"] for r in (await acme.list_runs(scope=scope))["runs"]] == [run["id"]]
    assert [r["id"] async for r in acme.iter_runs(scope=scope, state="running")] == [run["id"]]
    await acme.cancel_run(run["id"])

    file = json.loads((REPO_ROOT / "docs/examples/invoice-pipeline.json").read_text())
    name = unique("ainvoice")
    await acme.register_pipeline(name, file["definition"])
    assert name in [p["name"] async for p in acme.iter_pipelines()]
    assert len((await acme.list_pipelines(limit=1))["pipelines"]) == 1

    state = await acme.get_scope(scope)
    assert state["scope"] == scope and state["admissions_in_window"] == 2
    assert scope in [s["scope"] async for s in acme.iter_scopes()]
    assert len((await acme.list_scopes(limit=1))["scopes"]) == 1
    assert (await acme.scope_usage(scope)).get("scope") == scope
    assert (await acme.usage()).get("scope") is None
    assert (await acme.stats())["succeeded"] >= 2

    async with AsyncTollgate(server.base_url, ALICE_KEY) as alice:
        with pytest.raises(ForbiddenError):
            await alice.stats()
        with pytest.raises(ForbiddenError):
            await alice.get_scope(scope)


async def test_webhooks(acme: AsyncTollgate, beta: AsyncTollgate, receiver: Receiver) -> None:
    endpoint = await acme.create_webhook(receiver.url, ["task.succeeded"], description="async")
    assert (await acme.get_webhook(endpoint["id"])).get("secret") == endpoint.get("secret")
    assert endpoint["id"] in [w["id"] for w in await acme.list_webhooks()]
    with pytest.raises(NotFoundError):
        await beta.get_webhook(endpoint["id"])

    task = await acme.run("classify", {"input": "hello", "labels": ["spam", "ham"]}, scope=unique("hooks"), timeout=30)
    event_id = f"evt_{task['id']}"
    deadline = time.monotonic() + 10
    while not receiver.of_event(event_id):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    first = receiver.of_event(event_id)[0]
    assert verify_webhook(endpoint.get("secret", ""), first.headers, first.body)["id"] == event_id

    while True:
        found = [d for d in await acme.list_deliveries(endpoint["id"], limit=50) if d["event_id"] == event_id]
        if found and found[0]["state"] == "delivered":
            break
        assert time.monotonic() < deadline, found
        await asyncio.sleep(0.1)
    replay = await acme.replay_delivery(endpoint["id"], found[0]["id"])
    assert replay["replay_of"] == found[0]["id"] and replay["event_id"] == event_id

    updated = await acme.update_webhook(endpoint["id"], enabled=False, description=None)
    assert updated["enabled"] is False and updated["description"] is None
    await acme.delete_webhook(endpoint["id"])
    with pytest.raises(NotFoundError):
        await acme.get_webhook(endpoint["id"])
