//! Tollgate's HTTP API started in-process, for the scenarios that also measure over HTTP
//! (`latency`, `peer`): the product's own router and server loop
//! ([`tollgate_server::router`], [`tollgate_server::serve`]) on `127.0.0.1` with a port the
//! system picks, over a [`Tollgate`] the scenario built, and one keep-alive HTTP/1.1
//! client holding the benchmark app's API key.
//!
//! The server runs with `[server]`'s defaults but two: its idle and header-read timeouts
//! are raised, so the clients' kept-alive connections outlive the other sides' rounds
//! (the product's 5 s and 10 s would close them between rounds, and the first request of
//! a round would pay a new connection, or race the close).

use super::BENCH_APP;
use anyhow::Context;
use serde_json::Value;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate_core::AppId;
use tollgate_engine::Tollgate;
use tollgate_server::config::ServerSection;
use tollgate_server::{AppState, Auth, ConnectionTimeouts, KeyConfig};

/// How long the server keeps an idle connection: longer than any side's round.
const IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

/// Longest the server may take to stop once asked.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// A running in-process server and its client.
pub(crate) struct HttpServer {
    client: HttpClient,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

/// The client of an [`HttpServer`]: its address, the API key, and one keep-alive
/// HTTP/1.1 connection pool (clones share it).
#[derive(Clone)]
pub(crate) struct HttpClient {
    base: String,
    key: String,
    client: reqwest::Client,
    /// The longest `?wait=` the server honours.
    max_wait: Duration,
}

impl HttpServer {
    /// Serves `tollgate` on `127.0.0.1:0` with one API key for the benchmark app, and
    /// checks with one authenticated request that it answers (which also opens the
    /// client's connection).
    pub(crate) async fn start(tollgate: &Tollgate) -> anyhow::Result<HttpServer> {
        let defaults = ServerSection::default();
        let key = format!("tg_bench_{}", uuid::Uuid::new_v4().simple());
        let auth = Auth::new(&[(AppId::new(BENCH_APP)?, vec![KeyConfig::Plain(key.clone())])])
            .map_err(anyhow::Error::msg)
            .context("cannot configure the benchmark app's API key")?;
        let state = AppState {
            tollgate: tollgate.clone(),
            auth,
            max_wait: defaults.max_wait,
            body_read_timeout: defaults.body_read_timeout,
            metrics: None,
            metrics_access: Default::default(),
            batches: tollgate_server::BatchLimits::new(
                defaults.max_batch_body_bytes,
                defaults.batches_per_app,
            ),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot listen on 127.0.0.1")?;
        let addr = listener.local_addr()?;
        // The header timeout too: hyper runs it while a kept-alive connection waits for
        // its next request, so with the product's 10 s it would close connections
        // resting through the other sides' rounds, racing the next call sent on them
        // (`bench door` once failed so: "connection closed before message completed").
        let timeouts = ConnectionTimeouts {
            header_read: IDLE_TIMEOUT,
            idle: IDLE_TIMEOUT,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(tollgate_server::serve(
            listener,
            tollgate_server::router(state),
            timeouts,
            async move {
                let _ = stopped.await;
            },
        ));
        let client = reqwest::Client::builder()
            .http1_only()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(1)
            .pool_idle_timeout(IDLE_TIMEOUT)
            .build()
            .context("cannot build the HTTP client")?;
        let server = HttpServer {
            client: HttpClient {
                base: format!("http://{addr}"),
                key,
                client,
                max_wait: defaults.max_wait,
            },
            stop,
            task,
        };
        if let Err(e) = server.client.check().await {
            let _ = server.shutdown().await;
            return Err(e);
        }
        Ok(server)
    }

    /// The server's client.
    pub(crate) fn client(&self) -> &HttpClient {
        &self.client
    }

    /// Closes the client's connection and stops the server.
    pub(crate) async fn shutdown(self) -> anyhow::Result<()> {
        drop(self.client);
        // Clones of the client may still hold the connection: the graceful shutdown
        // closes it once it is idle.
        let _ = self.stop.send(());
        match tokio::time::timeout(STOP_TIMEOUT, self.task).await {
            Ok(joined) => joined
                .context("the in-process HTTP server panicked")?
                .context("the in-process HTTP server failed"),
            Err(_) => {
                anyhow::bail!("the in-process HTTP server did not stop within {STOP_TIMEOUT:?}")
            }
        }
    }
}

impl HttpClient {
    /// `GET /v1/models` with the key must answer 200.
    async fn check(&self) -> anyhow::Result<()> {
        let response = self
            .client
            .get(format!("{}/v1/models", self.base))
            .bearer_auth(&self.key)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .context("the in-process HTTP server does not answer")?;
        let status = response.status();
        anyhow::ensure!(
            status == reqwest::StatusCode::OK,
            "the in-process HTTP server answered GET /v1/models with {status}: {}",
            response.text().await.unwrap_or_default()
        );
        Ok(())
    }

    /// The server's root, `http://127.0.0.1:<port>`.
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// The benchmark app's API key.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The longest `?wait=` the server honours (a longer one is cut to it).
    pub(crate) fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// A `POST <path>` with the key, to be completed and sent by the caller (e.g. a
    /// streamed call read piece by piece).
    pub(crate) fn stream_request(&self, path: &str) -> reqwest::RequestBuilder {
        self.client
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.key)
    }

    /// Sends `body` (JSON) to `POST <path>` with the key and waits at most `timeout`;
    /// returns the status and the whole answer.
    pub(crate) async fn post(
        &self,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> anyhow::Result<(reqwest::StatusCode, Vec<u8>)> {
        let response = self
            .client
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.key)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .timeout(timeout)
            .send()
            .await
            .with_context(|| format!("POST {path} failed"))?;
        let status = response.status();
        let answer = response
            .bytes()
            .await
            .with_context(|| format!("POST {path}: the answer was cut"))?;
        Ok((status, answer.to_vec()))
    }
}

/// The task of a `POST /v1/tasks` answer that must have created it (201) and carry
/// `status`; anything else is an error naming what came back.
pub(crate) fn created_task(
    status: reqwest::StatusCode,
    answer: &[u8],
    want: &str,
) -> anyhow::Result<Value> {
    let text = || String::from_utf8_lossy(answer).into_owned();
    anyhow::ensure!(
        status == reqwest::StatusCode::CREATED,
        "POST /v1/tasks answered {status}, not 201: {}",
        text()
    );
    let task: Value = serde_json::from_slice(answer)
        .with_context(|| format!("POST /v1/tasks answered no JSON: {}", text()))?;
    let got = task.get("status").and_then(Value::as_str);
    anyhow::ensure!(
        got == Some(want),
        "the task came back {got:?}, not {want:?}: {}",
        text()
    );
    Ok(task)
}

/// Checks a `POST /v1/tasks/batch` answer: 200, and `expected` results, each a created
/// task (201). A refused item is an error with its message.
pub(crate) fn check_batch(
    status: reqwest::StatusCode,
    answer: &[u8],
    expected: usize,
) -> anyhow::Result<()> {
    let text = || {
        let t = String::from_utf8_lossy(answer);
        t.chars().take(500).collect::<String>()
    };
    anyhow::ensure!(
        status == reqwest::StatusCode::OK,
        "POST /v1/tasks/batch answered {status}: {}",
        text()
    );
    let answer: Value = serde_json::from_slice(answer)
        .with_context(|| format!("POST /v1/tasks/batch answered no JSON: {}", text()))?;
    let results = answer
        .get("results")
        .and_then(Value::as_array)
        .with_context(|| format!("POST /v1/tasks/batch answered no results: {}", text()))?;
    anyhow::ensure!(
        results.len() == expected,
        "POST /v1/tasks/batch answered {} results for {expected} tasks",
        results.len()
    );
    for (i, item) in results.iter().enumerate() {
        let status = item.get("status").and_then(Value::as_u64);
        anyhow::ensure!(
            status == Some(201) && item.get("task").is_some_and(Value::is_object),
            "batch item {i} was not created (status {status:?}): {}",
            item.get("error").map_or_else(String::new, Value::to_string)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        HOLD_PROVIDER, HoldProvider, SizeArgs, Sizes, classify, engine_config, submit_body,
        unscoped,
    };
    use serde_json::json;
    use tollgate_core::ScopeId;
    use tollgate_store::sqlite::{SqliteOptions, SqliteStore};

    /// The HTTP body the scenarios send is the facade's submission, field for field.
    #[test]
    fn the_http_body_is_the_facade_submission() {
        let scope = ScopeId::new("s").expect("scope");
        let body = submit_body(&scope, "k-1", "text 1");
        let parsed: tollgate_server::dto::SubmitBody =
            serde_json::from_value(body).expect("a valid SubmitBody");
        let facade = unscoped(&scope, "k-1", "text 1").expect("submission");
        assert_eq!(parsed.kind, facade.kind.as_str());
        assert_eq!(
            parsed.effect_key.as_deref(),
            Some(facade.effect_key.as_str())
        );
        assert_eq!(parsed.request, facade.request);
        assert_eq!(parsed.request, classify("text 1"));
        assert!(parsed.source.is_none() && parsed.budget.is_none() && parsed.model.is_none());
        match facade.owner {
            tollgate_engine::SubmissionOwner::Application { scope: owner } => {
                assert_eq!(parsed.scope.as_deref(), Some(owner.as_str()));
            }
            other => panic!("the facade's submission is owned by {other:?}"),
        }
    }

    #[test]
    fn answers_that_are_not_created_tasks_are_errors() {
        let ok = reqwest::StatusCode::OK;
        let created = reqwest::StatusCode::CREATED;
        let task = json!({"id": "x", "status": "succeeded"}).to_string();
        assert!(created_task(created, task.as_bytes(), "succeeded").is_ok());
        assert!(created_task(created, task.as_bytes(), "queued").is_err());
        assert!(created_task(ok, task.as_bytes(), "succeeded").is_err());
        assert!(created_task(created, b"not json", "succeeded").is_err());

        let batch = |statuses: &[u64]| {
            let results: Vec<Value> = statuses
                .iter()
                .map(|&s| {
                    if s == 201 {
                        json!({"status": s, "task": {"id": "x"}})
                    } else {
                        json!({"status": s, "error": {"code": "invalid_request", "message": "no"}})
                    }
                })
                .collect();
            json!({ "results": results }).to_string()
        };
        assert!(check_batch(ok, batch(&[201, 201]).as_bytes(), 2).is_ok());
        assert!(check_batch(ok, batch(&[201, 201]).as_bytes(), 3).is_err());
        let refused = check_batch(ok, batch(&[201, 422]).as_bytes(), 2).expect_err("refused");
        assert!(refused.to_string().contains("batch item 1"), "{refused}");
        assert!(check_batch(ok, batch(&[201, 200]).as_bytes(), 2).is_err());
        assert!(check_batch(reqwest::StatusCode::BAD_REQUEST, b"{}", 0).is_err());
    }

    /// The in-process server runs a submission with `?wait=` to its result and takes a
    /// batch, on SQLite.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_in_process_server_submits_waits_and_batches() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(SqliteOptions::new(dir.path().join("h.db")))
            .await
            .expect("store");
        let sizes = Sizes::resolve(&SizeArgs::default(), true).expect("sizes");
        let hold = HoldProvider::new();
        hold.release();
        let tollgate = Tollgate::builder(std::sync::Arc::new(store), engine_config(1, &sizes))
            .provider(HOLD_PROVIDER, std::sync::Arc::new(hold))
            .build()
            .expect("tollgate");
        let engine = tollgate.start().await.expect("workers");
        let server = HttpServer::start(&tollgate).await.expect("server");
        let client = server.client().clone();
        let scope = ScopeId::new("s").expect("scope");
        let body = serde_json::to_vec(&submit_body(&scope, "one", "one")).expect("json");
        let (status, answer) = client
            .post("/v1/tasks?wait=30s", body, Duration::from_secs(40))
            .await
            .expect("answer");
        created_task(status, &answer, "succeeded").expect("succeeded");
        let tasks: Vec<Value> = (0..3)
            .map(|i| submit_body(&scope, &format!("b-{i}"), &format!("b {i}")))
            .collect();
        let body = serde_json::to_vec(&json!({ "tasks": tasks })).expect("json");
        let (status, answer) = client
            .post("/v1/tasks/batch", body.clone(), Duration::from_secs(40))
            .await
            .expect("answer");
        check_batch(status, &answer, 3).expect("created");
        // The same effect keys again: answered, but not created.
        let (status, answer) = client
            .post("/v1/tasks/batch", body, Duration::from_secs(40))
            .await
            .expect("answer");
        assert!(check_batch(status, &answer, 3).is_err());
        server.shutdown().await.expect("stopped");
        engine.shutdown(Duration::from_secs(10)).await;
    }
}
