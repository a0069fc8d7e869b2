//! Provider dialects against scripted fake servers on 127.0.0.1: Anthropic's Messages
//! API (request shape, cache tokens priced), Azure OpenAI (deployment URL, `api-key`),
//! every structured-output mode for every kind in both dialects, a server that refuses
//! `response_format: json_schema` like llama-cpp-python, extra headers from literals and
//! the environment, transient failures as `Unavailable` with the provider paused, and
//! configuration errors.

// figment's error type is large; that is figment's choice, and fine in tests.
#![allow(clippy::result_large_err)]

mod common;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use common::*;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tollgate_core::{ErrorCode, ModelRef, TaskKind, TaskRequest, TaskStatus};
use tollgate_engine::config::{
    HeaderValueSource, ModelConfig, ModelPrices, ProviderConfig, ProviderKind, StructuredOutput,
};
use tollgate_engine::provider::{ProviderCall, ProviderError, ProviderRegistry};
use tollgate_engine::{EngineConfig, Submission, Tollgate};

on_both_backends!(anthropic_sends_its_dialect_and_prices_cache_reads_and_writes);

/// One request the fake received.
#[derive(Debug, Clone)]
struct Seen {
    uri: String,
    headers: HeaderMap,
    body: Value,
}

/// A reply: status, headers, JSON body.
type Reply = (u16, Vec<(&'static str, String)>, Value);
type Responder = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

#[derive(Clone)]
struct FakeState {
    seen: Arc<Mutex<Vec<Seen>>>,
    respond: Responder,
}

/// A scripted fake of any dialect: every POST is recorded and answered by `respond`.
struct Fake {
    base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Fake {
    async fn start(respond: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Fake {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let state = FakeState {
            seen: seen.clone(),
            respond: Arc::new(respond),
        };
        let app = Router::new().fallback(handle).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Fake { base, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn handle(
    State(state): State<FakeState>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let seen = Seen {
        uri: uri.to_string(),
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    };
    let (status, headers, body) = (state.respond)(&seen);
    state.seen.lock().unwrap().push(seen);
    let mut response = (StatusCode::from_u16(status).unwrap(), axum::Json(body)).into_response();
    for (name, value) in headers {
        response.headers_mut().insert(name, value.parse().unwrap());
    }
    response
}

fn header<'a>(seen: &'a Seen, name: &str) -> Option<&'a str> {
    seen.headers.get(name).and_then(|v| v.to_str().ok())
}

/// A variable cargo sets for every test process: a header value "from the environment"
/// without touching the environment.
const ENV_VAR: &str = "CARGO_PKG_NAME";

fn model(provider: &str, name: &str) -> ModelConfig {
    ModelConfig {
        provider: provider.into(),
        model: name.into(),
        ..ModelConfig::default()
    }
}

fn config_with(provider: ProviderConfig, model_name: &str) -> EngineConfig {
    let mut c = fast_config();
    let mut provider = provider;
    provider.retry_backoff = Duration::from_millis(10);
    provider.timeout = Duration::from_secs(10);
    c.providers.insert("p".into(), provider);
    c.models.insert("default".into(), model("p", model_name));
    c
}

fn submission(kind: TaskKind, key_: &str, request: Value) -> Submission {
    Submission::application(app(), scope(), key(key_), kind, request)
}

/// One request of each kind, each input carrying a marker the fakes answer by, and the
/// output a valid answer holds (as the model gives it: an extraction's non-object schema
/// wrapped as `{"value": …}`).
fn four_kinds() -> Vec<(TaskKind, Value, &'static str, Value)> {
    vec![
        (
            TaskKind::Classify,
            json!({"input": "K-CLASSIFY win a cruise", "labels": ["spam", "ham"]}),
            "K-CLASSIFY",
            json!({"label": "spam", "confidence": 0.9}),
        ),
        (
            TaskKind::ClassifyMany,
            json!({"items": [{"id": "a", "input": "K-MANY one"}, {"id": "b", "input": "two"}],
                   "labels": ["spam", "ham"]}),
            "K-MANY",
            json!({"results": [{"id": "a", "label": "spam"}, {"id": "b", "label": "ham"}]}),
        ),
        (
            TaskKind::ExtractData,
            json!({"input": "K-EXTRACT Ada and Grace",
                   "schema": {"type": "array", "items": {"type": "string"}}}),
            "K-EXTRACT",
            json!({"value": ["Ada", "Grace"]}),
        ),
        (
            TaskKind::GenerateText,
            json!({"prompt": "K-GENERATE say hi", "max_output_tokens": 20}),
            "K-GENERATE",
            json!("hi there"),
        ),
    ]
}

/// The answer a fake gives: the marker found in the body picks the kind's output,
/// which goes where the request's mode expects it (a tool call when a tool is
/// offered, else text).
fn answer_for(dialect: ProviderKind, body: &Value) -> Value {
    let text = body.to_string();
    let (_, _, _, output) = four_kinds()
        .into_iter()
        .find(|(_, _, marker, _)| text.contains(marker))
        .expect("a marker in the request");
    let content = match &output {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let tool = body.get("tools").map(|t| t[0].clone());
    match dialect {
        ProviderKind::Anthropic => {
            let block = match tool {
                Some(t) => {
                    json!({"type": "tool_use", "id": "t1", "name": t["name"], "input": output})
                }
                None => json!({"type": "text", "text": content}),
            };
            json!({"content": [block], "stop_reason": "end_turn",
                   "usage": {"input_tokens": 10, "output_tokens": 5}})
        }
        _ => {
            let message = match tool {
                Some(t) => json!({"role": "assistant", "content": null, "tool_calls": [{
                    "id": "c1", "type": "function",
                    "function": {"name": t["function"]["name"], "arguments": content}}]}),
                // A talkative local model: text around the JSON.
                None if body.get("response_format").is_none() && output.is_object() => {
                    json!({"role": "assistant", "content": format!("Here you go:\n```json\n{content}\n```")})
                }
                None => json!({"role": "assistant", "content": content}),
            };
            json!({"choices": [{"message": message}],
                   "usage": {"prompt_tokens": 10, "completion_tokens": 5}})
        }
    }
}

/// The system text a request carries, in either dialect.
fn system_text(dialect: ProviderKind, body: &Value) -> String {
    match dialect {
        ProviderKind::Anthropic => body["system"].as_str().unwrap_or("").to_string(),
        _ => body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "system")
            .map(|m| m["content"].as_str().unwrap().to_string())
            .collect(),
    }
}

/// Submits the four kinds and waits for them.
async fn run_four_kinds(engine: &Tollgate, tag: &str) -> Vec<tollgate_core::Task> {
    let mut tasks = Vec::new();
    for (kind, request, marker, _) in four_kinds() {
        let id = engine
            .submit(submission(kind, &format!("{tag}-{marker}"), request))
            .await
            .unwrap()
            .task
            .id;
        tasks.push(finished(engine, id).await);
    }
    tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_structured_output_mode_gives_valid_outputs_for_all_four_kinds() {
    let cases = [
        (ProviderKind::Openai, StructuredOutput::JsonSchema),
        (ProviderKind::Openai, StructuredOutput::JsonObject),
        (ProviderKind::Openai, StructuredOutput::Tool),
        (ProviderKind::Openai, StructuredOutput::Prompt),
        (ProviderKind::Anthropic, StructuredOutput::JsonSchema),
        (ProviderKind::Anthropic, StructuredOutput::Tool),
        (ProviderKind::Anthropic, StructuredOutput::Prompt),
    ];
    for (dialect, mode) in cases {
        let fake = Fake::start(move |seen| (200, vec![], answer_for(dialect, &seen.body))).await;
        let mut provider = match dialect {
            ProviderKind::Anthropic => ProviderConfig::anthropic(format!("{}/v1", fake.base)),
            _ => ProviderConfig::openai(format!("{}/v1", fake.base)),
        };
        provider.structured_output = Some(mode);
        let db = TestDb::sqlite("dialect-modes");
        let engine = db.engine(config_with(provider, "m")).await;
        let handle = engine.start().await.unwrap();
        let tasks = run_four_kinds(&engine, mode.as_str()).await;
        for (task, (kind, _, _, _)) in tasks.iter().zip(four_kinds()) {
            assert_eq!(
                task.status,
                TaskStatus::Succeeded,
                "{dialect:?} {mode:?} {kind:?}: {:?}",
                task.error
            );
        }
        assert_eq!(tasks[2].output, Some(json!(["Ada", "Grace"])));
        assert_eq!(tasks[3].output, Some(json!({"text": "hi there"})));
        for seen in fake.seen() {
            let body = &seen.body;
            let structured = !body.to_string().contains("K-GENERATE");
            let system = system_text(dialect, body);
            let states_schema = system.contains("JSON Schema");
            let what = format!("{dialect:?} {mode:?} {body}");
            match (mode, structured) {
                (_, false) => {
                    assert!(body.get("tools").is_none() && body.get("response_format").is_none());
                }
                (StructuredOutput::JsonSchema, true) if dialect == ProviderKind::Anthropic => {
                    assert_eq!(
                        body["output_config"]["format"]["type"], "json_schema",
                        "{what}"
                    );
                }
                (StructuredOutput::JsonSchema, true) => {
                    assert_eq!(body["response_format"]["type"], "json_schema", "{what}");
                }
                (StructuredOutput::JsonObject, true) => {
                    assert_eq!(
                        body["response_format"],
                        json!({"type": "json_object"}),
                        "{what}"
                    );
                    assert!(states_schema, "{what}");
                }
                (StructuredOutput::Tool, true) => {
                    assert!(body["tools"].is_array(), "{what}");
                    assert!(body["tool_choice"].is_object(), "{what}");
                    assert!(body.get("response_format").is_none(), "{what}");
                }
                (StructuredOutput::Prompt, true) => {
                    assert!(
                        body.get("tools").is_none()
                            && body.get("response_format").is_none()
                            && body.get("output_config").is_none(),
                        "{what}"
                    );
                    assert!(states_schema, "{what}");
                }
            }
        }
        handle.shutdown(Duration::from_secs(5)).await;
    }
}

/// llama-cpp-python's server answers a `response_format` of type `json_schema` with an
/// error; `json_object` and `prompt` get valid outputs from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_refusing_json_schema_works_with_json_object_and_prompt() {
    let fake = Fake::start(|seen| {
        if seen.body["response_format"]["type"] == "json_schema" {
            return (
                400,
                vec![],
                json!({"detail": "response_format: json_schema is not supported"}),
            );
        }
        (200, vec![], answer_for(ProviderKind::Openai, &seen.body))
    })
    .await;
    for mode in [
        StructuredOutput::JsonSchema,
        StructuredOutput::JsonObject,
        StructuredOutput::Prompt,
    ] {
        let mut provider = ProviderConfig::openai(format!("{}/v1", fake.base));
        provider.structured_output = Some(mode);
        let db = TestDb::sqlite("dialect-llama");
        let engine = db.engine(config_with(provider, "smollm2-135m")).await;
        let handle = engine.start().await.unwrap();
        let tasks = run_four_kinds(&engine, mode.as_str()).await;
        for task in &tasks[..3] {
            if mode == StructuredOutput::JsonSchema {
                assert_eq!(task.status, TaskStatus::Failed);
                let error = task.error.as_ref().unwrap();
                assert_eq!(error.code, ErrorCode::ProviderError);
                assert!(error.message.contains("400"), "{}", error.message);
            } else {
                assert_eq!(
                    task.status,
                    TaskStatus::Succeeded,
                    "{mode:?}: {:?}",
                    task.error
                );
            }
        }
        // Free text never asks for a format.
        assert_eq!(tasks[3].status, TaskStatus::Succeeded);
        handle.shutdown(Duration::from_secs(5)).await;
    }
}

async fn anthropic_sends_its_dialect_and_prices_cache_reads_and_writes(db: TestDb) {
    let fake = Fake::start(|seen| {
        let mut answer = answer_for(ProviderKind::Anthropic, &seen.body);
        answer["usage"] = json!({"input_tokens": 10, "output_tokens": 5,
            "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 200});
        (200, vec![], answer)
    })
    .await;
    let mut provider = ProviderConfig::anthropic(format!("{}/v1/", fake.base));
    provider.api_key_env = Some(ENV_VAR.into());
    provider.headers = BTreeMap::from([
        (
            "x-team".to_string(),
            HeaderValueSource::Literal("search".into()),
        ),
        (
            "x-from-env".to_string(),
            HeaderValueSource::Env {
                env: ENV_VAR.into(),
            },
        ),
    ]);
    let mut config = config_with(provider, "claude-sonnet-4-5");
    config.models.get_mut("default").unwrap().prices = Some(ModelPrices {
        input_per_million: 3.0,
        output_per_million: 15.0,
        cached_input_per_million: Some(0.30),
        cache_write_input_per_million: Some(3.75),
    });
    let engine = db.engine(config).await;
    let handle = engine.start().await.unwrap();
    let id = engine
        .submit(classify("anthropic", "K-CLASSIFY win a cruise"))
        .await
        .unwrap()
        .task
        .id;
    let task = finished(&engine, id).await;
    assert_eq!(task.status, TaskStatus::Succeeded, "{:?}", task.error);
    assert_eq!(
        task.output,
        Some(json!({"label": "spam", "confidence": 0.9}))
    );
    let usage = task.usage.unwrap();
    assert_eq!(
        (
            usage.input_tokens,
            usage.output_tokens,
            usage.cached_input_tokens,
            usage.cache_write_input_tokens
        ),
        (1210, 5, Some(1000), Some(200))
    );
    // 10 × $3 + 1,000 × $0.30 + 200 × $3.75 + 5 × $15 per million = $0.001155.
    let cost = usage.cost_usd.unwrap();
    assert!((cost - 0.001155).abs() < 1e-9, "{cost}");

    let seen = fake.seen();
    assert_eq!(seen.len(), 1);
    let request = &seen[0];
    assert_eq!(request.uri, "/v1/messages");
    let key = std::env::var(ENV_VAR).unwrap();
    assert_eq!(header(request, "x-api-key"), Some(key.as_str()));
    assert_eq!(header(request, "x-from-env"), Some(key.as_str()));
    assert_eq!(header(request, "x-team"), Some("search"));
    assert_eq!(header(request, "anthropic-version"), Some("2023-06-01"));
    assert_eq!(header(request, "authorization"), None);
    let body = &request.body;
    assert_eq!(body["model"], "claude-sonnet-4-5");
    assert_eq!(body["max_tokens"], 4096, "the default output bound is sent");
    assert!(body["system"].as_str().unwrap().contains("Classify"));
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": "K-CLASSIFY win a cruise"}])
    );
    assert_eq!(body["tools"][0]["name"], "classify");
    assert_eq!(
        body["tools"][0]["input_schema"]["properties"]["label"]["enum"],
        json!(["spam", "ham"])
    );
    assert_eq!(
        body["tool_choice"],
        json!({"type": "tool", "name": "classify"})
    );
    handle.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_calls_the_deployment_url_with_its_api_key() {
    let fake = Fake::start(|seen| (200, vec![], answer_for(ProviderKind::Azure, &seen.body))).await;
    let mut provider = ProviderConfig::azure(fake.base.clone());
    provider.api_key_env = Some(ENV_VAR.into());
    provider.api_version = Some("2025-01-01-preview".into());
    let db = TestDb::sqlite("dialect-azure");
    let engine = db.engine(config_with(provider, "prod-gpt4o")).await;
    let handle = engine.start().await.unwrap();
    let id = engine
        .submit(classify("azure", "K-CLASSIFY win"))
        .await
        .unwrap()
        .task
        .id;
    let task = finished(&engine, id).await;
    assert_eq!(task.status, TaskStatus::Succeeded, "{:?}", task.error);
    let seen = fake.seen();
    assert_eq!(
        seen[0].uri,
        "/openai/deployments/prod-gpt4o/chat/completions?api-version=2025-01-01-preview"
    );
    let key = std::env::var(ENV_VAR).unwrap();
    assert_eq!(header(&seen[0], "api-key"), Some(key.as_str()));
    assert_eq!(header(&seen[0], "authorization"), None);
    assert_eq!(seen[0].body["response_format"]["type"], "json_schema");
    handle.shutdown(Duration::from_secs(5)).await;
}

/// One classify call straight to the provider `p` of `config`, paced through `db`.
async fn call_provider(db: &TestDb, config: &EngineConfig) -> Result<Value, ProviderError> {
    let registry = ProviderRegistry::from_config_paced(config, db.store().await).unwrap();
    let request = TaskRequest::parse(
        TaskKind::Classify,
        &json!({"input": "K-CLASSIFY x", "labels": ["spam", "ham"]}),
    )
    .unwrap();
    let schema = request.output_schema();
    let model = ModelRef::new("p", "m");
    let call = ProviderCall {
        model: &model,
        request: &request,
        output_schema: &schema,
        previous_error: None,
        max_output_bytes: tollgate_core::DEFAULT_MAX_OUTPUT_BYTES,
    };
    registry
        .get("p")
        .unwrap()
        .complete(call)
        .await
        .map(|a| a.output)
}

async fn pause_left(db: &TestDb) -> Duration {
    db.store()
        .await
        .pace_pause_left(&["p".to_string()])
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_is_unavailable_and_pauses_the_provider() {
    let fake = Fake::start(|_| {
        (
            429,
            vec![("retry-after", "7".to_string())],
            json!({"error": {"message": "slow down"}}),
        )
    })
    .await;
    let mut provider = ProviderConfig::openai(format!("{}/v1", fake.base));
    provider.max_retries = 0;
    let config = config_with(provider, "m");
    let db = TestDb::sqlite("dialect-429");
    match call_provider(&db, &config).await {
        Err(ProviderError::Unavailable {
            message,
            retry_after,
            refused,
        }) => {
            assert_eq!(retry_after, Some(Duration::from_secs(7)));
            assert!(message.contains("429"), "{message}");
            assert!(refused, "a 429 processed nothing");
        }
        other => panic!("{other:?}"),
    }
    let left = pause_left(&db).await;
    assert!(
        left > Duration::from_secs(5) && left <= Duration::from_secs(7),
        "{left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_rate_limit_headers_pause_and_errors_are_told_apart() {
    let in_secs = |s: u64| {
        let at = std::time::SystemTime::now() + Duration::from_secs(s);
        let secs = at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        // RFC 3339 in UTC from Unix seconds.
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
            rem / 3600,
            rem / 60 % 60,
            rem % 60
        )
    };
    // A success whose headers say the request limit is used up: paused until its reset.
    let reset = in_secs(20);
    let fake = Fake::start(move |seen| {
        let answer = answer_for(ProviderKind::Anthropic, &seen.body);
        (
            200,
            vec![
                ("anthropic-ratelimit-requests-remaining", "0".to_string()),
                ("anthropic-ratelimit-requests-reset", reset.clone()),
                ("anthropic-ratelimit-tokens-remaining", "90000".to_string()),
            ],
            answer,
        )
    })
    .await;
    let db = TestDb::sqlite("dialect-anthropic-limits");
    let config = config_with(ProviderConfig::anthropic(format!("{}/v1", fake.base)), "m");
    assert!(call_provider(&db, &config).await.is_ok());
    let left = pause_left(&db).await;
    assert!(left > Duration::from_secs(15), "{left:?}");

    // A 529 (overloaded) after the provider's own retries: unavailable, not failed.
    let overloaded = Fake::start(|_| (529, vec![], json!({"type": "error"}))).await;
    let mut provider = ProviderConfig::anthropic(format!("{}/v1", overloaded.base));
    provider.max_retries = 1;
    let db = TestDb::sqlite("dialect-anthropic-529");
    let result = call_provider(&db, &config_with(provider, "m")).await;
    assert!(
        matches!(
            &result,
            Err(ProviderError::Unavailable {
                retry_after: None,
                ..
            })
        ),
        "{result:?}"
    );
    assert_eq!(overloaded.seen().len(), 2);

    // A 400 is the request's fault: failed at once, no retry.
    let refused = Fake::start(|_| (400, vec![], json!({"type": "invalid_request_error"}))).await;
    let db = TestDb::sqlite("dialect-anthropic-400");
    let config = config_with(
        ProviderConfig::anthropic(format!("{}/v1", refused.base)),
        "m",
    );
    let result = call_provider(&db, &config).await;
    assert!(
        matches!(&result, Err(ProviderError::Failed(m)) if m.contains("400")),
        "{result:?}"
    );
    assert_eq!(refused.seen().len(), 1);
}

fn load(toml: &str) -> Result<EngineConfig, figment::Error> {
    use figment::Figment;
    use figment::providers::{Format, Serialized, Toml};
    Figment::from(Serialized::defaults(EngineConfig::default()))
        .merge(Toml::string(toml))
        .extract()
}

#[test]
fn dialect_settings_load_and_bad_ones_are_named() {
    let config = load(
        r#"
[providers.claude]
kind = "anthropic"
api_key_env = "ANTHROPIC_API_KEY"
headers = { "anthropic-beta" = "prompt-caching-2024-07-31", "x-gateway" = { env = "GATEWAY_KEY" } }

[providers.az]
kind = "azure"
base_url = "https://acme.openai.azure.com"
api_version = "2024-10-21"

[providers.llama]
kind = "openai"
base_url = "http://127.0.0.1:8080/v1"
structured_output = "prompt"

[models.sonnet]
provider = "claude"
model = "claude-sonnet-4-5"
prices = { input_per_million = 3, output_per_million = 15, cached_input_per_million = 0.3, cache_write_input_per_million = 3.75 }
"#,
    )
    .unwrap();
    config.validate().unwrap();
    assert_eq!(
        config.providers["claude"].structured_output(),
        StructuredOutput::Tool
    );
    assert_eq!(
        config.providers["az"].structured_output(),
        StructuredOutput::JsonSchema
    );
    assert_eq!(
        config.providers["llama"].structured_output(),
        StructuredOutput::Prompt
    );
    assert_eq!(
        config.providers["claude"].headers["x-gateway"],
        HeaderValueSource::Env {
            env: "GATEWAY_KEY".into()
        }
    );
    // An anthropic model without an output bound sends (and reserves) 4096 tokens.
    let registry = tollgate_engine::ModelRegistry::from_config(&config).unwrap();
    let sonnet = registry
        .resolve(Some(&tollgate_core::ModelId::new("sonnet").unwrap()))
        .unwrap();
    assert_eq!(sonnet.model_ref.params["max_tokens"], 4096);
    let prices = sonnet.prices.unwrap();
    assert_eq!(prices.cache_write_input, 3_750_000);

    // Unknown kinds and modes are refused by name.
    let unknown = load("[providers.x]\nkind = \"gemini\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        unknown.contains("gemini") && unknown.contains("anthropic"),
        "{unknown}"
    );
    let bad_mode = load("[providers.x]\nkind = \"openai\"\nstructured_output = \"xml\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        bad_mode.contains("xml") && bad_mode.contains("json_object"),
        "{bad_mode}"
    );

    // Settings that cannot work are named with their key.
    let problems = load(
        r#"
[providers.claude]
kind = "anthropic"
structured_output = "json_object"

[providers.az]
kind = "azure"

[providers.o]
kind = "openai"
api_version = "2024-10-21"
headers = { "bad header" = "x" }

[providers.d]
kind = "dev"
structured_output = "prompt"
"#,
    )
    .unwrap()
    .validate()
    .unwrap_err()
    .to_string();
    for expected in [
        "providers.claude.structured_output",
        "providers.az.base_url",
        "providers.o.api_version",
        "providers.o.headers.bad header",
        "providers.d.structured_output",
    ] {
        assert!(problems.contains(expected), "{expected} in {problems}");
    }
}
