//! A replication session's reading, without I/O: from the server's
//! messages to the positions the slot may confirm.
//!
//! [`Stream`] reads the messages in order: between transactions, a Begin
//! opens one; in a transaction, the outbox table's inserts are collected
//! (Relation messages teach the decoder the table's columns) until the
//! Commit, which makes the transaction ready to send unless it inserted
//! nothing. pgoutput sends a transaction only once it committed, so a large
//! one need not be held whole: every [`PIECE_RECORDS`] records or
//! [`PIECE_BYTES`] bytes, the part read so far is ready to send as a piece
//! that confirms no position; the Commit's position is confirmed once every
//! piece before it was acknowledged and marked. A crash in the middle
//! re-reads the whole transaction from the slot: duplicates, never a loss,
//! and memory stays bounded whatever the transaction's size. Committed
//! transactions and pieces then move through
//!
//! ```text
//! ready --next_batch--> sending --acknowledged--> acknowledged --next_mark--> marking --marked--> confirmed
//! ```
//!
//! with one batch of whole transactions at the sink and one being marked at
//! a time, in order. A position is confirmed to the server only once every
//! transaction before it was acknowledged and marked: positions that arrive
//! meanwhile (keepalives, empty transactions, non-transactional messages)
//! extend the last transaction waiting, or wait until the pipeline is empty.
//! The session (`CdcRelay::stream`) performs the sends, marks and
//! confirmations these methods ask for.

use std::collections::VecDeque;

use pgwire_replication::{Lsn, ReplicationEvent};

use super::CdcError;
use super::pgoutput::{Decoder, OutboxTable};
use crate::record::OutboxRecord;

/// Batches of committed transactions read ahead of the one at the sink.
const BUFFERED_BATCHES: usize = 4;

/// Records of an open transaction kept before they are sent as a piece.
pub(crate) const PIECE_RECORDS: usize = 1_000;

/// Bytes of an open transaction kept before they are sent as a piece.
pub(crate) const PIECE_BYTES: usize = 4 << 20;

/// Bytes read ahead of the sink, at most (plus one record): reading stops
/// at this bound whatever the batch size, so large payloads cannot fill
/// the memory.
pub(crate) const BUFFERED_BYTES: usize = 16 << 20;

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01).
const POSTGRES_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// A committed transaction with inserts into the outbox table, or a piece
/// of one still being read.
#[derive(Debug)]
pub(crate) struct Committed {
    /// The rows it inserted, in order.
    pub(crate) records: Vec<OutboxRecord>,
    /// The transaction's commit time, in microseconds since the Unix epoch.
    pub(crate) commit_time_micros: i64,
    /// Confirmable once the records are acknowledged; zero for a piece
    /// whose transaction goes on (nothing to confirm).
    pub(crate) end_lsn: Lsn,
    /// The records' size in memory, about.
    pub(crate) bytes: usize,
}

impl Committed {
    /// Adds `record` to the transaction.
    fn push(&mut self, record: OutboxRecord) {
        self.bytes += record.memory_bytes();
        self.records.push(record);
    }
}

/// A batch whose every message the sink acknowledged.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Delivered {
    /// The event ids, to mark.
    pub(crate) ids: Vec<String>,
    /// Each one's row creation time as PostgreSQL wrote it (where the
    /// stream read one), so that marking finds the row in its partition of
    /// a partitioned outbox.
    pub(crate) created_at: Vec<Option<String>>,
    /// Confirmable once the rows are marked.
    pub(crate) end_lsn: Lsn,
}

/// Where the reading stands in the server's stream of transactions.
#[derive(Debug)]
enum Transaction {
    /// After a Commit (or before the first Begin): a position that arrives
    /// now has nothing unread before it.
    Between,
    /// After a Begin: collecting the transaction's inserts.
    Open(Committed),
}

