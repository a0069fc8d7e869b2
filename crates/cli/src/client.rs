//! `submit`, `task`, `run`, `pipeline`: a small client for a running server.

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How to reach the server.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// The server's base URL.
    #[arg(
        long,
        env = "TOLLGATE_URL",
        hide_env_values = true,
        default_value = "http://127.0.0.1:8080"
    )]
    url: String,
    /// API key (`serve` prints the development key at start-up).
    #[arg(long, env = "TOLLGATE_API_KEY", hide_env_values = true)]
    key: String,
    /// Subject to act for (only keys allowed to assert one): user:<id> or service:<id>.
    #[arg(long)]
    subject: Option<String>,
}

impl Connection {
    fn request(
        &self,
        method: reqwest::Method,
        path: &str,
    ) -> anyhow::Result<reqwest::RequestBuilder> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()?;
        let mut rb = client
            .request(method, format!("{}{path}", self.url.trim_end_matches('/')))
            .bearer_auth(&self.key);
        if let Some(s) = &self.subject {
            rb = rb.header("X-Tollgate-Subject", s);
        }
        Ok(rb)
    }
}

/// Sends, prints the JSON answer, and fails on an error status.
async fn send(rb: reqwest::RequestBuilder) -> anyhow::Result<Value> {
    let response = rb.send().await.context("cannot reach the server")?;
    let status = response.status();
    let text = response.text().await?;
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if !status.is_success() {
        bail!(
            "{status}: {}",
            serde_json::to_string_pretty(&body).unwrap_or_default()
        );
    }
    Ok(body)
}

fn print(v: &Value) {
    print_line(&serde_json::to_string_pretty(v).unwrap_or_default());
}

/// Writes one line to standard output. A reader that went away (`tollgate … | head`)
/// ends the command quietly, as `cat` would, instead of panicking like `println!`.
pub(crate) fn print_line(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{text}").and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

/// `tollgate submit`.
#[derive(Debug, Clone, Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    conn: Connection,
    /// Task kind: generate_text, classify, classify_many, extract_data, embed.
    #[arg(long)]
    kind: String,
    /// The effect key (idempotency key).
    #[arg(long)]
    effect_key: String,
    /// Application scope (or --run).
    #[arg(long, conflicts_with = "run")]
    scope: Option<String>,
    /// Owning workflow run (or --scope).
    #[arg(long)]
    run: Option<String>,
    /// Source id: makes the task scoped (cache and admission apply).
    #[arg(long, requires = "source_revision")]
    source_id: Option<String>,
    /// Source revision.
    #[arg(long, requires = "source_id")]
    source_revision: Option<String>,
    /// Skip the cache.
    #[arg(long, requires = "source_id")]
    recompute: bool,
    /// Model id.
    #[arg(long)]
    model: Option<String>,
    /// Step name.
    #[arg(long)]
    step: Option<String>,
    /// Budget policy.
    #[arg(long)]
    budget: Option<String>,
    /// Priority within the scope, 0 (lowest) to 9 (highest); default 5 (docs/conformance.md#priority).
    #[arg(long, value_parser = clap::value_parser!(i64).range(0..=9))]
    priority: Option<i64>,
    /// Wait for a terminal state, e.g. 30s.
    #[arg(long)]
    wait: Option<String>,
    /// The request JSON; `-` or nothing reads standard input.
    file: Option<PathBuf>,
}

/// Reads JSON from a file, or from standard input for `-` or no file.
async fn read_json(file: Option<&PathBuf>, what: &str) -> anyhow::Result<Value> {
    let text = match file {
        Some(p) if p.as_os_str() != "-" => {
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?
        }
        _ => {
            use tokio::io::AsyncReadExt;
            let mut s = String::new();
            tokio::io::stdin().read_to_string(&mut s).await?;
            s
        }
    };
    serde_json::from_str(&text).with_context(|| format!("{what} is not JSON"))
}

