//! The `embed` kind end to end (docs/engine.md, "Embeddings"), on both backends:
//!
//! - the item cache: a second task of 1,000 inputs of which 990 were embedded before
//!   calls the provider for the 10 others only and is charged for those only;
//! - grouping: queued `embed` tasks of one deployment share provider calls of at most
//!   the batch size, each settled with its own tokens; a failed grouped call fails each
//!   task;
//! - several engines (store instances) racing over one queue execute every task once;
//! - a route on Anthropic refuses `embed` at submit; the dev provider's vectors;
//! - the OpenAI-compatible `/embeddings` call and Azure's deployment URL.

mod common;

use async_trait::async_trait;
use axum::Json;
use axum::extract::State;
use common::*;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tollgate_core::{ErrorCode, TaskKind, TaskStatus};
use tollgate_engine::config::{BudgetPolicy, ModelConfig, ModelPrices, ProviderConfig};
use tollgate_engine::provider::dev::dev_vector;
use tollgate_engine::provider::{
    EmbedAnswer, EmbedCall, Provider, ProviderAnswer, ProviderCall, ProviderError,
};
use tollgate_engine::{EngineConfig, EngineError, Submission, Tollgate};

on_both_backends!(
    a_task_mostly_cached_calls_the_provider_for_the_rest_only,
    grouped_calls_settle_per_task,
    a_failed_grouped_call_fails_each_task,
    racing_engines_execute_every_embed_task_once,
    racing_submits_admit_embed_tasks_exactly_by_input_tokens,
    anthropic_routes_refuse_embed_at_submit,
    the_dev_provider_embeds_deterministic_unit_vectors,
    the_openai_dialect_posts_to_embeddings,
);

/// A provider that embeds like the dev provider (dimension 4) and records every call's
/// texts; usage: one token per byte (what the worker counts for an unknown provider).
#[derive(Debug, Default)]
struct Recorder {
    calls: Mutex<Vec<Vec<String>>>,
    fail: bool,
}

impl Recorder {
    fn calls(&self) -> Vec<Vec<String>> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait]
impl Provider for Recorder {
    async fn complete(&self, _: ProviderCall<'_>) -> Result<ProviderAnswer, ProviderError> {
        Err(ProviderError::Failed("embeddings only".into()))
    }

    async fn embed(&self, call: EmbedCall<'_>) -> Result<EmbedAnswer, ProviderError> {
        self.calls.lock().unwrap().push(call.texts.to_vec());
        if self.fail {
            return Err(ProviderError::Failed("the embeddings model is gone".into()));
        }
        Ok(EmbedAnswer {
            vectors: call
                .texts
                .iter()
                .map(|t| dev_vector(call.model, 4, t))
                .collect(),
            usage: tollgate_core::Usage {
                input_tokens: call.texts.iter().map(|t| t.len() as u64).sum(),
                ..Default::default()
            },
        })
    }
}

/// `fast_config` with the model `emb` on the provider `rec` (a recorder added in code),
/// priced at $1 per million input tokens, gathering grouped calls for `gather`.
fn config(batch: Option<u64>, gather: Duration) -> EngineConfig {
    let mut c = fast_config();
    // Not under test here: a loaded machine must not requeue a long execution.
    c.sweeper.liveness_timeout = Duration::from_secs(10);
    c.workers.concurrency = 16;
    c.workers.embed_gather = gather;
    c.max_output_bytes = 4 * 1024 * 1024;
    let mut params = serde_json::Map::new();
    if let Some(b) = batch {
        params.insert("embed_batch_size".into(), json!(b));
    }
    c.models.insert(
        "emb".into(),
        ModelConfig {
            provider: "rec".into(),
            model: "rec-embed".into(),
            params,
            prices: Some(ModelPrices {
                input_per_million: 1.0,
                output_per_million: 1.0,
                cached_input_per_million: None,
                cache_write_input_per_million: None,
            }),
            ..ModelConfig::default()
        },
    );
    c
}

