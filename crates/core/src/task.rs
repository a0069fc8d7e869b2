//! Tasks, owners, subjects, scopes and runs: the nouns of docs/conformance.md#concepts, docs/conformance.md#lifecycle, docs/conformance.md#workflow-runs.

use crate::budget::Budget;
use crate::canonical::{canonical_json, check_hashable, sha256_hex};
use crate::error::{ErrorCode, InvalidInput};
use crate::ids::{
    AppId, EffectKey, ModelId, RunId, ScopeId, SourceId, SourceRevision, StepKey, TaskId, WorkerId,
};
use crate::kinds::{TaskKind, TaskRequest};
use crate::model::{ConfigHash, ModelRef};
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

mod lease;
mod run;
mod usage;

pub use lease::Lease;
pub use run::{Dependency, NewRun, Run, RunState};
pub use usage::{MAX_REPORTED_TOKENS, Usage};

/// Default request size limit: 256 KiB of stored (canonical) bytes.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 256 * 1024;

/// Default output size limit: 1 MiB of stored JSON. A request whose smallest valid
/// output is larger is refused at submit; an output over it fails its task.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 1024 * 1024;

/// Longest error message kept on a task, in characters.
pub const MAX_ERROR_MESSAGE_CHARS: usize = 2_000;

/// Whether a subject is a person or a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubjectKind {
    /// A person.
    User,
    /// A machine identity.
    Service,
}

impl SubjectKind {
    /// The stable string form.
    pub fn as_str(self) -> &'static str {
        match self {
            SubjectKind::User => "user",
            SubjectKind::Service => "service",
        }
    }

    /// Parses the stable string form.
    pub fn parse(s: &str) -> Option<SubjectKind> {
        match s {
            "user" => Some(SubjectKind::User),
            "service" => Some(SubjectKind::Service),
            _ => None,
        }
    }
}

/// The authenticated identity a task is done for. It comes from authentication, never
/// from a request body or a model's output.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Subject {
    /// Person or service.
    #[serde(rename = "type")]
    pub kind: SubjectKind,
    /// The identity's id.
    pub id: String,
}

impl Subject {
    /// A subject whose id follows the identifier rule ([`crate::ids::check_identifier`]).
    pub fn new(kind: SubjectKind, id: impl Into<String>) -> Result<Subject, InvalidInput> {
        let id = id.into();
        crate::ids::check_identifier("subject.id", &id)?;
        Ok(Subject { kind, id })
    }

    /// Parses `user:<id>` or `service:<id>`; the id follows the identifier rule.
    pub fn parse(text: &str) -> Result<Subject, InvalidInput> {
        let (kind, id) = text.split_once(':').ok_or_else(|| {
            InvalidInput::field("subject", "must look like user:<id> or service:<id>")
        })?;
        let kind = SubjectKind::parse(kind).ok_or_else(|| {
            InvalidInput::field("subject.type", format!("{kind:?} must be user or service"))
        })?;
        Subject::new(kind, id)
    }
}

/// Who a caller may see inside its app (docs/api.md, "Subjects"): a caller bound to one
/// subject sees only the tasks and runs done for that subject; any other caller (a key
/// without a subject, or one allowed to assert subjects) sees the whole app's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Visibility {
    /// Every task and run of the app.
    App,
    /// Only tasks and runs whose subject is this one.
    Subject(Subject),
}

impl Visibility {
    /// Whether a task or run done for `subject` is visible.
    pub fn sees(&self, subject: Option<&Subject>) -> bool {
        match self {
            Visibility::App => true,
            Visibility::Subject(own) => subject == Some(own),
        }
    }
}

/// Who a task belongs to: exactly one of a workflow run or an application owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// A workflow run; the run's app, scope and subject apply.
    Run {
        /// The caller's app (the run must belong to it).
        app: AppId,
        /// The run.
        run_id: RunId,
    },
    /// A task the application drives itself.
    Application {
        /// The app.
        app: AppId,
        /// The scope inside the app.
        scope: ScopeId,
        /// The subject the task is done for, if any.
        subject: Option<Subject>,
    },
}

impl Owner {
    /// The owning app.
    pub fn app(&self) -> &AppId {
        match self {
            Owner::Run { app, .. } | Owner::Application { app, .. } => app,
        }
    }
}

/// What makes a task scoped: the source it is about and the budget it is admitted under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskScope {
    /// The source's id.
    pub source_id: SourceId,
    /// The source's revision: a new revision is new work.
    pub source_revision: SourceRevision,
    /// Skip the cache and count as a new step.
    pub recompute: bool,
    /// The limits to admit under.
    pub budget: Budget,
    /// docs/conformance.md#cost-reservation: what admission reserves (the engine computes it from the request, the
    /// tokenizer bound and the model's prices; [`Reservation::default`] reserves nothing).
    pub reservation: crate::cost::Reservation,
}

