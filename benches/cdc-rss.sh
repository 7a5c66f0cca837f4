#!/usr/bin/env bash
# Peak RSS of a CDC relay reading one transaction of N outbox rows
# (~200-byte payloads) on the local PostgreSQL (wal_level = logical) and
# publishing them to the Kafka-API broker (KAFKA_BROKERS, default
# 127.0.0.1:9092): `benches/cdc-rss.sh [N]`, BIN=path/to/outbox-relay,
# SINK="--sink stdout" for another sink, PGSSLMODE=require for TLS.
# Prints rows, the relay's peak RSS (VmHWM) and the seconds from the
# insert to the last row marked; drops its schema, slot and publication.
set -euo pipefail
N=${1:-200000}
BIN=${BIN:-target/release/outbox-relay}
BROKERS=${KAFKA_BROKERS:-127.0.0.1:9092}
PG=postgres://postgres@127.0.0.1:5432/test
S=cdc_rss_$$
psql -q $PG -c "CREATE SCHEMA $S"
URL="$PG?options=-c%20search_path%3D$S"
DATABASE_URL="$URL" $BIN migrate >/dev/null 2>&1
DATABASE_URL="$URL" $BIN run --mode cdc --slot $S --publication $S \
  ${SINK:---sink kafka --brokers $BROKERS} --topic-template "$S.{aggregatetype}" > /dev/null 2>"${TMPDIR:-/tmp}/cdc-rss-$$.err" &
PID=$!
cleanup() {
  kill -TERM $PID 2>/dev/null || true
  sleep 1
  psql -q $PG -c "SELECT pg_drop_replication_slot('$S') FROM pg_replication_slots WHERE slot_name = '$S'" \
    -c "DROP PUBLICATION IF EXISTS $S" -c "DROP SCHEMA $S CASCADE" >/dev/null 2>&1 || true
}
trap cleanup EXIT
for i in $(seq 1 100); do
  if psql -Atq $PG -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name='$S' AND active" | grep -q 1; then break; fi; sleep 0.2; done
sleep 1
START=$(date +%s.%N)
psql -q "$URL" -c "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) SELECT gen_random_uuid(), 'Invoice', 'inv-' || (g % 100), 'InvoiceIssued', json_build_object('n', g, 'note', repeat('x', 170))::jsonb FROM generate_series(1, $N) g"
while [ "$(psql -Atq "$URL" -c "SELECT count(*) FROM outbox WHERE published_at IS NULL")" != 0 ]; do sleep 0.5; done
END=$(date +%s.%N)
HWM=$(grep VmHWM /proc/$PID/status | awk '{print $2}')
echo "rows=$N peak_rss_kb=$HWM seconds=$(echo "$END - $START" | bc)"
