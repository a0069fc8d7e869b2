"""The clients cover every operation of the server's OpenAPI document (clients/openapi.json,
which CI checks is fresh against the live server): ``tollgate.OPERATIONS`` maps each
operation to the methods that call it, checked here both ways, and each method of both
clients is called over a recording transport to see that it sends the method and path its
entry says."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qsl

import httpx
import pytest

from conftest import REPO_ROOT
from tollgate import OPERATIONS, ROUTES_OUTSIDE_OPENAPI, AsyncTollgate, Tollgate

HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
DOCUMENT: dict[str, Any] = json.loads((REPO_ROOT / "clients" / "openapi.json").read_text())
DOCUMENTED = [
    f"{method.upper()} {path}"
    for path, item in DOCUMENT["paths"].items()
    for method in HTTP_METHODS
    if method in item
]
ROUTES: dict[str, tuple[str, ...]] = {
    **OPERATIONS,
    **{route: methods for route, (methods, _) in ROUTES_OUTSIDE_OPENAPI.items()},
}


def test_the_document_has_operations() -> None:
    assert len(DOCUMENTED) >= 20, DOCUMENTED


def test_every_documented_operation_has_a_method() -> None:
    missing = [op for op in DOCUMENTED if op not in OPERATIONS]
    assert missing == [], "operations of clients/openapi.json without an entry in tollgate/_operations.py"
    assert all(OPERATIONS[op] for op in DOCUMENTED)


def test_the_table_names_no_unknown_operation() -> None:
    unknown = [op for op in OPERATIONS if op not in DOCUMENTED]
    assert unknown == [], "entries of tollgate/_operations.py that clients/openapi.json does not have"


def test_routes_outside_the_document_are_not_in_it() -> None:
    for route, (_, reason) in ROUTES_OUTSIDE_OPENAPI.items():
        assert route not in DOCUMENTED, f"{route} is in clients/openapi.json now: move it to OPERATIONS"
        assert reason


@pytest.mark.parametrize("cls", [Tollgate, AsyncTollgate])
def test_every_named_method_exists_on_both_clients(cls: type[Any]) -> None:
    for route, methods in ROUTES.items():
        for name in methods:
            assert callable(getattr(cls, name, None)), f"{route}: {cls.__name__}.{name}"


# ---- each method sends its route ----


def _matcher(route: str) -> tuple[str, str, re.Pattern[str], bool]:
    method, template = route.split(" ")
    pattern = re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template))
    return route, method, re.compile(f"^{pattern}$"), "{" not in template


MATCHERS = [_matcher(route) for route in ROUTES]


def route_of(method: str, path: str) -> str | None:
    """The table's route of a request: a literal path wins over a template (``/v1/tasks/batch``)."""
    hits = [(route, literal) for route, m, regex, literal in MATCHERS if m == method and regex.match(path)]
    for route, literal in hits:
        if literal:
            return route
    return hits[0][0] if hits else None


TASK = {"id": "t-1", "kind": "classify", "status": "succeeded", "created": True}
RUN = {"id": "r-1", "state": "succeeded", "scope": "s"}


def answer_for(route: str | None) -> Any:
    """A plausible answer of each route, enough for the client to finish the call."""
    pages = {
        "GET /v1/tasks": {"tasks": [TASK]},
        "GET /v1/runs": {"runs": []},
        "GET /v1/pipelines": {"pipelines": []},
        "GET /v1/scopes": {"scopes": []},
        "GET /v1/scopes/{scope}/unreleased-sources": {"sources": []},
        "POST /v1/tasks/batch": {"results": []},
        "GET /v1/kinds": {"kinds": []},
        "GET /v1/models": {"models": []},
        "GET /v1/webhooks": {"webhooks": []},
        "GET /v1/webhooks/{id}/deliveries": {"deliveries": []},
    }
    if route in pages:
        return pages[route]
    if route and "/v1/runs" in route or route == "POST /v1/pipelines/{name}/runs":
        return RUN
    return TASK if route and "/v1/tasks" in route else {"status": "ok"}


