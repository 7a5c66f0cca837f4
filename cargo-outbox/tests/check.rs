//! `cargo outbox check --contract PATH`: a consumer's decoders against a
//! producer's published lock. The producer's lock is written by `cargo
//! outbox lock` from the producer's sources, as a producer publishes it;
//! the consumer is a separate crate with its own decoder structs.

use std::path::Path;
use std::process::Output;

mod common;
use common::{cargo_outbox, stderr, stdout, workspace};

/// A crate with `source` as its `src/lib.rs`, in a temporary directory.
fn crate_with(name: &str, source: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix(&format!("outbox-check-{name}-"))
        .tempdir()
        .expect("a temporary directory");
    let manifest =
        format!("[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2024\"\n");
    std::fs::write(dir.path().join("Cargo.toml"), manifest).unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/lib.rs"), source).unwrap();
    dir
}

/// The producer: version 1 of `OrderPlaced` and its bump to version 2,
/// whose nested `Line` changed with the bump (`qty` became `quantity`).
const PRODUCER_V1: &str = r#"
    #[derive(DomainEvent, Serialize, Deserialize)]
    #[domain_event(aggregate = "Order", version = 1)]
    pub struct OrderPlaced {
        pub order_id: i64,
        pub lines: Vec<Line>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub coupon: Option<String>,
        pub channel: Channel,
    }

    #[derive(EventPayload, Serialize, Deserialize)]
    pub struct Line {
        pub sku: String,
        pub qty: u32,
    }

    #[derive(EventPayload, Serialize, Deserialize)]
    #[serde(tag = "kind")]
    pub enum Channel {
        Web,
        Store { store_id: u32 },
    }

    #[derive(DomainEvent, Serialize, Deserialize)]
    #[domain_event(aggregate = "Order", version = 1)]
    pub struct OrderCancelled {
        pub order_id: i64,
    }
"#;

const PRODUCER_V2: &str = r#"
    #[derive(DomainEvent, Serialize, Deserialize)]
    #[domain_event(name = "OrderPlaced", aggregate = "Order", version = 1)]
    pub struct OrderPlacedV1 {
        pub order_id: i64,
        pub lines: Vec<LineV1>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub coupon: Option<String>,
        pub channel: Channel,
    }

    #[derive(EventPayload, Serialize, Deserialize)]
    pub struct LineV1 {
        pub sku: String,
        pub qty: u32,
    }

    #[derive(DomainEvent, Serialize, Deserialize)]
    #[domain_event(aggregate = "Order", version = 2)]
    pub struct OrderPlaced {
        pub order_id: i64,
        pub lines: Vec<Line>,
        pub channel: Channel,
    }

    #[derive(EventPayload, Serialize, Deserialize)]
    pub struct Line {
        pub sku: String,
        pub quantity: u64,
    }

    #[derive(EventPayload, Serialize, Deserialize)]
    #[serde(tag = "kind")]
    pub enum Channel {
        Web,
        Store { store_id: u32 },
    }

    #[derive(DomainEvent, Serialize, Deserialize)]
    #[domain_event(aggregate = "Order", version = 1)]
    pub struct OrderCancelled {
        pub order_id: i64,
    }
"#;

/// A published contract: the producer's lock after recording `sources`
/// in turn (each a later state of the producer).
fn contract(sources: &[&str]) -> tempfile::TempDir {
    let producer = crate_with("producer", "");
    for source in sources {
        std::fs::write(producer.path().join("src/lib.rs"), source).unwrap();
        let recorded = cargo_outbox(producer.path(), &["lock"]);
        assert!(recorded.status.success(), "{}", stderr(&recorded));
    }
    producer
}

fn check(consumer: &Path, contract: &Path) -> Output {
    let lock = contract.join("outbox.lock");
    cargo_outbox(consumer, &["check", "--contract", lock.to_str().unwrap()])
}

/// A decoder of `OrderPlaced` version 1 that reads what it needs, under
/// its own names and in wider types.
const READS_V1: &str = r#"
    #[derive(DomainEvent, Deserialize)]
    #[domain_event(name = "OrderPlaced", aggregate = "Order", version = 1)]
    pub struct Placed {
        pub order_id: i64,
        pub lines: Vec<Item>,
        pub coupon: Option<String>,
        pub channel: Source,
    }

    #[derive(EventPayload, Deserialize)]
    pub struct Item {
        pub qty: u64,
    }

    #[derive(EventPayload, Deserialize)]
    #[serde(tag = "kind")]
    pub enum Source {
        Web,
        Store { store_id: i64 },
        Phone,
    }
