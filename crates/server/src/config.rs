//! The whole service configuration: `[server]`, `[database]`, API keys under
//! `[apps.<app>]`, and everything else the engine reads ([`EngineConfig`]).
//!
//! Sources, later ones winning: built-in defaults < the TOML file given with
//! `--config` < `TOLLGATE_*` environment variables, with `__` between key levels
//! (`TOLLGATE_SERVER__ADDR=0.0.0.0:8080`, `TOLLGATE_DATABASE__URL=postgres://…`,
//! `TOLLGATE_WORKERS__CONCURRENCY=16`). Only variables whose first level is a known key
//! are read, so unrelated `TOLLGATE_…` variables never break start-up. Every problem is
//! reported with the key it concerns.

use crate::auth::{Auth, KeyConfig};
use figment::Figment;
use figment::providers::{Env, Format, Toml};
use serde::Deserialize;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tollgate_core::AppId;
use tollgate_engine::config::{ConfigError, EngineConfig};

/// The sections `TollgateConfig` reads itself; every other top-level key is the engine's.
const SERVER_SECTIONS: [&str; 4] = ["server", "metrics", "database", "telemetry"];

/// Every top-level key of the configuration, derived from the types (the server's
/// sections and every field of [`EngineConfig`]), so no section can be missed by the
/// environment; `TOLLGATE_*` variables naming anything else are ignored.
pub fn top_level_keys() -> Vec<String> {
    let engine = serde_json::to_value(EngineConfig::default()).unwrap_or_default();
    let mut keys: Vec<String> = SERVER_SECTIONS.iter().map(|k| k.to_string()).collect();
    if let Value::Object(map) = engine {
        keys.extend(map.keys().cloned());
    }
    keys
}

/// The default embedded database.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://./tollgate-data/tollgate.db";

/// `[server]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// Listen address.
    pub addr: SocketAddr,
    /// Largest request accepted, in bytes of its stored (canonical) form.
    pub max_request_bytes: Option<usize>,
    /// Longest `?wait=` a submission may ask for.
    #[serde(deserialize_with = "tollgate_engine::config::duration_text::deserialize")]
    pub max_wait: Duration,
    /// How long a shutdown lets in-flight tasks finish.
    #[serde(deserialize_with = "tollgate_engine::config::duration_text::deserialize")]
    pub shutdown_grace: Duration,
    /// Longest a connection may take to send a request's head (request line and
    /// headers), counted from when the server starts waiting for it: after accepting the
    /// connection, or after answering the previous request on it.
    #[serde(deserialize_with = "tollgate_engine::config::duration_text::deserialize")]
    pub header_read_timeout: Duration,
    /// Longest a request's whole body may take to arrive once the handler starts reading
    /// it; a slower one is answered 408 and its connection closed.
    #[serde(deserialize_with = "tollgate_engine::config::duration_text::deserialize")]
    pub body_read_timeout: Duration,
    /// Longest a connection may stay open without sending a byte while no request on it
    /// is being answered (a kept-alive connection between requests, or one stalled
    /// half-way through its headers).
    #[serde(deserialize_with = "tollgate_engine::config::duration_text::deserialize")]
    pub idle_timeout: Duration,
    /// Largest HTTP body of `POST /v1/tasks/batch`, in bytes (docs/api.md, "Batches").
    pub max_batch_body_bytes: usize,
    /// Batch requests of one app answered at once; one more is refused with 429
    /// `WORKFLOW_AI_TOO_MANY_BATCHES`.
    pub batches_per_app: usize,
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_request_bytes: None,
            max_wait: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(5),
            max_batch_body_bytes: crate::DEFAULT_BATCH_BODY_LIMIT,
            batches_per_app: crate::DEFAULT_BATCHES_PER_APP,
        }
    }
}

/// `[metrics]`: what `/metrics` shows and who may read it (docs/api.md, "Metrics").
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// Label the series that can be split by app with the app's name (off: no series
    /// carries a name a tenant chose; scope names never appear whatever this says).
    pub app_labels: bool,
    /// A bearer token `/metrics` requires (`Authorization: Bearer <token>`).
    pub token: Option<String>,
    /// The environment variable holding that token (instead of `token`).
    pub token_env: Option<String>,
    /// Serve `/metrics` on this address only (not on the API's).
    pub addr: Option<SocketAddr>,
}

/// Shortest `/metrics` token accepted: a guessable one protects nothing.
pub const MIN_METRICS_TOKEN_CHARS: usize = 16;

