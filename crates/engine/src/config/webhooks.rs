//! `[webhooks]`: this process's delivery of webhooks (docs/webhooks.md), the addresses
//! endpoints may reach, the retry schedule, and endpoints written in the configuration.

use serde::{Deserialize, Serialize};
use std::time::Duration;
use tollgate_core::webhook::budget::{BudgetThreshold, check_thresholds};
use tollgate_core::webhook::{RetrySchedule, WebhookEventType, WebhookSecret};
use tollgate_core::{AppId, check_identifier};

use super::*;

/// `[webhooks]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookConfig {
    /// Deliveries this process sends at once; 0: it sends none (another replica does).
    pub concurrency: u32,
    /// Deliveries of one app this process sends at once, so one app's slow or dead
    /// endpoint never holds the others'.
    pub per_app_concurrency: u32,
    /// Accept `http://` endpoints (default: `https` only).
    pub allow_http: bool,
    /// Internal networks (CIDR, e.g. `"10.0.0.0/8"`, `"127.0.0.1/32"`) endpoints may reach
    /// anyway. By default loopback, private, link-local and other internal addresses are
    /// refused, checked on the address a name resolves to, which is the one connected to.
    pub allowed_networks: Vec<String>,
    /// The whole time of one attempt (connect, send, read the answer).
    #[serde(with = "duration_text")]
    pub timeout: Duration,
    /// Bytes of an answer read at most (the rest is not read).
    pub max_response_bytes: usize,
    /// How long a replica holds a delivery it sends; when it dies, another sends it once
    /// this has passed. Longer than `timeout`.
    #[serde(with = "duration_text")]
    pub lease: Duration,
    /// How often an idle replica looks for due deliveries.
    #[serde(with = "duration_text")]
    pub poll_interval: Duration,
    /// When failed deliveries are tried again.
    pub retry: WebhookRetryConfig,
    /// Endpoints of the configuration file (read-only over the API).
    pub endpoints: Vec<ConfigWebhookEndpoint>,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig {
            concurrency: 16,
            per_app_concurrency: 4,
            allow_http: false,
            allowed_networks: Vec::new(),
            timeout: Duration::from_secs(10),
            max_response_bytes: 64 * 1024,
            lease: Duration::from_secs(60),
            poll_interval: Duration::from_secs(1),
            retry: WebhookRetryConfig::default(),
            endpoints: Vec::new(),
        }
    }
}

/// `[webhooks.retry]`: exponential backoff with jitter, then dead letter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookRetryConfig {
    /// The wait after the first failure (doubled after each further one).
    #[serde(with = "duration_text")]
    pub initial: Duration,
    /// The longest wait.
    #[serde(with = "duration_text")]
    pub max_interval: Duration,
    /// How long after its first attempt a delivery is retried; then it is dead-lettered.
    #[serde(with = "duration_text")]
    pub give_up_after: Duration,
    /// Share of each wait taken off at random (0 to below 1).
    pub jitter: f64,
}

impl Default for WebhookRetryConfig {
    fn default() -> Self {
        let s = RetrySchedule::default();
        WebhookRetryConfig {
            initial: s.initial,
            max_interval: s.max_interval,
            give_up_after: s.give_up_after,
            jitter: s.jitter,
        }
    }
}

impl WebhookRetryConfig {
    /// The schedule core applies.
    pub fn schedule(&self) -> RetrySchedule {
        RetrySchedule {
            initial: self.initial,
            max_interval: self.max_interval,
            give_up_after: self.give_up_after,
            jitter: self.jitter,
        }
    }
}

/// One `[[webhooks.endpoints]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigWebhookEndpoint {
    /// The app whose events it receives.
    pub app: String,
    /// Its name, unique within the app (its id is `cfg_<app>_<name>`).
    pub name: String,
    /// Where deliveries go.
    pub url: String,
    /// The signing secret, `whsec_<base64>`.
    pub secret: String,
    /// The event types (`task.succeeded`, `task.failed`, `task.canceled`,
    /// `run.finished`, `budget.threshold`).
    pub events: Vec<WebhookEventType>,
    /// The shares of a USD limit it hears `budget.threshold` about (default `[0.8]`).
    #[serde(default = "thresholds_default")]
    pub budget_thresholds: Vec<BudgetThreshold>,
    /// Whether it receives deliveries (default true).
    #[serde(default = "enabled_default")]
    pub enabled: bool,
}

fn enabled_default() -> bool {
    true
}

fn thresholds_default() -> Vec<BudgetThreshold> {
    vec![BudgetThreshold::DEFAULT]
}

impl ConfigWebhookEndpoint {
    /// Its id: `cfg_<app>_<name>`.
    pub fn id(&self) -> String {
        format!("cfg_{}_{}", self.app, self.name)
    }
}

