//! The relay's Prometheus metrics: their names, descriptions and buckets,
//! and the functions that record them. Recording is a no-op unless
//! `--metrics-addr` installed the exporter. Every metric carries the label
//! [`SINK_LABEL`] naming the sink (`kafka`, `rabbitmq`, `nats`, `stdout`),
//! so that relays publishing to different brokers can share dashboards.
//!
//! The pipeline (sources, the relay loop, CDC) reports here; this module
//! knows only the claimed rows and plain numbers, never the pipeline's own
//! types, so dependencies point one way.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

use crate::record::OutboxRecord;

/// Rows waiting to be published (all shards).
pub const PENDING: &str = "outbox_pending_rows";
/// Age of the oldest pending row.
pub const OLDEST_PENDING_AGE: &str = "outbox_oldest_pending_age_seconds";
/// Rows parked as dead letters.
pub const DEAD_LETTERS: &str = "outbox_dead_letters";
/// Rows published, per aggregate type.
pub const PUBLISHED: &str = "outbox_published_total";
/// Failed publish attempts, per aggregate type.
pub const FAILED: &str = "outbox_failed_total";
/// Rows dead-lettered by this relay, per aggregate type.
pub const DEAD_LETTERED: &str = "outbox_dead_lettered_total";
/// Rows per claimed batch.
pub const BATCH_SIZE: &str = "outbox_batch_size";
/// From the row's insertion to the broker's acknowledgement.
pub const COMMIT_TO_ACK: &str = "outbox_commit_to_ack_seconds";
/// Shards this relay owns.
pub const OWNED_SHARDS: &str = "outbox_owned_shards";
/// 1 when the last database check succeeded.
pub const DATABASE_UP: &str = "outbox_database_up";
/// 1 when the last broker check succeeded.
pub const BROKER_UP: &str = "outbox_broker_up";
/// CDC mode: WAL written since the slot's confirmed position.
pub const CDC_BEHIND: &str = "outbox_cdc_slot_behind_bytes";
/// CDC mode: WAL the server keeps for the slot.
pub const CDC_RETAINED_WAL: &str = "outbox_cdc_slot_retained_wal_bytes";
/// CDC mode: 1 while this relay reads the slot, 0 while it stands by.
pub const CDC_READING: &str = "outbox_cdc_reading";
/// Bytes CDC mode read from the slot and the sink has not acknowledged.
pub const CDC_BYTES_IN_FLIGHT: &str = "outbox_cdc_bytes_in_flight";
/// Rows of each transaction CDC mode read (a histogram).
pub const CDC_TRANSACTION_ROWS: &str = "outbox_cdc_transaction_rows";
/// Rows whose `aggregate_seq` fell as `seq` rose within their aggregate.
pub const ORDER_INVERSIONS: &str = "outbox_order_inversions_total";
/// A partitioned outbox: whole days from today that have partitions.
pub const PARTITION_DAYS_AHEAD: &str = "outbox_partition_days_ahead";
/// A partitioned outbox: rows in the default partition.
pub const PARTITION_DEFAULT_ROWS: &str = "outbox_partition_default_rows";
/// A partitioned outbox: day partitions this relay dropped.
pub const PARTITIONS_DROPPED: &str = "outbox_partitions_dropped_total";

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const BATCH_BUCKETS: &[f64] = &[1.0, 5.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 5000.0];
const TRANSACTION_BUCKETS: &[f64] = &[1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6];

/// The label naming the sink on every metric.
pub const SINK_LABEL: &str = "sink";