async fn engine_with(db: &TestDb, config: EngineConfig, rec: Arc<Recorder>) -> Tollgate {
    Tollgate::builder(db.store().await, config)
        .provider("rec", rec)
        .build()
        .expect("valid engine")
}

fn embed(effect_key: &str, texts: &[String]) -> Submission {
    Submission::application(
        app(),
        scope(),
        key(effect_key),
        TaskKind::Embed,
        json!({ "input": texts }),
    )
    .with_model(tollgate_core::ModelId::new("emb").unwrap())
}

fn bytes(texts: &[String]) -> u64 {
    texts.iter().map(|t| t.len() as u64).sum()
}

fn vectors(task: &tollgate_core::Task) -> Vec<Vec<f32>> {
    serde_json::from_value(task.output.as_ref().expect("an output")["embeddings"].clone())
        .expect("vectors")
}

async fn a_task_mostly_cached_calls_the_provider_for_the_rest_only(db: TestDb) {
    let rec = Arc::new(Recorder::default());
    let engine = engine_with(&db, config(None, Duration::from_millis(5)), rec.clone()).await;
    let handle = engine.start().await.unwrap();
    let first: Vec<String> = (0..1000).map(|i| format!("document {i}")).collect();
    let id = engine.submit(embed("first", &first)).await.unwrap().task.id;
    let one = finished(&engine, id).await;
    assert_eq!(one.status, TaskStatus::Succeeded, "{:?}", one.error);
    assert_eq!(one.output.as_ref().unwrap()["dimensions"], json!(4));
    assert_eq!(vectors(&one).len(), 1000);
    assert_eq!(one.usage.unwrap().input_tokens, bytes(&first));
    let embedded: usize = rec.calls().iter().map(Vec::len).sum();
    assert_eq!(embedded, 1000);

    // 990 of the same texts, 10 new ones.
    let mut second: Vec<String> = first[..990].to_vec();
    let new: Vec<String> = (0..10).map(|i| format!("fresh text {i}")).collect();
    second.extend(new.iter().cloned());
    let before = rec.calls().len();
    let id = engine
        .submit(embed("second", &second))
        .await
        .unwrap()
        .task
        .id;
    let two = finished(&engine, id).await;
    assert_eq!(two.status, TaskStatus::Succeeded, "{:?}", two.error);
    let calls = rec.calls();
    let sent: Vec<String> = calls[before..].concat();
    assert_eq!(sent, new, "only the 10 new texts reach the provider");
    let usage = two.usage.unwrap();
    assert_eq!(usage.input_tokens, bytes(&new), "charged for the 10 only");
    assert_eq!(usage.output_tokens, 0);
    // $1 per million tokens: one token costs 1,000 nano-dollars.
    assert_eq!(usage.cost_nano_usd, Some(bytes(&new) as i64 * 1000));
    let (v1, v2) = (vectors(&one), vectors(&two));
    assert_eq!(v1[..990], v2[..990], "cached items answer the same vectors");
    assert_eq!(
        db.store()
            .await
            .embeddings_of_task(&app(), two.id)
            .await
            .unwrap(),
        10
    );

    // Everything cached: no call at all, nothing charged.
    let before = rec.calls().len();
    let id = engine
        .submit(embed("third", &second[5..]))
        .await
        .unwrap()
        .task
        .id;
    let three = finished(&engine, id).await;
    assert_eq!(three.status, TaskStatus::Succeeded);
    assert_eq!(rec.calls().len(), before);
    assert_eq!(three.usage.unwrap().input_tokens, 0);
    handle.shutdown(Duration::from_secs(5)).await;
}

