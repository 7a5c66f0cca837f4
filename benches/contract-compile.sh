#!/usr/bin/env bash
# What the event contract's compile-time check costs a crate with many
# nested payload types: generates a crate of EVENTS events (default 40) in
# FILES source files (default 8), each event with a nested struct holding a
# nested enum and a vector of a third struct, records its lock with
# `cargo outbox lock`, then builds the crate alone ROUNDS times (default 3,
# each after touching every source file, so every derive and lock check
# runs again) and prints the seconds of each round.
#
#   benches/contract-compile.sh [REPO]     REPO: the checkout to build
#                                          against (default: this one)
#
# The first run builds outbox-core's dependencies into the target dir
# ($CARGO_TARGET_DIR, default a directory per REPO under /tmp); the rounds
# measure the generated crate only.
set -euo pipefail

repo="$(cd "${1:-$(dirname "$0")/..}" && pwd)"
events="${EVENTS:-40}"
files="${FILES:-8}"
rounds="${ROUNDS:-3}"
crate="$(mktemp -d "${TMPDIR:-/tmp}/outbox-contract-compile-XXXXXX")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/tmp/outbox-contract-compile-target-$(basename "$repo")}"
trap 'rm -rf "$crate"' EXIT

mkdir -p "$crate/src"
cat > "$crate/Cargo.toml" <<TOML
[package]
name = "contract-compile"
version = "0.1.0"
edition = "2024"

[dependencies]
outbox-core = { path = "$repo/outbox-core" }
serde = { version = "1", features = ["derive"] }

[workspace]
TOML
{
    for f in $(seq 1 "$files"); do echo "pub mod events_$f;"; done
} > "$crate/src/lib.rs"
for f in $(seq 1 "$files"); do
    out="$crate/src/events_$f.rs"
    echo "use outbox_core::{DomainEvent, EventPayload};" > "$out"
    echo "use serde::{Deserialize, Serialize};" >> "$out"
    for e in $(seq "$f" "$files" "$events"); do
        cat >> "$out" <<RS

#[derive(EventPayload, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Channel$e { Web, Store { store_id: u32 }, Phone(String) }

#[derive(EventPayload, Serialize, Deserialize)]
pub struct Line$e { pub sku: String, pub quantity: u32, pub note: Option<String> }

#[derive(EventPayload, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Detail$e { pub channel: Channel$e, pub lines: Vec<Line$e>, pub total_cents: i64 }

#[derive(DomainEvent, Serialize, Deserialize)]
#[domain_event(aggregate = "Order", version = 1)]
pub struct Event$e { pub order_id: i64, pub detail: Detail$e, pub tags: Vec<String> }
RS
    done
done

cargo run -q --manifest-path "$repo/Cargo.toml" -p cargo-outbox -- outbox lock \
    --manifest-path "$crate/Cargo.toml" >/dev/null
cargo build -q --manifest-path "$crate/Cargo.toml"
for round in $(seq 1 "$rounds"); do
    touch "$crate"/src/*.rs
    start=$(date +%s.%N)
    cargo build -q --manifest-path "$crate/Cargo.toml"
    end=$(date +%s.%N)
    printf 'round %d: %.2f s\n' "$round" "$(echo "$end - $start" | bc)"
done
