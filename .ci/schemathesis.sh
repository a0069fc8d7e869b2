#!/usr/bin/env bash
# Runs schemathesis (PyPI, pinned) with every check against a live `tollgate serve`
# (the debug binary) on a free 127.0.0.1 port, and fails on any finding.
#
#   .ci/schemathesis.sh [sqlite|postgres]        (default: sqlite)
#
# postgres needs TOLLGATE_TEST_DATABASE_URL; the run gets its own schema, dropped after.
# TOLLGATE_SCHEMATHESIS_EXAMPLES (default 25) bounds the examples per operation and
# TOLLGATE_SCHEMATHESIS_SEED (default 1) makes a run reproducible. Per-operation
# exclusions, each with its reason, are in .ci/schemathesis.toml.
set -euo pipefail
cd "$(dirname "$0")/.."

SCHEMATHESIS_VERSION=4.32.5
backend="${1:-sqlite}"
examples="${TOLLGATE_SCHEMATHESIS_EXAMPLES:-25}"
seed="${TOLLGATE_SCHEMATHESIS_SEED:-1}"
target="${CARGO_TARGET_DIR:-target}"
binary="$target/debug/tollgate"

if ! st --version 2>/dev/null | grep -qx "st, version $SCHEMATHESIS_VERSION"; then
  python3 -m pip install --quiet "schemathesis==$SCHEMATHESIS_VERSION"
fi
if [ ! -x "$binary" ]; then
  cargo build -p tollgate
fi
binary="$(cd "$(dirname "$binary")" && pwd)/tollgate"

work="$(mktemp -d)"
server_pid=""
schema=""
cleanup() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  if [ -n "$schema" ]; then
    psql "$TOLLGATE_TEST_DATABASE_URL" -qc "DROP SCHEMA IF EXISTS \"$schema\" CASCADE" || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

case "$backend" in
  sqlite) database_url="sqlite://$work/tollgate.db" ;;
  postgres)
    : "${TOLLGATE_TEST_DATABASE_URL:?the postgres run needs TOLLGATE_TEST_DATABASE_URL}"
    schema="schemathesis_$(date +%s)_$$"
    psql "$TOLLGATE_TEST_DATABASE_URL" -qc "CREATE SCHEMA \"$schema\""
    sep='?'
    case "$TOLLGATE_TEST_DATABASE_URL" in *\?*) sep='&' ;; esac
    database_url="${TOLLGATE_TEST_DATABASE_URL}${sep}options=-c%20search_path%3D${schema}"
    ;;
  *) echo "usage: $0 [sqlite|postgres]" >&2; exit 2 ;;
esac

key="schemathesis-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
# A short max_wait keeps generated `?wait=` values from stalling the run.
cat > "$work/tollgate.toml" <<EOF
[server]
max_wait = "1s"

[database]
url = "$database_url"

[apps.schemathesis]
api_keys = ["$key"]
EOF

(cd "$work" && exec "$binary" serve --addr 127.0.0.1:0 --config "$work/tollgate.toml") \
  > "$work/serve.log" 2>&1 &
server_pid=$!
base=""
for _ in $(seq 1 100); do
  base="$(sed -n 's/^Tollgate listening on //p' "$work/serve.log")"
  [ -n "$base" ] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
  sleep 0.2
done
[ -n "$base" ] || { echo "tollgate serve did not start" >&2; cat "$work/serve.log" >&2; exit 1; }

echo "schemathesis $SCHEMATHESIS_VERSION against $base ($backend), $examples examples per operation, seed $seed"
config="$PWD/.ci/schemathesis.toml"
# From the temporary directory, so schemathesis' own files stay out of the repository.
cd "$work"
st --config-file "$config" run "$base/openapi.json" \
  --header "Authorization: Bearer $key" \
  --max-examples "$examples" \
  --seed "$seed" \
  --generation-database none \
  --request-timeout 10 \
  --no-color
