//! One execution: the task's attempts (docs/routes.md, "Attempts"), each recorded from
//! its beginning to its end, a later one reserved before its call and made after a
//! transient failure while the task has tries left; in each attempt the provider called,
//! its output validated and re-asked as configured (each re-ask reserved first), the
//! calls' usage counted and priced; the end handed to [`complete`](super::complete) to
//! record.

use super::WorkerPool;
use super::attempts::{deployment_name, is_transient};
use super::complete::retry_unavailable;
use crate::cost::{TokenCounter, attempt_input_tokens, output_bound, reask_error};
use crate::cpu;
use crate::metrics as m;
use crate::provider::{Provider, ProviderCall, ProviderError};
use futures::FutureExt;
use serde_json::Value;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_core::attempt::{may_try_again, retry_backoff};
use tollgate_core::{
    ErrorCode, OutputTooLarge, OutputViolation, Prices, Reservation, Task, TaskRequest, Usage,
    ValidatedRequest, check_output_size, validate_output,
};
use tollgate_store::StoreError;

/// Why an execution ended without an output.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) code: ErrorCode,
    pub(super) message: String,
    /// docs/conformance.md#money-and-tokens: what the attempts used, when every attempt reported it (`None`: unknown,
    /// and a started task is then charged its whole reservation).
    pub(super) usage: Option<Usage>,
    /// A transient provider failure (docs/routes.md, "Attempts"): the next attempt may
    /// follow while the task has tries left.
    pub(super) transient: bool,
}

impl Failure {
    pub(super) fn new(code: ErrorCode, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
            usage: None,
            transient: false,
        }
    }

    pub(super) fn with_usage(mut self, usage: Usage) -> Failure {
        self.usage = Some(usage);
        self
    }
}

/// How an execution ended.
enum Ended {
    Done(Result<(Value, Usage), Failure>),
    /// The store or a notification said to stop (canceled, expired, deleted).
    Stopped,
    /// Shutdown's deadline passed.
    Interrupted,
}

impl WorkerPool {
    /// Runs the task, frees its execution slot as soon as the execution has ended, then
    /// records the end. The slot bounds concurrent executions (provider calls); while a
    /// completion waits for its batch's commit the next task may already run, which is
    /// what lets completions and claims batch under load. The task stays held (and
    /// heartbeated) until its end is recorded.
    pub(super) async fn execute_and_record(
        self: Arc<Self>,
        task: Arc<Task>,
        permit: OwnedSemaphorePermit,
    ) {
        let stop = CancellationToken::new();
        self.held().insert(task.id, stop.clone());
        let started = Instant::now();
        let interrupt = self.control.interrupt.clone();
        // The task's reservation as it grows with each re-ask (docs/budgets.md).
        let mut reservation = task.reservation;
        let trace = self.inner.traces.execution(&task, self.worker.as_str());
        let ended = tokio::select! {
            biased;
            _ = stop.cancelled() => Ended::Stopped,
            _ = interrupt.cancelled() => Ended::Interrupted,
            // docs/engine.md, "Workers": a panicking execution fails its task at once.
            result = AssertUnwindSafe(self.execute(&task, &mut reservation, &trace)).catch_unwind() => match result {
                Ok(result) => Ended::Done(result),
                Err(panic) => {
                    let message = cpu::panic_message(&*panic);
                    tracing::error!(task = %task.id, %message, "the execution panicked");
                    Ended::Done(Err(Failure::new(
                        ErrorCode::Interrupted,
                        format!("the execution panicked: {message}"),
                    )))
                }
            },
        };
        drop(permit);
        self.slot_freed.notify_one();
        let ended = match ended {
            // The task was canceled, deleted or finished before its re-ask was reserved.
            Ended::Done(Err(f)) if f.code == ErrorCode::Canceled => Ended::Stopped,
            other => other,
        };
        let r = reservation.as_ref();
        let settle = self.inner.traces.child(&trace, "settle");
        let (outcome, code) = match ended {
            Ended::Done(Ok((output, usage))) => self.complete(&task, r, output, usage).await,
            Ended::Done(Err(failure)) => {
                tracing::info!(task = %task.id, code = %failure.code, message = %failure.message, "task failed");
                self.fail(&task, r, failure).await
            }
            Ended::Stopped => {
                tracing::info!(task = %task.id, "execution stopped: task canceled, expired or deleted");
                // Acknowledge a requested cancellation (a no-op when already canceled).
                match self.inner.store.mark_canceled(task.id).await {
                    Ok(t) => self.inner.publish_transition(&t),
                    Err(e) => tracing::debug!(error = %e, "mark_canceled failed"),
                }
                ("aborted", "none")
            }
            Ended::Interrupted => {
                let failure = Failure::new(
                    ErrorCode::Interrupted,
                    "the worker shut down before the task finished",
                );
                let (_, code) = self.fail(&task, r, failure).await;
                ("interrupted", code)
            }
        };
        crate::telemetry::record_settle(&settle, outcome, code);
        metrics::counter!(m::TASK_OUTCOMES_TOTAL, "outcome" => outcome, "code" => code)
            .increment(1);
        metrics::histogram!(m::TASK_EXECUTION_SECONDS, "kind" => task.kind.as_str())
            .record(started.elapsed().as_secs_f64());
        self.held().remove(&task.id);
    }

