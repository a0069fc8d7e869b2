//! The JSON shapes of the HTTP API (docs/conformance.md#http-shapes), with their OpenAPI schemas: here the
//! ones several resources share (the task object, JSON values, names of kinds and
//! states); each resource's own bodies and answers live beside its routes and are
//! re-exported here.

pub use crate::routes::meta::{
    DeploymentView, KindView, KindsAnswer, ModelView, ModelsAnswer, PricesView, RouteView,
};
pub use crate::routes::pipelines::{
    DefinitionOutline, PipelineBody, PipelinePageView, PipelineProgressView, PipelineRunBody,
    PipelineSummaryView, PipelineVersionView, PipelineView, StepStatusName, StepView,
};
pub use crate::routes::runs::{RunBody, RunPageView, RunPipelineRef, RunSummaryView, RunView};
pub use crate::routes::scopes::{
    CostView, DeletedAnswer, PolicyView, ScopePageView, ScopeView, UnreleasedPageView,
    UnreleasedSourceView,
};
pub use crate::routes::stats::{
    FailureCount, LatencyView, MinuteCountView, StatsView, UsageReportView,
};
pub use crate::routes::tasks::{
    BatchAnswer, BatchBody, BatchItem, ReleaseAnswer, ReleaseBody, SourceBody, SubmitBody,
    TaskPageView, TasksAnswer,
};

use serde::Serialize;
use serde_json::Value;
use tollgate_core::{Attempt, Subject, Task, TaskError, TaskOwner, Usage};
use utoipa::ToSchema;

/// Any JSON value the service stores and hashes: numbers within ±(2^53 − 1), nested at
/// most 64 levels deep (the depth is not expressible in the schema). Schema only.
#[derive(Debug)]
pub struct HashableJson;

/// The largest integer a double holds exactly, 2^53 − 1.
const MAX_SAFE: f64 = 9_007_199_254_740_991.0;

impl utoipa::PartialSchema for HashableJson {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{
            AdditionalProperties, AnyOfBuilder, ArrayBuilder, ObjectBuilder, SchemaType, Type,
        };
        let this = || utoipa::openapi::Ref::from_schema_name("HashableJson");
        AnyOfBuilder::new()
            .item(ObjectBuilder::new().schema_type(SchemaType::from_iter([
                Type::Null,
                Type::Boolean,
                Type::String,
            ])))
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Number)
                    .minimum(Some(-MAX_SAFE))
                    .maximum(Some(MAX_SAFE)),
            )
            .item(ArrayBuilder::new().items(this()))
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Object)
                    .additional_properties(Some(AdditionalProperties::RefOr(this().into()))),
            )
            .description(Some(
                "Any JSON value with numbers within ±(2^53 − 1), nested at most 64 levels deep.",
            ))
            .into()
    }
}

impl ToSchema for HashableJson {}

/// An identifier (scope, source id and revision, step, effect key, model, budget,
/// pipeline version): 1 to 256 characters, no control or invisible formatting
/// character, no white space first or last. Schema only: every identifier of the
/// document is a `$ref` to this one schema, whose `pattern` the document states from
/// core's own rule ([`tollgate_core::identifier_pattern`]).
#[derive(Debug)]
pub struct Identifier;

/// The `pattern` written where an identifier is declared; the document replaces it by
/// the whole rule (see `openapi.rs`).
pub(crate) const ID_PATTERN_IN_ANNOTATIONS: &str = r"^[^\x00-\x1F\x7F-\x9F]+$";

impl utoipa::PartialSchema for Identifier {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(tollgate_core::MAX_ID_CHARS))
            .pattern(Some(ID_PATTERN_IN_ANNOTATIONS))
            .description(Some(
                "An identifier: 1 to 256 characters, no control or invisible formatting character, no white space first or last.",
            ))
            .into()
    }
}

impl ToSchema for Identifier {}

/// A JSON object of [`HashableJson`] values. Schema only.
#[derive(Debug)]
pub struct HashableObject;

impl utoipa::PartialSchema for HashableObject {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .additional_properties(Some(AdditionalProperties::RefOr(
                utoipa::openapi::Ref::from_schema_name("HashableJson").into(),
            )))
            .description(Some(
                "A JSON object; numbers within ±(2^53 − 1), nested at most 64 levels deep.",
            ))
            .into()
    }
}

impl ToSchema for HashableObject {}

/// A task kind.
#[derive(Debug, ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum KindName {
    /// `generate_text`.
    GenerateText,
    /// `classify`.
    Classify,
    /// `classify_many`.
    ClassifyMany,
    /// `extract_data`.
    ExtractData,
    /// `chat`.
    Chat,
    /// `embed`.
    Embed,
}

/// A task's status.
#[derive(Debug, ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum TaskStatusName {
    /// Waiting for a worker.
    Queued,
    /// Being executed.
    Running,
    /// Done, with an output.
    Succeeded,
    /// Done, with an error.
    Failed,
    /// Canceled.
    Canceled,
}

