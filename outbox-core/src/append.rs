//! Writing outbox rows inside the caller's transaction.
//!
//! One call reserves a contiguous block of per-aggregate sequence numbers for
//! each aggregate it touches (a row lock held until the transaction ends, so
//! concurrent writers of one aggregate get their numbers in commit order) and
//! inserts every row with a single multi-row `INSERT`.
//!
//! On PostgreSQL both steps are one statement, a data-modifying CTE: an
//! upsert of the `outbox_sequence` rows (`reserved`) and the outbox
//! `INSERT`, which numbers its rows from it. `insert_with_events` puts the
//! aggregate row's `INSERT .. RETURNING` in front of the same two parts:
//!
//! ```sql
//! WITH saved AS (INSERT INTO orders .. RETURNING ..),
//!      reserved AS (INSERT INTO outbox_sequence .. VALUES ($4, (SELECT "id"::text FROM saved), $5)
//!                   ON CONFLICT .. DO UPDATE .. RETURNING ..),
//!      appended AS (INSERT INTO outbox (.., aggregate_seq, ..)
//!                   SELECT .., reserved.last_seq - v.back, .. FROM (VALUES (0, $6, $4, ..)) AS v(..)
//!                   CROSS JOIN reserved ORDER BY v.place)
//! SELECT * FROM saved
//! ```
//!
//! so the row and its events cost one round trip, the events' aggregate id
//! computed from the saved row's key. MySQL/MariaDB and SQLite, appends of
//! more than 500 rows, and the rare calls the statement cannot express
//! ([`save_and_append_statement`]) take a statement per step.
//!
//! Every writer draws an event's `seq` only once it holds the lock on the
//! event's aggregate's `outbox_sequence` row, and holds it until commit
//! (here: the rows come out of the join with `reserved`, and the `seq`
//! default is evaluated above it). So within an aggregate `seq` order is
//! `aggregate_seq` order, and the relay's claim by `seq` is in aggregate
//! order ([`outbox_contract::ordering`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use sea_orm::{ConnectionTrait, DbBackend, Statement, Value};
use uuid::Uuid;

use crate::outbox_event::PreparedEvent;
use crate::transaction::ensure_transaction;
use crate::{OutboxError, OutboxEvent};

