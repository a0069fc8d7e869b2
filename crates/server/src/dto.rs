//! The JSON shapes of the HTTP API (SPEC §11), with their OpenAPI schemas.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tollgate_core::{Run, Subject, Task, TaskError, TaskOwner, Usage};
use tollgate_engine::{PipelineProgress, PipelineStep};
use tollgate_store::StoredPipeline;
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

/// A pipeline definition's outline (the full rules are in docs/pipelines.md). Schema
/// only.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct DefinitionOutline {
    /// What the pipeline is for.
    #[serde(default)]
    description: Option<String>,
    /// The steps, each `{key, kind, request, model?, source?, budget?, depends_on?,
    /// retries?}`.
    #[schema(value_type = Vec<Object>, min_items = 1)]
    steps: Vec<Value>,
    /// The run's output: name → JSON Pointer (`/steps/<key>/output…` or `/input…`).
    output: std::collections::BTreeMap<String, String>,
}

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

/// A pipeline step's status.
#[derive(Debug, ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum StepStatusName {
    /// Waiting for its dependencies, admission or a retry.
    Pending,
    /// Its task is queued.
    Queued,
    /// Its task runs.
    Running,
    /// Done, with an output.
    Succeeded,
    /// Done, with an error.
    Failed,
    /// Canceled.
    Canceled,
}

/// `POST /v1/tasks` body.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitBody {
    /// `generate_text`, `classify`, `classify_many` or `extract_data`.
    #[schema(value_type = KindName)]
    pub kind: String,
    /// Model id (one of `GET /v1/models`); defaults to the configured default model.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub model: Option<String>,
    /// The caller's name for the step; defaults to the kind.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub step: Option<String>,
    /// The kind's request object (its schema per kind: `GET /v1/kinds`).
    #[schema(value_type = HashableObject)]
    pub request: Value,
    /// Application owner's scope. Exactly one of `scope` and `run_id`.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub scope: Option<String>,
    /// Owning workflow run. Exactly one of `scope` and `run_id`.
    #[serde(default)]
    #[schema(
        pattern = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub run_id: Option<String>,
    /// Makes the task scoped: cache and admission apply.
    #[serde(default)]
    pub source: Option<SourceBody>,
    /// Budget policy name; defaults to the app's default policy.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub budget: Option<String>,
    /// The effect key, when not sent as the `Idempotency-Key` header.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub effect_key: Option<String>,
    /// SPEC §14: priority within its scope, 0 (lowest) to 9 (highest); default 5. Each
    /// level counts as one ageing step (default 60 s) of waiting, so low priority is
    /// never starved. Not compared on a replay of the effect key.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 9)]
    pub priority: Option<i64>,
}

/// The source a scoped task is about.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SourceBody {
    /// Source id.
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub id: String,
    /// Source revision.
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub revision: String,
    /// Skip the cache and count as a new step.
    #[serde(default)]
    pub recompute: bool,
}

/// `POST /v1/tasks/batch` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchBody {
    /// Up to 1,000 submissions, each with its own `effect_key`. Each item is answered
    /// in place: one that is not a valid submission gets its error in its result.
    #[schema(value_type = Vec<Value>, max_items = 1000)]
    pub tasks: Vec<Value>,
}

/// One item of a batch answer: the task, or the error it got.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchItem {
    /// HTTP status this item would have had on its own.
    #[schema(minimum = 200, maximum = 599)]
    pub status: u16,
    /// The task, when submitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub task: Option<TaskView>,
    /// The error, when refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub error: Option<crate::error::ErrorDetail>,
}

/// `POST /v1/tasks/batch` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchAnswer {
    /// One item per submission, in order.
    pub results: Vec<BatchItem>,
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
    /// SPEC §13: whether the model has prices (`false`: `cost_usd` is unknown, not 0).
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
            priced: u.cost_usd.is_some(),
            estimated: u.estimated,
        }
    }
}

