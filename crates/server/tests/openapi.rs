//! The OpenAPI document is part of the public contract: any change to it shows up here
//! as a snapshot diff to review (`cargo insta review`).

#[test]
fn openapi_document_is_stable() {
    insta::assert_snapshot!("openapi", tollgate_server::openapi_json());
}

#[test]
fn openapi_document_describes_every_endpoint() {
    let doc: serde_json::Value = serde_json::from_str(&tollgate_server::openapi_json()).unwrap();
    for path in [
        "/v1/tasks",
        "/v1/tasks/batch",
        "/v1/tasks/{id}",
        "/v1/tasks/{id}/cancel",
        "/v1/tasks/release",
        "/v1/scopes/{scope}/unreleased-sources",
        "/v1/scopes/{scope}/tasks",
        "/v1/runs",
        "/v1/runs/{id}",
        "/v1/runs/{id}/cancel",
        "/v1/pipelines",
        "/v1/pipelines/{name}",
        "/v1/pipelines/{name}/runs",
        "/v1/kinds",
        "/v1/models",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path} is documented");
    }
}

fn doc() -> serde_json::Value {
    serde_json::from_str(&tollgate_server::openapi_json()).unwrap()
}

fn operations(doc: &serde_json::Value) -> Vec<(String, String, serde_json::Value)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            out.push((path.clone(), method.clone(), op.clone()));
        }
    }
    out
}

#[test]
fn every_templated_path_declares_its_parameters() {
    let doc = doc();
    for (path, method, op) in operations(&doc) {
        let declared: Vec<&str> = op["parameters"]
            .as_array()
            .map(|ps| {
                ps.iter()
                    .filter(|p| p["in"] == "path")
                    .map(|p| p["name"].as_str().unwrap())
                    .collect()
            })
            .unwrap_or_default();
        let templated: Vec<&str> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
            .collect();
        assert_eq!(declared, templated, "{method} {path}");
        for p in op["parameters"].as_array().into_iter().flatten() {
            if p["in"] == "path" {
                assert_eq!(p["required"], true, "{method} {path} {}", p["name"]);
            }
        }
    }
}

#[test]
fn every_operation_declares_its_error_answers_with_the_envelope() {
    let doc = doc();
    for (path, method, op) in operations(&doc) {
        let responses = op["responses"].as_object().unwrap();
        for status in ["400", "401", "403", "500"] {
            assert!(responses.contains_key(status), "{method} {path} {status}");
        }
        if op.get("requestBody").is_some() {
            for status in ["408", "413", "415", "422", "503"] {
                assert!(responses.contains_key(status), "{method} {path} {status}");
            }
        }
        for (status, answer) in responses {
            if status.starts_with('4') || status.starts_with('5') {
                assert_eq!(
                    answer["content"]["application/json"]["schema"]["$ref"],
                    "#/components/schemas/ErrorBody",
                    "{method} {path} {status}"
                );
            }
        }
        if let Some(limited) = responses.get("429") {
            assert!(
                limited["headers"].get("Retry-After").is_some(),
                "{method} {path} 429 declares Retry-After"
            );
        }
    }
    for (path, method) in [("/v1/tasks", "post"), ("/v1/pipelines/{name}/runs", "post")] {
        assert!(
            doc["paths"][path][method]["responses"].get("429").is_some(),
            "{method} {path} 429"
        );
    }
}

#[test]
fn enforced_constraints_are_in_the_schemas() {
    let doc = doc();
    let schemas = &doc["components"]["schemas"];
    // Identifiers: non-empty, bounded, no control characters.
    for (schema, field) in [
        ("RunBody", "scope"),
        ("ReleaseBody", "scope"),
        ("ReleaseBody", "effect_key"),
        ("PipelineRunBody", "scope"),
        ("SourceBody", "id"),
    ] {
        // Every identifier is the one `Identifier` schema.
        let field_ref = &schemas[schema]["properties"][field]["$ref"];
        assert_eq!(
            field_ref, "#/components/schemas/Identifier",
            "{schema}.{field}"
        );
        let f = &schemas["Identifier"];
        assert_eq!(f["minLength"], 1, "{schema}.{field}");
        assert_eq!(f["maxLength"], 256, "{schema}.{field}");
        assert_eq!(
            f["pattern"],
            tollgate_core::identifier_pattern(),
            "{schema}.{field}: the whole identifier rule"
        );
    }
    // No identifier keeps the short form the annotations write (`\x00-\x1F\x7F-\x9F`).
    let text = tollgate_server::openapi_json();
    assert!(
        !text.contains(r"\\x00-\\x1F\\x7F-\\x9F"),
        "an identifier pattern was left in its short annotation form"
    );
    assert_eq!(
        schemas["SubmitBody"]["properties"]["kind"]["$ref"],
        "#/components/schemas/KindName"
    );
    assert_eq!(
        schemas["BatchBody"]["properties"]["tasks"]["maxItems"],
        1000
    );
    // Run inputs are objects, as stored and answered.
    for schema in ["RunBody", "RunView", "PipelineRunBody"] {
        assert_eq!(
            schemas[schema]["properties"]["input"]["$ref"], "#/components/schemas/HashableObject",
            "{schema}.input"
        );
    }
    assert!(
        schemas["RunView"]["required"]
            .as_array()
            .unwrap()
            .contains(&"input".into())
    );
    // `wait` declares its syntax.
    let submit = &doc["paths"]["/v1/tasks"]["post"]["parameters"];
    let wait = submit
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "wait")
        .unwrap();
    assert_eq!(wait["schema"]["pattern"], "^[0-9]{1,9}(ms|s|m|h)?$");
    // Answered-as-null fields are required and nullable.
    let task = &schemas["TaskView"];
    for field in [
        "run_id",
        "output",
        "error",
        "completed_at",
        "usage",
        "source",
    ] {
        assert!(
            task["required"].as_array().unwrap().contains(&field.into()),
            "TaskView.{field} is always answered"
        );
    }
}
