//! Issue 30, "racing budget test including embed and chat" (docs/budgets.md, docs/routes.md
//! "What is charged when"), on both backends: four engines (four store instances, two
//! workers each) race through `chat` tasks (parallel tool calls, tool-result round trips,
//! invalid tool calls asked again) and `embed` tasks (items shared between tasks, so many
//! are answered from the item cache; tasks of one engine grouped into shared calls) on
//! routes of two deployments at different prices, whose calls are sometimes refused
//! (503: the next attempt follows on the other deployment), while submissions on every
//! engine are admitted or refused by one scope's USD limit and one engine crashes
//! mid-call. At every observation the scope's settled plus reserved spend is within its
//! limit; at the end nothing is reserved, the settled spend is exactly the sum of the
//! attempts' charges, each attempt is charged its reported usage at its deployment's
//! prices, and the usage recorded is what the provider answered.
//!
//! The (in-process) scripted provider is random; its seed is printed, and
//! `TOLLGATE_RACE_SEED` replays one.

mod common;

use async_trait::async_trait;
use common::*;
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tollgate_core::{ErrorCode, MaxAttempts, Strategy, TaskId, TaskKind, TaskStatus, Usage};
use tollgate_engine::config::{BudgetPolicy, DeploymentConfig, ModelConfig, ModelPrices};
use tollgate_engine::provider::dev::dev_vector;
use tollgate_engine::provider::{
    EmbedAnswer, EmbedCall, Provider, ProviderAnswer, ProviderCall, ProviderError,
};
use tollgate_engine::{EngineConfig, EngineError, Submission, Tollgate};

on_both_backends!(racing_chat_and_embed_tasks_never_exceed_a_spend_limit);

/// Engines (store instances), each with [`WORKERS_EACH`] workers.
const ENGINES: usize = 4;
const WORKERS_EACH: u32 = 2;
/// Tasks submitted, half `chat`, half `embed`, spread over the engines.
const TASKS: usize = 96;
/// The scope's limit: $0.02 a day, in nano-dollars: about ten tasks' first reservations at
/// once, and far less than what all the tasks would cost.
const LIMIT: i64 = 20_000_000;
/// Every chat deployment's output bound.
const MAX_OUTPUT: u32 = 40;
/// Texts every `embed` task shares with others (the item cache answers them once
/// embedded) and texts of its own.
const SHARED_TEXTS: usize = 24;
const OWN_TEXTS: usize = 12;
/// `embed` tasks queued before the workers start, so that workers of one engine claim
/// several at once and group their calls.
const QUEUED_FIRST: usize = 8;

/// The deployments: (provider model name, price factor). Chat: $1 / $2 per million input
/// / output tokens times the factor; embeddings: $1 per million input tokens times it.
const CHAT_DEPLOYMENTS: [(&str, u64); 2] = [("chat-cheap", 1), ("chat-dear", 3)];
const EMBED_DEPLOYMENTS: [(&str, u64); 2] = [("embed-cheap", 1), ("embed-dear", 2)];

/// A small deterministic generator (xorshift).
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x % n
    }
}

/// What the provider answered, over all engines.
#[derive(Debug, Default)]
struct Ledger {
    /// Tokens of the answers delivered (with usage), per engine.
    tokens: [u64; ENGINES],
    /// Calls refused with a 503 (charged nothing).
    refused: usize,
    /// Chat answers calling a tool that was not offered (asked again).
    invalid: usize,
    /// Embeddings calls carrying the texts of several tasks.
    grouped: usize,
    /// Texts sent to the embeddings model.
    texts_sent: usize,
    /// Calls in progress, per engine.
    active: [usize; ENGINES],
}

/// The scripted provider of one engine: a short delay, then a 503 (one call in eight),
/// else an answer (chat: two parallel tool calls — first, for every other question, a
/// call of a tool that was not offered, so it is asked again; to tool results, text; embeddings: the dev provider's vectors, one
/// token per byte).
#[derive(Debug)]
struct Scripted {
    engine: usize,
    rng: Mutex<Rng>,
    ledger: Arc<Mutex<Ledger>>,
}

