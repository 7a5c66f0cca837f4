//! Settling a claim: once the sink has answered, the claim re-checks its
//! shards (fencing), marks the published rows (or deletes them), records
//! the failures and commits, all in the claim's transaction where it holds
//! one; nothing is marked when any step fails.

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, Database, Encode, Pool, Transaction, Type};

use super::dialect::{Connection, Dialect};
use super::fencing::Fencing;
use super::{Claim, FailedRow, Settlement, SharedStatements, SourceError};
use crate::record::OutboxRecord;

/// A claim of a [`super::SqlSource`].
pub(crate) struct SqlClaim<D: Dialect> {
    /// The transaction holding the rows, or `None` where the settle opens
    /// one of its own ([`Dialect::HOLDS_CLAIMS`]).
    pub txn: Option<Transaction<'static, D::Db>>,
    pub pool: Pool<D::Db>,
    pub records: Vec<OutboxRecord>,
    /// See [`super::InFlight::held`].
    pub held: Vec<super::AggregateKey>,
    pub delete_on_publish: bool,
    /// See [`Dialect::marks_by_creation_time`].
    pub mark_by_time: bool,
    pub fencing: Option<Fencing>,
}

#[async_trait]
impl<D: SharedStatements> Claim for SqlClaim<D> {
    fn records(&self) -> &[OutboxRecord] {
        &self.records
    }

    fn in_flight(&self) -> super::InFlight {
        super::InFlight {
            held: self.held.clone(),
            ..super::InFlight::of(&self.records)
        }
    }

    fn truncate(&mut self, len: usize) {
        self.records.truncate(len);
    }

    fn send_until(&self) -> Option<std::time::Instant> {
        self.fencing.as_ref().map(Fencing::send_until)
    }

    async fn settle(self: Box<Self>, settlement: &Settlement) -> Result<(), SourceError> {
        let this = *self;
        let mut txn = match this.txn {
            Some(txn) => txn,
            None if settlement.is_empty() => return Ok(()),
            None => this.pool.begin().await?,
        };
        if let Some(fencing) = &this.fencing {
            fencing
                .check(&D::owned_shards(&mut *txn, fencing.at_mark, &fencing.instance).await?)?;
        }
        if !settlement.published.is_empty() {
            D::Marking::mark_published(
                &mut txn,
                &settlement.published,
                &this.records,
                this.mark_by_time,
                this.delete_on_publish,
            )
            .await?;
        }
        if !settlement.failed.is_empty() {
            D::Marking::record_failures(&mut txn, &settlement.failed).await?;
        }
        txn.commit().await?;
        Ok(())
    }
}

/// How a dialect marks a settled claim's rows, in the claim's transaction.
#[async_trait]
pub trait Marking<D: Dialect> {
    /// Marks the rows `ids` published, or deletes them with `delete`;
    /// `records` are the claim's rows (what the dialect may need beyond
    /// the ids), `by_time` the dialect's
    /// [`Dialect::marks_by_creation_time`].
    async fn mark_published(
        conn: &mut Connection<D>,
        ids: &[String],
        records: &[OutboxRecord],
        by_time: bool,
        delete: bool,
    ) -> Result<(), SourceError>;

    /// Adds a failed attempt with its error to each row, parking those
    /// marked dead-lettered.
    async fn record_failures(
        conn: &mut Connection<D>,
        failed: &[FailedRow],
    ) -> Result<(), SourceError>;
}

/// Marking by `id IN (?, ...)` lists of at most `CHUNK` ids, and one
/// statement per failure, timed by [`Dialect::NOW`].
pub struct IdLists<const CHUNK: usize>;

#[async_trait]
impl<D: Dialect, const CHUNK: usize> Marking<D> for IdLists<CHUNK>
where
    for<'c> &'c mut Connection<D>: sqlx::Executor<'c, Database = D::Db>,
    <D::Db as Database>::Arguments: sqlx::IntoArguments<D::Db>,
    for<'q> &'q str: Encode<'q, D::Db> + Type<D::Db>,
    for<'q> bool: Encode<'q, D::Db> + Type<D::Db>,
{
    async fn mark_published(
        conn: &mut Connection<D>,
        ids: &[String],
        _records: &[OutboxRecord],
        _by_time: bool,
        delete: bool,
    ) -> Result<(), SourceError> {
        let action = if delete {
            "DELETE FROM outbox".to_owned()
        } else {
            format!("UPDATE outbox SET published_at = {}", D::NOW)
        };
        for ids in ids.chunks(CHUNK) {
            let sql = format!(
                "{action} WHERE id IN ({})",
                super::question_marks(ids.len())
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for id in ids {
                query = query.bind(id.as_str());
            }
            query.execute(&mut *conn).await?;
        }
        Ok(())
    }

    async fn record_failures(
        conn: &mut Connection<D>,
        failed: &[FailedRow],
    ) -> Result<(), SourceError> {
        let sql = format!(
            "UPDATE outbox SET attempts = attempts + 1, last_error = ?, \
             dead_lettered_at = CASE WHEN ? THEN {} END WHERE id = ?",
            D::NOW
        );
        for failed in failed {
            sqlx::query(AssertSqlSafe(sql.as_str()))
                .bind(failed.error.as_str())
                .bind(failed.dead_letter)
                .bind(failed.id.as_str())
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }
}
