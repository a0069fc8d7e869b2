//! The engine records its metrics through the `metrics` facade under the names declared
//! in `tollgate_engine::metrics`. A small recorder installed for this test binary counts
//! what is recorded.

mod common;

use common::*;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tollgate_core::{ModelId, SourceId, SourceRevision, TaskKind};
use tollgate_engine::Submission;
use tollgate_engine::config::{BudgetPolicy, Limit};
use tollgate_engine::metrics as m;

/// `name{label=value,…}` → counter total (or histogram sample count).
#[derive(Debug, Default)]
struct Recorded(Mutex<BTreeMap<String, f64>>);

struct Handle(Arc<Recorded>, String);

impl CounterFn for Handle {
    fn increment(&self, value: u64) {
        *self.0.0.lock().unwrap().entry(self.1.clone()).or_default() += value as f64;
    }
    fn absolute(&self, value: u64) {
        self.0
            .0
            .lock()
            .unwrap()
            .insert(self.1.clone(), value as f64);
    }
}

impl GaugeFn for Handle {
    fn increment(&self, value: f64) {
        *self.0.0.lock().unwrap().entry(self.1.clone()).or_default() += value;
    }
    fn decrement(&self, value: f64) {
        *self.0.0.lock().unwrap().entry(self.1.clone()).or_default() -= value;
    }
    fn set(&self, value: f64) {
        self.0.0.lock().unwrap().insert(self.1.clone(), value);
    }
}

impl HistogramFn for Handle {
    fn record(&self, _value: f64) {
        *self.0.0.lock().unwrap().entry(self.1.clone()).or_default() += 1.0;
    }
}

struct TestRecorder(Arc<Recorded>);

impl TestRecorder {
    fn handle(&self, key: &Key) -> Arc<Handle> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        Arc::new(Handle(
            self.0.clone(),
            format!("{}{{{}}}", key.name(), labels.join(",")),
        ))
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.handle(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.handle(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.handle(key))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submissions_admissions_cache_providers_and_outcomes_are_measured() {
    let recorded = Arc::new(Recorded::default());
    metrics::set_global_recorder(TestRecorder(recorded.clone())).expect("first recorder");
    m::describe();

    let db = TestDb::sqlite("metrics");
    let mut config = fast_config();
    config.budgets.insert(
        "standard".into(),
        BudgetPolicy {
            weight: Limit::Integer(1),
            burst: Limit::Integer(2),
            tasks_per_minute: Limit::Integer(1),
            ..BudgetPolicy::default()
        },
    );
    let engine = db.engine(config).await;
    let handle = engine.start().await.unwrap();
    let doc = |k: &str, d: &str| {
        classify(k, "same input").with_source(
            SourceId::new(d).unwrap(),
            SourceRevision::new("v1").unwrap(),
        )
    };
    let first = engine.submit(doc("a", "doc-1")).await.unwrap().task;
    finished(&engine, first.id).await;
    engine.submit(doc("a", "doc-1")).await.unwrap(); // existing
    engine.submit(doc("b", "doc-1")).await.unwrap(); // cached
    engine.submit(doc("c", "doc-2")).await.unwrap(); // admitted (second token)
    let rejected = engine.submit(doc("d", "doc-3")).await.unwrap_err(); // rate limited
    assert!(rejected.retry_after().is_some());
    let unknown = classify("e", "x").with_model(ModelId::new("nope").unwrap());
    engine.submit(unknown).await.unwrap_err();
    let extract = Submission::application(
        app(),
        scope(),
        key("f"),
        TaskKind::ExtractData,
        json!({"input": "x", "schema": {"type": "string", "pattern": "^[0-9]+$"}}),
    );
    let failing = engine.submit(extract).await.unwrap().task;
    finished(&engine, failing.id).await;
    handle.shutdown(Duration::from_secs(5)).await;

    let got = recorded.0.lock().unwrap().clone();
    let value = |k: &str| got.get(k).copied().unwrap_or(0.0);
    let expect = [
        "tollgate_submits_total{kind=classify,outcome=created}",
        "tollgate_submits_total{kind=classify,outcome=existing}",
        "tollgate_submits_total{kind=classify,outcome=cached}",
        "tollgate_submits_total{kind=classify,outcome=rejected}",
        "tollgate_submits_total{kind=classify,outcome=invalid}",
        "tollgate_admissions_total{outcome=admitted}",
        "tollgate_admissions_total{outcome=WORKFLOW_AI_RATE_LIMIT}",
        "tollgate_cache_hits_total{kind=classify}",
        "tollgate_provider_calls_total{outcome=ok,provider=dev}",
        "tollgate_provider_calls_total{outcome=error,provider=dev}",
        "tollgate_provider_latency_seconds{provider=dev}",
        "tollgate_provider_tokens_total{direction=input,provider=dev}",
        "tollgate_provider_tokens_total{direction=output,provider=dev}",
        "tollgate_task_outcomes_total{code=none,outcome=succeeded}",
        "tollgate_task_outcomes_total{code=provider_error,outcome=failed}",
        "tollgate_task_execution_seconds{kind=classify}",
        // docs/conformance.md#fair-share: with fairness on, a hint only wakes the dispatcher's fair claim.
        "tollgate_claims_total{via=poll}",
        // docs/api.md, "Metrics": no tenant-chosen label value by default.
        "tollgate_scope_claims_total{}",
        "tollgate_queue_wait_seconds{}",
        "tollgate_notifications_total{direction=published}",
    ];
    for key in expect {
        assert!(value(key) >= 1.0, "{key} was not recorded; got {got:#?}");
    }
    assert_eq!(value("tollgate_admissions_total{outcome=admitted}"), 2.0);
    assert_eq!(value("tollgate_tasks_in_flight{}"), 0.0);
    for key in got.keys() {
        assert!(
            !key.contains("acme") && !key.contains("customer-42"),
            "{key} names a tenant's app or scope"
        );
    }
}