impl Scripted {
    fn draw(&self, n: u64) -> u64 {
        self.rng.lock().unwrap().below(n)
    }

    fn deliver(&self, usage: &Usage) {
        self.ledger.lock().unwrap().tokens[self.engine] += usage.input_tokens + usage.output_tokens;
    }

    async fn pause_or_refuse(&self) -> Result<(), ProviderError> {
        let pause = 5 + self.draw(25);
        self.ledger.lock().unwrap().active[self.engine] += 1;
        tokio::time::sleep(Duration::from_millis(pause)).await;
        self.ledger.lock().unwrap().active[self.engine] -= 1;
        if self.draw(8) == 0 {
            self.ledger.lock().unwrap().refused += 1;
            return Err(ProviderError::Unavailable {
                message: "HTTP 503".into(),
                retry_after: None,
                refused: true,
            });
        }
        Ok(())
    }
}

/// Whether the scripted model first answers a question with a tool that was not offered:
/// the questions of tasks `k % 8 == 2` say so (those of `k % 8 == 6` are answered right
/// away).
fn asks_again(request: &tollgate_core::kinds::ChatRequest) -> bool {
    request.messages.iter().any(|m| {
        matches!(m, tollgate_core::kinds::ChatTurn::User { content }
            if content.ends_with("(ask again)"))
    })
}

fn call(id: String, name: &str, arguments: Value) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments.to_string()}})
}

#[async_trait]
impl Provider for Scripted {
    async fn complete(&self, call_: ProviderCall<'_>) -> Result<ProviderAnswer, ProviderError> {
        self.pause_or_refuse().await?;
        let tollgate_core::TaskRequest::Chat(request) = call_.request else {
            return Err(ProviderError::Failed("chat only".into()));
        };
        let after_results = matches!(
            request.messages.last(),
            Some(tollgate_core::kinds::ChatTurn::Tool { .. })
        );
        let n = self.draw(1 << 30);
        let output = if after_results {
            json!({"content": "Sunny in Paris, 10:00.", "finish_reason": "stop"})
        } else if call_.previous_error.is_none() && asks_again(request) {
            self.ledger.lock().unwrap().invalid += 1;
            json!({"content": null, "finish_reason": "tool_calls", "tool_calls": [
                call(format!("call_{n}_x"), "get_wether", json!({"city": "Paris"}))
            ]})
        } else {
            json!({"content": null, "finish_reason": "tool_calls", "tool_calls": [
                call(format!("call_{n}_a"), "get_weather", json!({"city": "Paris"})),
                call(format!("call_{n}_b"), "get_time", json!({"city": "Paris"}))
            ]})
        };
        // Within the bound: the prompts are longer than 60 bytes.
        let usage = Usage {
            input_tokens: 40 + self.draw(20),
            output_tokens: 5 + self.draw(u64::from(MAX_OUTPUT) - 5),
            ..Usage::default()
        };
        self.deliver(&usage);
        Ok(ProviderAnswer {
            output,
            usage,
            billed_before: false,
        })
    }

    async fn embed(&self, call: EmbedCall<'_>) -> Result<EmbedAnswer, ProviderError> {
        self.pause_or_refuse().await?;
        let owners: BTreeSet<&str> = call
            .texts
            .iter()
            .filter_map(|t| t.strip_prefix("own ").and_then(|t| t.split('/').next()))
            .collect();
        {
            let mut ledger = self.ledger.lock().unwrap();
            ledger.grouped += usize::from(owners.len() > 1);
            ledger.texts_sent += call.texts.len();
        }
        let usage = Usage {
            input_tokens: call.texts.iter().map(|t| t.len() as u64).sum(),
            ..Usage::default()
        };
        self.deliver(&usage);
        Ok(EmbedAnswer {
            vectors: call
                .texts
                .iter()
                .map(|t| dev_vector(call.model, 4, t))
                .collect(),
            usage,
        })
    }
}

fn deployment(model: &str, factor: u64, output_factor: u64) -> DeploymentConfig {
    DeploymentConfig {
        provider: "scripted".into(),
        model: model.into(),
        prices: Some(ModelPrices {
            input_per_million: factor as f64,
            output_per_million: (factor * output_factor) as f64,
            cached_input_per_million: None,
            cache_write_input_per_million: None,
        }),
        max_output_tokens: Some(MAX_OUTPUT),
        ..DeploymentConfig::default()
    }
}