    /// The task's attempts (docs/routes.md, "Attempts"): each begun in the store before
    /// its call and ended after it; a later attempt (also the first of this execution
    /// after a requeue) reserves its worst case before its call, and a refusal ends the
    /// task with `WORKFLOW_AI_SPEND_BUDGET`. A transient failure is followed by the next
    /// attempt, after a short backoff, while the task has tries left; the last error
    /// ends it otherwise. The usage returned is this execution's attempts', summed.
    async fn execute(
        &self,
        task: &Task,
        reservation: &mut Option<Reservation>,
        trace: &crate::TraceSpan,
    ) -> Result<(Value, Usage), Failure> {
        let request = task.parsed_request().map_err(|e| {
            Failure::new(
                ErrorCode::InvalidRequest,
                format!("the stored request cannot be read: {e}"),
            )
        })?;
        let provider_name = task.model_ref.provider.as_str();
        let provider = self.inner.providers.get(provider_name).ok_or_else(|| {
            Failure::new(
                ErrorCode::ProviderError,
                format!("provider `{provider_name}` is not configured in this process"),
            )
        })?;
        let deployment = deployment_name(&task.model_ref);
        // What this execution's ended attempts used (`None` once one did not report it).
        let mut spent = Some(Usage::default());
        loop {
            let n = self.begin_attempt(task, &deployment).await?;
            let result = if n > 1 {
                match self.reserve_next(task, &request, reservation).await {
                    Ok(()) => self.attempt(task, &request, provider, reservation, trace).await,
                    Err(refused) => Err(refused.with_usage(Usage::default())),
                }
            } else {
                self.attempt(task, &request, provider, reservation, trace).await
            };
            self.end_attempt(task, n, &result).await;
            match result {
                Ok((output, used)) => {
                    let total = spent.map_or(used, |s| s.plus(&used));
                    return Ok((output, total));
                }
                Err(f) if f.transient && may_try_again(n, task.max_attempts) => {
                    spent = spent.zip(f.usage).map(|(s, u)| s.plus(&u));
                    let wait = retry_backoff(n + 1);
                    tracing::info!(task = %task.id, attempt = n, code = %f.code, message = %f.message, ?wait, "transient failure: the next attempt follows");
                    tokio::time::sleep(wait).await;
                }
                Err(mut f) => {
                    f.usage = spent.zip(f.usage).map(|(s, u)| s.plus(&u));
                    return Err(f);
                }
            }
        }
    }

    /// docs/budgets.md, "The reservation": a later attempt reserves its first call
    /// before it is made, counted as it will be sent.
    async fn reserve_next(
        &self,
        task: &Task,
        request: &ValidatedRequest,
        reservation: &mut Option<Reservation>,
    ) -> Result<(), Failure> {
        let schema = request.request().output_schema();
        let call = ProviderCall {
            model: &task.model_ref,
            request: request.request(),
            output_schema: &schema,
            previous_error: None,
            max_output_bytes: self.inner.config.max_output_bytes,
        };
        let counter = TokenCounter::for_model_ref(&self.inner.config, &task.model_ref);
        self.reserve_call(task, counter, &call, reservation, "the next attempt")
            .await
    }

