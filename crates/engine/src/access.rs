//! What one caller may see and touch inside its app (docs/api.md, "Subjects"). A caller
//! bound to one subject ([`Visibility::Subject`]) sees only the tasks and runs done for
//! that subject: everything else of the app answers as if it did not exist (`None`, a run
//! not found, `false`, an empty page). Any other caller ([`Visibility::App`]) sees the
//! whole app's. Servers call the engine through a [`CallerView`], so the rule is applied
//! here once, not in each handler.

use crate::error::EngineError;
use crate::facade::{Start, Submission, SubmissionOwner, Submitted, TaskWaiter, Tollgate};
use crate::pipelines::{PipelineProgress, PipelineStart, StartedRun};
use std::time::Duration;
use tollgate_core::{
    AppId, EffectKey, EngineKeySpace, InvalidInput, Run, RunId, ScopeId, SourceId, Task, TaskId,
};
use tollgate_core::{Subject, Visibility};
use tollgate_store::{RunCancel, UnreleasedPage, UnreleasedQuery};

/// The engine as one authenticated caller sees it: its app, and within it what its
/// [`Visibility`] allows.
#[derive(Debug, Clone)]
pub struct CallerView {
    tollgate: Tollgate,
    app: AppId,
    visibility: Visibility,
}

impl Tollgate {
    /// The engine as a caller of `app` with `visibility` sees it.
    pub fn as_caller(&self, app: AppId, visibility: Visibility) -> CallerView {
        CallerView {
            tollgate: self.clone(),
            app,
            visibility,
        }
    }
}

impl CallerView {
    /// The caller's app.
    pub fn app(&self) -> &AppId {
        &self.app
    }

    /// What the caller may see.
    pub fn visibility(&self) -> &Visibility {
        &self.visibility
    }

    /// The engine behind the view.
    pub(crate) fn tollgate(&self) -> &Tollgate {
        &self.tollgate
    }

    fn sees(&self, subject: Option<&Subject>) -> bool {
        self.visibility.sees(subject)
    }

    /// What only a caller of the whole app may do (`what` says why not):
    /// [`EngineError::SubjectNotAllowed`] for a caller bound to a subject.
    pub(crate) fn no_subject(&self, what: &'static str) -> Result<(), EngineError> {
        match self.visibility {
            Visibility::App => Ok(()),
            Visibility::Subject(_) => Err(EngineError::SubjectNotAllowed(what)),
        }
    }

    /// The subject a listing is narrowed to: the caller's, when bound to one.
    pub(crate) fn subject_filter(&self) -> Option<Subject> {
        match &self.visibility {
            Visibility::App => None,
            Visibility::Subject(s) => Some(s.clone()),
        }
    }

    fn visible_task(&self, task: Option<Task>) -> Option<Task> {
        task.filter(|t| self.sees(t.subject.as_ref()))
    }

    fn visible_run(&self, run: Option<Run>) -> Option<Run> {
        run.filter(|r| self.sees(r.subject.as_ref()))
    }

    /// A replay answers an existing task only when the caller may see it (otherwise the
    /// effect key is taken by something the caller cannot see, and nothing of it shows),
    /// and only for the same submission.
    fn replay(
        &self,
        submission: &Submission,
        submitted: Submitted,
    ) -> Result<Submitted, EngineError> {
        if submitted.created {
            return Ok(submitted);
        }
        if !self.sees(submitted.task.subject.as_ref()) {
            return Err(EngineError::EffectKeyTaken);
        }
        self.tollgate.replayed(submission, submitted)
    }

    /// A task submitted into a run the caller cannot see is refused like a missing run.
    async fn check_owner(&self, submission: &Submission) -> Result<(), EngineError> {
        if let SubmissionOwner::Run(run) = submission.owner
            && matches!(self.visibility, Visibility::Subject(_))
            && self.get_run(run).await?.is_none()
        {
            return Err(EngineError::RunNotFound(run.to_string()));
        }
        Ok(())
    }

    /// [`Tollgate::submit`] in the caller's app; a replayed effect key of a task the
    /// caller cannot see is [`EngineError::EffectKeyTaken`], and one of a visible task
    /// that differs from this submission is [`EngineError::TaskConflict`] naming the field.
    pub async fn submit(&self, submission: Submission) -> Result<Submitted, EngineError> {
        self.submit_starting(submission, Start::Queued).await
    }

    /// [`CallerView::submit`] of a task the caller waits for (`POST /v1/tasks?wait=`):
    /// when this process's dispatcher is idle and a slot is free, the task is created
    /// claimed and starts at once (docs/engine.md, "Tasks claimed at creation"); its
    /// answer is then `running`, which a caller that waits does not see unless its wait
    /// ends first.
    pub async fn submit_awaited(&self, submission: Submission) -> Result<Submitted, EngineError> {
        self.submit_starting(submission, Start::AtOnce).await
    }

