//! What a caller submits: [`Submission`], its owner and source, and the answer.

use serde_json::Value;
use tollgate_core::kinds::{
    ChatRequest, ClassifyManyRequest, ClassifyRequest, ExtractDataRequest, GenerateTextRequest,
};
use tollgate_core::{
    AppId, BudgetName, EffectKey, InvalidInput, ModelId, Priority, RunId, ScopeId, SourceId,
    SourceRevision, StepKey, Subject, Task, TaskKind, TaskRequest,
};

/// Who a submitted task belongs to, as a caller names it.
///
/// Why not [`tollgate_core::Owner`]: that one is the owner *resolved* for the store (it
/// carries the app and, for an application task, the authenticated subject, which come
/// from authentication and sit on [`Submission`] beside this); and why not
/// [`tollgate_core::TaskOwner`]: that is what a stored [`Task`] records (the scope sits on
/// the task itself). This is the one a caller chooses: a run, or a scope of the app.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmissionOwner {
    /// A workflow run of the app: the run's scope and subject apply.
    Run(RunId),
    /// The application itself, in a scope.
    Application {
        /// The scope inside the app.
        scope: ScopeId,
    },
}

/// The source a scoped task is about: cache and admission apply (docs/conformance.md#creating-a-task, docs/conformance.md#admission).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSpec {
    /// The source's id.
    pub id: SourceId,
    /// The source's revision: a new revision is new work.
    pub revision: SourceRevision,
    /// Skip the cache and count as a new step.
    pub recompute: bool,
}

/// One task to submit.
#[derive(Debug, Clone, PartialEq)]
pub struct Submission {
    /// The caller's app (from authentication).
    pub app: AppId,
    /// Run or application owner.
    pub owner: SubmissionOwner,
    /// The authenticated subject of an application-owned task (from authentication,
    /// never from a request body). Run-owned tasks use the run's subject; this is ignored.
    pub subject: Option<Subject>,
    /// The caller's name for the step (default: the kind's name).
    pub step: Option<StepKey>,
    /// The caller's idempotency key.
    pub effect_key: EffectKey,
    /// The task's kind.
    pub kind: TaskKind,
    /// The request object of the kind (without `kind`).
    pub request: Value,
    /// The model id (default: the configured `default_model`).
    pub model: Option<ModelId>,
    /// Present for scoped tasks.
    pub source: Option<SourceSpec>,
    /// A budget policy the app may use (default: the app's default policy).
    pub budget: Option<BudgetName>,
    /// docs/conformance.md#priority: priority within its scope (default [`Priority::DEFAULT`]).
    pub priority: Option<Priority>,
}

impl Submission {
    /// An application-owned task with defaults for everything optional.
    pub fn application(
        app: AppId,
        scope: ScopeId,
        effect_key: EffectKey,
        kind: TaskKind,
        request: Value,
    ) -> Submission {
        Submission {
            priority: None,
            app,
            owner: SubmissionOwner::Application { scope },
            subject: None,
            step: None,
            effect_key,
            kind,
            request,
            model: None,
            source: None,
            budget: None,
        }
    }

    /// A run-owned task with defaults for everything optional.
    pub fn for_run(
        app: AppId,
        run: RunId,
        effect_key: EffectKey,
        kind: TaskKind,
        request: Value,
    ) -> Submission {
        Submission {
            priority: None,
            app,
            owner: SubmissionOwner::Run(run),
            subject: None,
            step: None,
            effect_key,
            kind,
            request,
            model: None,
            source: None,
            budget: None,
        }
    }

    /// An application-owned task from a typed request (`TaskRequest::Classify(…)`, …):
    /// the kind is the request's, and the request is checked like any other.
    pub fn application_request(
        app: AppId,
        scope: ScopeId,
        effect_key: EffectKey,
        request: TaskRequest,
    ) -> Submission {
        Submission::application(app, scope, effect_key, request.kind(), request.to_value())
    }

    /// A run-owned task from a typed request.
    pub fn run_request(
        app: AppId,
        run: RunId,
        effect_key: EffectKey,
        request: TaskRequest,
    ) -> Submission {
        Submission::for_run(app, run, effect_key, request.kind(), request.to_value())
    }

    /// An application-owned `classify` task.
    pub fn classify(
        app: AppId,
        scope: ScopeId,
        effect_key: EffectKey,
        request: ClassifyRequest,
    ) -> Submission {
        Submission::application_request(app, scope, effect_key, TaskRequest::Classify(request))
    }

    /// An application-owned `classify_many` task.
    pub fn classify_many(
        app: AppId,
        scope: ScopeId,
        effect_key: EffectKey,
        request: ClassifyManyRequest,
    ) -> Submission {
        Submission::application_request(app, scope, effect_key, TaskRequest::ClassifyMany(request))
    }

    /// An application-owned `generate_text` task.
    pub fn generate_text(
        app: AppId,
        scope: ScopeId,
        effect_key: EffectKey,
        request: GenerateTextRequest,
    ) -> Submission {
        Submission::application_request(app, scope, effect_key, TaskRequest::GenerateText(request))
    }

    /// An application-owned `extract_data` task.
    pub fn extract_data(
        app: AppId,
        scope: ScopeId,
        effect_key: EffectKey,
        request: ExtractDataRequest,
    ) -> Submission {
        Submission::application_request(app, scope, effect_key, TaskRequest::ExtractData(request))
    }

    /// An application-owned `chat` task.
    pub fn chat(
        app: AppId,
        scope: ScopeId,
        effect_key: EffectKey,
        request: ChatRequest,
    ) -> Submission {
        Submission::application_request(app, scope, effect_key, TaskRequest::Chat(request))
    }

    /// An application-owned `embed` task (docs/api.md, "Embeddings").
    pub fn embed(
        app: AppId,
        scope: ScopeId,
        effect_key: EffectKey,
        request: tollgate_core::EmbedRequest,
    ) -> Submission {
        Submission::application_request(app, scope, effect_key, TaskRequest::Embed(request))
    }

    /// Makes the task scoped: about `source` at `revision`.
    pub fn with_source(mut self, id: SourceId, revision: SourceRevision) -> Submission {
        self.source = Some(SourceSpec {
            id,
            revision,
            recompute: false,
        });
        self
    }

    /// Asks for a model id.
    pub fn with_model(mut self, model: ModelId) -> Submission {
        self.model = Some(model);
        self
    }

    /// Names the step.
    pub fn with_step(mut self, step: StepKey) -> Submission {
        self.step = Some(step);
        self
    }

    /// docs/conformance.md#priority: sets the priority within its scope.
    pub fn with_priority(mut self, priority: Priority) -> Submission {
        self.priority = Some(priority);
        self
    }

    /// Names a budget policy.
    pub fn with_budget(mut self, budget: BudgetName) -> Submission {
        self.budget = Some(budget);
        self
    }

    /// The step's name: the one given, or the kind's name (the one default of it).
    pub fn resolved_step(&self) -> Result<StepKey, InvalidInput> {
        match &self.step {
            Some(step) => Ok(step.clone()),
            None => StepKey::new(self.kind.as_str()),
        }
    }

    /// Sets the authenticated subject.
    pub fn with_subject(mut self, subject: Subject) -> Submission {
        self.subject = Some(subject);
        self
    }
}

/// The answer of a submission.
#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    /// The new or existing task.
    pub task: Task,
    /// False when the effect key already named a task in the app.
    pub created: bool,
}
