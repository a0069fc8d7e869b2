//! `POST /openai/v1/embeddings` (docs/openai.md, "Embeddings"): OpenAI's request
//! (`input` a string or a list of strings, `model`, `encoding_format` `float` or
//! `base64`, `dimensions`, `user`) as one `embed` task, submitted, idempotent and
//! budget-admitted like a chat completion, and its vectors in OpenAI's answer,
//! `{object: "list", data: [{object: "embedding", index, embedding}], model, usage}`.
//! `base64` is each vector's little-endian `f32` bytes, base64-encoded, as OpenAI sends.

use super::error::OpenAiError;
use super::{DoorCaller, TASK_ID_HEADER, check_model, read_json_body, run_door_task, submission};
use crate::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Map, Value, json};
use tollgate_core::{StepKey, TaskKind, ValidatedRequest};

/// The step name of the door's embeddings tasks.
pub const EMBEDDINGS_STEP: &str = "openai-embeddings";

/// How the vectors are answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Float,
    Base64,
}

/// An embeddings call, read.
#[derive(Debug)]
struct EmbeddingsCall {
    model: String,
    /// The `embed` task request.
    request: Value,
    encoding: Encoding,
}

fn parse(body: &Value) -> Result<EmbeddingsCall, OpenAiError> {
    let Value::Object(map) = body else {
        return Err(OpenAiError::invalid("", "the body must be a JSON object"));
    };
    if let Some(key) = map.keys().find(|k| {
        !["input", "model", "encoding_format", "dimensions", "user"].contains(&k.as_str())
    }) {
        return Err(OpenAiError::unsupported(
            key.as_str(),
            format!("unknown parameter `{key}`"),
        ));
    }
    let get = |k: &str| map.get(k).filter(|v| !v.is_null());
    let model = match get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => {
            return Err(OpenAiError::invalid(
                "model",
                "`model` is required: a Tollgate model id (GET /openai/v1/models lists them)",
            ));
        }
    };
    let input = match get("input") {
        Some(Value::String(s)) => json!([s]),
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => json!(items),
        Some(Value::Array(_)) => {
            return Err(OpenAiError::unsupported(
                "input",
                "`input` must be a string or a list of strings: token arrays are not supported \
                 by Tollgate",
            ));
        }
        Some(_) | None => {
            return Err(OpenAiError::invalid(
                "input",
                "`input` is required: a string or a list of strings",
            ));
        }
    };
    let encoding = match get("encoding_format").map(|v| v.as_str()) {
        None | Some(Some("float")) => Encoding::Float,
        Some(Some("base64")) => Encoding::Base64,
        Some(_) => {
            return Err(OpenAiError::invalid(
                "encoding_format",
                "`encoding_format` must be \"float\" or \"base64\"",
            ));
        }
    };
    let mut request = Map::new();
    request.insert("input".into(), input);
    if let Some(d) = get("dimensions") {
        request.insert("dimensions".into(), d.clone());
    }
    // `user` identifies the end user to OpenAI; Tollgate's subject comes from the key.
    Ok(EmbeddingsCall {
        model,
        request: Value::Object(request),
        encoding,
    })
}

/// The answer's `embedding` of one vector.
fn encode(vector: &Value, encoding: Encoding) -> Value {
    match encoding {
        Encoding::Float => vector.clone(),
        Encoding::Base64 => {
            let bytes: Vec<u8> = vector
                .as_array()
                .map(|v| v.as_slice())
                .unwrap_or_default()
                .iter()
                .flat_map(|x| (x.as_f64().unwrap_or(0.0) as f32).to_le_bytes())
                .collect();
            json!(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

pub(super) async fn embeddings(
    State(s): State<AppState>,
    caller: DoorCaller,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, OpenAiError> {
    let max_request_bytes = s.tollgate.config().max_request_bytes;
    let value = read_json_body(&s, &headers, body, max_request_bytes).await?;
    let call = parse(&value)?;
    check_model(&s, &call.model)?;
    // Request-shape errors are 400 here and write nothing (the engine checks again).
    ValidatedRequest::new(TaskKind::Embed, &call.request, max_request_bytes)?;
    let (mut sub, keyed) = submission(
        &caller.0,
        &headers,
        &call.model,
        TaskKind::Embed,
        &call.request,
    )?;
    sub.step = Some(StepKey::new(EMBEDDINGS_STEP).map_err(OpenAiError::from)?);
    let task = run_door_task(&s, &caller.0, sub, keyed).await?;
    let output = task.output.clone().unwrap_or(Value::Null);
    let data: Vec<Value> = output
        .get("embeddings")
        .and_then(Value::as_array)
        .map(|v| v.as_slice())
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(index, v)| {
            json!({ "object": "embedding", "index": index, "embedding": encode(v, call.encoding) })
        })
        .collect();
    let tokens = task.usage.map_or(0, |u| u.input_tokens);
    let answer = json!({
        "object": "list",
        "data": data,
        "model": task.model.to_string(),
        "usage": { "prompt_tokens": tokens, "total_tokens": tokens },
    });
    let mut response = axum::Json(answer).into_response();
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&task.id.to_string()) {
        h.insert(TASK_ID_HEADER, v);
    }
    h.insert(
        "x-tollgate-cached",
        HeaderValue::from_static(if task.cached() { "true" } else { "false" }),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn calls_are_read_like_openai() {
        let c = parse(&json!({ "input": "hi", "model": "m" })).unwrap();
        assert_eq!(c.request, json!({ "input": ["hi"] }));
        assert_eq!(c.encoding, Encoding::Float);
        let c = parse(&json!({ "input": ["a", "b"], "model": "m", "encoding_format": "base64", "dimensions": 8, "user": "u" })).unwrap();
        assert_eq!(c.request, json!({ "input": ["a", "b"], "dimensions": 8 }));
        assert_eq!(c.encoding, Encoding::Base64);
        for (bad, param) in [
            (json!({ "input": [[1, 2]], "model": "m" }), "input"),
            (json!({ "model": "m" }), "input"),
            (json!({ "input": "x" }), "model"),
            (
                json!({ "input": "x", "model": "m", "encoding_format": "int8" }),
                "encoding_format",
            ),
            (json!({ "input": "x", "model": "m", "tools": [] }), "tools"),
        ] {
            let e = parse(&bad).unwrap_err();
            assert_eq!(e.status(), StatusCode::BAD_REQUEST, "{bad}");
            assert_eq!(e.param_name(), Some(param), "{bad}");
        }
    }

    #[test]
    fn base64_is_little_endian_f32() {
        let v = encode(&json!([1.0, -0.5]), Encoding::Base64);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap();
        assert_eq!(bytes.len(), 8);
        assert_eq!(f32::from_le_bytes(bytes[0..4].try_into().unwrap()), 1.0);
        assert_eq!(f32::from_le_bytes(bytes[4..8].try_into().unwrap()), -0.5);
    }
}
