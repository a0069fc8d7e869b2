//! One deployment's turn in an execution ([`WorkerPool::attempt`]): its provider call
//! (bounded by the route's `attempt_timeout`), the output checked and re-asked on the
//! same deployment as configured, every call's usage counted and priced at the
//! deployment's prices; and the route's cooldowns, shared by every replica through the
//! store's pace rows (docs/routes.md).

use super::WorkerPool;
use super::complete::retry_unavailable;
use super::execute::Failure;
use crate::TraceSpan;
use crate::cost::{TokenCounter, attempt_input_tokens, output_bound, reask_error};
use crate::cpu;
use crate::metrics as m;
use crate::provider::{ProviderCall, ProviderError};
use serde_json::Value;
use std::time::Duration;
use tokio::time::Instant;
use tollgate_core::{
    Deployment, ErrorCode, OutputTooLarge, OutputViolation, Prices, Reservation, Route, Task,
    TaskRequest, Usage, check_output_size, validate_output,
};
use tollgate_store::StoreError;

/// How one deployment's turn ended, when it did not end the task.
#[derive(Debug)]
pub(super) enum Attempted {
    /// A valid output.
    Valid(Value),
    /// The deployment is unavailable (429, 5xx, timeout, connection error): the route
    /// moves on.
    Unavailable {
        message: String,
        retry_after: Option<Duration>,
    },
}

/// What an execution has spent so far: its calls, and their usage, priced.
#[derive(Debug, Default)]
pub(super) struct Spent {
    /// Provider calls made (the first was reserved at admission; every later one is
    /// reserved before it is made).
    pub(super) calls: u32,
    /// Every call's usage, each priced at its deployment's prices.
    pub(super) usage: Usage,
}

/// The store key of a deployment's cooldown: a pause on its own pace row.
fn cooldown_key(deployment: &Deployment) -> String {
    format!("cooldown:{}", deployment.name())
}

