//! The statements every SQL database runs alike, through sqlx's generic
//! API, with the text its [`Dialect`] gives: the table check, the shard
//! read of claims and settles, retention, backlog, `status` and re-drive.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, Pool};

use super::dialect::{Connection, DbRow, Dialect, RowsAffected};
use super::fencing;
use super::status::StatusRows;
use super::{Backlog, DEAD_LETTERS_SHOWN, SourceError, Status, owners_or_none, redrive_filter};

/// What [`super::SqlSource`] and its claims run on any database. Every
/// [`Dialect`] whose sqlx driver executes statements on its connections
/// and binds and reads the outbox's column types has it: this is the one
/// place those driver capabilities are stated.
#[async_trait]
pub trait SharedStatements: Dialect {
    /// Fails when the outbox table cannot be read.
    async fn check_table(pool: &Pool<Self::Db>) -> Result<(), SourceError>;

    /// The shards `instance` owns with their epochs, read by `sql`
    /// ([`super::dialect::ShardStatements`]).
    async fn owned_shards(
        conn: &mut Connection<Self>,
        sql: &'static str,
        instance: &str,
    ) -> Result<Vec<(i64, i64)>, sqlx::Error>;

    /// Deletes up to `limit` rows published more than `older_than` ago.
    async fn delete_published(
        pool: &Pool<Self::Db>,
        older_than: Duration,
        limit: u64,
    ) -> Result<u64, SourceError>;

    /// Pending rows, the oldest one's age, and dead letters.
    async fn backlog(pool: &Pool<Self::Db>) -> Result<Backlog, SourceError>;

    /// What `status` shows.
    async fn status(pool: &Pool<Self::Db>) -> Result<Status, SourceError>;

    /// Makes up to `limit` dead letters pending again: those of `ids` (all
    /// when empty) of `aggregate_type` (any when `None`).
    async fn redrive(
        pool: &Pool<Self::Db>,
        ids: &[String],
        aggregate_type: Option<&str>,
        limit: u64,
    ) -> Result<u64, SourceError>;
}

#[async_trait]
impl<D: Dialect> SharedStatements for D
where
    for<'c> &'c mut Connection<D>: sqlx::Executor<'c, Database = D::Db>,
    <D::Db as sqlx::Database>::Arguments: sqlx::IntoArguments<D::Db>,
    for<'q> &'q str: sqlx::Encode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> i64: sqlx::Encode<'q, D::Db> + sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> i32: sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> f64: sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    for<'q> String: sqlx::Decode<'q, D::Db> + sqlx::Type<D::Db>,
    usize: sqlx::ColumnIndex<DbRow<D>>,
    for<'a> &'a str: sqlx::ColumnIndex<DbRow<D>>,
{
    async fn check_table(pool: &Pool<D::Db>) -> Result<(), SourceError> {
        sqlx::query("SELECT 1 FROM outbox LIMIT 1")
            .fetch_optional(pool)
            .await?;
        Ok(())
    }

    async fn owned_shards(
        conn: &mut Connection<D>,
        sql: &'static str,
        instance: &str,
    ) -> Result<Vec<(i64, i64)>, sqlx::Error> {
        fencing::owned_shards(conn, sql, instance).await
    }

    async fn delete_published(
        pool: &Pool<D::Db>,
        older_than: Duration,
        limit: u64,
    ) -> Result<u64, SourceError> {
        let deleted = sqlx::query(D::DELETE_PUBLISHED)
            .bind(D::age(older_than))
            .bind(limit as i64)
            .execute(pool)
            .await?;
        Ok(deleted.rows_affected())
    }

    async fn backlog(pool: &Pool<D::Db>) -> Result<Backlog, SourceError> {
        let (pending, oldest_pending_age_seconds): (i64, Option<f64>) =
            sqlx::query_as(D::BACKLOG).fetch_one(pool).await?;
        let dead_letters: i64 = sqlx::query_scalar(D::DEAD_LETTER_COUNT)
            .fetch_one(pool)
            .await?;
        Ok(Backlog {
            pending,
            oldest_pending_age_seconds,
            dead_letters,
        })
    }

    async fn status(pool: &Pool<D::Db>) -> Result<Status, SourceError> {
        let published: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM outbox WHERE published_at IS NOT NULL")
                .fetch_one(pool)
                .await?;
        let pending_by_type = sqlx::query(D::PENDING_BY_TYPE)
            .fetch_all(pool)
            .await?
            .iter()
            .map(D::StatusRows::type_backlog)
            .collect::<Result<_, _>>()?;
        let shard_owners = match D::SHARDS {
            Some(shards) => owners_or_none(sqlx::query_as(shards.owners).fetch_all(pool).await)?,
            None => Vec::new(),
        };
        let dead_letter_rows = sqlx::query(D::DEAD_LETTERS)
            .bind(DEAD_LETTERS_SHOWN)
            .fetch_all(pool)
            .await?
            .iter()
            .map(D::StatusRows::dead_letter)
            .collect::<Result<_, _>>()?;
        Ok(Status {
            backlog: Self::backlog(pool).await?,
            published,
            pending_by_type,
            dead_letter_rows,
            shard_owners,
        })
    }

    async fn redrive(
        pool: &Pool<D::Db>,
        ids: &[String],
        aggregate_type: Option<&str>,
        limit: u64,
    ) -> Result<u64, SourceError> {
        let filter = redrive_filter(D::ID_AS_TEXT, ids.len(), aggregate_type.is_some(), |n| {
            D::PLACEHOLDERS.nth(n)
        });
        let mut query = sqlx::query(AssertSqlSafe(D::redrive_sql(&filter, limit)));
        for id in ids {
            query = query.bind(id.as_str());
        }
        if let Some(aggregate_type) = aggregate_type {
            query = query.bind(aggregate_type);
        }
        Ok(query.execute(pool).await?.rows_affected())
    }
}
