//! The byte bound of a batch: a backlog of large payloads must not make the
//! relay's memory grow with the batch size (500 rows of 1 MB would be
//! 500 MB read, copied into messages and queued at the broker's client).
//!
//! Two steps around each claim, neither in the databases' own claims:
//!
//! - before it, the claim's row limit is lowered to what the bound holds at
//!   the size of the largest row claimed lately ([`ByteBound::limit`]), so
//!   the claim reads about the bound from the database. Until a claim has
//!   shown the rows' size, a row is taken to be 1 MiB, librdkafka's default
//!   largest message: a relay starting on a backlog claims a few rows
//!   first. The estimate follows the rows claimed; after large rows it
//!   halves claim by claim, so the limit grows back within a few claims;
//! - after it, the rows past the bound are cut off the end of the batch
//!   ([`ByteBound::cut`]): a claim whose rows grew larger than the estimate
//!   sends only what the bound holds.
//!
//! Cutting the end of a claim keeps per-aggregate order. A claim lists each
//! aggregate's rows in that aggregate's order, so every prefix of it holds
//! a prefix of each aggregate's run: the rows cut are later than every row
//! of their aggregate that is sent, and none is left between two sent rows.
//! The cut rows are never marked, so they stay pending; they are the
//! earliest pending rows of their aggregates once the claim is settled, and
//! the next claim takes them first. Until that settle, the claim's
//! transaction still holds them (PostgreSQL, MariaDB/MySQL): a claim ahead
//! would wait for them, and must not send later rows of their aggregates,
//! so after a cut the relay claims only once the batch is settled.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::record::OutboxRecord;

/// The default of [`super::RelayOptions::max_batch_bytes`]: 2 MiB, far
/// above a batch of 500 typical events (about 200 KiB), and low enough
/// that a relay draining payloads of a megabyte peaks at about 32 MB
/// (BENCHMARKS.md): the batch is held as rows, as messages and in the
/// producer's queue while the next one is claimed.
pub const DEFAULT_MAX_BATCH_BYTES: usize = 2 << 20;

/// The size a row is taken to have before any claim showed one: 1 MiB,
/// librdkafka's default `message.max.bytes`.
const FIRST_ROW_ESTIMATE: usize = 1 << 20;

/// How the byte bound shortened a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortened {
    /// Fewer rows than the batch size were asked for, as many as the bound
    /// holds, and that many came: more rows may be pending.
    Limited,
    /// Rows past the bound were cut off the end of the claim; they stay
    /// pending, held by the claim until it is settled.
    Cut,
}

/// The byte bound of the relay's batches, with what it learned of the
/// rows' size.
#[derive(Debug)]
pub(crate) struct ByteBound {
    max_bytes: usize,
    /// The size of the largest row claimed lately, in bytes; 0 before the
    /// first rows.
    row_estimate: AtomicUsize,
}