pub async fn submit(args: SubmitArgs) -> anyhow::Result<()> {
    let request = read_json(args.file.as_ref(), "the request").await?;
    let mut body = json!({"kind": args.kind, "request": request});
    let obj = body.as_object_mut().context("body")?;
    for (k, v) in [
        ("scope", &args.scope),
        ("run_id", &args.run),
        ("model", &args.model),
        ("step", &args.step),
        ("budget", &args.budget),
    ] {
        if let Some(v) = v {
            obj.insert(k.into(), json!(v));
        }
    }
    if let Some(p) = args.priority {
        obj.insert("priority".into(), json!(p));
    }
    if let (Some(id), Some(rev)) = (&args.source_id, &args.source_revision) {
        obj.insert(
            "source".into(),
            json!({"id": id, "revision": rev, "recompute": args.recompute}),
        );
    }
    let path = match &args.wait {
        Some(w) => format!("/v1/tasks?wait={w}"),
        None => "/v1/tasks".to_string(),
    };
    let rb = args
        .conn
        .request(reqwest::Method::POST, &path)?
        .header("Idempotency-Key", &args.effect_key)
        .json(&body);
    print(&send(rb).await?);
    Ok(())
}

/// `tollgate task …`.
#[derive(Debug, Clone, Subcommand)]
pub enum TaskCommand {
    /// Show a task, by id or by its effect key (`--effect-key`).
    Get {
        #[command(flatten)]
        conn: Connection,
        /// Task id (or give --effect-key instead).
        #[arg(required_unless_present = "effect_key", conflicts_with = "effect_key")]
        id: Option<String>,
        /// The task's effect key (the Idempotency-Key it was submitted with).
        #[arg(long)]
        effect_key: Option<String>,
        /// Wait for a terminal state, e.g. 30s (as `submit --wait`).
        #[arg(long)]
        wait: Option<String>,
    },
    /// Wait until a task is terminal (or the wait passes) and show it.
    Wait {
        #[command(flatten)]
        conn: Connection,
        /// Task id.
        id: String,
        /// How long to wait at most, e.g. 30s (`--timeout` is the old name).
        #[arg(long, alias = "timeout", default_value = "60s")]
        wait: String,
    },
    /// Cancel a task.
    Cancel {
        #[command(flatten)]
        conn: Connection,
        /// Task id.
        id: String,
    },
}

pub async fn task(cmd: TaskCommand) -> anyhow::Result<()> {
    match cmd {
        TaskCommand::Get {
            conn,
            id,
            effect_key,
            wait,
        } => {
            let mut path = match (&id, &effect_key) {
                (_, Some(key)) => format!("/v1/tasks?effect_key={}", encode(key)),
                (Some(id), None) => format!("/v1/tasks/{}", encode(id)),
                (None, None) => bail!("give a task id or --effect-key"),
            };
            if let Some(w) = &wait {
                tollgate_core::parse_duration(w, tollgate_core::DurationSyntax::Config)
                    .context("--wait takes a duration like 30s")?;
                if effect_key.is_some() {
                    // The listing does not long-poll: find the id, then wait on it.
                    let task = send(conn.request(reqwest::Method::GET, &path)?).await?;
                    let id = task
                        .get("id")
                        .and_then(Value::as_str)
                        .context("the answer names no task id")?;
                    path = format!("/v1/tasks/{}", encode(id));
                }
                path.push_str(&format!("?wait={}", encode(w)));
            }
            print(&send(conn.request(reqwest::Method::GET, &path)?).await?);
        }
        TaskCommand::Wait { conn, id, wait } => {
            let wait = tollgate_core::parse_duration(&wait, tollgate_core::DurationSyntax::Config)
                .context("--wait takes a duration like 30s")?;
            let deadline = Instant::now() + wait;
            loop {
                // Long-poll the server for what is left (it caps each call at its
                // `max_wait`), so a task that ends is shown at once.
                let left = deadline.saturating_duration_since(Instant::now());
                let path = format!("/v1/tasks/{}?wait={}ms", encode(&id), left.as_millis());
                let t = send(conn.request(reqwest::Method::GET, &path)?).await?;
                let terminal = matches!(
                    t.get("status").and_then(Value::as_str),
                    Some("succeeded" | "failed" | "canceled")
                );
                if terminal || Instant::now() >= deadline {
                    print(&t);
                    break;
                }
            }
        }
        TaskCommand::Cancel { conn, id } => {
            print(
                &send(conn.request(reqwest::Method::POST, &format!("/v1/tasks/{id}/cancel"))?)
                    .await?,
            );
        }
    }
    Ok(())
}

