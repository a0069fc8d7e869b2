//! docs/conformance.md#provider-pace provider pace: `requests_per_minute` and `tokens_per_minute` of a provider
//! (and of its models), enforced across every replica through the store's shared
//! schedules ([`tollgate_store::PaceStore`]), and the pause a 429 with `Retry-After`
//! sets for every replica — on every HTTP provider (`openai`, `anthropic`, `azure`), paced or not, at most
//! `max_pause`. An unpaced provider's call only reads the pause before it sends: a read
//! begun at most [`PAUSE_READ_FRESH`] before serves every call that starts meanwhile, and
//! a door call's task reads it while it is being created ([`ProviderPace::prefetch`]).
//!
//! Before each HTTP request (first attempt and every retry) a call takes its start on
//! the provider's schedule and on its model's, if that has its own pace, and waits for
//! it; the task stays `running` and keeps being heartbeated by the pool meanwhile, so a
//! wait never fails it. A call that waited checks for a pause set meanwhile by another
//! replica before it sends. The token schedule holds the call's bound — docs/conformance.md#cost-reservation's
//! count of the prompt sent ([`crate::cost::prompt_input_tokens`]: the model family's
//! tokenizer where known, UTF-8 bytes otherwise, template overhead included) plus the
//! output-token bound — and is settled with the usage the provider reports.

use crate::config::{EngineConfig, ProviderConfig};
use crate::metrics as m;
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tollgate_core::pace_cost_us;
use tollgate_store::{PaceSlot, Store};

/// Output-token bound the pace assumes for a call with none (no `max_output_tokens` on
/// the request and none configured on the model, docs/conformance.md#money-and-tokens). The token schedule is
/// settled with the real usage afterwards.
pub const DEFAULT_PACE_OUTPUT_TOKENS: u32 = 4096;

/// How long a call waits before trying again when the store cannot be reached.
const STORE_RETRY: Duration = Duration::from_millis(500);

/// How long a read of an unpaced provider's pause serves the calls that start after it
/// began (docs/engine.md, "Provider pace"): a pause another replica records holds here
/// for every call that starts at most this long after it was recorded, besides the calls
/// already on the wire. This replica's own 429s hold at once.
pub const PAUSE_READ_FRESH: Duration = Duration::from_millis(10);

/// A read of the provider's pause: when it began, and what it found once it has (the
/// pause left when the answer came, and when that was; `Err`: the store could not say).
#[derive(Clone)]
struct PauseRead {
    began: Instant,
    left: Arc<tokio::sync::OnceCell<Result<(Duration, Instant), String>>>,
}

impl PauseRead {
    fn begun() -> PauseRead {
        PauseRead {
            began: Instant::now(),
            left: Arc::new(tokio::sync::OnceCell::new()),
        }
    }
}

/// The provider's latest read of its pause, shared by the calls of this process.
#[derive(Default)]
struct PauseReads {
    latest: std::sync::Mutex<Option<PauseRead>>,
}

impl PauseReads {
    /// The latest read if it began at most [`PAUSE_READ_FRESH`] ago and did not fail,
    /// else a new one, begun now, which the caller makes (`true`).
    fn fresh(&self) -> (PauseRead, bool) {
        let mut latest = self
            .latest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(read) = latest.as_ref()
            && read.began.elapsed() <= PAUSE_READ_FRESH
            && !matches!(read.left.get(), Some(Err(_)))
        {
            return (read.clone(), false);
        }
        let read = PauseRead::begun();
        *latest = Some(read.clone());
        (read, true)
    }

    /// This process met a 429: its pause holds here from now on, whatever a read begun
    /// before says.
    fn paused(&self, pause: Duration) {
        let read = PauseRead::begun();
        let _ = read.left.set(Ok((pause, read.began)));
        *self
            .latest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(read);
    }
}

/// Calls and tokens per window of one schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Limits {
    requests: Option<NonZeroU32>,
    tokens: Option<NonZeroU32>,
}

impl Limits {
    fn from(pace: crate::config::PaceLimits) -> Limits {
        Limits {
            requests: pace.requests_per_minute.and_then(|l| l.positive().ok()),
            tokens: pace.tokens_per_minute.and_then(|l| l.positive().ok()),
        }
    }

    fn is_set(&self) -> bool {
        self.requests.is_some() || self.tokens.is_some()
    }

    /// The stricter of two (a model named by two ids with different limits).
    fn min(self, other: Limits) -> Limits {
        let pick = |a: Option<NonZeroU32>, b: Option<NonZeroU32>| match (a, b) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        Limits {
            requests: pick(self.requests, other.requests),
            tokens: pick(self.tokens, other.tokens),
        }
    }
}

/// One provider's pace and pause, shared by its calls in this process. Every HTTP
/// provider has one: without limits it carries only the pause its 429s set.
#[derive(Clone)]
pub struct ProviderPace {
    store: Arc<dyn Store>,
    provider: String,
    window: Duration,
    limits: Limits,
    /// The provider's own model names with a pace of their own.
    models: HashMap<String, Limits>,
    /// The longest pause a 429 sets (`max_pause`).
    max_pause: Duration,
    /// The latest read of the provider's pause (unpaced calls).
    reads: Arc<PauseReads>,
}

