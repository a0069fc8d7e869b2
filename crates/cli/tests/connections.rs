//! The HTTP layer of the real `tollgate serve` over raw 127.0.0.1 sockets: every error
//! answer carries the JSON envelope (including those hyper makes itself), slow or stalled
//! connections are closed within the configured timeouts, `Expect: 100-continue` with an
//! oversize body is answered 413, and `/metrics` lists every series from the first scrape.

use serde_json::Value;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;
use common::Server;

const KEY: &str = "conn-key-0123456789abcdef";
const HEADER_READ: Duration = Duration::from_secs(2);
const BODY_READ: Duration = Duration::from_secs(2);
const IDLE: Duration = Duration::from_secs(1);
/// Slack for a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(1500);

fn config_text(database_url: &str) -> String {
    format!(
        r#"
[server]
max_request_bytes = 2000
header_read_timeout = "{}ms"
body_read_timeout = "{}ms"
idle_timeout = "{}ms"

[database]
url = "{database_url}"

[apps.acme]
api_keys = ["{KEY}"]

[workers]
concurrency = 1
"#,
        HEADER_READ.as_millis(),
        BODY_READ.as_millis(),
        IDLE.as_millis()
    )
}

fn start() -> Server {
    common::start("sqlite", "conn", config_text).expect("sqlite always runs")
}

fn addr(s: &Server) -> String {
    s.base.trim_start_matches("http://").to_string()
}