    async fn submit_starting(
        &self,
        mut submission: Submission,
        start: Start,
    ) -> Result<Submitted, EngineError> {
        submission.app = self.app.clone();
        self.check_owner(&submission).await?;
        let submitted = self
            .tollgate
            .submit_keyed(submission.clone(), None, start)
            .await?;
        self.replay(&submission, submitted)
    }

    /// [`CallerView::submit`] of a call through the OpenAI-compatible door: its key is
    /// the door's (`openai-<Idempotency-Key>`, [`EngineKeySpace::OpenAiDoor`]), a
    /// namespace [`CallerView::submit`] refuses (docs/openai.md, "Headers"). A task it
    /// creates is released in the same write (see [`NewTask::released`](tollgate_core::NewTask::released)).
    pub async fn submit_door_call(
        &self,
        mut submission: Submission,
    ) -> Result<Submitted, EngineError> {
        submission.app = self.app.clone();
        self.check_owner(&submission).await?;
        let submitted = self
            .tollgate
            .submit_keyed(
                submission.clone(),
                Some(EngineKeySpace::OpenAiDoor),
                Start::AtOnce,
            )
            .await?;
        self.replay(&submission, submitted)
    }

    /// [`Tollgate::submit_many`], each item judged like [`CallerView::submit`].
    pub async fn submit_many(
        &self,
        submissions: Vec<Submission>,
    ) -> Result<Vec<Result<Submitted, EngineError>>, EngineError> {
        let mut allowed = Vec::with_capacity(submissions.len());
        let mut refused = Vec::with_capacity(submissions.len());
        for mut s in submissions {
            s.app = self.app.clone();
            match self.check_owner(&s).await {
                Ok(()) => {
                    refused.push(None);
                    allowed.push(s);
                }
                Err(e) => refused.push(Some(e)),
            }
        }
        let mut answers = self
            .tollgate
            .submit_many_unjudged(allowed.clone())
            .await?
            .into_iter()
            .zip(allowed);
        Ok(refused
            .into_iter()
            .map(|r| match r {
                Some(e) => Err(e),
                None => match answers.next() {
                    Some((answer, submission)) => answer.and_then(|s| self.replay(&submission, s)),
                    None => Err(InvalidInput::field("tasks", "an item got no answer").into()),
                },
            })
            .collect())
    }

    /// A visible task by id.
    pub async fn get(&self, id: TaskId) -> Result<Option<Task>, EngineError> {
        Ok(self.visible_task(self.tollgate.get(&self.app, id).await?))
    }

    /// The attempts of a task the caller sees (read it with [`get`](Self::get) first).
    pub async fn attempts(&self, task: &Task) -> Result<Vec<tollgate_core::Attempt>, EngineError> {
        if self.visible_task(Some(task.clone())).is_none() {
            return Ok(Vec::new());
        }
        self.tollgate.attempts(&self.app, task.id).await
    }

    /// A visible task by effect key.
    pub async fn get_by_effect_key(&self, key: &EffectKey) -> Result<Option<Task>, EngineError> {
        Ok(self.visible_task(self.tollgate.get_by_effect_key(&self.app, key).await?))
    }

    /// [`Tollgate::wait`] on a visible task (a task's subject never changes).
    pub async fn wait(&self, id: TaskId, timeout: Duration) -> Result<Option<Task>, EngineError> {
        if self.get(id).await?.is_none() {
            return Ok(None);
        }
        Ok(self.visible_task(self.tollgate.wait(&self.app, id, timeout).await?))
    }

    /// [`Tollgate::events`] of a visible task (a task's subject never changes).
    pub async fn events(
        &self,
        id: TaskId,
    ) -> Result<Option<crate::stream::TaskEvents>, EngineError> {
        if self.get(id).await?.is_none() {
            return Ok(None);
        }
        self.tollgate.events(&self.app, id).await
    }

    /// [`TaskWaiter::events_of`] a task this caller just submitted or read (`known`): no
    /// read to start from; the waiter's slot (taken before submitting) is the reader's.
    /// `None`: not visible to this caller.
    pub async fn events_known(
        &self,
        waiter: TaskWaiter,
        known: &Task,
    ) -> Result<Option<crate::stream::TaskEvents>, EngineError> {
        let Some(known) = self.visible_task(Some(known.clone())) else {
            return Ok(None);
        };
        if known.app != self.app {
            return Ok(None);
        }
        waiter.events_of(known).await
    }

    /// [`Tollgate::waiter`]: make it before submitting or reading the task to wait on.
    pub fn waiter(&self) -> TaskWaiter {
        self.tollgate.waiter()
    }

