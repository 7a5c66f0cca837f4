#!/usr/bin/env bash
# What reading a claimed row's partition as its name costs the claim
# statement against reading its oid: pgbench on the statement that locks
# and reads the oldest 2,000 of 100,000 pending rows of a day-partitioned
# outbox, both forms alternately, then the server's share of each per-row
# conversion (the partition's name, the id as text) in EXPLAIN ANALYZE.
#
#   BIN=target/release/outbox-relay benches/claim-columns.sh [rounds]
#
# Needs PostgreSQL at $PGURL (default the test database) and pgbench; works
# in a schema of its own, dropped at the end.
set -euo pipefail

ROUNDS="${1:-4}"
BIN="${BIN:-target/release/outbox-relay}"
PGURL="${PGURL:-postgres://postgres@127.0.0.1:5432/test}"
SCHEMA="claim_columns_$$"
URL="$PGURL?options=-csearch_path%3D$SCHEMA"
WORK="$(mktemp -d)"
trap 'psql -q "$PGURL" -c "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" 2>/dev/null; rm -rf "$WORK"' EXIT

psql -q "$PGURL" -c "CREATE SCHEMA $SCHEMA"
"$BIN" migrate --partitioned --database-url "$URL" >/dev/null 2>&1
psql -q "$URL" -c "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
  SELECT gen_random_uuid(), 'Order', 'o-' || (g % 1000), 'OrderPlaced', \
    jsonb_build_object('n', g, 'pad', repeat('x', 150)) FROM generate_series(1, 100000) AS g; \
  ANALYZE outbox;"

for form in "tableoid::regclass::text" "tableoid::int8"; do
    name="${form//[^a-z0-9]/_}"
    cat >"$WORK/$name.sql" <<SQL
BEGIN;
SELECT id::text AS id, aggregatetype, aggregateid, type, payload::text AS payload, event_version,
  aggregate_seq, traceparent, seq, attempts, $form AS partition
FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL
ORDER BY seq LIMIT 2000 FOR UPDATE;
ROLLBACK;
SQL
done

echo "ms per statement (pgbench -M prepared, 5 s each):"
for round in $(seq 1 "$ROUNDS"); do
    for form in "tableoid::regclass::text" "tableoid::int8"; do
        name="${form//[^a-z0-9]/_}"
        latency="$(PGOPTIONS="-csearch_path=$SCHEMA" pgbench -n -M prepared -T 5 \
            -f "$WORK/$name.sql" "$PGURL" 2>/dev/null | sed -n 's/^latency average = //p')"
        echo "  round $round, $form: $latency"
    done
done

echo "the server's share, ms per 100,000 rows (EXPLAIN ANALYZE, mean of 5):"
for form in "tableoid::regclass::text" "tableoid::int8" "id::text" "id"; do
    total=0
    for _ in 1 2 3 4 5; do
        ms="$(psql -At "$URL" -c "EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON) \
            SELECT $form FROM outbox WHERE published_at IS NULL ORDER BY seq" \
            | sed -n 's/^Execution Time: \([0-9.]*\) ms$/\1/p')"
        total="$(echo "$total + $ms" | bc -l)"
    done
    printf '  %s: %.1f\n' "$form" "$(echo "$total / 5" | bc -l)"
done
