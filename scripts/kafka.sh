#!/usr/bin/env bash
# Installs, starts and stops the Kafka-API broker the tests use: tansu, an
# Apache-licensed Kafka-compatible broker written in Rust, in memory, on
# loopback. Its first build takes about 20 minutes; an installed binary is
# reused.
#
#   scripts/kafka.sh install   build tansu unless it is installed
#   scripts/kafka.sh start     start it on 127.0.0.1:$KAFKA_PORT (default 9092) unless running
#   scripts/kafka.sh stop      stop the broker this script started
#   scripts/kafka.sh status    exit 0 when the broker accepts connections
#
# TANSU_BIN points at a tansu binary to use instead of the one on PATH.
set -euo pipefail

TANSU_VERSION=0.6.0
PORT="${KAFKA_PORT:-9092}"
STATE_DIR="${OUTBOX_KAFKA_STATE_DIR:-${TMPDIR:-/tmp}/outbox-kafka-$PORT}"
PID_FILE="$STATE_DIR/tansu.pid"
LOG_FILE="$STATE_DIR/tansu.log"

tansu_bin() {
    if [[ -n "${TANSU_BIN:-}" ]]; then
        echo "$TANSU_BIN"
    elif command -v tansu >/dev/null 2>&1; then
        command -v tansu
    elif [[ -x "$HOME/.cargo/bin/tansu" ]]; then
        echo "$HOME/.cargo/bin/tansu"
    fi
}

port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null
}

install() {
    local bin
    bin="$(tansu_bin)"
    if [[ -n "$bin" ]] && "$bin" --version 2>/dev/null | grep -q "$TANSU_VERSION"; then
        echo "tansu $TANSU_VERSION is installed at $bin"
        return
    fi
    echo "building tansu $TANSU_VERSION (about 20 minutes the first time)..."
    cargo install tansu --version "$TANSU_VERSION" --locked --features dynostore
}

start() {
    if port_open; then
        echo "a broker is already listening on 127.0.0.1:$PORT"
        return
    fi
    local bin
    bin="$(tansu_bin)"
    if [[ -z "$bin" ]]; then
        echo "error: tansu is not installed; run scripts/kafka.sh install" >&2
        exit 1
    fi
    mkdir -p "$STATE_DIR"
    nohup "$bin" broker \
        --listener-url "tcp://127.0.0.1:$PORT" \
        --advertised-listener-url "tcp://127.0.0.1:$PORT" \
        --storage-engine memory://tansu/ >"$LOG_FILE" 2>&1 &
    echo $! >"$PID_FILE"
    for _ in $(seq 1 100); do
        if port_open; then
            echo "tansu is listening on 127.0.0.1:$PORT (log: $LOG_FILE)"
            return
        fi
        sleep 0.1
    done
    echo "error: tansu did not start listening on 127.0.0.1:$PORT; see $LOG_FILE" >&2
    exit 1
}

stop() {
    if [[ -f "$PID_FILE" ]]; then
        local pid
        pid="$(cat "$PID_FILE")"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        rm -f "$PID_FILE"
        echo "stopped the broker on 127.0.0.1:$PORT"
    else
        echo "no broker started by this script on 127.0.0.1:$PORT"
    fi
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status) port_open ;;
    *)
        echo "usage: $0 install|start|stop|status" >&2
        exit 2
        ;;
esac