async fn grouped_calls_settle_per_task(db: TestDb) {
    let rec = Arc::new(Recorder::default());
    // Batches of at most 6 texts; a long gather so every queued task joins.
    let engine = engine_with(
        &db,
        config(Some(6), Duration::from_millis(300)),
        rec.clone(),
    )
    .await;
    let mut tasks = Vec::new();
    for t in 0..5 {
        let texts: Vec<String> = (0..3)
            .map(|i| format!("task {t} text {i}{}", "x".repeat(t)))
            .collect();
        let id = engine
            .submit(embed(&format!("g{t}"), &texts))
            .await
            .unwrap()
            .task
            .id;
        tasks.push((id, texts));
    }
    // Queued before the workers start: claimed together, executed together.
    let handle = engine.start().await.unwrap();
    for (id, texts) in &tasks {
        let task = finished(&engine, *id).await;
        assert_eq!(task.status, TaskStatus::Succeeded, "{:?}", task.error);
        assert_eq!(
            task.usage.unwrap().input_tokens,
            bytes(texts),
            "each task is charged its own tokens"
        );
        let model = tollgate_core::ModelRef {
            params: serde_json::Map::from_iter([("embed_batch_size".to_string(), json!(6))]),
            ..tollgate_core::ModelRef::new("rec", "rec-embed")
        };
        let expected: Vec<Vec<f32>> = texts.iter().map(|t| dev_vector(&model, 4, t)).collect();
        assert_eq!(vectors(&task), expected, "each task gets its own vectors");
    }
    let calls = rec.calls();
    assert_eq!(calls.iter().map(Vec::len).sum::<usize>(), 15);
    assert!(calls.iter().all(|c| c.len() <= 6), "{calls:?}");
    assert!(
        calls.len() < tasks.len(),
        "tasks share calls: {} calls for {} tasks",
        calls.len(),
        tasks.len()
    );
    handle.shutdown(Duration::from_secs(5)).await;
}

async fn a_failed_grouped_call_fails_each_task(db: TestDb) {
    let rec = Arc::new(Recorder {
        fail: true,
        ..Recorder::default()
    });
    let engine = engine_with(&db, config(None, Duration::from_millis(300)), rec.clone()).await;
    let mut ids = Vec::new();
    for t in 0..3 {
        let texts = vec![format!("doomed {t}")];
        ids.push(
            engine
                .submit(embed(&format!("f{t}"), &texts))
                .await
                .unwrap()
                .task
                .id,
        );
    }
    let handle = engine.start().await.unwrap();
    for id in ids {
        let task = finished(&engine, id).await;
        assert_eq!(task.status, TaskStatus::Failed);
        let error = task.error.unwrap();
        assert_eq!(error.code, ErrorCode::ProviderError);
        assert!(
            error.message.contains("the embeddings model is gone"),
            "{error:?}"
        );
    }
    assert!(
        rec.calls().len() < 3,
        "the tasks shared a call: {:?}",
        rec.calls()
    );
    handle.shutdown(Duration::from_secs(5)).await;
}

async fn racing_engines_execute_every_embed_task_once(db: TestDb) {
    let rec = Arc::new(Recorder::default());
    let first = engine_with(&db, config(Some(8), Duration::from_millis(20)), rec.clone()).await;
    let mut tasks = Vec::new();
    for t in 0..24 {
        let texts: Vec<String> = (0..2).map(|i| format!("race {t}/{i}")).collect();
        let id = first
            .submit(embed(&format!("r{t}"), &texts))
            .await
            .unwrap()
            .task
            .id;
        tasks.push((id, texts));
    }
    let mut engines = vec![first];
    for _ in 0..2 {
        engines
            .push(engine_with(&db, config(Some(8), Duration::from_millis(20)), rec.clone()).await);
    }
    let mut handles = Vec::new();
    for e in &engines {
        handles.push(e.start().await.unwrap());
    }
    for (id, texts) in &tasks {
        let task = finished(&engines[0], *id).await;
        assert_eq!(task.status, TaskStatus::Succeeded, "{:?}", task.error);
        assert_eq!(task.usage.unwrap().input_tokens, bytes(texts));
        assert_eq!(task.attempt, 1, "claimed once");
    }
    let mut sent: Vec<String> = rec.calls().concat();
    sent.sort();
    let mut all: Vec<String> = tasks.iter().flat_map(|(_, t)| t.clone()).collect();
    all.sort();
    assert_eq!(
        sent, all,
        "every text embedded exactly once: no task ran twice"
    );
    for h in handles {
        h.shutdown(Duration::from_secs(5)).await;
    }
}

