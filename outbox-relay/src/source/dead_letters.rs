//! Dead letters: rows parked with their error, listed by `status` and made
//! pending again by a re-drive.
//!
//! A row is parked when the sink refuses it for good (at the settle, see
//! `source/settle.rs`) or when the claim cannot read it ([`park`], see
//! `source/decode.rs`).

use sqlx::{AssertSqlSafe, Encode, Type};

use super::SourceError;
use super::decode::Undecodable;
use super::dialect::{Connection, Dialect, RowsAffected};

/// Builds the `WHERE` filter of a re-drive: `dead_lettered_at IS NOT NULL`
/// plus an id list (compared as `id_text`, the id as text) and an aggregate
/// type when given, with `placeholder(n)` giving the n-th bind placeholder
/// (1-based).
pub(crate) fn redrive_filter(
    id_text: &str,
    ids: usize,
    aggregate_type: bool,
    placeholder: impl Fn(usize) -> String,
) -> String {
    let mut filter = "dead_lettered_at IS NOT NULL".to_owned();
    let mut next = 1;
    if ids > 0 {
        let list: Vec<String> = (next..next + ids).map(&placeholder).collect();
        filter.push_str(&format!(" AND {id_text} IN ({})", list.join(", ")));
        next += ids;
    }
    if aggregate_type {
        filter.push_str(&format!(" AND aggregatetype = {}", placeholder(next)));
    }
    filter
}

/// The statement that parks a row the claim cannot read, while it is still
/// pending, by `seq` (parameters: the reason, the `seq`).
fn park_sql<D: Dialect>() -> String {
    format!(
        "UPDATE outbox SET attempts = attempts + 1, last_error = {}, dead_lettered_at = {} \
         WHERE seq = {} AND published_at IS NULL AND dead_lettered_at IS NULL",
        D::PLACEHOLDERS.nth(1),
        D::NOW,
        D::PLACEHOLDERS.nth(2),
    )
}

/// Parks each of `rows` (dead-lettered with its reason, see [`park_sql`])
/// and logs it; returns how many rows were parked.
pub(crate) async fn park<D: Dialect>(
    conn: &mut Connection<D>,
    rows: &[Undecodable],
) -> Result<u64, SourceError>
where
    for<'c> &'c mut Connection<D>: sqlx::Executor<'c, Database = D::Db>,
    <D::Db as sqlx::Database>::Arguments: sqlx::IntoArguments<D::Db>,
    for<'q> &'q str: Encode<'q, D::Db> + Type<D::Db>,
    for<'q> i64: Encode<'q, D::Db> + Type<D::Db>,
{
    if rows.is_empty() {
        return Ok(0);
    }
    let sql = park_sql::<D>();
    let mut parked = 0;
    for row in rows {
        parked += sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(row.reason.as_str())
            .bind(row.seq)
            .execute(&mut *conn)
            .await?
            .rows_affected();
    }
    rows.iter().for_each(Undecodable::log);
    Ok(parked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redrive_filters_name_their_parameters() {
        assert_eq!(
            redrive_filter("id", 0, false, |_| "?".into()),
            "dead_lettered_at IS NOT NULL"
        );
        assert_eq!(
            redrive_filter("id::text", 2, true, |n| format!("${n}")),
            "dead_lettered_at IS NOT NULL AND id::text IN ($1, $2) AND aggregatetype = $3"
        );
    }

    #[test]
    fn parking_takes_only_rows_still_pending() {
        use crate::source::{postgres::PgDialect, sqlite::SqliteDialect};
        assert_eq!(
            park_sql::<PgDialect>(),
            "UPDATE outbox SET attempts = attempts + 1, last_error = $1, dead_lettered_at = now() \
             WHERE seq = $2 AND published_at IS NULL AND dead_lettered_at IS NULL"
        );
        assert_eq!(
            park_sql::<SqliteDialect>(),
            "UPDATE outbox SET attempts = attempts + 1, last_error = ?, \
             dead_lettered_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') \
             WHERE seq = ? AND published_at IS NULL AND dead_lettered_at IS NULL"
        );
    }
}
