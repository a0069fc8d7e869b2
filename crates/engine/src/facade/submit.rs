//! docs/conformance.md#creating-a-task: submitting tasks, one or a batch.

use crate::cost::route_reservation;
use crate::error::EngineError;
use crate::metrics as m;
use crate::notify::Event;
use futures::StreamExt;
use std::collections::{HashMap, HashSet};
use tollgate_core::{
    AppId, Dispatch, EngineKeySpace, InvalidInput, NewTask, Owner, TaskCost, TaskKind, TaskScope,
    TaskStatus,
};
use tollgate_store::{Created, StoreError};

use super::*;

impl Tollgate {
    /// docs/conformance.md#creating-a-task: resolves the model and budget, validates the request, creates the task
    /// (idempotent per effect key; served from the cache when possible; admitted under
    /// the budget when scoped) and tells the workers. A rejection wrote nothing. A key in
    /// the engine's own namespaces (`run:`, `openai-`) is refused (docs/api.md, "Effect
    /// keys"). A replay of a key answers its task (`created: false`) for the same
    /// submission, and is [`EngineError::TaskConflict`] naming the first field that
    /// differs otherwise (the HTTP API's 409), nothing written.
    pub async fn submit(&self, submission: Submission) -> Result<Submitted, EngineError> {
        let submitted = self
            .submit_keyed(submission.clone(), None, Start::Queued)
            .await?;
        self.replayed(&submission, submitted)
    }

    /// [`submit`](Self::submit) without comparing a replay (callers that judge it
    /// themselves: [`CallerView`](crate::CallerView) after its visibility check, the
    /// pipeline driver, whose keys it derives), of a task whose key the engine made in
    /// `space` (a pipeline step, a door call) when given: the key must lie in that
    /// namespace, and only there.
    /// `start`: whether the task may be created claimed by this process (docs/engine.md,
    /// "Tasks claimed at creation").
    pub(crate) async fn submit_keyed(
        &self,
        submission: Submission,
        space: Option<EngineKeySpace>,
        start: Start,
    ) -> Result<Submitted, EngineError> {
        let kind = submission.kind;
        let traces = &self.inner.traces;
        // docs/telemetry.md, "Runs": a run's task is a child of the run's span.
        let run_parent = match &submission.owner {
            SubmissionOwner::Run(run) if traces.enabled() => self
                .inner
                .store
                .get_run(&submission.app, *run)
                .await
                .ok()
                .flatten()
                .and_then(|r| r.trace_parent),
            _ => None,
        };
        let span = traces.start_under("submit", run_parent);
        let result =
            match check_key_space(&submission, space).and_then(|()| self.prepare(submission)) {
                Ok(mut prepared) => {
                    prepared.trace_parent = span.trace_parent();
                    // docs/openai.md: the door answers its task itself and nothing replays
                    // it but a retried call, so it is released in the creating write (no
                    // second write on the call's path, none holding the row while a
                    // worker claims it).
                    prepared.released = space == Some(EngineKeySpace::OpenAiDoor);
                    // docs/engine.md, "Tasks claimed at creation": a task its caller
                    // waits for, with a free slot and nothing else claimable here, is
                    // created claimed by this process's worker and starts at once, without
                    // a claim of its own (a commit and the dispatcher's hand-over saved).
                    let direct = match start {
                        Start::AtOnce => self.inner.direct_slot(),
                        Start::Queued => None,
                    };
                    prepared.claim_by = direct.as_ref().map(|slot| slot.worker().clone());
                    if direct.is_some() {
                        self.inner.prepare_call(&prepared.model);
                    }
                    let scoped = prepared.scope.is_some();
                    let admission = traces.child(&span, "admission");
                    let created = self.inner.store.create_task(prepared).await;
                    if let (Some(slot), Ok(c)) = (direct, &created)
                        && c.created
                    {
                        slot.start(&c.task);
                    }
                    let answer = self.created(kind, scoped, created);
                    crate::telemetry::record_admission(&admission, &answer);
                    answer
                }
                Err(e) => Err(e),
            };
        match &result {
            Ok(s) => span.set_task(&s.task),
            Err(e) => span.error(e.to_string()),
        }
        count_submit(kind, &result);
        result
    }

