#!/usr/bin/env bash
# Runs the whole test suite against real services: PostgreSQL and MariaDB
# (expected on 127.0.0.1:5432 and :3306, see README), SQLite, and a
# Kafka-API broker that this script installs (once) and starts if none is
# listening. Extra arguments go to `cargo nextest run`.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
    echo "error: $*" >&2
    exit 1
}

check_port() {
    local name=$1 port=$2 hint=$3
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        fail "$name is not listening on 127.0.0.1:$port; $hint"
    fi
}

check_port PostgreSQL 5432 "start it (trust auth, database \`test\`) or set OUTBOX_TEST_POSTGRES_URL"
check_port MariaDB 3306 "start it (root without password, database \`test\`) or set OUTBOX_TEST_MYSQL_URL"

# CDC mode's tests read PostgreSQL's write-ahead log through logical
# decoding, which needs wal_level = logical (a fresh server has `replica`).
postgres_url="${OUTBOX_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
wal_level="$(psql "$postgres_url" -Atc 'SHOW wal_level')" ||
    fail "cannot read wal_level from PostgreSQL at $postgres_url"
if [[ "$wal_level" != logical ]]; then
    echo "PostgreSQL's wal_level is $wal_level; setting it to logical and restarting the server"
    psql "$postgres_url" -qc 'ALTER SYSTEM SET wal_level = logical' ||
        fail "cannot set wal_level = logical (the tests' PostgreSQL user must be a superuser)"
    pg_ctlcluster --skip-systemctl-redirect 15 main restart ||
        fail "cannot restart PostgreSQL 15 (cluster main) to apply wal_level = logical; restart it by hand"
    for _ in $(seq 1 60); do
        if psql "$postgres_url" -Atc 'SELECT 1' >/dev/null 2>&1; then break; fi
        sleep 1
    done
    wal_level="$(psql "$postgres_url" -Atc 'SHOW wal_level')" ||
        fail "PostgreSQL did not come back after the restart"
    [[ "$wal_level" == logical ]] || fail "wal_level is still $wal_level after the restart"
fi

command -v cargo-nextest >/dev/null 2>&1 || cargo install cargo-nextest --locked

export KAFKA_PORT="${KAFKA_PORT:-9092}"
export KAFKA_BROKERS="${KAFKA_BROKERS:-127.0.0.1:$KAFKA_PORT}"
started_broker=false
if ! scripts/kafka.sh status; then
    scripts/kafka.sh install
    scripts/kafka.sh start
    started_broker=true
fi
stop_broker() {
    if $started_broker; then scripts/kafka.sh stop; fi
}
trap stop_broker EXIT

profile=default
if [[ "${CI:-}" == "true" ]]; then profile=ci; fi

cargo nextest run --workspace --profile "$profile" "$@"
# nextest does not run doctests (README and API examples).
cargo test --workspace --doc
