//! Fencing: a sharded claim is marked only while this instance still owns
//! the claim's shards under the epochs it claimed them with.
//!
//! A claim reads this instance's shards and their epochs ([`owned_shards`]);
//! the relay hands the batch's messages to the sink only while its own
//! view of the lease still holds them ([`Fencing::send_until`]); the settle reads them again in
//! the claim's transaction and marks nothing when any changed owner
//! meanwhile ([`Fencing::check`], [`SourceError::Fenced`]).

use std::sync::Arc;
use std::time::Instant;

use sqlx::{Database, Decode, Encode, Executor, Row, Type};

use super::SourceError;
use super::shards::Membership;

/// What a sharded claim must still hold when it marks its rows.
pub(crate) struct Fencing {
    /// This instance.
    pub instance: String,
    /// The statement reading its shards at the mark.
    pub at_mark: &'static str,
    /// `(shard, epoch)` pairs held when the batch was claimed.
    pub owned: Vec<(i64, i64)>,
    /// This instance's view of its lease.
    pub membership: Arc<Membership>,
}

impl Fencing {
    /// Until when, as this instance knows it, it holds the claim's shards
    /// under the same epochs: the end of its lease, or an instant already
    /// past once any of them changed owner.
    pub fn send_until(&self) -> Instant {
        self.membership
            .held_until(&self.owned)
            .unwrap_or_else(Instant::now)
    }

    /// Fails with the shards whose owner or epoch changed since the claim.
    pub fn check(&self, now_owned: &[(i64, i64)]) -> Result<(), SourceError> {
        let lost: Vec<i64> = self
            .owned
            .iter()
            .filter(|held| !now_owned.contains(held))
            .map(|(shard, _)| *shard)
            .collect();
        if lost.is_empty() {
            Ok(())
        } else {
            Err(SourceError::Fenced(lost))
        }
    }
}

/// The shards of `instance` and their epochs, as `sql` (one of a
/// dialect's [`super::dialect::ShardStatements`]) selects them.
pub(crate) async fn owned_shards<'c, DB, E>(
    executor: E,
    sql: &'static str,
    instance: &str,
) -> Result<Vec<(i64, i64)>, sqlx::Error>
where
    DB: Database,
    DB::Arguments: sqlx::IntoArguments<DB>,
    E: Executor<'c, Database = DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i32: Decode<'q, DB> + Type<DB>,
    for<'q> i64: Decode<'q, DB> + Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    let rows = sqlx::query(sql).bind(instance).fetch_all(executor).await?;
    rows.iter()
        .map(|row| Ok((i64::from(row.try_get::<i32, _>(0)?), row.try_get(1)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_epoch_fences_the_mark() {
        let fencing = Fencing {
            instance: "me".into(),
            at_mark: "",
            owned: vec![(0, 3), (1, 7)],
            membership: Arc::default(),
        };
        assert!(fencing.check(&[(0, 3), (1, 7), (2, 1)]).is_ok());
        match fencing.check(&[(0, 3), (1, 8)]) {
            Err(SourceError::Fenced(lost)) => assert_eq!(lost, [1]),
            other => panic!("expected fencing, got {other:?}"),
        }
    }
}