/// The money side of a task without a source (docs/budgets.md, "Tasks without a
/// source"): the USD limits and the token bucket of its policy (and app) apply to it as
/// to a sourced task; the limits about sources and task counts do not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskCost {
    /// The policy it falls under; only its [`Budget::cost`] limits apply.
    pub budget: Budget,
    /// What it reserves, as [`TaskScope::reservation`].
    pub reservation: crate::cost::Reservation,
}

impl TaskCost {
    /// Whether a USD or token limit applies: the store then checks the reservation under
    /// the scope's lock (and the app's, for the app's limit). Otherwise the reservation
    /// is only recorded, which needs no lock.
    pub fn limited(&self) -> bool {
        self.budget.cost.needs_bound()
    }
}

impl NewTask {
    /// The budget and reservation the store checks and records for this task: a sourced
    /// task's from its [`TaskScope`], an unsourced one's from [`NewTask::cost`].
    pub fn charge(&self) -> Option<(&Budget, &crate::cost::Reservation)> {
        match (&self.scope, &self.cost) {
            (Some(s), _) => Some((&s.budget, &s.reservation)),
            (None, Some(c)) => Some((&c.budget, &c.reservation)),
            (None, None) => None,
        }
    }
}

/// A request that passed validation: parsed for its kind, canonical, within the size limit.
#[derive(Debug, Clone)]
pub struct ValidatedRequest {
    request: TaskRequest,
    value: Value,
    canonical: String,
    input_hash: String,
}

impl ValidatedRequest {
    /// Validates a caller's request object for `kind` (docs/conformance.md#task-kinds, docs/conformance.md#creating-a-task). The size limit applies
    /// to the canonical text that the store keeps (the request's fields plus `kind`).
    pub fn new(kind: TaskKind, raw: &Value, max_bytes: usize) -> Result<Self, InvalidInput> {
        check_hashable(raw).map_err(|e| e.within("request"))?;
        let request = TaskRequest::parse(kind, raw)?;
        let built = Self::from_parsed(request)?;
        if built.canonical.len() > max_bytes {
            return Err(InvalidInput::TooLarge {
                actual: built.canonical.len(),
                limit: max_bytes,
            });
        }
        Ok(built)
    }

    /// Rebuilds from the stored canonical text (no size limit: it was checked on the way in).
    pub fn from_stored(stored: &Value) -> Result<Self, InvalidInput> {
        Self::from_parsed(Self::typed_from_stored(stored)?)
    }

    /// The typed request of a stored canonical text, without the canonical text and hash
    /// [`ValidatedRequest::from_stored`] computes again (what executing a task and
    /// checking its output need).
    pub fn typed_from_stored(stored: &Value) -> Result<TaskRequest, InvalidInput> {
        let kind = stored
            .get("kind")
            .and_then(Value::as_str)
            .and_then(TaskKind::parse)
            .ok_or_else(|| InvalidInput::field("request.kind", "missing or unknown kind"))?;
        let mut fields = stored.clone();
        if let Some(map) = fields.as_object_mut() {
            map.remove("kind");
        }
        TaskRequest::parse(kind, &fields)
    }

    fn from_parsed(request: TaskRequest) -> Result<Self, InvalidInput> {
        let mut value = request.to_value();
        if let Some(map) = value.as_object_mut() {
            map.insert("kind".into(), json!(request.kind().as_str()));
        }
        let canonical = canonical_json(&value).map_err(|e| e.within("request"))?;
        let input_hash = sha256_hex(canonical.as_bytes());
        Ok(ValidatedRequest {
            request,
            value,
            canonical,
            input_hash,
        })
    }

    /// The request's kind.
    pub fn kind(&self) -> TaskKind {
        self.request.kind()
    }

    /// The typed request.
    pub fn request(&self) -> &TaskRequest {
        &self.request
    }

    /// The normalized request with its `kind`, as stored.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The exact text the store keeps.
    pub fn canonical(&self) -> &str {
        &self.canonical
    }

    /// SHA-256 of [`canonical`](Self::canonical): equal requests hash equally whatever
    /// the client's key order.
    pub fn input_hash(&self) -> &str {
        &self.input_hash
    }
}

