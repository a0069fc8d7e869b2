"""The official Python client for Tollgate, the durable budgeted AI task service.

``Tollgate`` (sync) and ``AsyncTollgate`` (asyncio/trio) cover the whole HTTP API; the
request, task, run and error shapes are TypedDicts generated from the server's
``/openapi.json`` and ``GET /v1/kinds`` (``tollgate._generated``, made by
``clients/generate.sh``).
"""

from ._calls import new_idempotency_key
from ._operations import OPERATIONS, ROUTES_OUTSIDE_OPENAPI
from ._sse import TaskStreamEvent
from ._generated import (
    BatchAnswer,
    BatchItem,
    ChatMessage,
    ChatOutput,
    ChatRequest,
    ClassifyManyOutput,
    ClassifyManyRequest,
    ClassifyOutput,
    ClassifyRequest,
    DeletedAnswer,
    DeliveryListView,
    DeliveryStateName,
    DeliveryView,
    EmbedItem,
    EmbedOutput,
    EmbedRequest,
    ErrorDetail,
    ExtractDataOutput,
    ExtractDataRequest,
    GenerateTextOutput,
    GenerateTextRequest,
    Kind,
    KindView,
    Label,
    ModelView,
    PipelinePageView,
    PipelineProgressView,
    PipelineSummaryView,
    PipelineView,
    ReleaseAnswer,
    RunPageView,
    RunSummaryView,
    RunView,
    ScopePageView,
    ScopeView,
    SourceBody,
    StatsView,
    StepView,
    TaskErrorView,
    TaskPageView,
    TaskView,
    UnreleasedPageView,
    UnreleasedSourceView,
    UsageReportView,
    UsageView,
    WebhookBody,
    WebhookEventName,
    WebhookListView,
    WebhookPatchBody,
    WebhookView,
)
from .client import AsyncTollgate, KindRequest, Tollgate, batch_item
from .webhook import WebhookVerificationError, verify_webhook
from .errors import (
    AdmissionError,
    BadRequestError,
    ConflictError,
    ConnectionError,
    ForbiddenError,
    InvalidRequestError,
    NotFoundError,
    RequestTooLargeError,
    ServerError,
    TollgateError,
    UnauthorizedError,
    UnavailableError,
    WaitTimeoutError,
    error_for,
)

#: A task (docs/conformance.md#http-shapes).
Task = TaskView
#: A workflow run; a pipeline run has ``pipeline`` with its steps.
Run = RunView
#: A registered pipeline version.
Pipeline = PipelineView
#: A scope's policy in force and live admission state.
Scope = ScopeView
#: A webhook endpoint (``secret`` only on creation and from ``get_webhook``).
Webhook = WebhookView
#: One delivery of an event to a webhook endpoint.
WebhookDelivery = DeliveryView


def batch_item_error(item: BatchItem) -> TollgateError | None:
    """The typed error of a refused batch item (``None`` for a submitted one)."""
    error = item.get("error")
    return None if error is None else error_for(item["status"], error, None)


__all__ = [
    "TaskStreamEvent",
    "WebhookVerificationError",
    "verify_webhook",
    "OPERATIONS", "ROUTES_OUTSIDE_OPENAPI",
    "DeliveryListView", "DeliveryStateName", "DeliveryView", "Webhook", "WebhookBody",
    "WebhookDelivery", "WebhookEventName", "WebhookListView", "WebhookPatchBody", "WebhookView",
    "AdmissionError", "AsyncTollgate", "BadRequestError", "BatchAnswer", "BatchItem",
    "ChatMessage", "ChatOutput", "ChatRequest", "ClassifyManyOutput", "ClassifyManyRequest", "ClassifyOutput",
    "ClassifyRequest", "ConflictError", "ConnectionError", "DeletedAnswer", "EmbedItem", "EmbedOutput", "EmbedRequest", "ErrorDetail",
    "ExtractDataOutput", "ExtractDataRequest", "ForbiddenError", "GenerateTextOutput",
    "GenerateTextRequest", "InvalidRequestError", "Kind", "KindRequest", "KindView", "Label",
    "ModelView", "NotFoundError", "Pipeline", "PipelinePageView", "PipelineProgressView",
    "PipelineSummaryView", "PipelineView", "ReleaseAnswer", "RequestTooLargeError", "Run",
    "RunPageView", "RunSummaryView", "RunView", "Scope", "ScopePageView", "ScopeView",
    "ServerError", "SourceBody", "StatsView", "StepView", "Task", "TaskErrorView",
    "TaskPageView", "TaskView", "Tollgate", "TollgateError", "UnauthorizedError",
    "UnavailableError", "UnreleasedPageView", "UnreleasedSourceView", "UsageReportView",
    "UsageView", "WaitTimeoutError", "batch_item", "batch_item_error", "new_idempotency_key",
]
