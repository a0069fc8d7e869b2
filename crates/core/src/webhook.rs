//! Webhooks (docs/webhooks.md): the events an endpoint may subscribe to, the Standard
//! Webhooks signing rule, the retry schedule and which addresses an endpoint may reach.
//! Pure rules; the store keeps the outbox, the engine delivers.

pub mod budget;

use crate::error::InvalidInput;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::net::IpAddr;
use std::time::Duration;

/// What happened, as named in an endpoint's `events` and in a payload's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum WebhookEventType {
    /// A task finished with an output.
    #[serde(rename = "task.succeeded")]
    TaskSucceeded,
    /// A task finished with an error.
    #[serde(rename = "task.failed")]
    TaskFailed,
    /// A task was canceled.
    #[serde(rename = "task.canceled")]
    TaskCanceled,
    /// A workflow run (or pipeline run) finished: succeeded, failed or canceled.
    #[serde(rename = "run.finished")]
    RunFinished,
    /// A scope's or the app's spend in a 24 h window reached a share of its USD limit
    /// (the endpoint's `budget_thresholds`).
    #[serde(rename = "budget.threshold")]
    BudgetThreshold,
}

impl WebhookEventType {
    /// Every event type, in the order documented.
    pub const ALL: [WebhookEventType; 5] = [
        WebhookEventType::TaskSucceeded,
        WebhookEventType::TaskFailed,
        WebhookEventType::TaskCanceled,
        WebhookEventType::RunFinished,
        WebhookEventType::BudgetThreshold,
    ];

    /// The stored and wire name (`task.succeeded`).
    pub const fn as_str(self) -> &'static str {
        match self {
            WebhookEventType::TaskSucceeded => "task.succeeded",
            WebhookEventType::TaskFailed => "task.failed",
            WebhookEventType::TaskCanceled => "task.canceled",
            WebhookEventType::RunFinished => "run.finished",
            WebhookEventType::BudgetThreshold => "budget.threshold",
        }
    }

    /// The event type of a name.
    pub fn parse(name: &str) -> Result<WebhookEventType, InvalidInput> {
        WebhookEventType::ALL
            .into_iter()
            .find(|t| t.as_str() == name)
            .ok_or_else(|| {
                InvalidInput::field(
                    "events",
                    format!(
                        "unknown event type {name:?}; known: {}",
                        WebhookEventType::ALL.map(|t| t.as_str()).join(", ")
                    ),
                )
            })
    }
}

/// An endpoint's subscription: a non-empty set of event types, stored as a JSON array of
/// their names in a fixed order (the store matches an event by its quoted name in it).
pub fn subscription_text(events: &[WebhookEventType]) -> Result<String, InvalidInput> {
    if events.is_empty() {
        return Err(InvalidInput::field(
            "events",
            "name at least one event type".to_string(),
        ));
    }
    let mut names: Vec<&str> = events.iter().map(|e| e.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    Ok(serde_json::to_string(&names).unwrap_or_default())
}

/// The event types of a stored subscription (unknown names are skipped).
pub fn parse_subscription(text: &str) -> Vec<WebhookEventType> {
    serde_json::from_str::<Vec<String>>(text)
        .unwrap_or_default()
        .iter()
        .filter_map(|n| WebhookEventType::parse(n).ok())
        .collect()
}

/// Prefix of a signing secret's text form.
pub const SECRET_PREFIX: &str = "whsec_";

/// An endpoint's signing secret: 24 to 64 random bytes, written `whsec_<base64>`.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret(Vec<u8>);

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(..)")
    }
}

