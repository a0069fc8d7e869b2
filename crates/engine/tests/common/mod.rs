//! Shared by the engine's integration tests: databases on both backends, short-interval
//! configurations and a scriptable fake OpenAI-compatible server.

#![allow(dead_code)]

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tempfile::TempDir;
use tokio::sync::Notify;
use tokio::time::Instant;
use tollgate_core::{AppId, EffectKey, ScopeId, Task, TaskId, TaskKind, TaskStatus};
use tollgate_engine::config::{ModelConfig, ProviderConfig};
use tollgate_engine::{EngineConfig, Submission, Tollgate};
use tollgate_store::Store;
use tollgate_store::postgres::{PostgresOptions, PostgresStore};
use tollgate_store::sqlite::{SqliteOptions, SqliteStore};

/// Runs each named `async fn name(db: TestDb)` once on SQLite and once on PostgreSQL
/// (skipped with a notice when `TOLLGATE_TEST_DATABASE_URL` is not set).
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let db = $crate::common::TestDb::sqlite(stringify!($name));
                    super::$name(db).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let Some(db) = $crate::common::TestDb::postgres(stringify!($name)) else {
                        return;
                    };
                    super::$name(db).await;
                }
            )*
        }
    };
}

/// One test's database.
pub enum TestDb {
    /// A fresh SQLite file in its own folder.
    Sqlite { path: PathBuf, _dir: TempDir },
    /// A fresh schema in the database of `TOLLGATE_TEST_DATABASE_URL`.
    Postgres { url: String, schema: String },
}

impl TestDb {
    pub fn sqlite(test: &str) -> TestDb {
        let dir = tempfile::Builder::new()
            .prefix(&format!("tollgate-engine-{test}-"))
            .tempdir()
            .expect("temporary folder");
        TestDb::Sqlite {
            path: dir.path().join("tollgate.db"),
            _dir: dir,
        }
    }

    pub fn postgres(test: &str) -> Option<TestDb> {
        let url = tollgate_conformance::postgres_url(&format!("{test} on PostgreSQL"))?;
        let short: String = test
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .take(30)
            .collect();
        let schema = format!("e_{short}_{}", uuid::Uuid::new_v4().simple()).to_ascii_lowercase();
        Some(TestDb::Postgres { url, schema })
    }

    pub fn is_postgres(&self) -> bool {
        matches!(self, TestDb::Postgres { .. })
    }

    /// A new store instance on this database (several may be open at once, like
    /// replicas).
    pub async fn store(&self) -> Arc<dyn Store> {
        match self {
            TestDb::Sqlite { path, .. } => {
                let mut options = SqliteOptions::new(path.clone());
                options.busy_timeout = Duration::from_secs(30);
                options.synchronous_full = false;
                Arc::new(SqliteStore::open(options).await.expect("open SQLite"))
            }
            TestDb::Postgres { .. } => Arc::new(self.postgres_store().await),
        }
    }

    /// The PostgreSQL store (panics on SQLite).
    pub async fn postgres_store(&self) -> PostgresStore {
        let TestDb::Postgres { url, schema } = self else {
            panic!("not a PostgreSQL test database");
        };
        let mut options = PostgresOptions::new(url.clone()).with_schema(schema.clone());
        options.max_connections = 6;
        options.acquire_timeout = Duration::from_secs(60);
        PostgresStore::open(options)
            .await
            .unwrap_or_else(|e| panic!("cannot open schema {schema}: {e}"))
    }

    /// An engine on a new store instance.
    pub async fn engine(&self, config: EngineConfig) -> Tollgate {
        Tollgate::new(self.store().await, config).expect("valid engine configuration")
    }
}

impl Drop for TestDb {
    /// Drops a PostgreSQL test schema so repeated runs leave nothing behind.
    fn drop(&mut self) {
        let TestDb::Postgres { url, schema } = self else {
            return;
        };
        let (url, schema) = (url.clone(), schema.clone());
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(pool) = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&url)
                    .await
                {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
                    )))
                    .execute(&pool)
                    .await;
                    pool.close().await;
                }
            });
        })
        .join();
    }
}