/// What a replication session holds between the server's messages and the
/// slot's confirmed position.
#[derive(Debug)]
pub(crate) struct Stream {
    decoder: Decoder,
    batch_size: usize,
    transaction: Transaction,
    /// Committed transactions read, not sent yet.
    ready: VecDeque<Committed>,
    /// Records in `ready`.
    buffered: usize,
    /// Their bytes.
    buffered_bytes: usize,
    /// A batch is at the sink.
    sending: bool,
    /// Its bytes.
    sending_bytes: usize,
    /// Rows the open transaction inserted so far, pieces sent included.
    open_rows: usize,
    /// Rows of the last transaction committed, until asked for.
    committed_rows: Option<usize>,
    /// Batches the sink acknowledged, to mark and confirm one at a time and
    /// in order, while the next batch is already being sent.
    acknowledged: VecDeque<Delivered>,
    /// A batch is being marked.
    marking: bool,
    /// A position past everything read, to confirm once nothing before it
    /// is left unconfirmed.
    idle_position: Option<Lsn>,
}

impl Stream {
    /// A session reading the inserts into the outbox `table`, sending
    /// batches of `batch_size` records (whole transactions) or more.
    pub(crate) fn new(table: OutboxTable, batch_size: usize) -> Self {
        Self {
            decoder: Decoder::new(table),
            batch_size,
            transaction: Transaction::Between,
            ready: VecDeque::new(),
            buffered: 0,
            buffered_bytes: 0,
            sending: false,
            sending_bytes: 0,
            open_rows: 0,
            committed_rows: None,
            acknowledged: VecDeque::new(),
            marking: false,
            idle_position: None,
        }
    }

    /// Whether to read the server's next message. While the sink is slow or
    /// down, reading stops once a few batches wait: the server holds the
    /// rest in its WAL.
    pub(crate) fn reads(&self) -> bool {
        self.buffered < self.batch_size.saturating_mul(BUFFERED_BATCHES)
            && self.buffered_bytes < BUFFERED_BYTES
            && self.acknowledged.len() < BUFFERED_BATCHES
    }

    /// Bytes read and not acknowledged yet, about: the open transaction's
    /// records, the batches waiting and the batch at the sink.
    pub(crate) fn bytes_in_flight(&self) -> usize {
        let open = match &self.transaction {
            Transaction::Open(open) => open.bytes,
            Transaction::Between => 0,
        };
        open + self.buffered_bytes + self.sending_bytes
    }

    /// How many rows the transaction committed last inserted, once.
    pub(crate) fn take_committed_rows(&mut self) -> Option<usize> {
        self.committed_rows.take()
    }

    /// Reads one message of the server; returns a position to confirm now.
    pub(crate) fn received(&mut self, event: ReplicationEvent) -> Result<Option<Lsn>, CdcError> {
        let position = match event {
            ReplicationEvent::Begin {
                commit_time_micros, ..
            } => {
                self.transaction = Transaction::Open(Committed {
                    records: Vec::new(),
                    commit_time_micros: commit_time_micros + POSTGRES_EPOCH_MICROS,
                    end_lsn: Lsn::ZERO,
                    bytes: 0,
                });
                self.open_rows = 0;
                None
            }
            ReplicationEvent::XLogData { data, .. } => {
                if let Some(record) = self.decoder.decode(&data)? {
                    match &mut self.transaction {
                        Transaction::Open(open) => {
                            open.push(record);
                            self.open_rows += 1;
                            if open.records.len() >= PIECE_RECORDS || open.bytes >= PIECE_BYTES {
                                let piece = Committed {
                                    records: std::mem::take(&mut open.records),
                                    commit_time_micros: open.commit_time_micros,
                                    end_lsn: Lsn::ZERO,
                                    bytes: std::mem::take(&mut open.bytes),
                                };
                                self.enqueue(piece);
                            }
                        }
                        Transaction::Between => return Err(CdcError::InsertOutsideTransaction),
                    }
                }
                None
            }
            ReplicationEvent::Commit { end_lsn, .. } => self.commit(end_lsn),
            ReplicationEvent::KeepAlive { wal_end, .. } => Some(wal_end),
            ReplicationEvent::Message {
                lsn,
                transactional: false,
                ..
            } => Some(lsn),
            ReplicationEvent::Message { .. } | ReplicationEvent::StoppedAt { .. } => None,
        };
        Ok(position
            .filter(|lsn| !lsn.is_zero())
            .and_then(|position| self.passed(position)))
    }

