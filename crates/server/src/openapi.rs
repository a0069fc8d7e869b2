//! The OpenAPI document, generated from the handlers and shapes (utoipa).

use crate::dto::{
    AttemptView, BatchAnswer, BatchBody, BatchItem, CostView, DefinitionOutline, DeletedAnswer,
    DeploymentView, FailureCount, HashableJson, HashableObject, ID_PATTERN_IN_ANNOTATIONS,
    Identifier, KindName, KindView, KindsAnswer, LatencyView, MinuteCountView, ModelView,
    ModelsAnswer, PipelineBody, PipelinePageView, PipelineProgressView, PipelineRunBody,
    PipelineSummaryView, PipelineVersionView, PipelineView, PolicyView, PricesView, ReleaseAnswer,
    ReleaseBody, RouteView, RunBody, RunPageView, RunPipelineRef, RunStateName, RunSummaryView,
    RunView, ScopePageView, ScopeView, SourceBody, SourceView, StatsView, StepStatusName, StepView,
    SubjectView, SubmitBody, TaskErrorView, TaskPageView, TaskStatusName, TaskView, TasksAnswer,
    UnreleasedPageView, UnreleasedSourceView, UsageReportView, UsageView,
};
use crate::error::{ErrorBody, ErrorDetail};
use crate::routes::events::{TaskDeltaEvent, TaskRestartEvent, ToolCallDelta};
use crate::routes::webhooks::{
    DeliveryListView, DeliveryStateName, DeliveryView, WebhookBody, WebhookEventName,
    WebhookListView, WebhookPatchBody, WebhookView,
};
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::HttpMethod;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tollgate",
        description = "Durable, budgeted AI tasks: admission, exactly-once effects, caching, workers, deletion.",
        version = env!("CARGO_PKG_VERSION")
    ),
    paths(
        crate::routes::tasks::submit,
        crate::routes::tasks::submit_batch,
        crate::routes::tasks::list_tasks,
        crate::routes::tasks::get_task,
        crate::routes::tasks::cancel_task,
        crate::routes::events::task_events,
        crate::routes::tasks::release,
        crate::routes::scopes::unreleased_sources,
        crate::routes::scopes::delete_owner_data,
        crate::routes::runs::create_run,
        crate::routes::runs::get_run,
        crate::routes::runs::cancel_run,
        crate::routes::pipelines::register_pipeline,
        crate::routes::pipelines::get_pipeline,
        crate::routes::pipelines::start_pipeline_run,
        crate::routes::meta::kinds,
        crate::routes::meta::models,
        crate::routes::runs::list_runs,
        crate::routes::pipelines::list_pipelines,
        crate::routes::scopes::list_scopes,
        crate::routes::scopes::get_scope,
        crate::routes::stats::stats,
        crate::routes::stats::scope_usage,
        crate::routes::stats::app_usage,
        crate::routes::webhooks::create_webhook,
        crate::routes::webhooks::list_webhooks,
        crate::routes::webhooks::get_webhook,
        crate::routes::webhooks::update_webhook,
        crate::routes::webhooks::delete_webhook,
        crate::routes::webhooks::list_deliveries,
        crate::routes::webhooks::replay_delivery,
    ),
    components(schemas(
        SubmitBody, SourceBody, BatchBody, BatchItem, BatchAnswer, TaskView, SourceView,
        TaskErrorView, UsageView, ReleaseBody, ReleaseAnswer, UnreleasedSourceView,
        UnreleasedPageView, DeletedAnswer, RunBody, RunView, KindView, KindsAnswer, ModelView,
        ModelsAnswer, PipelineBody, PipelineView, PipelineRunBody, StepView,
        PipelineProgressView, ErrorBody, ErrorDetail, KindName, TaskStatusName, RunStateName,
        StepStatusName, HashableJson, HashableObject, Identifier, DefinitionOutline, SubjectView, AttemptView,
        TaskPageView, TasksAnswer, RunSummaryView, RunPipelineRef, RunPageView,
        PipelineVersionView, PipelineSummaryView, PipelinePageView, PolicyView, ScopeView,
        CostView, ScopePageView, FailureCount, LatencyView, StatsView, UsageReportView,
        MinuteCountView, PricesView, WebhookBody, WebhookPatchBody, WebhookView,
        WebhookListView, DeliveryView, DeliveryListView, WebhookEventName, DeliveryStateName, RouteView, DeploymentView,
        TaskDeltaEvent, ToolCallDelta, TaskRestartEvent
    )),
    modifiers(&ApiKeyAuth, &ErrorAnswers)
)]
struct ApiDoc;