/// The task object (SPEC §11).
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
    /// When a worker claimed it (SPEC §15).
    #[schema(required = true)]
    pub claimed_at: Option<String>,
    /// Its last heartbeat while running.
    #[schema(required = true)]
    pub heartbeat_at: Option<String>,
    /// The worker that ran it.
    #[schema(required = true)]
    pub worker: Option<String>,
    /// SPEC §14: its priority within its scope (0–9, higher starts first).
    #[schema(minimum = 0, maximum = 9)]
    pub priority: u8,
    /// Its attempts (a task runs at most once: none until claimed, then one), each with
    /// its worker, times and usage.
    pub attempts: Vec<AttemptView>,
    /// The stored request (its fields plus `kind`): present on reads of one task
    /// (`GET /v1/tasks/{id}`, `GET /v1/tasks?effect_key=`), absent in pages and answers
    /// to submissions.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>, nullable = false)]
    pub request: Option<Value>,
}

/// One attempt of a task (SPEC §15).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AttemptView {
    /// 1 for the first attempt.
    pub attempt: u32,
    /// The worker that claimed it.
    #[schema(required = true)]
    pub worker: Option<String>,
    /// When it was claimed.
    #[schema(required = true)]
    pub claimed_at: Option<String>,
    /// Its last heartbeat.
    #[schema(required = true)]
    pub heartbeat_at: Option<String>,
    /// When it ended.
    #[schema(required = true)]
    pub finished_at: Option<String>,
    /// Its usage, once succeeded.
    #[schema(required = true)]
    pub usage: Option<UsageView>,
    /// Its error, once failed or canceled.
    #[schema(required = true)]
    pub error: Option<TaskErrorView>,
}

impl TaskView {
    /// The view of one task read on its own: with its request.
    pub fn detail(task: &Task) -> TaskView {
        let mut view = TaskView::of(task, false);
        view.request = Some(task.request.clone());
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
            attempts: (1..=task.attempt)
                .map(|attempt| AttemptView {
                    attempt,
                    worker: task.worker.as_ref().map(ToString::to_string),
                    claimed_at: task.claimed_at.map(|t| t.to_rfc3339()),
                    heartbeat_at: task.heartbeat_at.map(|t| t.to_rfc3339()),
                    finished_at: task.completed_at.map(|t| t.to_rfc3339()),
                    usage: task.usage.as_ref().map(UsageView::from),
                    error: task.error.as_ref().map(TaskErrorView::from),
                })
                .collect(),
            request: None,
        }
    }
}

/// `POST /v1/tasks/release` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// The task's effect key.
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub effect_key: String,
    /// The task's scope.
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub scope: String,
}

/// `POST /v1/tasks/release` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReleaseAnswer {
    /// Always true: an unmatched release answers 404.
    pub released: bool,
}

/// A (scope, source) pair with unreleased application tasks.
#[derive(Debug, Serialize, ToSchema)]
pub struct UnreleasedSourceView {
    /// Scope.
    pub scope: String,
    /// Source id.
    pub source: String,
}

/// `GET /v1/scopes/{scope}/unreleased-sources` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct UnreleasedPageView {
    /// Up to 100 sources, in order.
    pub sources: Vec<UnreleasedSourceView>,
    /// Pass as `after` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub next: Option<String>,
}

/// `DELETE /v1/scopes/{scope}/tasks` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeletedAnswer {
    /// How many application-owned tasks were deleted.
    pub deleted: u64,
}

/// `POST /v1/runs` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunBody {
    /// The scope the run's tasks are admitted and cached in.
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub scope: String,
    /// The run's input: a JSON object (default `{}`).
    #[serde(default)]
    #[schema(value_type = HashableObject)]
    pub input: serde_json::Map<String, Value>,
}

