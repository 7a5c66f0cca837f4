#!/usr/bin/env bash
# Peak RSS of a polling relay draining a backlog of N outbox rows of about
# 1 MB each (990,000-byte payloads, under librdkafka's default largest
# message) over 4 aggregates to the Kafka-API broker (KAFKA_BROKERS,
# default 127.0.0.1:9092) from the local PostgreSQL:
# `benches/polling-rss.sh [N] [relay options...]`, BIN=path/to/outbox-relay,
# SINK="--sink stdout" for another sink.
# Prints rows, the relay's peak RSS (VmHWM) and the seconds to drain; drops
# its schema (the topics stay on the broker).
set -euo pipefail
N=${1:-200}
shift || true
BIN=${BIN:-target/release/outbox-relay}
BROKERS=${KAFKA_BROKERS:-127.0.0.1:9092}
PG=postgres://postgres@127.0.0.1:5432/test
S=polling_rss_$$
psql -q $PG -c "CREATE SCHEMA $S"
URL="$PG?options=-c%20search_path%3D$S"
cleanup() {
  [ -n "${PID:-}" ] && kill -TERM $PID 2>/dev/null || true
  sleep 1
  psql -q $PG -c "DROP SCHEMA $S CASCADE" >/dev/null 2>&1 || true
}
trap cleanup EXIT
DATABASE_URL="$URL" $BIN migrate >/dev/null 2>&1
psql -q "$URL" -c "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) SELECT gen_random_uuid(), 'Blob', 'blob-' || (g % 4), 'BlobStored', jsonb_build_object('n', g, 'blob', repeat('x', 990000 - 30)) FROM generate_series(1, $N) g"
START=$(date +%s.%N)
DATABASE_URL="$URL" $BIN run ${SINK:---sink kafka --brokers $BROKERS} --topic-template "$S.{aggregatetype}" "$@" \
  > /dev/null 2>"${TMPDIR:-/tmp}/polling-rss-$$.err" &
PID=$!
while [ "$(psql -Atq "$URL" -c "SELECT count(*) FROM outbox WHERE published_at IS NULL")" != 0 ]; do
  kill -0 $PID 2>/dev/null || { echo "the relay exited:"; cat "${TMPDIR:-/tmp}/polling-rss-$$.err"; exit 1; }
  sleep 0.2
done
END=$(date +%s.%N)
HWM=$(grep VmHWM /proc/$PID/status | awk '{print $2}')
echo "rows=$N peak_rss_kb=$HWM seconds=$(echo "$END - $START" | bc)"