"#;

#[test]
fn decoders_that_read_every_declared_version_pass() {
    let producer = contract(&[PRODUCER_V1]);
    let consumer = crate_with("consumer", READS_V1);
    let output = check(consumer.path(), producer.path());
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output).contains("1 decoder(s) read all 1 version(s) of 1 event type(s)"),
        "{}",
        stdout(&output)
    );
    // The event type it does not decode is a note, not a failure.
    assert!(
        stderr(&output)
            .contains("note: `OrderCancelled` (1 version(s) in the contract) has no decoder"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn aliases_and_an_other_variant_widen_what_a_decoder_reads() {
    let producer = contract(&[PRODUCER_V1]);
    // `quantity` reads the producer's `qty` and `Online` its `Web` through
    // their aliases, and the `other` variant reads `Store`, which the
    // decoder does not name.
    let qty_alias = "#[serde(alias = \"qty\")] ";
    let web_alias = "#[serde(alias = \"Web\")] ";
    let reads = READS_V1
        .replace("pub qty: u64,", &format!("{qty_alias}pub quantity: u64,"))
        .replace("Web,", &format!("{web_alias}Online,"))
        .replace("Store { store_id: i64 },", "#[serde(other)] Unknown,");
    let consumer = crate_with("consumer", &reads);
    let output = check(consumer.path(), producer.path());
    assert!(output.status.success(), "{}", stderr(&output));

    // Without `other`, only the variant nothing reads is named.
    let closed = reads.replace("#[serde(other)] ", "");
    let consumer = crate_with("consumer", &closed);
    let output = check(consumer.path(), producer.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let errors = stderr(&output);
    assert!(errors.contains("`OrderPlaced.channel::Store`"), "{errors}");
    assert!(
        !errors.contains("channel::Web") && !errors.contains("quantity"),
        "{errors}"
    );

    // Without the aliases either, every path is named.
    let unread = reads
        .replace(qty_alias, "")
        .replace(web_alias, "")
        .replace("#[serde(other)] ", "");
    let consumer = crate_with("consumer", &unread);
    let output = check(consumer.path(), producer.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let errors = stderr(&output);
    for path in [
        "`OrderPlaced.lines[].quantity`",
        "`OrderPlaced.channel::Web`",
        "`OrderPlaced.channel::Store`",
    ] {
        assert!(errors.contains(path), "{path} in {errors}");
    }
}

#[test]
fn every_unreadable_path_is_reported_at_once() {
    let producer = contract(&[PRODUCER_V1]);
    let consumer = crate_with(
        "consumer",
        r#"
        #[derive(DomainEvent, Deserialize)]
        #[domain_event(name = "OrderPlaced", aggregate = "Order", version = 1)]
        pub struct Placed {
            pub order_id: i32,
            pub lines: Vec<Item>,
            pub coupon: String,
            pub channel: Source,
            pub total_cents: i64,
        }

        #[derive(EventPayload, Deserialize)]
        pub struct Item {
            pub qty: u16,
        }

        #[derive(EventPayload, Deserialize)]
        #[serde(tag = "kind")]
        pub enum Source {
            Web,
        }
    "#,
    );
    let output = check(consumer.path(), producer.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let errors = stderr(&output);
    for expected in [
        "`OrderPlaced` version 1: `OrderPlaced.order_id`: the producer writes `i64`, which the decoder's `i32` does not read",
        "`OrderPlaced` version 1: `OrderPlaced.lines[].qty`: the producer writes `u32`, which the decoder's `u16` does not read",
        "`OrderPlaced` version 1: `OrderPlaced.coupon`: the producer may leave this key out",
        "`OrderPlaced.coupon`: the producer may write null here",
        "`OrderPlaced` version 1: `OrderPlaced.channel::Store`: the producer writes this variant, which the decoder does not have",
        "`OrderPlaced` version 1: `OrderPlaced.total_cents`: the decoder requires this key, which the producer never writes",
        "problem(s) above",
    ] {
        assert!(
            errors.contains(expected),
            "missing {expected:?} in:\n{errors}"
        );
    }
    assert_eq!(
        errors.matches("error: `OrderPlaced` version 1").count(),
        6,
        "{errors}"
    );
}

#[test]
fn a_bumped_version_needs_its_own_decoder_and_the_old_one_keeps_its_nested_types() {
    let producer = contract(&[PRODUCER_V1, PRODUCER_V2]);
    // The consumer that only reads version 1 fails on version 2.
    let consumer = crate_with("consumer", READS_V1);
    let output = check(consumer.path(), producer.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("error: `OrderPlaced` version 2 has no decoder"),
        "{}",
        stderr(&output)
    );
    // A version 2 decoder with its own `Item` next to version 1's passes;
    // version 1's decoder still reads `qty`, recorded with version 1.
    let both = format!(
        "{READS_V1}{}",
        r#"
        #[derive(DomainEvent, Deserialize)]
        #[domain_event(name = "OrderPlaced", aggregate = "Order", version = 2)]
        pub struct PlacedV2 {
            pub order_id: i64,
            pub lines: Vec<ItemV2>,
        }

        #[derive(EventPayload, Deserialize)]
        pub struct ItemV2 {
            pub quantity: u64,
        }
    "#
    );
    std::fs::write(consumer.path().join("src/lib.rs"), &both).unwrap();
    let output = check(consumer.path(), producer.path());
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output).contains("2 decoder(s) read all 2 version(s) of 1 event type(s)"),
        "{}",
        stdout(&output)
    );
    // Reading version 2's `quantity` as version 1's `qty` is caught.
    let swapped = both.replace("pub quantity: u64", "pub qty: u64");
    std::fs::write(consumer.path().join("src/lib.rs"), swapped).unwrap();
    let output = check(consumer.path(), producer.path());
    assert!(
        stderr(&output).contains(
            "`OrderPlaced` version 2: `OrderPlaced.lines[].qty`: the decoder requires this key, which the producer never writes"
        ),
        "{}",
        stderr(&output)
    );
}

#[test]
fn decoders_of_undeclared_versions_and_types_are_errors() {
    let producer = contract(&[PRODUCER_V1]);
    let consumer = crate_with(
        "consumer",
        r#"
        #[derive(DomainEvent, Deserialize)]
        #[domain_event(name = "OrderCancelled", aggregate = "Order", version = 3)]
        pub struct Cancelled {
            pub order_id: i64,
        }

        #[derive(DomainEvent, Deserialize)]
        #[domain_event(name = "OrderShiped", aggregate = "Order", version = 1)]
        pub struct Shipped {
            pub order_id: i64,
        }
    "#,
    );
    let output = check(consumer.path(), producer.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let errors = stderr(&output);
    for expected in [
        "`OrderCancelled` version 1 has no decoder",
        "the decoder of `OrderCancelled` version 3 reads a version the contract does not declare",
        "the decoder of `OrderShiped` version 1 reads an event type the contract does not declare",
    ] {
        assert!(
            errors.contains(expected),
            "missing {expected:?} in:\n{errors}"
        );
    }
}

#[test]
fn a_decoder_of_another_aggregate_is_an_error() {
    let producer = contract(&[PRODUCER_V1]);
    let consumer = crate_with(
        "consumer",
        r#"
        #[derive(DomainEvent, Deserialize)]
        #[domain_event(name = "OrderCancelled", aggregate = "Cart", version = 1)]
        pub struct Cancelled {
            pub order_id: i64,
        }
    "#,
    );
    let output = check(consumer.path(), producer.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains(
            "`OrderCancelled` version 1: the contract's aggregate is `Order`, the decoder's `Cart`"
        ),
        "{}",
        stderr(&output)
    );
}

#[test]
fn a_missing_contract_or_no_decoder_is_one_line() {
    let consumer = crate_with("consumer", "pub struct NotAnEvent;");
    let missing = consumer.path().join("producer.lock");
    let output = cargo_outbox(
        consumer.path(),
        &["check", "--contract", missing.to_str().unwrap()],
    );
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(stderr(&output).lines().count(), 1, "{}", stderr(&output));
    assert!(
        stderr(&output).starts_with("error: no contract at "),
        "{}",
        stderr(&output)
    );

    let producer = contract(&[PRODUCER_V1]);
    let output = check(consumer.path(), producer.path());
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("no #[derive(DomainEvent)] decoder in src of"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn the_example_consumer_reads_the_example_service_contract() {
    let output = cargo_outbox(
        &workspace().join("examples/order-consumer/src"),
        &["check", "--contract", "../../order-service/outbox.lock"],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output).contains("3 decoder(s) read all 3 version(s) of 3 event type(s)"),
        "{}",
        stdout(&output)
    );
}