impl WebhookSecret {
    /// A secret of these bytes (24 to 64 of them).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<WebhookSecret, InvalidInput> {
        if !(24..=64).contains(&bytes.len()) {
            return Err(InvalidInput::field(
                "secret",
                format!("must hold 24 to 64 bytes, got {}", bytes.len()),
            ));
        }
        Ok(WebhookSecret(bytes))
    }

    /// Parses `whsec_<base64>`.
    pub fn parse(text: &str) -> Result<WebhookSecret, InvalidInput> {
        let b64 = text.strip_prefix(SECRET_PREFIX).ok_or_else(|| {
            InvalidInput::field("secret", format!("must start with {SECRET_PREFIX}"))
        })?;
        let bytes = BASE64
            .decode(b64)
            .map_err(|e| InvalidInput::field("secret", format!("not base64 after whsec_: {e}")))?;
        WebhookSecret::from_bytes(bytes)
    }

    /// `whsec_<base64>`.
    pub fn to_text(&self) -> String {
        format!("{SECRET_PREFIX}{}", BASE64.encode(&self.0))
    }

    /// The Standard Webhooks signature of a message: `v1,<base64 of HMAC-SHA256 over
    /// "<id>.<timestamp>.<body>">`, keyed by the secret's bytes.
    pub fn sign(&self, id: &str, timestamp_secs: i64, body: &[u8]) -> String {
        format!("v1,{}", BASE64.encode(self.mac(id, timestamp_secs, body)))
    }

    fn mac(&self, id: &str, timestamp_secs: i64, body: &[u8]) -> Vec<u8> {
        // A key of any length is accepted by HMAC.
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp_secs.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac.finalize().into_bytes().to_vec()
    }

    /// Verifies a received message: `signatures` is the `webhook-signature` header (one
    /// or more space-separated `v1,<base64>`), the timestamp must lie within `tolerance`
    /// of `now_secs`. Compares in constant time.
    pub fn verify(
        &self,
        id: &str,
        timestamp_secs: i64,
        signatures: &str,
        body: &[u8],
        now_secs: i64,
        tolerance: Duration,
    ) -> Result<(), SignatureError> {
        let skew = now_secs.abs_diff(timestamp_secs);
        if skew > tolerance.as_secs() {
            return Err(SignatureError::Timestamp);
        }
        for sig in signatures.split(' ') {
            let Some(b64) = sig.strip_prefix("v1,") else {
                continue;
            };
            let Ok(bytes) = BASE64.decode(b64) else {
                continue;
            };
            let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key");
            mac.update(format!("{id}.{timestamp_secs}.").as_bytes());
            mac.update(body);
            if mac.verify_slice(&bytes).is_ok() {
                return Ok(());
            }
        }
        Err(SignatureError::Mismatch)
    }
}

/// Why a received webhook failed verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// `webhook-timestamp` is too far from now (a replay or a wrong clock).
    #[error("webhook timestamp outside the tolerance")]
    Timestamp,
    /// No `v1` signature matches.
    #[error("no matching webhook signature")]
    Mismatch,
}

/// When a failed delivery is tried again: exponential backoff from `initial`, doubling up
/// to `max_interval`, each wait shortened by up to `jitter` of itself at random, for
/// `give_up_after` from the first attempt; a delivery still failing then is dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetrySchedule {
    /// The wait after the first failed attempt.
    pub initial: Duration,
    /// The longest wait between attempts.
    pub max_interval: Duration,
    /// How long after its first attempt a delivery is retried at all.
    pub give_up_after: Duration,
    /// Share of each wait taken off at random (0 to 1), so endpoints that failed together
    /// are not retried together.
    pub jitter: f64,
}

impl Default for RetrySchedule {
    /// 5 s, doubling to 1 h, for 24 h, with 20 % jitter.
    fn default() -> RetrySchedule {
        RetrySchedule {
            initial: Duration::from_secs(5),
            max_interval: Duration::from_secs(3600),
            give_up_after: Duration::from_secs(24 * 3600),
            jitter: 0.2,
        }
    }
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Try again after this wait.
    RetryAfter(Duration),
    /// Give up: the delivery is dead-lettered.
    DeadLetter,
}

impl RetrySchedule {
    /// Checks the schedule: positive waits, `initial ≤ max_interval`, jitter within 0..1.
    pub fn check(&self) -> Result<(), InvalidInput> {
        if self.initial.is_zero() || self.max_interval < self.initial {
            return Err(InvalidInput::field(
                "webhooks.retry",
                "initial must be positive and at most max_interval".to_string(),
            ));
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return Err(InvalidInput::field(
                "webhooks.retry.jitter",
                format!("must be at least 0 and below 1, got {}", self.jitter),
            ));
        }
        Ok(())
    }

    /// After failed attempt number `attempts` (1 for the first), `elapsed` after the
    /// first attempt started; `random` is a number in `0..1` (the jitter's draw).
    pub fn after_failure(&self, attempts: u32, elapsed: Duration, random: f64) -> RetryDecision {
        let doublings = attempts.saturating_sub(1).min(30);
        let base = self
            .initial
            .saturating_mul(1u32 << doublings)
            .min(self.max_interval);
        let cut = base.mul_f64((self.jitter * random.clamp(0.0, 1.0)).clamp(0.0, 1.0));
        let wait = base.saturating_sub(cut).max(Duration::from_millis(1));
        if elapsed.saturating_add(wait) > self.give_up_after {
            RetryDecision::DeadLetter
        } else {
            RetryDecision::RetryAfter(wait)
        }
    }
}