impl ByteBound {
    /// A bound of `max_bytes` a batch (at least one row is always sent).
    pub(crate) fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes: max_bytes.max(1),
            row_estimate: AtomicUsize::new(0),
        }
    }

    /// The rows to claim, at most `batch_size`: as many rows of the
    /// estimated size as the bound holds, at least one.
    pub(crate) fn limit(&self, batch_size: usize) -> usize {
        let estimate = match self.row_estimate.load(Ordering::Relaxed) {
            0 => FIRST_ROW_ESTIMATE,
            learned => learned,
        };
        (self.max_bytes / estimate).clamp(1, batch_size.max(1))
    }

    /// Learns the rows' size from `records`, a claim made with `limit`
    /// rows out of `batch_size`, and says how many of them to send: the
    /// longest prefix within the bound (at least one row), and how the
    /// bound shortened the claim, if it did.
    pub(crate) fn cut(
        &self,
        records: &[OutboxRecord],
        limit: usize,
        batch_size: usize,
    ) -> (usize, Option<Shortened>) {
        let Some(largest) = records.iter().map(OutboxRecord::memory_bytes).max() else {
            return (0, None);
        };
        // Larger rows count at once, smaller ones by halves: a claim of
        // small rows among large ones does not open the next claim wide.
        let previous = self.row_estimate.load(Ordering::Relaxed);
        self.row_estimate
            .store(largest.max(previous / 2).max(1), Ordering::Relaxed);
        let mut total = 0usize;
        let kept = records
            .iter()
            .take_while(|record| {
                total = total.saturating_add(record.memory_bytes());
                total <= self.max_bytes
            })
            .count()
            .max(1);
        if kept < records.len() {
            (kept, Some(Shortened::Cut))
        } else if limit < batch_size && records.len() == limit {
            (kept, Some(Shortened::Limited))
        } else {
            (kept, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: usize = 1 << 10;

    /// A row whose memory is about `bytes`, of aggregate `aggregate`.
    fn row(aggregate: &str, seq: i64, bytes: usize) -> OutboxRecord {
        let mut record = OutboxRecord {
            id: format!("id-{seq}"),
            aggregate_type: "Order".into(),
            aggregate_id: aggregate.into(),
            event_type: "OrderPlaced".into(),
            payload: None,
            event_version: 1,
            aggregate_seq: None,
            traceparent: None,
            seq,
            attempts: 0,
            age_at_claim: 0.0,
            created_at: None,
            partition: None,
            ctid: None,
            extra: Vec::new(),
        };
        let overhead = record.memory_bytes();
        record.payload = Some("x".repeat(bytes.saturating_sub(overhead)));
        record
    }

    #[test]
    fn a_fresh_relay_claims_a_few_rows_then_as_many_as_the_bound_holds() {
        let bound = ByteBound::new(4 << 20);
        assert_eq!(bound.limit(500), 4, "rows taken to be 1 MiB at first");
        let small: Vec<_> = (0..4).map(|seq| row("a", seq, 300)).collect();
        assert_eq!(bound.cut(&small, 4, 500), (4, Some(Shortened::Limited)));
        assert_eq!(bound.limit(500), 500, "small rows: the batch size rules");
        let some: Vec<_> = (0..7).map(|seq| row("a", seq, 300)).collect();
        assert_eq!(
            bound.cut(&some, 500, 500),
            (7, None),
            "a claim of fewer rows than asked was not shortened"
        );
    }

    #[test]
    fn large_rows_lower_the_limit_and_it_grows_back_as_they_shrink() {
        let bound = ByteBound::new(4 << 20);
        let large: Vec<_> = (0..4).map(|seq| row("a", seq, 1 << 20)).collect();
        assert_eq!(bound.cut(&large, 4, 500), (4, Some(Shortened::Limited)));
        assert_eq!(bound.limit(500), 4);
        let mut limits = Vec::new();
        for _ in 0..4 {
            let limit = bound.limit(500);
            let rows: Vec<_> = (0..limit as i64).map(|seq| row("a", seq, KIB)).collect();
            bound.cut(&rows, limit, 500);
            limits.push(bound.limit(500));
        }
        assert_eq!(
            limits,
            [8, 16, 32, 64],
            "the estimate halves claim by claim"
        );
    }

    #[test]
    fn rows_past_the_bound_are_cut_off_the_end_leaving_a_prefix_of_each_aggregate() {
        let bound = ByteBound::new(3 << 20);
        // Claim order: a's run, then b's; the cut falls inside b's run.
        let claim = vec![
            row("a", 1, 1 << 20),
            row("a", 2, 512 * KIB),
            row("b", 3, 1 << 20),
            row("b", 4, 1 << 20),
            row("a", 5, KIB),
        ];
        let (kept, shortened) = bound.cut(&claim, 500, 500);
        assert_eq!((kept, shortened), (3, Some(Shortened::Cut)));
        // Everything after the cut stays pending: for each aggregate, the
        // sent rows come before every cut one.
        for sent in &claim[..kept] {
            for cut in &claim[kept..] {
                if sent.aggregate_id == cut.aggregate_id {
                    assert!(sent.seq < cut.seq);
                }
            }
        }
    }

    #[test]
    fn one_row_larger_than_the_bound_still_goes_alone() {
        let bound = ByteBound::new(KIB);
        let claim = vec![row("a", 1, 1 << 20), row("a", 2, 10)];
        assert_eq!(bound.cut(&claim, 2, 500), (1, Some(Shortened::Cut)));
        assert_eq!(bound.limit(500), 1);
        assert_eq!(bound.cut(&[], 1, 500), (0, None));
    }
}