    /// The transaction ends at `end_lsn`: ready to send if it inserted
    /// rows, else a position past it.
    fn commit(&mut self, end_lsn: Lsn) -> Option<Lsn> {
        if self.open_rows > 0 {
            self.committed_rows = Some(std::mem::take(&mut self.open_rows));
        }
        match std::mem::replace(&mut self.transaction, Transaction::Between) {
            Transaction::Open(mut committed) if !committed.records.is_empty() => {
                committed.end_lsn = end_lsn;
                self.enqueue(committed);
                None
            }
            // Nothing inserted, or everything already sent in pieces: the
            // position waits for what is in flight (see `passed`).
            _ => Some(end_lsn),
        }
    }

    /// Makes `committed` (a transaction or a piece) ready to send.
    fn enqueue(&mut self, committed: Committed) {
        self.buffered += committed.records.len();
        self.buffered_bytes += committed.bytes;
        self.ready.push_back(committed);
    }

    /// The stream passed `position` with nothing unread before it: it is
    /// confirmed now if nothing before it waits, else with what waits.
    fn passed(&mut self, position: Lsn) -> Option<Lsn> {
        if matches!(self.transaction, Transaction::Open(_)) {
            return None;
        }
        if let Some(last) = self.ready.back_mut() {
            last.end_lsn = last.end_lsn.max(position);
            None
        } else if self.sending || self.marking || !self.acknowledged.is_empty() {
            self.idle_position = Some(self.idle_position.map_or(position, |p| p.max(position)));
            None
        } else {
            // Confirming it lets the server release WAL on a quiet table.
            Some(position)
        }
    }

    /// The next batch to send (whole transactions, at least one, until
    /// they hold the batch size or more), unless one is at the sink.
    pub(crate) fn next_batch(&mut self) -> Option<Vec<Committed>> {
        // Marking that falls behind holds the ids of every batch waiting:
        // sending pauses until it catches up.
        if self.sending || self.ready.is_empty() || self.acknowledged.len() >= BUFFERED_BATCHES {
            return None;
        }
        let batch = take_batch(&mut self.ready, self.batch_size);
        self.buffered -= batch.iter().map(|c| c.records.len()).sum::<usize>();
        self.sending_bytes = batch.iter().map(|c| c.bytes).sum::<usize>();
        self.buffered_bytes -= self.sending_bytes;
        self.sending = true;
        Some(batch)
    }

    /// The sink acknowledged every message of the batch in flight.
    pub(crate) fn acknowledged(&mut self, delivered: Delivered) {
        self.sending = false;
        self.sending_bytes = 0;
        self.acknowledged.push_back(delivered);
    }

    /// The next acknowledged batch to mark, unless one is being marked.
    pub(crate) fn next_mark(&mut self) -> Option<Delivered> {
        if self.marking {
            return None;
        }
        let delivered = self.acknowledged.pop_front()?;
        self.marking = true;
        Some(delivered)
    }

    /// The batch being marked was marked up to `end_lsn`; returns the
    /// positions to confirm, in order.
    pub(crate) fn marked(&mut self, end_lsn: Lsn) -> Vec<Lsn> {
        self.marking = false;
        // A batch of pieces confirms nothing.
        let mut confirm: Vec<Lsn> = Some(end_lsn)
            .filter(|lsn| !lsn.is_zero())
            .into_iter()
            .collect();
        if !self.sending
            && self.ready.is_empty()
            && self.acknowledged.is_empty()
            && let Some(position) = self.idle_position.take()
        {
            confirm.push(position);
        }
        confirm
    }

    /// At shutdown: the acknowledged batches not being marked yet, to mark
    /// and confirm in order. Nothing else is confirmed.
    pub(crate) fn unmarked(&mut self) -> Vec<Delivered> {
        self.acknowledged.drain(..).collect()
    }
}

