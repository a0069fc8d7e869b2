//! Declarative pipelines over workflow runs: registering definitions, starting runs and
//! reading where a run's steps stand. The [`driver`](crate::driver) moves runs forward.
//!
//! Every attempt of a step is one run-owned task whose effect key is derived from the
//! run, the step and the attempt ([`step_effect_key`]). Submitting it again returns the
//! existing task (docs/conformance.md#create-idempotency), so a driver that crashed at any instant and a driver
//! that takes over never execute a finished step again and never spend a budget twice.

use crate::error::EngineError;
use crate::facade::Tollgate;
use crate::notify::Event;
use crate::pipeline_cache::{load_pipeline, parsed};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::pipeline::{Pipeline, Step, check_pipeline_name, has_references};
use tollgate_core::{
    AppId, BudgetName, EffectKey, EngineKeySpace, InvalidInput, NewRun, PipelineName,
    PipelineVersion, Run, RunId, ScopeId, StepKey, Subject, Task, TaskError, TaskId, TaskKind,
    TaskOwner, TaskStatus,
};
use tollgate_store::{PipelineRef, StoredPipeline};

/// How often [`Tollgate::wait_run`] looks at a run. A run finishes in a drive right after
/// its last task did, on whichever replica drives it: polling the database is the one
/// signal every replica shares.
const RUN_WAIT_POLL: Duration = Duration::from_millis(100);

/// The effect key of one attempt of a step of a run: `run:<run id>:<step>` for the first
/// attempt, `run:<run id>:<step>#<n>` for the n-th retry. Step keys of a pipeline hold no
/// `:` or `#` ([`tollgate_core::pipeline::check_step_key`]), so the key names exactly one
/// (step, attempt). The `run:` prefix is the engine's namespace
/// ([`EngineKeySpace::PipelineStep`]): a caller's key never starts with it.
pub fn step_effect_key(
    run: RunId,
    step: &StepKey,
    attempt: u32,
) -> Result<EffectKey, InvalidInput> {
    let space = EngineKeySpace::PipelineStep.prefix();
    if attempt == 0 {
        EffectKey::new(format!("{space}{run}:{step}"))
    } else {
        EffectKey::new(format!("{space}{run}:{step}#{attempt}"))
    }
}

/// The (step key, attempt) an effect key of `run` names, if it is one of its step keys.
fn parse_step_effect_key(run: RunId, key: &str) -> Option<(&str, u32)> {
    let prefix = format!("{}{run}:", EngineKeySpace::PipelineStep.prefix());
    let rest = key.strip_prefix(prefix.as_str())?;
    match rest.split_once('#') {
        None => Some((rest, 0)),
        Some((step, n)) => {
            let attempt: u32 = n.parse().ok()?;
            (attempt > 0 && n == attempt.to_string()).then_some((step, attempt))
        }
    }
}

/// Where one step stands: its latest attempt and that attempt's task.
#[derive(Debug, Clone)]
pub(crate) struct StepProgress<'p> {
    /// The step.
    pub(crate) step: &'p Step,
    /// The latest attempt's number (0: the first).
    pub(crate) attempt: u32,
    /// The latest attempt's task; `None` while the step was never submitted.
    pub(crate) task: Option<Task>,
    /// Attempts that failed or were canceled, except those interrupted by a dead worker:
    /// what the step's `retries` bound.
    pub(crate) failures: u32,
    /// Attempts interrupted by a dead worker (`WORKFLOW_AI_INTERRUPTED`): what
    /// `pipelines.interrupted_retries` bounds.
    pub(crate) interruptions: u32,
}

impl StepProgress<'_> {
    /// The step's output, once its latest attempt succeeded.
    pub(crate) fn output(&self) -> Option<&Value> {
        self.task
            .as_ref()
            .filter(|t| t.status == TaskStatus::Succeeded)
            .and_then(|t| t.output.as_ref())
    }

    /// Whether the latest attempt ended without an output (failed or canceled).
    pub(crate) fn failed(&self) -> bool {
        self.task
            .as_ref()
            .is_some_and(|t| matches!(t.status, TaskStatus::Failed | TaskStatus::Canceled))
    }

    /// Whether the latest attempt was interrupted by a worker that died mid-call (a
    /// crash, not an answer of the model).
    pub(crate) fn interrupted(&self) -> bool {
        self.failed() && self.task.as_ref().is_some_and(was_interrupted)
    }

    /// Whether another attempt is allowed after a failure: a step's own failures are
    /// bounded by its `retries`; attempts cut short by a crashed worker are tried again
    /// up to `interrupted_retries` times on top, so a run survives a crash mid-step.
    pub(crate) fn may_retry(&self, interrupted_retries: u32) -> bool {
        if self.interrupted() {
            self.interruptions <= interrupted_retries
        } else {
            self.failures <= self.step.retries
        }
    }
}