    /// docs/conformance.md#create-validate and the configuration: model, budget policy, request, owner.
    fn prepare(&self, s: Submission) -> Result<NewTask, EngineError> {
        let inner = &self.inner;
        let model = inner.models.resolve(s.model.as_ref())?;
        let (policy, budget) = inner.budgets.resolve(&s.app, s.budget.as_ref())?;
        // docs/conformance.md#priority: the task's priority, its scope's weight (the policy's), the ageing.
        let dispatch = Dispatch {
            priority: s.priority.unwrap_or_default(),
            weight: inner.budgets.weight(&policy),
            ageing_step: inner.config.dispatch.ageing_step,
        };
        let request = inner.validate_request(s.kind, &s.request)?;
        if let tollgate_core::TaskRequest::Embed(r) = request.request() {
            crate::cost::check_embed_route(&inner.config, &model.route, r)?;
        }
        let step = s.resolved_step()?;
        let owner = match s.owner {
            SubmissionOwner::Run(run_id) => Owner::Run {
                app: s.app.clone(),
                run_id,
            },
            SubmissionOwner::Application { scope } => Owner::Application {
                app: s.app.clone(),
                scope,
                subject: s.subject,
            },
        };
        // docs/conformance.md#cost-reservation: the task's worst case, reserved at admission (a cache hit or a replay
        // reserves nothing; the store decides which it is). A task without a source
        // reserves too when it can cost money: its model has prices, or a USD or token
        // limit applies to it (docs/budgets.md, "Tasks without a source").
        let reserves = s.source.is_some() || model.prices.is_some() || budget.cost.needs_bound();
        // A route reserves its first attempt at the dearest deployment it could go to
        // (docs/routes.md).
        let reservation = if reserves {
            route_reservation(
                &inner.config,
                &model.route,
                request.request(),
                inner.config.workers.max_output_retries,
                inner.config.max_output_bytes,
            )
        } else {
            tollgate_core::Reservation::default()
        };
        let cost = (s.source.is_none() && reserves).then_some(TaskCost {
            budget,
            reservation,
        });
        Ok(NewTask {
            cost,
            dispatch,
            owner,
            step,
            effect_key: s.effect_key,
            request,
            model: model.id.clone(),
            model_ref: model.model_ref.clone(),
            scope: s.source.map(|source| TaskScope {
                source_id: source.id,
                source_revision: source.revision,
                recompute: source.recompute,
                budget,
                reservation,
            }),
            trace_parent: None,
            max_attempts: tollgate_core::attempt::max_attempts(
                model.max_attempts,
                inner
                    .config
                    .apps
                    .get(s.app.as_str())
                    .and_then(|a| a.max_attempts),
            ),
            released: false,
            claim_by: None,
        })
    }