/// Installs the Prometheus recorder, labelling every metric with the
/// `sink`, and describes every metric.
pub fn install(sink: &str) -> Result<PrometheusHandle, BuildError> {
    let handle = PrometheusBuilder::new()
        .add_global_label(SINK_LABEL, sink)
        .set_buckets_for_metric(Matcher::Full(COMMIT_TO_ACK.into()), LATENCY_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(BATCH_SIZE.into()), BATCH_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full(CDC_TRANSACTION_ROWS.into()),
            TRANSACTION_BUCKETS,
        )?
        .install_recorder()?;
    describe_gauge!(PENDING, "Rows waiting to be published");
    describe_gauge!(
        OLDEST_PENDING_AGE,
        "Age of the oldest pending row, in seconds"
    );
    describe_gauge!(DEAD_LETTERS, "Rows parked as dead letters");
    describe_counter!(PUBLISHED, "Rows published, by aggregate type");
    describe_counter!(FAILED, "Failed publish attempts, by aggregate type");
    describe_counter!(
        DEAD_LETTERED,
        "Rows dead-lettered by this relay, by aggregate type"
    );
    describe_histogram!(BATCH_SIZE, "Rows per claimed batch");
    describe_histogram!(
        COMMIT_TO_ACK,
        "Seconds from a row's insertion to the broker's acknowledgement"
    );
    describe_gauge!(OWNED_SHARDS, "Shards this relay owns");
    describe_gauge!(DATABASE_UP, "1 when the last database check succeeded");
    describe_gauge!(BROKER_UP, "1 when the last broker check succeeded");
    describe_gauge!(
        CDC_BEHIND,
        "WAL bytes written since the replication slot's confirmed position (CDC mode)"
    );
    describe_gauge!(
        CDC_RETAINED_WAL,
        "WAL bytes the server keeps for the replication slot (CDC mode)"
    );
    describe_gauge!(
        CDC_READING,
        "1 while this relay reads the replication slot, 0 while it stands by (CDC mode)"
    );
    describe_gauge!(
        CDC_BYTES_IN_FLIGHT,
        "Bytes read from the replication slot and not acknowledged by the broker yet (CDC mode)"
    );
    describe_histogram!(
        CDC_TRANSACTION_ROWS,
        "Outbox rows per transaction read from the replication slot (CDC mode)"
    );
    describe_counter!(
        ORDER_INVERSIONS,
        "Claimed rows whose aggregate_seq fell as seq rose within their aggregate \
         (a writer that broke the ordering rule); sent in aggregate_seq order"
    );
    describe_gauge!(
        PARTITION_DAYS_AHEAD,
        "Whole days from today that have day partitions (partitioned outbox)"
    );
    describe_gauge!(
        PARTITION_DEFAULT_ROWS,
        "Rows in the default partition, which no day partition covers (partitioned outbox)"
    );
    describe_counter!(
        PARTITIONS_DROPPED,
        "Day partitions dropped once every row in them was published (partitioned outbox)"
    );
    Ok(handle)
}

