#!/usr/bin/env bash
# Release soak of per-aggregate order under concurrent writers (issue 13).
#
# Runs outbox-relay's `concurrent_writers` tests (8+ writer tasks on 2, 5
# and 20 aggregates; the real relay binary, one to three instances, one
# killed with SIGKILL, polling and CDC; PostgreSQL, MariaDB and SQLite;
# the real Kafka-API broker; an independent consumer checks every
# aggregate's sequence against what the writers committed) with many more
# transactions per writer than CI does, several times over.
#
#   scripts/soak-ordering.sh [ITERATIONS] [FILTER...]
#
#   ITERATIONS  how many times the whole set runs (default 10)
#   FILTER      test name filters passed on to the test runner, for example
#               `postgres_one_relay` (default: every test of the file)
#
# Environment:
#   OUTBOX_SOAK_ROUNDS   transactions per writer in each test (default here
#                        600; CI runs the tests with 60)
#   OUTBOX_SOAK_WRITERS  writer tasks per test (default 8, never fewer)
#   SOAK_LOG_DIR         where each iteration's output goes
#                        (default target/soak-ordering)
#
# At 600 rounds an iteration takes about two minutes on a 2-core machine,
# the SQLite case (whose writers take turns on the file) about 70 s of it.
# nextest ends a test after 300 s (.config/nextest.toml), so keep
# OUTBOX_SOAK_ROUNDS below about 2000 and soak longer with more iterations.
#
# It needs what scripts/test.sh needs: PostgreSQL (wal_level = logical for
# the CDC test; scripts/test.sh sets it) and MariaDB on their usual ports,
# and a Kafka-API broker on KAFKA_BROKERS (started here with
# scripts/kafka.sh when none listens). It prints one line per iteration and
# exits non-zero when any iteration failed; the failing tests' messages
# (aggregate, sequences on the broker, missing or unexpected event ids) are
# in that iteration's log.
set -euo pipefail
cd "$(dirname "$0")/.."

iterations="${1:-10}"
shift || true
export OUTBOX_SOAK_ROUNDS="${OUTBOX_SOAK_ROUNDS:-600}"
export OUTBOX_SOAK_WRITERS="${OUTBOX_SOAK_WRITERS:-8}"
export KAFKA_PORT="${KAFKA_PORT:-9092}"
export KAFKA_BROKERS="${KAFKA_BROKERS:-127.0.0.1:$KAFKA_PORT}"
log_dir="${SOAK_LOG_DIR:-target/soak-ordering}"
mkdir -p "$log_dir"

postgres_url="${OUTBOX_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
if [[ "$(psql "$postgres_url" -Atc 'SHOW wal_level' 2>/dev/null || true)" != logical ]]; then
    echo "warning: PostgreSQL's wal_level is not logical, the CDC test will fail;" \
        "scripts/test.sh sets it" >&2
fi

started_broker=false
if ! scripts/kafka.sh status >/dev/null 2>&1; then
    scripts/kafka.sh start
    started_broker=true
fi
stop_broker() {
    if $started_broker; then scripts/kafka.sh stop; fi
}
trap stop_broker EXIT

if cargo nextest --version >/dev/null 2>&1; then
    run_tests() {
        cargo nextest run -p outbox-relay --test concurrent_writers \
            --no-fail-fast --success-output final "$@"
    }
else
    run_tests() {
        cargo test -p outbox-relay --test concurrent_writers -- --nocapture "$@"
    }
fi

# Build once, outside the timed iterations.
cargo test -p outbox-relay --test concurrent_writers --no-run

failed=0
for iteration in $(seq 1 "$iterations"); do
    log="$log_dir/iteration-$iteration.log"
    start=$SECONDS
    if run_tests "$@" >"$log" 2>&1; then
        echo "iteration $iteration/$iterations: ok ($((SECONDS - start))s, $OUTBOX_SOAK_ROUNDS rounds x $OUTBOX_SOAK_WRITERS writers per test)"
    else
        failed=$((failed + 1))
        echo "iteration $iteration/$iterations: FAILED ($((SECONDS - start))s), see $log"
        grep -E "^(thread .* panicked|.*breaks per-aggregate order|  aggregate )" "$log" | head -20 || true
    fi
done

echo "$failed of $iterations iterations failed"
[[ $failed -eq 0 ]]