/// Everything needed to create a task (docs/conformance.md#creating-a-task input).
#[derive(Debug, Clone)]
pub struct NewTask {
    /// Run or application owner.
    pub owner: Owner,
    /// The caller's name for the step.
    pub step: StepKey,
    /// The caller's idempotency key.
    pub effect_key: EffectKey,
    /// The validated request.
    pub request: ValidatedRequest,
    /// The model id the caller asked for.
    pub model: ModelId,
    /// What that id resolved to.
    pub model_ref: ModelRef,
    /// Present for scoped tasks: cache and admission apply.
    pub scope: Option<TaskScope>,
    /// For a task without a source that can cost money (docs/budgets.md, "Tasks without
    /// a source"): its policy's cost limits and its reservation. `None`: it reserves
    /// nothing and no limit applies. A sourced task's are in its [`TaskScope`]; this is
    /// then ignored.
    pub cost: Option<TaskCost>,
    /// docs/conformance.md#priority: priority, its scope's weight and the ageing step.
    pub dispatch: crate::dispatch::Dispatch,
    /// Where the task's trace continues (docs/telemetry.md): the submitting span, so the
    /// worker that claims it, on any replica, adds its spans to the same trace. `None`
    /// when traces are off.
    pub trace_parent: Option<crate::trace::TraceParent>,
    /// How many attempts it may make (docs/routes.md, "Attempts"); `ONE`: at most once.
    pub max_attempts: crate::attempt::MaxAttempts,
    /// Released in the creating write (`released_at` = `created_at`): a task the engine
    /// answers itself and nothing replays but a retried call (the OpenAI-compatible
    /// door's), so it needs no separate release (docs/conformance.md#application-tasks).
    /// A replay of its key changes nothing.
    pub released: bool,
    /// Created already claimed by this worker (docs/engine.md, "Door calls claimed at
    /// creation"): its insert writes it `running` by this worker, its first attempt
    /// open, as a claim would leave it, so it is never queued. The engine asks this only
    /// for a door call on a replica with a free execution slot and nothing else
    /// claimable. A replay or a cache hit is not claimed.
    pub claim_by: Option<WorkerId>,
}

/// docs/conformance.md#create-cache: the cache key, a hash of source, revision, request, model config hash
/// and subject. Results never cross apps or scopes because lookups also filter on both.
pub fn cache_key(
    source_id: &SourceId,
    source_revision: &SourceRevision,
    request: &ValidatedRequest,
    config_hash: &ConfigHash,
    subject: Option<&Subject>,
) -> String {
    // The SHA-256 of the canonical text of {"model_config_hash", "request", "source_id",
    // "source_revision", "subject"}: RFC 8785 writes an object's members sorted by key
    // (these keys are ASCII, in that order), each value in its own canonical text, so
    // the request's canonical text (computed once, when it was validated) is spliced in
    // rather than computed again. The small members are canonicalized as values of
    // their own; none can fail (strings, and a subject of strings).
    let small = |v: Value| canonical_json(&v).unwrap_or_default();
    let text = format!(
        "{{\"model_config_hash\":{},\"request\":{},\"source_id\":{},\"source_revision\":{},\"subject\":{}}}",
        small(json!(config_hash)),
        request.canonical(),
        small(json!(source_id)),
        small(json!(source_revision)),
        small(json!(subject)),
    );
    sha256_hex(text.as_bytes())
}

/// A task's state (docs/conformance.md#lifecycle). Terminal states are final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Waiting for a worker.
    Queued,
    /// Claimed by a worker.
    Running,
    /// Finished with an output.
    Succeeded,
    /// Finished with an error.
    Failed,
    /// Canceled by request.
    Canceled,
}

impl TaskStatus {
    /// The stable string form.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Queued => "queued",
            TaskStatus::Running => "running",
            TaskStatus::Succeeded => "succeeded",
            TaskStatus::Failed => "failed",
            TaskStatus::Canceled => "canceled",
        }
    }

    /// Parses the stable string form.
    pub fn parse(s: &str) -> Option<TaskStatus> {
        match s {
            "queued" => Some(TaskStatus::Queued),
            "running" => Some(TaskStatus::Running),
            "succeeded" => Some(TaskStatus::Succeeded),
            "failed" => Some(TaskStatus::Failed),
            "canceled" => Some(TaskStatus::Canceled),
            _ => None,
        }
    }

    /// Succeeded, failed or canceled.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskStatus::Succeeded | TaskStatus::Failed | TaskStatus::Canceled
        )
    }
}

/// A failed or canceled task's error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskError {
    /// Stable code (docs/conformance.md#error-codes).
    pub code: ErrorCode,
    /// Human-readable message, at most 2,000 characters.
    pub message: String,
}

impl TaskError {
    /// An error whose message is cut to [`MAX_ERROR_MESSAGE_CHARS`] characters.
    pub fn new(code: ErrorCode, message: impl AsRef<str>) -> TaskError {
        TaskError {
            code,
            message: truncate_message(message.as_ref()),
        }
    }
}