struct ApiKeyAuth;

impl Modify for ApiKeyAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("Authorization: Bearer <api key>"))
                    .build(),
            ),
        );
    }
}

/// What every authenticated route can answer besides its own answers: a malformed query
/// or header (400), no or an unknown key (401), a subject the key may not assert (403),
/// a server fault (500).
const EVERY_ROUTE: &[u16] = &[400, 401, 403, 500];
/// The error answers each operation can give beyond [`EVERY_ROUTE`] (404 and 409 are
/// declared on the handlers, with what they mean there). A route reading a JSON body adds
/// 408 (it did not arrive in time), 413 (over its limit), 415 (not JSON) and 422
/// (invalid); 503: the database is unreachable; 429: admission refused (`Retry-After` on
/// a rate limit).
const ROUTE_ERRORS: &[(&str, HttpMethod, &[u16])] = &[
    (
        "/v1/tasks",
        HttpMethod::Post,
        &[408, 413, 415, 422, 429, 503],
    ),
    ("/v1/tasks", HttpMethod::Get, &[503]),
    (
        "/v1/tasks/batch",
        HttpMethod::Post,
        &[408, 413, 415, 422, 503],
    ),
    (
        "/v1/tasks/release",
        HttpMethod::Post,
        &[408, 413, 415, 422, 503],
    ),
    ("/v1/tasks/{id}", HttpMethod::Get, &[503]),
    ("/v1/tasks/{id}/cancel", HttpMethod::Post, &[409, 503]),
    // 429: all of the app's waiter slots are taken (`WORKFLOW_AI_TOO_MANY_WAITERS`).
    ("/v1/tasks/{id}/events", HttpMethod::Get, &[429, 503]),
    (
        "/v1/scopes/{scope}/unreleased-sources",
        HttpMethod::Get,
        &[422, 503],
    ),
    ("/v1/scopes/{scope}/tasks", HttpMethod::Delete, &[422, 503]),
    ("/v1/runs", HttpMethod::Post, &[408, 413, 415, 422, 503]),
    ("/v1/runs/{id}", HttpMethod::Get, &[503]),
    ("/v1/runs/{id}/cancel", HttpMethod::Post, &[409, 503]),
    (
        "/v1/pipelines",
        HttpMethod::Post,
        &[408, 413, 415, 422, 503],
    ),
    ("/v1/pipelines/{name}", HttpMethod::Get, &[422, 503]),
    (
        "/v1/pipelines/{name}/runs",
        HttpMethod::Post,
        &[408, 413, 415, 422, 429, 503],
    ),
    ("/v1/runs", HttpMethod::Get, &[503]),
    ("/v1/pipelines", HttpMethod::Get, &[503]),
    ("/v1/scopes", HttpMethod::Get, &[503]),
    ("/v1/scopes/{scope}", HttpMethod::Get, &[422, 503]),
    ("/v1/stats", HttpMethod::Get, &[503]),
    ("/v1/scopes/{scope}/usage", HttpMethod::Get, &[422, 503]),
    ("/v1/usage", HttpMethod::Get, &[503]),
    ("/v1/kinds", HttpMethod::Get, &[]),
    ("/v1/webhooks", HttpMethod::Post, &[408, 413, 415, 422, 503]),
    ("/v1/webhooks", HttpMethod::Get, &[503]),
    ("/v1/webhooks/{id}", HttpMethod::Get, &[503]),
    (
        "/v1/webhooks/{id}",
        HttpMethod::Patch,
        &[408, 413, 415, 422, 503],
    ),
    ("/v1/webhooks/{id}", HttpMethod::Delete, &[503]),
    ("/v1/webhooks/{id}/deliveries", HttpMethod::Get, &[422, 503]),
    (
        "/v1/webhooks/{id}/deliveries/{delivery}/replay",
        HttpMethod::Post,
        &[503],
    ),
    ("/v1/models", HttpMethod::Get, &[]),
];