/// Whole transactions (or pieces) from the front of `ready`, at least one,
/// until they hold `batch_size` records or [`PIECE_BYTES`] bytes or more.
fn take_batch(ready: &mut VecDeque<Committed>, batch_size: usize) -> Vec<Committed> {
    let mut batch = Vec::new();
    let mut records = 0;
    let mut bytes = 0;
    while let Some(committed) = ready.pop_front() {
        records += committed.records.len();
        bytes += committed.bytes;
        batch.push(committed);
        if records >= batch_size || bytes >= PIECE_BYTES {
            break;
        }
    }
    batch
}

/// The position a batch confirms once acknowledged and marked: its last
/// transaction's end (zero when it holds only pieces of an open one).
pub(crate) fn batch_end(batch: &[Committed]) -> Lsn {
    batch
        .iter()
        .map(|committed| committed.end_lsn)
        .max()
        .unwrap_or(Lsn::ZERO)
}

#[cfg(test)]
mod tests {
    use super::super::pgoutput::encode::{OUTBOX_COLUMNS, insert, relation, relation_named};
    use super::*;

    const OUTBOX: u32 = 16_400;

    fn table() -> OutboxTable {
        OutboxTable {
            extra: Vec::new(),
            schema: "public".into(),
            oid: OUTBOX,
        }
    }

    fn committed(records: usize, end: u64) -> Committed {
        let record = OutboxRecord {
            id: String::new(),
            aggregate_type: String::new(),
            aggregate_id: String::new(),
            event_type: String::new(),
            payload: None,
            event_version: 1,
            aggregate_seq: None,
            traceparent: None,
            seq: 0,
            attempts: 0,
            age_at_claim: 0.0,
            created_at: None,
            partition: None,
            ctid: None,
            extra: Vec::new(),
        };
        Committed {
            bytes: records * record.memory_bytes(),
            records: vec![record; records],
            commit_time_micros: 0,
            end_lsn: Lsn::from_u64(end),
        }
    }

    fn lsn(at: u64) -> Lsn {
        Lsn::from_u64(at)
    }

    fn begin() -> ReplicationEvent {
        ReplicationEvent::Begin {
            final_lsn: Lsn::ZERO,
            xid: 1,
            commit_time_micros: 0,
        }
    }

    fn data(message: Vec<u8>) -> ReplicationEvent {
        ReplicationEvent::XLogData {
            wal_start: Lsn::ZERO,
            wal_end: Lsn::ZERO,
            server_time_micros: 0,
            data: message.into(),
        }
    }

    fn outbox_relation() -> ReplicationEvent {
        data(relation(OUTBOX, OUTBOX_COLUMNS))
    }

    fn outbox_insert(id: &str) -> ReplicationEvent {
        data(insert(
            OUTBOX,
            &[
                Some(id),
                Some("Order"),
                Some("42"),
                Some("OrderPlaced"),
                Some("{}"),
                Some("1"),
                Some("1"),
                None,
                None,
                None,
                None,
            ],
        ))
    }

    fn commit(end: u64) -> ReplicationEvent {
        ReplicationEvent::Commit {
            lsn: lsn(end - 1),
            end_lsn: lsn(end),
            commit_time_micros: 0,
        }
    }

    fn keepalive(wal_end: u64) -> ReplicationEvent {
        ReplicationEvent::KeepAlive {
            wal_end: lsn(wal_end),
            reply_requested: false,
            server_time_micros: 0,
        }
    }

    /// Feeds `events`, returning the positions confirmed on the way.
    fn feed(stream: &mut Stream, events: Vec<ReplicationEvent>) -> Vec<u64> {
        events
            .into_iter()
            .filter_map(|event| stream.received(event).expect("a valid message"))
            .map(|lsn| lsn.as_u64())
            .collect()
    }

    /// One transaction inserting `ids`, committed at `end`.
    fn transaction(ids: &[&str], end: u64) -> Vec<ReplicationEvent> {
        let mut events = vec![begin()];
        events.extend(ids.iter().map(|id| outbox_insert(id)));
        events.push(commit(end));
        events
    }

    fn ids(batch: &[Committed]) -> Vec<&str> {
        batch
            .iter()
            .flat_map(|c| c.records.iter().map(|r| r.id.as_str()))
            .collect()
    }

