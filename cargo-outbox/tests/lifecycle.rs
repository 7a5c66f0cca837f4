//! Walks a real crate through the schema lock's lifecycle with the real
//! `cargo build` and `cargo outbox lock`: no lock -> record version 1 ->
//! additive changes compile -> breaking changes fail the build (in the event
//! and in a nested payload type) and cannot be recorded -> bump to version 2,
//! which compiles once recorded -> the lock holds versions 1 and 2.
//!
//! The crate is written to a temporary directory and depends on this
//! workspace's `outbox-core` by path. It builds offline with a copy of the
//! workspace's Cargo.lock into `target/lifecycle`, which is kept between
//! runs, so only the first run builds `outbox-core`'s dependencies.

use std::process::{Command, Output};

mod common;
use common::{stderr, stdout, workspace};

use outbox_schema::schema_lock::Lock;

/// A crate defining events, in a temporary directory.
struct EventCrate {
    dir: tempfile::TempDir,
}

impl EventCrate {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("outbox-lifecycle-")
            .tempdir()
            .expect("a temporary directory");
        let core = workspace().join("outbox-core");
        let manifest = format!(
            "[package]\nname = \"lifecycle-events\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\
             publish = false\n\n[dependencies]\noutbox-core = {{ path = {core:?} }}\n\
             serde = {{ version = \"1\", features = [\"derive\"] }}\n\n[workspace]\n"
        );
        std::fs::write(dir.path().join("Cargo.toml"), manifest).unwrap();
        std::fs::copy(
            workspace().join("Cargo.lock"),
            dir.path().join("Cargo.lock"),
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("src")).unwrap();
        Self { dir }
    }

    fn write_events(&self, source: &str) {
        std::fs::write(self.dir.path().join("src/lib.rs"), source).unwrap();
    }

    fn lock_text(&self) -> Option<String> {
        std::fs::read_to_string(self.dir.path().join("outbox.lock")).ok()
    }

    fn cargo_build(&self) -> Output {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        Command::new(cargo)
            .args(["build", "--offline", "--quiet", "--manifest-path"])
            .arg(self.dir.path().join("Cargo.toml"))
            .env("CARGO_TARGET_DIR", workspace().join("target/lifecycle"))
            .env_remove("OUTBOX_LOCK")
            .env_remove("RUSTFLAGS")
            .output()
            .expect("cargo runs")
    }

    fn outbox_lock(&self, check: bool) -> Output {
        let mut command = Command::new(env!("CARGO_BIN_EXE_cargo-outbox"));
        command.args(["outbox", "lock", "--manifest-path"]);
        command.arg(self.dir.path().join("Cargo.toml"));
        if check {
            command.arg("--check");
        }
        command
            .env_remove("OUTBOX_LOCK")
            .output()
            .expect("the command runs")
    }
}

#[track_caller]
fn assert_succeeds(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what} failed:\n{}{}",
        stdout(output),
        stderr(output)
    );
}

#[track_caller]
fn assert_fails_with(output: &Output, what: &str, expected: &[&str]) {
    assert!(
        !output.status.success(),
        "{what} succeeded:\n{}",
        stdout(output)
    );
    let stderr = stderr(output);
    for expected in expected {
        assert!(
            stderr.contains(expected),
            "{what}: no {expected:?} in:\n{stderr}"
        );
    }
}

/// The event as first published, with a nested payload type.
const V1: &str = r#"
use outbox_core::{DomainEvent, EventPayload};
use serde::Serialize;

#[derive(EventPayload, Serialize)]
pub struct Money {
    pub cents: i64,
}

#[derive(DomainEvent, Serialize)]
#[domain_event(aggregate = "Order", version = 1)]
pub struct OrderPlaced {
    pub order_id: i64,
    pub customer: String,
    pub total: Money,
}
"#;