/// `tollgate usage`: spend and tokens in the 24 h window (docs/budgets.md).
#[derive(Debug, Clone, Args)]
pub struct UsageArgs {
    #[command(flatten)]
    conn: Connection,
    /// One scope (default: the whole app, all scopes).
    #[arg(long)]
    scope: Option<String>,
    /// Print the server's JSON answer instead of the summary.
    #[arg(long)]
    json: bool,
}

pub async fn usage(args: UsageArgs) -> anyhow::Result<()> {
    let path = match &args.scope {
        Some(scope) => format!("/v1/scopes/{}/usage", percent_encode(scope)),
        None => "/v1/usage".to_string(),
    };
    let report = send(args.conn.request(reqwest::Method::GET, &path)?).await?;
    if args.json {
        print(&report);
        return Ok(());
    }
    print_line(&usage_summary(&report));
    Ok(())
}

/// The human summary of a usage report.
fn usage_summary(r: &Value) -> String {
    let num = |k: &str| r.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    let who = match r.get("scope").and_then(Value::as_str) {
        Some(s) => format!("scope {s}"),
        None => "app (all scopes)".to_string(),
    };
    let mut out = format!(
        "{who}, 24 h window since {}\n  spend:   ${:.6} settled + ${:.6} reserved",
        r.get("since").and_then(Value::as_str).unwrap_or("?"),
        num("settled_usd"),
        num("reserved_usd"),
    );
    match r.get("limit_usd").and_then(Value::as_f64) {
        Some(limit) => out.push_str(&format!(
            " of ${limit:.6} ({:.1}% used)\n",
            100.0 * (num("settled_usd") + num("reserved_usd")) / limit
        )),
        None => out.push_str(" (no USD limit)\n"),
    }
    out.push_str(&format!(
        "  tokens:  {} settled + {} reserved\n",
        num("settled_tokens"),
        num("reserved_tokens")
    ));
    if let (Some(burst), Some(rate)) = (
        r.get("token_burst").and_then(Value::as_u64),
        r.get("tokens_per_minute").and_then(Value::as_u64),
    ) {
        out.push_str(&format!(
            "  bucket:  {:.0} of {burst} tokens available, refilled {rate}/min\n",
            num("tokens_available")
        ));
    }
    out.push_str(&format!(
        "  overrun: ${:.6}   saved by cache: ${:.6}",
        num("overrun_usd"),
        num("saved_usd")
    ));
    out
}

/// Percent-encodes a path segment.
fn percent_encode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `tollgate run …`.
#[derive(Debug, Clone, Subcommand)]
pub enum RunCommand {
    /// Create a workflow run.
    Create {
        #[command(flatten)]
        conn: Connection,
        /// The run's scope.
        #[arg(long)]
        scope: String,
        /// The run's input JSON file (default: {}).
        #[arg(long)]
        input: Option<PathBuf>,
    },
    /// Show a run (a pipeline run with its steps).
    Get {
        #[command(flatten)]
        conn: Connection,
        /// Run id.
        id: String,
        /// Wait for the run to end, e.g. 30s (bounded by the server's maximum wait).
        #[arg(long)]
        wait: Option<String>,
    },
    /// Cancel a run and its queued and running tasks.
    Cancel {
        #[command(flatten)]
        conn: Connection,
        /// Run id.
        id: String,
    },
}

pub async fn run(cmd: RunCommand) -> anyhow::Result<()> {
    match cmd {
        RunCommand::Create { conn, scope, input } => {
            let input: Value = match input {
                Some(p) => serde_json::from_str(
                    &std::fs::read_to_string(&p)
                        .with_context(|| format!("cannot read {}", p.display()))?,
                )
                .context("the input is not JSON")?,
                None => json!({}),
            };
            let rb = conn
                .request(reqwest::Method::POST, "/v1/runs")?
                .json(&json!({"scope": scope, "input": input}));
            print(&send(rb).await?);
        }
        RunCommand::Get { conn, id, wait } => {
            let mut path = format!("/v1/runs/{}", encode(&id));
            if let Some(w) = wait {
                tollgate_core::parse_duration(&w, tollgate_core::DurationSyntax::Config)
                    .context("--wait takes a duration like 30s")?;
                path.push_str(&format!("?wait={}", encode(&w)));
            }
            print(&send(conn.request(reqwest::Method::GET, &path)?).await?);
        }
        RunCommand::Cancel { conn, id } => {
            print(
                &send(conn.request(reqwest::Method::POST, &format!("/v1/runs/{id}/cancel"))?)
                    .await?,
            );
        }
    }
    Ok(())
}

