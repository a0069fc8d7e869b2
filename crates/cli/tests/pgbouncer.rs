//! Tollgate behind PgBouncer (Debian's `pgbouncer`) in session pooling mode, the mode
//! README "PgBouncer" documents as tested: `serve` starts through it with PgBouncer's
//! default settings (no `ignore_startup_parameters`), migrates, admits, runs and answers
//! tasks. `.ci/run` installs PgBouncer and sets `TOLLGATE_REQUIRE_PGBOUNCER=1`, so a
//! missing one fails instead of skipping. Transaction pooling is not supported (README).

mod common;

use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const KEY: &str = "pgbouncer-key-0123456789";

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_behind_pgbouncer_in_session_mode() {
    let required = std::env::var("TOLLGATE_REQUIRE_PGBOUNCER").is_ok_and(|v| v == "1");
    let bin = Path::new("/usr/sbin/pgbouncer");
    let Ok(url) = std::env::var("TOLLGATE_TEST_DATABASE_URL") else {
        assert!(
            !required,
            "TOLLGATE_REQUIRE_PGBOUNCER=1 needs TOLLGATE_TEST_DATABASE_URL"
        );
        eprintln!("skipping: TOLLGATE_TEST_DATABASE_URL is not set");
        return;
    };
    if !bin.exists() {
        assert!(
            !required,
            "TOLLGATE_REQUIRE_PGBOUNCER=1 but /usr/sbin/pgbouncer is missing"
        );
        eprintln!("skipping: no /usr/sbin/pgbouncer");
        return;
    }
    // A database of its own: PgBouncer passes no `search_path` option through.
    let database = format!("tollgate_pgb_{}", uuid::Uuid::new_v4().simple());
    let admin = url
        .rsplit_once('/')
        .map(|(base, _)| format!("{base}/postgres"))
        .unwrap();
    common::psql(&admin, &format!("CREATE DATABASE \"{database}\""));
    struct Drop_(String, String);
    impl Drop for Drop_ {
        fn drop(&mut self) {
            common::psql(
                &self.0,
                &format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.1),
            );
        }
    }
    let _drop = Drop_(admin.clone(), database.clone());

    // PgBouncer refuses to run as root: a directory the postgres user owns.
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let target: reqwest::Url = url.parse().unwrap();
    let ini = dir.path().join("pgbouncer.ini");
    std::fs::write(dir.path().join("users.txt"), "\"postgres\" \"\"\n").unwrap();
    std::fs::write(
        &ini,
        format!(
            "[databases]\n{database} = host={} port={} dbname={database}\n\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
             unix_socket_dir =\nauth_type = trust\nauth_file = {}\n\
             pool_mode = session\nmax_client_conn = 200\ndefault_pool_size = 40\n\
             logfile = {}\npidfile = {}\n",
            target.host_str().unwrap_or("127.0.0.1"),
            target.port().unwrap_or(5432),
            dir.path().join("users.txt").display(),
            dir.path().join("pgbouncer.log").display(),
            dir.path().join("pgbouncer.pid").display(),
        ),
    )
    .unwrap();
    let owned = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(owned.success());
    // Started as the postgres user directly (not through `runuser`, which would stay
    // between this test and PgBouncer), so dropping the handle stops PgBouncer itself.
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("the postgres user")
    };
    let _pgbouncer = {
        use std::os::unix::process::CommandExt;
        Kill(
            Command::new(bin)
                .arg("--quiet")
                .arg(&ini)
                .uid(id("-u"))
                .gid(id("-g"))
                .current_dir(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("pgbouncer starts"),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "pgbouncer never listened");
        std::thread::sleep(Duration::from_millis(50));
    }

    let config = dir.path().join("tollgate.toml");
    std::fs::write(
        &config,
        format!(
            "[database]\nurl = \"postgres://postgres@127.0.0.1:{port}/{database}\"\n\n\
             [apps.acme]\napi_keys = [\"{KEY}\"]\n\n[notifications]\npoll_interval = \"200ms\"\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--addr", "127.0.0.1:0", "--config"])
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(addr) = line.strip_prefix("Tollgate listening on ") {
                let _ = tx.send(addr.trim().to_string());
            }
        }
    });
    let errors = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let base = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(base) => base,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve did not start behind PgBouncer: {:?}", errors.join());
        }
    };
    let serve = Kill(child);
    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for i in 0..20 {
        let answer: Value = http
            .post(format!("{base}/v1/tasks"))
            .bearer_auth(KEY)
            .header("Idempotency-Key", format!("pgb-{i}"))
            .json(&json!({"kind": "classify", "scope": format!("s{}", i % 3),
                          "source": {"id": format!("doc-{i}"), "revision": "v1"},
                          "request": {"input": format!("item {i}"), "labels": ["a", "b"]}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        ids.push(answer["id"].as_str().expect("a task").to_string());
    }
    for id in &ids {
        let task: Value = http
            .get(format!("{base}/v1/tasks/{id}?wait=20s"))
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(task["status"], json!("succeeded"), "{task}");
    }
    drop(serve);
}