/// Nano-dollars per input and output token of a deployment (`provider/model`).
fn nano_per_token(deployment: &str) -> (i64, i64) {
    let model = deployment
        .strip_prefix("scripted/")
        .expect("a scripted deployment");
    if let Some((_, f)) = CHAT_DEPLOYMENTS.iter().find(|(m, _)| *m == model) {
        return (1000 * *f as i64, 2000 * *f as i64);
    }
    let (_, f) = EMBED_DEPLOYMENTS
        .iter()
        .find(|(m, _)| *m == model)
        .expect("a known deployment");
    (1000 * *f as i64, 1000 * *f as i64)
}

fn config() -> EngineConfig {
    let mut c = fast_config();
    c.workers.concurrency = WORKERS_EACH;
    // Grouped embeddings calls: a group gathers for 100 ms.
    c.workers.embed_gather = Duration::from_millis(100);
    // The crash is found by the sweep after this long without a heartbeat; a loaded
    // machine must not requeue a live execution.
    c.sweeper.liveness_timeout = Duration::from_secs(3);
    let tries = Some(MaxAttempts::new(3).expect("1..=20"));
    c.models.insert(
        "chat".into(),
        ModelConfig {
            strategy: Some(Strategy::Fallback),
            deployments: CHAT_DEPLOYMENTS
                .iter()
                .map(|(m, f)| deployment(m, *f, 2))
                .collect(),
            max_attempts: tries,
            ..ModelConfig::default()
        },
    );
    c.models.insert(
        "emb".into(),
        ModelConfig {
            strategy: Some(Strategy::Fallback),
            deployments: EMBED_DEPLOYMENTS
                .iter()
                .map(|(m, f)| DeploymentConfig {
                    max_output_tokens: None,
                    ..deployment(m, *f, 1)
                })
                .collect(),
            max_attempts: tries,
            ..ModelConfig::default()
        },
    );
    c.budgets.insert(
        "standard".into(),
        BudgetPolicy {
            usd_per_24_hours: Some(LIMIT as f64 / 1e9),
            ..BudgetPolicy::default()
        },
    );
    c
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    ])
}

/// Task `k`: the first [`QUEUED_FIRST`] and odd ones `embed`, the other even ones
/// `chat` (every fourth a tool-result round trip).
fn submission(k: usize) -> Submission {
    let (kind, model, request) = if k >= QUEUED_FIRST && k.is_multiple_of(2) {
        let again = if k % 8 == 2 { " (ask again)" } else { "" };
        let question =
            json!({"role": "user", "content": format!("Weather and time in Paris? ({k}){again}")});
        let messages = if k.is_multiple_of(4) {
            json!([question,
                {"role": "assistant", "content": null, "tool_calls": [
                    call(format!("c{k}a"), "get_weather", json!({"city": "Paris"})),
                    call(format!("c{k}b"), "get_time", json!({"city": "Paris"}))
                ]},
                {"role": "tool", "tool_call_id": format!("c{k}a"), "content": "Sunny"},
                {"role": "tool", "tool_call_id": format!("c{k}b"), "content": "10:00"}
            ])
        } else {
            json!([question])
        };
        let request = json!({"messages": messages, "tools": tools(),
            "tool_choice": "auto", "parallel_tool_calls": true});
        (TaskKind::Chat, "chat", request)
    } else {
        let mut texts: Vec<String> = (0..SHARED_TEXTS)
            .map(|i| format!("shared document number {i}"))
            .collect();
        texts.extend((0..OWN_TEXTS).map(|i| format!("own t{k}/{i} of this task alone")));
        (TaskKind::Embed, "emb", json!({ "input": texts }))
    };
    Submission::application(app(), scope(), key(&format!("race-{k}")), kind, request)
        .with_model(tollgate_core::ModelId::new(model).unwrap())
}