/// The outbox table, with Debezium's column names.
pub const OUTBOX_TABLE: &str = outbox_contract::table::OUTBOX;
/// The table holding the last sequence number given to each aggregate.
pub const SEQUENCE_TABLE: &str = outbox_contract::table::SEQUENCE;

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

    let backend = db.get_database_backend();
    if backend == DbBackend::Postgres && rows.len() <= ROWS_PER_INSERT {
        write_in_one_statement(db, &mut rows).await?;
        return Ok(rows.into_iter().map(Row::into_appended).collect());
    }
    // Sorted keys: transactions touching several aggregates lock their
    // sequence rows in one global order and cannot deadlock on them.
    let mut next_sequence: BTreeMap<(&'static str, String), i64> = BTreeMap::new();
    for row in &rows {
        *next_sequence.entry(row.aggregate_key()).or_default() += 1;
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
async fn write_in_one_statement<C: ConnectionTrait>(
    db: &C,
    rows: &mut [Row],
) -> Result<(), OutboxError> {
    let cte = AppendCte::new(
        rows.iter()
            .map(|row| (&row.event, AggregateIdSql::Param(&row.aggregate_id))),
        0,
    );
    let sql = format!(
        "WITH reserved AS ({}) {} RETURNING id, aggregate_seq",
        cte.reserve, cte.insert
    );
    let inserted = db
        .query_all_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            sql,
            cte.values,
        ))
        .await?;
    let mut sequences = HashMap::with_capacity(inserted.len());
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

/// PostgreSQL: one statement that saves the aggregate row and appends
/// `events`, or `None` when this call needs a statement per step.
///
/// `save` is the row's `INSERT .. RETURNING` as SeaORM builds it, and the
/// statement returns what `save` returns. Events without an aggregate id
/// take the saved row's primary key: `key_columns` (in key order; `None` if
/// the key cannot serve as an aggregate id), each converted to text and
/// joined with `:`, in SQL. `None` when the backend is not PostgreSQL,
/// there are no events or more than one statement holds, events need a key
/// that `key_columns` cannot give, or an aggregate type has both events of
/// the saved row and events with a given id (which of the two locks its
/// sequence row first, and whether they are one aggregate, only shows once
/// the row exists).
pub(crate) fn save_and_append_statement(
    save: Statement,
    key_columns: Option<&[&str]>,
    events: &[PreparedEvent],
) -> Option<Statement> {
    if save.db_backend != DbBackend::Postgres || events.is_empty() || events.len() > ROWS_PER_INSERT
    {
        return None;
    }
    let saved_row_types: BTreeSet<&str> = events
        .iter()
        .filter(|event| event.aggregate_id.is_none())
        .map(|event| event.aggregate_type)
        .collect();
    let mixed = events.iter().any(|event| {
        event.aggregate_id.is_some() && saved_row_types.contains(event.aggregate_type)
    });
    if mixed {
        return None;
    }
    let saved_key = if saved_row_types.is_empty() {
        String::new()
    } else {
        saved_key_sql(key_columns.filter(|columns| !columns.is_empty())?)
    };

    let mut values = save.values.map(|values| values.0).unwrap_or_default();
    let rows = events.iter().map(|event| {
        let aggregate_id = match &event.aggregate_id {
            Some(id) => AggregateIdSql::Param(id),
            None => AggregateIdSql::Expression(&saved_key),
        };
        (event, aggregate_id)
    });
    let cte = AppendCte::new(rows, values.len());
    values.extend(cte.values);
    let sql = format!(
        "WITH {SAVED} AS ({}), reserved AS ({}), appended AS ({}) SELECT * FROM {SAVED}",
        save.sql, cte.reserve, cte.insert
    );
    Some(Statement::from_sql_and_values(
        DbBackend::Postgres,
        sql,
        values,
    ))
}

/// The name of the saved row in [`save_and_append_statement`].
const SAVED: &str = "saved";

/// The saved row's primary key as an `aggregateid`, in SQL: each column as
/// text (PostgreSQL writes integers, strings and UUIDs as `aggregate_id_of`
/// does in Rust), joined with `:`.
fn saved_key_sql(columns: &[&str]) -> String {
    let parts: Vec<String> = columns
        .iter()
        .map(|column| format!("\"{}\"::text", column.replace('"', "\"\"")))
        .collect();
    format!("(SELECT {} FROM {SAVED})", parts.join(" || ':' || "))
}

/// A row's `aggregateid` in a one-statement append.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum AggregateIdSql<'a> {
    /// Known before the statement runs; bound as a parameter.
    Param(&'a str),
    /// Computed by the statement (the saved row's key).
    Expression(&'a str),
}

/// The two data-modifying parts of an append on PostgreSQL, shared by the
/// append on its own and the append with a saved row: `reserve` adds each
/// aggregate's event count to its `last_seq` and returns the new last
/// numbers (the other part reads it as `reserved`); `insert` inserts the
/// rows in the order given, a plain multi-row `INSERT .. VALUES` whose
/// rows take their numbers from `reserved` by scalar subqueries.
///
/// Each aggregate's type and id are bound once and their placeholders
/// reused; the offset of a row's number from its aggregate's new last
/// number is a literal, fixed by the shape of the call, so calls of one
/// shape share one SQL text and one prepared statement.
#[derive(Debug)]
struct AppendCte {
    reserve: String,
    insert: String,
    /// The parameters of both parts, numbered after the statement's
    /// earlier ones.
    values: Vec<Value>,
}

/// One aggregate of an append: its event count and its key, as SQL.
struct Reservation {
    count: i64,
    aggregate_type: String,
    aggregate_id: String,
}

impl AppendCte {
    /// Builds the parts for `rows`; their placeholders follow the
    /// statement's `earlier_values` parameters.
    fn new<'a>(
        rows: impl Iterator<Item = (&'a PreparedEvent, AggregateIdSql<'a>)>,
        earlier_values: usize,
    ) -> Self {
        let rows: Vec<_> = rows.collect();
        let counts = aggregate_counts(&rows);
        let mut params = Params {
            earlier: earlier_values,
            values: Vec::with_capacity(counts.len() * 3 + rows.len() * 5),
        };
        let reservations = reservations(counts, &mut params);
        let reserved_rows: Vec<String> = reservations
            .values()
            .map(|reservation| {
                format!(
                    "({}, {}, {})",
                    reservation.aggregate_type,
                    reservation.aggregate_id,
                    params.bind(reservation.count, "bigint")
                )
            })
            .collect();
        let events = event_values(&rows, &reservations, &mut params);
        let reserve = format!(
            "INSERT INTO {SEQUENCE_TABLE} (aggregatetype, aggregateid, last_seq) VALUES {} \
             ON CONFLICT (aggregatetype, aggregateid) \
             DO UPDATE SET last_seq = {SEQUENCE_TABLE}.last_seq + excluded.last_seq \
             RETURNING aggregatetype, aggregateid, last_seq",
            reserved_rows.join(", ")
        );
        // The rows come out of a join with `reserved`, so each row's `seq`
        // (the column default, evaluated above the join) is drawn once its
        // aggregate's sequence row is locked; sorted by their place in the
        // call, so an aggregate's rows draw `seq` in `aggregate_seq` order.
        let join = if reservations.len() == 1 {
            "CROSS JOIN reserved".to_owned()
        } else {
            "JOIN reserved ON reserved.aggregatetype = v.aggregatetype \
             AND reserved.aggregateid = v.aggregateid"
                .to_owned()
        };
        let insert = format!(
            "INSERT INTO {OUTBOX_TABLE} \
               (id, aggregatetype, aggregateid, type, payload, event_version, aggregate_seq, traceparent) \
             SELECT v.id, v.aggregatetype, v.aggregateid, v.type, v.payload, v.event_version, \
               reserved.last_seq - v.back, v.traceparent \
             FROM (VALUES {}) AS v(place, id, aggregatetype, aggregateid, type, payload, event_version, back, traceparent) \
             {join} ORDER BY v.place",
            events.join(", ")
        );
        Self {
            reserve,
            insert,
            values: params.values,
        }
    }
}

/// An aggregate of an append, as the statement keys it.
type AggregateSql<'a> = (&'static str, AggregateIdSql<'a>);

/// Each aggregate of `rows` with its event count.
///
/// Sorted keys: the multi-row upsert locks the sequence rows in one global
/// order, so transactions touching several aggregates cannot deadlock on
/// them.
fn aggregate_counts<'a>(
    rows: &[(&'a PreparedEvent, AggregateIdSql<'a>)],
) -> BTreeMap<AggregateSql<'a>, i64> {
    let mut counts: BTreeMap<AggregateSql<'a>, i64> = BTreeMap::new();
    for (event, aggregate_id) in rows {
        *counts
            .entry((event.aggregate_type, *aggregate_id))
            .or_default() += 1;
    }
    counts
}