/// Whether an endpoint's URL may be used: `https`, or `http` when the operator allows it.
/// Returns the host and port to resolve.
pub fn check_endpoint_url(url: &str, allow_http: bool) -> Result<(String, u16), InvalidInput> {
    let parsed =
        url::Url::parse(url).map_err(|e| InvalidInput::field("url", format!("not a URL: {e}")))?;
    let default_port = match parsed.scheme() {
        "https" => 443,
        "http" if allow_http => 80,
        "http" => {
            return Err(InvalidInput::field(
                "url",
                "must be https (the operator has not allowed http endpoints)".to_string(),
            ));
        }
        other => {
            return Err(InvalidInput::field(
                "url",
                format!("must be https, got scheme {other:?}"),
            ));
        }
    };
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(InvalidInput::field(
            "url",
            "must not carry credentials".to_string(),
        ));
    }
    let host = match parsed.host() {
        Some(url::Host::Domain(d)) => d.to_string(),
        Some(url::Host::Ipv4(ip)) => ip.to_string(),
        Some(url::Host::Ipv6(ip)) => ip.to_string(),
        None => return Err(InvalidInput::field("url", "has no host".to_string())),
    };
    if url.len() > 2048 {
        return Err(InvalidInput::field(
            "url",
            "must be at most 2048 characters".to_string(),
        ));
    }
    Ok((host, parsed.port().unwrap_or(default_port)))
}

/// Whether an address is one an endpoint may never reach unless the operator allows it:
/// loopback, private (RFC 1918, IPv6 unique local), link-local, shared (100.64/10),
/// unspecified, multicast, broadcast, documentation and benchmarking ranges, and IPv4
/// addresses written as IPv6.
pub fn is_internal_address(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
                || (o[0] == 198 && (o[1] & 0xfe) == 18)
                || o[0] >= 240
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal_address(IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] == 0x2001 && s[1] == 0x0db8)
                || (s[0] == 0x64 && s[1] == 0xff9b)
        }
    }
}

/// Whether an endpoint may connect to `ip`: any public address, and an internal one only
/// inside a network the operator allowed.
pub fn address_allowed(ip: IpAddr, allowed_networks: &[ipnet::IpNet]) -> bool {
    !is_internal_address(ip) || allowed_networks.iter().any(|n| n.contains(&ip))
}

/// The stable id of the event of a task's or run's terminal move (one per task or run:
/// either moves to a terminal state once).
pub fn terminal_event_id(task_or_run_id: &str) -> String {
    format!("{TERMINAL_EVENT_PREFIX}{task_or_run_id}")
}

/// What [`terminal_event_id`] puts before the task's or run's id.
pub const TERMINAL_EVENT_PREFIX: &str = "evt_";

/// One event of the outbox, as stored: what happened and to what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookEvent {
    /// Stable id: the `webhook-id` of every delivery of the event.
    pub id: String,
    /// The app it belongs to.
    pub app: String,
    /// What happened.
    pub event_type: WebhookEventType,
    /// The task, for task events.
    pub task_id: Option<String>,
    /// The run: a run event's, or the run a task belongs to.
    pub run_id: Option<String>,
    /// The scope of the task, run or budget.
    pub scope: Option<String>,
    /// The task's status or run's state it ended in.
    pub state: Option<String>,
    /// The error code it ended with, if any.
    pub error_code: Option<String>,
    /// Further fields of the data, merged into the payload's `data` (a budget
    /// threshold's app, limit, window, threshold and amounts).
    pub data: Option<serde_json::Value>,
    /// When it happened.
    pub created_at: crate::Timestamp,
}

impl WebhookEvent {
    /// The JSON body every delivery of the event sends (the same bytes on every retry).
    pub fn body(&self) -> serde_json::Value {
        let mut data = serde_json::Map::new();
        let mut put = |k: &str, v: &Option<String>| {
            if let Some(v) = v {
                data.insert(k.to_string(), serde_json::Value::String(v.clone()));
            }
        };
        put("task_id", &self.task_id);
        put("run_id", &self.run_id);
        put("scope", &self.scope);
        let state_key = if self.task_id.is_some() {
            "status"
        } else {
            "state"
        };
        put(state_key, &self.state);
        put("error_code", &self.error_code);
        if let Some(serde_json::Value::Object(extra)) = &self.data {
            for (k, v) in extra {
                data.insert(k.clone(), v.clone());
            }
        }
        payload(
            self.event_type,
            &self.id,
            self.created_at,
            serde_json::Value::Object(data),
        )
    }
}

/// The JSON body of a delivery: `{"type", "id", "timestamp", "data"}` (the Standard
/// Webhooks payload shape; `id` repeats the `webhook-id` header).
pub fn payload(
    event: WebhookEventType,
    id: &str,
    timestamp: crate::Timestamp,
    data: serde_json::Value,
) -> serde_json::Value {
    serde_json::json!({
        "type": event.as_str(),
        "id": id,
        "timestamp": timestamp.to_rfc3339(),
        "data": data,
    })
}

#[cfg(test)]
mod tests;
