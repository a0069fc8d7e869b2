//! The HTTP client every dialect posts with: timeouts, the provider's credentials and
//! extra headers, docs/conformance.md#provider-pace pace and pauses, bounded retries with
//! backoff, bounded reading of the answer, and the waits the provider's headers ask for
//! ([`retry_after`], read defensively in [`super::wait`]).
//!
//! A failure that may pass (HTTP 408, 409, 429, 5xx, a timeout, a connection error) is
//! retried up to `max_retries` times; when retries run out, or the provider asks to wait
//! longer than `max_retry_delay`, the call answers [`ProviderError::Unavailable`] (with
//! the wait the provider asked for) so a caller may try another deployment later. Any
//! other failure (4xx, a malformed answer) is [`ProviderError::Failed`].

use crate::config::{ConfigError, HeaderValueSource, ProviderConfig};
use crate::metrics as m;
use crate::provider::pace::{PaceTicket, ProviderPace};
use crate::provider::sse::{SseDecoder, SseEvent, StreamBroke, StreamParser};
use crate::provider::wait::retry_after;
use crate::provider::{ProviderAnswer, ProviderError};
use crate::stream::StreamSink;
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;
use std::fmt;
use std::time::{Duration, SystemTime};

/// Longest excerpt of an error body kept in a message, in characters.
const MAX_BODY_EXCERPT: usize = 500;

/// How a dialect sends its API key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKeyHeader {
    /// `Authorization: Bearer <key>` (OpenAI-compatible).
    Bearer,
    /// The key as the value of a header of its own (`x-api-key`, `api-key`).
    Named(&'static str),
}

/// Reads, from an answer's headers, how long the provider will refuse calls (a limit
/// whose remaining count is zero), if it says. `None`: nothing exhausted.
pub type ExhaustedLimits = fn(&HeaderMap, SystemTime) -> Option<Duration>;

/// One provider's HTTP client.
pub struct HttpClient {
    name: String,
    client: reqwest::Client,
    /// The API key's header and the configured extra headers.
    headers: HeaderMap,
    max_retries: u32,
    retry_backoff: Duration,
    max_retry_delay: Duration,
    pace: Option<ProviderPace>,
}

impl fmt::Debug for HttpClient {
    // Never print the headers: they hold the API key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpClient")
            .field("name", &self.name)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("max_retries", &self.max_retries)
            .field("pace", &self.pace)
            .finish_non_exhaustive()
    }
}