    /// What the store answered for one item: metrics, and the workers told (after the
    /// commit) about a new queued task.
    fn created(
        &self,
        kind: TaskKind,
        scoped: bool,
        answer: Result<Created, StoreError>,
    ) -> Result<Submitted, EngineError> {
        let created = match answer {
            Ok(c) => c,
            Err(StoreError::Admission(rejection)) => {
                metrics::counter!(m::ADMISSIONS_TOTAL, "outcome" => rejection.code().as_str())
                    .increment(1);
                return Err(EngineError::Admission(rejection));
            }
            Err(StoreError::Cost(rejection)) => {
                metrics::counter!(m::ADMISSIONS_TOTAL, "outcome" => rejection.code().as_str())
                    .increment(1);
                return Err(EngineError::Cost(rejection));
            }
            Err(e) => return Err(e.into()),
        };
        let task = created.task;
        if created.created {
            if task.cached() {
                metrics::counter!(m::CACHE_HITS_TOTAL, "kind" => kind.as_str()).increment(1);
                // docs/conformance.md#cost-cache-hits: what the hit saved (the copied task's charge, from the store).
                if created.saved_nano > 0 {
                    metrics::counter!(m::SPEND_SAVED_TOTAL, m::app_labels(&task.app))
                        .increment(created.saved_nano);
                }
            } else {
                if scoped {
                    metrics::counter!(m::ADMISSIONS_TOTAL, "outcome" => "admitted").increment(1);
                }
                // Sourced or not: every reservation counts (docs/budgets.md).
                if let Some(r) = task.reservation.filter(|r| r.nano_usd > 0) {
                    metrics::counter!(m::SPEND_RESERVED_TOTAL, m::app_labels(&task.app))
                        .increment(r.nano_usd as u64);
                }
            }
            if task.status == TaskStatus::Queued {
                self.inner.notifier.publish(Event::TaskQueued {
                    app: task.app.clone(),
                    id: task.id,
                });
            }
        }
        Ok(Submitted {
            task,
            created: created.created,
        })
    }

    /// Submits up to [`MAX_BATCH`] tasks. Each is admitted or rejected on its own; the
    /// answers come in the order of the submissions. Items are grouped by owner (a scope,
    /// or a run): each group goes to the store's batch creation in order (SQLite: one
    /// transaction per group), so earlier items take a scope's budget first; groups run
    /// concurrently (bounded). A repeated effect key within the batch is submitted after
    /// its first occurrence, so the first one is the one that creates. Each replay is
    /// judged like [`submit`](Self::submit)'s ([`EngineError::TaskConflict`] when it
    /// differs).
    pub async fn submit_many(
        &self,
        submissions: Vec<Submission>,
    ) -> Result<Vec<Result<Submitted, EngineError>>, EngineError> {
        let answers = self.submit_many_unjudged(submissions.clone()).await?;
        Ok(answers
            .into_iter()
            .zip(&submissions)
            .map(|(answer, submission)| answer.and_then(|s| self.replayed(submission, s)))
            .collect())
    }