    /// One attempt: calls the provider, validating and re-asking as configured. Each re-ask is
    /// reserved before it is made (`reservation` grows with it; docs/budgets.md, "The
    /// reservation"); a re-ask that does not fit ends the task with
    /// `WORKFLOW_AI_SPEND_BUDGET`, its spent calls settled.
    async fn attempt(
        &self,
        task: &Task,
        request: &ValidatedRequest,
        provider: &Arc<dyn Provider>,
        reservation: &mut Option<Reservation>,
        trace: &crate::TraceSpan,
    ) -> Result<(Value, Usage), Failure> {
        let provider_name = task.model_ref.provider.as_str();
        let schema = request.request().output_schema();
        let max_retries = self.inner.config.workers.max_output_retries;
        let max_output_bytes = self.inner.config.max_output_bytes;
        let mut usage = Usage::default();
        let mut previous: Option<String> = None;
        let counter = TokenCounter::for_model_ref(&self.inner.config, &task.model_ref);
        for attempt in 0..=max_retries {
            let call = ProviderCall {
                model: &task.model_ref,
                request: request.request(),
                output_schema: &schema,
                previous_error: previous.as_deref(),
                max_output_bytes,
            };
            if attempt > 0 {
                if let Err(failure) = self
                    .reserve_call(task, counter, &call, reservation, "its re-ask")
                    .await
                {
                    return Err(failure.with_usage(self.priced(task, usage)));
                }
                metrics::counter!(m::OUTPUT_REASKS_TOTAL, "kind" => task.kind.as_str())
                    .increment(1);
            }
            let started = Instant::now();
            let span = self
                .inner
                .traces
                .provider_call(&self.inner.config, trace, task, attempt);
            let answer = provider.complete(call).await;
            metrics::histogram!(m::PROVIDER_LATENCY_SECONDS, "provider" => provider_name.to_string())
                .record(started.elapsed().as_secs_f64());
            let (output, used, refused) = match answer {
                Ok(a) => (Some(a.output), a.usage, None),
                Err(ProviderError::InvalidOutput { message, usage }) => {
                    (None, usage, Some(reask_error(message)))
                }
                Err(e @ (ProviderError::Failed(_) | ProviderError::Unavailable { .. })) => {
                    span.error(e.to_string());
                    provider_call(provider_name, "error");
                    let transient = is_transient(&e);
                    let mut failure = Failure::new(ErrorCode::ProviderError, e.to_string());
                    failure.transient = transient;
                    // The calls before this one reported their usage; this one's is
                    // unknown, so the attempt is charged its reservation.
                    return Err(failure);
                }
                Err(ProviderError::OutputTooLarge(message)) => {
                    span.error(message.clone());
                    provider_call(provider_name, "too_large");
                    return Err(Failure::new(ErrorCode::OutputTooLarge, message));
                }
            };
            let used = attempt_usage(task, counter, &call, used);
            self.inner
                .traces
                .call_answered(span, task, output.as_ref(), || self.priced(task, used));
            if let Some(refused) = refused {
                previous = Some(refused);
            }
            add_usage(&mut usage, used, provider_name);
            if let Some(output) = output {
                let check = self.inner.traces.child(trace, "validate");
                let checked = check_output(request.request(), output, max_output_bytes).await?;
                check.set(crate::telemetry::attr::OUTPUT_VALID, checked.is_ok());
                match checked {
                    Ok(valid) => {
                        provider_call(provider_name, "ok");
                        return Ok((valid, self.priced(task, usage)));
                    }
                    Err(violation) => previous = Some(reask_error(violation.0)),
                }
            }
            provider_call(provider_name, "invalid_output");
            tracing::debug!(task = %task.id, attempt, error = ?previous, "invalid model output");
        }
        // Every attempt reported its usage: a failed task is charged what it used.
        Err(Failure::new(
            ErrorCode::InvalidModelOutput,
            format!(
                "the model's output was invalid {} time(s); last: {}",
                max_retries + 1,
                previous.unwrap_or_default()
            ),
        )
        .with_usage(self.priced(task, usage)))
    }

    /// docs/budgets.md, "The reservation": reserves `call` (a re-ask or a later
    /// attempt's first call, `what` in messages; its input counted exactly as it will be
    /// sent) before it is made, through the store, with the same exactness as admission.
    /// Tasks without a bounded reservation reserve nothing.
    async fn reserve_call(
        &self,
        task: &Task,
        counter: TokenCounter,
        call: &ProviderCall<'_>,
        reservation: &mut Option<Reservation>,
        what: &str,
    ) -> Result<(), Failure> {
        let Some(current) = reservation.filter(|r| r.bounded) else {
            return Ok(());
        };
        let Some(output) = output_bound(call.model, call.request) else {
            return Ok(());
        };
        let input = attempt_input_tokens(counter, call);
        let attempt = tollgate_core::cost::attempt_reservation(input, output, current.prices);
        let store = &self.inner.store;
        match retry_unavailable(|| store.reserve_attempt(task.id, &self.worker, &attempt)).await {
            Ok(Some(after)) => {
                *reservation = Some(after);
                if attempt.nano_usd > 0 {
                    metrics::counter!(m::SPEND_RESERVED_TOTAL, "app" => task.app.to_string())
                        .increment(attempt.nano_usd as u64);
                }
                Ok(())
            }
            Ok(None) => Err(Failure::new(
                ErrorCode::Canceled,
                format!("the task was canceled, deleted or finished before {what}"),
            )),
            Err(StoreError::Cost(c)) => Err(Failure::new(
                ErrorCode::SpendBudget,
                format!("{what} does not fit: {c}"),
            )),
            Err(e) => Err(Failure::new(
                ErrorCode::ProviderError,
                format!("cannot reserve {what}: {e}"),
            )),
        }
    }

