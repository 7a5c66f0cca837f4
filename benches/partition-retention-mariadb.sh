#!/usr/bin/env bash
# Retiring N published outbox rows of one past day (default 1,000,000) on
# the local MariaDB, two ways, each in a database of its own:
#   - plain outbox: `outbox-relay cleanup --older-than 3d` (batched DELETE);
#   - partitioned outbox: `outbox-relay partitions maintain --retain 0s`
#     (the partition holding them, `p_before`, dropped; the rows are ten
#     days old, the partition ends today).
# Prints, for each, the InnoDB redo log bytes written (Innodb_lsn_current
# before and after; the binary log, when on, comes on top) and the
# command's wall-clock seconds, and their ratios.
# `benches/partition-retention-mariadb.sh [N]`, BIN=path/to/outbox-relay.
# Nothing else should write to the server meanwhile (the redo log is
# server-wide).
set -euo pipefail
N=${1:-1000000}
BIN=${BIN:-target/release/outbox-relay}
SERVER=${OUTBOX_TEST_MYSQL_URL:-mysql://root@127.0.0.1:3306}
PLAIN=retention_plain_$$
PARTITIONED=retention_partitioned_$$
sql() { mariadb -uroot -h127.0.0.1 -N -B "$@"; }
cleanup() {
  sql -e "DROP DATABASE IF EXISTS $PLAIN; DROP DATABASE IF EXISTS $PARTITIONED" >/dev/null 2>&1 || true
}
trap cleanup EXIT

lsn() { sql -e "SHOW GLOBAL STATUS LIKE 'Innodb_lsn_current'" | cut -f2; }

# N published rows of ten days ago (payloads of about 200 bytes).
prepare() {
  local database=$1 migrate=$2
  sql -e "CREATE DATABASE $database"
  DATABASE_URL="$SERVER/$database" $BIN migrate $migrate >/dev/null 2>&1
  sql "$database" -e "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_seq, created_at, published_at) \
    SELECT UUID(), 'Order', CONCAT('order-', seq % 10000), 'OrderPlaced', \
      JSON_OBJECT('order_id', seq, 'note', REPEAT('x', 150)), seq DIV 10000 + 1, \
      UTC_TIMESTAMP(6) - INTERVAL 10 DAY, UTC_TIMESTAMP(6) - INTERVAL 10 DAY \
    FROM seq_1_to_$N"
  sql "$database" -e "ANALYZE TABLE outbox" >/dev/null
  sleep 5
}

# Runs the retention command on `database`; prints "redo_bytes seconds".
measure() {
  local database=$1
  shift
  local before after start end
  before=$(lsn)
  start=$(date +%s.%N)
  DATABASE_URL="$SERVER/$database" $BIN "$@" >"${TMPDIR:-/tmp}/retention-$$.out" 2>/dev/null
  end=$(date +%s.%N)
  after=$(lsn)
  echo "$((after - before)) $(echo "$end - $start" | bc)"
}

prepare "$PLAIN" ""
read -r plain_redo plain_seconds < <(measure "$PLAIN" cleanup --older-than 3d)
left=$(sql "$PLAIN" -e "SELECT COUNT(*) FROM outbox")
[ "$left" = 0 ] || { echo "cleanup left $left rows"; exit 1; }

prepare "$PARTITIONED" --partitioned
read -r part_redo part_seconds < <(measure "$PARTITIONED" partitions maintain --retain 0s --json)
left=$(sql "$PARTITIONED" -e "SELECT COUNT(*) FROM outbox")
[ "$left" = 0 ] || { echo "maintenance left $left rows"; exit 1; }

read -r drop_seconds locked_seconds < <(python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['dropped'][0]; print(d['seconds'], d['locked_seconds'])" "${TMPDIR:-/tmp}/retention-$$.out")
rm -f "${TMPDIR:-/tmp}/retention-$$.out"
echo "rows=$N"
echo "batched DELETE (cleanup):      redo_bytes=$plain_redo seconds=$plain_seconds"
echo "drop partition (maintain):     redo_bytes=$part_redo seconds=$part_seconds (the drop itself: $drop_seconds s, the outbox locked: $locked_seconds s)"
echo "ratio drop/DELETE: redo=$(echo "scale=5; $part_redo / $plain_redo" | bc) time=$(echo "scale=4; $part_seconds / $plain_seconds" | bc)"
