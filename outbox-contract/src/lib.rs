//! The outbox's wire contract: the names other systems and the crates of
//! this workspace agree on, defined once.
//!
//! - [`table`]: the outbox table and its columns (Debezium's Outbox Event
//!   Router names for the first five), as the migrations create them;
//! - [`headers`]: the headers of every published message;
//! - [`topic`]: the default topic template;
//! - [`ordering`]: the rule every writer follows so that an aggregate's
//!   events are claimed in order;
//! - [`wakeup`]: how a PostgreSQL writer wakes a waiting relay
//!   (`LISTEN`/`NOTIFY` channel and advisory-lock slots).
//!
//! The writer (`outbox-core`'s append), the relay (`outbox-relay`), the
//! consumer helpers (`outbox-core`'s `consume`) and the derive's diagnostics
//! all read these constants; the migrations' SQL is checked against them.
//!
//! ```
//! use outbox_contract::{headers, topic};
//!
//! assert_eq!(headers::EVENT_TYPE, "eventType");
//! assert_eq!(topic::for_aggregate(topic::DEFAULT_TEMPLATE, "Order"), "outbox.event.Order");
//! ```

#![no_std]

extern crate alloc;

/// The outbox table and its columns.
///
/// `id`, `aggregatetype`, `aggregateid`, `type` and `payload` are Debezium's
/// Outbox Event Router columns: a row inserted with only these is valid.
/// Every other column has a default.
pub mod table {
    /// The outbox table.
    pub const OUTBOX: &str = "outbox";
    /// The last sequence number given to each aggregate.
    pub const SEQUENCE: &str = "outbox_sequence";

    /// The outbox table's columns.
    pub mod column {
        /// The event id, a UUID (Debezium `id`).
        pub const ID: &str = "id";
        /// The aggregate type, which names the topic (Debezium `aggregatetype`).
        pub const AGGREGATE_TYPE: &str = "aggregatetype";
        /// The aggregate id, the message key (Debezium `aggregateid`).
        pub const AGGREGATE_ID: &str = "aggregateid";
        /// The event type (Debezium `type`).
        pub const EVENT_TYPE: &str = "type";
        /// The payload JSON (Debezium `payload`).
        pub const PAYLOAD: &str = "payload";
        /// The insertion sequence.
        pub const SEQ: &str = "seq";
        /// The payload version, 1 by default.
        pub const EVENT_VERSION: &str = "event_version";
        /// The event's number within its aggregate; NULL for rows written by
        /// plain SQL.
        pub const AGGREGATE_SEQ: &str = "aggregate_seq";
        /// The W3C trace context, when the event was appended with one.
        pub const TRACEPARENT: &str = "traceparent";
        /// When the row was inserted.
        pub const CREATED_AT: &str = "created_at";
        /// When the broker acknowledged it; NULL while pending.
        pub const PUBLISHED_AT: &str = "published_at";
        /// How many sends failed.
        pub const ATTEMPTS: &str = "attempts";
        /// The last send's error.
        pub const LAST_ERROR: &str = "last_error";
        /// When the row was parked as dead-lettered.
        pub const DEAD_LETTERED_AT: &str = "dead_lettered_at";
    }
}

/// The header names of every published message: Debezium's Outbox Event
/// Router names, plus this crate's version and sequence headers.
pub mod headers {
    /// The event id (a UUID): what consumers deduplicate by.
    pub const ID: &str = "id";
    /// The event type (`DomainEvent::EVENT_TYPE`).
    pub const EVENT_TYPE: &str = "eventType";
    /// The payload version (`DomainEvent::VERSION`), a decimal number.
    pub const EVENT_VERSION: &str = "eventVersion";
    /// The event's number within its aggregate: 1, 2, 3, ... in commit
    /// order. Absent for rows written by plain SQL.
    pub const AGGREGATE_SEQUENCE: &str = "aggregateSequence";
    /// The W3C trace context, when the event was appended with one.
    pub const TRACEPARENT: &str = "traceparent";
    /// The aggregate type, on brokers without a message key (RabbitMQ, NATS).
    pub const AGGREGATE_TYPE: &str = "aggregateType";
    /// The aggregate id, on brokers without a message key (RabbitMQ, NATS).
    pub const AGGREGATE_ID: &str = "aggregateId";
    /// Set on a copy of an already published event that `outbox-relay
    /// replay` sent again: the replay's id. The copy keeps the event's id
    /// and every other header, so an inbox recognises it as the same event.
    pub const REPLAY_ID: &str = "replayId";
}

