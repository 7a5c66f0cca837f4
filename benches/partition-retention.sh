#!/usr/bin/env bash
# Retiring one day of N published outbox rows (default 1,000,000) on the
# local PostgreSQL, two ways, each in a schema of its own:
#   - plain outbox: `outbox-relay cleanup --older-than 3d` (batched DELETE);
#   - partitioned outbox: `outbox-relay partitions maintain --retain 3d`
#     (the day's partition dropped).
# Prints, for each, the WAL bytes written (pg_current_wal_lsn before and
# after) and the command's wall-clock seconds, and their ratios.
# `benches/partition-retention.sh [N]`, BIN=path/to/outbox-relay.
# Nothing else should write to the server meanwhile (WAL is server-wide).
set -euo pipefail
N=${1:-1000000}
BIN=${BIN:-target/release/outbox-relay}
PG=${OUTBOX_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}
PLAIN=retention_plain_$$
PARTITIONED=retention_partitioned_$$
cleanup() {
  psql -q "$PG" -c "DROP SCHEMA IF EXISTS $PLAIN CASCADE" >/dev/null 2>&1 || true
  psql -q "$PG" -c "DROP SCHEMA IF EXISTS $PARTITIONED CASCADE" >/dev/null 2>&1 || true
}
trap cleanup EXIT

url() { echo "$PG?options=-c%20search_path%3D$1"; }

# One day ten days ago of N published rows (payloads of about 200 bytes),
# then a checkpoint, so both measurements start alike.
prepare() {
  local schema=$1 migrate=$2
  psql -q "$PG" -c "CREATE SCHEMA $schema"
  DATABASE_URL="$(url "$schema")" $BIN migrate $migrate >/dev/null 2>&1
  psql -q "$(url "$schema")" -c "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_seq, created_at, published_at) \
    SELECT gen_random_uuid(), 'Order', 'order-' || (g % 10000), 'OrderPlaced', \
      jsonb_build_object('order_id', g, 'note', repeat('x', 150)), g / 10000 + 1, \
      now() - interval '10 days', now() - interval '10 days' \
    FROM generate_series(1, $N) AS g"
  psql -q "$(url "$schema")" -c "VACUUM ANALYZE outbox" -c "CHECKPOINT"
}

# Runs the retention command on `schema`; prints "wal_bytes seconds".
measure() {
  local schema=$1
  shift
  local before after start end
  before=$(psql -Atq "$PG" -c "SELECT pg_current_wal_lsn()")
  start=$(date +%s.%N)
  DATABASE_URL="$(url "$schema")" $BIN "$@" >"${TMPDIR:-/tmp}/retention-$$.out" 2>/dev/null
  end=$(date +%s.%N)
  after=$(psql -Atq "$PG" -c "SELECT pg_current_wal_lsn()")
  echo "$(psql -Atq "$PG" -c "SELECT pg_wal_lsn_diff('$after', '$before')::bigint") $(echo "$end - $start" | bc)"
}

prepare "$PLAIN" ""
read -r plain_wal plain_seconds < <(measure "$PLAIN" cleanup --older-than 3d)
left=$(psql -Atq "$(url "$PLAIN")" -c "SELECT count(*) FROM outbox")
[ "$left" = 0 ] || { echo "cleanup left $left rows"; exit 1; }

prepare "$PARTITIONED" --partitioned
# The rows went to the default partition: maintenance gives the day its
# partition first (not measured), then the measured run drops it.
DATABASE_URL="$(url "$PARTITIONED")" $BIN partitions maintain --retain 3650d >/dev/null 2>&1
psql -q "$(url "$PARTITIONED")" -c "VACUUM ANALYZE outbox" -c "CHECKPOINT"
read -r part_wal part_seconds < <(measure "$PARTITIONED" partitions maintain --retain 3d --json)
left=$(psql -Atq "$(url "$PARTITIONED")" -c "SELECT count(*) FROM outbox")
[ "$left" = 0 ] || { echo "maintenance left $left rows"; exit 1; }

read -r drop_seconds locked_seconds < <(python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['dropped'][0]; print(d['seconds'], d['locked_seconds'])" "${TMPDIR:-/tmp}/retention-$$.out")
rm -f "${TMPDIR:-/tmp}/retention-$$.out"
# The commands' times include the process's start (connecting, checking
# the table); the drop's own time, and how long of it the outbox was
# locked, are what maintenance reports.
echo "rows=$N"
echo "batched DELETE (cleanup):      wal_bytes=$plain_wal seconds=$plain_seconds"
echo "drop partition (maintain):     wal_bytes=$part_wal seconds=$part_seconds (the drop itself: $drop_seconds s, the outbox locked: $locked_seconds s)"
echo "ratio drop/DELETE: wal=$(echo "scale=5; $part_wal / $plain_wal" | bc) time=$(echo "scale=4; $part_seconds / $plain_seconds" | bc)"
