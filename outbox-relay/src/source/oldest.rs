//! The oldest pending rows by `seq`, as MariaDB/MySQL and SQLite read
//! them: within an aggregate that is its order
//! ([`outbox_contract::ordering`]); [`crate::ordering`] then decides what
//! a batch hands over. (PostgreSQL's claim, which locks as it reads, is
//! `postgres/claim.rs`.)

use sqlx::{AssertSqlSafe, Database, Encode, Executor, Type};

use super::AggregateKey;
use super::dialect::ShardScope;

/// With `?` placeholders: the oldest `?` (the last parameter) pending rows
/// that pass `filter` (a condition starting with ` AND `, its parameters
/// first), as `columns`, in `seq` order.
pub(crate) fn oldest_sql(columns: &str, filter: &str) -> String {
    format!(
        "SELECT {columns} FROM outbox \
         WHERE published_at IS NULL AND dead_lettered_at IS NULL{filter} \
         ORDER BY seq LIMIT ?"
    )
}

/// A pending row as MariaDB/MySQL's claim reads it before it locks it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct RunKey {
    pub id: String,
    pub aggregatetype: String,
    pub aggregateid: String,
    pub aggregate_seq: Option<i64>,
    pub seq: i64,
    /// `created_at` as text, where read.
    #[sqlx(default)]
    pub created_at: Option<String>,
}

/// ` AND (aggregatetype, aggregateid) NOT IN (...)` with a `(?, ?)` pair
/// per excluded aggregate (a `VALUES` list with `values`), or nothing.
pub(crate) fn exclusion(excluded: usize, values: bool) -> String {
    if excluded == 0 {
        return String::new();
    }
    let pairs = super::question_mark_pairs(excluded);
    let list = if values {
        format!("VALUES {pairs}")
    } else {
        pairs
    };
    format!(" AND (aggregatetype, aggregateid) NOT IN ({list})")
}

/// Runs `sql` ([`oldest_sql`] with a filter from
/// [`exclusion`], then with `shards` a condition on the shard count and
/// the owned shards).
pub(crate) async fn read_heads<DB>(
    conn: &mut DB::Connection,
    sql: &str,
    excluded: &[AggregateKey],
    shards: Option<&ShardScope>,
    limit: usize,
) -> Result<Vec<DB::Row>, sqlx::Error>
where
    DB: Database,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> u32: Encode<'q, DB> + Type<DB>,
{
    let mut query = sqlx::query(AssertSqlSafe(sql));
    for key in excluded {
        query = query
            .bind(key.aggregate_type.as_str())
            .bind(key.aggregate_id.as_str());
    }
    if let Some(shards) = shards {
        query = query.bind(shards.count);
        for shard in &shards.owned {
            query = query.bind(*shard);
        }
    }
    query.bind(limit as i64).fetch_all(conn).await
}
