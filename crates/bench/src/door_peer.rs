//! The `door` scenario's optional peer gateway: another OpenAI-compatible gateway run as a
//! child process, pointed at the same in-process fake upstream, and measured in the same
//! run as a fourth side (docs/benchmarks.md, "Door").
//!
//! Portkey's AI Gateway (npm `@portkey-ai/gateway`, Node, stateless) is installed outside
//! the product build, in `bench/portkey-peer` (its own `package.json` and lock file:
//! `npm ci --prefix bench/portkey-peer`), and started with `node` on a free port of
//! `127.0.0.1`. A call names its upstream with Portkey's headers (`x-portkey-provider:
//! openai`, `x-portkey-custom-host`: the fake upstream's `/v1`).
//!
//! The LiteLLM proxy (PyPI `litellm[proxy]`, Python) is installed in a virtual
//! environment of its own, `bench/litellm-peer/.venv` (`requirements.txt` beside it), and
//! started as `litellm --config bench/litellm-peer/config.yaml` with the upstream's `/v1`
//! in `TOLLGATE_BENCH_UPSTREAM`; a call is a plain OpenAI call of model `door`. Without
//! `--gateway` the scenario runs without a peer.

use anyhow::Context;
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where `npm ci --prefix bench/portkey-peer` puts Portkey's server, from the repository
/// root.
pub const DEFAULT_PORTKEY_SERVER: &str =
    "bench/portkey-peer/node_modules/@portkey-ai/gateway/build/start-server.js";

/// Where the LiteLLM proxy's executable is after the install of
/// `bench/litellm-peer/README.md`, from the repository root.
pub const DEFAULT_LITELLM: &str = "bench/litellm-peer/.venv/bin/litellm";

/// The LiteLLM proxy's configuration, from the repository root.
pub const DEFAULT_LITELLM_CONFIG: &str = "bench/litellm-peer/config.yaml";

/// How long the peer may take to answer its first request after it was started (the
/// LiteLLM proxy imports a great deal before it listens).
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// `tollgate bench door` options of the peer gateway.
#[derive(Debug, Clone, Default, Args)]
pub struct DoorPeerArgs {
    /// door: also measure this gateway, a child process over the same fake upstream
    /// (installed apart from the product: docs/benchmarks.md, "Door").
    #[arg(long, value_enum)]
    pub gateway: Option<PeerGateway>,
    /// door, `--gateway portkey`: Portkey's `start-server.js` (after `npm ci --prefix
    /// bench/portkey-peer`).
    #[arg(long, default_value = DEFAULT_PORTKEY_SERVER)]
    pub portkey_server: PathBuf,
    /// door, `--gateway portkey`: the Node.js executable that runs it.
    #[arg(long, default_value = "node")]
    pub node: PathBuf,
    /// door, `--gateway litellm`: the proxy's `litellm` executable (after the install in
    /// bench/litellm-peer/README.md).
    #[arg(long, default_value = DEFAULT_LITELLM)]
    pub litellm: PathBuf,
    /// door, `--gateway litellm`: its configuration (one model, `door`, at the upstream
    /// named by `TOLLGATE_BENCH_UPSTREAM`).
    #[arg(long, default_value = DEFAULT_LITELLM_CONFIG)]
    pub litellm_config: PathBuf,
    /// door, `--gateway litellm`: its worker processes.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub litellm_workers: u16,
}

/// A gateway the door is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PeerGateway {
    /// Portkey's AI Gateway (npm `@portkey-ai/gateway`), run by Node.js.
    Portkey,
    /// The LiteLLM proxy (PyPI `litellm[proxy]`), without a database.
    Litellm,
}

impl PeerGateway {
    /// The gateway's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            PeerGateway::Portkey => "portkey",
            PeerGateway::Litellm => "litellm",
        }
    }
}

impl DoorPeerArgs {
    /// Checks before a database is made that the peer's files are where they are said to
    /// be, with the command that installs them.
    pub(crate) fn preflight(&self) -> anyhow::Result<()> {
        match self.gateway {
            Some(PeerGateway::Portkey) => anyhow::ensure!(
                self.portkey_server.is_file(),
                "no Portkey server at {}: install it with `npm ci --prefix bench/portkey-peer` \
                 (from the repository root), or name it with --portkey-server",
                self.portkey_server.display()
            ),
            Some(PeerGateway::Litellm) => {
                anyhow::ensure!(
                    self.litellm.is_file(),
                    "no LiteLLM proxy at {}: install it as bench/litellm-peer/README.md says \
                     (a virtual environment and `pip install -r requirements.txt`), or name it \
                     with --litellm",
                    self.litellm.display()
                );
                anyhow::ensure!(
                    self.litellm_config.is_file(),
                    "no LiteLLM configuration at {} (--litellm-config)",
                    self.litellm_config.display()
                );
            }
            None => {}
        }
        Ok(())
    }
}