    /// [`Tollgate::waiter_for`] the caller's app: take it before submitting a task to wait
    /// on, so a call refused for want of a waiter slot submitted nothing.
    pub fn waiter_with_slot(&self) -> Result<TaskWaiter, EngineError> {
        self.tollgate.waiter_for(&self.app)
    }

    /// [`TaskWaiter::wait`] from a task this caller just submitted or read through this
    /// view after `waiter` was made (`known`): no read to check that it is visible, none to
    /// start from, and none at its end when this process's worker ends it. `None`: not
    /// visible to this caller, or deleted meanwhile.
    pub async fn wait_known(
        &self,
        waiter: TaskWaiter,
        known: Task,
        timeout: Duration,
    ) -> Result<Option<Task>, EngineError> {
        let Some(known) = self.visible_task(Some(known)) else {
            return Ok(None);
        };
        let id = known.id;
        Ok(self.visible_task(waiter.wait(&self.app, id, Some(known), timeout).await?))
    }

    /// [`Tollgate::cancel`] of a visible task.
    pub async fn cancel(&self, id: TaskId) -> Result<Option<Task>, EngineError> {
        if self.get(id).await?.is_none() {
            return Ok(None);
        }
        self.tollgate.cancel(&self.app, id).await
    }

    /// [`Tollgate::release`] of a visible application task.
    pub async fn release(&self, scope: &ScopeId, key: &EffectKey) -> Result<bool, EngineError> {
        if matches!(self.visibility, Visibility::Subject(_))
            && self.get_by_effect_key(key).await?.is_none()
        {
            return Ok(false);
        }
        self.tollgate.release(&self.app, scope, key).await
    }

    /// [`Tollgate::list_unreleased_sources`]: a caller bound to a subject sees only the
    /// pairs with tasks done for it.
    pub async fn list_unreleased_sources(
        &self,
        query: &UnreleasedQuery,
    ) -> Result<UnreleasedPage, EngineError> {
        let mut query = query.clone();
        if let Some(s) = self.subject_filter() {
            query.subject = Some(s);
        }
        self.tollgate
            .list_unreleased_sources(&self.app, &query)
            .await
    }

    /// [`Tollgate::delete_owner_data`]: deleting a scope's data acts on every subject's
    /// tasks, so a caller bound to one subject may not ([`EngineError::SubjectNotAllowed`]).
    pub async fn delete_owner_data(
        &self,
        scope: &ScopeId,
        source: Option<&SourceId>,
    ) -> Result<u64, EngineError> {
        self.no_subject(
            "a key bound to a subject may not delete a scope's tasks: use a key of the app",
        )?;
        self.tollgate
            .delete_owner_data(&self.app, scope, source)
            .await
    }

    /// A visible run by id.
    pub async fn get_run(&self, id: RunId) -> Result<Option<Run>, EngineError> {
        Ok(self.visible_run(self.tollgate.get_run(&self.app, id).await?))
    }

    /// [`Tollgate::wait_run`] on a visible run.
    pub async fn wait_run(&self, id: RunId, timeout: Duration) -> Result<Option<Run>, EngineError> {
        if self.get_run(id).await?.is_none() {
            return Ok(None);
        }
        Ok(self.visible_run(self.tollgate.wait_run(&self.app, id, timeout).await?))
    }

    /// [`Tollgate::cancel_run`] of a visible run.
    pub async fn cancel_run(&self, id: RunId) -> Result<Option<RunCancel>, EngineError> {
        if self.get_run(id).await?.is_none() {
            return Ok(None);
        }
        self.tollgate.cancel_run(&self.app, id).await
    }

    /// [`Tollgate::pipeline_run`] of a visible run.
    pub async fn pipeline_run(&self, run: &Run) -> Result<Option<PipelineProgress>, EngineError> {
        if run.app != self.app || !self.sees(run.subject.as_ref()) {
            return Ok(None);
        }
        self.tollgate.pipeline_run(run).await
    }

    /// [`Tollgate::start_pipeline`] in the caller's app; a replayed start key of a run the
    /// caller cannot see is [`EngineError::EffectKeyTaken`], and one of a visible run
    /// started differently is [`EngineError::RunConflict`] naming the field.
    pub async fn start_pipeline(
        &self,
        mut start: PipelineStart,
    ) -> Result<Option<StartedRun>, EngineError> {
        start.app = self.app.clone();
        let started = self.tollgate.start_pipeline(start.clone()).await?;
        match started {
            Some(s) if !s.created => {
                if !self.sees(s.run.subject.as_ref()) {
                    return Err(EngineError::EffectKeyTaken);
                }
                self.tollgate.check_same_start(&start, &s.run).await?;
                Ok(Some(s))
            }
            other => Ok(other),
        }
    }
}