/// The default configuration with test-sized intervals: heartbeats every 50 ms, sweeps
/// every 50 ms, liveness 400 ms, polling every 100 ms.
pub fn fast_config() -> EngineConfig {
    let mut c = EngineConfig::default();
    c.workers.concurrency = 4;
    c.workers.heartbeat_interval = Duration::from_millis(50);
    c.sweeper.interval = Duration::from_millis(50);
    c.sweeper.liveness_timeout = Duration::from_millis(400);
    c.notifications.poll_interval = Duration::from_millis(100);
    c
}

/// [`fast_config`] whose `default` model is served by the fake server through the
/// `openai` provider (fast retries).
pub fn fake_config(fake: &FakeOpenAi) -> EngineConfig {
    let mut c = fast_config();
    let mut provider = ProviderConfig::openai(fake.base_url.clone());
    provider.retry_backoff = Duration::from_millis(10);
    provider.max_retry_delay = Duration::from_secs(3);
    provider.timeout = Duration::from_secs(10);
    c.providers.insert("fake".into(), provider);
    c.models.insert(
        "default".into(),
        ModelConfig {
            requests_per_minute: None,
            tokens_per_minute: None,
            provider: "fake".into(),
            model: "fake-model".into(),
            params: Default::default(),
            prices: None,
            max_output_tokens: None,
            ..ModelConfig::default()
        },
    );
    c
}

pub fn app() -> AppId {
    AppId::new("acme").unwrap()
}

pub fn scope() -> ScopeId {
    ScopeId::new("customer-42").unwrap()
}

pub fn key(k: &str) -> EffectKey {
    EffectKey::new(k).unwrap()
}

/// An application-owned classify submission (labels `spam`, `ham`).
pub fn classify(effect_key: &str, input: &str) -> Submission {
    Submission::application(
        app(),
        scope(),
        key(effect_key),
        TaskKind::Classify,
        json!({"input": input, "labels": ["spam", "ham"]}),
    )
}

/// Waits (bounded) for the task to be terminal and returns it.
pub async fn finished(engine: &Tollgate, id: TaskId) -> Task {
    let task = engine
        .wait(&app(), id, Duration::from_secs(20))
        .await
        .expect("wait")
        .expect("task exists");
    assert!(
        task.status.is_terminal(),
        "task {id} still {:?} after 20 s",
        task.status
    );
    task
}

