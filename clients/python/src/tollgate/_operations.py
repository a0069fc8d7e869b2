"""Every operation of the server's ``/openapi.json`` (``clients/openapi.json``), as
``"METHOD /path"``, with the client methods that call it (the same names on
:class:`~tollgate.Tollgate` and :class:`~tollgate.AsyncTollgate`).

``tests/test_operations.py`` checks the table both ways against the committed document — no
operation missing, none unknown — and calls each method to see that it sends that method
and path, so a new route cannot go without a method.
"""

from __future__ import annotations

from typing import Final, Mapping

OPERATIONS: Final[Mapping[str, tuple[str, ...]]] = {
    # tasks
    "POST /v1/tasks": ("submit", "run"),
    "POST /v1/tasks/batch": ("submit_batch",),
    "GET /v1/tasks": ("list_tasks", "iter_tasks", "get_task_by_effect_key"),
    "GET /v1/tasks/{id}": ("get_task", "wait"),
    "POST /v1/tasks/{id}/cancel": ("cancel",),
    "GET /v1/tasks/{id}/events": ("events",),
    "POST /v1/tasks/release": ("release",),
    # scopes
    "GET /v1/scopes": ("list_scopes", "iter_scopes"),
    "GET /v1/scopes/{scope}": ("get_scope",),
    "GET /v1/scopes/{scope}/usage": ("scope_usage",),
    "GET /v1/scopes/{scope}/unreleased-sources": ("unreleased_sources", "iter_unreleased_sources"),
    "DELETE /v1/scopes/{scope}/tasks": ("delete_owner_data",),
    # runs
    "POST /v1/runs": ("create_run",),
    "GET /v1/runs": ("list_runs", "iter_runs"),
    "GET /v1/runs/{id}": ("get_run", "wait_run"),
    "POST /v1/runs/{id}/cancel": ("cancel_run",),
    # pipelines
    "POST /v1/pipelines": ("register_pipeline",),
    "GET /v1/pipelines": ("list_pipelines", "iter_pipelines"),
    "GET /v1/pipelines/{name}": ("get_pipeline",),
    "POST /v1/pipelines/{name}/runs": ("start_pipeline",),
    # webhooks
    "POST /v1/webhooks": ("create_webhook",),
    "GET /v1/webhooks": ("list_webhooks",),
    "GET /v1/webhooks/{id}": ("get_webhook",),
    "PATCH /v1/webhooks/{id}": ("update_webhook",),
    "DELETE /v1/webhooks/{id}": ("delete_webhook",),
    "GET /v1/webhooks/{id}/deliveries": ("list_deliveries",),
    "POST /v1/webhooks/{id}/deliveries/{delivery}/replay": ("replay_delivery",),
    # discovery
    "GET /v1/kinds": ("kinds",),
    "GET /v1/models": ("models",),
    "GET /v1/usage": ("usage",),
    "GET /v1/stats": ("stats",),
}

_DOOR = "the OpenAI-compatible door: the official openai SDK covers it (docs/openai.md)"

#: The server's routes that ``/openapi.json`` does not describe: ``(methods, why)``. The test
#: checks that none of them is in the document (one that moves into it moves to OPERATIONS).
ROUTES_OUTSIDE_OPENAPI: Final[Mapping[str, tuple[tuple[str, ...], str]]] = {
    "GET /healthz": (("healthz",), "liveness probe, no key"),
    "GET /readyz": (("readyz",), "readiness probe, no key"),
    "GET /openapi.json": ((), "the document itself: the client's types are generated from it"),
    "GET /metrics": ((), "Prometheus text for a scraper, server-wide; stats() is the app's own figures as JSON"),
    "GET /ui": ((), "the dashboard's static files, for a browser"),
    "POST /openai/v1/chat/completions": ((), _DOOR),
    "GET /openai/v1/models": ((), _DOOR),
    "GET /openai/v1/models/{id}": ((), _DOOR),
}
