#!/usr/bin/env bash
# Drain rate of `outbox-relay run --drain` to the Kafka-API broker
# (127.0.0.1:9092) over a backlog of N rows (200-byte payloads, 1,000
# aggregates) on a plain or day-partitioned outbox:
#   benches/partitioned-drain.sh pg|maria plain|partitioned analyze|noanalyze [N]
# BIN=path/to/outbox-relay (default target/release/outbox-relay); AHEAD=30
# creates that many days ahead after migrate (a partitioned outbox with
# retention has a few dozen partitions); NUMBERED=1 gives the rows
# aggregate_seq numbers as the SeaORM append does (1, 2, ... per aggregate
# in insertion order; else NULL, as plain-SQL writers leave it); EXTRA=
# more relay options.
# Prints the partitions, rows left pending, events/s and the relay's CPU
# and peak RSS; drops its schema or database.
set -euo pipefail
DB=$1; LAYOUT=$2; AN=$3; N=${4:-100000}
BIN=${BIN:-target/release/outbox-relay}
MIG=""; [ "$LAYOUT" = partitioned ] && MIG="--partitioned"
S=drain_bench_$$_$RANDOM
if [ "$DB" = pg ]; then
  PG=postgres://postgres@127.0.0.1:5432/test
  psql -q $PG -c "CREATE SCHEMA $S"
  URL="$PG?options=-c%20search_path%3D$S"
  DATABASE_URL="$URL" $BIN migrate $MIG >/dev/null 2>&1
  [ -n "${AHEAD:-}" ] && [ "$LAYOUT" = partitioned ] && DATABASE_URL="$URL" $BIN partitions maintain --ahead $AHEAD --retain 365d >/dev/null
  NUM="NULL"; [ -n "${NUMBERED:-}" ] && NUM="(g - 1) / 1000 + 1"
  psql -q "$URL" -c "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_seq) SELECT gen_random_uuid(), 'Invoice', 'inv-' || (g % 1000), 'InvoiceIssued', json_build_object('n', g, 'note', repeat('x', 170))::jsonb, $NUM FROM generate_series(1, $N) g"
  [ "$AN" = analyze ] && psql -q "$URL" -c "ANALYZE outbox"
  cleanup() { psql -q $PG -c "DROP SCHEMA $S CASCADE" >/dev/null 2>&1; }
else
  mariadb -uroot -h127.0.0.1 -e "CREATE DATABASE $S"
  URL="mysql://root@127.0.0.1:3306/$S"
  DATABASE_URL="$URL" $BIN migrate $MIG >/dev/null 2>&1
  [ -n "${AHEAD:-}" ] && [ "$LAYOUT" = partitioned ] && DATABASE_URL="$URL" $BIN partitions maintain --ahead $AHEAD --retain 365d >/dev/null
  NUM="NULL"; [ -n "${NUMBERED:-}" ] && NUM="(seq - 1) DIV 1000 + 1"
  mariadb -uroot -h127.0.0.1 $S -e "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_seq) SELECT UUID(), 'Invoice', CONCAT('inv-', seq % 1000), 'InvoiceIssued', JSON_OBJECT('n', seq, 'note', REPEAT('x', 170)), $NUM FROM seq_1_to_$N"
  [ "$AN" = analyze ] && mariadb -uroot -h127.0.0.1 $S -e "ANALYZE TABLE outbox" >/dev/null
  cleanup() { mariadb -uroot -h127.0.0.1 -e "DROP DATABASE $S"; }
fi
trap cleanup EXIT
START=$(date +%s.%N)
DATABASE_URL="$URL" /usr/bin/time -f "%e s %U user %S sys %M maxrss" $BIN run --drain ${EXTRA:-} --brokers 127.0.0.1:9092 --topic-template "$S.{aggregatetype}" >/dev/null 2>"${TMPDIR:-/tmp}/partitioned-drain-$$.err" || { tail -3 "${TMPDIR:-/tmp}/partitioned-drain-$$.err"; }
END=$(date +%s.%N)
LEFT=0
if [ "$DB" = pg ]; then LEFT=$(psql -Atq "$URL" -c "select count(*) from outbox where published_at is null"); else LEFT=$(mariadb -uroot -h127.0.0.1 $S -N -e "select count(*) from outbox where published_at is null"); fi
PARTS=""; [ "$DB" = pg ] && PARTS=$(psql -Atq "$URL" -c "select count(*) from pg_inherits where inhparent='outbox'::regclass"); [ "$DB" = maria ] && PARTS=$(mariadb -uroot -h127.0.0.1 -N -e "select count(*) from information_schema.partitions where table_schema='$S' and table_name='outbox' and partition_name is not null")
echo "$DB $LAYOUT $AN${NUMBERED:+ numbered} partitions=$PARTS rows=$N left=$LEFT rate=$(echo "$N / ($END - $START)" | bc) $(tail -1 "${TMPDIR:-/tmp}/partitioned-drain-$$.err")"
