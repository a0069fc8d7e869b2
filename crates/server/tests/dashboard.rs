//! docs/conformance.md#listings, the dashboard over HTTP: every `/ui` answer — a page, a missing file (404)
//! or a wrong method (405) — carries the same Content-Security-Policy, X-Frame-Options
//! and nosniff headers, so an error answer is no weaker than a page.

use std::time::Duration;
use tokio::net::TcpListener;
use tollgate_core::AppId;
use tollgate_engine::{EngineConfig, Tollgate};
use tollgate_server::{AppState, Auth, KeyConfig, UI_CSP};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ui_answer_carries_the_pages_headers() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("ui.db").display());
    let tollgate = Tollgate::open(&url, EngineConfig::default()).await.unwrap();
    let state = AppState {
        tollgate,
        auth: Auth::new(&[(
            AppId::new("acme").unwrap(),
            vec![KeyConfig::Plain("ui-headers-key-0123456789".into())],
        )])
        .unwrap(),
        max_wait: Duration::from_secs(5),
        body_read_timeout: Duration::from_secs(5),
        metrics: None,
        metrics_access: Default::default(),
        batches: Default::default(),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        axum::serve(listener, tollgate_server::router(state))
            .await
            .unwrap();
    });
    let http = reqwest::Client::new();
    for (method, path, status) in [
        ("GET", "/ui", 200),
        ("GET", "/ui/", 200),
        ("GET", "/ui/app.js", 200),
        ("GET", "/ui/no-such-file.js", 404),
        ("GET", "/ui/index.htm", 404),
        ("POST", "/ui", 405),
        ("DELETE", "/ui/", 405),
        ("PUT", "/ui/app.js", 405),
        ("POST", "/ui/no-such-file.js", 405),
    ] {
        let answer = http
            .request(method.parse().unwrap(), format!("{base}{path}"))
            .header("content-type", "application/json")
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), status, "{method} {path}");
        let header = |name: &str| {
            answer
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        assert_eq!(
            header("content-security-policy").as_deref(),
            Some(UI_CSP),
            "{method} {path}"
        );
        assert_eq!(
            header("x-frame-options").as_deref(),
            Some("DENY"),
            "{method} {path}"
        );
        assert_eq!(
            header("x-content-type-options").as_deref(),
            Some("nosniff"),
            "{method} {path}"
        );
        assert_eq!(
            header("referrer-policy").as_deref(),
            Some("no-referrer"),
            "{method} {path}"
        );
        if status != 200 {
            let body: serde_json::Value = answer.json().await.unwrap();
            assert!(
                body["error"]["code"].is_string(),
                "{method} {path}: the error envelope: {body}"
            );
        }
    }
    // The API's own answers keep theirs: the dashboard's policy is the dashboard's.
    let api = http.get(format!("{base}/v1/kinds")).send().await.unwrap();
    assert!(api.headers().get("content-security-policy").is_none());
    server.abort();
}