CLASSIFY: dict[str, Any] = {"input": "x", "labels": ["a", "b"]}
#: One call of every method the table names: (positional, keyword) arguments.
CALLS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "submit": (("classify", CLASSIFY), {"scope": "s"}),
    "run": (("classify", CLASSIFY), {"scope": "s", "timeout": 1}),
    "submit_batch": (([{"kind": "classify", "scope": "s", "request": CLASSIFY}],), {}),
    "list_tasks": ((), {"scope": "s", "status": ["queued", "running"], "limit": 10}),
    "iter_tasks": ((), {"scope": "s"}),
    "get_task_by_effect_key": (("k/1",), {}),
    "get_task": (("t/1",), {}),
    "wait": (("t-1",), {"timeout": 1}),
    "cancel": (("t-1",), {}),
    "events": (("t-1",), {}),
    "release": (("k", "s"), {}),
    "list_scopes": ((), {"limit": 5}),
    "iter_scopes": ((), {}),
    "get_scope": (("team/a",), {}),
    "scope_usage": (("team/a",), {}),
    "unreleased_sources": (("team/a",), {}),
    "iter_unreleased_sources": (("s",), {}),
    "delete_owner_data": (("s",), {"source": "src"}),
    "create_run": (("s",), {}),
    "list_runs": ((), {"state": ["running", "waiting"], "pipeline": "invoice"}),
    "iter_runs": ((), {}),
    "get_run": (("r-1",), {}),
    "wait_run": (("r-1",), {"timeout": 1}),
    "cancel_run": (("r-1",), {}),
    "register_pipeline": (("p", {"steps": []}), {}),
    "list_pipelines": ((), {}),
    "iter_pipelines": ((), {}),
    "get_pipeline": (("p",), {}),
    "start_pipeline": (("p", "s"), {}),
    "create_webhook": (("https://hooks.example.com/t", ["task.succeeded"]), {}),
    "list_webhooks": ((), {}),
    "get_webhook": (("whe_1",), {}),
    "update_webhook": (("whe_1",), {"enabled": False}),
    "delete_webhook": (("whe_1",), {}),
    "list_deliveries": (("whe_1",), {"state": "dead", "limit": 5}),
    "replay_delivery": (("whe_1", "d/1"), {}),
    "kinds": ((), {}),
    "models": ((), {}),
    "usage": ((), {}),
    "stats": ((), {}),
    "healthz": ((), {}),
    "readyz": ((), {}),
}

CASES = [(route, name) for route, methods in ROUTES.items() for name in methods]


def recorder(seen: list[tuple[str, str, str | None]]) -> Callable[[httpx.Request], httpx.Response]:
    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.raw_path.decode().split("?")[0]
        route = route_of(request.method, path)
        seen.append((request.method, path, route))
        return httpx.Response(200, json=answer_for(route))

    return handle


def check(name: str, route: str, seen: list[tuple[str, str, str | None]]) -> None:
    assert seen, f"{name} sent nothing"
    for method, path, known in seen:
        assert known, f"{name} sent {method} {path}, which is no known route"
    assert any(known == route for _, _, known in seen), f"{name} sent {seen}, not {route}"


@pytest.mark.parametrize(("route", "name"), CASES)
def test_sync_method_sends_its_operation(route: str, name: str) -> None:
    assert name in CALLS, f"add a sample call of {name} to CALLS in tests/test_operations.py"
    args, kwargs = CALLS[name]
    seen: list[tuple[str, str, str | None]] = []
    http = httpx.Client(base_url="http://tollgate.invalid", transport=httpx.MockTransport(recorder(seen)))
    with Tollgate("http://tollgate.invalid", "k", max_retries=0, http_client=http) as client:
        result = getattr(client, name)(*args, **kwargs)
        if inspect.isgenerator(result):
            list(result)
    check(name, route, seen)


@pytest.mark.anyio
@pytest.mark.parametrize(("route", "name"), CASES)
async def test_async_method_sends_its_operation(route: str, name: str) -> None:
    assert name in CALLS, f"add a sample call of {name} to CALLS in tests/test_operations.py"
    args, kwargs = CALLS[name]
    seen: list[tuple[str, str, str | None]] = []
    http = httpx.AsyncClient(base_url="http://tollgate.invalid", transport=httpx.MockTransport(recorder(seen)))
    async with AsyncTollgate("http://tollgate.invalid", "k", max_retries=0, http_client=http) as client:
        result = getattr(client, name)(*args, **kwargs)
        if inspect.isasyncgen(result):
            async for _ in result:
                pass
        else:
            await result
    check(name, route, seen)


def test_path_segments_are_encoded() -> None:
    seen: list[tuple[str, str, str | None]] = []
    http = httpx.Client(base_url="http://tollgate.invalid", transport=httpx.MockTransport(recorder(seen)))
    with Tollgate("http://tollgate.invalid", "k", http_client=http) as client:
        client.get_scope("team/a")
    assert [path for _, path, _ in seen] == ["/v1/scopes/team%2Fa"]


def test_listing_filters_go_in_the_query_as_the_server_reads_them() -> None:
    queries: list[dict[str, str]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        queries.append(dict(parse_qsl(request.url.query.decode())))
        return httpx.Response(200, json={"tasks": [], "runs": []})

    http = httpx.Client(base_url="http://tollgate.invalid", transport=httpx.MockTransport(handle))
    with Tollgate("http://tollgate.invalid", "k", http_client=http) as client:
        client.list_tasks(
            scope="s",
            status=["queued", "running"],
            kind="classify",
            created_after=datetime(2026, 1, 2, tzinfo=timezone.utc),
            limit=7,
            next="c",
        )
        client.list_runs(state="waiting")
        with pytest.raises(ValueError, match="naive"):
            client.list_tasks(created_before=datetime(2026, 1, 2))
    assert queries == [
        {
            "scope": "s",
            "status": "queued,running",
            "kind": "classify",
            "created_after": "2026-01-02T00:00:00+00:00",
            "limit": "7",
            "next": "c",
        },
        {"state": "waiting"},
    ]
