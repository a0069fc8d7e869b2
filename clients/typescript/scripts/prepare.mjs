// npm's `prepare`: compiles src/ into dist/, which is not committed. npm runs it on `npm ci`
// or `npm install` in this folder, and when another project installs the package from git
// (npm installs the dev dependencies first) or from a path. A path install of a fresh
// clone has no compiler yet: then this installs the locked dev dependencies here first.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = join(root, "node_modules", "typescript", "bin", "tsc");

function run(command, args, env = process.env) {
  const result = spawnSync(command, args, { cwd: root, stdio: "inherit", env });
  if (result.error) throw result.error;
  if (result.status !== 0) process.exit(result.status ?? 1);
}

if (!existsSync(tsc)) {
  // The installing npm's own settings (--global, --omit=dev, a prefix) are not this folder's.
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.toLowerCase().startsWith("npm_config_")));
  const npm = process.env.npm_execpath;
  const args = ["ci", "--include=dev", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"];
  if (npm && npm.endsWith(".js")) run(process.execPath, [npm, ...args], env);
  else run(process.platform === "win32" ? "npm.cmd" : "npm", args, env);
}
run(process.execPath, [tsc, "-p", "tsconfig.json"]);