async fn racing_chat_and_embed_tasks_never_exceed_a_spend_limit(db: TestDb) {
    let seed = std::env::var("TOLLGATE_RACE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    eprintln!("racing chat and embed: TOLLGATE_RACE_SEED={seed}");
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let mut engines: Vec<Tollgate> = Vec::new();
    for e in 0..ENGINES {
        let provider = Arc::new(Scripted {
            engine: e,
            rng: Mutex::new(Rng(seed.wrapping_mul(e as u64 + 7) | 1)),
            ledger: ledger.clone(),
        });
        engines.push(
            Tollgate::builder(db.store().await, config())
                .provider("scripted", provider)
                .build()
                .expect("valid engine"),
        );
    }
    let answered = Arc::new(AtomicUsize::new(0));
    let admitted = Arc::new(Mutex::new(Vec::<(TaskId, usize)>::new()));
    let refused = Arc::new(AtomicUsize::new(0));
    let submit = {
        let (answered, admitted, refused) = (answered.clone(), admitted.clone(), refused.clone());
        move |engine: Tollgate, k: usize| {
            let (answered, admitted, refused) =
                (answered.clone(), admitted.clone(), refused.clone());
            async move {
                match engine.submit(submission(k)).await {
                    Ok(s) => {
                        assert!(s.created);
                        admitted.lock().unwrap().push((s.task.id, k));
                    }
                    Err(err @ EngineError::Cost(_)) => {
                        assert_eq!(err.code(), Some(ErrorCode::SpendBudget), "{err}");
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(other) => panic!("only the budget may refuse a submission: {other:?}"),
                }
                answered.fetch_add(1, Ordering::SeqCst);
            }
        }
    };
    for k in 0..QUEUED_FIRST {
        submit(engines[k % ENGINES].clone(), k).await;
    }
    let mut handles = Vec::new();
    for e in &engines {
        handles.push(Some(e.start().await.unwrap()));
    }

    // The observer: settled + reserved within the limit at every instant it looks.
    let stop = Arc::new(AtomicBool::new(false));
    let observations = Arc::new(AtomicU64::new(0));
    let observer = {
        let (s, stop, observations) = (db.store().await, stop.clone(), observations.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let w = s.spend(&app(), Some(&scope())).await.expect("spend");
                assert!(
                    w.settled_nano + w.reserved_nano <= LIMIT,
                    "settled {} + reserved {} over the limit {LIMIT}",
                    w.settled_nano,
                    w.reserved_nano
                );
                observations.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };

    // Submitters, one per engine, race the workers.
    let next = Arc::new(AtomicUsize::new(QUEUED_FIRST));
    let mut submitters = Vec::new();
    for (e, engine) in engines.iter().enumerate() {
        let (engine, next, submit) = (engine.clone(), next.clone(), submit.clone());
        let mut rng = Rng(seed.wrapping_mul(e as u64 + 101) | 1);
        submitters.push(tokio::spawn(async move {
            loop {
                let k = next.fetch_add(1, Ordering::SeqCst);
                if k >= TASKS {
                    return;
                }
                submit(engine.clone(), k).await;
                tokio::time::sleep(Duration::from_millis(rng.below(100))).await;
            }
        }));
    }

    // The crash: once a third of the submissions are answered, the last engine stops
    // dead in the middle of a provider call (its tasks are swept back to the queue).
    let crashed = ENGINES - 1;
    while answered.load(Ordering::SeqCst) < TASKS / 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let in_flight = loop {
        let held = handles[crashed].as_ref().unwrap().in_flight();
        if !held.is_empty() && ledger.lock().unwrap().active[crashed] > 0 {
            break held;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the engine to crash never had a call in flight"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    handles[crashed].take().unwrap().abandon().await;

    for s in submitters {
        s.await.expect("a submitter panicked");
    }
    let admitted: Vec<(TaskId, usize)> = admitted.lock().unwrap().clone();
    let mut tasks = HashMap::new();
    for &(id, k) in &admitted {
        let task = engines[0]
            .wait(&app(), id, Duration::from_secs(60))
            .await
            .expect("wait")
            .expect("task exists");
        assert!(task.status.is_terminal(), "{id} still {:?}", task.status);
        tasks.insert(id, (k, task));
    }
    stop.store(true, Ordering::SeqCst);
    observer.await.expect("the observer saw an overshoot");
    for h in handles.into_iter().flatten() {
        h.shutdown(Duration::from_secs(5)).await;
    }

    // Exact settlement.
    let s = db.store().await;
    let w = s.spend(&app(), Some(&scope())).await.expect("spend");
    assert_eq!(
        (w.reserved_nano, w.reserved_tokens),
        (0, 0),
        "every task ended: nothing stays reserved"
    );
    assert!(w.settled_nano <= LIMIT);
    let (mut charged, mut used_tokens) = (0i64, 0u64);
    let (mut fallbacks, mut crashed_attempts, mut parallel_calls) = (0, 0, 0);
    let mut embed_items = 0usize;
    for (id, (_, task)) in &tasks {
        let attempts = s.task_attempts(&app(), *id).await.expect("attempts");
        for a in &attempts {
            assert!(a.ended_at.is_some(), "{id}: attempt {} still open", a.n);
            assert!(
                a.charged.nano_usd <= a.reserved.nano_usd,
                "{id}: attempt {} charged {} over its reservation {}",
                a.n,
                a.charged.nano_usd,
                a.reserved.nano_usd
            );
            match &a.usage {
                Some(u) => {
                    let (input, output) = nano_per_token(&a.deployment);
                    assert_eq!(
                        a.charged.nano_usd,
                        u.input_tokens as i64 * input + u.output_tokens as i64 * output,
                        "{id}: attempt {} is charged its usage at {}'s prices",
                        a.n,
                        a.deployment
                    );
                    used_tokens += u.input_tokens + u.output_tokens;
                }
                None => {
                    crashed_attempts += 1;
                    assert_eq!(
                        a.charged, a.reserved,
                        "{id}: attempt {} without usage is charged its reservation",
                        a.n
                    );
                }
            }
            fallbacks += usize::from(a.n > 1);
            charged += a.charged.nano_usd;
        }
        if task.status == TaskStatus::Succeeded {
            let output = task.output.as_ref().unwrap();
            if task.kind == TaskKind::Chat {
                parallel_calls +=
                    usize::from(output["tool_calls"].as_array().map(Vec::len) == Some(2));
            } else {
                embed_items += SHARED_TEXTS + OWN_TEXTS;
                assert_eq!(
                    output["embeddings"].as_array().unwrap().len(),
                    SHARED_TEXTS + OWN_TEXTS
                );
            }
        }
    }
    assert_eq!(
        w.settled_nano, charged,
        "the settled spend is the sum of the attempts' charges"
    );
    let ledger = ledger.lock().unwrap();
    let survivors: u64 = (0..ENGINES)
        .filter(|e| *e != crashed)
        .map(|e| ledger.tokens[e])
        .sum();
    let all: u64 = ledger.tokens.iter().sum();
    assert!(
        survivors <= used_tokens && used_tokens <= all,
        "the usage recorded ({used_tokens} tokens) is what the provider answered: every \
         answer to a live engine ({survivors}), at most every answer ({all})"
    );
    eprintln!(
        "racing chat and embed: {} admitted, {} refused, {} in flight at the crash, {} \
         attempts without usage, {} fallbacks, {} re-asks, {} refused calls, {} grouped \
         calls, {} of {} texts sent, {} parallel tool calls, {} observations, settled {} of \
         {LIMIT}",
        admitted.len(),
        refused.load(Ordering::SeqCst),
        in_flight.len(),
        crashed_attempts,
        fallbacks,
        ledger.invalid,
        ledger.refused,
        ledger.grouped,
        ledger.texts_sent,
        embed_items,
        parallel_calls,
        observations.load(Ordering::SeqCst),
        w.settled_nano
    );
    assert!(
        refused.load(Ordering::SeqCst) > 0
            && crashed_attempts > 0
            && fallbacks > 0
            && ledger.invalid > 0
            && ledger.grouped > 0
            && ledger.texts_sent < embed_items
            && parallel_calls > 0
            && observations.load(Ordering::SeqCst) > 0,
        "every path must be taken: refused admissions, a crash, fallbacks, re-asks, grouped \
         calls, cached items, parallel tool calls"
    );
}
