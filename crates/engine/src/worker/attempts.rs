//! Recording attempts (docs/routes.md, "Attempts"): an attempt begins in the store
//! before a deployment's call ([`WorkerPool::begin_attempt`]) and ends after it
//! ([`WorkerPool::end_attempt`]) with its outcome, usage and error; whether a failure is
//! transient (the next attempt may follow) is [`is_transient`].

use super::WorkerPool;
use super::complete::retry_unavailable;
use super::execute::Failure;
use crate::metrics as m;
use crate::provider::ProviderError;
use serde_json::Value;
use tollgate_core::{AttemptOutcome, ErrorCode, ModelRef, Task, TaskError, Usage};
use tollgate_store::AttemptEnd;

/// The name an attempt records for the deployment it went to: `provider/model`. A task's
/// model resolves to one deployment today; routes of several deployments name each
/// their own (their `Deployment::name`, which replaces this).
pub(super) fn deployment_name(model: &ModelRef) -> String {
    format!("{}/{}", model.provider, model.model)
}

/// Whether a provider error is transient: the provider said it is unavailable for now
/// ([`ProviderError::Unavailable`]: 429, 5xx, a timeout or a dropped connection after
/// the provider's own retries, or a wait longer than `max_retry_delay`). Another attempt
/// may then succeed; any other error (a refused request, a misconfiguration) would fail
/// again.
pub(super) fn is_transient(error: &ProviderError) -> bool {
    matches!(error, ProviderError::Unavailable { .. })
}

impl WorkerPool {
    /// Begins the task's next attempt on `deployment` and returns its number. A task no
    /// longer running under this worker (canceled, deleted, finished, requeued) stops
    /// (`Canceled`, acknowledged as such).
    pub(super) async fn begin_attempt(
        &self,
        task: &Task,
        deployment: &str,
    ) -> Result<u32, Failure> {
        let store = &self.inner.store;
        match retry_unavailable(|| store.begin_attempt(task.id, &self.worker, deployment)).await {
            Ok(Some(n)) => Ok(n),
            Ok(None) => Err(Failure::new(
                ErrorCode::Canceled,
                "the task was canceled, deleted or finished before its attempt",
            )),
            Err(e) => Err(Failure::new(
                ErrorCode::ProviderError,
                format!("cannot record the attempt: {e}"),
            )),
        }
    }

    /// Ends attempt `n` with what `result` says: its usage (an attempt that failed
    /// without one is charged its reservation), outcome and error. A failure to record
    /// is logged: the attempt then ends with its task, charged its reservation.
    pub(super) async fn end_attempt(
        &self,
        task: &Task,
        n: u32,
        result: &Result<(Value, Usage), Failure>,
    ) {
        let end = match result {
            Ok((_, usage)) => AttemptEnd {
                outcome: AttemptOutcome::Succeeded,
                usage: Some(*usage),
                prices: self.prices(task),
                error: None,
            },
            Err(f) => AttemptEnd {
                outcome: if f.transient {
                    AttemptOutcome::Unavailable
                } else {
                    AttemptOutcome::of_error(f.code)
                },
                usage: f.usage,
                prices: self.prices(task),
                error: Some(TaskError::new(f.code, &f.message)),
            },
        };
        let store = &self.inner.store;
        match retry_unavailable(|| store.end_attempt(task.id, n, &end)).await {
            Ok(true) => {
                metrics::counter!(m::ATTEMPTS_TOTAL, "outcome" => end.outcome.as_str())
                    .increment(1);
            }
            Ok(false) => {
                tracing::info!(task = %task.id, attempt = n, "the attempt was ended already (the task ended or went back to the queue)");
            }
            Err(e) => {
                tracing::warn!(task = %task.id, attempt = n, error = %e, "cannot record the attempt's end; it ends with its task");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_given_up_retryable_answers_are_transient() {
        assert!(is_transient(&ProviderError::Unavailable {
            message: "HTTP 503 Service Unavailable: busy (gave up after 3 attempts)".into(),
            retry_after: None,
        }));
        assert!(!is_transient(&ProviderError::Failed(
            "HTTP 400 Bad Request: no".into()
        )));
        assert!(!is_transient(&ProviderError::OutputTooLarge("big".into())));
        assert_eq!(
            deployment_name(&ModelRef::new("openai", "gpt-x")),
            "openai/gpt-x"
        );
    }
}