#[test]
fn an_event_crate_goes_through_the_lock_lifecycle() {
    let krate = EventCrate::new();
    krate.write_events(V1);

    // No lock yet: the build says how to create it.
    let build = krate.cargo_build();
    assert_fails_with(
        &build,
        "building without a lock",
        &["no outbox.lock in", "run `cargo outbox lock`"],
    );
    assert_fails_with(
        &krate.outbox_lock(true),
        "checking without a lock",
        &["is stale", "run `cargo outbox lock`"],
    );

    // Record version 1.
    let record = krate.outbox_lock(false);
    assert_succeeds(&record, "recording version 1");
    assert!(stdout(&record).contains("recorded new `OrderPlaced` version 1 in outbox.lock"));
    assert_succeeds(&krate.outbox_lock(true), "checking after recording");
    assert_succeeds(&krate.cargo_build(), "building version 1");

    // Additive changes compile; the lock is stale until they are recorded.
    let additive = V1
        .replace("pub cents: i64,", "pub cents: i64,\n    pub currency: Option<String>,")
        .replace(
            "pub total: Money,",
            "pub total: Money,\n    pub coupon: Option<String>,\n    #[serde(default)]\n    pub channel: String,",
        );
    krate.write_events(&additive);
    assert_succeeds(&krate.cargo_build(), "building an additive change");
    assert_fails_with(
        &krate.outbox_lock(true),
        "checking an unrecorded additive change",
        &["outbox.lock is stale: not recorded: additive changes of `OrderPlaced` version 1"],
    );
    assert_succeeds(&krate.outbox_lock(false), "recording the additive change");
    let lock = krate.lock_text().unwrap();
    assert!(
        lock.contains(r#"{ name = "coupon", type = "Option<String>", optional = true }"#),
        "{lock}"
    );

    // A breaking change in the event fails the build, at the field, and
    // cannot be recorded.
    let retyped = additive.replace("pub order_id: i64,", "pub order_id: u64,");
    krate.write_events(&retyped);
    let expected = "`OrderPlaced` version 1 no longer matches outbox.lock: field `order_id` changed \
                    type from `i64` to `u64`; bump to `version = 2` and run `cargo outbox lock`";
    assert_fails_with(
        &krate.cargo_build(),
        "building a changed type",
        &[expected, "src/lib.rs:14:"],
    );
    let before = krate.lock_text();
    assert_fails_with(
        &krate.outbox_lock(false),
        "recording a changed type",
        &[expected, "outbox.lock was not changed"],
    );
    assert_eq!(
        krate.lock_text(),
        before,
        "a rejected change leaves the lock alone"
    );

    // So does one inside the nested payload type.
    let nested = additive.replace("pub cents: i64,", "pub cents: String,");
    krate.write_events(&nested);
    let expected = "`OrderPlaced` version 1 no longer matches outbox.lock through field `total`: \
                    in `Money`, field `cents` changed type from `i64` to `String`";
    assert_fails_with(
        &krate.cargo_build(),
        "building a changed nested type",
        &[expected],
    );
    assert_fails_with(
        &krate.outbox_lock(false),
        "recording a changed nested type",
        &[expected],
    );

    // Bumped, it fails until version 2 is recorded, then compiles.
    let bumped = nested
        .replace("pub order_id: i64,", "pub order_id: u64,")
        .replace("version = 1", "version = 2");
    krate.write_events(&bumped);
    assert_fails_with(
        &krate.cargo_build(),
        "building an unrecorded bump",
        &[
            "`OrderPlaced` version 2 is not recorded in outbox.lock yet (latest recorded: version 1); \
           run `cargo outbox lock`",
        ],
    );
    let record = krate.outbox_lock(false);
    assert_succeeds(&record, "recording version 2");
    assert!(stdout(&record).contains("recorded `OrderPlaced` version 2 (bumped from version 1)"));
    assert_succeeds(&krate.cargo_build(), "building version 2");
    assert_succeeds(&krate.outbox_lock(true), "checking version 2");

    // Version 1 stays as it was published, beside version 2.
    let lock = Lock::parse(&krate.lock_text().unwrap()).unwrap();
    let versions: Vec<u32> = lock
        .versions("OrderPlaced")
        .iter()
        .map(|e| e.version)
        .collect();
    assert_eq!(versions, [1, 2]);
    let v1 = lock.entry("OrderPlaced", 1).unwrap();
    assert_eq!(v1.fields[0].ty, "i64");
    assert_eq!(v1.types["Money"].fields[0].ty, "i64");
    let v2 = lock.entry("OrderPlaced", 2).unwrap();
    assert_eq!(v2.fields[0].ty, "u64");
    assert_eq!(v2.types["Money"].fields[0].ty, "String");

    // Going back to version 1's number for the new payload is refused.
    krate.write_events(&bumped.replace("version = 2", "version = 1"));
    assert_fails_with(
        &krate.cargo_build(),
        "building a reused version",
        &["bump to `version = 3`"],
    );
}