/// Cuts a message to [`MAX_ERROR_MESSAGE_CHARS`] characters (not bytes: never splits a
/// character), with any NUL replaced by U+FFFD: messages can quote provider or model
/// text, and a NUL could not be stored in PostgreSQL text (both backends keep the same).
pub fn truncate_message(message: &str) -> String {
    let cut = match message.char_indices().nth(MAX_ERROR_MESSAGE_CHARS) {
        Some((cut, _)) => &message[..cut],
        None => message,
    };
    cut.replace('\0', "\u{FFFD}")
}

/// Who owns a stored task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum TaskOwner {
    /// A workflow run.
    Run {
        /// The run's id.
        run_id: RunId,
    },
    /// The application itself.
    Application,
}

/// The source a scoped task is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRef {
    /// The source's id.
    pub id: SourceId,
    /// The source's revision.
    pub revision: SourceRevision,
    /// Whether the task skipped the cache.
    pub recompute: bool,
}

/// A stored task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// Identifier.
    pub id: TaskId,
    /// Owning tenant.
    pub app: AppId,
    /// The caller's idempotency key (unique per app).
    pub effect_key: EffectKey,
    /// The task's kind.
    pub kind: TaskKind,
    /// The caller's step name.
    pub step: StepKey,
    /// Run or application.
    pub owner: TaskOwner,
    /// The scope (the run's scope for run-owned tasks).
    pub scope: ScopeId,
    /// The subject the task is done for.
    pub subject: Option<Subject>,
    /// Present for scoped tasks.
    pub source: Option<SourceRef>,
    /// The model id asked for.
    pub model: ModelId,
    /// What it resolved to at submission.
    pub model_ref: ModelRef,
    /// Hash of `model_ref`.
    pub model_config_hash: ConfigHash,
    /// The stored request (its fields plus `kind`).
    pub request: Value,
    /// SHA-256 of the canonical request.
    pub input_hash: String,
    /// Cache key, for scoped tasks.
    pub cache_key: Option<String>,
    /// Lifecycle state.
    pub status: TaskStatus,
    /// Whether cancellation was requested for the task itself.
    pub cancel_requested: bool,
    /// The task whose output this one copied, for cache hits.
    pub cached_from: Option<TaskId>,
    /// The output, once succeeded.
    pub output: Option<Value>,
    /// Usage, once succeeded.
    pub usage: Option<Usage>,
    /// The error, once failed or canceled.
    pub error: Option<TaskError>,
    /// The number of the attempt its latest claim began (docs/routes.md, "Attempts"):
    /// each claim begins one, numbered after every attempt the task made, so it is 1
    /// for the first claim and grows with each later one (a task whose attempt was
    /// interrupted goes back to the queue while it has tries left, and is claimed
    /// again); 0 while never claimed.
    pub attempt: u32,
    /// How many attempts it may make (docs/routes.md, "Attempts").
    pub max_attempts: crate::attempt::MaxAttempts,
    /// The worker that claimed it.
    pub worker: Option<WorkerId>,
    /// docs/conformance.md#priority: its priority within its scope.
    pub priority: crate::dispatch::Priority,
    /// When it was created.
    pub created_at: Timestamp,
    /// When a worker claimed it.
    pub claimed_at: Option<Timestamp>,
    /// Last heartbeat while running.
    pub heartbeat_at: Option<Timestamp>,
    /// When it reached a terminal state.
    pub completed_at: Option<Timestamp>,
    /// When the application released it.
    pub released_at: Option<Timestamp>,
    /// docs/conformance.md#cost-reservation: what it reserved (admitted tasks, and tasks without a source that can
    /// cost money: docs/budgets.md, "Tasks without a source").
    pub reservation: Option<crate::cost::Reservation>,
    /// Where the task's trace continues (docs/telemetry.md); `None` when it was submitted
    /// with traces off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_parent: Option<crate::trace::TraceParent>,
}

impl Task {
    /// Served from the cache.
    pub fn cached(&self) -> bool {
        self.cached_from.is_some()
    }

    /// The owning run, if any.
    pub fn run_id(&self) -> Option<RunId> {
        match self.owner {
            TaskOwner::Run { run_id } => Some(run_id),
            TaskOwner::Application => None,
        }
    }

    /// The typed request, parsed again from its stored form.
    pub fn parsed_request(&self) -> Result<ValidatedRequest, InvalidInput> {
        ValidatedRequest::from_stored(&self.request)
    }

    /// The typed request alone, parsed again from its stored form
    /// ([`ValidatedRequest::typed_from_stored`]).
    pub fn typed_request(&self) -> Result<TaskRequest, InvalidInput> {
        ValidatedRequest::typed_from_stored(&self.request)
    }
}

#[cfg(test)]
mod tests;