    fn delivered(batch: &[Committed]) -> Delivered {
        Delivered {
            ids: ids(batch).into_iter().map(str::to_owned).collect(),
            created_at: ids(batch).iter().map(|_| None).collect(),
            end_lsn: batch_end(batch),
        }
    }

    #[test]
    fn a_transaction_is_confirmed_only_after_it_is_acknowledged_and_marked() {
        let mut stream = Stream::new(table(), 10);
        let mut events = vec![outbox_relation()];
        events.extend(transaction(&["e1", "e2"], 100));
        assert_eq!(feed(&mut stream, events), Vec::<u64>::new());
        let batch = stream.next_batch().expect("a batch to send");
        assert_eq!(ids(&batch), ["e1", "e2"]);
        assert_eq!(batch[0].end_lsn, lsn(100));
        assert!(stream.next_batch().is_none(), "one batch at the sink");
        // Nothing is confirmed while the batch is at the sink.
        assert_eq!(feed(&mut stream, vec![keepalive(150)]), Vec::<u64>::new());
        assert!(stream.next_mark().is_none());
        stream.acknowledged(delivered(&batch));
        let marking = stream.next_mark().expect("a batch to mark");
        assert_eq!(marking.ids, ["e1", "e2"]);
        // The keepalive's position follows the transaction's.
        assert_eq!(stream.marked(marking.end_lsn), [lsn(100), lsn(150)]);
        assert!(stream.next_mark().is_none());
    }

    #[test]
    fn positions_with_nothing_waiting_are_confirmed_at_once() {
        let mut stream = Stream::new(table(), 10);
        assert_eq!(feed(&mut stream, vec![keepalive(10)]), [10]);
        // A transaction that inserted no outbox row.
        let mut events = vec![begin(), data(relation_named(99, "other", &["id"]))];
        events.push(data(insert(99, &[Some("x")])));
        events.push(commit(20));
        assert_eq!(feed(&mut stream, events), [20]);
        // A message outside any transaction; one inside waits for its commit.
        let message = |transactional| ReplicationEvent::Message {
            transactional,
            lsn: lsn(30),
            prefix: "outbox".into(),
            content: Vec::new().into(),
        };
        assert_eq!(feed(&mut stream, vec![message(false)]), [30]);
        assert_eq!(feed(&mut stream, vec![message(true)]), Vec::<u64>::new());
        // Position zero means none.
        assert_eq!(feed(&mut stream, vec![keepalive(0)]), Vec::<u64>::new());
        assert!(stream.next_batch().is_none());
    }

    #[test]
    fn nothing_is_confirmed_inside_a_transaction() {
        let mut stream = Stream::new(table(), 10);
        let events = vec![
            outbox_relation(),
            begin(),
            outbox_insert("e1"),
            keepalive(50),
        ];
        assert_eq!(feed(&mut stream, events), Vec::<u64>::new());
        assert!(stream.next_batch().is_none(), "not committed yet");
        assert_eq!(feed(&mut stream, vec![commit(60)]), Vec::<u64>::new());
        let batch = stream.next_batch().expect("the committed transaction");
        assert_eq!(batch[0].end_lsn, lsn(60));
    }

    #[test]
    fn a_position_read_behind_a_waiting_transaction_extends_it() {
        let mut stream = Stream::new(table(), 10);
        let mut events = vec![outbox_relation()];
        events.extend(transaction(&["e1"], 100));
        events.push(keepalive(180));
        assert_eq!(feed(&mut stream, events), Vec::<u64>::new());
        let batch = stream.next_batch().expect("a batch");
        assert_eq!(batch[0].end_lsn, lsn(180));
    }

    #[test]
    fn acknowledged_batches_are_marked_one_at_a_time_in_order() {
        let mut stream = Stream::new(table(), 1);
        let mut events = vec![outbox_relation()];
        events.extend(transaction(&["e1"], 100));
        events.extend(transaction(&["e2"], 200));
        feed(&mut stream, events);
        let first = stream.next_batch().expect("first");
        stream.acknowledged(delivered(&first));
        let second = stream
            .next_batch()
            .expect("second, while the first is marked");
        stream.acknowledged(delivered(&second));
        let marking = stream.next_mark().expect("the first");
        assert_eq!(marking.ids, ["e1"]);
        assert!(stream.next_mark().is_none(), "one mark at a time");
        assert_eq!(stream.marked(marking.end_lsn), [lsn(100)]);
        let marking = stream.next_mark().expect("the second");
        assert_eq!(marking.ids, ["e2"]);
        assert_eq!(stream.marked(marking.end_lsn), [lsn(200)]);
    }

