//! An independent witness of per-aggregate order: what the writers
//! committed (recorded by the writers themselves after `commit`), what a
//! consumer of its own read back from the broker (with partition and
//! offset), and the check between the two. Neither side reads the outbox
//! table, so a relay that claims in the wrong order cannot hide it by
//! agreeing with itself.
//!
//! The rule [`check`] applies, per aggregate (= Kafka key):
//! - every message is one a writer committed: its `id` header names a
//!   committed event, its key is that event's aggregate, its
//!   `aggregateSequence` header the `aggregate_seq` the append returned,
//!   its payload the committed one;
//! - all of an aggregate's messages are in one partition;
//! - in offset order, the first deliveries of its events have the
//!   sequences 1, 2, ..., n exactly, n being the number of its committed
//!   events: strictly increasing, no gap, nothing missing, so no event
//!   arrives before the first delivery of an earlier one;
//! - a repeated event id (at-least-once: a relay that crashed between the
//!   broker's ack and its mark re-sends) is an exact re-send: same key,
//!   headers and payload bytes as its first delivery. Re-sends are counted
//!   in the [`Verdict`], not refused.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// The header with the event id.
pub const HEADER_ID: &str = "id";
/// The header with the per-aggregate sequence number.
pub const HEADER_SEQUENCE: &str = "aggregateSequence";

/// One event a writer committed, as the writer saw it after `commit`.
#[derive(Debug, Clone, PartialEq)]
pub struct Committed {
    /// The writer (task) that committed it.
    pub writer: usize,
    /// The aggregate id (the Kafka key).
    pub aggregate_id: String,
    /// The `aggregate_seq` the append returned.
    pub sequence: i64,
    /// The event id, hyphenated.
    pub id: String,
    /// The payload the writer appended.
    pub payload: serde_json::Value,
}

/// One message as the witness's consumer read it.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivered {
    /// Partition.
    pub partition: i32,
    /// Offset within the partition.
    pub offset: i64,
    /// The key as text.
    pub key: Option<String>,
    /// Headers as text.
    pub headers: BTreeMap<String, String>,
    /// The value's bytes.
    pub payload: Option<Vec<u8>>,
}

impl Delivered {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    fn at(&self) -> String {
        format!("partition {} offset {}", self.partition, self.offset)
    }
}

/// Reads one topic from the beginning on a thread of its own, from before
/// the writers start until [`TopicReader::stop`].
pub struct TopicReader {
    topic: String,
    stop: Arc<AtomicBool>,
    delivered: Arc<Mutex<Vec<Delivered>>>,
    errors: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TopicReader {
    /// Starts reading partitions `0..partitions` of `topic` (which must
    /// exist) from their beginning.
    pub fn start(brokers: &str, topic: &str, partitions: i32) -> Self {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set(
                "group.id",
                format!("witness-{}", uuid::Uuid::now_v7().simple()),
            )
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .create()
            .expect("witness consumer");
        let mut assignment = TopicPartitionList::new();
        for partition in 0..partitions {
            assignment
                .add_partition_offset(topic, partition, Offset::Beginning)
                .expect("assignment");
        }
        consumer.assign(&assignment).expect("assign");
        let stop = Arc::new(AtomicBool::new(false));
        let delivered = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, delivered, errors) = (stop.clone(), delivered.clone(), errors.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match consumer.poll(Duration::from_millis(50)) {
                        Some(Ok(message)) => {
                            let headers = message
                                .headers()
                                .map(|headers| {
                                    headers
                                        .iter()
                                        .map(|h| {
                                            (
                                                h.key.to_owned(),
                                                String::from_utf8_lossy(
                                                    h.value.unwrap_or_default(),
                                                )
                                                .into_owned(),
                                            )
                                        })
                                        .collect()
                                })
                                .unwrap_or_default();
                            delivered.lock().unwrap().push(Delivered {
                                partition: message.partition(),
                                offset: message.offset(),
                                key: message
                                    .key()
                                    .map(|k| String::from_utf8_lossy(k).into_owned()),
                                headers,
                                payload: message.payload().map(<[u8]>::to_vec),
                            });
                        }
                        Some(Err(error)) => errors.lock().unwrap().push(error.to_string()),
                        None => {}
                    }
                }
            })
        };
        Self {
            topic: topic.to_owned(),
            stop,
            delivered,
            errors,
            thread: Some(thread),
        }
    }

    /// The number of messages read so far.
    pub fn len(&self) -> usize {
        self.delivered.lock().unwrap().len()
    }

    /// Whether nothing was read yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until every id in `ids` was read at least once, or `timeout`
    /// passed; returns whether all arrived.
    pub async fn wait_for(&self, ids: &HashSet<String>, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let seen: HashSet<String> = self
                .delivered
                .lock()
                .unwrap()
                .iter()
                .filter_map(|message| message.header(HEADER_ID).map(str::to_owned))
                .collect();
            if ids.iter().all(|id| seen.contains(id)) {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Reads for `settle` longer (to catch late extras), stops, and returns
    /// every message in partition/offset order.
    pub async fn stop(mut self, settle: Duration) -> Vec<Delivered> {
        tokio::time::sleep(settle).await;
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("witness consumer thread");
        }
        let errors = self.errors.lock().unwrap();
        if !errors.is_empty() {
            eprintln!(
                "witness consumer of {}: {} errors, e.g. {:?}",
                self.topic,
                errors.len(),
                &errors[..errors.len().min(3)]
            );
        }
        let mut delivered = std::mem::take(&mut *self.delivered.lock().unwrap());
        delivered.sort_by_key(|message| (message.partition, message.offset));
        delivered
    }
}