impl std::fmt::Debug for ProviderPace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderPace")
            .field("provider", &self.provider)
            .field("window", &self.window)
            .field("limits", &self.limits)
            .field("models", &self.models)
            .field("max_pause", &self.max_pause)
            .finish_non_exhaustive()
    }
}

/// A call's reserved start: what to settle once its usage is known.
#[derive(Debug, Clone)]
pub struct PaceTicket {
    /// (schedule key, tokens per window) of the schedules with a token pace.
    token_schedules: Vec<(String, NonZeroU32)>,
    /// The tokens reserved.
    estimate: u64,
}

impl ProviderPace {
    /// The pace of `[providers.<name>]` and of the models that use it (none when
    /// neither has limits: then only its 429s' pauses).
    pub fn from_config(
        name: &str,
        provider: &ProviderConfig,
        config: &EngineConfig,
        store: Arc<dyn Store>,
    ) -> ProviderPace {
        let mut models: HashMap<String, Limits> = HashMap::new();
        // Pace is per deployment (docs/routes.md): every model's and route's
        // deployments on this provider.
        let deployments = config.models.values().flat_map(|m| m.deployment_configs());
        for d in deployments.filter(|d| d.provider == name) {
            let limits = Limits::from(d.pace());
            if limits.is_set() {
                let entry = models.entry(d.model.clone()).or_insert(limits);
                *entry = entry.min(limits);
            }
        }
        ProviderPace {
            store,
            provider: name.to_string(),
            window: provider.pace_window,
            limits: Limits::from(provider.pace()),
            models,
            max_pause: provider.max_pause,
            reads: Arc::default(),
        }
    }

    /// Whether the provider or one of its models has `requests_per_minute` or
    /// `tokens_per_minute`.
    pub fn is_paced(&self) -> bool {
        self.limits.is_set() || !self.models.is_empty()
    }

    /// The schedules a call of `model` takes, with their limits. The provider's own is
    /// always one (without limits it only carries the provider's pause).
    fn schedules(&self, model: &str) -> Vec<(String, Limits)> {
        let mut out = Vec::with_capacity(2);
        out.push((self.provider.clone(), self.limits));
        if let Some(limits) = self.models.get(model) {
            out.push((format!("{}/{model}", self.provider), *limits));
        }
        out
    }

    /// Waits until a call of `model` bounded by `estimate` tokens may start on every
    /// replica's shared schedules, then returns its ticket. Never fails: while the store
    /// cannot be reached, it waits and asks again.
    pub async fn wait_turn(&self, model: &str, estimate: u64) -> PaceTicket {
        if !self.is_paced() {
            self.wait_pause().await;
            return PaceTicket {
                token_schedules: Vec::new(),
                estimate,
            };
        }
        let schedules = self.schedules(model);
        let slots: Vec<PaceSlot> = schedules
            .iter()
            .map(|(key, limits)| PaceSlot {
                key: key.clone(),
                request_cost_us: limits
                    .requests
                    .map_or(0, |n| pace_cost_us(1, n, self.window)),
                token_cost_us: limits
                    .tokens
                    .map_or(0, |n| pace_cost_us(estimate, n, self.window)),
            })
            .collect();
        let keys: Vec<String> = schedules.iter().map(|(k, _)| k.clone()).collect();
        let ticket = PaceTicket {
            token_schedules: schedules
                .iter()
                .filter_map(|(k, l)| l.tokens.map(|t| (k.clone(), t)))
                .collect(),
            estimate,
        };
        let started = Instant::now();
        let mut waited = false;
        loop {
            let wait = match self.store.reserve_pace(&slots).await {
                Ok(wait) => wait,
                Err(e) => {
                    tracing::warn!(provider = %self.provider, error = %e, "cannot reserve provider pace; waiting");
                    tokio::time::sleep(STORE_RETRY).await;
                    waited = true;
                    continue;
                }
            };
            if wait.is_zero() {
                break;
            }
            waited = true;
            tokio::time::sleep(wait).await;
            // Another replica may have met a 429 while this call waited.
            match self.store.pace_pause_left(&keys).await {
                Ok(left) if left.is_zero() => break,
                Ok(left) => tokio::time::sleep(left.min(self.max_pause)).await,
                Err(e) => {
                    tracing::warn!(provider = %self.provider, error = %e, "cannot read provider pause; waiting");
                    tokio::time::sleep(STORE_RETRY).await;
                }
            }
        }
        if waited {
            metrics::counter!(m::PACE_WAITS_TOTAL, "provider" => self.provider.clone())
                .increment(1);
            metrics::histogram!(m::PACE_WAIT_SECONDS, "provider" => self.provider.clone())
                .record(started.elapsed().as_secs_f64());
        }
        ticket
    }

