//! Sending one delivery (docs/webhooks.md, "Addresses" and "Signing"): the Standard
//! Webhooks headers, an HTTP client that never follows redirects nor uses a proxy, and
//! connects only to addresses the operator allows — names are resolved here and every
//! internal address dropped, so the address checked is the address connected to.

use crate::config::WebhookConfig;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use tollgate_core::webhook::{WebhookSecret, address_allowed, check_endpoint_url};
use tollgate_store::webhooks::{AttemptResult, LeasedDelivery};

/// Resolves names to their allowed addresses only.
struct CheckedResolver {
    allowed: Arc<Vec<ipnet::IpNet>>,
}

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allowed = self.allowed.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let ok: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|a| address_allowed(a.ip(), &allowed))
                .collect();
            if ok.is_empty() {
                return Err(format!(
                    "{host} resolves only to addresses webhooks may not reach ({})",
                    found
                        .iter()
                        .map(|a| a.ip().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
                .into());
            }
            let addrs: reqwest::dns::Addrs = Box::new(ok.into_iter());
            Ok(addrs)
        })
    }
}

/// The client deliveries are sent with, and what it may reach.
pub(crate) struct Sender {
    client: reqwest::Client,
    allowed: Arc<Vec<ipnet::IpNet>>,
    allow_http: bool,
    max_response_bytes: usize,
}

impl Sender {
    /// A client for `config`.
    pub(crate) fn new(config: &WebhookConfig) -> Result<Sender, reqwest::Error> {
        let allowed = Arc::new(config.networks());
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent("Tollgate-Webhooks/1")
            .dns_resolver(Arc::new(CheckedResolver {
                allowed: allowed.clone(),
            }))
            .build()?;
        Ok(Sender {
            client,
            allowed,
            allow_http: config.allow_http,
            max_response_bytes: config.max_response_bytes,
        })
    }

    /// Sends one attempt of a delivery, signed at `timestamp_secs`.
    pub(crate) async fn send(&self, leased: &LeasedDelivery, timestamp_secs: i64) -> AttemptResult {
        let failed = |code: Option<u16>, error: String| AttemptResult::Failed { code, error };
        // The URL was checked when the endpoint was saved; the operator's rules may have
        // changed since.
        let host = match check_endpoint_url(&leased.url, self.allow_http) {
            Ok((host, _)) => host,
            Err(e) => return failed(None, e.to_string()),
        };
        // An address written in the URL is never resolved: check it here.
        if let Ok(ip) = host.parse::<IpAddr>()
            && !address_allowed(ip, &self.allowed)
        {
            return failed(
                None,
                format!("{ip} is an internal address webhooks may not reach"),
            );
        }
        let secret = match WebhookSecret::parse(&leased.secret) {
            Ok(s) => s,
            Err(e) => return failed(None, e.to_string()),
        };
        let body = match serde_json::to_vec(&leased.event.body()) {
            Ok(b) => b,
            Err(e) => return failed(None, e.to_string()),
        };
        let id = &leased.event.id;
        let signature = secret.sign(id, timestamp_secs, &body);
        let sent = self
            .client
            .post(&leased.url)
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp_secs.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await;
        let mut response = match sent {
            Ok(r) => r,
            Err(e) => return failed(None, describe(&e)),
        };
        let code = response.status().as_u16();
        // Read at most `max_response_bytes` of the answer, within the attempt's timeout.
        let mut read = 0usize;
        let mut excerpt = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if excerpt.len() < 200 {
                        excerpt.extend_from_slice(&chunk[..chunk.len().min(200 - excerpt.len())]);
                    }
                    read += chunk.len();
                    if read >= self.max_response_bytes {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) if response_is_success(code) => {
                    tracing::debug!(error = %e, "webhook answer cut short after a 2xx");
                    break;
                }
                Err(e) => return failed(Some(code), describe(&e)),
            }
        }
        if response_is_success(code) {
            AttemptResult::Delivered { code }
        } else {
            failed(
                Some(code),
                format!("HTTP {code}: {}", String::from_utf8_lossy(&excerpt)),
            )
        }
    }
}

fn response_is_success(code: u16) -> bool {
    (200..300).contains(&code)
}

/// The error and its causes in one line (reqwest's own message omits the cause).
fn describe(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() {
        "timed out".to_string()
    } else {
        e.to_string()
    };
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