    /// docs/conformance.md#cost-reservation: `cost_usd` of a usage at the task's prices (those it was reserved at, or
    /// the model's for a task that reserved nothing); an unpriced model's is `None`
    /// (unknown, `priced: false`) whatever its provider reported.
    fn priced(&self, task: &Task, mut usage: Usage) -> Usage {
        usage.cost_usd = self
            .prices(task)
            .map(|p| tollgate_core::cost::nano_to_usd(p.cost_nano(&usage)));
        usage
    }

    /// The task's prices: those it was reserved at, or the model's for a task that
    /// reserved nothing (`None`: unpriced).
    pub(super) fn prices(&self, task: &Task) -> Option<Prices> {
        task.reservation.and_then(|r| r.prices).or_else(|| {
            self.inner
                .models
                .resolve(Some(&task.model))
                .ok()
                .and_then(|m| m.prices)
        })
    }
}

/// The output limit, then the kind's contract (`validate_output`), off the async runtime
/// unless small (a large output or a complex schema takes real CPU; see `cpu::is_small`). `Err`: the task fails
/// (`output_too_large`); `Ok(Err)`: the output breaks the contract (asked again).
async fn check_output(
    request: &TaskRequest,
    output: Value,
    max_output_bytes: usize,
) -> Result<Result<Value, OutputViolation>, Failure> {
    let checked = if cpu::is_small(request, Some(&output)) {
        cpu::inline(None, |_| checked_output(request, &output, max_output_bytes))
    } else {
        let request = request.clone();
        cpu::run(None, move |_| {
            checked_output(&request, &output, max_output_bytes)
        })
        .await
    };
    let checked = checked.map_err(|panic| {
        Failure::new(
            ErrorCode::ProviderError,
            format!("checking the output failed: {panic}"),
        )
    })?;
    checked.map_err(|e: OutputTooLarge| {
        Failure::new(ErrorCode::OutputTooLarge, format!("the model's {e}"))
    })
}

/// [`check_output`]'s work, wherever it runs.
fn checked_output(
    request: &TaskRequest,
    output: &Value,
    max_output_bytes: usize,
) -> Result<Result<Value, OutputViolation>, OutputTooLarge> {
    check_output_size(output, max_output_bytes)?;
    let valid = validate_output(request, output);
    // The normalized output is what is stored: it must fit too.
    if let Ok(v) = &valid {
        check_output_size(v, max_output_bytes)?;
    }
    Ok(valid)
}

fn provider_call(provider: &str, outcome: &'static str) {
    metrics::counter!(m::PROVIDER_CALLS_TOTAL, "provider" => provider.to_string(), "outcome" => outcome)
        .increment(1);
}

/// docs/budgets.md, "Settlement": what one attempt is counted as. A provider that
/// reported no usage is counted at the attempt's bound (its input as sent, its output
/// bound: never less than could have been billed) and flagged `estimated`; absurd usage
/// is clamped to `MAX_REPORTED_TOKENS` and logged (the excess over the reservation is
/// settled as overrun).
fn attempt_usage(
    task: &Task,
    counter: TokenCounter,
    call: &ProviderCall<'_>,
    used: Usage,
) -> Usage {
    let used = if used.estimated {
        let input = attempt_input_tokens(counter, call);
        let output = output_bound(call.model, call.request).unwrap_or(0);
        tracing::warn!(
            task = %task.id, provider = %call.model.provider, input_tokens = input, output_tokens = output,
            "the provider reported no usage: the attempt is counted at its bound"
        );
        Usage {
            input_tokens: input,
            output_tokens: output,
            cached_input_tokens: None,
            cache_write_input_tokens: None,
            ..used
        }
    } else {
        used
    };
    let (clamped, absurd) = used.clamped();
    if absurd {
        tracing::warn!(
            task = %task.id, provider = %call.model.provider,
            input_tokens = used.input_tokens, output_tokens = used.output_tokens,
            "the provider reported absurd usage: clamped to {} tokens",
            tollgate_core::MAX_REPORTED_TOKENS
        );
    }
    clamped
}

fn add_usage(total: &mut Usage, used: Usage, provider: &str) {
    *total = total.plus(&used);
    metrics::counter!(m::PROVIDER_TOKENS_TOTAL, "provider" => provider.to_string(), "direction" => "input")
        .increment(used.input_tokens);
    metrics::counter!(m::PROVIDER_TOKENS_TOTAL, "provider" => provider.to_string(), "direction" => "output")
        .increment(used.output_tokens);
}