/// Where a row is published.
pub mod topic {
    use alloc::string::String;

    /// What stands for the row's aggregate type in a topic template.
    pub const AGGREGATE_TYPE_PLACEHOLDER: &str = "{aggregatetype}";
    /// The default topic template, Debezium's `outbox.event.<aggregatetype>`.
    pub const DEFAULT_TEMPLATE: &str = "outbox.event.{aggregatetype}";

    /// The topic of `aggregate_type` under `template`.
    ///
    /// ```
    /// assert_eq!(
    ///     outbox_contract::topic::for_aggregate("events.{aggregatetype}.v1", "Order"),
    ///     "events.Order.v1"
    /// );
    /// ```
    pub fn for_aggregate(template: &str, aggregate_type: &str) -> String {
        template.replace(AGGREGATE_TYPE_PLACEHOLDER, aggregate_type)
    }
}

/// Per-aggregate order, by construction on the write side.
///
/// Every writer that numbers events through the library (`outbox-core`'s
/// `append` and the SeaORM integration, on every backend) follows one rule:
/// it locks the aggregate's row of the [`table::SEQUENCE`] table first,
/// then inserts the aggregate's events, drawing both `aggregate_seq` (from
/// that row) and `seq` (the column's default) while it holds the lock, and
/// holds it until the transaction ends. Two writers of one aggregate
/// therefore draw their numbers one after the other, in commit order, and:
///
/// > within an aggregate, `seq` order is `aggregate_seq` order.
///
/// The relay claims pending rows by `seq` alone, so each aggregate's rows
/// come out in its order. A writer in plain SQL keeps the invariant by the
/// same steps, in one transaction:
///
/// ```sql
/// INSERT INTO outbox_sequence (aggregatetype, aggregateid, last_seq) VALUES ('Order', '42', 1)
///     ON CONFLICT (aggregatetype, aggregateid)
///     DO UPDATE SET last_seq = outbox_sequence.last_seq + 1
///     RETURNING last_seq;                    -- the row stays locked until COMMIT
/// INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_seq)
///     VALUES ('0190..', 'Order', '42', 'OrderPlaced', '{}', <last_seq>);
/// COMMIT;
/// ```
///
/// (MySQL/MariaDB: `ON DUPLICATE KEY UPDATE last_seq = last_seq + 1`, then
/// read `last_seq`.) Rows written by plain SQL without `aggregate_seq`
/// keep their insertion (`seq`) order, as Debezium's router would publish
/// them. The `seq` sequence must hand out values in the order they are
/// asked for (PostgreSQL: `CACHE 1`, the default), or a number drawn later
/// by one connection could be lower than one drawn earlier by another.
pub mod ordering {
    /// The outbox's insertion-order column, which the relay claims by.
    pub const CLAIM_ORDER: &str = super::table::column::SEQ;
    /// The per-aggregate number, which follows [`CLAIM_ORDER`] within an
    /// aggregate.
    pub const AGGREGATE_ORDER: &str = super::table::column::AGGREGATE_SEQ;
}

/// How a writer on PostgreSQL wakes a relay waiting for new rows.
///
/// A waiting relay `LISTEN`s on [`CHANNEL`](wakeup::CHANNEL) and holds shared
/// advisory locks `(LOCK_KEY, 0) .. (LOCK_KEY, SLOTS - 1)`; the outbox's
/// insert trigger tries the exclusive lock of one slot and notifies the
/// channel only when that fails.
pub mod wakeup {
    /// The channel the outbox's insert trigger notifies.
    pub const CHANNEL: &str = "outbox";
    /// The first key of the wake-up advisory locks (`outb` in ASCII).
    pub const LOCK_KEY: i32 = 0x6F75_7462;
    /// The number of wake-up slots; an inserting transaction tries the slot
    /// of its backend's process id modulo this.
    pub const SLOTS: i32 = 64;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_topic_is_debeziums() {
        assert_eq!(
            topic::for_aggregate(topic::DEFAULT_TEMPLATE, "Order"),
            "outbox.event.Order"
        );
    }

    #[test]
    fn the_lock_key_spells_outb() {
        assert_eq!(&wakeup::LOCK_KEY.to_be_bytes(), b"outb");
    }
}