impl Drop for TopicReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// What a stream that passed [`check`] held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Aggregates written.
    pub aggregates: usize,
    /// Events committed (each delivered at least once).
    pub events: usize,
    /// Messages read.
    pub messages: usize,
    /// Messages that repeated an event already delivered.
    pub duplicates: usize,
}

/// At most this many problems are listed in a failure message.
const PROBLEMS_SHOWN: usize = 25;
/// At most this many parts of an aggregate's broker order are listed.
const RANGES_SHOWN: usize = 60;

/// Compares the broker's stream with what the writers committed (the rule
/// is in the module's documentation). The error lists what broke: the
/// aggregate, the sequence expected and seen, the aggregate's order on the
/// broker, missing and unexpected event ids.
pub fn check(committed: &[Committed], delivered: &[Delivered]) -> Result<Verdict, String> {
    let mut problems: Vec<String> = Vec::new();

    // The writers' own record: each aggregate numbered 1..n by the appends.
    let mut by_id: HashMap<&str, &Committed> = HashMap::new();
    let mut committed_by_aggregate: BTreeMap<&str, BTreeMap<i64, &Committed>> = BTreeMap::new();
    for event in committed {
        if by_id.insert(event.id.as_str(), event).is_some() {
            problems.push(format!("writers committed event id {} twice", event.id));
        }
        if let Some(other) = committed_by_aggregate
            .entry(event.aggregate_id.as_str())
            .or_default()
            .insert(event.sequence, event)
        {
            problems.push(format!(
                "append gave aggregate {} sequence {} twice: events {} (writer {}) and {} (writer {})",
                event.aggregate_id, event.sequence, other.id, other.writer, event.id, event.writer
            ));
        }
    }
    for (aggregate, sequences) in &committed_by_aggregate {
        let numbers: Vec<i64> = sequences.keys().copied().collect();
        let expected: Vec<i64> = (1..=numbers.len() as i64).collect();
        if numbers != expected {
            problems.push(format!(
                "append numbered aggregate {aggregate} {} (committed by the writers), not 1..{}",
                ranges(&numbers),
                numbers.len()
            ));
        }
    }

    // Each message against the committed event it names.
    let mut first_delivery: HashMap<&str, &Delivered> = HashMap::new();
    let mut duplicates = 0;
    let mut unexpected: Vec<String> = Vec::new();
    // Per aggregate (key): (sequence, first delivery?) in offset order.
    let mut broker_order: BTreeMap<&str, Vec<(i64, bool, &Delivered)>> = BTreeMap::new();
    let mut partitions: BTreeMap<&str, BTreeSet<i32>> = BTreeMap::new();
    for message in delivered {
        let (Some(id), Some(key)) = (message.header(HEADER_ID), message.key.as_deref()) else {
            problems.push(format!(
                "message at {} has no id header or no key: key {:?}, headers {:?}",
                message.at(),
                message.key,
                message.headers
            ));
            continue;
        };
        let sequence = message
            .header(HEADER_SEQUENCE)
            .and_then(|value| value.parse::<i64>().ok());
        let Some(event) = by_id.get(id) else {
            unexpected.push(format!(
                "{id} (key {key}, aggregateSequence {:?}, at {})",
                message.header(HEADER_SEQUENCE),
                message.at()
            ));
            continue;
        };
        if key != event.aggregate_id || sequence != Some(event.sequence) {
            problems.push(format!(
                "event {id} was committed to aggregate {} with sequence {} by writer {} but arrived \
                 at {} with key {key} and aggregateSequence {:?}",
                event.aggregate_id,
                event.sequence,
                event.writer,
                message.at(),
                message.header(HEADER_SEQUENCE)
            ));
            continue;
        }
        partitions
            .entry(event.aggregate_id.as_str())
            .or_default()
            .insert(message.partition);
        match first_delivery.get(id) {
            None => {
                let payload: Option<serde_json::Value> = message
                    .payload
                    .as_deref()
                    .and_then(|bytes| serde_json::from_slice(bytes).ok());
                if payload.as_ref() != Some(&event.payload) {
                    problems.push(format!(
                        "event {id} (aggregate {key}, sequence {}) arrived at {} with payload {:?}, \
                         committed {}",
                        event.sequence,
                        message.at(),
                        message
                            .payload
                            .as_deref()
                            .map(String::from_utf8_lossy)
                            .unwrap_or_default(),
                        event.payload
                    ));
                }
                first_delivery.insert(id, message);
                broker_order
                    .entry(event.aggregate_id.as_str())
                    .or_default()
                    .push((event.sequence, true, message));
            }
            Some(first) => {
                duplicates += 1;
                if first.key != message.key
                    || first.headers != message.headers
                    || first.payload != message.payload
                {
                    problems.push(format!(
                        "event {id} (aggregate {key}, sequence {}) re-sent at {} differs from its \
                         first delivery at {}: headers {:?} vs {:?}, payload {:?} vs {:?}",
                        event.sequence,
                        message.at(),
                        first.at(),
                        message.headers,
                        first.headers,
                        message.payload.as_deref().map(String::from_utf8_lossy),
                        first.payload.as_deref().map(String::from_utf8_lossy),
                    ));
                }
                broker_order
                    .entry(event.aggregate_id.as_str())
                    .or_default()
                    .push((event.sequence, false, message));
            }
        }
    }
    if !unexpected.is_empty() {
        problems.push(format!(
            "{} messages carry event ids no writer committed: {}",
            unexpected.len(),
            unexpected[..unexpected.len().min(10)].join("; ")
        ));
    }
    for (aggregate, used) in &partitions {
        if used.len() > 1 {
            problems.push(format!(
                "aggregate {aggregate} was published to several partitions {used:?}"
            ));
        }
    }

    // Per aggregate: first deliveries exactly 1..n in offset order.
    for (aggregate, sequences) in &committed_by_aggregate {
        let order = broker_order.remove(aggregate).unwrap_or_default();
        let firsts: Vec<(i64, &Delivered)> = order
            .iter()
            .filter(|(_, first, _)| *first)
            .map(|(sequence, _, message)| (*sequence, *message))
            .collect();
        let all: Vec<i64> = order.iter().map(|(sequence, _, _)| *sequence).collect();
        let n = sequences.len() as i64;
        let broken = firsts
            .iter()
            .enumerate()
            .find(|(position, (sequence, _))| *sequence != *position as i64 + 1);
        if let Some((position, (sequence, message))) = broken {
            let expected = position as i64 + 1;
            let what = if firsts.iter().any(|(s, _)| *s == expected) {
                format!(
                    "out of order: {sequence} arrived (at {}) before {expected}",
                    message.at()
                )
            } else {
                format!(
                    "gap: {sequence} arrived (at {}) but {expected} never did",
                    message.at()
                )
            };
            problems.push(format!(
                "aggregate {aggregate}: {what}; first deliveries on the broker: {}; \
                 all deliveries: {}",
                around(
                    &firsts.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
                    position
                ),
                capped(&ranges(&all))
            ));
        }
        let delivered_sequences: BTreeSet<i64> = firsts.iter().map(|(s, _)| *s).collect();
        let missing: Vec<String> = sequences
            .values()
            .filter(|event| !delivered_sequences.contains(&event.sequence))
            .map(|event| {
                format!(
                    "{} (sequence {}, writer {})",
                    event.id, event.sequence, event.writer
                )
            })
            .collect();
        if !missing.is_empty() {
            problems.push(format!(
                "aggregate {aggregate}: {} of {n} committed events never arrived: {}",
                missing.len(),
                missing[..missing.len().min(10)].join(", ")
            ));
        }
    }
    for aggregate in broker_order.keys() {
        problems.push(format!(
            "aggregate {aggregate} arrived on the broker but no writer committed to it"
        ));
    }

    if problems.is_empty() {
        Ok(Verdict {
            aggregates: committed_by_aggregate.len(),
            events: committed.len(),
            messages: delivered.len(),
            duplicates,
        })
    } else {
        let count = problems.len();
        let mut report = format!(
            "the broker's stream breaks per-aggregate order or delivery ({count} problems; \
             {} events committed, {} messages read):\n  ",
            committed.len(),
            delivered.len()
        );
        report.push_str(&problems[..count.min(PROBLEMS_SHOWN)].join("\n  "));
        if count > PROBLEMS_SHOWN {
            report.push_str(&format!("\n  ... and {} more", count - PROBLEMS_SHOWN));
        }
        Err(report)
    }
}

