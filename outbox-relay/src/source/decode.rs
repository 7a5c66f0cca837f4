//! Claimed rows read one by one, so that one row that cannot be read never
//! fails the claim of the others.
//!
//! A source reads its claim's rows as raw rows and decodes each here. A row
//! that fails (on SQLite, whose columns take any type whatever their
//! declaration: a BLOB payload, text in `event_version`; elsewhere a value
//! out of range or text that is not UTF-8) comes back as [`Undecodable`],
//! with its `seq` and a one-line reason naming the column and what it
//! holds. The source dead-letters it at once (in the claim's transaction
//! where there is one: `attempts` + 1, `last_error` = the reason,
//! `dead_lettered_at` set, by `seq` and only while the row is still
//! pending) and leaves it out of the batch. Its aggregate's later rows are
//! then behind a hole in their run, which [`crate::ordering`] cuts; the next claim takes them, the dead letter being no longer
//! pending, as for a row the broker refused for good. `status` lists it and
//! `retry` re-drives it once it has been fixed.

use outbox_contract::table::column;
use sqlx::{Column, ColumnIndex, Decode, Row, Type, TypeInfo, ValueRef};

use super::{AggregateKey, SourceError};
use crate::record::{OutboxRecord, Partition};

/// A claimed row that cannot be read: dead-lettered by `seq`, with
/// `reason`, and left out of the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Undecodable {
    /// The row's `seq`.
    pub seq: i64,
    /// One line for `last_error`: `undecodable row: column ... holds ...`.
    pub reason: String,
    /// Its aggregate, when that much of it can be read.
    pub aggregate: Option<AggregateKey>,
}

/// The holes undecodable rows leave in their aggregates' runs.
pub(crate) fn holes(rows: Vec<Undecodable>) -> Vec<crate::ordering::Hole> {
    rows.into_iter()
        .map(|row| crate::ordering::Hole {
            seq: row.seq,
            aggregate: row.aggregate,
        })
        .collect()
}

impl Undecodable {
    /// Logs the dead letter.
    pub(crate) fn log(&self) {
        tracing::warn!(seq = self.seq, reason = %self.reason, "dead-lettered an outbox row that cannot be read");
    }
}

/// The rows of a claim that could be read, and those that could not.
#[derive(Debug)]
pub(crate) struct Decoded<T> {
    /// Read rows, in the order given.
    pub rows: Vec<T>,
    /// Rows to dead-letter.
    pub undecodable: Vec<Undecodable>,
}

/// Decodes each of `rows` with `decode`; a row it refuses is identified by
/// its `seq_column`. Fails only when that column cannot be read either (a
/// row that could then be neither sent nor dead-lettered).
pub(crate) fn decode_each<R, T>(
    rows: &[R],
    seq_column: &str,
    decode: impl Fn(&R) -> Result<T, String>,
) -> Result<Decoded<T>, SourceError>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    usize: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
{
    let mut decoded = Decoded {
        rows: Vec::with_capacity(rows.len()),
        undecodable: Vec::new(),
    };
    for row in rows {
        match decode(row) {
            Ok(value) => decoded.rows.push(value),
            Err(reason) => {
                let seq = by_name::<R, i64>(row, seq_column).map_err(|seq_error| {
                    SourceError::Query(sqlx::Error::Decode(
                        format!(
                            "an outbox row cannot be read ({reason}) nor identified ({seq_error})"
                        )
                        .into(),
                    ))
                })?;
                let aggregate = by_name::<R, String>(row, "aggregatetype")
                    .and_then(|aggregate_type| {
                        Ok(AggregateKey {
                            aggregate_type,
                            aggregate_id: by_name::<R, String>(row, "aggregateid")?,
                        })
                    })
                    .ok();
                decoded.undecodable.push(Undecodable {
                    seq,
                    reason: format!("undecodable row: {reason}"),
                    aggregate,
                });
            }
        }
    }
    Ok(decoded)
}

/// Claimed rows (every database; replay's
/// reads), each then read further by `more` (a dialect's own columns, such
/// as PostgreSQL's `ctid`; `|_, _| Ok(())` for none); a row `more` refuses
/// is undecodable as any other.
pub(crate) fn records<R>(
    rows: &[R],
    more: impl Fn(&R, &mut OutboxRecord) -> Result<(), String>,
) -> Result<Decoded<OutboxRecord>, SourceError>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    usize: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i32: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> f64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> uuid::Uuid: Decode<'r, R::Database> + Type<R::Database>,
{
    let columns = RecordColumns::of(rows.first());
    decode_each(rows, "seq", |row| {
        let mut record = record(row, &columns)?;
        more(row, &mut record)?;
        Ok(record)
    })
}

/// The place of the column `name` in `rows` (all rows of a statement have
/// the same columns), if they have it.
pub(crate) fn column_index<R: Row>(rows: &[R], name: &str) -> Option<usize> {
    Place::of(rows.first(), name).index
}