    #[test]
    fn an_idle_position_waits_for_every_batch_before_it() {
        let mut stream = Stream::new(table(), 1);
        let mut events = vec![outbox_relation()];
        events.extend(transaction(&["e1"], 100));
        feed(&mut stream, events);
        let first = stream.next_batch().expect("first");
        assert_eq!(feed(&mut stream, vec![keepalive(120)]), Vec::<u64>::new());
        let mut events = transaction(&["e2"], 200);
        events.push(keepalive(250));
        feed(&mut stream, events);
        stream.acknowledged(delivered(&first));
        let marking = stream.next_mark().expect("first");
        // e2 is still to send: the idle position waits.
        assert_eq!(stream.marked(marking.end_lsn), [lsn(100)]);
        let second = stream.next_batch().expect("second");
        assert_eq!(
            second[0].end_lsn,
            lsn(250),
            "the later keepalive extends it"
        );
        stream.acknowledged(delivered(&second));
        let marking = stream.next_mark().expect("second");
        assert_eq!(stream.marked(marking.end_lsn), [lsn(250), lsn(120)]);
    }

    #[test]
    fn reading_stops_while_a_few_batches_wait_for_the_sink() {
        let mut stream = Stream::new(table(), 2);
        feed(&mut stream, vec![outbox_relation()]);
        let mut end = 100;
        while stream.reads() {
            feed(&mut stream, transaction(&["e"], end));
            end += 100;
        }
        assert_eq!(stream.buffered, 2 * BUFFERED_BATCHES);
        stream.next_batch().expect("a batch");
        assert!(stream.reads(), "a batch sent makes room");
    }

    #[test]
    fn an_insert_outside_a_transaction_is_an_error() {
        let mut stream = Stream::new(table(), 10);
        feed(&mut stream, vec![outbox_relation()]);
        let error = stream.received(outbox_insert("e1")).unwrap_err();
        assert!(
            matches!(error, CdcError::InsertOutsideTransaction),
            "{error}"
        );
        let error = stream.received(data(vec![b'I'])).unwrap_err();
        assert!(matches!(error, CdcError::Decode(_)), "{error}");
    }

    #[test]
    fn at_shutdown_the_acknowledged_batches_are_left_to_mark_in_order() {
        let mut stream = Stream::new(table(), 1);
        let mut events = vec![outbox_relation()];
        events.extend(transaction(&["e1"], 100));
        events.extend(transaction(&["e2"], 200));
        feed(&mut stream, events);
        let first = stream.next_batch().expect("first");
        stream.acknowledged(delivered(&first));
        let _marking = stream.next_mark().expect("the first");
        let second = stream.next_batch().expect("second");
        stream.acknowledged(delivered(&second));
        let unmarked: Vec<_> = stream.unmarked().into_iter().map(|d| d.ids).collect();
        assert_eq!(unmarked, [["e2"]]);
    }

    /// Sends, acknowledges and marks every batch ready; returns the
    /// positions confirmed and the ids sent.
    fn drain(stream: &mut Stream) -> (Vec<u64>, Vec<String>) {
        let (mut confirmed, mut sent) = (Vec::new(), Vec::new());
        while let Some(batch) = stream.next_batch() {
            let delivered = delivered(&batch);
            sent.extend(delivered.ids.iter().cloned());
            stream.acknowledged(delivered);
            let marking = stream.next_mark().expect("the batch to mark");
            confirmed.extend(stream.marked(marking.end_lsn).iter().map(|l| l.as_u64()));
        }
        (confirmed, sent)
    }

