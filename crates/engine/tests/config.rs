//! The configuration file as the CLI loads it (figment: defaults < TOML < environment),
//! and validation naming the exact key of every problem.

// figment's error type is large; that is figment's choice, and fine in tests.
#![allow(clippy::result_large_err)]

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use std::time::Duration;
use tollgate_core::{AppId, BudgetName, ErrorCode, ModelId};
use tollgate_engine::config::{Limit, ProviderKind, TransportKind};
use tollgate_engine::{BudgetPolicies, EngineConfig, ModelRegistry};

const FULL: &str = r#"
default_model = "fast"
default_budget = "standard"
max_request_bytes = 65536

[models.fast]
provider = "local"
model = "llama3.1:8b"
params = { temperature = 0, seed = 7 }

[models.offline]
provider = "dev"
model = "dev-1"
params = { latency_ms = 50 }

[providers.local]
kind = "openai"
base_url = "http://127.0.0.1:11434/v1"
timeout = "90s"
max_retries = 3
retry_backoff = "200ms"
max_retry_delay = "20s"

[budgets.standard]
max_steps_per_source = 20
sources_per_24_hours = 1000
scope_concurrent = 10
burst = 30
tasks_per_minute = 120

[budgets.bulk]
max_steps_per_source = 100
sources_per_24_hours = 100000
scope_concurrent = 100
burst = 500
tasks_per_minute = 6000

[apps.acme]
default_budget = "standard"
allowed_budgets = ["standard", "bulk"]
api_keys = [{ key_sha256 = "abc", subject = "svc-1" }]

[admission]
global_concurrent = 500

[workers]
concurrency = 16
heartbeat_interval = "2s"
max_output_retries = 1

[sweeper]
interval = "5s"
queue_timeout = "30m"
liveness_timeout = "20s"
retention = "48h"
batch_size = 50

[notifications]
transport = "nats"
nats_url = "nats://127.0.0.1:4222"
subject_prefix = "tollgate-prod"
poll_interval = "500ms"
"#;

fn load(toml: &str) -> Result<EngineConfig, figment::Error> {
    Figment::from(Serialized::defaults(EngineConfig::default()))
        .merge(Toml::string(toml))
        .extract()
}

#[test]
fn a_full_file_loads_over_the_defaults() {
    let config = load(FULL).unwrap();
    config.validate().unwrap();
    assert_eq!(config.default_model, "fast");
    assert_eq!(config.max_request_bytes, 65536);
    // The defaults' `default` model and `dev` provider are still there (figment merges).
    assert!(config.models.contains_key("default"));
    let local = &config.providers["local"];
    assert_eq!(local.kind, ProviderKind::Openai);
    assert_eq!(local.timeout, Duration::from_secs(90));
    assert_eq!(local.retry_backoff, Duration::from_millis(200));
    assert_eq!(config.workers.heartbeat_interval, Duration::from_secs(2));
    assert_eq!(config.sweeper.queue_timeout, Duration::from_secs(1800));
    assert_eq!(config.sweeper.retention, Duration::from_secs(48 * 3600));
    assert_eq!(config.notifications.transport, TransportKind::Nats);
    assert_eq!(
        config.notifications.poll_interval,
        Duration::from_millis(500)
    );
    assert_eq!(config.budgets["bulk"].burst, Limit::Integer(500));

    let models = ModelRegistry::from_config(&config).unwrap();
    let fast = models.resolve(None).unwrap();
    assert_eq!(fast.id.as_str(), "fast");
    assert_eq!(fast.model_ref.model, "llama3.1:8b");
    let offline = models
        .resolve(Some(&ModelId::new("offline").unwrap()))
        .unwrap();
    assert_ne!(fast.config_hash, offline.config_hash);

    let budgets = BudgetPolicies::from_config(&config).unwrap();
    let acme = AppId::new("acme").unwrap();
    let (name, budget) = budgets
        .resolve(&acme, Some(&BudgetName::new("bulk").unwrap()))
        .unwrap();
    assert_eq!(name.as_str(), "bulk");
    assert_eq!(budget.global_concurrent.get(), 500);
    let stranger = AppId::new("stranger").unwrap();
    let err = budgets
        .resolve(&stranger, Some(&BudgetName::new("bulk").unwrap()))
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::BudgetNotAllowed));
}