/// Whether a finished task ended because its worker died (docs/conformance.md#sweep-liveness).
fn was_interrupted(task: &Task) -> bool {
    task.status == TaskStatus::Failed
        && task
            .error
            .as_ref()
            .is_some_and(|e| e.code == tollgate_core::ErrorCode::Interrupted)
}

/// Where every step of a run stands, in the pipeline's topological order.
#[derive(Debug, Clone)]
pub(crate) struct Progress<'p> {
    /// One entry per step.
    pub(crate) steps: Vec<StepProgress<'p>>,
}

impl<'p> Progress<'p> {
    /// Sorts a run's tasks into its steps: a task belongs to a step when its effect key is
    /// one of the step's attempt keys and its step and kind match. Other tasks of the run
    /// (submitted by hand) are ignored.
    pub(crate) fn of(pipeline: &'p Pipeline, run: RunId, tasks: Vec<Task>) -> Progress<'p> {
        let mut latest: HashMap<&str, (u32, Task)> = HashMap::new();
        let mut ended: HashMap<&str, (u32, u32)> = HashMap::new();
        for task in tasks {
            if task.owner != (TaskOwner::Run { run_id: run }) {
                continue;
            }
            let Some((key, attempt)) = parse_step_effect_key(run, task.effect_key.as_str()) else {
                continue;
            };
            let Some(step) = pipeline.steps.iter().find(|s| s.key.as_str() == key) else {
                continue;
            };
            if task.step != step.key || task.kind != step.kind {
                continue;
            }
            if matches!(task.status, TaskStatus::Failed | TaskStatus::Canceled) {
                let (failures, interruptions) = ended.entry(step.key.as_str()).or_default();
                if was_interrupted(&task) {
                    *interruptions += 1;
                } else {
                    *failures += 1;
                }
            }
            let newer = latest
                .get(step.key.as_str())
                .is_none_or(|(seen, _)| attempt > *seen);
            if newer {
                latest.insert(step.key.as_str(), (attempt, task));
            }
        }
        let steps = pipeline
            .steps
            .iter()
            .map(|step| {
                let (failures, interruptions) =
                    ended.get(step.key.as_str()).copied().unwrap_or_default();
                let (attempt, task) = match latest.remove(step.key.as_str()) {
                    Some((attempt, task)) => (attempt, Some(task)),
                    None => (0, None),
                };
                StepProgress {
                    step,
                    attempt,
                    task,
                    failures,
                    interruptions,
                }
            })
            .collect();
        Progress { steps }
    }

    /// The outputs of the steps that succeeded.
    pub(crate) fn outputs(&self) -> BTreeMap<StepKey, Value> {
        self.steps
            .iter()
            .filter_map(|p| p.output().map(|o| (p.step.key.clone(), o.clone())))
            .collect()
    }
}

/// What [`Tollgate::start_pipeline`] starts.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineStart {
    /// The caller's app.
    pub app: AppId,
    /// The authenticated subject the run's tasks are done for.
    pub subject: Option<Subject>,
    /// The pipeline.
    pub name: PipelineName,
    /// That version (default: the newest).
    pub version: Option<String>,
    /// The scope its tasks are admitted and cached in.
    pub scope: ScopeId,
    /// The run's input.
    pub input: Value,
    /// Starts the run once per app and key (the HTTP `Idempotency-Key`).
    pub start_key: Option<EffectKey>,
}

/// A started (or, under a start key, an earlier started) run.
#[derive(Debug, Clone, PartialEq)]
pub struct StartedRun {
    /// The run.
    pub run: Run,
    /// Whether this call created it.
    pub created: bool,
}

/// Where a step of a pipeline run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepStatus {
    /// Not submitted yet (waiting for its dependencies or for admission), or waiting to
    /// be tried again after a failed attempt.
    Pending,
    /// Its task is queued.
    Queued,
    /// Its task is running.
    Running,
    /// Its task succeeded.
    Succeeded,
    /// Its last attempt failed.
    Failed,
    /// Its last attempt was canceled.
    Canceled,
}

impl StepStatus {
    /// The stable string form.
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Pending => "pending",
            StepStatus::Queued => "queued",
            StepStatus::Running => "running",
            StepStatus::Succeeded => "succeeded",
            StepStatus::Failed => "failed",
            StepStatus::Canceled => "canceled",
        }
    }
}