impl WorkerPool {
    /// Deployment `index` of `route`: one provider call, re-asked on the same deployment
    /// while the output is invalid (at most `workers.max_output_retries` times). Every
    /// call is reserved before it is made, at this deployment's prices, but the task's
    /// first (`covered`: reserved at admission, when `spent.calls` is 0). `spent` gathers every call and its usage, priced.
    /// `Err`: the task ends (a permanent provider error, an output too large, invalid
    /// outputs every time, a call that does not fit the budget).
    #[allow(clippy::too_many_arguments)] // one deployment's turn: what it needs, by name
    pub(super) async fn attempt(
        &self,
        task: &Task,
        request: &TaskRequest,
        route: &Route,
        index: usize,
        reservation: &mut Option<Reservation>,
        spent: &mut Spent,
        covered: bool,
        trace: &TraceSpan,
        sink: &crate::StreamSink,
    ) -> Result<Attempted, Failure> {
        let deployment = &route.deployments[index];
        let model = deployment.model_ref();
        let provider_name = deployment.provider.as_str();
        let provider = self.inner.providers.get(provider_name).ok_or_else(|| {
            Failure::new(
                ErrorCode::ProviderError,
                format!("provider `{provider_name}` is not configured in this process"),
            )
        })?;
        let schema = request.output_schema();
        let max_retries = self.inner.config.workers.max_output_retries;
        let max_output_bytes = self.inner.config.max_output_bytes;
        let counter = TokenCounter::for_model_ref(&self.inner.config, &model);
        let timeout = route.attempt_timeout(index);
        let mut previous: Option<String> = None;
        for reask in 0..=max_retries {
            let call = ProviderCall {
                model: &model,
                request,
                output_schema: &schema,
                previous_error: previous.as_deref(),
                max_output_bytes,
            };
            if spent.calls > 0 || !covered {
                let what = if reask > 0 {
                    "the model's output was invalid and its re-ask does not fit".to_string()
                } else {
                    format!("the fallback to {} does not fit", deployment.name())
                };
                let prices = deployment.prices;
                if let Err(failure) = self
                    .reserve_call(task, counter, &call, prices, reservation, &what)
                    .await
                {
                    return Err(failure.with_usage(spent.usage));
                }
                if reask > 0 {
                    metrics::counter!(m::OUTPUT_REASKS_TOTAL, "kind" => task.kind.as_str())
                        .increment(1);
                }
            }
            // Output another call published is void from here (docs/api.md, "Streaming a
            // task"): readers are told before this call's pieces.
            sink.restart(if reask > 0 {
                "the output was invalid: the model is asked again"
            } else {
                "another attempt"
            });
            spent.calls += 1;
            let started = Instant::now();
            let span =
                self.inner
                    .traces
                    .provider_call(&self.inner.config, trace, task, &model, reask);
            // `embed` goes through the item cache and grouped embeddings calls.
            let answered = async {
                match call.request {
                    TaskRequest::Embed(r) => {
                        self.embed_call(task, r, deployment, provider, counter)
                            .await
                    }
                    _ => provider.complete_streaming(call, sink).await,
                }
            };
            let answer = match timeout {
                Some(limit) => tokio::time::timeout(limit, answered)
                    .await
                    .unwrap_or_else(|_| {
                        Err(ProviderError::Unavailable {
                            message: format!(
                                "no answer within the attempt_timeout of {}",
                                humantime::format_duration(limit)
                            ),
                            retry_after: None,
                            refused: false,
                        })
                    }),
                None => answered.await,
            };
            metrics::histogram!(m::PROVIDER_LATENCY_SECONDS, "provider" => provider_name.to_string())
                .record(started.elapsed().as_secs_f64());
            let (output, used, refused, billed_before) = match answer {
                Ok(a) => (Some(a.output), a.usage, None, a.billed_before),
                Err(ProviderError::InvalidOutput {
                    message,
                    usage,
                    billed_before,
                }) => (None, usage, Some(reask_error(message)), billed_before),
                Err(ProviderError::Unavailable {
                    message,
                    retry_after,
                    refused,
                }) => {
                    span.error(message.clone());
                    provider_call(provider_name, "unavailable");
                    // docs/routes.md, "What is charged when": a call the provider refused
                    // (429, 503) processed nothing and costs nothing; any other may have
                    // been billed (a timeout): counted at its bound.
                    let used = if refused {
                        Usage::default()
                    } else {
                        bound_usage(counter, &call)
                    };
                    let used = priced(used, deployment.prices);
                    add_usage(&mut spent.usage, used, provider_name);
                    return Ok(Attempted::Unavailable {
                        message,
                        retry_after,
                    });
                }
                Err(ProviderError::Failed(message)) => {
                    span.error(message.clone());
                    provider_call(provider_name, "error");
                    return Err(Failure::new(ErrorCode::ProviderError, message));
                }
                Err(ProviderError::OutputTooLarge(message)) => {
                    span.error(message.clone());
                    provider_call(provider_name, "too_large");
                    return Err(Failure::new(ErrorCode::OutputTooLarge, message));
                }
            };
            let used = priced(attempt_usage(task, counter, &call, used), deployment.prices);
            if billed_before {
                // docs/routes.md, "What is charged when": a try before this answer may
                // have been billed (it timed out, dropped or broke off): counted at the
                // call's bound, as a call that got no answer at all would be.
                let lost = priced(bound_usage(counter, &call), deployment.prices);
                add_usage(&mut spent.usage, lost, provider_name);
            }
            self.inner
                .traces
                .call_answered(span, task, output.as_ref(), || used);
            if let Some(refused) = refused {
                previous = Some(refused);
            }
            add_usage(&mut spent.usage, used, provider_name);
            if let Some(output) = output {
                let check = self.inner.traces.child(trace, "validate");
                let checked = check_output(request, output, max_output_bytes).await?;
                check.set(crate::telemetry::attr::OUTPUT_VALID, checked.is_ok());
                match checked {
                    Ok(valid) => {
                        provider_call(provider_name, "ok");
                        return Ok(Attempted::Valid(valid));
                    }
                    Err(violation) => previous = Some(reask_error(violation.0)),
                }
            }
            provider_call(provider_name, "invalid_output");
            tracing::debug!(task = %task.id, reask, error = ?previous, "invalid model output");
        }
        // Every call reported its usage: a failed task is charged what it used.
        Err(Failure::new(
            ErrorCode::InvalidModelOutput,
            format!(
                "the model's output was invalid {} time(s); last: {}",
                max_retries + 1,
                previous.unwrap_or_default()
            ),
        )
        .with_usage(spent.usage))
    }