/// Reads one answer (head and, by its Content-Length, body), or what came before EOF.
async fn read_answer(stream: &mut TcpStream) -> (String, String) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let len = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + len]).to_string();
                return (head, body);
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(20), stream.read(&mut chunk))
            .await
            .expect("an answer within 20s")
            .unwrap_or(0);
        if n == 0 {
            return (String::from_utf8_lossy(&buf).to_string(), String::new());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Sends `request` on a new connection and reads the answer.
async fn exchange(addr: &str, request: &[u8]) -> (String, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    read_answer(&mut stream).await
}

fn assert_enveloped(head: &str, body: &str, status: u16, code: &str) {
    assert!(
        head.starts_with(&format!("HTTP/1.1 {status} ")),
        "want {status}, got {head}\n{body}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
    assert_eq!(v["error"]["code"], code, "{body}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_answer_has_the_envelope() {
    let s = start();
    let a = addr(&s);
    let auth = format!("Authorization: Bearer {KEY}\r\n");
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (
            b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n".to_vec(),
            400,
            "malformed_request",
        ),
        (
            b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n"
                .to_vec(),
            400,
            "malformed_request",
        ),
        (
            format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000)).into_bytes(),
            414,
            "uri_too_long",
        ),
        (
            format!(
                "GET /healthz HTTP/1.1\r\nHost: x\r\n{}\r\n",
                (0..200).map(|i| format!("X-H{i}: y\r\n")).collect::<String>()
            )
            .into_bytes(),
            431,
            "request_header_fields_too_large",
        ),
        (
            format!(
                "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
                "y".repeat(500_000)
            )
            .into_bytes(),
            431,
            "request_header_fields_too_large",
        ),
        (
            // Within the HTTP layer's buffer, over the 400 KiB of headers the API reads.
            format!(
                "GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: {y}\r\nX-B: {y}\r\n\r\n",
                y = "y".repeat(205_000)
            )
            .into_bytes(),
            431,
            "request_header_fields_too_large",
        ),
        (
            b"DELETE /v1/kinds HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            405,
            "method_not_allowed",
        ),
        (
            b"GET /no/such/route HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            404,
            "not_found",
        ),
        (
            format!(
                "POST /v1/tasks HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: text/plain\r\nContent-Length: 2\r\n\r\n{{}}"
            )
            .into_bytes(),
            415,
            "unsupported_media_type",
        ),
        (
            // An axum extractor rejection (a path segment that is not UTF-8).
            format!("GET /v1/tasks/%FF HTTP/1.1\r\nHost: x\r\n{auth}\r\n").into_bytes(),
            400,
            "malformed_request",
        ),
        (
            b"GET /v1/kinds HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            401,
            "unauthorized",
        ),
    ];
    for (request, status, code) in cases {
        let (head, body) = exchange(&a, &request).await;
        assert_enveloped(&head, &body, status, code);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_with_an_oversize_body_is_refused_without_100_continue() {
    let s = start();
    let a = addr(&s);
    let mut stream = TcpStream::connect(&a).await.unwrap();
    stream
        .write_all(
            format!(
                "POST /v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\
                 Content-Type: application/json\r\nExpect: 100-continue\r\n\
                 Content-Length: 100000000\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let (head, body) = read_answer(&mut stream).await;
    assert!(!head.contains("100 Continue"), "{head}");
    assert_enveloped(&head, &body, 413, "request_too_large");

    // Within the limit, the client is told to go on.
    let mut stream = TcpStream::connect(&a).await.unwrap();
    let payload = br#"{"kind":"classify","scope":"s","effect_key":"k1","request":{"input":"x","labels":["a","b"]}}"#;
    stream
        .write_all(
            format!(
                "POST /v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\
                 Content-Type: application/json\r\nExpect: 100-continue\r\n\
                 Content-Length: {}\r\n\r\n",
                payload.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut first = [0u8; 25];
    stream.read_exact(&mut first).await.unwrap();
    assert!(first.starts_with(b"HTTP/1.1 100 Continue"), "{first:?}");
    stream.write_all(payload).await.unwrap();
}

/// Reads until the server closes the connection; the time it took and what it sent.
async fn until_closed(mut stream: TcpStream, drip: Option<&'static [u8]>) -> (Duration, String) {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        tokio::select! {
            n = stream.read(&mut chunk) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            },
            () = tokio::time::sleep(Duration::from_millis(300)), if drip.is_some() => {
                // Keep trickling bytes, so only a total deadline closes the connection.
                if stream.write_all(drip.unwrap_or_default()).await.is_err() {
                    break;
                }
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the server held the connection for 30s"
        );
    }
    (started.elapsed(), String::from_utf8_lossy(&got).to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_stalled_connections_are_closed_within_the_timeouts() {
    let s = start();
    let a = addr(&s);
    let mut tasks = Vec::new();
    // 200 connections trickling a request head that never ends: the header-read timeout.
    for i in 0..200 {
        let a = a.clone();
        tasks.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(&a).await.unwrap();
            stream
                .write_all(format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-N: {i}").as_bytes())
                .await
                .unwrap();
            ("head", until_closed(stream, Some(b"a")).await)
        }));
    }
    // 20 connections trickling a body shorter than its Content-Length: the body timeout.
    for i in 0..20 {
        let a = a.clone();
        tasks.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(&a).await.unwrap();
            stream
                .write_all(
                    format!(
                        "POST /v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\
                         Content-Type: application/json\r\nIdempotency-Key: slow-{i}\r\n\
                         Content-Length: 1900\r\n\r\n{{\"kind\":"
                    )
                    .as_bytes(),
                )
                .await
                .unwrap();
            ("body", until_closed(stream, Some(b" ")).await)
        }));
    }
    // A chunked body whose last chunk never comes.
    {
        let a = a.clone();
        tasks.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(&a).await.unwrap();
            stream
                .write_all(
                    format!(
                        "POST /v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\
                         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{{\r\n"
                    )
                    .as_bytes(),
                )
                .await
                .unwrap();
            ("chunked", until_closed(stream, Some(b"1\r\n \r\n")).await)
        }));
    }
    // A connection that sends nothing, and one kept alive after an answer: idle.
    {
        let a = a.clone();
        tasks.push(tokio::spawn(async move {
            let stream = TcpStream::connect(&a).await.unwrap();
            ("silent", until_closed(stream, None).await)
        }));
    }
    {
        let a = a.clone();
        tasks.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(&a).await.unwrap();
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let (head, _) = read_answer(&mut stream).await;
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            ("kept-alive", until_closed(stream, None).await)
        }));
    }
    for t in tasks {
        let (what, (took, got)) = t.await.unwrap();
        let (least, most) = match what {
            "head" => (HEADER_READ, HEADER_READ + SLACK),
            "body" | "chunked" => (BODY_READ, BODY_READ + SLACK),
            _ => (IDLE, IDLE + SLACK),
        };
        assert!(
            took >= least - Duration::from_millis(200) && took <= most,
            "{what}: closed after {took:?}, want {least:?}..{most:?}"
        );
        if what == "body" || what == "chunked" {
            let (head, body) = got.split_once("\r\n\r\n").unwrap_or((&got, ""));
            assert_enveloped(head, body, 408, "request_timeout");
        }
    }
    // The server still answers.
    let (head, _) = exchange(&a, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_lists_every_series_from_the_first_scrape() {
    let s = start();
    let text = s.metrics().await;
    for name in tollgate_engine::metrics::ALL {
        assert!(text.contains(&format!("# HELP {name} ")), "{name}:\n{text}");
        assert!(text.contains(&format!("# TYPE {name} ")), "{name}:\n{text}");
    }
    for series in [
        r#"tollgate_submits_total{kind="classify",outcome="created"} 0"#,
        r#"tollgate_admissions_total{outcome="WORKFLOW_AI_RATE_LIMIT"} 0"#,
        r#"tollgate_provider_calls_total{provider="dev",outcome="ok"} 0"#,
        "tollgate_tasks_in_flight 0",
        "tollgate_heartbeat_stops_total 0",
    ] {
        assert!(text.contains(series), "{series}:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_input_is_an_object_and_wait_has_one_syntax() {
    let s = start();
    let post = |body: Value| {
        s.http
            .post(format!("{}/v1/runs", s.base))
            .bearer_auth(KEY)
            .json(&body)
            .send()
    };
    let run: Value = post(serde_json::json!({"scope": "s"}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(run["input"], serde_json::json!({}), "{run}");
    for input in [serde_json::json!([1]), serde_json::json!("x"), Value::Null] {
        let r = post(serde_json::json!({"scope": "s", "input": input}))
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400, "input {input}");
    }
    let id = run["id"].as_str().unwrap();
    for (wait, status) in [
        ("0", 200),
        ("250ms", 200),
        ("1s", 200),
        ("1m30s", 400),
        ("", 400),
        ("1 s", 400),
        ("1234567890", 400),
        ("-1", 400),
    ] {
        let r = s
            .http
            .get(format!("{}/v1/runs/{id}", s.base))
            .query(&[("wait", wait)])
            .bearer_auth(KEY)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "wait={wait:?}");
    }
}