#[test]
fn an_empty_file_is_the_working_default() {
    let config = load("").unwrap();
    assert_eq!(config, EngineConfig::default());
    config.validate().unwrap();
}

#[test]
fn unknown_keys_and_bad_durations_are_refused() {
    let err = load("[workers]\nconcurency = 3\n").unwrap_err();
    assert!(err.to_string().contains("concurency"), "{err}");
    let err = load("[sweeper]\ninterval = \"soon\"\n").unwrap_err();
    assert!(err.to_string().contains("soon"), "{err}");
    // An unknown kind is refused, naming it and the known ones.
    let err = load("[providers.x]\nkind = \"gemini\"\n").unwrap_err();
    assert!(err.to_string().contains("gemini"), "{err}");
    assert!(err.to_string().contains("anthropic"), "{err}");
}

#[test]
fn every_problem_names_its_key() {
    let toml = r#"
default_model = "missing"
default_budget = "gold"

[models.broken]
provider = "nowhere"
model = ""

[models.dev-latency]
provider = "dev"
model = "dev-1"
params = { latency_ms = "slow" }

[providers.remote]
kind = "openai"
base_url = "ftp://example.com"
timeout = "0s"

[providers.quiet]
kind = "dev"
base_url = "http://127.0.0.1:1"

[budgets.standard]
max_steps_per_source = 0
sources_per_24_hours = -5
scope_concurrent = 1.5
burst = 10
tasks_per_minute = 10000000000

[apps.acme]
default_budget = "standard"
allowed_budgets = ["bulk", "bulk"]

[admission]
global_concurrent = 0

[workers]
concurrency = 10001
heartbeat_interval = "30s"

[sweeper]
liveness_timeout = "10s"
batch_size = 0

[notifications]
subject_prefix = "a b"
"#;
    let config = load(toml).unwrap();
    let err = config.validate().unwrap_err();
    let text = err.to_string();
    for key in [
        "default_model",
        "default_budget",
        "models.broken.provider",
        "models.broken.model",
        "models.dev-latency.params.latency_ms",
        "providers.remote.base_url",
        "providers.remote.timeout",
        "providers.quiet.base_url",
        "budgets.standard.max_steps_per_source",
        "budgets.standard.sources_per_24_hours",
        "budgets.standard.scope_concurrent",
        "budgets.standard.tasks_per_minute",
        "apps.acme.allowed_budgets[0]",
        "apps.acme.allowed_budgets[1]",
        "apps.acme.default_budget",
        "admission.global_concurrent",
        "workers.concurrency",
        "sweeper.liveness_timeout",
        "sweeper.batch_size",
        "notifications.subject_prefix",
    ] {
        assert!(err.mentions(key), "no problem at {key}: {text}");
    }
    assert!(!err.mentions("budgets.standard.burst"), "{text}");
    assert!(text.contains("1.5"), "{text}");
}

#[test]
fn environment_variables_override_the_file() {
    figment::Jail::expect_with(|jail| {
        // The test environment has TOLLGATE_TEST_DATABASE_URL and friends, which a plain
        // `TOLLGATE_` prefix would read as (unknown) configuration keys.
        jail.clear_env();
        jail.set_env("TOLLGATE_WORKERS", "{concurrency=3}");
        let config: EngineConfig = Figment::from(Serialized::defaults(EngineConfig::default()))
            .merge(Toml::string("[workers]\nconcurrency = 16\n"))
            .merge(figment::providers::Env::prefixed("TOLLGATE_").split("__"))
            .extract()?;
        assert_eq!(config.workers.concurrency, 3);
        Ok(())
    });
}