    /// [`submit_many`](Self::submit_many) without comparing replays (for
    /// [`CallerView`](crate::CallerView), which checks visibility first).
    pub(crate) async fn submit_many_unjudged(
        &self,
        submissions: Vec<Submission>,
    ) -> Result<Vec<Result<Submitted, EngineError>>, EngineError> {
        if submissions.len() > MAX_BATCH {
            return Err(InvalidInput::field(
                "tasks",
                format!(
                    "a batch holds at most {MAX_BATCH} tasks, got {}",
                    submissions.len()
                ),
            )
            .into());
        }
        let total = submissions.len();
        // One `submit` span for the batch: every task of it continues this trace.
        let span = self.inner.traces.start_here("submit");
        span.set("tollgate.batch.size", total as i64);
        let mut results: Vec<Option<Result<Submitted, EngineError>>> =
            (0..total).map(|_| None).collect();
        let mut seen = HashSet::new();
        let mut groups: Vec<Vec<(usize, TaskKind, NewTask)>> = Vec::new();
        let mut group_of: HashMap<(AppId, String), usize> = HashMap::new();
        let mut repeated = Vec::new();
        for (i, s) in submissions.into_iter().enumerate() {
            if !seen.insert((s.app.clone(), s.effect_key.clone())) {
                repeated.push((i, s));
                continue;
            }
            let kind = s.kind;
            let owner = match &s.owner {
                SubmissionOwner::Run(run) => format!("run:{run}"),
                SubmissionOwner::Application { scope } => format!("scope:{scope}"),
            };
            let app = s.app.clone();
            match check_key_space(&s, None).and_then(|()| self.prepare(s)) {
                Ok(mut new) => {
                    new.trace_parent = span.trace_parent();
                    let next = groups.len();
                    let g = *group_of.entry((app, owner)).or_insert(next);
                    if g == next {
                        groups.push(Vec::new());
                    }
                    groups[g].push((i, kind, new));
                }
                Err(e) => {
                    let result = Err(e);
                    count_submit(kind, &result);
                    results[i] = Some(result);
                }
            }
        }
        let answered: Vec<Vec<(usize, Result<Submitted, EngineError>)>> =
            futures::stream::iter(groups)
                .map(|group| self.create_group(group, &span))
                .buffer_unordered(BATCH_PARALLELISM)
                .collect()
                .await;
        for (i, answer) in answered.into_iter().flatten() {
            results[i] = Some(answer);
        }
        for (i, s) in repeated {
            results[i] = Some(self.submit_keyed(s, None, Start::Queued).await);
        }
        Ok(results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(
                        InvalidInput::field("tasks", "internal error: an item got no answer")
                            .into(),
                    )
                })
            })
            .collect())
    }

    /// One owner's items through the store's batch creation, in order.
    async fn create_group(
        &self,
        group: Vec<(usize, TaskKind, NewTask)>,
        submit: &crate::TraceSpan,
    ) -> Vec<(usize, Result<Submitted, EngineError>)> {
        let admission = self.inner.traces.child(submit, "admission");
        let meta: Vec<(usize, TaskKind, bool)> = group
            .iter()
            .map(|(i, kind, new)| (*i, *kind, new.scope.is_some()))
            .collect();
        let news: Vec<NewTask> = group.into_iter().map(|(_, _, new)| new).collect();
        match self.inner.store.create_tasks(news).await {
            Ok(answers) => {
                let mut out = Vec::with_capacity(meta.len());
                for ((i, kind, scoped), answer) in meta.into_iter().zip(answers) {
                    let result = self.created(kind, scoped, answer);
                    crate::telemetry::record_admission(&admission, &result);
                    count_submit(kind, &result);
                    out.push((i, result));
                }
                out
            }
            // The database failed the whole call: every item of the group reports it.
            Err(e) => {
                let e = EngineError::from(e);
                meta.into_iter()
                    .map(|(i, kind, _)| {
                        let result = Err(e.copy_for_item());
                        count_submit(kind, &result);
                        (i, result)
                    })
                    .collect()
            }
        }
    }
}

/// docs/api.md, "Effect keys": a caller's key (`space` `None`) lies outside the engine's
/// namespaces; a key the engine made lies in the one it was made for.
fn check_key_space(
    submission: &Submission,
    space: Option<EngineKeySpace>,
) -> Result<(), EngineError> {
    let key = &submission.effect_key;
    match space {
        None => key
            .check_caller_key()
            .map_err(EngineError::ReservedEffectKey),
        Some(space) if key.engine_space() == Some(space) => Ok(()),
        Some(space) => Err(InvalidInput::field(
            "effect_key",
            format!(
                "{:?} is not a key of {} (they start with `{}`)",
                key.as_str(),
                space.owner(),
                space.prefix()
            ),
        )
        .into()),
    }
}

/// Submissions of one batch in flight at once.
const BATCH_PARALLELISM: usize = 8;

/// Counts one submission by kind and outcome.
fn count_submit(kind: TaskKind, result: &Result<Submitted, EngineError>) {
    let outcome = match result {
        Ok(s) if !s.created => "existing",
        Ok(s) if s.task.cached() => "cached",
        Ok(_) => "created",
        Err(EngineError::Admission(_) | EngineError::Cost(_)) => "rejected",
        Err(_) => "invalid",
    };
    metrics::counter!(m::SUBMITS_TOTAL, "kind" => kind.as_str(), "outcome" => outcome).increment(1);
}

/// How a submitted task may start (docs/engine.md, "Tasks claimed at creation").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// Created `queued`, as docs/conformance.md#creating-a-task inserts it; the dispatcher
    /// claims it.
    Queued,
    /// Its caller waits for its end (a door call, `POST /v1/tasks?wait=`): created claimed
    /// by this process's worker when its dispatcher is idle and a slot is free, else queued.
    AtOnce,
}
