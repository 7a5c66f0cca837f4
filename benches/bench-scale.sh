#!/usr/bin/env bash
# bench-scale: 1, 2, 3 ... `outbox-relay run` processes (the release binary,
# Kafka sink) draining one backlog loaded by SQL, with default and short
# leases, with and without ANALYZE after loading (issue 14, "throughput
# scales").
#
# Every drain gets a fresh schema (PostgreSQL) or database (MariaDB) named
# outbox_scale_<pid>_<n>, created with `outbox-relay migrate`, with
# autovacuum disabled for the outbox table (so "no ANALYZE" stays
# unanalyzed), and a topic template of its own. The relays are started at
# once; the drain runs from their start to the last row's `published_at`,
# found once no row is pending (probed every 0.5 s). The relays are then
# stopped with SIGTERM. Schemas, databases and relay processes are removed
# at the end, also on error, SIGINT or SIGTERM; a drain longer than
# --timeout is reported as such and stopped.
#
#   benches/bench-scale.sh [--backend postgres|mysql] [--events 200000]
#       [--aggregates 2000] [--relays 1,2,3] [--leases default,2s]
#       [--analyze yes,no] [--repetitions 2] [--timeout 180]
#       [--relay-bin target/release/outbox-relay] [--batch-size N]
#       [--results FILE] [--keep-logs]
#
# PostgreSQL comes from OUTBOX_TEST_POSTGRES_URL (default
# postgres://postgres@127.0.0.1:5432/test), MariaDB from OUTBOX_TEST_MYSQL_URL
# (default mysql://root@127.0.0.1:3306/test; the mysql client is used with
# its host, port and user), the broker from KAFKA_BROKERS (default
# 127.0.0.1:9092). A drain stopped by --timeout counts at the rate of the
# part it drained (status "timeout"). Output: one line per drain, then medians and ratios
# (N relays / 1 relay; without / with ANALYZE). Each line carries the
# 1-minute load average at its start, and the relays' wait events on
# PostgreSQL (samples of pg_stat_activity taken with the probes).
set -euo pipefail

BACKEND=postgres
EVENTS=200000
AGGREGATES=2000
RELAYS=1,2,3
LEASES=default,2s
ANALYZE=yes,no
REPETITIONS=2
TIMEOUT=180
RELAY_BIN=${OUTBOX_RELAY_BIN:-target/release/outbox-relay}
BATCH_SIZE=
RESULTS=
KEEP_LOGS=

while [[ $# -gt 0 ]]; do
    case "$1" in
        --backend) BACKEND=$2; shift 2 ;;
        --events) EVENTS=$2; shift 2 ;;
        --aggregates) AGGREGATES=$2; shift 2 ;;
        --relays) RELAYS=$2; shift 2 ;;
        --leases) LEASES=$2; shift 2 ;;
        --analyze) ANALYZE=$2; shift 2 ;;
        --repetitions) REPETITIONS=$2; shift 2 ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        --relay-bin) RELAY_BIN=$2; shift 2 ;;
        --batch-size) BATCH_SIZE=$2; shift 2 ;;
        --results) RESULTS=$2; shift 2 ;;
        --keep-logs) KEEP_LOGS=1; shift ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "bench-scale: unknown option $1" >&2; exit 2 ;;
    esac
done

[[ -x "$RELAY_BIN" ]] || { echo "bench-scale: no relay binary at $RELAY_BIN (cargo build --release -p outbox-relay)" >&2; exit 2; }
case "$BACKEND" in postgres|mysql) ;; *) echo "bench-scale: --backend postgres or mysql" >&2; exit 2 ;; esac

PG_URL=${OUTBOX_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}
MY_URL=${OUTBOX_TEST_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}
BROKERS=${KAFKA_BROKERS:-127.0.0.1:9092}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-scale.XXXXXX")
RESULTS=${RESULTS:-$WORK/results.tsv}
PIDS=()
SCHEMA=

