//! The PostgreSQL claim: the oldest pending rows by `seq`, locked and read,
//! in the order [`crate::ordering`] hands them over.

use super::super::FastMap;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnection, PgRow};
use sqlx::{AssertSqlSafe, Row};

use super::super::SourceError;
use super::super::dead_letters::park;
use super::super::decode;
use super::super::dialect::{ClaimRequest, ClaimedRows};
use super::super::shards::ShardConfig;
use super::PgDialect;
use crate::ordering::{self, Hole};
use crate::record::OutboxRecord;
use crate::source::extra::ExtraSelect;

/// The select items that plan the rest of a transaction by index alone:
/// no sort, no hash or merge join, no sequential scan. The pending and
/// aggregate indexes give every order the claim's statements need, and
/// the primary key finds every row its marks name. Without statistics (a
/// table or a day's partition never analyzed, or one that grew since a
/// statement's plan was made, which a partitioned outbox's generic plans
/// keep) the planner may otherwise scan every pending row and sort it, or
/// hash the whole table or partition to mark a batch, once per claim.
///
/// JIT compilation is off too: a statement that cannot avoid a sequential
/// scan then costs more than `jit_above_cost`, and compiling it would take
/// hundreds of milliseconds of a claim that takes a few.
macro_rules! planned_by_index {
    () => {
        "set_config('enable_sort', 'off', true), set_config('enable_hashjoin', 'off', true), \
         set_config('enable_mergejoin', 'off', true), set_config('enable_seqscan', 'off', true), \
         set_config('jit', 'off', true)"
    };
}
pub(super) use planned_by_index;

/// Sets the claim's transaction-local timeouts. Rows another claim holds
/// are waited for, never skipped, for at most a few seconds: one instance
/// leaves its own open claim's aggregates out, so this waits only for a
/// second instance misconfigured without shards; with shards, for rows a
/// previous owner still holds. With shards, a paused relay's claim ends
/// after the batch timeout.
pub(super) async fn begin(
    conn: &mut PgConnection,
    sharding: Option<&ShardConfig>,
    ahead: bool,
) -> Result<bool, sqlx::Error> {
    let idle_timeout = sharding.map(|config| config.batch_timeout.as_millis().to_string());
    // Partition maintenance takes the outbox's exclusive lock only once it
    // holds DROP_LOCK exclusively, which waits for the claims open now;
    // meanwhile a claim waits here, before it locks anything of the
    // outbox, and a claim ahead yields, so that the claim it would follow
    // can settle. One round trip either way.
    //
    // The claim's statements find their rows through indexes alone (see
    // `planned_by_index`).
    const SETTINGS: &str = concat!(
        "SELECT set_config('idle_in_transaction_session_timeout', \
           coalesce($1, current_setting('idle_in_transaction_session_timeout')), true), \
         set_config('lock_timeout', '5s', true), ",
        planned_by_index!()
    );
    let key = crate::partitions::outbox_lock_key(2);
    if ahead {
        let sql = format!("{SETTINGS}, pg_try_advisory_xact_lock_shared({key}) AS locked");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(idle_timeout)
            .bind(crate::partitions::DROP_LOCK)
            .fetch_one(conn)
            .await?;
        row.try_get("locked")
    } else {
        let sql = format!("{SETTINGS}, pg_advisory_xact_lock_shared({key})");
        sqlx::query(AssertSqlSafe(sql))
            .bind(idle_timeout)
            .bind(crate::partitions::DROP_LOCK)
            .execute(conn)
            .await?;
        Ok(true)
    }
}