/// `tollgate pipeline …`.
#[derive(Debug, Clone, Subcommand)]
pub enum PipelineCommand {
    /// Register a pipeline version. The file holds `{"name": …, "definition": {…}}`, or
    /// only the definition when `--name` is given; `-` reads standard input. The same
    /// definition twice is the same version (`"created": false` the second time).
    Register {
        #[command(flatten)]
        conn: Connection,
        /// The pipeline's name (then the file holds only the definition).
        #[arg(long)]
        name: Option<String>,
        /// The JSON file; `-` reads standard input.
        file: PathBuf,
    },
    /// Show a pipeline: its newest version, or `--version`.
    Get {
        #[command(flatten)]
        conn: Connection,
        /// The pipeline's name.
        name: String,
        /// A version (content hash).
        #[arg(long)]
        version: Option<String>,
    },
    /// Start a run of a pipeline and print it (with `--wait`, once it ended or the wait
    /// passed). `tollgate run get ID` shows it later.
    Run {
        #[command(flatten)]
        conn: Connection,
        /// The pipeline's name.
        name: String,
        /// The run's scope (budgets and cache).
        #[arg(long)]
        scope: String,
        /// The run's input JSON file; `-` reads standard input (default: {}).
        #[arg(long)]
        input: Option<PathBuf>,
        /// A version to run (default: the newest).
        #[arg(long)]
        version: Option<String>,
        /// Wait for the run to end, e.g. 30s (bounded by the server's maximum wait).
        #[arg(long)]
        wait: Option<String>,
        /// Start the run once per key: running the command again with the key prints the
        /// run it started.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
}

/// Percent-encodes a path segment or query value (names are plain, but be safe).
fn encode(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub async fn pipeline(cmd: PipelineCommand) -> anyhow::Result<()> {
    match cmd {
        PipelineCommand::Register { conn, name, file } => {
            let text = read_json(Some(&file), "the pipeline file").await?;
            let body = match name {
                Some(name) => json!({"name": name, "definition": text}),
                None => {
                    let ok = text
                        .as_object()
                        .is_some_and(|o| o.contains_key("name") && o.contains_key("definition"));
                    if !ok {
                        bail!(
                            "the file must hold {{\"name\": …, \"definition\": {{…}}}}, or give --name NAME with a file holding only the definition"
                        );
                    }
                    text
                }
            };
            let rb = conn
                .request(reqwest::Method::POST, "/v1/pipelines")?
                .json(&body);
            print(&send(rb).await?);
        }
        PipelineCommand::Get {
            conn,
            name,
            version,
        } => {
            let mut path = format!("/v1/pipelines/{}", encode(&name));
            if let Some(v) = version {
                path.push_str(&format!("?version={}", encode(&v)));
            }
            print(&send(conn.request(reqwest::Method::GET, &path)?).await?);
        }
        PipelineCommand::Run {
            conn,
            name,
            scope,
            input,
            version,
            wait,
            idempotency_key,
        } => {
            let input = match &input {
                Some(p) => read_json(Some(p), "the input").await?,
                None => json!({}),
            };
            let mut body = json!({"scope": scope, "input": input});
            if let Some(v) = version {
                body["version"] = json!(v);
            }
            let mut path = format!("/v1/pipelines/{}/runs", encode(&name));
            if let Some(w) = wait {
                tollgate_core::parse_duration(&w, tollgate_core::DurationSyntax::Config)
                    .context("--wait takes a duration like 30s")?;
                path.push_str(&format!("?wait={}", encode(&w)));
            }
            let mut rb = conn.request(reqwest::Method::POST, &path)?.json(&body);
            if let Some(key) = idempotency_key {
                rb = rb.header("Idempotency-Key", key);
            }
            print(&send(rb).await?);
        }
    }
    Ok(())
}