/// One step of a pipeline run, as shown.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineStep {
    /// The step's key.
    pub key: StepKey,
    /// The step's task kind.
    pub kind: TaskKind,
    /// Where it stands.
    pub status: StepStatus,
    /// Attempts submitted so far.
    pub attempts: u32,
    /// The latest attempt's task.
    pub task_id: Option<TaskId>,
    /// The latest attempt's error, once it failed or was canceled.
    pub error: Option<TaskError>,
    /// The step's output, once it succeeded.
    pub output: Option<Value>,
}

/// The pipeline side of a run: the version it runs and where each step stands.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineProgress {
    /// The pipeline's name.
    pub name: PipelineName,
    /// The version (content hash) the run runs.
    pub version: String,
    /// Every step, in an order where each comes after its dependencies.
    pub steps: Vec<PipelineStep>,
}

impl Tollgate {
    /// Registers a version of a pipeline definition (the version is the hash of its
    /// canonical form): `true` when this version is new, `false` when the app already
    /// had it. The definition is validated first — shape, kinds, step keys, a DAG of
    /// `depends_on`, every reference, and the configured models and budget policies the
    /// steps name; requests without references are validated for their kind. An invalid
    /// definition is [`EngineError::Invalid`] with the precise place and reason, and
    /// nothing is stored.
    pub async fn register_pipeline(
        &self,
        app: &AppId,
        name: &PipelineName,
        definition: &Value,
    ) -> Result<(StoredPipeline, bool), EngineError> {
        check_pipeline_name(name.as_str())?;
        let pipeline = Pipeline::parse(definition)?;
        self.check_steps(app, &pipeline)?;
        let registered = self
            .inner
            .store
            .put_pipeline(app, name, &pipeline.version, &pipeline.definition)
            .await?;
        self.inner.pipelines.insert(Arc::new(pipeline));
        Ok(registered)
    }

    /// What only the configuration can tell: the models and budget policies steps name,
    /// and requests that reference nothing (they are final as written).
    fn check_steps(&self, app: &AppId, pipeline: &Pipeline) -> Result<(), EngineError> {
        let inner = &self.inner;
        for step in &pipeline.steps {
            let at = format!("definition.steps ({})", step.key);
            if let Some(model) = &step.model {
                inner
                    .models
                    .resolve(Some(model))
                    .map_err(|e| InvalidInput::field(format!("{at}.model"), e.to_string()))?;
            }
            if let Some(budget) = &step.budget {
                let name = BudgetName::new(budget.as_str())
                    .map_err(|e| InvalidInput::field(format!("{at}.budget"), e.to_string()))?;
                inner
                    .budgets
                    .resolve(app, Some(&name))
                    .map_err(|e| InvalidInput::field(format!("{at}.budget"), e.to_string()))?;
            }
            if !has_references(&step.request) {
                inner
                    .validate_request(step.kind, &step.request)
                    .map_err(|e| e.within(&at))?;
            }
        }
        Ok(())
    }

    /// A registered pipeline of the app: that version, or the newest when `version` is
    /// `None`. `None`: the app has no such pipeline or version.
    pub async fn get_pipeline(
        &self,
        app: &AppId,
        name: &PipelineName,
        version: Option<&str>,
    ) -> Result<Option<StoredPipeline>, EngineError> {
        if let Some(v) = version {
            PipelineVersion::new(v)?;
        }
        Ok(self.inner.store.get_pipeline(app, name, version).await?)
    }

    /// Starts a run of a pipeline (that version, or the newest) in a scope, for the
    /// authenticated subject. The input must hold everything the steps read from it
    /// (otherwise [`EngineError::Invalid`] naming the step and the pointer). The run is
    /// created `running` and the drivers are told; `None`: the app has no such pipeline or
    /// version.
    pub async fn start_pipeline_run(
        &self,
        app: &AppId,
        subject: Option<Subject>,
        name: &PipelineName,
        version: Option<&str>,
        scope: ScopeId,
        input: Value,
    ) -> Result<Option<Run>, EngineError> {
        let started = self
            .start_pipeline(PipelineStart {
                app: app.clone(),
                subject,
                name: name.clone(),
                version: version.map(str::to_string),
                scope,
                input,
                start_key: None,
            })
            .await?;
        Ok(started.map(|s| s.run))
    }