impl HttpClient {
    /// The client of `[providers.<name>]`: reads the API key (`api_key_env`, sent as
    /// `key_header`) and the extra headers' environment variables now, so a missing one
    /// fails at start-up rather than on the first task.
    pub fn new(
        name: &str,
        config: &ProviderConfig,
        key_header: ApiKeyHeader,
    ) -> Result<HttpClient, ConfigError> {
        let mut headers = HeaderMap::new();
        for (header, source) in &config.headers {
            let at = || format!("providers.{name}.headers.{header}");
            let value = match source {
                HeaderValueSource::Literal(v) => v.clone(),
                HeaderValueSource::Env { env } => std::env::var(env).map_err(|_| {
                    ConfigError::at(at(), format!("the environment variable {env} is not set"))
                })?,
            };
            let header_name = HeaderName::from_bytes(header.as_bytes())
                .map_err(|_| ConfigError::at(at(), "is not a valid HTTP header name"))?;
            let mut value = HeaderValue::from_str(&value)
                .map_err(|_| ConfigError::at(at(), "is not a valid HTTP header value"))?;
            value.set_sensitive(matches!(source, HeaderValueSource::Env { .. }));
            headers.insert(header_name, value);
        }
        if let Some(var) = &config.api_key_env {
            let key = std::env::var(var).map_err(|_| {
                ConfigError::at(
                    format!("providers.{name}.api_key_env"),
                    format!("the environment variable {var} is not set"),
                )
            })?;
            let (header, text) = match key_header {
                ApiKeyHeader::Bearer => (reqwest::header::AUTHORIZATION, format!("Bearer {key}")),
                ApiKeyHeader::Named(h) => (HeaderName::from_static(h), key),
            };
            let mut value = HeaderValue::from_str(&text).map_err(|_| {
                ConfigError::at(
                    format!("providers.{name}.api_key_env"),
                    format!("the value of {var} is not a valid HTTP header value"),
                )
            })?;
            value.set_sensitive(true);
            headers.insert(header, value);
        }
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout.min(Duration::from_secs(10)))
            .user_agent(concat!("tollgate/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| {
                ConfigError::at(
                    format!("providers.{name}"),
                    format!("cannot build an HTTP client: {e}"),
                )
            })?;
        Ok(HttpClient {
            name: name.to_string(),
            client,
            headers,
            max_retries: config.max_retries,
            retry_backoff: config.retry_backoff,
            max_retry_delay: config.max_retry_delay,
            pace: None,
        })
    }

    /// docs/conformance.md#provider-pace: paces this provider's calls with the schedules
    /// every replica shares.
    pub fn with_pace(mut self, pace: Option<ProviderPace>) -> HttpClient {
        self.pace = pace;
        self
    }

    /// Adds a header sent with every request (a dialect's own, e.g. `anthropic-version`).
    pub fn with_header(mut self, name: &'static str, value: HeaderValue) -> HttpClient {
        self.headers
            .entry(HeaderName::from_static(name))
            .or_insert(value);
        self
    }

    /// Whether calls wait for a turn on a token or request pace (and so need a token
    /// estimate).
    pub fn is_paced(&self) -> bool {
        self.pace.as_ref().is_some_and(ProviderPace::is_paced)
    }

    /// A call is about to start: an unpaced provider begins reading its pause
    /// ([`ProviderPace::prefetch`]).
    pub fn prefetch_pause(&self) {
        if let Some(pace) = &self.pace {
            pace.prefetch();
        }
    }

    /// Settles a call's pace ticket with the usage its answer reported.
    pub async fn settle(
        &self,
        ticket: Option<PaceTicket>,
        parsed: &Result<ProviderAnswer, ProviderError>,
    ) {
        let (Some(pace), Some(ticket)) = (&self.pace, &ticket) else {
            return;
        };
        let used = match parsed {
            Ok(a) => Some(a.usage),
            Err(ProviderError::InvalidOutput { usage, .. }) => Some(*usage),
            Err(_) => None,
        };
        if let Some(u) = used {
            pace.settle(ticket, u.input_tokens.saturating_add(u.output_tokens))
                .await;
        }
    }

    /// POSTs `body` to `url`, retrying what may succeed later. Returns the answer's JSON,
    /// when paced the ticket to settle with its usage, and whether an earlier try may have
    /// been billed ([`Posted`]). `model` names the pace
    /// schedule, `estimate` the call's token bound; an answer body longer than
    /// `max_answer_bytes` is not read further. `exhausted` reads the dialect's rate-limit
    /// headers: a limit it reports exhausted pauses the provider (at most `max_pause`)
    /// until it resets, and sets the pause of a 429 that names no `retry-after`.
    pub async fn post(
        &self,
        url: &str,
        body: &Value,
        model: &str,
        estimate: u64,
        max_answer_bytes: usize,
        exhausted: ExhaustedLimits,
    ) -> Result<Posted, ProviderError> {
        let reading = Reading::Json;
        self.send(
            url,
            body,
            model,
            estimate,
            max_answer_bytes,
            exhausted,
            reading,
        )
        .await
    }

    /// [`post`](Self::post) of a request that asks for a streamed answer: a
    /// `text/event-stream` answer is read event by event with a fresh parser from
    /// `parser` for each try, its pieces published to `sink` (a try after one that broke
    /// off restarts them), and answered as the parser rebuilds it; output past
    /// `max_output_bytes` stops it. A server that answers with plain JSON is read as
    /// [`post`](Self::post) reads it.
    #[allow(clippy::too_many_arguments)] // `post`'s, and how to read the stream
    pub async fn post_streaming(
        &self,
        url: &str,
        body: &Value,
        model: &str,
        estimate: u64,
        max_output_bytes: usize,
        exhausted: ExhaustedLimits,
        parser: &(dyn Fn() -> Box<dyn StreamParser> + Sync),
        sink: &StreamSink,
    ) -> Result<Posted, ProviderError> {
        let reading = Reading::Stream { parser, sink };
        let limit = super::answer_limit(max_output_bytes);
        self.send(url, body, model, estimate, limit, exhausted, reading)
            .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn send(
        &self,
        url: &str,
        body: &Value,
        model: &str,
        estimate: u64,
        max_answer_bytes: usize,
        exhausted: ExhaustedLimits,
        reading: Reading<'_>,
    ) -> Result<Posted, ProviderError> {
        let text = serde_json::to_string(body)
            .map_err(|e| ProviderError::Failed(format!("cannot encode the request: {e}")))?;
        let mut attempt: u32 = 0;
        // Whether a failed try may have been processed (and billed) by the provider.
        let mut maybe_billed = false;
        loop {
            let ticket = match &self.pace {
                Some(pace) => Some(pace.wait_turn(model, estimate).await),
                None => None,
            };
            let request = self
                .client
                .post(url)
                .headers(self.headers.clone())
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(text.clone());
            let (message, retry_after) = match request.send().await {
                Ok(response) if response.status().is_success() => {
                    if let (Some(pace), Some(wait)) = (
                        &self.pace,
                        exhausted(response.headers(), SystemTime::now()).filter(|w| !w.is_zero()),
                    ) {
                        // The provider says its next call would be refused: every
                        // replica waits for the limit's reset instead of meeting a 429.
                        let pause = pace.pause(wait).await;
                        tracing::info!(provider = %self.name, ?pause, "rate limit exhausted: provider paused");
                    }
                    match reading.read(response, max_answer_bytes).await {
                        Ok(answer) => {
                            return Ok(Posted {
                                answer,
                                ticket,
                                billed_before: maybe_billed,
                            });
                        }
                        Err(ReadError::Provider(e)) => return Err(e),
                        Err(ReadError::Broken(message)) => {
                            maybe_billed = true;
                            (message, None)
                        }
                        Err(ReadError::TooLarge) => {
                            return Err(ProviderError::OutputTooLarge(format!(
                                "the provider's answer is longer than {max_answer_bytes} bytes, \
                                 more than any output within the output limit needs \
                                 (max_output_bytes)"
                            )));
                        }
                    }
                }
                Ok(response) => {
                    let status = response.status();
                    let retry_after = retry_after(response.headers());
                    let limits = exhausted(response.headers(), SystemTime::now());
                    let text = response.text().await.unwrap_or_default();
                    let message = format!("HTTP {status}: {}", excerpt(&text));
                    if status == StatusCode::TOO_MANY_REQUESTS {
                        metrics::counter!(m::PROVIDER_429S_TOTAL, "provider" => self.name.clone())
                            .increment(1);
                        if let Some(pace) = &self.pace {
                            // docs/conformance.md#provider-pace: every provider's 429 pauses it
                            // on every replica (cut to `max_pause`). A paced call then waits
                            // for its turn again; an unpaced one retries as below (its retry
                            // waits the pause out first).
                            let pause = retry_after
                                .or(limits)
                                .unwrap_or_else(|| self.backoff(attempt));
                            let pause = pace.pause(pause).await;
                            tracing::info!(provider = %self.name, ?pause, "429: provider paused");
                            if pace.is_paced() {
                                continue;
                            }
                        }
                    }
                    if !is_retryable_status(status) {
                        return Err(ProviderError::Failed(message));
                    }
                    maybe_billed |= !is_refusal(status);
                    (message, retry_after.or(limits))
                }
                Err(e) if is_transient(&e) => {
                    maybe_billed = true;
                    (describe(&e), None)
                }
                Err(e) => return Err(ProviderError::Failed(describe(&e))),
            };
            if attempt >= self.max_retries {
                return Err(ProviderError::Unavailable {
                    message: format!("{message} (gave up after {} attempts)", attempt + 1),
                    retry_after,
                    refused: !maybe_billed,
                });
            }
            let delay = match retry_after {
                Some(wait) if wait > self.max_retry_delay => {
                    return Err(ProviderError::Unavailable {
                        message: format!(
                            "{message}; the provider asked to retry after {} s, longer than \
                             max_retry_delay ({} s)",
                            wait.as_secs_f64(),
                            self.max_retry_delay.as_secs_f64()
                        ),
                        retry_after: Some(wait),
                        refused: !maybe_billed,
                    });
                }
                Some(wait) => wait,
                None => self.backoff(attempt),
            };
            tracing::debug!(provider = %self.name, attempt, ?delay, %message, "retrying");
            metrics::counter!(m::PROVIDER_RETRIES_TOTAL, "provider" => self.name.clone())
                .increment(1);
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    /// Exponential backoff with jitter: `retry_backoff · 2^attempt`, capped at
    /// `max_retry_delay`, then a random 50–100 % of that.
    fn backoff(&self, attempt: u32) -> Duration {
        let full = self
            .retry_backoff
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.max_retry_delay);
        full.mul_f64(0.5 + fastrand::f64() * 0.5)
    }
}

/// No rate-limit headers read (dialects whose headers say nothing usable).
pub fn no_exhausted_limits(_: &HeaderMap, _: SystemTime) -> Option<Duration> {
    None
}

/// A successful answer's body, read.
pub struct Posted {
    /// The answer (JSON, or the stream rebuilt into the dialect's JSON answer).
    pub answer: Value,
    /// The pace ticket to settle with the answer's usage, when paced.
    pub ticket: Option<PaceTicket>,
    /// An earlier try failed after the provider may have processed it
    /// ([`ProviderAnswer::billed_before`](super::ProviderAnswer::billed_before)).
    pub billed_before: bool,
}

enum ReadError {
    TooLarge,
    /// A body that broke off while read (the connection died, a timeout), or a stream
    /// that stopped short or reported an error: a later try may succeed.
    Broken(String),
    /// The answer cannot be read (not JSON, not the dialect's events).
    Provider(ProviderError),
}

/// How a successful answer's body is read.
#[derive(Clone, Copy)]
enum Reading<'a> {
    /// One JSON document.
    Json,
    /// Server-sent events, when the server streams.
    Stream {
        parser: &'a (dyn Fn() -> Box<dyn StreamParser> + Sync),
        sink: &'a StreamSink,
    },
}

