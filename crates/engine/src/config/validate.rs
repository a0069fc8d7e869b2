//! [`EngineConfig::validate`]: every problem of a configuration, each at its key.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;
use tollgate_core::{AppId, BudgetName, ModelId};

use super::*;

/// The longest `providers.<name>.max_pause` accepted.
const MAX_PROVIDER_PAUSE: Duration = Duration::from_secs(24 * 3600);

/// One configuration problem, at one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// The dotted key, e.g. `budgets.standard.burst` or `apps.acme.allowed_budgets[1]`.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// Every problem [`EngineConfig::validate`] found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {}", self.problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct ConfigError {
    /// The problems, in key order of discovery.
    pub problems: Vec<ConfigProblem>,
}

impl ConfigError {
    /// One problem.
    pub fn at(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            problems: vec![ConfigProblem {
                key: key.into(),
                message: message.into(),
            }],
        }
    }

    /// Whether some problem is at `key`.
    pub fn mentions(&self, key: &str) -> bool {
        self.problems.iter().any(|p| p.key == key)
    }
}

struct Problems(Vec<ConfigProblem>);

impl Problems {
    fn add(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigProblem {
            key: key.into(),
            message: message.into(),
        });
    }

    /// docs/conformance.md#provider-pace pace limits: positive integers where set.
    fn pace(&mut self, key: &str, pace: PaceLimits) {
        for (field, value) in pace.fields() {
            if let Some(Err(message)) = value.map(Limit::positive) {
                self.add(format!("{key}.{field}"), message);
            }
        }
    }

    fn positive_duration(&mut self, key: &str, d: Duration) {
        if d.is_zero() {
            self.add(key, "must be longer than 0");
        }
    }
}

