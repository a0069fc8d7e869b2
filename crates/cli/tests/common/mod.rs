//! What the end-to-end tests of the `tollgate` binary share: a fresh database per server
//! (SQLite file or PostgreSQL schema), `psql` for schema set-up, and a `serve` process on
//! a free 127.0.0.1 port that is killed (and its schema dropped) on drop.

// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Runs one statement with `psql` (schema set-up for the Postgres half).
pub fn psql(url: &str, sql: &str) {
    let out = Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-qc", sql])
        .output()
        .expect("psql runs");
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A database URL for one server: a fresh SQLite file in `dir`, or a fresh Postgres
/// schema named `<prefix>_<uuid>` (with the base URL and schema name, to drop it
/// afterwards). `None` when the Postgres half is skipped (no
/// `TOLLGATE_TEST_DATABASE_URL`, and `TOLLGATE_REQUIRE_POSTGRES` not set).
pub fn database(
    backend: &str,
    dir: &Path,
    prefix: &str,
) -> Option<(String, Option<(String, String)>)> {
    match backend {
        "sqlite" => Some((
            format!("sqlite://{}", dir.join("tollgate.db").display()),
            None,
        )),
        _ => {
            let Ok(url) = std::env::var("TOLLGATE_TEST_DATABASE_URL") else {
                if std::env::var("TOLLGATE_REQUIRE_POSTGRES").is_ok_and(|v| v == "1") {
                    panic!("TOLLGATE_REQUIRE_POSTGRES=1 but TOLLGATE_TEST_DATABASE_URL is not set");
                }
                eprintln!("skipping the Postgres half: TOLLGATE_TEST_DATABASE_URL is not set");
                return None;
            };
            let schema = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
            psql(&url, &format!("CREATE SCHEMA \"{schema}\""));
            let sep = if url.contains('?') { '&' } else { '?' };
            Some((
                format!("{url}{sep}options=-c%20search_path%3D{schema}"),
                Some((url, schema)),
            ))
        }
    }
}

/// A running `tollgate serve`, killed on drop.
pub struct Server {
    pub child: Child,
    pub base: String,
    pub http: reqwest::Client,
    /// (database URL, schema) of the Postgres half, dropped at the end.
    pub schema: Option<(String, String)>,
    pub _dir: tempfile::TempDir,
}

impl Server {
    /// The `/metrics` page as text.
    pub async fn metrics(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The sum of the `/metrics` series whose line starts with `series` (a name, or a
    /// name with its labels).
    pub async fn metric(&self, series: &str) -> f64 {
        self.metrics()
            .await
            .lines()
            .filter(|l| l.starts_with(series))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some((url, schema)) = &self.schema {
            psql(url, &format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"));
        }
    }
}

/// Starts `serve` on a fresh database of `backend` with the configuration `config_text`
/// builds from its URL; `None` when the Postgres half is skipped.
pub fn start(
    backend: &str,
    schema_prefix: &str,
    config_text: impl FnOnce(&str) -> String,
) -> Option<Server> {
    start_with_env(backend, schema_prefix, config_text, &[])
}

/// [`start`] with extra environment variables for the `serve` process.
pub fn start_with_env(
    backend: &str,
    schema_prefix: &str,
    config_text: impl FnOnce(&str) -> String,
    env: &[(&str, &str)],
) -> Option<Server> {
    let dir = tempfile::tempdir().unwrap();
    let (db, schema) = database(backend, dir.path(), schema_prefix)?;
    let config = dir.path().join("tollgate.toml");
    std::fs::write(&config, config_text(&db)).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--addr", "127.0.0.1:0", "--config"])
        .arg(&config)
        .current_dir(dir.path())
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the tollgate binary starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(addr) = line.strip_prefix("Tollgate listening on ") {
                let _ = tx.send(addr.trim().to_string());
            }
        }
    });
    let base = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the server prints its address");
    Some(Server {
        child,
        base,
        http: reqwest::Client::new(),
        schema,
        _dir: dir,
    })
}

/// Runs each named `async fn name(backend: &str)` as a test on SQLite and on PostgreSQL
/// (`sqlite::name`, `postgres::name`).
#[allow(unused_macros)]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { super::$name("sqlite").await })*
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { super::$name("postgres").await })*
        }
    };
}

/// Starts another `serve` on the configuration (so the database) of `of`, with `extra`
/// arguments (`--workers 0`: a replica that runs no task). Killed on drop; the schema
/// stays `of`'s to drop.
pub fn replica(of: &Server, extra: &[&str]) -> Server {
    let config = of._dir.path().join("tollgate.toml");
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--addr", "127.0.0.1:0", "--config"])
        .arg(&config)
        .args(extra)
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the tollgate binary starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(addr) = line.strip_prefix("Tollgate listening on ") {
                let _ = tx.send(addr.trim().to_string());
            }
        }
    });
    let base = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the replica prints its address");
    Server {
        child,
        base,
        http: reqwest::Client::new(),
        schema: None,
        _dir: dir,
    }
}

/// Reads server-sent events, one `(event name, data)` at a time.
pub struct Events {
    response: reqwest::Response,
    buffer: String,
}

impl Events {
    pub fn of(response: reqwest::Response) -> Events {
        Events {
            response,
            buffer: String::new(),
        }
    }

    /// The next event; `None` at the end of the body.
    pub async fn next(&mut self) -> Option<(String, String)> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let raw: String = self.buffer.drain(..end + 2).collect();
                let mut name = "message".to_string();
                let mut data = Vec::new();
                for line in raw.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push(v.trim_start().to_string());
                    }
                }
                if data.is_empty() {
                    continue; // a keep-alive comment
                }
                return Some((name, data.join("\n")));
            }
            let bytes =
                tokio::time::timeout(std::time::Duration::from_secs(30), self.response.chunk())
                    .await
                    .expect("an event within 30 s")
                    .ok()??;
            self.buffer.push_str(&String::from_utf8_lossy(&bytes));
        }
    }

    /// The next event's data as JSON, checking its name.
    pub async fn expect(&mut self, name: &str) -> serde_json::Value {
        let (n, data) = self.next().await.expect("one more event");
        assert_eq!(n, name, "{data}");
        serde_json::from_str(&data).unwrap_or_else(|_| panic!("JSON data: {data}"))
    }

    /// Every remaining event.
    pub async fn rest(&mut self) -> Vec<(String, String)> {
        let mut all = Vec::new();
        while let Some(e) = self.next().await {
            all.push(e);
        }
        all
    }
}