impl Reading<'_> {
    async fn read(self, response: reqwest::Response, limit: usize) -> Result<Value, ReadError> {
        let streamed = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.trim_start().starts_with("text/event-stream"));
        match self {
            Reading::Stream { parser, sink } if streamed => {
                read_stream(response, limit, parser(), sink).await
            }
            _ => {
                let bytes = read_bounded(response, limit).await?;
                parse_json_body(bytes).await.map_err(ReadError::Provider)
            }
        }
    }
}

/// A streamed answer, event by event: pieces published as they come, the answer rebuilt
/// by `parser`. Output past `limit` bytes stops it.
async fn read_stream(
    mut response: reqwest::Response,
    limit: usize,
    mut parser: Box<dyn StreamParser>,
    sink: &StreamSink,
) -> Result<Value, ReadError> {
    // A try after one that broke off: what that one published is void.
    sink.restart("the provider's answer broke off: asked again");
    let mut decoder = SseDecoder::default();
    let feed = |events: Vec<SseEvent>, parser: &mut Box<dyn StreamParser>| {
        for event in events {
            parser
                .event(&event.name, &event.data, sink)
                .map_err(|broke| match broke {
                    StreamBroke::Broken(m) => ReadError::Broken(m),
                    StreamBroke::Failed(m) => ReadError::Provider(ProviderError::Failed(m)),
                })?;
            if parser.output_bytes() > limit {
                return Err(ReadError::TooLarge);
            }
        }
        Ok(())
    };
    while let Some(chunk) = response.chunk().await.map_err(body_broke)? {
        feed(decoder.feed(&chunk), &mut parser)?;
    }
    feed(decoder.finish().into_iter().collect(), &mut parser)?;
    if !parser.complete() {
        return Err(ReadError::Broken(
            "the provider's stream ended before its answer did".into(),
        ));
    }
    Ok(parser.answer())
}