impl EngineConfig {
    /// Checks the whole configuration and reports every problem with its exact key:
    /// unknown providers, models, budgets; budget numbers that are not positive integers;
    /// app defaults outside their allowed lists; zero intervals; a liveness timeout not
    /// longer than the heartbeat interval; and so on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_with_providers(&[])
    }

    /// [`validate`](Self::validate), counting `extra_providers` (registered in code) as
    /// configured.
    pub fn validate_with_providers(&self, extra_providers: &[&str]) -> Result<(), ConfigError> {
        let mut p = Problems(Vec::new());
        self.check_models(&mut p, extra_providers);
        self.check_providers(&mut p);
        self.check_budgets(&mut p);
        self.check_runtime(&mut p);
        if p.0.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { problems: p.0 })
        }
    }

    fn has_provider(&self, name: &str, extra: &[&str]) -> bool {
        self.providers.contains_key(name) || name == DEV_PROVIDER || extra.contains(&name)
    }

    fn check_models(&self, p: &mut Problems, extra: &[&str]) {
        if !self.models.contains_key(&self.default_model) {
            p.add(
                "default_model",
                format!(
                    "names model `{}`, which is not under [models] (configured: {})",
                    self.default_model,
                    listed(self.models.keys())
                ),
            );
        }
        for (id, model) in &self.models {
            let key = format!("models.{id}");
            if let Err(e) = ModelId::new(id.as_str()) {
                p.add(&key, format!("is not a valid model id: {e}"));
            }
            if model.is_route() {
                self.check_route(p, &key, model, extra);
            } else {
                for (field, set) in [
                    ("strategy", model.strategy.is_some()),
                    ("cooldown", model.cooldown.is_some()),
                ] {
                    if set {
                        p.add(
                            format!("{key}.{field}"),
                            "applies to routes only: list the deployments under \
                             [[models.<id>.deployments]]",
                        );
                    }
                }
                let single = &model.deployment_configs()[0];
                self.check_deployment(p, &key, single, extra);
            }
            if let Some(t) = model.attempt_timeout {
                p.positive_duration(&format!("{key}.attempt_timeout"), t);
            }
            if let Err(e) = model.model_ref(|p| self.provider_kind(p)).config_hash() {
                p.add(format!("{key}.params"), e.to_string());
            }
        }
    }

    /// docs/routes.md: a route's own settings and each of its deployments.
    fn check_route(&self, p: &mut Problems, key: &str, model: &ModelConfig, extra: &[&str]) {
        let single_form = [
            ("provider", !model.provider.is_empty()),
            ("model", !model.model.is_empty()),
            ("params", !model.params.is_empty()),
            ("prices", model.prices.is_some()),
            ("max_output_tokens", model.max_output_tokens.is_some()),
            ("requests_per_minute", model.requests_per_minute.is_some()),
            ("tokens_per_minute", model.tokens_per_minute.is_some()),
        ];
        for (field, set) in single_form {
            if set {
                p.add(
                    format!("{key}.{field}"),
                    "is set per deployment in a route (under [[models.<id>.deployments]])",
                );
            }
        }
        let mut names = BTreeSet::new();
        for (i, d) in model.deployments.iter().enumerate() {
            let dkey = format!("{key}.deployments[{i}]");
            self.check_deployment(p, &dkey, d, extra);
            if d.weight == Some(0) {
                p.add(format!("{dkey}.weight"), "must be a positive integer");
            }
            if let Some(t) = d.attempt_timeout {
                p.positive_duration(&format!("{dkey}.attempt_timeout"), t);
            }
            if !names.insert((d.provider.as_str(), d.model.as_str())) {
                p.add(
                    &dkey,
                    format!(
                        "repeats `{}/{}`: a route's deployments differ in provider or model \
                         (cooldowns and pace are kept per provider/model)",
                        d.provider, d.model
                    ),
                );
            }
        }
        let priced = model
            .deployments
            .iter()
            .filter(|d| d.prices.is_some())
            .count();
        if priced != 0 && priced != model.deployments.len() {
            p.add(
                format!("{key}.deployments"),
                "either every deployment of a route has prices or none has (a task's cost \
                 must be known whichever deployment answers)",
            );
        }
    }

    /// One deployment (the single form's or a route's): provider, model, prices,
    /// output bound, pace, and the `dev` provider's parameters.
    fn check_deployment(&self, p: &mut Problems, key: &str, d: &DeploymentConfig, extra: &[&str]) {
        if !self.has_provider(&d.provider, extra) {
            p.add(
                format!("{key}.provider"),
                format!(
                    "names provider `{}`, which is not under [providers] (configured: {})",
                    d.provider,
                    listed(self.providers.keys())
                ),
            );
        }
        if d.model.trim().is_empty() {
            p.add(format!("{key}.model"), "must not be empty");
        }
        if let Some(Err((field, message))) = d.prices.as_ref().map(|pr| pr.to_core()) {
            p.add(format!("{key}.prices.{field}"), message);
        }
        if d.max_output_tokens == Some(0) {
            p.add(
                format!("{key}.max_output_tokens"),
                "must be a positive integer",
            );
        }
        p.pace(key, d.pace());
        if d.provider == DEV_PROVIDER
            || self.providers.get(&d.provider).map(|c| c.kind) == Some(ProviderKind::Dev)
        {
            match d.params.get("latency_ms") {
                None => {}
                Some(v) if v.as_u64().is_some() => {}
                Some(_) => p.add(
                    format!("{key}.params.latency_ms"),
                    "must be a non-negative integer (milliseconds)",
                ),
            }
            match d.params.get("time_limit_ms") {
                None => {}
                Some(v) if v.as_u64().is_some_and(|ms| ms > 0) => {}
                Some(_) => p.add(
                    format!("{key}.params.time_limit_ms"),
                    "must be a positive integer (milliseconds)",
                ),
            }
        }
    }

    fn check_providers(&self, p: &mut Problems) {
        for (name, provider) in &self.providers {
            let key = format!("providers.{name}");
            if name.trim().is_empty() {
                p.add(&key, "a provider name must not be empty");
            }
            p.pace(&key, provider.pace());
            p.positive_duration(&format!("{key}.pace_window"), provider.pace_window);
            match provider.kind {
                ProviderKind::Dev => {
                    if provider.pace().is_set() {
                        p.add(
                            format!("{key}.requests_per_minute"),
                            "pace applies to HTTP providers only; the `dev` provider \
                             calls nothing",
                        );
                    }
                    let unused = [
                        ("base_url", provider.base_url.is_some()),
                        ("api_key_env", provider.api_key_env.is_some()),
                        ("api_version", provider.api_version.is_some()),
                        ("headers", !provider.headers.is_empty()),
                        ("structured_output", provider.structured_output.is_some()),
                    ];
                    for (field, set) in unused {
                        if set {
                            p.add(
                                format!("{key}.{field}"),
                                "is not used by a `dev` provider; remove it or set kind = \
                                 \"openai\", \"anthropic\" or \"azure\"",
                            );
                        }
                    }
                }
                kind => self.check_http_provider(p, &key, kind, provider),
            }
        }
    }

    /// The settings of an `openai`, `anthropic` or `azure` provider.
    fn check_http_provider(
        &self,
        p: &mut Problems,
        key: &str,
        kind: ProviderKind,
        provider: &ProviderConfig,
    ) {
        let url = match (kind, provider.base_url.as_deref()) {
            (_, Some(url)) => Some(url),
            (ProviderKind::Anthropic, None) => Some(ANTHROPIC_BASE_URL),
            (ProviderKind::Azure, None) => {
                p.add(
                    format!("{key}.base_url"),
                    "is required for an `azure` provider: its resource endpoint, e.g. \
                     https://<resource>.openai.azure.com",
                );
                None
            }
            (_, None) => Some(OPENAI_BASE_URL),
        };
        if let Some(url) = url {
            match reqwest::Url::parse(url) {
                Ok(u) if u.scheme() == "http" || u.scheme() == "https" => {}
                Ok(u) => p.add(
                    format!("{key}.base_url"),
                    format!("must be an http or https URL, not {}", u.scheme()),
                ),
                Err(e) => p.add(
                    format!("{key}.base_url"),
                    format!("is not a valid URL ({url:?}): {e}"),
                ),
            }
        }
        if let Some(env) = &provider.api_key_env
            && !is_env_name(env)
        {
            p.add(
                format!("{key}.api_key_env"),
                "must be the name of an environment variable",
            );
        }
        if let Some(version) = &provider.api_version {
            if kind == ProviderKind::Openai {
                p.add(
                    format!("{key}.api_version"),
                    "is used by `azure` (api-version) and `anthropic` (anthropic-version) \
                     providers only",
                );
            } else if version.trim().is_empty()
                || reqwest::header::HeaderValue::from_str(version).is_err()
                || version.contains(['&', '#', ' '])
            {
                p.add(
                    format!("{key}.api_version"),
                    "must be a version such as 2024-10-21",
                );
            }
        }
        for (name, source) in &provider.headers {
            let at = format!("{key}.headers.{name}");
            if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                p.add(&at, "is not a valid HTTP header name");
            }
            match source {
                HeaderValueSource::Literal(v) => {
                    if reqwest::header::HeaderValue::from_str(v).is_err() {
                        p.add(&at, "is not a valid HTTP header value");
                    }
                }
                HeaderValueSource::Env { env } => {
                    if !is_env_name(env) {
                        p.add(
                            format!("{at}.env"),
                            "must be the name of an environment variable",
                        );
                    }
                }
            }
        }
        if kind == ProviderKind::Anthropic
            && provider.structured_output == Some(StructuredOutput::JsonObject)
        {
            p.add(
                format!("{key}.structured_output"),
                "`json_object` does not exist in Anthropic's Messages API; use \"tool\" (the \
                 default), \"json_schema\" or \"prompt\"",
            );
        }
        p.positive_duration(&format!("{key}.timeout"), provider.timeout);
        if provider.max_retries > 20 {
            p.add(format!("{key}.max_retries"), "must be at most 20");
        }
        p.positive_duration(&format!("{key}.retry_backoff"), provider.retry_backoff);
        if provider.max_retry_delay < provider.retry_backoff {
            p.add(
                format!("{key}.max_retry_delay"),
                "must not be shorter than retry_backoff",
            );
        }
        p.positive_duration(&format!("{key}.max_pause"), provider.max_pause);
        if provider.max_pause > MAX_PROVIDER_PAUSE {
            p.add(
                format!("{key}.max_pause"),
                "must be at most 24h (a provider paused longer looks dead)",
            );
        }
    }

    fn check_budgets(&self, p: &mut Problems) {
        for (name, policy) in &self.budgets {
            if let Err(e) = BudgetName::new(name.as_str()) {
                p.add(format!("budgets.{name}"), format!("invalid name: {e}"));
            }
            for (field, value) in policy.fields() {
                if let Err(message) = value.positive() {
                    p.add(format!("budgets.{name}.{field}"), message);
                }
            }
            match policy.weight.positive() {
                Err(message) => p.add(format!("budgets.{name}.weight"), message),
                Ok(w) => {
                    if let Err(e) = tollgate_core::Weight::new(i64::from(w.get())) {
                        p.add(format!("budgets.{name}.weight"), e.to_string());
                    }
                }
            }
            if let Err((field, message)) = policy.cost_limits() {
                p.add(format!("budgets.{name}.{field}"), message);
            }
        }
        for (app, conf) in &self.apps {
            if let Some(Err(e)) = conf
                .usd_per_24_hours
                .map(|usd| tollgate_core::cost::usd_limit_from_f64("usd_per_24_hours", usd))
            {
                p.add(format!("apps.{app}.usd_per_24_hours"), e.to_string());
            }
        }
        match self.admission.global_concurrent.positive() {
            Err(message) => p.add("admission.global_concurrent", message),
            Ok(global) => {
                if let Err(message) = super::budgets::app_shares(&self.apps, global.get()) {
                    p.add("apps", message);
                }
            }
        }
        // The top-level default is used by apps without a default of their own and by the
        // development app (no apps configured). The implicit `standard` must exist only
        // when it is used; a name written in the configuration must always exist.
        let default_used = self.apps.is_empty()
            || self.apps.values().any(|conf| conf.default_budget.is_none())
            || self.default_budget != STANDARD_BUDGET;
        if default_used && !self.budgets.contains_key(&self.default_budget) {
            p.add(
                "default_budget",
                format!(
                    "names budget `{}`, which is not under [budgets] (configured: {})",
                    self.default_budget,
                    listed(self.budgets.keys())
                ),
            );
        }
        for (app, conf) in &self.apps {
            let key = format!("apps.{app}");
            if let Err(e) = AppId::new(app.as_str()) {
                p.add(&key, format!("is not a valid app id: {e}"));
            }
            let default = conf.default_budget.as_ref().unwrap_or(&self.default_budget);
            if let Some(name) = &conf.default_budget
                && !self.budgets.contains_key(name)
            {
                p.add(
                    format!("{key}.default_budget"),
                    format!("names budget `{name}`, which is not under [budgets]"),
                );
            }
            if let Some(allowed) = &conf.allowed_budgets {
                if allowed.is_empty() {
                    p.add(
                        format!("{key}.allowed_budgets"),
                        "must list at least the app's default budget",
                    );
                }
                let mut seen = BTreeSet::new();
                for (i, name) in allowed.iter().enumerate() {
                    if !self.budgets.contains_key(name) {
                        p.add(
                            format!("{key}.allowed_budgets[{i}]"),
                            format!("names budget `{name}`, which is not under [budgets]"),
                        );
                    }
                    if !seen.insert(name) {
                        p.add(
                            format!("{key}.allowed_budgets[{i}]"),
                            format!("lists `{name}` twice"),
                        );
                    }
                }
                if !allowed.is_empty() && !allowed.contains(default) {
                    p.add(
                        format!("{key}.default_budget"),
                        format!(
                            "`{default}` is not in allowed_budgets ({})",
                            listed(allowed)
                        ),
                    );
                }
            }
        }
    }

    fn check_runtime(&self, p: &mut Problems) {
        for (key, message) in self.webhooks.problems() {
            p.add(key, message);
        }
        if self.max_request_bytes == 0 {
            p.add("max_request_bytes", "must be at least 1");
        }
        if self.max_output_bytes < 64 {
            p.add("max_output_bytes", "must be at least 64");
        }
        if self.workers.concurrency > 10_000 {
            p.add("workers.concurrency", "must be from 0 to 10000");
        }
        p.positive_duration(
            "workers.heartbeat_interval",
            self.workers.heartbeat_interval,
        );
        if self.workers.max_output_retries > 10 {
            p.add("workers.max_output_retries", "must be at most 10");
        }
        if self.workers.embed_gather > Duration::from_secs(1) {
            p.add("workers.embed_gather", "must be at most 1s");
        }
        p.positive_duration("dispatch.ageing_step", self.dispatch.ageing_step);
        p.positive_duration("sweeper.interval", self.sweeper.interval);
        p.positive_duration("sweeper.queue_timeout", self.sweeper.queue_timeout);
        if self.sweeper.liveness_timeout <= self.workers.heartbeat_interval {
            p.add(
                "sweeper.liveness_timeout",
                format!(
                    "must be longer than workers.heartbeat_interval ({}), or running tasks \
                     would expire between heartbeats",
                    humantime::format_duration(self.workers.heartbeat_interval)
                ),
            );
        }
        if self.sweeper.batch_size == 0 || self.sweeper.batch_size > 10_000 {
            p.add("sweeper.batch_size", "must be from 1 to 10000");
        }
        p.positive_duration(
            "notifications.poll_interval",
            self.notifications.poll_interval,
        );
        if self.notifications.waiters_per_app == 0 || self.notifications.waiters_per_app > 1_000_000
        {
            p.add("notifications.waiters_per_app", "must be from 1 to 1000000");
        }
        if self.notifications.transport == TransportKind::Nats
            && self.notifications.nats_url.trim().is_empty()
        {
            p.add("notifications.nats_url", "must not be empty");
        }
        if self.pipelines.concurrency > 1000 {
            p.add("pipelines.concurrency", "must be from 0 to 1000");
        }
        if self.pipelines.interrupted_retries > 100 {
            p.add("pipelines.interrupted_retries", "must be from 0 to 100");
        }
        p.positive_duration("pipelines.lease", self.pipelines.lease);
        p.positive_duration("pipelines.poll_interval", self.pipelines.poll_interval);
        p.positive_duration(
            "pipelines.admission_default_delay",
            self.pipelines.admission_default_delay,
        );
        p.positive_duration("pipelines.error_delay", self.pipelines.error_delay);
        let prefix = &self.notifications.subject_prefix;
        if prefix.is_empty()
            || prefix.starts_with('.')
            || prefix.ends_with('.')
            || prefix
                .chars()
                .any(|c| c.is_whitespace() || c == '*' || c == '>' || c.is_control())
        {
            p.add(
                "notifications.subject_prefix",
                "must be a NATS subject without wildcards or whitespace, e.g. `tollgate`",
            );
        }
    }
}

fn listed<T: AsRef<str>>(names: impl IntoIterator<Item = T>) -> String {
    let names: Vec<String> = names
        .into_iter()
        .map(|n| format!("`{}`", n.as_ref()))
        .collect();
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

/// Whether `name` can name an environment variable.
fn is_env_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['=', '\0'])
}