    #[test]
    fn a_large_transaction_is_sent_in_pieces_and_confirmed_at_its_commit() {
        let mut stream = Stream::new(table(), 100_000);
        feed(&mut stream, vec![outbox_relation(), begin()]);
        let ids: Vec<String> = (0..2 * PIECE_RECORDS + 5)
            .map(|n| format!("e{n}"))
            .collect();
        for id in &ids[..PIECE_RECORDS + 1] {
            feed(&mut stream, vec![outbox_insert(id)]);
        }
        // Read but not committed yet: a piece is ready, and confirms nothing.
        assert!(stream.bytes_in_flight() > 0);
        let (confirmed, sent) = drain(&mut stream);
        assert_eq!(sent, ids[..PIECE_RECORDS]);
        assert!(confirmed.is_empty(), "a piece confirmed {confirmed:?}");
        for id in &ids[PIECE_RECORDS + 1..] {
            feed(&mut stream, vec![outbox_insert(id)]);
        }
        assert_eq!(feed(&mut stream, vec![keepalive(400)]), Vec::<u64>::new());
        assert_eq!(feed(&mut stream, vec![commit(500)]), Vec::<u64>::new());
        assert_eq!(stream.take_committed_rows(), Some(ids.len()));
        let (confirmed, rest) = drain(&mut stream);
        assert_eq!([sent, rest].concat(), ids, "every row once, in order");
        assert_eq!(confirmed, [500], "confirmed once, at the commit");
        assert_eq!(stream.bytes_in_flight(), 0);
    }

    #[test]
    fn a_commit_after_every_piece_was_sent_waits_for_the_last_mark() {
        let mut stream = Stream::new(table(), 100_000);
        feed(&mut stream, vec![outbox_relation(), begin()]);
        for n in 0..PIECE_RECORDS {
            feed(&mut stream, vec![outbox_insert(&format!("e{n}"))]);
        }
        let piece = stream.next_batch().expect("the piece");
        assert_eq!(batch_end(&piece), Lsn::ZERO);
        // The commit arrives while the piece is at the sink.
        assert_eq!(feed(&mut stream, vec![commit(700)]), Vec::<u64>::new());
        stream.acknowledged(delivered(&piece));
        let marking = stream.next_mark().expect("the piece");
        assert_eq!(stream.marked(marking.end_lsn), [lsn(700)]);
    }

    #[test]
    fn reading_stops_at_the_byte_bound_whatever_the_batch_size() {
        let mut stream = Stream::new(table(), 100_000);
        feed(&mut stream, vec![outbox_relation(), begin()]);
        let payload = "x".repeat(1 << 20);
        let mut rows = 0;
        while stream.reads() {
            let id = format!("e{rows}");
            feed(
                &mut stream,
                vec![data(insert(
                    OUTBOX,
                    &[
                        Some(id.as_str()),
                        Some("Order"),
                        Some("42"),
                        Some("OrderPlaced"),
                        Some(payload.as_str()),
                        Some("1"),
                        Some("1"),
                        None,
                        None,
                        None,
                        None,
                    ],
                ))],
            );
            rows += 1;
            assert!(rows < 100, "reading did not stop");
        }
        let held = stream.bytes_in_flight();
        assert!(
            held <= BUFFERED_BYTES + PIECE_BYTES + (2 << 20),
            "{held} bytes held"
        );
        let batch = stream.next_batch().expect("a batch");
        assert!(batch.iter().map(|c| c.bytes).sum::<usize>() <= PIECE_BYTES + (2 << 20));
        assert!(stream.reads(), "a batch sent makes room");
    }

    #[test]
    fn batches_hold_whole_transactions() {
        let mut ready: VecDeque<_> = [committed(3, 1), committed(3, 2), committed(600, 3)].into();
        let ends = |batch: Vec<Committed>| -> Vec<u64> {
            batch.iter().map(|c| c.end_lsn.as_u64()).collect()
        };
        assert_eq!(ends(take_batch(&mut ready, 5)), [1, 2]);
        assert_eq!(
            ends(take_batch(&mut ready, 5)),
            [3],
            "a large transaction stays whole"
        );
        assert!(take_batch(&mut ready, 5).is_empty());
    }
}
