//! Writing numbered events and checking the stream a consumer read back.

use std::collections::{BTreeMap, HashSet};

use outbox_core::{AppendedEvent, OutboxEvent};
use sea_orm::{DatabaseConnection, TransactionTrait};

use crate::events::InvoiceIssuedV2;
use crate::kafka::Consumed;

/// Appends `count` events to aggregate `Invoice`/`aggregate_id` in one
/// transaction; the payload's `amountCents` is the event's position.
pub async fn append_events(
    db: &DatabaseConnection,
    aggregate_id: &str,
    count: usize,
) -> Vec<AppendedEvent> {
    let txn = db.begin().await.expect("begin");
    let events = (0..count).map(|n| {
        OutboxEvent::new(InvoiceIssuedV2 {
            amount_cents: n as i64,
            note: None,
        })
        .aggregate_id(aggregate_id)
    });
    let appended = outbox_core::append(&txn, events).await.expect("append");
    txn.commit().await.expect("commit");
    appended
}

/// Writes `per_aggregate` events to each of `aggregates` aggregates
/// (`agg-0`, `agg-1`, ...), interleaved: rounds of `chunk` events per
/// aggregate per transaction. Returns every event id.
pub async fn seed(
    db: &DatabaseConnection,
    aggregates: usize,
    per_aggregate: usize,
    chunk: usize,
) -> Vec<String> {
    let mut ids = Vec::with_capacity(aggregates * per_aggregate);
    let mut written = 0;
    while written < per_aggregate {
        let count = chunk.min(per_aggregate - written);
        for aggregate in 0..aggregates {
            let appended = append_events(db, &format!("agg-{aggregate}"), count).await;
            ids.extend(appended.iter().map(|event| event.id.to_string()));
        }
        written += count;
    }
    ids
}

/// What a consumed stream holds.
#[derive(Debug, Default)]
pub struct StreamReport {
    /// Distinct event ids received.
    pub distinct: usize,
    /// Messages received more than once.
    pub duplicates: usize,
}

/// Checks that every id in `expected_ids` arrived and that, per key, the
/// first arrival of each `aggregateSequence` is in increasing order (a
/// redelivery may repeat earlier numbers; nothing may overtake). Reads
/// Debezium's shape and CloudEvents alike.
pub fn check_stream(messages: &[Consumed], expected_ids: &[String]) -> StreamReport {
    let mut seen_ids = HashSet::new();
    let mut duplicates = 0;
    let mut first_arrivals: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut seen_sequences: HashSet<(String, i64)> = HashSet::new();
    for message in messages {
        let id = message.event_id().expect("an event id");
        if !seen_ids.insert(id) {
            duplicates += 1;
        }
        let key = message.key.clone().expect("a key");
        let sequence = message
            .aggregate_sequence()
            .expect("an aggregate sequence number");
        if seen_sequences.insert((key.clone(), sequence)) {
            first_arrivals.entry(key).or_default().push(sequence);
        }
    }
    let missing: Vec<&String> = expected_ids
        .iter()
        .filter(|id| !seen_ids.contains(*id))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} events never arrived, e.g. {:?}",
        missing.len(),
        expected_ids.len(),
        &missing[..missing.len().min(5)]
    );
    for (key, sequences) in &first_arrivals {
        let mut sorted = sequences.clone();
        sorted.sort_unstable();
        assert_eq!(
            sequences, &sorted,
            "events of aggregate {key} arrived out of order"
        );
        let expected: Vec<i64> = (1..=sequences.len() as i64).collect();
        assert_eq!(sorted, expected, "aggregate {key} has a gap");
    }
    StreamReport {
        distinct: seen_ids.len(),
        duplicates,
    }
}

/// Per key (aggregate id), the event ids (`id` header) in the order they
/// first arrived; a redelivery adds nothing.
pub fn first_arrivals(messages: &[Consumed]) -> BTreeMap<String, Vec<String>> {
    let mut seen = HashSet::new();
    let mut order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for message in messages {
        let id = message.header("id").expect("id header").to_owned();
        if seen.insert(id.clone()) {
            let key = message.key.clone().expect("a key");
            order.entry(key).or_default().push(id);
        }
    }
    order
}

/// Per aggregate id, the event ids in the order written, from (aggregate
/// id, event id) pairs such as [`crate::TestDb::insert_plain_rows`] returns.
pub fn written_order(written: &[(String, String)]) -> BTreeMap<String, Vec<String>> {
    let mut order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (aggregate, id) in written {
        order.entry(aggregate.clone()).or_default().push(id.clone());
    }
    order
}

/// Checks the JSON lines of a relay's stdout sink against the events
/// written: every id in `written` was printed, and per key (aggregate id)
/// the first arrivals of the numbered events (`aggregateSequence`) are 1,
/// 2, 3, ... with nothing overtaking and no gap (a redelivery may repeat
/// an earlier event). Returns how many distinct events were printed.
pub fn check_printed(lines: &[String], written: &[String]) -> usize {
    let mut ids = HashSet::new();
    let mut sequences: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for line in lines {
        let message: serde_json::Value =
            serde_json::from_str(line).expect("a JSON message per line");
        let id = message["headers"]["id"].as_str().expect("id header");
        if !ids.insert(id.to_owned()) {
            continue;
        }
        if let Some(sequence) = message["headers"]["aggregateSequence"].as_str() {
            let key = message["key"].as_str().expect("a key").to_owned();
            sequences
                .entry(key)
                .or_default()
                .push(sequence.parse().expect("a numeric aggregateSequence"));
        }
    }
    let missing: Vec<&String> = written.iter().filter(|id| !ids.contains(*id)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} written events never published, e.g. {:?}",
        missing.len(),
        written.len(),
        &missing[..missing.len().min(3)]
    );
    for (aggregate, numbers) in &sequences {
        let expected: Vec<i64> = (1..=numbers.len() as i64).collect();
        assert_eq!(
            numbers, &expected,
            "aggregate {aggregate}: out of order or a gap"
        );
    }
    ids.len()
}