fn error_description(status: u16) -> &'static str {
    match status {
        400 => "malformed: not JSON or not the body's shape, a bad query parameter or header",
        401 => "no API key, or an unknown one",
        403 => "the key may not assert the X-Tollgate-Subject it sent",
        404 => "not found, or not the caller's",
        408 => "the request body did not arrive within the server's body_read_timeout",
        409 => "conflicts with the current state",
        413 => "the body is over the size limit",
        415 => "the body is not JSON (Content-Type)",
        422 => "well-formed but invalid: the message names the field and the reason",
        429 => "refused by admission: the code says which limit; Retry-After on a rate limit",
        500 => "a server fault (the message carries no internal detail)",
        503 => "the database is unavailable; retry",
        _ => "error",
    }
}

/// Declares on every operation the error answers it can give, each with the error
/// envelope; 429 with its `Retry-After` header.
struct ErrorAnswers;

impl Modify for ErrorAnswers {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (path, method, extra) in ROUTE_ERRORS {
            let Some(item) = openapi.paths.paths.get_mut(*path) else {
                panic!("ROUTE_ERRORS names {path}, which is not documented");
            };
            let operation = match method {
                HttpMethod::Get => item.get.as_mut(),
                HttpMethod::Post => item.post.as_mut(),
                HttpMethod::Delete => item.delete.as_mut(),
                HttpMethod::Patch => item.patch.as_mut(),
                _ => None,
            };
            let Some(operation) = operation else {
                panic!("ROUTE_ERRORS names a method of {path} that is not documented");
            };
            for status in EVERY_ROUTE.iter().chain(extra.iter()) {
                let key = status.to_string();
                if operation.responses.responses.contains_key(&key) {
                    continue;
                }
                let mut response = ResponseBuilder::new()
                    .description(error_description(*status))
                    .content(
                        "application/json",
                        ContentBuilder::new()
                            .schema(Some(Ref::from_schema_name("ErrorBody")))
                            .build(),
                    );
                if *status == 429 {
                    response = response.header(
                        "Retry-After",
                        HeaderBuilder::new()
                            .schema(
                                utoipa::openapi::ObjectBuilder::new()
                                    .schema_type(utoipa::openapi::schema::Type::Integer)
                                    .minimum(Some(1)),
                            )
                            .description(Some(
                                "seconds until admission may succeed again, where known (the task rate limit, docs/conformance.md#cost-limits's token rate limit and spend budgets)",
                            ))
                            .build(),
                    );
                }
                operation
                    .responses
                    .responses
                    .insert(key, RefOr::T(response.build()));
            }
        }
        for (path, item) in &openapi.paths.paths {
            for (method, operation) in [
                ("get", &item.get),
                ("post", &item.post),
                ("delete", &item.delete),
                ("patch", &item.patch),
            ] {
                if let Some(op) = operation {
                    assert!(
                        op.responses.responses.contains_key("401"),
                        "{method} {path} is missing from ROUTE_ERRORS"
                    );
                }
            }
        }
    }
}

/// Replaces the identifier pattern [`Identifier`] (and a listing's name cursor) writes
/// (utoipa takes only string literals in annotations) by the whole rule, generated from
/// core's own tables ([`tollgate_core::identifier_pattern`]), so what the document
/// declares and what the server checks are one rule.
fn state_identifier_rule(node: &mut serde_json::Value, rule: &str) {
    match node {
        serde_json::Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                if key == "pattern" && value.as_str() == Some(ID_PATTERN_IN_ANNOTATIONS) {
                    *value = serde_json::Value::String(rule.to_owned());
                } else if key == "pattern"
                    && let Some(prefix) = value
                        .as_str()
                        .and_then(|v| v.strip_suffix(&ID_PATTERN_IN_ANNOTATIONS[1..]))
                        .filter(|p| p.starts_with('^') && p.ends_with(r"1\."))
                {
                    // A name cursor of a listing (`s1.<scope>`, `p1.<pipeline>`).
                    *value = serde_json::Value::String(format!("{prefix}{}", &rule[1..]));
                } else {
                    state_identifier_rule(value, rule);
                }
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                state_identifier_rule(item, rule);
            }
        }
        _ => {}
    }
}

/// The OpenAPI document as pretty JSON.
pub fn openapi_json() -> String {
    let render = || -> Result<String, serde_json::Error> {
        let mut doc = serde_json::to_value(ApiDoc::openapi())?;
        state_identifier_rule(&mut doc, &tollgate_core::identifier_pattern());
        serde_json::to_string_pretty(&doc)
    };
    render()
        .unwrap_or_else(|e| format!("{{\"error\": \"cannot render the OpenAPI document: {e}\"}}"))
}