/// A column of a claim's rows: its name, and its place in the rows when
/// the first row has it (all rows of a statement have the same columns),
/// so that each row is read by place, not by looking its names up.
#[derive(Debug, Clone, Copy)]
struct Place<'a> {
    name: &'a str,
    index: Option<usize>,
}

impl<'a> Place<'a> {
    fn of<R: Row>(first: Option<&R>, name: &'a str) -> Self {
        let index = first.and_then(|row| row.columns().iter().position(|c| c.name() == name));
        Self { name, index }
    }
}

/// Where [`OutboxRecord`]'s fields are in a claim's rows.
#[derive(Debug, Clone)]
struct RecordColumns {
    id: Place<'static>,
    aggregate_type: Place<'static>,
    aggregate_id: Place<'static>,
    event_type: Place<'static>,
    payload: Place<'static>,
    event_version: Place<'static>,
    aggregate_seq: Place<'static>,
    traceparent: Place<'static>,
    seq: Place<'static>,
    attempts: Place<'static>,
    age_at_claim: Place<'static>,
    created_at: Place<'static>,
    partition: Place<'static>,
    /// `extra_0`, `extra_1`, ... as far as the rows have them.
    extra: Vec<Place<'static>>,
}

impl RecordColumns {
    fn of<R: Row>(first: Option<&R>) -> Self {
        let place = |name| Place::of(first, name);
        Self {
            id: place(column::ID),
            aggregate_type: place(column::AGGREGATE_TYPE),
            aggregate_id: place(column::AGGREGATE_ID),
            event_type: place(column::EVENT_TYPE),
            payload: place(column::PAYLOAD),
            event_version: place(column::EVENT_VERSION),
            aggregate_seq: place(column::AGGREGATE_SEQ),
            traceparent: place(column::TRACEPARENT),
            seq: place(column::SEQ),
            attempts: place(column::ATTEMPTS),
            age_at_claim: place("age_at_claim"),
            created_at: place(column::CREATED_AT),
            partition: place("partition"),
            extra: super::extra::NAMES
                .iter()
                .map(|name| place(name))
                .take_while(|place| place.index.is_some())
                .collect(),
        }
    }
}

/// One claimed row, its columns named as [`OutboxRecord`]'s fields.
fn record<R>(row: &R, columns: &RecordColumns) -> Result<OutboxRecord, String>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    usize: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i32: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> f64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> uuid::Uuid: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(OutboxRecord {
        id: id(row, columns.id)?,
        aggregate_type: required(row, columns.aggregate_type)?,
        aggregate_id: required(row, columns.aggregate_id)?,
        event_type: required(row, columns.event_type)?,
        payload: optional(row, columns.payload)?,
        event_version: required(row, columns.event_version)?,
        aggregate_seq: optional(row, columns.aggregate_seq)?,
        traceparent: optional(row, columns.traceparent)?,
        seq: required(row, columns.seq)?,
        attempts: required(row, columns.attempts)?,
        // A measurement, not the row's content: a `created_at` the
        // database cannot subtract gives an unknown (zero) age.
        age_at_claim: optional(row, columns.age_at_claim)?.unwrap_or(0.0),
        // Read where known (a claim may leave it out); a value that is
        // not text (plain SQL may write anything into SQLite's column)
        // is an unknown time, never a reason to park the row.
        created_at: match columns.created_at.index {
            Some(_) => optional(row, columns.created_at).ok().flatten(),
            None => None,
        },
        partition: match columns.partition.index {
            Some(_) => optional(row, columns.partition)?.map(|oid| Partition { oid, name: None }),
            None => None,
        },
        ctid: None,
        extra: columns
            .extra
            .iter()
            .map(|place| optional::<R, String>(row, *place))
            .collect::<Result<_, _>>()?,
    })
}