/// A running peer gateway, killed when dropped.
pub(crate) struct RunningPeer {
    gateway: PeerGateway,
    child: Child,
    /// Its chat completions URL.
    url: String,
    /// The fake upstream's API root, as the peer is told to call it.
    upstream: String,
}

impl RunningPeer {
    /// Starts the peer of `args` (none without `--gateway`) on a free local port and waits
    /// until it answers.
    pub(crate) async fn start(
        args: &DoorPeerArgs,
        upstream: &str,
    ) -> anyhow::Result<Option<RunningPeer>> {
        let Some(gateway) = args.gateway else {
            return Ok(None);
        };
        let port = free_port()?;
        let mut command = match gateway {
            PeerGateway::Portkey => {
                let mut c = Command::new(&args.node);
                c.arg(&args.portkey_server)
                    .arg(format!("--port={port}"))
                    .arg("--headless")
                    // Not `development`: no log UI, no per-request log stream.
                    .env("NODE_ENV", "production");
                c
            }
            PeerGateway::Litellm => {
                let mut c = Command::new(&args.litellm);
                c.arg("--config")
                    .arg(&args.litellm_config)
                    .arg("--host")
                    .arg("127.0.0.1")
                    .arg("--port")
                    .arg(port.to_string())
                    .arg("--num_workers")
                    .arg(args.litellm_workers.to_string())
                    .env("TOLLGATE_BENCH_UPSTREAM", upstream)
                    // No telemetry, no model-price download: nothing leaves 127.0.0.1.
                    .env("LITELLM_TELEMETRY", "False")
                    .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
                    .env("LITELLM_LOG", "ERROR");
                c
            }
        };
        // Its own process group, so that the workers a gateway forks go with it.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot start {} ({:?})", gateway.name(), command))?;
        let mut peer = RunningPeer {
            gateway,
            child,
            url: format!("http://127.0.0.1:{port}/v1/chat/completions"),
            upstream: upstream.to_string(),
        };
        let ready = match gateway {
            PeerGateway::Portkey => format!("http://127.0.0.1:{port}/"),
            PeerGateway::Litellm => format!("http://127.0.0.1:{port}/health/liveliness"),
        };
        peer.wait_ready(&ready).await?;
        Ok(Some(peer))
    }

    /// The gateway's name in reports.
    pub(crate) fn name(&self) -> &'static str {
        self.gateway.name()
    }

    /// A chat completion call through the peer to the fake upstream.
    pub(crate) fn request(&self, client: &reqwest::Client) -> reqwest::RequestBuilder {
        match self.gateway {
            PeerGateway::Portkey => client
                .post(&self.url)
                .bearer_auth("sk-bench")
                .header("x-portkey-provider", "openai")
                .header("x-portkey-custom-host", &self.upstream),
            PeerGateway::Litellm => client.post(&self.url).bearer_auth("sk-bench"),
        }
    }

    /// Polls the peer's root until it answers, or fails when it exited or took too long.
    async fn wait_ready(&mut self, root: &str) -> anyhow::Result<()> {
        let client = reqwest::Client::new();
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!("{} exited before it answered: {status}", self.name());
            }
            let answered = client
                .get(root)
                .timeout(Duration::from_secs(1))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if answered {
                return Ok(());
            }
            anyhow::ensure!(
                start.elapsed() < START_TIMEOUT,
                "{} did not answer within {} s",
                self.name(),
                START_TIMEOUT.as_secs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for RunningPeer {
    fn drop(&mut self) {
        // Its whole process group killed (a gateway's forked workers too), then the child
        // reaped so no zombie is left.
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) with a negative pid signals that process group; the group is
            // the child's own (process_group(0) at its start), so nothing else is hit.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port of `127.0.0.1` free now (the system's pick, released for the child to take).
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .context("cannot find a free port on 127.0.0.1 for the peer")?;
    Ok(listener.local_addr()?.port())
}