/// A run's state.
#[derive(Debug, ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum RunStateName {
    /// Going.
    Running,
    /// A step waits on a task.
    Waiting,
    /// Done, with an output.
    Succeeded,
    /// Done, with an error.
    Failed,
    /// Canceled.
    Canceled,
}

/// The source of a task, as shown.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SourceView {
    /// Source id.
    pub id: String,
    /// Source revision.
    pub revision: String,
}

/// The subject a task or run is done for, as shown.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SubjectView {
    /// `user` or `service`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The subject's id.
    pub id: String,
}

impl SubjectView {
    pub(crate) fn of(subject: Option<&Subject>) -> Option<SubjectView> {
        subject.map(|s| SubjectView {
            kind: s.kind.as_str().to_string(),
            id: s.id.clone(),
        })
    }
}

/// A task error, as shown.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskErrorView {
    /// Stable code.
    pub code: String,
    /// Message (at most 2,000 characters).
    pub message: String,
}

impl From<&TaskError> for TaskErrorView {
    fn from(e: &TaskError) -> Self {
        TaskErrorView {
            code: e.code.as_str().to_string(),
            message: e.message.clone(),
        }
    }
}

/// Usage, as shown.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UsageView {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Cost in US dollars, where known.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub cost_usd: Option<f64>,
    /// Of `input_tokens`, those the provider served from its prompt cache, where it says.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub cached_input_tokens: Option<u64>,
    /// Of `input_tokens`, those the provider wrote to its prompt cache (Anthropic's cache
    /// creation), where it says; priced at the cache-write price (docs/providers.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub cache_write_input_tokens: Option<u64>,
    /// docs/conformance.md#cost-prices: whether the model has prices (`false`: `cost_usd` is unknown, not 0).
    pub priced: bool,
    /// `true` when the provider reported no usage for an attempt, which is then counted
    /// at its bound (docs/budgets.md, "Settlement"); absent otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    #[schema(nullable = false)]
    pub estimated: bool,
}

impl From<&Usage> for UsageView {
    fn from(u: &Usage) -> Self {
        UsageView {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cost_usd: u.cost_usd.map(|c| (c * 1e9).round() / 1e9),
            cached_input_tokens: u.cached_input_tokens,
            cache_write_input_tokens: u.cache_write_input_tokens,
            priced: u.cost_usd.is_some(),
            estimated: u.estimated,
        }
    }
}

/// The task object (docs/conformance.md#http-shapes).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskView {
    /// Task id.
    pub id: String,
    /// The effect key.
    pub effect_key: String,
    /// The kind.
    #[schema(value_type = KindName)]
    pub kind: String,
    /// The step name.
    pub step: String,
    /// `queued`, `running`, `succeeded`, `failed` or `canceled`.
    #[schema(value_type = TaskStatusName)]
    pub status: String,
    /// The scope (the run's scope for run-owned tasks).
    pub scope: String,
    /// The owning run, if any.
    #[schema(required = true)]
    pub run_id: Option<String>,
    /// The source, for scoped tasks.
    #[schema(required = true)]
    pub source: Option<SourceView>,
    /// The subject the task is done for (`null`: none). A key bound to a subject sees only
    /// that subject's tasks.
    pub subject: Option<SubjectView>,
    /// The model id asked for.
    pub model: String,
    /// Whether this call created the task (false when the effect key named an existing
    /// one; reads say false).
    pub created: bool,
    /// Served from the cache.
    pub cached: bool,
    /// When served from the cache: the id of the task whose result it copied (`null`
    /// otherwise).
    #[schema(required = true)]
    pub cached_from: Option<String>,
    /// The kind's output, once succeeded (its shape is the kind's output schema, see
    /// `GET /v1/kinds`).
    #[schema(value_type = Option<Value>, required = true)]
    pub output: Option<Value>,
    /// Usage, once succeeded.
    #[schema(required = true)]
    pub usage: Option<UsageView>,
    /// `{code, message}` once failed or canceled.
    #[schema(required = true)]
    pub error: Option<TaskErrorView>,
    /// Creation time (RFC 3339, UTC).
    pub created_at: String,
    /// Completion time, once terminal.
    #[schema(required = true)]
    pub completed_at: Option<String>,
    /// When a worker claimed it (docs/conformance.md#listings).
    #[schema(required = true)]
    pub claimed_at: Option<String>,
    /// Its last heartbeat while running.
    #[schema(required = true)]
    pub heartbeat_at: Option<String>,
    /// The worker that ran it.
    #[schema(required = true)]
    pub worker: Option<String>,
    /// docs/conformance.md#priority: its priority within its scope (0–9, higher starts first).
    #[schema(minimum = 0, maximum = 9)]
    pub priority: u8,
    /// The id of the trace that follows the task (docs/telemetry.md): 32 hexadecimal
    /// digits, the caller's own trace when it sent a `traceparent`; `null` when the task
    /// was submitted with traces off.
    #[schema(required = true)]
    pub trace_id: Option<String>,
    /// Its attempts (docs/routes.md, "Attempts"), in order: present on reads of one task
    /// (`GET /v1/tasks/{id}`, `GET /v1/tasks?effect_key=`), absent in pages and answers
    /// to submissions. None until its first provider call begins.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub attempts: Option<Vec<AttemptView>>,
    /// The stored request (its fields plus `kind`): present on reads of one task
    /// (`GET /v1/tasks/{id}`, `GET /v1/tasks?effect_key=`), absent in pages and answers
    /// to submissions.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>, nullable = false)]
    pub request: Option<Value>,
}