/// The reservation of each aggregate's `count` numbers, its key bound once.
fn reservations<'a>(
    counts: BTreeMap<AggregateSql<'a>, i64>,
    params: &mut Params,
) -> BTreeMap<AggregateSql<'a>, Reservation> {
    counts
        .into_iter()
        .map(|(key @ (aggregate_type, aggregate_id), count)| {
            let reservation = Reservation {
                count,
                aggregate_type: params.bind(aggregate_type, "text"),
                aggregate_id: match aggregate_id {
                    AggregateIdSql::Param(id) => params.bind(id, "text"),
                    AggregateIdSql::Expression(sql) => sql.to_owned(),
                },
            };
            (key, reservation)
        })
        .collect()
}

/// The `VALUES` tuple of each row, in order: its place in the call, its
/// columns, and how far its `aggregate_seq` lies below its aggregate's new
/// last number (a literal, fixed by the shape of the call).
fn event_values(
    rows: &[(&PreparedEvent, AggregateIdSql<'_>)],
    reservations: &BTreeMap<AggregateSql<'_>, Reservation>,
    params: &mut Params,
) -> Vec<String> {
    let mut positions: BTreeMap<AggregateSql, i64> = BTreeMap::new();
    rows.iter()
        .enumerate()
        .map(|(place, &(event, aggregate_id))| {
            let key = (event.aggregate_type, aggregate_id);
            let reservation = &reservations[&key];
            let position = positions.entry(key).or_default();
            *position += 1;
            format!(
                "({place}, {}, {}, {}, {}, {}, {}, {}, {})",
                params.bind(event.id, "uuid"),
                reservation.aggregate_type,
                reservation.aggregate_id,
                params.bind(event.event_type, "text"),
                params.bind(event.payload.as_str(), "jsonb"),
                params.bind(i64::from(event.version), "int"),
                reservation.count - *position,
                params.bind(event.traceparent.clone(), "text"),
            )
        })
        .collect()
}

/// The parameters of a statement under construction.
struct Params {
    /// Parameters of the statement before these.
    earlier: usize,
    values: Vec<Value>,
}

impl Params {
    /// Binds `value` and returns its placeholder, cast to `sql_type`.
    fn bind(&mut self, value: impl Into<Value>, sql_type: &str) -> String {
        self.values.push(value.into());
        format!("${}::{sql_type}", self.earlier + self.values.len())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn event(aggregate_type: &'static str, aggregate_id: Option<&str>) -> PreparedEvent {
        PreparedEvent {
            id: Uuid::now_v7(),
            aggregate_type,
            aggregate_id: aggregate_id.map(str::to_owned),
            event_type: "Happened",
            version: 1,
            payload: "{}".to_owned(),
            traceparent: None,
        }
    }

    /// The row's `INSERT .. RETURNING`, with its two parameters.
    fn save(backend: DbBackend) -> Statement {
        Statement::from_sql_and_values(
            backend,
            r#"INSERT INTO "orders" ("customer", "total") VALUES ($1, $2) RETURNING "id", "customer", "total""#,
            ["ada".into(), 1i64.into()],
        )
    }

    #[test]
    fn the_saved_row_and_its_events_make_one_statement() {
        let events = [event("Order", None), event("Order", None)];
        let statement =
            save_and_append_statement(save(DbBackend::Postgres), Some(&["id"]), &events)
                .expect("one statement");
        let sql = &statement.sql;
        assert!(
            sql.starts_with(
                r#"WITH saved AS (INSERT INTO "orders" ("customer", "total") VALUES ($1, $2) RETURNING "id", "customer", "total"), reserved AS (INSERT INTO outbox_sequence"#
            ),
            "{sql}"
        );
        assert!(sql.ends_with(") SELECT * FROM saved"), "{sql}");
        // One reservation for the one aggregate, whose id comes from the row.
        assert!(
            sql.contains(
                r#"VALUES ($3::text, (SELECT "id"::text FROM saved), $4::bigint) ON CONFLICT"#
            ),
            "{sql}"
        );
        assert_eq!(sql.matches(r#"(SELECT "id"::text FROM saved)"#).count(), 3);
        // The rows reuse the aggregate's placeholders and are numbered from
        // the one reservation, the last row with its new last number; they
        // come out of the join with it, in their order, so each draws its
        // `seq` once the aggregate is locked.
        assert!(
            sql.contains(
                r#"SELECT v.id, v.aggregatetype, v.aggregateid, v.type, v.payload, v.event_version, reserved.last_seq - v.back, v.traceparent FROM (VALUES (0, $5::uuid, $3::text, (SELECT "id"::text FROM saved), $6::text, $7::jsonb, $8::int, 1, $9::text), (1, $10::uuid, $3::text, (SELECT "id"::text FROM saved), $11::text, $12::jsonb, $13::int, 0, $14::text)) AS v(place, id, aggregatetype, aggregateid, type, payload, event_version, back, traceparent) CROSS JOIN reserved ORDER BY v.place) SELECT"#
            ),
            "{sql}"
        );
        assert!(!sql.contains("$15"), "{sql}");
        // The row's 2, the reservation's 2, 5 per event.
        assert_eq!(statement.values.expect("parameters").0.len(), 2 + 2 + 2 * 5);
    }

    #[test]
    fn composite_keys_join_their_columns_with_colons() {
        assert_eq!(
            saved_key_sql(&["tenant", "odd\"name"]),
            r#"(SELECT "tenant"::text || ':' || "odd""name"::text FROM saved)"#
        );
    }

    #[test]
    fn events_with_given_ids_need_no_key() {
        let events = [event("Order", Some("7")), event("Invoice", None)];
        let statement =
            save_and_append_statement(save(DbBackend::Postgres), Some(&["id"]), &events)
                .expect("one statement");
        // Sorted by aggregate type: Invoice (the row's key), then Order 7.
        let sql = &statement.sql;
        assert!(
            sql.contains(
                r#"VALUES ($3::text, (SELECT "id"::text FROM saved), $6::bigint), ($4::text, $5::text, $7::bigint) ON CONFLICT"#
            ),
            "{sql}"
        );
        // With several aggregates, each row joins its aggregate's reservation.
        assert!(
            sql.contains(
                r#"(VALUES (0, $8::uuid, $4::text, $5::text, $9::text, $10::jsonb, $11::int, 0, $12::text), (1, $13::uuid, $3::text, (SELECT "id"::text FROM saved), $14::text, $15::jsonb, $16::int, 0, $17::text))"#
            ),
            "{sql}"
        );
        assert!(
            sql.contains(
                "JOIN reserved ON reserved.aggregatetype = v.aggregatetype \
                 AND reserved.aggregateid = v.aggregateid ORDER BY v.place"
            ),
            "{sql}"
        );
        let given_only = [event("Order", Some("7"))];
        assert!(save_and_append_statement(save(DbBackend::Postgres), None, &given_only).is_some());
    }

    #[test]
    fn other_calls_take_a_statement_per_step() {
        let key = Some(&["id"][..]);
        let one = [event("Order", None)];
        assert!(save_and_append_statement(save(DbBackend::MySql), key, &one).is_none());
        assert!(save_and_append_statement(save(DbBackend::Sqlite), key, &one).is_none());
        assert!(save_and_append_statement(save(DbBackend::Postgres), key, &[]).is_none());
        let many = vec![event("Order", None); ROWS_PER_INSERT + 1];
        assert!(save_and_append_statement(save(DbBackend::Postgres), key, &many).is_none());
        // The row's key is needed but cannot serve as an aggregate id.
        assert!(save_and_append_statement(save(DbBackend::Postgres), None, &one).is_none());
        // One aggregate type, the row's key and a given id.
        let mixed = [event("Order", None), event("Order", Some("7"))];
        assert!(save_and_append_statement(save(DbBackend::Postgres), key, &mixed).is_none());
    }
}
