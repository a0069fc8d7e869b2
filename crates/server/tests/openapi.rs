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