/// Polls (bounded) until the task has `status`.
pub async fn until_status(engine: &Tollgate, id: TaskId, status: TaskStatus) -> Task {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let task = engine.get(&app(), id).await.unwrap().expect("task exists");
        if task.status == status {
            return task;
        }
        assert!(
            Instant::now() < deadline,
            "task {id} is {:?}, never {status:?}",
            task.status
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What the fake server answers to one call.
#[derive(Debug, Clone)]
pub enum Reply {
    /// 200 with this message content (usage 10 prompt / 5 completion tokens).
    Content(String),
    /// Waits, then answers like `Content`.
    Slow(Duration, String),
    /// An error status, with an optional `Retry-After` header.
    Status(u16, Option<&'static str>),
    /// An error status with one header of any name and (byte) value.
    StatusHeader(u16, &'static str, &'static [u8]),
}

type Responder = Box<dyn Fn(&Value) -> Reply + Send + Sync>;

#[derive(Default)]
struct FakeState {
    script: Mutex<VecDeque<Reply>>,
    responder: Mutex<Option<Responder>>,
    requests: Mutex<Vec<(Instant, Value)>>,
    in_flight: Mutex<HashMap<String, usize>>,
    max_same_input: AtomicUsize,
    calls_per_input: Mutex<HashMap<String, usize>>,
    dropped: Mutex<Vec<Instant>>,
    dropped_notify: Notify,
    arrived: Notify,
}

/// A scriptable OpenAI-compatible chat completions server on 127.0.0.1, living as long
/// as the test's runtime.
#[derive(Clone)]
pub struct FakeOpenAi {
    pub base_url: String,
    state: Arc<FakeState>,
}

impl FakeOpenAi {
    pub async fn start() -> FakeOpenAi {
        let state = Arc::new(FakeState::default());
        let app = axum::Router::new()
            .route("/v1/chat/completions", axum::routing::post(chat))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeOpenAi {
            base_url: format!("http://{addr}/v1"),
            state,
        }
    }

    /// The next calls' replies, in order (before the responder).
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        self.state.script.lock().unwrap().extend(replies);
    }

    /// The reply of every call the script does not cover.
    pub fn respond(&self, f: impl Fn(&Value) -> Reply + Send + Sync + 'static) {
        *self.state.responder.lock().unwrap() = Some(Box::new(f));
    }

    /// Request bodies received, with their arrival times.
    pub fn requests(&self) -> Vec<(Instant, Value)> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Most calls about the same input that were in flight at once.
    pub fn max_concurrent_same_input(&self) -> usize {
        self.state.max_same_input.load(Ordering::SeqCst)
    }

    /// Calls per input text.
    pub fn calls_per_input(&self) -> HashMap<String, usize> {
        self.state.calls_per_input.lock().unwrap().clone()
    }

    /// When the server saw calls abandoned by the client before answering.
    pub fn dropped(&self) -> Vec<Instant> {
        self.state.dropped.lock().unwrap().clone()
    }

    /// Waits (bounded) for `n` requests in total.
    pub async fn until_requests(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let notified = self.state.arrived.notified();
            if self.state.requests.lock().unwrap().len() >= n {
                return;
            }
            assert!(Instant::now() < deadline, "the fake never got {n} requests");
            let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
        }
    }

    /// Waits (bounded by `limit`) for a call to be dropped by the client; returns when.
    pub async fn until_dropped(&self, limit: Duration) -> Option<Instant> {
        let deadline = Instant::now() + limit;
        loop {
            let notified = self.state.dropped_notify.notified();
            if let Some(at) = self.state.dropped.lock().unwrap().first().copied() {
                return Some(at);
            }
            if Instant::now() >= deadline {
                return None;
            }
            let _ = tokio::time::timeout(Duration::from_millis(20), notified).await;
        }
    }
}

/// The user's input of a call: the content of its first user message.
pub fn input_of(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Counts a call in flight; on drop before `finish`, records that the client went away.
struct InFlight {
    state: Arc<FakeState>,
    input: String,
    finished: bool,
}

impl InFlight {
    fn enter(state: Arc<FakeState>, input: String) -> InFlight {
        {
            let mut in_flight = state.in_flight.lock().unwrap();
            let n = in_flight.entry(input.clone()).or_default();
            *n += 1;
            state.max_same_input.fetch_max(*n, Ordering::SeqCst);
            *state
                .calls_per_input
                .lock()
                .unwrap()
                .entry(input.clone())
                .or_default() += 1;
        }
        InFlight {
            state,
            input,
            finished: false,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(n) = self.state.in_flight.lock().unwrap().get_mut(&self.input) {
            *n -= 1;
        }
        if !self.finished {
            self.state.dropped.lock().unwrap().push(Instant::now());
            self.state.dropped_notify.notify_waiters();
        }
    }
}

async fn chat(State(state): State<Arc<FakeState>>, Json(body): Json<Value>) -> Response {
    state
        .requests
        .lock()
        .unwrap()
        .push((Instant::now(), body.clone()));
    state.arrived.notify_waiters();
    let mut guard = InFlight::enter(state.clone(), input_of(&body));
    let scripted = state.script.lock().unwrap().pop_front();
    let reply = match scripted {
        Some(r) => r,
        None => match &*state.responder.lock().unwrap() {
            Some(f) => f(&body),
            None => Reply::Status(500, None),
        },
    };
    let response = match reply {
        Reply::Content(content) => answer(&content),
        Reply::Slow(delay, content) => {
            tokio::time::sleep(delay).await;
            answer(&content)
        }
        Reply::Status(code, retry_after) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let body = Json(json!({"error": {"message": format!("scripted {code}")}}));
            match retry_after {
                Some(after) => (status, [("retry-after", after)], body).into_response(),
                None => (status, body).into_response(),
            }
        }
        Reply::StatusHeader(code, name, value) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut response = (
                status,
                Json(json!({"error": {"message": format!("scripted {code}")}})),
            )
                .into_response();
            response.headers_mut().insert(
                axum::http::HeaderName::from_static(name),
                axum::http::HeaderValue::from_bytes(value).expect("a header value"),
            );
            response
        }
    };
    guard.finished = true;
    response
}

fn answer(content: &str) -> Response {
    Json(json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    }))
    .into_response()
}