/// Claims up to `request.limit` pending rows, leaving out the excluded
/// aggregates, those the other open claim holds, and the rows of that
/// claim (`in_flight`), which a plain `FOR UPDATE` would otherwise wait for.
/// The filters run below the row locks, so left-out rows are not locked.
///
/// One statement locks and reads the oldest pending rows by `seq`: within
/// an aggregate that is its order ([`outbox_contract::ordering`]), so the
/// batch is those rows as [`ordering::claim_order`] hands them over. An
/// aggregate it cuts at a hole (a row dead-lettered because it cannot be
/// read) keeps later rows locked, untaken, until the claim ends: the claim
/// reports it as held, so that a claim ahead leaves it out instead of
/// waiting for them.
pub(super) async fn claim(
    conn: &mut PgConnection,
    request: &ClaimRequest<'_>,
    read_: &Read,
    window: Option<&Window>,
) -> Result<ClaimedRows, SourceError> {
    let bound = match window {
        Some(window) => window.current(conn).await?,
        None => Bound::default(),
    };
    let mut head = head_rows(conn, request, read_, &bound).await?;
    // Nothing found: maybe because a row became pending before the days
    // the window names and reopened it since it was read (the statement
    // then matches nothing), or maintenance settled more days. Read it
    // again and, if it changed, the oldest rows again.
    if head.is_empty()
        && let Some(window) = window
    {
        let fresh = window.reload(conn).await?;
        if fresh.version != bound.version && bound.low.is_some() {
            head = head_rows(conn, request, read_, &fresh).await?;
        }
    }
    let (records, holes) = read(conn, &head, read_).await?;
    let ordered = ordering::claim_order(records, &holes);
    ordering::report(&ordered.inversions);
    Ok(ClaimedRows {
        records: ordered.records,
        held: ordered.cut,
    })
}

/// [`head_sql`]'s rows for `request`, from the days `bound` names.
async fn head_rows(
    conn: &mut PgConnection,
    request: &ClaimRequest<'_>,
    read_: &Read,
    bound: &Bound,
) -> Result<Vec<PgRow>, SourceError> {
    let excluded = || request.excluded.iter().chain(&request.in_flight.held);
    let types: Vec<&str> = excluded().map(|key| key.aggregate_type.as_str()).collect();
    let ids: Vec<&str> = excluded().map(|key| key.aggregate_id.as_str()).collect();
    let filter = match &request.shards {
        None => bound.filter(),
        Some(_) => format!("{} AND {SHARD_OF_ROW} = ANY($6::bigint[])", bound.filter()),
    };
    let sql = head_sql(&filter, read_);
    let mut query = sqlx::query(AssertSqlSafe(sql))
        .bind(request.limit as i64)
        .bind(&types)
        .bind(&ids)
        .bind(&request.in_flight.seqs);
    if let Some(shards) = &request.shards {
        query = query.bind(i64::from(shards.count)).bind(&shards.owned);
    }
    let rows = query.fetch_all(&mut *conn).await?;
    Ok(rows)
}

/// The days the claims of a partitioned outbox read: from the claim
/// window's lower bound on (`outbox_claim_window`, migration 0011), the
/// days before it settled by partition maintenance, as last read.
#[derive(Debug, Default)]
pub(crate) struct Window {
    /// The window as last read, and when.
    last: std::sync::Mutex<Option<(Bound, Instant)>>,
}

/// How long a claim trusts the window it read last, under a load that
/// never leaves a claim empty (an empty claim reads it again): days
/// settled since are left out after this.
const WINDOW_READ_AGAIN: Duration = Duration::from_secs(60);

/// The claim window as read: its version and lower bound.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Bound {
    version: i64,
    /// The lower bound as a timestamp literal (UTC); `None`: every day.
    low: Option<String>,
}

impl Bound {
    /// The oldest rows' filter: rows created from the bound on, while the
    /// window is still the one read, so that a row which became pending
    /// before the bound (its trigger bumped the version) is never passed
    /// over. Both are constants, so that the plan leaves the settled days'
    /// partitions out. Empty for every day.
    fn filter(&self) -> String {
        match &self.low {
            Some(low) => format!(
                " AND created_at >= '{low}'::timestamptz \
                 AND (SELECT version FROM outbox_claim_window WHERE only_row) = {}",
                self.version
            ),
            None => String::new(),
        }
    }
}

impl Window {
    /// The window as last read (read now the first time).
    async fn current(&self, conn: &mut PgConnection) -> Result<Bound, sqlx::Error> {
        let last = self.last.lock().expect("claim window lock").clone();
        match last {
            Some((bound, read_at)) if read_at.elapsed() < WINDOW_READ_AGAIN => Ok(bound),
            _ => self.reload(conn).await,
        }
    }

    /// Reads the window again.
    async fn reload(&self, conn: &mut PgConnection) -> Result<Bound, sqlx::Error> {
        let (version, low): (i64, Option<String>) = sqlx::query_as(
            "SELECT version, CASE WHEN isfinite(low) THEN \
               to_char(low AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') END \
             FROM outbox_claim_window",
        )
        .fetch_one(&mut *conn)
        .await?;
        // Written into the statement: digits and separators only.
        let low = low.filter(|low| {
            low.chars()
                .all(|c| c.is_ascii_digit() || matches!(c, '-' | ':' | '.' | 'T' | 'Z'))
        });
        let bound = Bound { version, low };
        *self.last.lock().expect("claim window lock") = Some((bound.clone(), Instant::now()));
        Ok(bound)
    }
}

