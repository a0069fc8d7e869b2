// Starts a real `tollgate serve` (the debug binary) for the browser tests: SQLite in a
// temporary folder, a free 127.0.0.1 port, three apps (one with a USD limit), the built-in
// dev provider (one model of it priced).
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
export const repoRoot = resolve(here, "../..");
export const ACME_KEY = "acme-dashboard-key-0123456789";
export const BETA_KEY = "beta-dashboard-key-0123456789";
export const GAMMA_KEY = "gamma-dashboard-key-0123456789";

export function tollgateBin() {
  const candidates = [
    process.env.TOLLGATE_BIN,
    process.env.CARGO_TARGET_DIR && join(process.env.CARGO_TARGET_DIR, "debug", "tollgate"),
    join(repoRoot, "target", "debug", "tollgate"),
  ].filter(Boolean);
  const found = candidates.find((p) => existsSync(p));
  if (!found) throw new Error(`no tollgate binary (tried ${candidates.join(", ")}): cargo build -p tollgate`);
  return found;
}

const config = (db) => `
[server]
max_wait = "20s"

[database]
url = "${db}"

[models.default]
provider = "dev"
model = "dev-1"

# Each call takes 60 s: a task that stays running until canceled.
[models.slow]
provider = "dev"
model = "dev-1"
params = { latency_ms = 60000 }

# Priced: costs show per task, and the spend gauge moves (USD limits need an output bound).
[models.priced]
provider = "dev"
model = "dev-1"
max_output_tokens = 64

[models.priced.prices]
input_per_million = 2.5
output_per_million = 10
cached_input_per_million = 1.25
cache_write_input_per_million = 3.75

# A bucket that refills slowly, so the gauges visibly move with each admission.
[budgets.standard]
max_steps_per_source = 10
sources_per_24_hours = 100
scope_concurrent = 20
burst = 40
tasks_per_minute = 1

# The same, with a small daily USD limit: the spend gauge has something to measure against.
[budgets.spendy]
max_steps_per_source = 10
sources_per_24_hours = 100
scope_concurrent = 20
burst = 40
tasks_per_minute = 1
usd_per_24_hours = 0.01

[apps.acme]
api_keys = ["${ACME_KEY}"]
default_budget = "standard"

[apps.beta]
api_keys = ["${BETA_KEY}"]
default_budget = "standard"

[apps.gamma]
api_keys = ["${GAMMA_KEY}"]
default_budget = "spendy"

[workers]
concurrency = 4
heartbeat_interval = "200ms"

[sweeper]
interval = "500ms"

[pipelines]
poll_interval = "200ms"
`;

/** Resolves to `{ baseUrl, stop() }`. */
export async function startServer() {
  const dir = mkdtempSync(join(tmpdir(), "tollgate-ui-"));
  const configPath = join(dir, "tollgate.toml");
  writeFileSync(configPath, config(`sqlite://${join(dir, "tollgate.db")}`));
  const env = { ...process.env };
  for (const k of Object.keys(env)) if (k.startsWith("TOLLGATE_") && k !== "TOLLGATE_LOG") delete env[k];
  const child = spawn(tollgateBin(), ["serve", "--addr", "127.0.0.1:0", "--config", configPath], {
    cwd: dir, env, stdio: ["ignore", "pipe", "inherit"],
  });
  const baseUrl = await new Promise((ok, fail) => {
    let buffer = "";
    const timer = setTimeout(() => fail(new Error("tollgate serve did not print its address in 60 s")), 60_000);
    child.on("exit", (code) => fail(new Error(`tollgate serve exited with ${code}`)));
    child.stdout.setEncoding("utf8");
    child.stdout.on("data", (chunk) => {
      buffer += chunk;
      const m = buffer.match(/Tollgate listening on (\S+)/);
      if (m) { clearTimeout(timer); ok(m[1]); }
    });
  });
  child.stdout.resume();
  return {
    baseUrl,
    async stop() {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once("exit", r));
        child.kill("SIGKILL");
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
