//! Writing outbox rows inside the caller's transaction.
//!
//! One call reserves a contiguous block of per-aggregate sequence numbers for
//! each aggregate it touches (a row lock held until the transaction ends, so
//! concurrent writers of one aggregate get their numbers in commit order) and
//! inserts every row with a single multi-row `INSERT`.

use std::collections::BTreeMap;

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, Statement, Value};
use uuid::Uuid;

use crate::outbox_event::PreparedEvent;
use crate::{OutboxError, OutboxEvent};

/// The outbox table, with Debezium's column names.
pub const OUTBOX_TABLE: &str = "outbox";
/// The table holding the last sequence number given to each aggregate.
pub const SEQUENCE_TABLE: &str = "outbox_sequence";

/// Rows per `INSERT`, well inside every backend's bind-parameter limit.
const ROWS_PER_INSERT: usize = 500;

/// One row written by an append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendedEvent {
    /// The event id (`id` column and header).
    pub id: Uuid,
    /// The `aggregatetype` column.
    pub aggregate_type: &'static str,
    /// The `aggregateid` column.
    pub aggregate_id: String,
    /// The `type` column.
    pub event_type: &'static str,
    /// The per-aggregate sequence number (`aggregate_seq` column), 1 for an
    /// aggregate's first event.
    pub sequence: i64,
}

/// Appends events to the outbox inside the transaction `db`.
///
/// Every event needs an aggregate id ([`OutboxEvent::aggregate_id`]); to take
/// it from a saved model, use [`crate::ActiveModelOutboxExt`] instead. All
/// payloads are serialized before anything is written, and a connection that
/// is not a transaction is refused.
///
/// ```no_run
/// # use outbox_core::{DomainEvent, OutboxEvent};
/// # use sea_orm::{DatabaseConnection, TransactionTrait};
/// #[derive(DomainEvent, serde::Serialize)]
/// #[domain_event(aggregate = "Order", version = 1)]
/// struct OrderCancelled { reason: String }
///
/// # async fn cancel(db: &DatabaseConnection) -> Result<(), Box<dyn std::error::Error>> {
/// let txn = db.begin().await?;
/// let cancelled = OrderCancelled { reason: "out of stock".into() };
/// outbox_core::append(&txn, [OutboxEvent::new(cancelled).aggregate_id("42")]).await?;
/// txn.commit().await?;
/// # Ok(()) }
/// ```
pub async fn append<C, I>(db: &C, events: I) -> Result<Vec<AppendedEvent>, OutboxError>
where
    C: ConnectionTrait,
    I: IntoIterator,
    I::Item: Into<OutboxEvent>,
{
    ensure_transaction::<C>()?;
    let prepared = prepare(events)?;
    write(db, prepared, None).await
}

/// Appends events and deletes their rows again in the same transaction:
/// Debezium's insert+delete idiom, which keeps the outbox table empty.
///
/// Only a relay reading PostgreSQL's write-ahead log publishes such events:
/// `outbox-relay run --mode cdc` (or Debezium) sees the insert at commit and
/// ignores the delete; a polling relay never sees the rows at all. The
/// events get their aggregate sequence numbers as with [`append`], and
/// anything but PostgreSQL is refused before a write.
///
/// ```no_run
/// # use outbox_core::{DomainEvent, OutboxEvent};
/// # use sea_orm::{DatabaseConnection, TransactionTrait};
/// #[derive(DomainEvent, serde::Serialize)]
/// #[domain_event(aggregate = "Order", version = 1)]
/// struct OrderShipped { carrier: String }
///
/// # async fn ship(db: &DatabaseConnection) -> Result<(), Box<dyn std::error::Error>> {
/// let txn = db.begin().await?;
/// let shipped = OrderShipped { carrier: "DHL".into() };
/// outbox_core::append_transient(&txn, [OutboxEvent::new(shipped).aggregate_id("42")]).await?;
/// txn.commit().await?;
/// # Ok(()) }
/// ```
pub async fn append_transient<C, I>(db: &C, events: I) -> Result<Vec<AppendedEvent>, OutboxError>
where
    C: ConnectionTrait,
    I: IntoIterator,
    I::Item: Into<OutboxEvent>,
{
    ensure_transaction::<C>()?;
    let backend = db.get_database_backend();
    if backend != DbBackend::Postgres {
        return Err(OutboxError::TransientNeedsPostgres {
            backend: format!("{backend:?}"),
        });
    }
    let prepared = prepare(events)?;
    let appended = write(db, prepared, None).await?;
    for chunk in appended.chunks(ROWS_PER_INSERT) {
        let placeholders: Vec<String> = (1..=chunk.len()).map(|n| format!("${n}")).collect();
        let values: Vec<Value> = chunk.iter().map(|event| event.id.into()).collect();
        db.execute_raw(Statement::from_sql_and_values(
            backend,
            format!(
                "DELETE FROM {OUTBOX_TABLE} WHERE id IN ({})",
                placeholders.join(", ")
            ),
            values,
        ))
        .await?;
    }
    Ok(appended)
}

