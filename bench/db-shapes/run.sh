#!/usr/bin/env bash
# The database's ceiling for four shapes of the claim-and-complete work, no client at
# all (issue 18; docs/benchmarks.md#database-ceiling): pgbench runs each shape's procedure
# on a fresh database holding Tollgate's migrations and 400,000 queued tasks.
#
#   bench/db-shapes/run.sh [postgres://postgres@127.0.0.1:5432/test] [batch=32] [seconds=4]
#
# Each shape gets its own database (created, then dropped): shape A's rows would be
# claimed by the others otherwise. Prints tasks per second for each shape.
set -euo pipefail
url=${1:-postgres://postgres@127.0.0.1:5432/test}
batch=${2:-32}
seconds=${3:-4}
here=$(cd "$(dirname "$0")" && pwd)
migrations="$here/../../crates/store/migrations/postgres"
admin="${url%/*}/postgres"
for shape in today attempts narrow bare; do
  db="tollgate_shape_${shape}_$$"
  psql "$admin" -qc "CREATE DATABASE $db"
  trap 'psql "$admin" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)"' EXIT
  target="${url%/*}/$db"
  for f in "$migrations"/*.sql; do psql "$target" -q -v ON_ERROR_STOP=1 -f "$f" >/dev/null; done
  psql "$target" -q -v ON_ERROR_STOP=1 -f "$here/shapes.sql"
  if [ "$shape" = narrow ] || [ "$shape" = bare ]; then
    # The queue lives in task_queue: the task row keeps no queue or running index.
    psql "$target" -qc "DROP INDEX tasks_queued_age, tasks_queued_dispatch, tasks_running_claimed"
  fi
  psql "$target" -qc "VACUUM ANALYZE"
  echo "CALL cycle_${shape}('w' || :client_id, $batch);" > "/tmp/tollgate_shape_$$.pgb"
  tps=$(pgbench "$target" -n -c 8 -j 2 -T "$seconds" -f "/tmp/tollgate_shape_$$.pgb" \
        | awk '/^tps/ {print $3}')
  awk -v s="$shape" -v t="$tps" -v b="$batch" 'BEGIN {printf "%-7s %8.0f tasks/s\n", s, t * b}'
  psql "$admin" -qc "DROP DATABASE $db WITH (FORCE)"
  trap - EXIT
done
rm -f "/tmp/tollgate_shape_$$.pgb"