    /// Settles a call's token reservation with the tokens it really used.
    pub async fn settle(&self, ticket: &PaceTicket, used: u64) {
        for (key, per_window) in &ticket.token_schedules {
            let reserved = pace_cost_us(ticket.estimate, *per_window, self.window);
            let real = pace_cost_us(used, *per_window, self.window);
            if used > ticket.estimate {
                tracing::warn!(provider = %self.provider, used, bound = ticket.estimate, "a call used more tokens than its pace bound");
            }
            if let Err(e) = self.store.settle_pace(key, real - reserved).await {
                tracing::warn!(provider = %self.provider, error = %e, "cannot settle provider pace");
            }
        }
    }

    /// Waits, without taking a start on any schedule, until no 429's pause of the
    /// provider is in force on any replica: one read per HTTP request of an unpaced
    /// provider, shared by the calls that start within [`PAUSE_READ_FRESH`] of its start
    /// (and begun by [`Self::prefetch`] while a door call's task is created). Never
    /// fails: while the store cannot be reached, it waits and asks again (at most
    /// `max_pause` in all for unreadable pauses, then it sends).
    async fn wait_pause(&self) {
        let started = Instant::now();
        let mut waited = false;
        loop {
            let (read, _) = self.reads.fresh();
            let left = read
                .left
                .get_or_init(|| self.read_pause())
                .await
                .clone()
                .map(|(left, at)| left.saturating_sub(at.elapsed()));
            match left {
                Ok(left) if left.is_zero() => break,
                Ok(left) => {
                    waited = true;
                    tokio::time::sleep(left.min(self.max_pause)).await;
                }
                Err(e) if started.elapsed() < self.max_pause => {
                    tracing::warn!(provider = %self.provider, error = %e, "cannot read provider pause; waiting");
                    waited = true;
                    tokio::time::sleep(STORE_RETRY).await;
                }
                Err(e) => {
                    tracing::warn!(provider = %self.provider, error = %e, "cannot read provider pause; sending");
                    break;
                }
            }
        }
        if waited {
            metrics::counter!(m::PACE_WAITS_TOTAL, "provider" => self.provider.clone())
                .increment(1);
            metrics::histogram!(m::PACE_WAIT_SECONDS, "provider" => self.provider.clone())
                .record(started.elapsed().as_secs_f64());
        }
    }

    /// The provider's pause left, read from the store.
    async fn read_pause(&self) -> Result<(Duration, Instant), String> {
        self.store
            .pace_pause_left(std::slice::from_ref(&self.provider))
            .await
            .map(|left| (left, Instant::now()))
            .map_err(|e| e.to_string())
    }

    /// A call of an unpaced provider is about to start (a door call's task is being
    /// created, claimed by this process): its pause read begins now, beside the creation,
    /// unless a fresh one is under way. Never waits. A paced provider takes its turn on
    /// its schedules instead, which reads nothing ahead.
    pub fn prefetch(&self) {
        if self.is_paced() {
            return;
        }
        let (read, new) = self.reads.fresh();
        if !new {
            return;
        }
        let pace = self.clone();
        tokio::spawn(async move {
            read.left.get_or_init(|| pace.read_pause()).await;
        });
    }

    /// A 429 with `Retry-After` (or a backoff when it names none): no replica calls the
    /// provider again before the pause has passed. The pause is cut to `max_pause`
    /// (docs/engine.md, "Provider pace") and returned. When the store cannot record it,
    /// this call at least waits it out here.
    pub async fn pause(&self, pause: Duration) -> Duration {
        let pause = pause.min(self.max_pause);
        self.reads.paused(pause);
        if let Err(e) = self.store.pause_pace(&self.provider, pause).await {
            tracing::warn!(provider = %self.provider, error = %e, "cannot record a provider pause; waiting here");
            tokio::time::sleep(pause).await;
        }
        pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reads of one provider's pause: a read serves the calls that start within
    /// [`PAUSE_READ_FRESH`] of its start, then a new one is made; a failed read serves
    /// no one; this process's own 429 holds at once.
    #[tokio::test(start_paused = true)]
    async fn a_pause_read_serves_the_calls_that_start_while_it_is_fresh() {
        let reads = PauseReads::default();
        let (first, new) = reads.fresh();
        assert!(new, "the first call reads");
        let at = Instant::now();
        first
            .left
            .get_or_init(|| async { Ok((Duration::ZERO, at)) })
            .await;
        tokio::time::advance(PAUSE_READ_FRESH / 2).await;
        let (again, new) = reads.fresh();
        assert!(!new, "a call within the fresh time shares the read");
        assert_eq!(again.left.get(), Some(&Ok((Duration::ZERO, at))));
        tokio::time::advance(PAUSE_READ_FRESH).await;
        let (later, new) = reads.fresh();
        assert!(
            new && later.left.get().is_none(),
            "a stale read is read again"
        );
        later
            .left
            .get_or_init(|| async { Err("unreachable".to_string()) })
            .await;
        let (retry, new) = reads.fresh();
        assert!(new, "a failed read serves no one");
        reads.paused(Duration::from_secs(2));
        let (paused, new) = reads.fresh();
        assert!(!new, "this process's own pause is the latest read");
        assert!(
            matches!(paused.left.get(), Some(Ok((p, _))) if *p == Duration::from_secs(2)),
            "{:?}",
            paused.left.get()
        );
        assert!(retry.left.get().is_none(), "the replaced read is untouched");
    }
}