/// Decodes claimed `rows`, dead-lettering in the claim's transaction those
/// that cannot be read (the holes of their aggregates' runs), and names
/// their partitions.
async fn read(
    conn: &mut PgConnection,
    rows: &[PgRow],
    read_: &Read,
) -> Result<(Vec<OutboxRecord>, Vec<Hole>), SourceError> {
    // A row whose place cannot be read (never the row's fault) is marked
    // by its id instead.
    let ctid = decode::column_index(rows, "ctid");
    let mut decoded = decode::records(rows, |row, record| {
        record.ctid = ctid.and_then(|index| row.try_get(index).ok());
        Ok(())
    })?;
    park::<PgDialect>(conn, &decoded.undecodable).await?;
    if let Some(names) = &read_.partition {
        names.name(conn, &mut decoded.rows).await?;
    }
    Ok((decoded.rows, decode::holes(decoded.undecodable)))
}

/// The names of a partitioned outbox's partitions by oid, as claims found
/// them. A claim reads each row's partition as its oid (`tableoid`), not
/// as its name (`tableoid::regclass::text`, which the server would format
/// for every row), and looks up the names of oids it has not seen.
///
/// An oid names one table until the table is dropped, and a dropped
/// partition's oid comes back only after the server has handed out its
/// other 2^32 - 1 oids; names are forgotten after [`PartitionNames::KEPT`]
/// all the same. A name looked up in a claim is that of the table holding
/// the rows the claim locked, which no detach or drop takes away before
/// the claim's transaction ends.
#[derive(Debug, Clone, Default)]
pub(crate) struct PartitionNames(Arc<Mutex<Names>>);

#[derive(Debug, Default)]
struct Names {
    /// When the oldest of `by_oid` was looked up.
    since: Option<Instant>,
    by_oid: FastMap<i64, Arc<str>>,
}

impl PartitionNames {
    /// How long names are kept.
    const KEPT: Duration = Duration::from_secs(600);

    /// Names the partition of each of `records`, looking up in `conn`
    /// those not known.
    async fn name(
        &self,
        conn: &mut PgConnection,
        records: &mut [OutboxRecord],
    ) -> Result<(), SourceError> {
        let unknown = self.name_known(records);
        if unknown.is_empty() {
            return Ok(());
        }
        let found: Vec<(i64, String)> = sqlx::query_as(
            "SELECT o.oid, o.oid::oid::regclass::text FROM unnest($1::int8[]) AS o(oid)",
        )
        .bind(&unknown)
        .fetch_all(&mut *conn)
        .await?;
        let mut names = self.0.lock().expect("partition names lock");
        names.since.get_or_insert_with(Instant::now);
        names
            .by_oid
            .extend(found.into_iter().map(|(oid, name)| (oid, Arc::from(name))));
        drop(names);
        self.name_known(records);
        Ok(())
    }

    /// Names the partitions of `records` whose names are known; returns
    /// the oids of the others.
    fn name_known(&self, records: &mut [OutboxRecord]) -> Vec<i64> {
        let mut names = self.0.lock().expect("partition names lock");
        if names
            .since
            .is_some_and(|since| since.elapsed() > Self::KEPT)
        {
            *names = Names::default();
        }
        let mut unknown = Vec::new();
        for partition in records
            .iter_mut()
            .filter_map(|record| record.partition.as_mut())
        {
            match names.by_oid.get(&partition.oid) {
                Some(name) => partition.name = Some(name.clone()),
                None if !unknown.contains(&partition.oid) => unknown.push(partition.oid),
                None => {}
            }
        }
        unknown
    }
}

/// The columns of a claimed row but its creation time; the id as a `uuid`,
/// which the relay writes out as text (see `decode::id`); where the locked
/// row is (`ctid`), where the settle marks it. An infinite `created_at`
/// (which cannot be subtracted) has age 0.
const CLAIMED_COLUMNS: &str = "id, aggregatetype, aggregateid, type, \
     payload::text AS payload, event_version, aggregate_seq, traceparent, seq, attempts, ctid, \
     CASE WHEN isfinite(created_at) \
       THEN EXTRACT(EPOCH FROM clock_timestamp() - created_at)::float8 ELSE 0 END AS age_at_claim";

