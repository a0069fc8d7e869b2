use super::*;
use tollgate_core::{ModelRef, TaskKind};

fn call_for(kind: TaskKind, raw: Value) -> (TaskRequest, Value) {
    let request = TaskRequest::parse(kind, &raw).unwrap();
    let schema = request.output_schema();
    (request, schema)
}

#[test]
fn root_references_follow_the_wrapped_schema() {
    let wrapped = wrap_schema(&json!({"anyOf": [{"type": "null"}, {"$ref": "#"}]}));
    assert_eq!(
        wrapped["properties"]["value"]["anyOf"][1]["$ref"],
        "#/properties/value"
    );
}

#[test]
fn strictness_follows_the_schema() {
    assert!(is_strict_compatible(&json!({
        "type": "object", "properties": {"a": {"type": "string"}},
        "required": ["a"], "additionalProperties": false
    })));
    assert!(!is_strict_compatible(&json!({
        "type": "object", "properties": {"a": {"type": "string"}}
    })));
}

#[test]
fn a_reask_adds_one_user_message_with_the_error_framed() {
    let (request, schema) = call_for(
        TaskKind::Classify,
        json!({"input": "Win a cruise", "labels": ["spam", "ham"]}),
    );
    let model = ModelRef::new("openai", "gpt-x");
    let mut call = ProviderCall {
        model: &model,
        request: &request,
        output_schema: &schema,
        previous_error: None,
        max_output_bytes: tollgate_core::DEFAULT_MAX_OUTPUT_BYTES,
    };
    let first = Prompt::render(&call);
    call.previous_error = Some("no");
    let again = Prompt::render(&call);
    assert_eq!(again.messages.len(), first.messages.len() + 1);
    let last = again.messages.last().unwrap();
    assert_eq!(last.role_name(), "user");
    assert_eq!(last.content.len(), REASK_FRAME_BYTES + "no".len());
    assert_eq!(again.format, first.format);
}

#[test]
fn every_mode_states_the_schema_once() {
    let (request, schema) = call_for(
        TaskKind::Classify,
        json!({"input": "Win a cruise", "labels": ["spam", "ham"]}),
    );
    let model = ModelRef::new("openai", "m");
    let call = ProviderCall {
        model: &model,
        request: &request,
        output_schema: &schema,
        previous_error: None,
        max_output_bytes: tollgate_core::DEFAULT_MAX_OUTPUT_BYTES,
    };
    let stated = |p: &Prompt| {
        p.messages
            .iter()
            .filter(|m| m.content.contains(SCHEMA_INSTRUCTIONS))
            .count()
    };
    let schema_format = Prompt::render_as(&call, StructuredOutput::JsonSchema);
    assert!(matches!(
        schema_format.format,
        Some(OutputFormat::JsonSchema { .. })
    ));
    assert_eq!(stated(&schema_format), 0);
    let object = Prompt::render_as(&call, StructuredOutput::JsonObject);
    assert_eq!(object.format, Some(OutputFormat::JsonObject));
    assert_eq!(stated(&object), 1);
    assert_eq!(object.messages.len(), schema_format.messages.len());
    let tool = Prompt::render_as(&call, StructuredOutput::Tool);
    assert!(
        matches!(&tool.format, Some(OutputFormat::Tool { name: "classify", schema: s, .. }) if s == &schema)
    );
    let prompt = Prompt::render_as(&call, StructuredOutput::Prompt);
    assert_eq!(prompt.format, None);
    assert_eq!(stated(&prompt), 1);
    // An extraction's instructions state the schema already.
    let (request, schema) = call_for(
        TaskKind::ExtractData,
        json!({"input": "Ada", "schema": {"type": "array", "items": {"type": "string"}}}),
    );
    let call = ProviderCall {
        request: &request,
        output_schema: &schema,
        ..call
    };
    let prompt = Prompt::render_as(&call, StructuredOutput::Prompt);
    assert_eq!(prompt.shape, AnswerShape::WrappedJson);
    assert!(
        prompt.messages[0]
            .content
            .contains("JSON Schema of the answer")
    );
    assert_eq!(stated(&prompt), 0);
}