impl WebhookConfig {
    /// The allowed internal networks, parsed (invalid ones are reported by
    /// [`problems`](Self::problems)).
    pub fn networks(&self) -> Vec<ipnet::IpNet> {
        self.allowed_networks
            .iter()
            .filter_map(|n| parse_network(n).ok())
            .collect()
    }

    /// Every problem of the section, as (key, message).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut p = Vec::new();
        let mut add = |k: &str, m: String| p.push((format!("webhooks.{k}"), m));
        if self.concurrency > 10_000 {
            add("concurrency", "must be from 0 to 10000".into());
        }
        if self.per_app_concurrency == 0 || self.per_app_concurrency > 10_000 {
            add("per_app_concurrency", "must be from 1 to 10000".into());
        }
        for (i, n) in self.allowed_networks.iter().enumerate() {
            if let Err(e) = parse_network(n) {
                add(&format!("allowed_networks[{i}]"), e);
            }
        }
        if self.timeout.is_zero() {
            add("timeout", "must be positive".into());
        }
        if self.lease <= self.timeout {
            add(
                "lease",
                format!(
                    "must be longer than webhooks.timeout ({}), or a delivery would be sent \
                     twice while its attempt still runs",
                    humantime::format_duration(self.timeout)
                ),
            );
        }
        if self.poll_interval.is_zero() {
            add("poll_interval", "must be positive".into());
        }
        if self.max_response_bytes == 0 {
            add("max_response_bytes", "must be at least 1".into());
        }
        if let Err(e) = self.retry.schedule().check() {
            add("retry", e.to_string());
        }
        let mut ids = std::collections::BTreeSet::new();
        for (i, e) in self.endpoints.iter().enumerate() {
            let key = |f: &str| format!("endpoints[{i}].{f}");
            if let Err(err) = AppId::new(e.app.clone()) {
                add(&key("app"), err.to_string());
            }
            if let Err(err) = check_identifier("name", &e.name) {
                add(&key("name"), err.to_string());
            }
            if !ids.insert(e.id()) {
                add(&key("name"), "is used twice for this app".into());
            }
            if let Err(err) = tollgate_core::webhook::check_endpoint_url(&e.url, self.allow_http) {
                add(&key("url"), err.to_string());
            }
            if let Err(err) = WebhookSecret::parse(&e.secret) {
                add(&key("secret"), err.to_string());
            }
            if e.events.is_empty() {
                add(&key("events"), "name at least one event type".into());
            }
            if let Err(err) = check_thresholds(&e.budget_thresholds) {
                add(&key("budget_thresholds"), err.to_string());
            }
        }
        p
    }
}

/// A CIDR network, or a single address (its /32 or /128).
fn parse_network(text: &str) -> Result<ipnet::IpNet, String> {
    text.parse::<ipnet::IpNet>()
        .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("{text:?} is not a network (e.g. \"10.0.0.0/8\") or an address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(app: &str, name: &str, url: &str, secret: &str) -> ConfigWebhookEndpoint {
        ConfigWebhookEndpoint {
            app: app.into(),
            name: name.into(),
            url: url.into(),
            secret: secret.into(),
            events: vec![WebhookEventType::TaskFailed],
            budget_thresholds: vec![BudgetThreshold::DEFAULT],
            enabled: true,
        }
    }

    fn keys(c: &WebhookConfig) -> Vec<String> {
        c.problems().into_iter().map(|(k, _)| k).collect()
    }

    #[test]
    fn the_default_is_valid_and_https_only() {
        let c = WebhookConfig::default();
        assert!(keys(&c).is_empty());
        assert!(!c.allow_http);
        assert!(c.networks().is_empty());
    }

    #[test]
    fn every_problem_names_its_key() {
        let c = WebhookConfig {
            per_app_concurrency: 0,
            allowed_networks: vec!["10.0.0.0/8".into(), "127.0.0.1".into(), "nope".into()],
            timeout: Duration::from_secs(10),
            lease: Duration::from_secs(10),
            retry: WebhookRetryConfig {
                jitter: 2.0,
                ..WebhookRetryConfig::default()
            },
            endpoints: vec![
                endpoint(
                    "acme",
                    "main",
                    "https://h.example/x",
                    "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                ),
                ConfigWebhookEndpoint {
                    budget_thresholds: Vec::new(),
                    ..endpoint("acme", "main", "http://h.example/x", "plain")
                },
            ],
            ..WebhookConfig::default()
        };
        assert_eq!(
            keys(&c),
            vec![
                "webhooks.per_app_concurrency",
                "webhooks.allowed_networks[2]",
                "webhooks.lease",
                "webhooks.retry",
                "webhooks.endpoints[1].name",
                "webhooks.endpoints[1].url",
                "webhooks.endpoints[1].secret",
                "webhooks.endpoints[1].budget_thresholds",
            ]
        );
        assert_eq!(c.networks().len(), 2, "a single address is its own network");
        assert_eq!(c.endpoints[0].id(), "cfg_acme_main");
    }
}