# mysql client arguments from the URL (host, port, user; no password support).
my_hostport=${MY_URL#mysql://}; my_hostport=${my_hostport#*@}; my_hostport=${my_hostport%%/*}
my_user=${MY_URL#mysql://}; my_user=${my_user%%@*}
MYSQL=(mysql -h "${my_hostport%%:*}" -P "${my_hostport##*:}" -u "$my_user" -N -B)

pg() { PGOPTIONS="-c search_path=${SCHEMA:-public} -c client_min_messages=warning" psql "$PG_URL" -XAtq -v ON_ERROR_STOP=1 -c "$1"; }
my() { "${MYSQL[@]}" ${SCHEMA:+"$SCHEMA"} -e "$1"; }

stop_relays() {
    local pid
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 1 100); do
        local alive=0
        for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [[ $alive == 0 ]] && break
        sleep 0.1
    done
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
    PIDS=()
}

drop_schema() {
    [[ -n "$SCHEMA" ]] || return 0
    local name=$SCHEMA
    SCHEMA=
    if [[ $BACKEND == postgres ]]; then
        pg "DROP SCHEMA IF EXISTS $name CASCADE" || true
    else
        my "DROP DATABASE IF EXISTS $name" || true
    fi
}

cleanup() {
    stop_relays
    drop_schema
    if [[ -z "$KEEP_LOGS" ]]; then rm -rf "$WORK"; else echo "bench-scale: logs in $WORK" >&2; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# One drain: fresh schema, load, maybe ANALYZE, N relays, wait, stop.
drain() {
    local relays=$1 lease=$2 analyze=$3 rep=$4 run=$5
    SCHEMA="outbox_scale_$$_$run"
    local url load1
    load1=$(cut -d' ' -f1 /proc/loadavg)
    if [[ $BACKEND == postgres ]]; then
        pg "CREATE SCHEMA $SCHEMA"
        url="$PG_URL$([[ $PG_URL == *\?* ]] && echo '&' || echo '?')options=-c%20search_path%3D$SCHEMA"
    else
        "${MYSQL[@]}" -e "CREATE DATABASE $SCHEMA"
        url="${MY_URL%/*}/$SCHEMA"
    fi
    DATABASE_URL=$url "$RELAY_BIN" migrate >"$WORK/migrate-$run.log" 2>&1
    if [[ $BACKEND == postgres ]]; then
        pg "ALTER TABLE outbox SET (autovacuum_enabled = false, toast.autovacuum_enabled = false);
            INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_seq)
            SELECT gen_random_uuid(), 'Order', (n % $AGGREGATES)::text, 'OrderPlaced',
                   jsonb_build_object('order_id', n, 'customer', 'c-' || (n % 977), 'total_cents', 1000 + n % 9973, 'currency', 'EUR'),
                   n / $AGGREGATES + 1
            FROM generate_series(0, $EVENTS - 1) AS n ORDER BY n"
        [[ $analyze == yes ]] && pg "ANALYZE outbox"
    else
        my "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_seq)
            SELECT UUID(), 'Order', CAST(seq % $AGGREGATES AS CHAR), 'OrderPlaced',
                   JSON_OBJECT('order_id', seq, 'customer', CONCAT('c-', seq % 977), 'total_cents', 1000 + seq % 9973, 'currency', 'EUR'),
                   seq DIV $AGGREGATES + 1
            FROM seq_0_to_$((EVENTS - 1)) ORDER BY seq"
        [[ $analyze == yes ]] && my "ANALYZE TABLE outbox" >/dev/null
    fi
    local t0 i args
    if [[ $BACKEND == postgres ]]; then t0=$(pg "SELECT clock_timestamp()"); else t0=$(my "SELECT UTC_TIMESTAMP(6)"); fi
    for i in $(seq 1 "$relays"); do
        args=(run --sink kafka --brokers "$BROKERS" --topic-template "bench.scale.$$.$run.{aggregatetype}"
              --no-cleanup --instance-id "scale-$$-$run-$i")
        [[ $lease != default ]] && args+=(--lease "$lease")
        [[ -n $BATCH_SIZE ]] && args+=(--batch-size "$BATCH_SIZE")
        DATABASE_URL=$url RUST_LOG=${RUST_LOG:-info} "$RELAY_BIN" "${args[@]}" >"$WORK/relay-$run-$i.log" 2>&1 &
        PIDS+=($!)
    done
    local started=$SECONDS pending=1 status=ok waits="$WORK/waits-$run"
    : >"$waits"
    while :; do
        sleep 0.5
        if [[ $BACKEND == postgres ]]; then
            pending=$(pg "SELECT count(*) FROM (SELECT 1 FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL LIMIT 1) p")
            pg "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') || '/' || replace(state, ' ', '_') FROM pg_stat_activity
                WHERE application_name LIKE 'scale-$$-$run-%' AND state <> 'idle'" >>"$waits" || true
        else
            pending=$(my "SELECT count(*) FROM (SELECT 1 FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL LIMIT 1) p")
        fi
        [[ $pending == 0 ]] && break
        for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null || { status=relay-exited; break 2; }; done
        (( SECONDS - started > TIMEOUT )) && { status=timeout; break; }
    done
    local seconds first
    if [[ $BACKEND == postgres ]]; then
        read -r seconds first < <(pg "SELECT coalesce(round(extract(epoch FROM max(published_at) - '$t0'::timestamptz), 3), 0),
                                             coalesce(round(extract(epoch FROM max(published_at) - min(published_at)), 3), 0) FROM outbox" | tr '|' ' ')
    else
        read -r seconds first < <(my "SELECT TIMESTAMPDIFF(MICROSECOND, '$t0', MAX(published_at)) / 1e6,
                                             TIMESTAMPDIFF(MICROSECOND, MIN(published_at), MAX(published_at)) / 1e6 FROM outbox")
    fi
    local published
    if [[ $BACKEND == postgres ]]; then published=$(pg "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL");
    else published=$(my "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL"); fi
    stop_relays
    local warns
    warns=$(cat "$WORK"/relay-"$run"-*.log | grep -c -E 'WARN|ERROR' || true)
    local top
    top=$(sort "$waits" | uniq -c | sort -rn | head -4 | awk '{printf "%s%s=%s", (NR>1?",":""), $2, $1}')
    # After a timeout, the rate of the part drained (status says so).
    local rate steady
    rate=$(awk -v e="$published" -v s="$seconds" 'BEGIN{printf "%.0f", (s>0?e/s:0)}')
    steady=$(awk -v e="$published" -v s="$first" 'BEGIN{printf "%.0f", (s>0?e/s:0)}')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
        "$BACKEND" "$analyze" "$lease" "$relays" "$rep" "$published" "$seconds" "$rate" "$steady" \
        "$load1" "$warns" "$status" "${top:--}" | tee -a "$RESULTS"
    drop_schema
}

echo "bench-scale: $BACKEND, $EVENTS events over $AGGREGATES aggregates, relays $RELAYS, leases $LEASES, analyze $ANALYZE, $REPETITIONS repetitions; $(uptime)" >&2
printf 'backend\tanalyze\tlease\trelays\trep\tevents\tseconds\tevents/s\tfirst-to-last/s\tload1\twarn-lines\tstatus\twait-samples\n' | tee -a "$RESULTS"
IFS=, read -r -a relay_list <<<"$RELAYS"
IFS=, read -r -a lease_list <<<"$LEASES"
IFS=, read -r -a analyze_list <<<"$ANALYZE"
run=0
for rep in $(seq 1 "$REPETITIONS"); do
    # Alternate the order across repetitions so that drift in the machine's
    # load does not favour one end of the list.
    order=("${relay_list[@]}")
    if (( rep % 2 == 0 )); then order=(); for (( i=${#relay_list[@]}-1; i>=0; i-- )); do order+=("${relay_list[$i]}"); done; fi
    for analyze in "${analyze_list[@]}"; do
        for lease in "${lease_list[@]}"; do
            for relays in "${order[@]}"; do
                run=$((run + 1))
                drain "$relays" "$lease" "$analyze" "$rep" "$run"
            done
        done
    done
done

echo "bench-scale: done; $(uptime)" >&2
echo
echo "median events/s (range) per configuration; ratio of medians to 1 relay, and without / with ANALYZE"
awk -F'\t' -v backend="$BACKEND" '
    NR > 1 && $1 == backend && ($12 == "ok" || $12 == "timeout") && $8 > 0 {
        key = $2 "\t" $3 "\t" $4; n[key]++; v[key, n[key]] = $8
        if (!(key in seen)) { seen[key] = 1; keys[++k] = key }
    }
    function median(key,    m, i, j, t, a) {
        m = n[key]; for (i = 1; i <= m; i++) a[i] = v[key, i]
        for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        lo[key] = a[1]; hi[key] = a[m]
        return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
    }
    END {
        printf "analyze\tlease\trelays\tmedian\trange\tvs 1 relay\tno-ANALYZE/ANALYZE\n"
        for (i = 1; i <= k; i++) med[keys[i]] = median(keys[i])
        for (i = 1; i <= k; i++) {
            split(keys[i], f, "\t"); one = f[1] "\t" f[2] "\t1"; other = "yes\t" f[2] "\t" f[3]
            printf "%s\t%s\t%s\t%.0f\t%.0f-%.0f\t%s\t%s\n", f[1], f[2], f[3], med[keys[i]], lo[keys[i]], hi[keys[i]],
                (one in med) ? sprintf("%.2f", med[keys[i]] / med[one]) : "-",
                (f[1] == "no" && (other in med)) ? sprintf("%.2f", med[keys[i]] / med[other]) : "-"
        }
    }' "$RESULTS"
