//! SQLite, the embedded default: reads pending rows without holding a
//! transaction (so the application's writers never wait on the broker),
//! settles them in one short transaction, and polls for new rows. One relay
//! per database file.
//!
//! A column's declared type is only an affinity here: a row may hold a BLOB
//! payload (which the `json_valid` check accepts when its bytes are JSON),
//! text in `event_version` or a BLOB key. The claim reads each row on its
//! own and dead-letters those it cannot read (see `source/decode.rs`);
//! `status` shows such values as SQL literals.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions, SqliteRow,
};
use sqlx::{Connection, Row, Sqlite};

use super::dead_letters::park;
use super::decode::holes;
use super::decode::{self, Undecodable};
use super::dialect::{ClaimRequest, ClaimedRows, Dialect};
use super::extra;
use super::oldest::{exclusion, oldest_sql, read_heads};
use super::{DeadLetter, IdLists, SourceError, SourceOptions, SqlSource, StatusRows, TypeBacklog};
use crate::database::DatabaseUrl;
use crate::ordering;

/// The columns of a claimed row, named as [`OutboxRecord`](crate::record::OutboxRecord)'s fields.
const COLUMNS: &str = "id, aggregatetype, aggregateid, type, payload, event_version, \
     aggregate_seq, traceparent, seq, attempts, \
     (julianday('now') - julianday(created_at)) * 86400.0 AS age_at_claim, created_at";

/// Rows per statement, far below SQLite's bind-parameter limit.
const CHUNK: usize = 500;

/// Pending rows of an SQLite database file.
pub type SqliteSource = SqlSource<SqliteDialect>;

/// SQLite's part of a [`SqliteSource`]: the columns its claims read.
pub struct SqliteDialect {
    /// The columns a claim reads, the extra ones included.
    columns: String,
}

#[async_trait]
impl Dialect for SqliteDialect {
    type Db = Sqlite;
    type Age = String;
    type Marking = IdLists<CHUNK>;
    type StatusRows = Self;

    /// Opens the database file; it must exist (`?mode=rwc` creates it).
    async fn connect(
        url: &DatabaseUrl,
        options: &SourceOptions,
    ) -> Result<(SqlitePool, Self), sqlx::Error> {
        let connect_options =
            SqliteConnectOptions::from_str(url.as_str())?.busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(connect_options)
            .await?;
        let extra = extra::select(&pool, &options.extra, &extra::SQLITE).await?;
        let columns = format!("{COLUMNS}{}", extra.items);
        Ok((pool, Self { columns }))
    }

    const HOLDS_CLAIMS: bool = false;