/// Refuses a connection that is not a [`DatabaseTransaction`]: events written
/// on an auto-committing connection could commit without the aggregate.
pub(crate) fn ensure_transaction<C: ConnectionTrait>() -> Result<(), OutboxError> {
    let connection = std::any::type_name::<C>();
    if connection == std::any::type_name::<DatabaseTransaction>() {
        Ok(())
    } else {
        Err(OutboxError::NotInTransaction { connection })
    }
}

/// Serializes every payload and checks every option before any write.
pub(crate) fn prepare<I>(events: I) -> Result<Vec<PreparedEvent>, OutboxError>
where
    I: IntoIterator,
    I::Item: Into<OutboxEvent>,
{
    events
        .into_iter()
        .map(|event| event.into().prepare())
        .collect()
}

/// Writes prepared events; those without an aggregate id take `default_aggregate_id`.
pub(crate) async fn write<C: ConnectionTrait>(
    db: &C,
    events: Vec<PreparedEvent>,
    default_aggregate_id: Option<&str>,
) -> Result<Vec<AppendedEvent>, OutboxError> {
    let mut rows = Vec::with_capacity(events.len());
    for event in events {
        let aggregate_id = match (&event.aggregate_id, default_aggregate_id) {
            (Some(id), _) => id.clone(),
            (None, Some(default)) => default.to_owned(),
            (None, None) => {
                return Err(OutboxError::MissingAggregateId {
                    event_type: event.event_type,
                });
            }
        };
        rows.push(Row {
            aggregate_id,
            sequence: 0,
            event,
        });
    }
    if rows.is_empty() {
        return Ok(Vec::new());
    }

    // Sorted keys: transactions touching several aggregates lock their
    // sequence rows in one global order and cannot deadlock on them.
    let mut next_sequence: BTreeMap<(&'static str, String), i64> = BTreeMap::new();
    for row in &rows {
        *next_sequence.entry(row.aggregate_key()).or_default() += 1;
    }
    let backend = db.get_database_backend();
    if backend == DbBackend::Postgres && rows.len() <= ROWS_PER_INSERT {
        write_in_one_statement(db, &mut rows, &next_sequence).await?;
        return Ok(rows.into_iter().map(Row::into_appended).collect());
    }
    for ((aggregate_type, aggregate_id), next) in next_sequence.iter_mut() {
        let count = *next;
        let last = reserve_sequence(db, backend, aggregate_type, aggregate_id, count).await?;
        *next = last - count + 1;
    }
    for row in &mut rows {
        let next = next_sequence
            .get_mut(&row.aggregate_key())
            .expect("every aggregate of the call has reserved numbers");
        row.sequence = *next;
        *next += 1;
    }

    for chunk in rows.chunks(ROWS_PER_INSERT) {
        db.execute_raw(insert_statement(backend, chunk)).await?;
    }
    Ok(rows.into_iter().map(Row::into_appended).collect())
}

/// PostgreSQL: reserves the sequence numbers and inserts the rows in one
/// statement (a data-modifying CTE), saving a round trip per aggregate.
/// The multi-row upsert locks the sequence rows in `counts`' sorted order.
async fn write_in_one_statement<C: ConnectionTrait>(
    db: &C,
    rows: &mut [Row],
    counts: &BTreeMap<(&'static str, String), i64>,
) -> Result<(), OutboxError> {
    let mut values: Vec<Value> = Vec::with_capacity(counts.len() * 3 + rows.len() * 10);
    let mut placeholder = 0;
    let mut next = || {
        placeholder += 1;
        format!("${placeholder}")
    };
    let mut reservations = Vec::with_capacity(counts.len());
    for ((aggregate_type, aggregate_id), count) in counts {
        reservations.push(format!(
            "({}::text, {}::text, {}::bigint)",
            next(),
            next(),
            next()
        ));
        values.extend([
            (*aggregate_type).into(),
            aggregate_id.as_str().into(),
            (*count).into(),
        ]);
    }
    let mut positions: BTreeMap<(&'static str, String), i64> = BTreeMap::new();
    let mut events = Vec::with_capacity(rows.len());
    for (order, row) in rows.iter().enumerate() {
        let key = row.aggregate_key();
        let position = positions.entry(key.clone()).or_default();
        *position += 1;
        events.push(format!(
            "({}::bigint, {}::uuid, {}::text, {}::text, {}::text, {}::jsonb, {}::int, {}::bigint, {}::bigint, {}::text)",
            next(), next(), next(), next(), next(), next(), next(), next(), next(), next()
        ));
        values.extend([
            (order as i64).into(),
            row.event.id.into(),
            row.event.aggregate_type.into(),
            row.aggregate_id.as_str().into(),
            row.event.event_type.into(),
            row.event.payload.as_str().into(),
            i64::from(row.event.version).into(),
            (*position).into(),
            counts[&key].into(),
            row.event.traceparent.clone().into(),
        ]);
    }
    let sql = format!(
        "WITH reserved AS (\
           INSERT INTO {SEQUENCE_TABLE} (aggregatetype, aggregateid, last_seq) VALUES {} \
           ON CONFLICT (aggregatetype, aggregateid) \
           DO UPDATE SET last_seq = {SEQUENCE_TABLE}.last_seq + excluded.last_seq \
           RETURNING aggregatetype, aggregateid, last_seq) \
         INSERT INTO {OUTBOX_TABLE} \
           (id, aggregatetype, aggregateid, type, payload, event_version, aggregate_seq, traceparent) \
         SELECT e.id, e.aggregatetype, e.aggregateid, e.type, e.payload, e.event_version, \
           r.last_seq - e.count + e.position, e.traceparent \
         FROM (VALUES {}) AS e(ord, id, aggregatetype, aggregateid, type, payload, event_version, \
           position, count, traceparent) \
         JOIN reserved r USING (aggregatetype, aggregateid) \
         ORDER BY e.ord \
         RETURNING id, aggregate_seq",
        reservations.join(", "),
        events.join(", ")
    );
    let inserted = db
        .query_all_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            sql,
            values,
        ))
        .await?;
    let mut sequences = std::collections::HashMap::with_capacity(inserted.len());
    for row in &inserted {
        sequences.insert(
            row.try_get_by_index::<Uuid>(0)?,
            row.try_get_by_index::<i64>(1)?,
        );
    }
    for row in rows.iter_mut() {
        row.sequence = *sequences
            .get(&row.event.id)
            .ok_or_else(|| OutboxError::Db(sea_orm::DbErr::RecordNotInserted))?;
    }
    Ok(())
}

/// A prepared event with the aggregate id and sequence number of its row.
struct Row {
    event: PreparedEvent,
    aggregate_id: String,
    sequence: i64,
}

impl Row {
    fn aggregate_key(&self) -> (&'static str, String) {
        (self.event.aggregate_type, self.aggregate_id.clone())
    }

    fn into_appended(self) -> AppendedEvent {
        AppendedEvent {
            id: self.event.id,
            aggregate_type: self.event.aggregate_type,
            aggregate_id: self.aggregate_id,
            event_type: self.event.event_type,
            sequence: self.sequence,
        }
    }
}

/// Adds `count` to the aggregate's last sequence number and returns the new
/// last number. The row stays locked until the transaction ends.
async fn reserve_sequence<C: ConnectionTrait>(
    db: &C,
    backend: DbBackend,
    aggregate_type: &str,
    aggregate_id: &str,
    count: i64,
) -> Result<i64, OutboxError> {
    let key = || -> Vec<Value> { vec![aggregate_type.into(), aggregate_id.into()] };
    let returned = match backend {
        DbBackend::MySql => {
            let upsert = format!(
                "INSERT INTO {SEQUENCE_TABLE} (aggregatetype, aggregateid, last_seq) VALUES (?, ?, ?) \
                 ON DUPLICATE KEY UPDATE last_seq = last_seq + ?"
            );
            let mut values = key();
            values.extend([count.into(), count.into()]);
            db.execute_raw(Statement::from_sql_and_values(backend, upsert, values))
                .await?;
            let select = format!(
                "SELECT last_seq FROM {SEQUENCE_TABLE} WHERE aggregatetype = ? AND aggregateid = ?"
            );
            db.query_one_raw(Statement::from_sql_and_values(backend, select, key()))
                .await?
        }
        _ => {
            let placeholders = match backend {
                DbBackend::Postgres => ["$1", "$2", "$3"],
                _ => ["?", "?", "?"],
            };
            let [p1, p2, p3] = placeholders;
            let upsert = format!(
                "INSERT INTO {SEQUENCE_TABLE} (aggregatetype, aggregateid, last_seq) VALUES ({p1}, {p2}, {p3}) \
                 ON CONFLICT (aggregatetype, aggregateid) \
                 DO UPDATE SET last_seq = {SEQUENCE_TABLE}.last_seq + excluded.last_seq \
                 RETURNING last_seq"
            );
            let mut values = key();
            values.push(count.into());
            db.query_one_raw(Statement::from_sql_and_values(backend, upsert, values))
                .await?
        }
    };
    let row = returned.ok_or_else(|| {
        OutboxError::Db(sea_orm::DbErr::RecordNotFound(format!(
            "{SEQUENCE_TABLE} row of {aggregate_type} {aggregate_id}"
        )))
    })?;
    Ok(row.try_get_by_index::<i64>(0)?)
}

fn insert_statement(backend: DbBackend, rows: &[Row]) -> Statement {
    const COLUMNS: usize = 8;
    let mut sql = format!(
        "INSERT INTO {OUTBOX_TABLE} \
         (id, aggregatetype, aggregateid, type, payload, event_version, aggregate_seq, traceparent) VALUES "
    );
    let mut values: Vec<Value> = Vec::with_capacity(rows.len() * COLUMNS);
    for (
        index,
        Row {
            event,
            aggregate_id,
            sequence,
        },
    ) in rows.iter().enumerate()
    {
        if index > 0 {
            sql.push_str(", ");
        }
        match backend {
            DbBackend::Postgres => {
                let p = |column: usize| format!("${}", index * COLUMNS + column);
                sql.push_str(&format!(
                    "({}, {}, {}, {}, {}::jsonb, {}, {}, {})",
                    p(1),
                    p(2),
                    p(3),
                    p(4),
                    p(5),
                    p(6),
                    p(7),
                    p(8)
                ));
                values.push(event.id.into());
            }
            _ => {
                sql.push_str("(?, ?, ?, ?, ?, ?, ?, ?)");
                values.push(event.id.hyphenated().to_string().into());
            }
        }
        values.extend([
            event.aggregate_type.into(),
            aggregate_id.as_str().into(),
            event.event_type.into(),
            event.payload.as_str().into(),
            i64::from(event.version).into(),
            (*sequence).into(),
            event.traceparent.clone().into(),
        ]);
    }
    Statement::from_sql_and_values(backend, sql, values)
}