    /// docs/budgets.md, "The reservation": reserves `call` (its input counted exactly as
    /// it will be sent, at `prices`) before it is made, through the store, with the same
    /// exactness as admission. Tasks without a bounded reservation reserve nothing. A
    /// refusal is `WORKFLOW_AI_SPEND_BUDGET`, saying `what` did not fit.
    async fn reserve_call(
        &self,
        task: &Task,
        counter: TokenCounter,
        call: &ProviderCall<'_>,
        prices: Option<Prices>,
        reservation: &mut Option<Reservation>,
        what: &str,
    ) -> Result<(), Failure> {
        if !reservation.is_some_and(|r| r.bounded) {
            return Ok(());
        }
        let Some(output) = output_bound(call.model, call.request) else {
            return Ok(());
        };
        let input = attempt_input_tokens(counter, call);
        let attempt = tollgate_core::cost::attempt_reservation(input, output, prices);
        let store = &self.inner.store;
        let lease = self.lease(task);
        match retry_unavailable(|| store.reserve_attempt(task.id, &lease, &attempt)).await {
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
                "the task was canceled, deleted or finished before its next call",
            )),
            Err(StoreError::Cost(c)) => {
                Err(Failure::new(ErrorCode::SpendBudget, format!("{what}: {c}")))
            }
            Err(e) => Err(Failure::new(
                ErrorCode::ProviderError,
                format!("cannot reserve the next call: {e}"),
            )),
        }
    }

    /// docs/routes.md: which of the route's deployments are cooling down, on any
    /// replica (one store read; none for a route of one, which has nowhere else to go).
    /// When the store cannot say, none is taken as cooling.
    pub(super) async fn cooling(&self, task: &Task, route: &Route) -> Vec<bool> {
        if route.deployments.len() < 2 {
            return Vec::new();
        }
        let keys: Vec<String> = route.deployments.iter().map(cooldown_key).collect();
        match self.inner.store.pace_pauses_left(&keys).await {
            Ok(left) => left.iter().map(|d| !d.is_zero()).collect(),
            Err(e) => {
                tracing::warn!(task = %task.id, error = %e, "cannot read the route's cooldowns");
                Vec::new()
            }
        }
    }

    /// docs/routes.md: a deployment that was unavailable is skipped by every replica
    /// for the route's cooldown (longer when the provider's `Retry-After` says, at most
    /// five minutes).
    pub(super) async fn cool_down(
        &self,
        task: &Task,
        route: &Route,
        deployment: &Deployment,
        retry_after: Option<Duration>,
    ) {
        let pause = route.cooldown_after(retry_after);
        if pause.is_zero() {
            return;
        }
        let key = cooldown_key(deployment);
        if let Err(e) = self.inner.store.pause_pace(&key, pause).await {
            tracing::warn!(task = %task.id, deployment = %deployment.name(), error = %e, "cannot record a cooldown");
            return;
        }
        metrics::counter!(m::ROUTE_COOLDOWNS_TOTAL, "model" => task.model.to_string(), "deployment" => deployment.name())
            .increment(1);
    }
}

/// docs/conformance.md#cost-reservation: a call's usage priced at its deployment's
/// prices (`cost_usd` and the exact `cost_nano_usd` settlement charges); an unpriced
/// deployment's cost is unknown (`None`) whatever its provider reported.
fn priced(mut usage: Usage, prices: Option<Prices>) -> Usage {
    let nano = prices.map(|p| usage.cost_at(&p));
    usage.cost_nano_usd = nano;
    usage.cost_usd = nano.map(tollgate_core::cost::nano_to_usd);
    usage
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

/// A call counted at its bound: its input as sent, its output bound (never less than
/// could have been billed), flagged `estimated`.
fn bound_usage(counter: TokenCounter, call: &ProviderCall<'_>) -> Usage {
    Usage {
        input_tokens: attempt_input_tokens(counter, call),
        output_tokens: output_bound(call.model, call.request).unwrap_or(0),
        estimated: true,
        ..Usage::default()
    }
}

/// docs/budgets.md, "Settlement": what one call is counted as. A provider that
/// reported no usage is counted at the call's bound ([`bound_usage`]); absurd usage is
/// clamped to `MAX_REPORTED_TOKENS` and logged (the excess over the reservation is
/// settled as overrun).
fn attempt_usage(
    task: &Task,
    counter: TokenCounter,
    call: &ProviderCall<'_>,
    used: Usage,
) -> Usage {
    // An `embed` call's unreported usage was counted item by item already.
    let counted = matches!(call.request, TaskRequest::Embed(_));
    let used = if used.estimated && !counted {
        let bound = bound_usage(counter, call);
        tracing::warn!(
            task = %task.id, provider = %call.model.provider, input_tokens = bound.input_tokens,
            output_tokens = bound.output_tokens,
            "the provider reported no usage: the call is counted at its bound"
        );
        Usage {
            input_tokens: bound.input_tokens,
            output_tokens: bound.output_tokens,
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

/// Adds one call's (priced) usage to the execution's, and counts its tokens.
fn add_usage(total: &mut Usage, used: Usage, provider: &str) {
    *total = total.plus(&used);
    total.cost_usd = total.cost_nano_usd.map(tollgate_core::cost::nano_to_usd);
    total.estimated |= used.estimated;
    metrics::counter!(m::PROVIDER_TOKENS_TOTAL, "provider" => provider.to_string(), "direction" => "input")
        .increment(used.input_tokens);
    metrics::counter!(m::PROVIDER_TOKENS_TOTAL, "provider" => provider.to_string(), "direction" => "output")
        .increment(used.output_tokens);
}
