//! The `tollgate` command as an operator and a user would run it: scale-out roles
//! (`serve --workers 0` beside `tollgate worker`), graceful shutdown, `migrate`, the
//! client commands, and `demo`.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const KEY: &str = "roles-key-0123456789abcdef";

fn tollgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
}

fn write_config(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("tollgate.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[database]
url = "sqlite://{}"

[apps.acme]
api_keys = ["{KEY}"]

[workers]
heartbeat_interval = "200ms"

[sweeper]
interval = "300ms"

[notifications]
poll_interval = "200ms"
"#,
            dir.join("tollgate.db").display()
        ),
    )
    .unwrap();
    path
}

/// Starts `serve` and returns it with its base URL.
fn serve(config: &Path, extra: &[&str]) -> (Child, String) {
    let (child, base, _) = serve_until(config, extra, |line| {
        line.starts_with("Tollgate listening on ")
    });
    (child, base)
}

/// Starts `serve` and reads what it prints up to and including the line `last` picks:
/// the process, its base URL and the lines read.
fn serve_until(
    config: &Path,
    extra: &[&str],
    last: impl Fn(&str) -> bool,
) -> (Child, String, Vec<String>) {
    let mut child = tollgate()
        .args(["serve", "--addr", "127.0.0.1:0", "--config"])
        .arg(config)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve never printed what was awaited: {lines:?}");
        };
        let done = last(&line);
        lines.push(line);
        if done {
            break;
        }
    }
    let base = lines
        .iter()
        .find_map(|l| l.strip_prefix("Tollgate listening on "))
        .expect("the address line")
        .trim()
        .to_string();
    (child, base, lines)
}

/// Sends SIGTERM and waits for a clean exit.
fn terminate(mut child: Child) -> Output {
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "did not stop after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn client(base: &str, args: &[&str], stdin: Option<&str>) -> Value {
    let mut cmd = tollgate();
    cmd.args(args)
        .env("TOLLGATE_URL", base)
        .env("TOLLGATE_API_KEY", KEY)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    if let Some(text) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    } else {
        drop(child.stdin.take());
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "tollgate {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the command prints JSON")
}