async fn anthropic_routes_refuse_embed_at_submit(db: TestDb) {
    let mut c = fast_config();
    c.providers.insert(
        "claude".into(),
        ProviderConfig::anthropic("http://127.0.0.1:9".to_string()),
    );
    c.models.insert(
        "sonnet".into(),
        ModelConfig {
            provider: "claude".into(),
            model: "claude-sonnet".into(),
            ..ModelConfig::default()
        },
    );
    let engine = db.engine(c).await;
    let sub = Submission::application(
        app(),
        scope(),
        key("no-embeddings"),
        TaskKind::Embed,
        json!({ "input": "hello" }),
    )
    .with_model(tollgate_core::ModelId::new("sonnet").unwrap());
    match engine.submit(sub).await {
        Err(EngineError::Invalid(e)) => {
            assert!(e.to_string().contains("no embeddings API"), "{e}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        engine
            .get_by_effect_key(&app(), &key("no-embeddings"))
            .await
            .unwrap(),
        None,
        "nothing written"
    );
}

async fn the_dev_provider_embeds_deterministic_unit_vectors(db: TestDb) {
    let engine = db.engine(fast_config()).await;
    let handle = engine.start().await.unwrap();
    let sub = |k: &str| {
        Submission::application(
            app(),
            scope(),
            key(k),
            TaskKind::Embed,
            json!({ "input": ["alpha", { "text": "beta", "id": "doc-1", "revision": "v1" }], "dimensions": 16 }),
        )
    };
    let a = engine.submit(sub("dev-a")).await.unwrap().task.id;
    let a = finished(&engine, a).await;
    assert_eq!(a.status, TaskStatus::Succeeded, "{:?}", a.error);
    let v = vectors(&a);
    assert_eq!(v.len(), 2);
    assert_eq!(v[0].len(), 16);
    let norm: f32 = v[0].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-3, "{norm}");
    assert!(a.usage.unwrap().input_tokens > 0);
    let b = engine.submit(sub("dev-b")).await.unwrap().task.id;
    let b = finished(&engine, b).await;
    assert_eq!(vectors(&b), v, "deterministic");
    assert_eq!(
        b.usage.unwrap().input_tokens,
        0,
        "served from the item cache"
    );
    handle.shutdown(Duration::from_secs(5)).await;
}

#[derive(Default)]
struct FakeEmbeddings {
    seen: Mutex<Vec<(String, Value)>>,
}

async fn fake_embeddings(
    State(fake): State<Arc<FakeEmbeddings>>,
    uri: axum::http::Uri,
    Json(body): Json<Value>,
) -> Json<Value> {
    fake.seen
        .lock()
        .unwrap()
        .push((uri.to_string(), body.clone()));
    let n = body["input"].as_array().map_or(0, Vec::len);
    // Answered out of order, as `index` allows.
    let data: Vec<Value> = (0..n)
        .rev()
        .map(|i| json!({ "object": "embedding", "index": i, "embedding": [i as f64, 0.5] }))
        .collect();
    Json(
        json!({ "object": "list", "data": data, "model": body["model"], "usage": { "prompt_tokens": 7 * n, "total_tokens": 7 * n } }),
    )
}

async fn the_openai_dialect_posts_to_embeddings(db: TestDb) {
    let fake = Arc::new(FakeEmbeddings::default());
    let router = axum::Router::new()
        .route("/v1/embeddings", axum::routing::post(fake_embeddings))
        .route(
            "/openai/deployments/{d}/embeddings",
            axum::routing::post(fake_embeddings),
        )
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let mut c = fast_config();
    c.providers.insert(
        "oai".into(),
        ProviderConfig::openai(format!("http://{addr}/v1")),
    );
    let mut azure = ProviderConfig::azure(format!("http://{addr}"));
    azure.api_version = Some("2024-10-21".into());
    c.providers.insert("az".into(), azure);
    for (id, provider, model) in [
        ("small", "oai", "text-embedding-3-small"),
        ("azure", "az", "prod-embed"),
    ] {
        c.models.insert(
            id.into(),
            ModelConfig {
                provider: provider.into(),
                model: model.into(),
                ..ModelConfig::default()
            },
        );
    }
    let engine = db.engine(c).await;
    let handle = engine.start().await.unwrap();
    for model in ["small", "azure"] {
        let sub = Submission::application(
            app(),
            scope(),
            key(&format!("oai-{model}")),
            TaskKind::Embed,
            json!({ "input": ["one", "two"], "dimensions": 2 }),
        )
        .with_model(tollgate_core::ModelId::new(model).unwrap());
        let id = engine.submit(sub).await.unwrap().task.id;
        let task = finished(&engine, id).await;
        assert_eq!(task.status, TaskStatus::Succeeded, "{:?}", task.error);
        assert_eq!(vectors(&task), vec![vec![0.0, 0.5], vec![1.0, 0.5]]);
        assert_eq!(task.usage.unwrap().input_tokens, 14);
    }
    let seen = fake.seen.lock().unwrap().clone();
    assert_eq!(seen[0].0, "/v1/embeddings");
    assert_eq!(
        seen[0].1,
        json!({ "model": "text-embedding-3-small", "input": ["one", "two"], "encoding_format": "float", "dimensions": 2 })
    );
    assert_eq!(
        seen[1].0,
        "/openai/deployments/prod-embed/embeddings?api-version=2024-10-21"
    );
    handle.shutdown(Duration::from_secs(5)).await;
}

async fn racing_submits_admit_embed_tasks_exactly_by_input_tokens(db: TestDb) {
    // Each task: one text of 1,000 bytes = 1,000 tokens (bytes: the recorder's tokenizer
    // is unknown), no output bound needed, reserved at $1 per million = $0.001. The
    // scope's $0.005 a day admits exactly 5, whichever replica submits them.
    let mut c = config(None, Duration::from_millis(5));
    c.budgets.insert(
        "standard".into(),
        BudgetPolicy {
            usd_per_24_hours: Some(0.005),
            ..BudgetPolicy::default()
        },
    );
    let rec = Arc::new(Recorder::default());
    let mut engines = Vec::new();
    for _ in 0..3 {
        engines.push(engine_with(&db, c.clone(), rec.clone()).await);
    }
    let mut submits = Vec::new();
    for (e, engine) in engines.iter().enumerate() {
        for t in 0..4 {
            let engine = engine.clone();
            submits.push(tokio::spawn(async move {
                let text = format!("{e}{t}{}", "x".repeat(998));
                let sub = embed(&format!("budget-{e}-{t}"), &[text]).with_source(
                    tollgate_core::SourceId::new(format!("doc-{e}-{t}")).unwrap(),
                    tollgate_core::SourceRevision::new("v1").unwrap(),
                );
                engine.submit(sub).await
            }));
        }
    }
    let mut admitted = 0;
    for s in submits {
        match s.await.unwrap() {
            Ok(sub) => {
                admitted += 1;
                let r = sub.task.reservation.expect("reserved");
                assert_eq!(r.tokens, 1000, "input tokens only: {r:?}");
            }
            Err(e @ EngineError::Cost(_)) => {
                assert_eq!(e.code(), Some(ErrorCode::SpendBudget), "{e}")
            }
            Err(other) => panic!("unexpected: {other:?}"),
        }
    }
    assert_eq!(admitted, 5, "exactly the budget's worth, across 3 replicas");
}
