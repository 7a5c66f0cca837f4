//! The ownership statements every database runs alike on the shard table
//! (`outbox_relay_shard`) and the instance table (`outbox_relay_instance`),
//! in its dialect's words; a dialect's [`super::ShardStore`] adds the ones
//! that differ (creating the shard rows, renewing, taking over, ending
//! sessions).

use std::time::Duration;

use sqlx::{AssertSqlSafe, Database, Decode, Encode, Executor, IntoArguments, Pool, Type};

use super::super::SourceError;
use super::super::dialect::Dialect;

/// Fails when shard rows beyond `count` exist (instances disagree on the
/// shard count), once the rows `0..count` are created.
pub(crate) async fn check_count<DB>(pool: &Pool<DB>, count: u32) -> Result<(), SourceError>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> i32: Decode<'q, DB> + Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let highest: Option<i32> = sqlx::query_scalar("SELECT MAX(shard) FROM outbox_relay_shard")
        .fetch_one(pool)
        .await?;
    match highest {
        Some(highest) if i64::from(highest) + 1 > i64::from(count) => {
            Err(SourceError::ShardCount {
                configured: count,
                found: i64::from(highest) + 1,
            })
        }
        _ => Ok(()),
    }
}

/// Registers `instance` for `lease` with `register` (parameters: the
/// instance, the lease as [`Dialect::age`] binds it), forgets expired
/// instances and returns the number of live ones.
pub(crate) async fn heartbeat<D: Dialect>(
    pool: &Pool<D::Db>,
    register: &str,
    instance: &str,
    lease: Duration,
) -> Result<usize, SourceError>
where
    for<'c> &'c mut <D::Db as Database>::Connection: Executor<'c, Database = D::Db>,
    <D::Db as Database>::Arguments: IntoArguments<D::Db>,
    for<'q> &'q str: Encode<'q, D::Db> + Type<D::Db>,
    for<'q> i64: Decode<'q, D::Db> + Type<D::Db>,
    usize: sqlx::ColumnIndex<<D::Db as Database>::Row>,
{
    sqlx::query(AssertSqlSafe(register))
        .bind(instance)
        .bind(D::age(lease))
        .execute(pool)
        .await?;
    sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM outbox_relay_instance WHERE lease_until < {}",
        D::NOW
    )))
    .execute(pool)
    .await?;
    let live: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox_relay_instance")
        .fetch_one(pool)
        .await?;
    Ok(live as usize)
}

/// Gives up every shard of `instance` and unregisters it.
pub(crate) async fn leave<D: Dialect>(pool: &Pool<D::Db>, instance: &str) -> Result<(), SourceError>
where
    for<'c> &'c mut <D::Db as Database>::Connection: Executor<'c, Database = D::Db>,
    <D::Db as Database>::Arguments: IntoArguments<D::Db>,
    for<'q> &'q str: Encode<'q, D::Db> + Type<D::Db>,
{
    let owner = D::PLACEHOLDERS.nth(1);
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE outbox_relay_shard SET owner = NULL, lease_until = NULL WHERE owner = {owner}"
    )))
    .bind(instance)
    .execute(pool)
    .await?;
    sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM outbox_relay_instance WHERE id = {owner}"
    )))
    .bind(instance)
    .execute(pool)
    .await?;
    Ok(())
}