/// `[1, 2, 3, 5, 4, 6, 7]` as `1-3, 5, 4, 6-7`: runs of consecutive
/// increasing numbers as ranges.
pub fn ranges(numbers: &[i64]) -> String {
    let mut parts = Vec::new();
    let mut index = 0;
    while index < numbers.len() {
        let start = numbers[index];
        let mut end = index;
        while end + 1 < numbers.len() && numbers[end + 1] == numbers[end] + 1 {
            end += 1;
        }
        if end == index {
            parts.push(start.to_string());
        } else {
            parts.push(format!("{start}-{}", numbers[end]));
        }
        index = end + 1;
    }
    if parts.is_empty() {
        "nothing".into()
    } else {
        parts.join(", ")
    }
}

/// At most [`RANGES_SHOWN`] parts of a [`ranges`] list.
fn capped(ranges: &str) -> String {
    let parts: Vec<&str> = ranges.split(", ").collect();
    if parts.len() <= RANGES_SHOWN {
        ranges.to_owned()
    } else {
        format!(
            "{}, ... ({} more)",
            parts[..RANGES_SHOWN].join(", "),
            parts.len() - RANGES_SHOWN
        )
    }
}

/// The numbers from a few before `position` to a few after, listed one by
/// one, e.g. `... 12, 13, 16, 14, 15, 17 ...`.
fn around(numbers: &[i64], position: usize) -> String {
    let start = position.saturating_sub(3);
    let end = (position + 6).min(numbers.len());
    let shown: Vec<String> = numbers[start..end].iter().map(i64::to_string).collect();
    format!(
        "{}{}{}",
        if start > 0 { "... " } else { "" },
        shown.join(", "),
        if end < numbers.len() { " ..." } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed(aggregate: &str, n: i64) -> Vec<Committed> {
        (1..=n)
            .map(|sequence| Committed {
                writer: sequence as usize % 3,
                aggregate_id: aggregate.into(),
                sequence,
                id: format!("{aggregate}-{sequence}"),
                payload: serde_json::json!({ "n": sequence }),
            })
            .collect()
    }

    fn message(event: &Committed, offset: i64) -> Delivered {
        Delivered {
            partition: 0,
            offset,
            key: Some(event.aggregate_id.clone()),
            headers: [
                (HEADER_ID.to_owned(), event.id.clone()),
                (HEADER_SEQUENCE.to_owned(), event.sequence.to_string()),
            ]
            .into(),
            payload: Some(event.payload.to_string().into_bytes()),
        }
    }

    /// The broker order of `events` by their positions (1-based sequence).
    fn stream(events: &[Committed], order: &[i64]) -> Vec<Delivered> {
        order
            .iter()
            .enumerate()
            .map(|(offset, sequence)| message(&events[*sequence as usize - 1], offset as i64))
            .collect()
    }

    #[test]
    fn an_ordered_stream_passes() {
        let events = committed("a", 5);
        let verdict = check(&events, &stream(&events, &[1, 2, 3, 4, 5])).unwrap();
        assert_eq!(verdict.events, 5);
        assert_eq!(verdict.duplicates, 0);
    }

    #[test]
    fn the_reorder_of_the_issue_is_caught_and_described() {
        let events = committed("agg-1", 17);
        let order: Vec<i64> = (1..=13).chain([16, 14, 15, 17]).collect();
        let error = check(&events, &stream(&events, &order)).unwrap_err();
        assert!(
            error.contains("aggregate agg-1: out of order: 16 arrived"),
            "{error}"
        );
        assert!(error.contains("before 14"), "{error}");
        assert!(error.contains("12, 13, 16, 14, 15, 17"), "{error}");
        assert!(error.contains("1-13, 16, 14-15, 17"), "{error}");
    }

    #[test]
    fn a_resent_suffix_after_a_crash_passes() {
        let events = committed("a", 6);
        let verdict = check(&events, &stream(&events, &[1, 2, 3, 4, 3, 4, 5, 6])).unwrap();
        assert_eq!(verdict.duplicates, 2);
    }

    #[test]
    fn a_duplicate_that_overtakes_a_first_delivery_is_caught() {
        let events = committed("a", 4);
        let error = check(&events, &stream(&events, &[1, 2, 4, 3, 4])).unwrap_err();
        assert!(error.contains("4 arrived"), "{error}");
    }

    #[test]
    fn a_gap_and_missing_events_are_caught() {
        let events = committed("a", 5);
        let error = check(&events, &stream(&events, &[1, 2, 4, 5])).unwrap_err();
        assert!(error.contains("gap: 4 arrived"), "{error}");
        assert!(
            error.contains("1 of 5 committed events never arrived: a-3"),
            "{error}"
        );
    }

    #[test]
    fn an_unexpected_event_is_caught() {
        let events = committed("a", 2);
        let mut messages = stream(&events, &[1, 2]);
        let mut phantom = message(&events[1], 2);
        phantom
            .headers
            .insert(HEADER_ID.into(), "rolled-back".into());
        messages.push(phantom);
        let error = check(&events, &messages).unwrap_err();
        assert!(
            error.contains("no writer committed: rolled-back"),
            "{error}"
        );
    }

    #[test]
    fn a_resend_that_is_not_exact_is_caught() {
        let events = committed("a", 2);
        let mut messages = stream(&events, &[1, 2]);
        let mut changed = message(&events[0], 2);
        changed.payload = Some(b"{\"n\":99}".to_vec());
        messages.push(changed);
        let error = check(&events, &messages).unwrap_err();
        assert!(error.contains("differs from its first delivery"), "{error}");
    }

    #[test]
    fn a_wrong_sequence_header_is_caught() {
        let events = committed("a", 2);
        let mut messages = stream(&events, &[1, 2]);
        messages[1]
            .headers
            .insert(HEADER_SEQUENCE.into(), "7".into());
        let error = check(&events, &messages).unwrap_err();
        assert!(error.contains("with sequence 2 by writer"), "{error}");
    }

    #[test]
    fn an_append_that_skips_a_number_is_caught() {
        let mut events = committed("a", 3);
        events[2].sequence = 4;
        let messages: Vec<Delivered> = events
            .iter()
            .enumerate()
            .map(|(offset, event)| message(event, offset as i64))
            .collect();
        let error = check(&events, &messages).unwrap_err();
        assert!(
            error.contains("append numbered aggregate a 1-2, 4"),
            "{error}"
        );
    }

    #[test]
    fn ranges_compress_runs() {
        assert_eq!(ranges(&[1, 2, 3, 5, 4, 6, 7]), "1-3, 5, 4, 6-7");
        assert_eq!(ranges(&[]), "nothing");
    }
}
