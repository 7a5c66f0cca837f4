//! Settling a claim: once the sink has answered, the claim re-checks its
//! shards (fencing), marks the published rows (or deletes them), records
//! the failures and commits, all in the claim's transaction where it holds
//! one; nothing is marked when any step fails.

use super::FastSet as HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, Database, Encode, Pool, Transaction, Type};

use super::dialect::{Connection, Dialect};
use super::fencing::Fencing;
use super::runs::Settled;
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
    /// Told where each aggregate continues once the settle committed.
    pub settled: Option<Arc<Settled>>,
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
        if let Some(settled) = &this.settled {
            settled_rows(settled, &this.records, settlement);
        }
        Ok(())
    }
}

/// Records in `settled` where each aggregate of a committed settlement
/// continues.
fn settled_rows(settled: &Settled, records: &[OutboxRecord], settlement: &Settlement) {
    // Published lists each row at most once: as many as the claim's rows
    // is every row (the usual case), with no set of ids to build.
    if settlement.published.len() == records.len() {
        settled.record(records, |_| false);
        return;
    }
    let done: HashSet<&str> = settlement
        .published
        .iter()
        .map(String::as_str)
        .chain(
            settlement
                .failed
                .iter()
                .filter(|row| row.dead_letter)
                .map(|row| row.id.as_str()),
        )
        .collect();
    settled.record(records, |record| !done.contains(record.id.as_str()));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::test_record;
    use crate::source::{AggregateKey, FailedRow};

    fn numbered(id: &str, aggregate: &str, aggregate_seq: i64) -> OutboxRecord {
        OutboxRecord {
            aggregate_seq: Some(aggregate_seq),
            ..test_record(id, aggregate, 0)
        }
    }

    fn last(settled: &Settled, aggregate: &str) -> Option<i64> {
        settled.last(&AggregateKey::of(&test_record("", aggregate, 0)))
    }

    /// An aggregate continues after its last row settled before the first
    /// that stays pending; a dead-lettered row counts as settled.
    #[test]
    fn each_aggregate_continues_after_its_settled_rows() {
        let records = [
            numbered("a1", "a", 1),
            numbered("b1", "b", 1),
            numbered("a2", "a", 2),
            numbered("b2", "b", 2),
            numbered("a3", "a", 3),
            numbered("c1", "c", 1),
            numbered("c2", "c", 2),
        ];
        let failed = |id: &str, dead_letter| FailedRow {
            id: id.into(),
            error: "refused".into(),
            dead_letter,
        };
        let settled = Settled::default();
        let settlement = Settlement {
            published: ["a1", "b1", "b2", "c2"].map(String::from).to_vec(),
            failed: vec![failed("a2", false), failed("c1", true)],
        };
        settled_rows(&settled, &records, &settlement);
        assert_eq!(last(&settled, "a"), Some(1), "a2 stays pending");
        assert_eq!(last(&settled, "b"), Some(2));
        assert_eq!(last(&settled, "c"), Some(2), "c1 is dead-lettered");

        let settled = Settled::default();
        let every = Settlement {
            published: records.iter().map(|record| record.id.clone()).collect(),
            failed: Vec::new(),
        };
        settled_rows(&settled, &records, &every);
        assert_eq!(last(&settled, "a"), Some(3));
        assert_eq!(last(&settled, "c"), Some(2));
    }
}