/// docs/conformance.md#provider-pace keys: the pace of a provider and of a model, the pace window, a policy's
/// weight and `[dispatch]`; bad values are reported at their key.
#[test]
fn dispatch_and_pace_keys_are_configuration() {
    let toml = r#"
        [providers.fake]
        kind = "openai"
        base_url = "http://127.0.0.1:1/v1"
        requests_per_minute = 500
        tokens_per_minute = 200000
        pace_window = "10s"

        [models.default]
        provider = "fake"
        model = "m"
        requests_per_minute = 100

        [budgets.standard]
        max_steps_per_source = 50
        sources_per_24_hours = 10000
        scope_concurrent = 50
        burst = 60
        tasks_per_minute = 600
        weight = 3

        [dispatch]
        fairness = false
        ageing_step = "30s"
    "#;
    let config = load(toml).expect("parses");
    config.validate().expect("valid");
    let p = &config.providers["fake"];
    assert_eq!(p.requests_per_minute, Some(Limit::Integer(500)));
    assert_eq!(p.tokens_per_minute, Some(Limit::Integer(200_000)));
    assert_eq!(p.pace_window, Duration::from_secs(10));
    assert_eq!(
        config.models["default"].requests_per_minute,
        Some(Limit::Integer(100))
    );
    assert_eq!(config.budgets["standard"].weight, Limit::Integer(3));
    assert!(!config.dispatch.fairness);
    assert_eq!(config.dispatch.ageing_step, Duration::from_secs(30));
    for (from, to, key) in [
        (
            "requests_per_minute = 500",
            "requests_per_minute = 0",
            "providers.fake.requests_per_minute",
        ),
        ("weight = 3", "weight = 1001", "budgets.standard.weight"),
        ("weight = 3", "weight = 0", "budgets.standard.weight"),
        (
            "ageing_step = \"30s\"",
            "ageing_step = \"0s\"",
            "dispatch.ageing_step",
        ),
    ] {
        let bad = load(&toml.replace(from, to)).expect("parses");
        let e = bad.validate().unwrap_err();
        assert!(e.mentions(key), "{to}: {e}");
    }
}

/// docs/routes.md: a route's configuration loads, resolves to its deployments in order,
/// and its problems are named at their keys.
#[test]
fn routes_load_and_their_problems_name_their_keys() {
    let toml = r#"
[providers.a]
kind = "openai"
base_url = "http://127.0.0.1:1/v1"

[models.smart]
strategy = "weighted"
cooldown = "45s"
attempt_timeout = "3s"

[[models.smart.deployments]]
provider = "a"
model = "big"
weight = 3
max_output_tokens = 100
prices = { input_per_million = 2.0, output_per_million = 8.0 }

[[models.smart.deployments]]
provider = "dev"
model = "dev-1"
attempt_timeout = "1s"
prices = { input_per_million = 0.0, output_per_million = 0.0 }
"#;
    let config = load(toml).unwrap();
    config.validate().unwrap();
    let registry = ModelRegistry::from_config(&config).unwrap();
    let smart = registry
        .resolve(Some(&ModelId::new("smart").unwrap()))
        .unwrap();
    let route = &smart.route;
    assert_eq!(route.strategy, tollgate_core::Strategy::Weighted);
    assert_eq!(route.cooldown_ms, 45_000);
    let names: Vec<String> = route.deployments.iter().map(|d| d.name()).collect();
    assert_eq!(names, ["a/big", "dev/dev-1"]);
    assert_eq!(route.deployments[0].weight, 3);
    assert_eq!(route.deployments[0].params["max_tokens"], 100);
    assert_eq!(route.attempt_timeout(0), Some(Duration::from_secs(3)));
    assert_eq!(route.attempt_timeout(1), Some(Duration::from_secs(1)));
    // The task's model reference: the first deployment, carrying the whole route.
    assert_eq!(smart.model_ref.provider, "a");
    assert_eq!(smart.model_ref.route.as_ref(), Some(route));
    assert_eq!(smart.config_hash, route.config_hash().unwrap());
    // The single form is a route of one whose hash is unchanged.
    let default = registry.resolve(None).unwrap();
    assert_eq!(default.route.deployments.len(), 1);
    assert_eq!(default.model_ref.route, None);

    let broken = r#"
[models.mixed]
provider = "dev"
model = "dev-1"
strategy = "fallback"
cooldown = "1s"

[models.r]
provider = "dev"
[[models.r.deployments]]
provider = "nowhere"
model = "m"
weight = 0
attempt_timeout = "0s"
prices = { input_per_million = 1.0, output_per_million = 1.0 }
[[models.r.deployments]]
provider = "dev"
model = "dev-1"
[[models.r.deployments]]
provider = "dev"
model = "dev-1"
"#;
    let err = load(broken).unwrap().validate().unwrap_err();
    let text = err.to_string();
    for key in [
        "models.mixed.strategy",
        "models.mixed.cooldown",
        "models.r.provider",
        "models.r.deployments[0].provider",
        "models.r.deployments[0].weight",
        "models.r.deployments[0].attempt_timeout",
        "models.r.deployments[2]",
        "models.r.deployments",
    ] {
        assert!(err.mentions(key), "no problem at {key}: {text}");
    }
}