/// What a claim reads beyond the fixed columns.
#[derive(Debug, Clone, Default)]
pub(crate) struct Read {
    /// Each row's creation time as PostgreSQL writes it, for CloudEvents'
    /// `time`; NULL otherwise (see [`OutboxRecord::created_at`]).
    pub created_at: bool,
    /// Each row's partition (`tableoid`), named through these names: read
    /// on a partitioned outbox, whose marks then update each partition on
    /// its own, by each row's `ctid` (one through the partitioned table
    /// opens every partition); NULL otherwise.
    pub partition: Option<PartitionNames>,
    /// The extra columns (see [`crate::source::extra`]).
    pub extra: ExtraSelect,
}

impl Read {
    /// The select items after [`CLAIMED_COLUMNS`].
    fn items(&self) -> String {
        let created_at = if self.created_at {
            "created_at::text AS created_at"
        } else {
            "NULL::text AS created_at"
        };
        let partition = if self.partition.is_some() {
            "tableoid::int8 AS partition"
        } else {
            "NULL::int8 AS partition"
        };
        format!("{created_at}, {partition}{}", self.extra.items)
    }
}

/// A pending row of `table` (an alias of `outbox`).
fn pending(table: &str) -> String {
    format!("{table}.published_at IS NULL AND {table}.dead_lettered_at IS NULL")
}

/// Claimed rows (`claimed`, selecting [`CLAIMED_COLUMNS`] and `read`'s
/// items) as read.
fn as_read(claimed: &str, read_: &Read) -> String {
    format!(
        "SELECT id, aggregatetype, aggregateid, type, payload, event_version, \
           aggregate_seq, traceparent, seq, attempts, ctid, age_at_claim, created_at, partition{} \
         FROM ({claimed}) AS claimed",
        read_.extra.names
    )
}

/// Locks and reads the oldest pending rows by `seq` (the pending index),
/// up to `$1`, leaving out the excluded aggregates `$2`/`$3`, `filter` and
/// the rows of this relay's open claim (`$4`, by `seq`): what
/// the claim hands over ([`ordering::claim_order`]). Both exclusions are hashed lists
/// the scan of the pending index filters by, below the lock, whatever the
/// table's statistics (a join there may become a nested loop over the rows
/// in flight for every pending row when the table was never analyzed).
///
/// Rows are never skipped as locked: the statement waits (up to the
/// claim's lock timeout) for rows another transaction holds, and one no
/// longer pending once it has them (published or parked by a previous
/// owner of its shard, or re-driven) is passed over for the next, so no
/// earlier pending row can be left behind a later one.
fn head_sql(filter: &str, read_: &Read) -> String {
    as_read(
        &format!(
            "SELECT {CLAIMED_COLUMNS}, {items} FROM outbox WHERE {pending} \
         AND (aggregatetype, aggregateid) NOT IN \
           (SELECT t, i FROM unnest($2::text[], $3::text[]) AS excluded(t, i)){filter} \
         AND seq NOT IN (SELECT unnest($4::bigint[])) \
         ORDER BY seq LIMIT $1 FOR UPDATE",
            pending = pending("outbox"),
            items = read_.items(),
        ),
        read_,
    )
}

/// The shard of a row: a stable hash of its aggregate.
const SHARD_OF_ROW: &str =
    "((hashtextextended(aggregatetype || '/' || aggregateid, 0) % $5) + $5) % $5";

#[cfg(test)]
mod tests {
    use super::{Read, head_sql};

    #[test]
    fn claims_lock_rows_as_they_are_read_never_skipping_any() {
        let plain = Read::default();
        let timed = Read {
            created_at: true,
            ..Read::default()
        };
        let head = head_sql(" AND shard_filter", &plain);
        for sql in [&head, &head_sql("", &timed)] {
            assert!(!sql.contains("SKIP LOCKED"), "{sql}");
        }
        // The oldest rows are locked by the scan of the pending index that
        // finds them; the filters (shards, rows in flight) run below it.
        assert!(
            head.contains(
                "AND shard_filter AND seq NOT IN (SELECT unnest($4::bigint[])) \
                 ORDER BY seq LIMIT $1 FOR UPDATE"
            ),
            "{head}"
        );
    }
}