#[test]
fn api_only_replica_and_worker_replica_share_the_work() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let migrate = tollgate()
        .args(["migrate", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        migrate.status.success(),
        "{}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    assert!(String::from_utf8_lossy(&migrate.stdout).contains("is migrated"));

    let (api, base) = serve(&config, &["--workers", "0"]);
    let request = r#"{"input": "hello", "labels": ["a", "b"]}"#;
    let task = client(
        &base,
        &[
            "submit",
            "--kind",
            "classify",
            "--scope",
            "s",
            "--effect-key",
            "role-1",
            "-",
        ],
        Some(request),
    );
    assert_eq!(task["status"], json!("queued"));
    let id = task["id"].as_str().unwrap().to_string();
    std::thread::sleep(Duration::from_millis(800));
    let still = client(&base, &["task", "get", &id], None);
    assert_eq!(
        still["status"],
        json!("queued"),
        "an API-only replica runs nothing"
    );

    let worker = tollgate()
        .args(["worker", "--config"])
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let done = client(&base, &["task", "wait", &id, "--wait", "20s"], None);
    assert_eq!(
        done["status"],
        json!("succeeded"),
        "the worker replica ran it: {done}"
    );

    // Client commands for runs and cancellation.
    let run = client(&base, &["run", "create", "--scope", "wf"], None);
    let rid = run["id"].as_str().unwrap().to_string();
    assert_eq!(
        client(&base, &["run", "get", &rid], None)["state"],
        json!("running")
    );
    assert_eq!(
        client(&base, &["run", "cancel", &rid], None)["state"],
        json!("canceled")
    );
    let waited = client(
        &base,
        &[
            "submit",
            "--kind",
            "classify",
            "--scope",
            "s",
            "--effect-key",
            "role-2",
            "--wait",
            "20s",
            "-",
        ],
        Some(request),
    );
    assert_eq!(waited["status"], json!("succeeded"));
    let canceled = client(&base, &["task", "cancel", &id], None);
    assert_eq!(
        canceled["status"],
        json!("succeeded"),
        "a finished task stays finished"
    );

    let out = terminate(worker);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("stopped"));
    let out = terminate(api);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The client commands as a user types them: one flag name for waiting, a task found by
/// its effect key, output that ends with a newline and survives `| head`, and `--help`
/// that shows no empty environment value.
#[test]
fn client_commands_behave_as_a_user_types_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let (server, base) = serve(&config, &[]);
    let request = r#"{"input": "hello", "labels": ["a", "b"]}"#;
    let args = [
        "submit",
        "--kind",
        "classify",
        "--scope",
        "s",
        "--effect-key",
        "cli-1",
        "-",
    ];
    let task = client(&base, &args, Some(request));
    let id = task["id"].as_str().unwrap().to_string();

    // `--wait` everywhere (`task wait` took `--timeout` before; it stays an alias).
    let done = client(&base, &["task", "wait", &id, "--wait", "20s"], None);
    assert_eq!(done["status"], json!("succeeded"), "{done}");
    let old = client(&base, &["task", "wait", &id, "--timeout", "5s"], None);
    assert_eq!(old["id"], json!(id));

    // `task get` by effect key, with or without a wait.
    let by_key = client(&base, &["task", "get", "--effect-key", "cli-1"], None);
    assert_eq!(by_key["id"], json!(id), "{by_key}");
    let by_key = client(
        &base,
        &["task", "get", "--effect-key", "cli-1", "--wait", "5s"],
        None,
    );
    assert_eq!(by_key["status"], json!("succeeded"), "{by_key}");
    let missing = tollgate()
        .args(["task", "get", "--effect-key", "no-such-key"])
        .env("TOLLGATE_URL", &base)
        .env("TOLLGATE_API_KEY", KEY)
        .output()
        .unwrap();
    assert!(!missing.status.success(), "an unknown key is an error");
    assert!(String::from_utf8_lossy(&missing.stderr).contains("404"));

    // Every printed answer ends with a newline (`usage --json` did not).
    for args in [
        &["usage", "--json"][..],
        &["usage"][..],
        &["task", "get", &id][..],
    ] {
        let out = tollgate()
            .args(args)
            .env("TOLLGATE_URL", &base)
            .env("TOLLGATE_API_KEY", KEY)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stdout.ends_with(b"\n"),
            "{args:?} ends with a newline: {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
    }

    // A reader that goes away (`tollgate task get ID | head -c 1`) ends the command
    // quietly instead of a panic.
    let piped = Command::new("sh")
        .arg("-c")
        .arg("\"$0\" demo | head -c 1 >/dev/null; exit 0")
        .arg(env!("CARGO_BIN_EXE_tollgate"))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&piped.stderr);
    assert!(
        !stderr.contains("panicked"),
        "no panic on a closed pipe: {stderr}"
    );
    let out = Command::new("sh")
        .arg("-c")
        .arg("\"$0\" task get \"$1\" | head -c 1 >/dev/null; exit 0")
        .arg(env!("CARGO_BIN_EXE_tollgate"))
        .arg(&id)
        .env("TOLLGATE_URL", &base)
        .env("TOLLGATE_API_KEY", KEY)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked"),
        "no panic on a closed pipe: {stderr}"
    );

    // `--help` with TOLLGATE_URL unset shows no `[env: TOLLGATE_URL=]`.
    let help = tollgate()
        .args(["task", "get", "--help"])
        .env_remove("TOLLGATE_URL")
        .env_remove("TOLLGATE_API_KEY")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("TOLLGATE_URL"), "{text}");
    assert!(!text.contains("TOLLGATE_URL=]"), "{text}");
    assert!(!text.contains("TOLLGATE_API_KEY=]"), "{text}");

    terminate(server);
}

#[test]
fn demo_walks_through_the_guarantees() {
    let dir = tempfile::tempdir().unwrap();
    let out = tollgate()
        .arg("demo")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "-> succeeded",
        "cached true",
        "created false, same id true",
        "WORKFLOW_AI_RATE_LIMIT",
        "canceled (WORKFLOW_AI_CANCELED)",
        "deletion never resets the rate",
    ] {
        assert!(
            text.contains(expected),
            "the report shows {expected:?}:\n{text}"
        );
    }
}

/// Starts a keyless `serve`: its lines up to the development key's.
fn serve_banner(config: &Path) -> (Child, String, Vec<String>) {
    serve_until(config, &[], |line| line.contains("API key:"))
}

/// A raw `GET path` without following redirects: (status line, headers in lower case).
fn raw_get(base: &str, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let addr = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let (head, _) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_lowercase())
}