/// A workflow run (SPEC §7).
#[derive(Debug, Serialize, ToSchema)]
pub struct RunView {
    /// Run id.
    pub id: String,
    /// Scope.
    pub scope: String,
    /// `running`, `waiting`, `succeeded`, `failed` or `canceled`.
    #[schema(value_type = RunStateName)]
    pub state: String,
    /// The subject the run's tasks are done for (`null`: none).
    pub subject: Option<SubjectView>,
    /// Whether cancellation was requested.
    pub cancel_requested: bool,
    /// The run's input (a JSON object).
    #[schema(value_type = HashableObject)]
    pub input: Value,
    /// The output, once succeeded.
    #[schema(value_type = Option<Value>, required = true)]
    pub output: Option<Value>,
    /// The error, once failed or canceled.
    #[schema(required = true)]
    pub error: Option<TaskErrorView>,
    /// The task a waiting step waits on.
    #[schema(required = true)]
    pub waiting_on: Option<String>,
    /// Creation time.
    pub created_at: String,
    /// Last change.
    pub updated_at: String,
    /// For a run of a pipeline: its version and where each step stands (absent for
    /// other runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub pipeline: Option<PipelineProgressView>,
}

impl RunView {
    /// The view of a run with its pipeline progress, if it is a pipeline run.
    pub fn with_pipeline(run: &Run, pipeline: Option<&PipelineProgress>) -> RunView {
        let mut view = RunView::from(run);
        view.pipeline = pipeline.map(PipelineProgressView::from);
        view
    }
}

impl From<&Run> for RunView {
    fn from(r: &Run) -> Self {
        RunView {
            id: r.id.to_string(),
            scope: r.scope.to_string(),
            state: r.state.as_str().to_string(),
            subject: SubjectView::of(r.subject.as_ref()),
            cancel_requested: r.cancel_requested,
            input: r.input.clone(),
            output: r.output.clone(),
            error: r.error.as_ref().map(TaskErrorView::from),
            waiting_on: r.waiting_on.as_ref().map(|d| d.key.to_string()),
            created_at: r.created_at.to_rfc3339(),
            updated_at: r.updated_at.to_rfc3339(),
            pipeline: None,
        }
    }
}

/// `POST /v1/pipelines` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineBody {
    /// The pipeline's name (letters, digits, `_`, `-`, `.`; not starting with `.`; at
    /// most 128 bytes): new versions are registered under the same name.
    #[schema(pattern = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$")]
    pub name: String,
    /// The definition: `{"description"?, "steps": [...], "output": {...}}` (see
    /// docs/pipelines.md).
    #[schema(value_type = DefinitionOutline)]
    pub definition: Value,
}

/// A registered pipeline version.
#[derive(Debug, Serialize, ToSchema)]
pub struct PipelineView {
    /// The pipeline's name.
    pub name: String,
    /// The version: SHA-256 of the canonical definition (the same definition always has
    /// the same version).
    pub version: String,
    /// Whether this call registered the version (false: the app had it already; reads
    /// say false).
    pub created: bool,
    /// The definition as stored (normalized).
    #[schema(value_type = Object)]
    pub definition: Value,
    /// When this version was first registered.
    pub created_at: String,
}

impl PipelineView {
    /// The view of a stored version; `created` says whether this call registered it.
    pub fn of(p: &StoredPipeline, created: bool) -> PipelineView {
        PipelineView {
            name: p.name.to_string(),
            version: p.version.clone(),
            created,
            definition: p.definition.clone(),
            created_at: p.created_at.to_rfc3339(),
        }
    }
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// A JSON object (anything else is refused as not the body's shape).
fn object<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
    serde_json::Map::<String, Value>::deserialize(d).map(Value::Object)
}

/// `POST /v1/pipelines/{name}/runs` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineRunBody {
    /// The scope the run's tasks are admitted and cached in.
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub scope: String,
    /// The run's input: what the steps' `/input…` references read (default `{}`).
    #[serde(default = "empty_object", deserialize_with = "object")]
    #[schema(value_type = HashableObject)]
    pub input: Value,
    /// The version to run (default: the newest).
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub version: Option<String>,
}

