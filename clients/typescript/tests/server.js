// Starts a real `tollgate serve` for the tests: SQLite in a temporary folder, a free
// 127.0.0.1 port (the server picks it: --addr 127.0.0.1:0, and prints it), two apps with
// keys (and a key of one of them bound to a subject), the built-in dev provider, and a
// tight budget policy; webhooks may go to http://127.0.0.1.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
export const repoRoot = resolve(here, "../../..");

export const ACME_KEY = "acme-key-ts-0123456789abcdef";
export const BETA_KEY = "beta-key-ts-0123456789abcdef";
/** An acme key bound to the subject `user:alice`: sees only alice's tasks and runs. */
export const ALICE_KEY = "acme-alice-key-ts-0123456789abcdef";
/** Requests above this many stored bytes are refused with 413. */
export const MAX_REQUEST_BYTES = 20000;

export function tollgateBin() {
  const candidates = [
    process.env.TOLLGATE_BIN,
    process.env.CARGO_TARGET_DIR && join(process.env.CARGO_TARGET_DIR, "debug", "tollgate"),
    join(repoRoot, "target", "debug", "tollgate"),
  ].filter(Boolean);
  const found = candidates.find((p) => existsSync(p));
  if (!found) {
    throw new Error(`no tollgate binary (tried ${candidates.join(", ")}): run cargo build -p tollgate or set TOLLGATE_BIN`);
  }
  return found;
}

function config(databaseUrl) {
  return `
[server]
max_request_bytes = ${MAX_REQUEST_BYTES}
max_wait = "20s"

[database]
url = "${databaseUrl}"

[models.default]
provider = "dev"
model = "dev-1"

# Each call takes 30 s: for waits that time out and for cancellations.
[models.slow]
provider = "dev"
model = "dev-1"
params = { latency_ms = 30000 }

[budgets.standard]
max_steps_per_source = 50
sources_per_24_hours = 1000
scope_concurrent = 50
burst = 100
tasks_per_minute = 6000

# One scoped task at once, then one a second.
[budgets.tight]
max_steps_per_source = 50
sources_per_24_hours = 1000
scope_concurrent = 50
burst = 1
tasks_per_minute = 60

[apps.acme]
api_keys = ["${ACME_KEY}", { key = "${ALICE_KEY}", subject = "user:alice" }]
default_budget = "standard"
allowed_budgets = ["standard", "tight"]

[apps.beta]
api_keys = ["${BETA_KEY}"]
default_budget = "standard"
allowed_budgets = ["standard"]

[workers]
concurrency = 4
heartbeat_interval = "200ms"

[sweeper]
interval = "500ms"

[pipelines]
poll_interval = "200ms"

# The webhook tests' receivers listen on 127.0.0.1 over plain http.
[webhooks]
allow_http = true
allowed_networks = ["127.0.0.1/32"]
poll_interval = "200ms"
`;
}

/** Starts the server; resolves to `{ baseUrl, stop() }`. */
export async function startServer() {
  const dir = mkdtempSync(join(tmpdir(), "tollgate-ts-"));
  const configPath = join(dir, "tollgate.toml");
  writeFileSync(configPath, config(`sqlite://${join(dir, "tollgate.db")}`));
  const env = { ...process.env };
  for (const k of Object.keys(env)) if (k.startsWith("TOLLGATE_") && k !== "TOLLGATE_LOG") delete env[k];
  const child = spawn(tollgateBin(), ["serve", "--addr", "127.0.0.1:0", "--config", configPath], {
    cwd: dir,
    env,
    stdio: ["ignore", "pipe", "inherit"],
  });
  const baseUrl = await new Promise((resolvePromise, reject) => {
    let buffer = "";
    const timer = setTimeout(() => reject(new Error("tollgate serve did not print its address in 60 s")), 60_000);
    child.on("exit", (code) => reject(new Error(`tollgate serve exited with ${code}`)));
    child.stdout.setEncoding("utf8");
    child.stdout.on("data", (chunk) => {
      buffer += chunk;
      const match = buffer.match(/Tollgate listening on (\S+)/);
      if (match) {
        clearTimeout(timer);
        resolvePromise(match[1]);
      }
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