    /// The oldest pending rows by `seq`, each read on its own: one that
    /// cannot be read is dead-lettered at once and cuts its aggregate's run
    /// (see [`crate::ordering`]).
    async fn claim(
        source: &SqliteSource,
        conn: &mut SqliteConnection,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimedRows, SourceError> {
        let sql = oldest_sql(
            &source.dialect().columns,
            &exclusion(request.excluded.len(), true),
        );
        loop {
            let rows =
                read_heads::<Sqlite>(conn, &sql, request.excluded, None, request.limit).await?;
            let decoded = decode::records(&rows, |_, _| Ok(()))?;
            let dead_lettered = dead_letter(conn, &decoded.undecodable).await?;
            let ordered = ordering::claim_order(decoded.rows, &holes(decoded.undecodable));
            ordering::report(&ordered.inversions);
            // Claim again at once rather than after a poll interval when
            // only rows that cannot be read were found; each round parks
            // at least one, so this ends.
            if !ordered.records.is_empty() || dead_lettered == 0 {
                return Ok(ClaimedRows {
                    records: ordered.records,
                    held: ordered.cut,
                });
            }
        }
    }

    /// SQLite's `now` in the format of the table's `created_at` default.
    const NOW: &'static str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

    const DELETE_PUBLISHED: &'static str = "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox \
         WHERE published_at IS NOT NULL \
         AND published_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?) \
         ORDER BY published_at LIMIT ?)";

    fn age(older_than: Duration) -> String {
        format!("-{:.3} seconds", older_than.as_secs_f64())
    }

    const BACKLOG: &'static str = "SELECT COUNT(*), (julianday('now') - julianday(MIN(created_at))) * 86400.0 \
         FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL";

    const DEAD_LETTER_COUNT: &'static str =
        "SELECT COUNT(*) FROM outbox WHERE dead_lettered_at IS NOT NULL";

    /// The aggregate type as text whatever it holds (`CASE typeof`, read lossily).
    const PENDING_BY_TYPE: &'static str = "SELECT CASE typeof(aggregatetype) \
           WHEN 'text' THEN aggregatetype ELSE quote(aggregatetype) END AS aggregatetype, \
           COUNT(*) AS pending, \
           (julianday('now') - julianday(MIN(created_at))) * 86400.0 AS oldest_pending_age_seconds \
         FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL \
         GROUP BY aggregatetype ORDER BY 2 DESC, 1 LIMIT 50";

    /// Every column as text whatever it holds (`CASE typeof`, read lossily).
    const DEAD_LETTERS: &'static str = "SELECT \
           CASE typeof(id) WHEN 'text' THEN id ELSE quote(id) END AS id, \
           CASE typeof(aggregatetype) WHEN 'text' THEN aggregatetype ELSE quote(aggregatetype) END \
             AS aggregatetype, \
           CASE typeof(aggregateid) WHEN 'text' THEN aggregateid ELSE quote(aggregateid) END \
             AS aggregateid, \
           CASE typeof(type) WHEN 'text' THEN type ELSE quote(type) END AS type, \
           CAST(attempts AS INTEGER) AS attempts, CAST(last_error AS TEXT) AS last_error \
         FROM outbox WHERE dead_lettered_at IS NOT NULL ORDER BY dead_lettered_at LIMIT ?";

    const ID_AS_TEXT: &'static str = "id";

    fn redrive_sql(filter: &str, limit: u64) -> String {
        format!(
            "UPDATE outbox SET dead_lettered_at = NULL, attempts = 0 \
             WHERE seq IN (SELECT seq FROM outbox WHERE {filter} LIMIT {limit})"
        )
    }
}

/// Columns that may hold any type are read as text whatever they hold.
impl StatusRows<Sqlite> for SqliteDialect {
    fn type_backlog(row: &SqliteRow) -> Result<TypeBacklog, sqlx::Error> {
        Ok(TypeBacklog {
            aggregate_type: lossy(row, "aggregatetype")?,
            pending: row.try_get("pending")?,
            oldest_pending_age_seconds: row.try_get("oldest_pending_age_seconds")?,
        })
    }

    fn dead_letter(row: &SqliteRow) -> Result<DeadLetter, sqlx::Error> {
        let last_error: Option<Vec<u8>> = row.try_get("last_error")?;
        Ok(DeadLetter {
            id: lossy(row, "id")?,
            aggregate_type: lossy(row, "aggregatetype")?,
            aggregate_id: lossy(row, "aggregateid")?,
            event_type: lossy(row, "type")?,
            attempts: row.try_get::<Option<i64>, _>("attempts")?.unwrap_or(0) as i32,
            last_error: last_error.map(|text| String::from_utf8_lossy(&text).into_owned()),
        })
    }
}

/// Dead-letters rows that cannot be read, in a transaction of their own;
/// returns how many rows it parked.
async fn dead_letter(
    conn: &mut SqliteConnection,
    undecodable: &[Undecodable],
) -> Result<u64, SourceError> {
    if undecodable.is_empty() {
        return Ok(0);
    }
    let mut txn = conn.begin().await?;
    let parked = park::<SqliteDialect>(&mut txn, undecodable).await?;
    txn.commit().await?;
    Ok(parked)
}

/// A column read as text whatever it holds (`CASE typeof(..) WHEN 'text'
/// .. ELSE quote(..)`: a value that is not text as its SQL literal,
/// `X'00FF'`, `42`), with bytes that are not UTF-8 replaced.
fn lossy(row: &SqliteRow, column: &str) -> Result<String, sqlx::Error> {
    let bytes: Option<Vec<u8>> = row.try_get(column)?;
    Ok(String::from_utf8_lossy(&bytes.unwrap_or_default()).into_owned())
}