    /// [`start_pipeline_run`](Self::start_pipeline_run) with an optional start key: the
    /// first start under a key creates the run, every later one answers that run with
    /// `created: false` and starts nothing (compare [`StartedRun::run`] with what you
    /// asked for: the key alone decides).
    pub async fn start_pipeline(
        &self,
        start: PipelineStart,
    ) -> Result<Option<StartedRun>, EngineError> {
        let inner = &self.inner;
        if let Some(v) = &start.version {
            PipelineVersion::new(v.as_str())?;
        }
        let Some(stored) = inner
            .store
            .get_pipeline(&start.app, &start.name, start.version.as_deref())
            .await?
        else {
            return Ok(None);
        };
        let pipeline = parsed(inner, &stored)?;
        pipeline.check_input(&start.input)?;
        let new = NewRun {
            trace_parent: None,
            app: start.app.clone(),
            scope: start.scope,
            subject: start.subject,
            input: start.input,
        };
        let pref = PipelineRef {
            name: start.name,
            version: stored.version,
        };
        let (run, created) = match &start.start_key {
            Some(key) => inner.store.start_pipeline_run_once(new, &pref, key).await?,
            None => (inner.store.create_pipeline_run(new, &pref).await?, true),
        };
        if created {
            inner.notifier.publish(Event::RunWoken {
                app: Some(start.app),
                id: run.id,
            });
        }
        Ok(Some(StartedRun { run, created }))
    }

    /// Waits until a run of the app is terminal or `timeout` passed, and returns it as it
    /// is then. `None`: the app has no such run. Waiting holds one of the app's waiter
    /// slots ([`EngineError::TooManyWaiters`] when none is free).
    pub async fn wait_run(
        &self,
        app: &AppId,
        id: RunId,
        timeout: Duration,
    ) -> Result<Option<Run>, EngineError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut slot = None;
        loop {
            let Some(run) = self.inner.store.get_run(app, id).await? else {
                return Ok(None);
            };
            let now = tokio::time::Instant::now();
            if run.state.is_terminal() || now >= deadline {
                return Ok(Some(run));
            }
            // Waiting holds one of the app's waiter slots (docs/api.md, "Waiting").
            if slot.is_none() {
                slot = Some(self.inner.watches.slot(app)?);
            }
            tokio::time::sleep(RUN_WAIT_POLL.min(deadline - now)).await;
        }
    }

    /// The pipeline side of a run the caller has read (so of their app): its pipeline
    /// version and where each step stands. `None` for a run that is not a pipeline run.
    pub async fn pipeline_run(&self, run: &Run) -> Result<Option<PipelineProgress>, EngineError> {
        let inner = &self.inner;
        let Some(pref) = inner.store.run_pipeline(&run.app, run.id).await? else {
            return Ok(None);
        };
        let Some(pipeline) = load_pipeline(inner, &run.app, &pref).await? else {
            return Ok(Some(PipelineProgress {
                name: pref.name,
                version: pref.version,
                steps: Vec::new(),
            }));
        };
        let tasks = inner.store.run_tasks(&run.app, run.id).await?;
        let progress = Progress::of(&pipeline, run.id, tasks);
        let finished = run.state.is_terminal();
        let interrupted_retries = inner.config.pipelines.interrupted_retries;
        let steps = progress
            .steps
            .iter()
            .map(|p| {
                let status = match &p.task {
                    None => StepStatus::Pending,
                    Some(_) if p.failed() && p.may_retry(interrupted_retries) && !finished => {
                        StepStatus::Pending
                    }
                    Some(t) => match t.status {
                        TaskStatus::Queued => StepStatus::Queued,
                        TaskStatus::Running => StepStatus::Running,
                        TaskStatus::Succeeded => StepStatus::Succeeded,
                        TaskStatus::Failed => StepStatus::Failed,
                        TaskStatus::Canceled => StepStatus::Canceled,
                    },
                };
                PipelineStep {
                    key: p.step.key.clone(),
                    kind: p.step.kind,
                    status,
                    attempts: p.task.as_ref().map_or(0, |_| p.attempt + 1),
                    task_id: p.task.as_ref().map(|t| t.id),
                    error: p.task.as_ref().and_then(|t| t.error.clone()),
                    output: p.output().cloned(),
                }
            })
            .collect();
        Ok(Some(PipelineProgress {
            name: pref.name,
            version: pref.version,
            steps,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effect_keys_name_one_step_and_attempt() {
        let run = RunId::generate();
        let step = StepKey::new("extract").unwrap();
        let first = step_effect_key(run, &step, 0).unwrap();
        assert_eq!(first.as_str(), format!("run:{run}:extract"));
        let third = step_effect_key(run, &step, 2).unwrap();
        assert_eq!(third.as_str(), format!("run:{run}:extract#2"));
        assert_eq!(
            parse_step_effect_key(run, first.as_str()),
            Some(("extract", 0))
        );
        assert_eq!(
            parse_step_effect_key(run, third.as_str()),
            Some(("extract", 2))
        );
        let other = RunId::generate();
        assert_eq!(parse_step_effect_key(other, first.as_str()), None);
        for odd in ["#0", "#01", "#x", "#"] {
            let key = format!("run:{run}:extract{odd}");
            assert_eq!(parse_step_effect_key(run, &key), None, "{key}");
        }
    }
}