impl MetricsSection {
    /// The token `/metrics` requires, read from `token` or from the variable `token_env`
    /// names; every problem names its key.
    pub fn resolve_token(&self) -> Result<Option<String>, ConfigError> {
        let (key, token) = match (&self.token, &self.token_env) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::at(
                    "metrics.token",
                    "give `token` or `token_env`, not both",
                ));
            }
            (Some(t), None) => ("metrics.token", t.clone()),
            (None, Some(var)) => (
                "metrics.token_env",
                std::env::var(var).map_err(|_| {
                    ConfigError::at(
                        "metrics.token_env",
                        format!("the environment variable {var} is not set (or not UTF-8)"),
                    )
                })?,
            ),
            (None, None) => return Ok(None),
        };
        let token = token.trim().to_string();
        if token.chars().count() < MIN_METRICS_TOKEN_CHARS
            || token.chars().any(|c| c.is_control() || c.is_whitespace())
        {
            return Err(ConfigError::at(
                key,
                format!(
                    "the token must be at least {MIN_METRICS_TOKEN_CHARS} characters, without spaces or control characters"
                ),
            ));
        }
        Ok(Some(token))
    }
}

/// `[database]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseSection {
    /// `sqlite://path` (embedded) or `postgres://…`.
    pub url: String,
}

impl Default for DatabaseSection {
    fn default() -> Self {
        DatabaseSection {
            url: DEFAULT_DATABASE_URL.to_string(),
        }
    }
}

/// Everything `tollgate serve` and `tollgate worker` read.
#[derive(Debug, Clone)]
pub struct TollgateConfig {
    /// `[server]`.
    pub server: ServerSection,
    /// `[database]`.
    pub database: DatabaseSection,
    /// `[metrics]`.
    pub metrics: MetricsSection,
    /// `[telemetry]`: trace export (docs/telemetry.md).
    pub telemetry: crate::telemetry::TelemetrySection,
    /// The token `/metrics` requires (`[metrics] token` or `token_env`), read at load.
    pub metrics_token: Option<String>,
    /// Models, providers, budgets, apps, workers, sweeper, notifications.
    pub engine: EngineConfig,
    /// API keys per app, in configuration order.
    pub api_keys: Vec<(AppId, Vec<KeyConfig>)>,
}

impl TollgateConfig {
    /// Loads defaults < `file` < environment (`TOLLGATE_*`), and validates.
    pub fn load(file: Option<&Path>) -> Result<TollgateConfig, ConfigError> {
        let mut figment = Figment::new();
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::at(
                    "--config",
                    format!("configuration file {} does not exist", path.display()),
                ));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        let known = top_level_keys();
        figment = figment.merge(Env::prefixed("TOLLGATE_").split("__").filter(move |key| {
            let first = key.as_str().split('.').next().unwrap_or_default();
            known.iter().any(|k| k.eq_ignore_ascii_case(first))
        }));
        let value: Value = figment
            .extract()
            .map_err(|e| ConfigError::at(figment_key(&e), e.to_string()))?;
        Self::from_value(value)
    }

    /// Builds from one JSON-like value (what the file and environment merge into).
    pub fn from_value(value: Value) -> Result<TollgateConfig, ConfigError> {
        let mut map = match value {
            Value::Object(m) => m,
            Value::Null => Default::default(),
            other => {
                return Err(ConfigError::at(
                    "(root)",
                    format!("expected a table, got {other}"),
                ));
            }
        };
        let server: ServerSection = section(map.remove("server"), "server")?;
        let database: DatabaseSection = section(map.remove("database"), "database")?;
        let metrics: MetricsSection = section(map.remove("metrics"), "metrics")?;
        let metrics_token = metrics.resolve_token()?;
        let telemetry: crate::telemetry::TelemetrySection =
            section(map.remove("telemetry"), "telemetry")?;
        if let Some(addr) = metrics.addr
            && addr == server.addr
            && addr.port() != 0
        {
            return Err(ConfigError::at(
                "metrics.addr",
                "must differ from server.addr (leave it out to serve /metrics on the API's address)",
            ));
        }
        let mut engine: EngineConfig = section(Some(Value::Object(map)), "")?;
        if let Some(limit) = server.max_request_bytes {
            engine.max_request_bytes = limit;
        }
        engine.validate()?;
        let mut api_keys = Vec::new();
        for (app, cfg) in &engine.apps {
            let app_id = AppId::new(app.clone())
                .map_err(|e| ConfigError::at(format!("apps.{app}"), e.to_string()))?;
            let keys: Vec<KeyConfig> = match &cfg.api_keys {
                None => Vec::new(),
                Some(v) => serde_json::from_value(v.clone()).map_err(|e| {
                    ConfigError::at(
                        format!("apps.{app}.api_keys"),
                        format!("expected a list of keys or {{ key, subject, may_assert_subject }} tables: {e}"),
                    )
                })?,
            };
            api_keys.push((app_id, keys));
        }
        let any_key = api_keys.iter().any(|(_, k)| !k.is_empty());
        if any_key {
            for (app, keys) in &api_keys {
                if keys.is_empty() {
                    return Err(ConfigError::at(
                        format!("apps.{app}.api_keys"),
                        "every configured app needs at least one API key",
                    ));
                }
            }
        } else if let Some((app, _)) = api_keys.first() {
            return Err(ConfigError::at(
                format!("apps.{app}.api_keys"),
                "apps are configured but none has an API key (leave [apps] out to run the development app)",
            ));
        }
        for (key, value) in [
            ("server.max_wait", server.max_wait),
            ("server.header_read_timeout", server.header_read_timeout),
            ("server.body_read_timeout", server.body_read_timeout),
            ("server.idle_timeout", server.idle_timeout),
        ] {
            if value.is_zero() {
                return Err(ConfigError::at(key, "must be longer than 0"));
            }
        }
        // A batch must hold at least one item of the largest request; beyond 1 GiB one
        // request could take the process's memory.
        if server.max_batch_body_bytes < 1024 || server.max_batch_body_bytes > 1 << 30 {
            return Err(ConfigError::at(
                "server.max_batch_body_bytes",
                "must be from 1024 to 1073741824 (1 GiB)",
            ));
        }
        if server.batches_per_app == 0 || server.batches_per_app > 10_000 {
            return Err(ConfigError::at(
                "server.batches_per_app",
                "must be from 1 to 10000",
            ));
        }
        Auth::new(&api_keys).map_err(|e| {
            let key = e.split(':').next().unwrap_or("apps").to_string();
            ConfigError::at(key, e)
        })?;
        Ok(TollgateConfig {
            server,
            database,
            metrics,
            telemetry,
            metrics_token,
            engine,
            api_keys,
        })
    }

    /// Whether any API key is configured (otherwise `serve` runs the development app).
    pub fn has_keys(&self) -> bool {
        self.api_keys.iter().any(|(_, k)| !k.is_empty())
    }
}

