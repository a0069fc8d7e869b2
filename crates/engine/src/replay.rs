//! docs/conformance.md#create-idempotency over an idempotency key: a replay answers what the key already names,
//! only for the same submission ([`Tollgate::submit`], and every caller through it) or
//! start (a [`CallerView`](crate::CallerView)'s), and [`EngineError::TaskConflict`] /
//! [`EngineError::RunConflict`] naming the first field that differs otherwise. The one
//! statement of "the same".

use crate::error::{ConflictField, EngineError};
use crate::facade::{Submission, SubmissionOwner, Submitted, Tollgate};
use crate::pipelines::PipelineStart;
use serde_json::Value;
use tollgate_core::{Run, Task, TaskOwner, ValidatedRequest};

impl Tollgate {
    /// The first field in which `submission` differs from `task`, the task its effect
    /// key already names; defaults are resolved as [`Tollgate::submit`] resolves them.
    pub(crate) fn submission_differs(
        &self,
        submission: &Submission,
        task: &Task,
    ) -> Result<Option<ConflictField>, EngineError> {
        if task.kind != submission.kind {
            return Ok(Some(ConflictField::Kind));
        }
        if task.step != submission.resolved_step()? {
            return Ok(Some(ConflictField::Step));
        }
        let model = self.inner.models.resolve(submission.model.as_ref())?;
        if task.model != model.id {
            return Ok(Some(ConflictField::Model));
        }
        let same_owner = match (&submission.owner, task.owner) {
            (SubmissionOwner::Application { scope }, TaskOwner::Application) => {
                *scope == task.scope
            }
            (SubmissionOwner::Run(run), TaskOwner::Run { run_id }) => *run == run_id,
            _ => false,
        };
        if !same_owner {
            return Ok(Some(ConflictField::Owner));
        }
        let same_source = match (&submission.source, &task.source) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                a.id == b.id && a.revision == b.revision && a.recompute == b.recompute
            }
            _ => false,
        };
        if !same_source {
            return Ok(Some(ConflictField::Source));
        }
        let request = ValidatedRequest::new(submission.kind, &submission.request, usize::MAX)?;
        if request.input_hash() != task.input_hash {
            return Ok(Some(ConflictField::Request));
        }
        Ok(None)
    }

    /// `submitted` as the answer to `submission`: a new task as it is, a replayed one only
    /// when it is what `submission` asks for ([`EngineError::TaskConflict`] otherwise).
    pub(crate) fn replayed(
        &self,
        submission: &Submission,
        submitted: Submitted,
    ) -> Result<Submitted, EngineError> {
        if !submitted.created {
            self.check_same_submission(submission, &submitted.task)?;
        }
        Ok(submitted)
    }

    /// [`EngineError::TaskConflict`] when `task` (named by the submission's key) is not
    /// what `submission` asks for.
    pub(crate) fn check_same_submission(
        &self,
        submission: &Submission,
        task: &Task,
    ) -> Result<(), EngineError> {
        match self.submission_differs(submission, task)? {
            None => Ok(()),
            Some(field) => Err(EngineError::TaskConflict {
                effect_key: task.effect_key.clone(),
                task: task.id,
                field,
            }),
        }
    }

    /// [`EngineError::RunConflict`] when `run` (started under the start's key) was not
    /// started by the same pipeline, version, scope and input.
    pub(crate) async fn check_same_start(
        &self,
        start: &PipelineStart,
        run: &Run,
    ) -> Result<(), EngineError> {
        let pipeline = self.inner.store.run_pipeline(&run.app, run.id).await?;
        let version = start.version.as_deref();
        let field = match pipeline {
            Some(p) if p.name != start.name => Some(ConflictField::Pipeline),
            Some(p) if version.is_some_and(|v| v != p.version) => Some(ConflictField::Version),
            None => Some(ConflictField::Pipeline),
            Some(_) if run.scope != start.scope => Some(ConflictField::Scope),
            Some(_) if !same_json(&run.input, &start.input) => Some(ConflictField::Input),
            Some(_) => None,
        };
        match field {
            None => Ok(()),
            Some(field) => Err(EngineError::RunConflict { run: run.id, field }),
        }
    }
}

/// Equal as stored: the canonical forms (key order and number spelling aside).
fn same_json(a: &Value, b: &Value) -> bool {
    use tollgate_core::canonical::canonical_json;
    match (canonical_json(a), canonical_json(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}