/// One attempt of a task (docs/routes.md, "Attempts"): one deployment's provider call
/// with its re-asks.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AttemptView {
    /// 1 for the first attempt.
    pub n: u32,
    /// The deployment it went to (`provider/model`).
    pub deployment: String,
    /// When it started (RFC 3339, UTC).
    pub started_at: String,
    /// When it ended (`null` while running).
    #[schema(required = true)]
    pub ended_at: Option<String>,
    /// How it ended: `running`, `succeeded`, `unavailable` (a transient provider
    /// failure), `failed`, `interrupted` (its worker crashed, lost its lease or shut
    /// down), `canceled` or `refused` (its reservation did not fit the budget).
    pub outcome: String,
    /// What its calls used, when the provider reported it (`null`: unknown, charged its
    /// reservation).
    #[schema(required = true)]
    pub usage: Option<UsageView>,
    /// What it is charged in US dollars: its usage priced, or its reservation when its
    /// usage is unknown (while running: its reservation). `null` when the model has no
    /// prices.
    #[schema(required = true)]
    pub cost_usd: Option<f64>,
    /// Its error, when it did not succeed.
    #[schema(required = true)]
    pub error: Option<TaskErrorView>,
}

impl AttemptView {
    /// The view of one attempt of `task`.
    pub fn of(task: &Task, a: &Attempt) -> AttemptView {
        let priced = task.reservation.is_some_and(|r| r.prices.is_some())
            || task.usage.is_some_and(|u| u.cost_usd.is_some());
        let cost = priced.then(|| tollgate_core::cost::nano_to_usd(a.charged.nano_usd));
        AttemptView {
            n: a.n,
            deployment: a.deployment.clone(),
            started_at: a.started_at.to_rfc3339(),
            ended_at: a.ended_at.map(|t| t.to_rfc3339()),
            outcome: a.outcome.as_str().to_string(),
            usage: a.usage.as_ref().map(|u| {
                let mut view = UsageView::from(u);
                view.cost_usd = cost;
                view.priced = priced;
                view
            }),
            cost_usd: cost,
            error: a.error.as_ref().map(TaskErrorView::from),
        }
    }
}

impl TaskView {
    /// The view of one task read on its own: with its request and its attempts.
    pub fn detail(task: &Task, attempts: &[Attempt]) -> TaskView {
        let mut view = TaskView::of(task, false);
        view.request = Some(task.request.clone());
        view.attempts = Some(attempts.iter().map(|a| AttemptView::of(task, a)).collect());
        view
    }

    /// The view of a task; `created` says whether this call created it.
    pub fn of(task: &Task, created: bool) -> TaskView {
        TaskView {
            id: task.id.to_string(),
            effect_key: task.effect_key.to_string(),
            kind: task.kind.as_str().to_string(),
            step: task.step.to_string(),
            status: task.status.as_str().to_string(),
            scope: task.scope.to_string(),
            run_id: match task.owner {
                TaskOwner::Run { run_id } => Some(run_id.to_string()),
                TaskOwner::Application => None,
            },
            source: task.source.as_ref().map(|s| SourceView {
                id: s.id.to_string(),
                revision: s.revision.to_string(),
            }),
            subject: SubjectView::of(task.subject.as_ref()),
            model: task.model.to_string(),
            created,
            cached: task.cached(),
            cached_from: task.cached_from.map(|id| id.to_string()),
            output: task.output.clone(),
            usage: task.usage.as_ref().map(UsageView::from),
            error: task.error.as_ref().map(TaskErrorView::from),
            created_at: task.created_at.to_rfc3339(),
            completed_at: task.completed_at.map(|t| t.to_rfc3339()),
            claimed_at: task.claimed_at.map(|t| t.to_rfc3339()),
            heartbeat_at: task.heartbeat_at.map(|t| t.to_rfc3339()),
            worker: task.worker.as_ref().map(ToString::to_string),
            priority: task.priority.get(),
            trace_id: task.trace_parent.map(|t| t.trace_id_hex()),
            attempts: None,
            request: None,
        }
    }
}
