//! [`OutboxRecord`]: a pending outbox row claimed by the relay.

use std::sync::Arc;

/// One claimed outbox row, as every source reads it (the claim queries name
/// their columns after these fields).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct OutboxRecord {
    /// `id`: the event id.
    pub id: String,
    /// `aggregatetype`.
    #[sqlx(rename = "aggregatetype")]
    pub aggregate_type: String,
    /// `aggregateid`: the Kafka key.
    #[sqlx(rename = "aggregateid")]
    pub aggregate_id: String,
    /// `type`: the `eventType` header.
    #[sqlx(rename = "type")]
    pub event_type: String,
    /// `payload` as stored; `None` becomes a tombstone (null value).
    pub payload: Option<String>,
    /// `event_version`.
    pub event_version: i32,
    /// `aggregate_seq`, when the row was written through `outbox-core`.
    pub aggregate_seq: Option<i64>,
    /// `traceparent`, when one was attached.
    pub traceparent: Option<String>,
    /// `seq`: insertion order.
    pub seq: i64,
    /// Failed publish attempts so far.
    pub attempts: i32,
    /// Seconds between the row's insertion and its claim, for the
    /// commit-to-acknowledgement latency.
    pub age_at_claim: f64,
    /// `created_at` as the database writes it (its text form): read by
    /// the PostgreSQL claim for CloudEvents' `time`; by the MariaDB/MySQL
    /// and SQLite claims, CDC mode and replay always.
    #[sqlx(default)]
    pub created_at: Option<String>,
    /// The partition holding the row: read by the PostgreSQL claim on a
    /// partitioned outbox, whose marks then go to that partition alone
    /// (see [`OutboxRecord::ctid`]); `None` elsewhere.
    #[sqlx(skip)]
    pub partition: Option<Partition>,
    /// Where the claimed version of the row is (PostgreSQL's `ctid`): read
    /// by the PostgreSQL claim, whose settle marks the rows there. The
    /// claim's row lock keeps each row in place until its transaction,
    /// which marks, ends. `None` elsewhere.
    #[sqlx(skip)]
    pub ctid: Option<Tid>,
    /// The extra columns asked for (see [`crate::source::extra`]), as
    /// JSON text, `None` for NULL.
    #[sqlx(skip)]
    pub extra: Vec<Option<String>>,
}

/// The partition a claimed row is in (a partitioned PostgreSQL outbox).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Its oid, the row's `tableoid`.
    pub oid: i64,
    /// Its name as SQL reads it, which the claim looks up by oid; `None`
    /// until then.
    pub name: Option<Arc<str>>,
}

/// A row version's place in a PostgreSQL table (a `tid`, what `ctid`
/// holds): its block and its line pointer there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tid {
    /// The block number.
    pub block: u32,
    /// The line pointer within the block, from 1.
    pub offset: u16,
}

impl sqlx::Type<sqlx::Postgres> for Tid {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        sqlx::postgres::PgTypeInfo::with_oid(sqlx::postgres::types::Oid(27))
    }
}

impl sqlx::postgres::PgHasArrayType for Tid {
    fn array_type_info() -> sqlx::postgres::PgTypeInfo {
        sqlx::postgres::PgTypeInfo::with_oid(sqlx::postgres::types::Oid(1010))
    }
}

impl sqlx::Encode<'_, sqlx::Postgres> for Tid {
    fn encode_by_ref(
        &self,
        buf: &mut sqlx::postgres::PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        buf.extend_from_slice(&self.block.to_be_bytes());
        buf.extend_from_slice(&self.offset.to_be_bytes());
        Ok(sqlx::encode::IsNull::No)
    }
}

impl sqlx::Decode<'_, sqlx::Postgres> for Tid {
    fn decode(value: sqlx::postgres::PgValueRef<'_>) -> Result<Self, sqlx::error::BoxDynError> {
        let (block, offset) = match value.format() {
            sqlx::postgres::PgValueFormat::Binary => {
                let bytes: [u8; 6] = value.as_bytes()?.try_into()?;
                (
                    u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
                    u16::from_be_bytes([bytes[4], bytes[5]]),
                )
            }
            // `(block,offset)`
            sqlx::postgres::PgValueFormat::Text => {
                let text = value.as_str()?;
                let inner = text
                    .strip_prefix('(')
                    .and_then(|rest| rest.strip_suffix(')'))
                    .ok_or_else(|| format!("not a tid: {text:?}"))?;
                let (block, offset) = inner
                    .split_once(',')
                    .ok_or_else(|| format!("not a tid: {text:?}"))?;
                (block.parse()?, offset.parse()?)
            }
        };
        Ok(Self { block, offset })
    }
}

/// A pending `Order` row of `aggregate` with an empty payload, after
/// `attempts` failed attempts.
#[cfg(test)]
pub(crate) fn test_record(id: &str, aggregate: &str, attempts: i32) -> OutboxRecord {
    OutboxRecord {
        id: id.into(),
        aggregate_type: "Order".into(),
        aggregate_id: aggregate.into(),
        event_type: "E".into(),
        payload: Some("{}".into()),
        event_version: 1,
        aggregate_seq: None,
        traceparent: None,
        seq: 0,
        attempts,
        age_at_claim: 0.0,
        created_at: None,
        partition: None,
        ctid: None,
        extra: Vec::new(),
    }
}

impl OutboxRecord {
    /// About how much memory the record holds: what the byte bounds of a
    /// batch (polling mode) and of the rows read ahead (CDC mode) count.
    pub fn memory_bytes(&self) -> usize {
        let text = |value: &Option<String>| value.as_ref().map_or(0, String::len);
        std::mem::size_of::<Self>()
            + self.id.len()
            + self.aggregate_type.len()
            + self.aggregate_id.len()
            + self.event_type.len()
            + text(&self.payload)
            + text(&self.traceparent)
            + text(&self.created_at)
    }
}