/// The first run as a newcomer meets it: the development key survives a restart (so the
/// exported key and the dashboard session keep working), the banner names the
/// notification transport and the dashboard, `GET /` leads a browser to `/ui`, and a
/// replica whose NATS is down still starts and serves (at polling speed).
#[test]
fn first_run_keeps_its_dev_key_and_starts_without_nats() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tollgate.toml");
    let db = dir.path().join("tollgate.db");
    std::fs::write(
        &config,
        format!("[database]\nurl = \"sqlite://{}\"\n", db.display()),
    )
    .unwrap();
    let key_of = |lines: &[String]| {
        lines
            .iter()
            .find_map(|l| l.trim().strip_prefix("API key: "))
            .expect("the key line")
            .to_string()
    };
    let (first, base, lines) = serve_banner(&config);
    let key = key_of(&lines);
    assert!(key.starts_with("tg_dev_"), "{lines:?}");
    assert!(
        lines.iter().any(|l| l.contains("notifications: local")),
        "the banner names the notification transport: {lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&format!("dashboard: {base}/ui"))),
        "{lines:?}"
    );
    let (status, headers) = raw_get(&base, "/");
    assert!(status.contains(" 307 "), "{status}");
    assert!(headers.contains("location: /ui"), "{headers}");
    terminate(first);

    // Restarted with NATS configured but nothing listening at its address.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        &config,
        format!(
            "[database]\nurl = \"sqlite://{}\"\n\n[notifications]\ntransport = \"nats\"\nnats_url = \"nats://127.0.0.1:{port}\"\npoll_interval = \"200ms\"\n",
            db.display()
        ),
    )
    .unwrap();
    let (second, base, lines) = serve_banner(&config);
    assert_eq!(
        key_of(&lines),
        key,
        "the development key survives a restart"
    );
    assert!(
        lines.iter().any(|l| l.contains("notifications: nats")),
        "{lines:?}"
    );
    let out = tollgate()
        .args([
            "submit",
            "--kind",
            "classify",
            "--scope",
            "s",
            "--effect-key",
            "first-run",
            "--wait",
            "20s",
            "-",
        ])
        .env("TOLLGATE_URL", &base)
        .env("TOLLGATE_API_KEY", &key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(br#"{"input": "hello", "labels": ["a", "b"]}"#)?;
            child.wait_with_output()
        })
        .unwrap();
    assert!(
        out.status.success(),
        "the old key works after the restart: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let task: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(task["status"], json!("succeeded"), "{task}");
    terminate(second);
}

/// The README's shell blocks run as written against a real `serve` (README "Try it" and
/// "Pipelines"): the one change is the placeholder key line, which a user fills with the
/// key `serve` printed, and the address, which is this test's port. The first block
/// (`cargo test`, `cargo run`) is what CI itself runs.
#[test]
fn readme_shell_blocks_run_as_written() {
    let readme = include_str!("../../../README.md");
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in readme.lines() {
        match (&mut current, line.trim_start()) {
            (None, "```sh" | "```bash") => current = Some(String::new()),
            (Some(_), "```") => blocks.push(current.take().unwrap()),
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            _ => {}
        }
    }
    assert!(blocks.len() >= 3, "the README's shell blocks were read");
    assert!(
        blocks[0].contains("cargo test --workspace"),
        "{}",
        blocks[0]
    );

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tollgate.toml");
    std::fs::write(
        &config,
        format!(
            "[database]\nurl = \"sqlite://{}\"\n",
            dir.path().join("tollgate.db").display()
        ),
    )
    .unwrap();
    let (server, base, lines) = serve_banner(&config);
    let key = lines
        .iter()
        .find_map(|l| l.trim().strip_prefix("API key: "))
        .unwrap()
        .to_string();
    let addr = base.trim_start_matches("http://");
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_tollgate")).parent().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for block in &blocks[1..] {
        let mut script = String::new();
        for line in block.lines() {
            // The placeholder a user replaces with the printed key.
            if line.starts_with("export TOLLGATE_API_KEY=tg_dev_…") {
                continue;
            }
            script.push_str(
                &line
                    .replace("localhost:8080", addr)
                    .replace("127.0.0.1:8080", addr),
            );
            script.push('\n');
        }
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", &script])
            .current_dir(&repo)
            .env("TOLLGATE_API_KEY", &key)
            .env("TOLLGATE_URL", &base)
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    bin_dir.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "README block failed:\n{block}\nstdout: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !stdout.contains(r#""error":{"#) && !stdout.contains(r#""error": {"#),
            "README block answered an error:\n{block}\n{stdout}"
        );
        assert!(
            !stdout.contains(r#""status":"failed""#) && !stdout.contains(r#""status": "failed""#),
            "README block's task failed:\n{block}\n{stdout}"
        );
    }
    terminate(server);
}
