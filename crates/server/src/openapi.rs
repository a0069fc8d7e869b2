//! The OpenAPI document, generated from the handlers and shapes (utoipa).

use crate::dto::*;
use crate::error::{ErrorBody, ErrorDetail};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tollgate",
        description = "Durable, budgeted AI tasks: admission, exactly-once effects, caching, workers, deletion.",
        version = env!("CARGO_PKG_VERSION")
    ),
    paths(
        crate::routes::submit,
        crate::routes::submit_batch,
        crate::routes::get_by_effect_key,
        crate::routes::get_task,
        crate::routes::cancel_task,
        crate::routes::release,
        crate::routes::unreleased_sources,
        crate::routes::delete_owner_data,
        crate::routes::create_run,
        crate::routes::get_run,
        crate::routes::cancel_run,
        crate::routes::register_pipeline,
        crate::routes::get_pipeline,
        crate::routes::start_pipeline_run,
        crate::routes::kinds,
        crate::routes::models,
    ),
    components(schemas(
        SubmitBody, SourceBody, BatchBody, BatchItem, BatchAnswer, TaskView, SourceView,
        TaskErrorView, UsageView, ReleaseBody, ReleaseAnswer, UnreleasedSourceView,
        UnreleasedPageView, DeletedAnswer, RunBody, RunView, KindView, KindsAnswer, ModelView,
        ModelsAnswer, PipelineBody, PipelineView, PipelineRunBody, StepView,
        PipelineProgressView, SubjectView, ErrorBody, ErrorDetail
    )),
    modifiers(&ApiKeyAuth)
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

/// The OpenAPI document as pretty JSON.
pub fn openapi_json() -> String {
    ApiDoc::openapi()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"cannot render the OpenAPI document: {e}\"}}"))
}