/// A failure to read the body of an answer that had begun (200): it broke off, so the
/// provider may have done (and billed) the work and a later try may succeed — never a
/// permanent failure. reqwest reports every failure to read a body frame as a decode
/// error (`Response::chunk`), whatever its cause (a connection that died mid-answer, a
/// timeout); with no content decoding enabled it never concerns the body's content,
/// which the dialect's parser reads.
fn body_broke(e: reqwest::Error) -> ReadError {
    ReadError::Broken(describe(&e))
}

/// The body, chunk by chunk, stopping past `limit` bytes.
async fn read_bounded(mut response: reqwest::Response, limit: usize) -> Result<Vec<u8>, ReadError> {
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(ReadError::TooLarge);
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(body_broke)? {
        if bytes.len() + chunk.len() > limit {
            return Err(ReadError::TooLarge);
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// Parses an answer body off the async runtime (it may be megabytes).
async fn parse_json_body(bytes: Vec<u8>) -> Result<Value, ProviderError> {
    crate::cpu::run(None, move |_| {
        serde_json::from_slice::<Value>(&bytes).map_err(|e| {
            ProviderError::Failed(format!(
                "the provider's answer is not JSON ({e}): {}",
                excerpt(&String::from_utf8_lossy(
                    &bytes[..bytes.len().min(4 * MAX_BODY_EXCERPT)]
                ))
            ))
        })
    })
    .await
    .map_err(|panic| {
        ProviderError::Failed(format!("reading the provider's answer failed: {panic}"))
    })?
}

fn is_retryable_status(status: StatusCode) -> bool {
    status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::CONFLICT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

/// docs/routes.md, "What is charged when": an answer that refuses the request before
/// processing it (rate limited, 503 unavailable, Anthropic's 529 overloaded): no tokens
/// were processed, nothing can have been billed.
fn is_refusal(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::SERVICE_UNAVAILABLE
        || status.as_u16() == 529
}

fn is_transient(e: &reqwest::Error) -> bool {
    e.is_timeout() || e.is_connect() || e.is_request() || e.is_body()
}

/// An error and its causes, e.g. "error sending request: connection refused".
fn describe(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() {
        format!("timed out: {e}")
    } else {
        e.to_string()
    };
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `text` cut to its first 500 characters (for error messages).
pub fn excerpt(text: &str) -> String {
    match text.char_indices().nth(MAX_BODY_EXCERPT) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}