fn section<T: serde::de::DeserializeOwned + Default>(
    value: Option<Value>,
    prefix: &str,
) -> Result<T, ConfigError> {
    let Some(value) = value else {
        return Ok(T::default());
    };
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let key = match (prefix.is_empty(), path == ".") {
            (true, _) => path,
            (false, true) => prefix.to_string(),
            (false, false) => format!("{prefix}.{path}"),
        };
        ConfigError::at(key, e.into_inner().to_string())
    })
}

fn figment_key(e: &figment::Error) -> String {
    if e.path.is_empty() {
        "(configuration)".to_string()
    } else {
        e.path.join(".")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_need_no_setup() {
        let c = TollgateConfig::from_value(json!({})).unwrap();
        assert_eq!(c.server.addr.to_string(), "127.0.0.1:8080");
        assert_eq!(c.database.url, DEFAULT_DATABASE_URL);
        assert!(!c.has_keys());
    }

    #[test]
    fn problems_name_their_key() {
        let err = TollgateConfig::from_value(json!({"server": {"adr": "x"}})).unwrap_err();
        assert!(err.to_string().contains("server"), "{err}");
        let err = TollgateConfig::from_value(json!({"budgets": {"standard": {
            "max_steps_per_source": 0, "sources_per_24_hours": 1, "scope_concurrent": 1,
            "burst": 1, "tasks_per_minute": 1}}}))
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("budgets.standard.max_steps_per_source"),
            "{err}"
        );
        let err = TollgateConfig::from_value(json!({"apps": {
            "acme": {"api_keys": ["acme-key-0123456789"]},
            "beta": {}
        }}))
        .unwrap_err();
        assert!(err.to_string().contains("apps.beta.api_keys"), "{err}");
        let err = TollgateConfig::from_value(json!({"apps": {"acme": {}}})).unwrap_err();
        assert!(err.to_string().contains("apps.acme.api_keys"), "{err}");
    }

    #[test]
    fn connection_timeouts_have_defaults_and_refuse_zero() {
        let c = TollgateConfig::from_value(json!({})).unwrap();
        assert_eq!(c.server.header_read_timeout, Duration::from_secs(10));
        assert_eq!(c.server.body_read_timeout, Duration::from_secs(30));
        assert_eq!(c.server.idle_timeout, Duration::from_secs(5));
        let c =
            TollgateConfig::from_value(json!({"server": {"body_read_timeout": "250ms"}})).unwrap();
        assert_eq!(c.server.body_read_timeout, Duration::from_millis(250));
        let err =
            TollgateConfig::from_value(json!({"server": {"idle_timeout": "0s"}})).unwrap_err();
        assert!(err.to_string().contains("server.idle_timeout"), "{err}");
    }

    /// Every section (and top-level key) is read from the environment: a variable naming
    /// a key that does not exist under it is an error naming the section, never ignored.
    #[test]
    // figment's `Jail` closures return its (large) error type.
    #[allow(clippy::result_large_err)]
    fn every_section_is_read_from_the_environment() {
        let keys = top_level_keys();
        for section in [
            "server",
            "metrics",
            "database",
            "models",
            "providers",
            "budgets",
            "apps",
            "admission",
            "workers",
            "sweeper",
            "notifications",
            "pipelines",
            "dispatch",
            "webhooks",
            "default_model",
            "default_budget",
        ] {
            assert!(keys.iter().any(|k| k == section), "{section}: {keys:?}");
        }
        for section in &keys {
            figment::Jail::expect_with(|jail| {
                jail.clear_env();
                jail.set_env(
                    format!("TOLLGATE_{}__NO_SUCH_KEY", section.to_uppercase()),
                    "[1, 2]",
                );
                let err = match TollgateConfig::load(None) {
                    Ok(_) => panic!(
                        "TOLLGATE_{}__NO_SUCH_KEY was ignored",
                        section.to_uppercase()
                    ),
                    Err(e) => e.to_string(),
                };
                assert!(err.contains(section.as_str()), "{section}: {err}");
                Ok(())
            });
        }
        // A real setting of a section the old list missed is applied.
        figment::Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("TOLLGATE_PIPELINES__DRIVE_WITHOUT_WORKERS", "true");
            let c = TollgateConfig::load(None).expect("loads");
            assert!(c.engine.pipelines.drive_without_workers);
            Ok(())
        });
    }

    /// The implicit `default_budget = "standard"` need not exist when every app names its
    /// own default; a name written in the configuration must.
    #[test]
    fn an_unused_implicit_default_budget_need_not_exist() {
        let gold = json!({"max_steps_per_source": 1, "sources_per_24_hours": 1,
            "scope_concurrent": 1, "burst": 1, "tasks_per_minute": 1});
        let c = TollgateConfig::from_value(json!({
            "budgets": {"gold": gold},
            "apps": {"acme": {"api_keys": ["acme-key-0123456789"], "default_budget": "gold"}}
        }));
        assert!(c.is_ok(), "{:?}", c.err());
        let err = TollgateConfig::from_value(json!({
            "budgets": {"gold": gold},
            "apps": {"acme": {"api_keys": ["acme-key-0123456789"]}}
        }))
        .unwrap_err();
        assert!(err.to_string().contains("default_budget"), "{err}");
        let err = TollgateConfig::from_value(json!({
            "default_budget": "silver",
            "budgets": {"gold": gold},
            "apps": {"acme": {"api_keys": ["acme-key-0123456789"], "default_budget": "gold"}}
        }))
        .unwrap_err();
        assert!(err.to_string().contains("silver"), "{err}");
    }

    #[test]
    fn batch_bounds_have_defaults_and_are_checked() {
        let c = TollgateConfig::from_value(json!({})).unwrap();
        assert_eq!(c.server.max_batch_body_bytes, 8 << 20);
        assert_eq!(c.server.batches_per_app, 2);
        for (bad, key) in [
            (
                json!({"max_batch_body_bytes": 10}),
                "server.max_batch_body_bytes",
            ),
            (json!({"batches_per_app": 0}), "server.batches_per_app"),
        ] {
            let err = TollgateConfig::from_value(json!({ "server": bad })).unwrap_err();
            assert!(err.to_string().contains(key), "{bad}: {err}");
        }
    }

    #[test]
    fn metrics_protection_is_validated_at_load() {
        let c = TollgateConfig::from_value(json!({})).unwrap();
        assert!(!c.metrics.app_labels);
        assert_eq!(c.metrics_token, None);
        let c = TollgateConfig::from_value(json!({"metrics": {
            "token": "scrape-0123456789abcdef", "addr": "127.0.0.1:9100", "app_labels": true}}))
        .unwrap();
        assert_eq!(c.metrics_token.as_deref(), Some("scrape-0123456789abcdef"));
        assert!(c.metrics.app_labels);
        for (bad, key) in [
            (json!({"token": "short"}), "metrics.token"),
            (json!({"token": "has a space in it 0123"}), "metrics.token"),
            (
                json!({"token": "scrape-0123456789abcdef", "token_env": "X"}),
                "metrics.token",
            ),
            (
                json!({"token_env": "TOLLGATE_TEST_SURELY_UNSET_VARIABLE"}),
                "metrics.token_env",
            ),
            (json!({"addr": "127.0.0.1:8080"}), "metrics.addr"),
            (json!({"labels": true}), "metrics"),
        ] {
            let err = TollgateConfig::from_value(json!({ "metrics": bad })).unwrap_err();
            assert!(err.to_string().contains(key), "{bad}: {err}");
        }
    }

    #[test]
    fn server_max_request_bytes_sets_the_engine_limit() {
        let c = TollgateConfig::from_value(json!({"server": {"max_request_bytes": 1000}})).unwrap();
        assert_eq!(c.engine.max_request_bytes, 1000);
    }
}