/// The id: text as the table holds it, or a `uuid` (PostgreSQL claims read
/// it as it is stored, sparing the server a conversion per row) written
/// out as PostgreSQL writes it, in lowercase hyphenated form.
fn id<R>(row: &R, column: Place<'_>) -> Result<String, String>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    usize: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> uuid::Uuid: Decode<'r, R::Database> + Type<R::Database>,
{
    let is_uuid = match column.index {
        Some(index) => row.try_get_raw(index),
        None => row.try_get_raw(column.name),
    }
    .is_ok_and(|value| {
        let found = value.type_info();
        !value.is_null() && !String::compatible(&found) && uuid::Uuid::compatible(&found)
    });
    if is_uuid {
        let id: uuid::Uuid = required(row, column)?;
        Ok(id.hyphenated().to_string())
    } else {
        required(row, column)
    }
}

/// A column that must not be NULL.
fn required<'r, R, T>(row: &'r R, column: Place<'_>) -> Result<T, String>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    usize: ColumnIndex<R>,
    T: Decode<'r, R::Database> + Type<R::Database>,
{
    optional(row, column)?.ok_or_else(|| format!("column `{}` is NULL", column.name))
}

/// A column that may be NULL: `None` then.
fn optional<'r, R, T>(row: &'r R, column: Place<'_>) -> Result<Option<T>, String>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    usize: ColumnIndex<R>,
    T: Decode<'r, R::Database> + Type<R::Database>,
{
    let name = column.name;
    let value = match column.index {
        Some(index) => row.try_get_raw(index),
        None => row.try_get_raw(name),
    }
    .map_err(|error| one_line(format!("column `{name}`: {error}")))?;
    if value.is_null() {
        return Ok(None);
    }
    let found = value.type_info().into_owned();
    if !(found.is_null() || T::compatible(&found)) {
        return Err(format!(
            "column `{name}` holds {}, expected {}",
            found.name(),
            T::type_info().name()
        ));
    }
    T::decode(value).map(Some).map_err(|error| {
        one_line(format!(
            "column `{name}` holds {} that cannot be read: {error}",
            found.name()
        ))
    })
}

/// A column of [`heads`]' rows, found by name.
fn by_name<'r, R, T>(row: &'r R, name: &str) -> Result<T, String>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    usize: ColumnIndex<R>,
    T: Decode<'r, R::Database> + Type<R::Database>,
{
    required(row, Place { name, index: None })
}

fn one_line(text: String) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use sqlx::sqlite::SqlitePoolOptions;

    use super::*;

    /// The claim's columns over one row of literal values.
    async fn decode(values: &str) -> Decoded<OutboxRecord> {
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        let sql = format!(
            "SELECT column1 AS id, column2 AS aggregatetype, column3 AS aggregateid, \
             column4 AS type, column5 AS payload, column6 AS event_version, \
             column7 AS aggregate_seq, column8 AS traceparent, column9 AS seq, \
             column10 AS attempts, column11 AS age_at_claim, column12 AS run_position \
             FROM (VALUES ('good', 'Order', 'a', 'E', '{{}}', 1, 1, NULL, 1, 0, 0.5, 1), ({values}))"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&pool)
            .await
            .unwrap();
        records(&rows, |_, _| Ok(())).unwrap()
    }

    async fn reason(values: &str) -> String {
        let decoded = decode(values).await;
        assert_eq!(decoded.rows.len(), 1, "the good row is read");
        assert_eq!(decoded.undecodable.len(), 1, "{:?}", decoded.rows);
        assert_eq!(decoded.undecodable[0].seq, 2);
        decoded.undecodable[0].reason.clone()
    }

    #[tokio::test]
    async fn each_row_is_read_on_its_own() {
        let decoded = decode("'b', 'Order', 'b', 'E', NULL, 2, NULL, 'tp', 2, 3, NULL, 1").await;
        assert!(decoded.undecodable.is_empty(), "{:?}", decoded.undecodable);
        let second = &decoded.rows[1];
        assert_eq!(
            (
                second.payload.as_deref(),
                second.aggregate_seq,
                second.age_at_claim
            ),
            (None, None, 0.0)
        );
        assert_eq!(decoded.rows[0].age_at_claim, 0.5);
    }

    #[tokio::test]
    async fn a_row_that_cannot_be_read_is_named_with_its_column() {
        assert_eq!(
            reason("'b', 'Order', 'b', 'E', X'7B7D', 1, 1, NULL, 2, 0, 0.0, 1").await,
            "undecodable row: column `payload` holds BLOB, expected TEXT"
        );
        assert_eq!(
            reason("'b', 'Order', 'b', 'E', '{}', 'abc', 1, NULL, 2, 0, 0.0, 1").await,
            "undecodable row: column `event_version` holds TEXT, expected INTEGER"
        );
        assert_eq!(
            reason("'b', 'Order', 'b', 'E', '{}', 1, 1.5, NULL, 2, 0, 0.0, 1").await,
            "undecodable row: column `aggregate_seq` holds REAL, expected INTEGER"
        );
        assert_eq!(
            reason("'b', 'Order', NULL, 'E', '{}', 1, 1, NULL, 2, 0, 0.0, 1").await,
            "undecodable row: column `aggregateid` is NULL"
        );
        let out_of_range =
            reason("'b', 'Order', 'b', 'E', '{}', 4294967296, 1, NULL, 2, 0, 0.0, 1").await;
        assert!(
            out_of_range.starts_with(
                "undecodable row: column `event_version` holds INTEGER that cannot be read: "
            ),
            "{out_of_range}"
        );
        let not_utf8 =
            reason("'b', 'Order', 'b', CAST(X'FF' AS TEXT), '{}', 1, 1, NULL, 2, 0, 0.0, 1").await;
        assert!(
            not_utf8.starts_with("undecodable row: column `type` holds TEXT that cannot be read"),
            "{not_utf8}"
        );
    }
}