/// What a batch's metrics need, taken before the claim is settled.
pub struct BatchObservation {
    size: usize,
    claimed_at: Instant,
    /// The age at claim of each published row.
    published_ages: Vec<f64>,
    /// Rows per aggregate type and counter.
    counts: Vec<((String, &'static str), u64)>,
}

impl BatchObservation {
    /// Notes each row's aggregate type, age and fate: acknowledged if its
    /// id is in `published`, failed if in `failed` (with whether it was
    /// dead-lettered), untouched otherwise. `published` names each of
    /// `records` at most once (as a [`Settlement`](crate::source::Settlement)
    /// does), so as many ids as rows is every row.
    pub fn new<'a>(
        records: &[OutboxRecord],
        published: impl IntoIterator<Item = &'a str>,
        failed: impl IntoIterator<Item = (&'a str, bool)>,
        claimed_at: Instant,
    ) -> Self {
        let published: Vec<&str> = published.into_iter().collect();
        // The usual batch, every row published, needs no set of ids.
        let every_row = published.len() == records.len();
        let published: HashSet<&str> = if every_row {
            HashSet::new()
        } else {
            published.into_iter().collect()
        };
        let failed: HashMap<&str, bool> = failed.into_iter().collect();
        let mut published_ages = Vec::with_capacity(records.len());
        // Counted per aggregate type first: one counter update per type
        // and outcome, not per row.
        let mut counts: HashMap<(&str, &'static str), u64> = HashMap::new();
        for record in records {
            let aggregate_type = record.aggregate_type.as_str();
            if every_row || published.contains(record.id.as_str()) {
                published_ages.push(record.age_at_claim.max(0.0));
                *counts.entry((aggregate_type, PUBLISHED)).or_default() += 1;
            } else if let Some(&dead_letter) = failed.get(record.id.as_str()) {
                if dead_letter {
                    *counts.entry((aggregate_type, DEAD_LETTERED)).or_default() += 1;
                }
                *counts.entry((aggregate_type, FAILED)).or_default() += 1;
            }
        }
        Self {
            size: records.len(),
            claimed_at,
            published_ages,
            counts: counts
                .into_iter()
                .map(|((aggregate_type, name), count)| ((aggregate_type.to_owned(), name), count))
                .collect(),
        }
    }

    /// Records the batch once its settlement committed.
    pub fn record(self) {
        histogram!(BATCH_SIZE).record(self.size as f64);
        let since_claim = self.claimed_at.elapsed().as_secs_f64();
        let commit_to_ack = histogram!(COMMIT_TO_ACK);
        for age in self.published_ages {
            commit_to_ack.record(age + since_claim);
        }
        for ((aggregate_type, name), count) in self.counts {
            counter!(name, "aggregate_type" => aggregate_type).increment(count);
        }
    }
}

/// Records the backlog sampled from the database: pending rows, the age of
/// the oldest one in seconds, and dead letters.
pub fn record_backlog(pending: i64, oldest_pending_age_seconds: Option<f64>, dead_letters: i64) {
    gauge!(PENDING).set(pending as f64);
    gauge!(OLDEST_PENDING_AGE).set(oldest_pending_age_seconds.unwrap_or(0.0));
    gauge!(DEAD_LETTERS).set(dead_letters as f64);
}

/// Records how many shards this relay owns.
pub fn record_owned_shards(count: usize) {
    gauge!(OWNED_SHARDS).set(count as f64);
}

/// Records a partitioned outbox's coverage: whole days from today with
/// partitions, and rows in the default partition.
pub fn record_partitions(days_ahead: i64, default_rows: i64) {
    gauge!(PARTITION_DAYS_AHEAD).set(days_ahead as f64);
    gauge!(PARTITION_DEFAULT_ROWS).set(default_rows as f64);
}

/// Counts claimed rows whose `aggregate_seq` fell as `seq` rose.
pub fn record_order_inversions(count: u64) {
    counter!(ORDER_INVERSIONS).increment(count);
}

/// Records day partitions dropped by maintenance.
pub fn record_partitions_dropped(count: usize) {
    counter!(PARTITIONS_DROPPED).increment(count as u64);
}

/// Records the outcome of the connection checks.
pub fn record_connections(database_up: bool, broker_up: bool) {
    gauge!(DATABASE_UP).set(f64::from(u8::from(database_up)));
    gauge!(BROKER_UP).set(f64::from(u8::from(broker_up)));
}

/// Records the replication slot's position (CDC mode): WAL bytes written
/// since its confirmed position, and WAL bytes the server keeps for it.
pub fn record_slot(behind_bytes: Option<i64>, retained_wal_bytes: Option<i64>) {
    gauge!(CDC_BEHIND).set(behind_bytes.unwrap_or(0) as f64);
    gauge!(CDC_RETAINED_WAL).set(retained_wal_bytes.unwrap_or(0) as f64);
}

/// Records whether this relay reads the replication slot (CDC mode).
pub fn record_cdc_reading(reading: bool) {
    gauge!(CDC_READING).set(f64::from(u8::from(reading)));
}

/// Records the bytes CDC mode holds between the slot and the sink.
pub fn record_cdc_bytes_in_flight(bytes: usize) {
    gauge!(CDC_BYTES_IN_FLIGHT).set(bytes as f64);
}

/// Records the size of a transaction CDC mode read, in rows.
pub fn record_cdc_transaction(rows: usize) {
    histogram!(CDC_TRANSACTION_ROWS).record(rows as f64);
}