/// One step of a pipeline run.
#[derive(Debug, Serialize, ToSchema)]
pub struct StepView {
    /// The step's key.
    pub key: String,
    /// The step's task kind.
    #[schema(value_type = KindName)]
    pub kind: String,
    /// `pending` (waiting for dependencies, admission or a retry), `queued`, `running`,
    /// `succeeded`, `failed` or `canceled`.
    #[schema(value_type = StepStatusName)]
    pub status: String,
    /// Attempts submitted so far.
    pub attempts: u32,
    /// The latest attempt's task.
    #[schema(required = true)]
    pub task_id: Option<String>,
    /// The step's output, once succeeded.
    #[schema(value_type = Option<Value>, required = true)]
    pub output: Option<Value>,
    /// The latest attempt's error, once failed or canceled.
    #[schema(required = true)]
    pub error: Option<TaskErrorView>,
}

impl From<&PipelineStep> for StepView {
    fn from(s: &PipelineStep) -> Self {
        StepView {
            key: s.key.to_string(),
            kind: s.kind.as_str().to_string(),
            status: s.status.as_str().to_string(),
            attempts: s.attempts,
            task_id: s.task_id.map(|t| t.to_string()),
            output: s.output.clone(),
            error: s.error.as_ref().map(TaskErrorView::from),
        }
    }
}

/// The pipeline side of a run.
#[derive(Debug, Serialize, ToSchema)]
pub struct PipelineProgressView {
    /// The pipeline's name.
    pub name: String,
    /// The version the run runs.
    pub version: String,
    /// Every step, each after its dependencies.
    pub steps: Vec<StepView>,
}

impl From<&PipelineProgress> for PipelineProgressView {
    fn from(p: &PipelineProgress) -> Self {
        PipelineProgressView {
            name: p.name.to_string(),
            version: p.version.clone(),
            steps: p.steps.iter().map(StepView::from).collect(),
        }
    }
}

/// One kind's published schemas.
#[derive(Debug, Serialize, ToSchema)]
pub struct KindView {
    /// The kind.
    #[schema(value_type = KindName)]
    pub kind: String,
    /// JSON Schema of its request object.
    #[schema(value_type = Object)]
    pub request_schema: Value,
    /// JSON Schema of its output.
    #[schema(value_type = Object)]
    pub output_schema: Value,
}

/// `GET /v1/kinds` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct KindsAnswer {
    /// The four kinds.
    pub kinds: Vec<KindView>,
}

/// One configured model.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelView {
    /// The id callers use.
    pub id: String,
    /// Provider name.
    pub provider: String,
    /// Provider's model name.
    pub model: String,
    /// Hash of the resolved configuration (changes invalidate cached results).
    pub config_hash: String,
    /// Whether it is the default model.
    pub default: bool,
    /// SPEC §13: its prices (`null`: unpriced, its costs are unknown).
    #[schema(required = true)]
    pub prices: Option<PricesView>,
}

/// A model's prices, US dollars per million tokens.
#[derive(Debug, Serialize, ToSchema)]
pub struct PricesView {
    /// Per million input tokens not served from the provider's prompt cache.
    pub input_usd_per_million: f64,
    /// Per million output tokens.
    pub output_usd_per_million: f64,
    /// Per million input tokens served from the provider's prompt cache.
    pub cached_input_usd_per_million: f64,
}

impl From<&tollgate_core::Prices> for PricesView {
    fn from(p: &tollgate_core::Prices) -> Self {
        // Pico-dollars per token are micro-dollars per million tokens.
        let usd = |pico: u64| pico as f64 / 1e6;
        PricesView {
            input_usd_per_million: usd(p.input),
            output_usd_per_million: usd(p.output),
            cached_input_usd_per_million: usd(p.cached_input),
        }
    }
}

/// `GET /v1/models` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelsAnswer {
    /// Configured models.
    pub models: Vec<ModelView>,
}
