//! Where a replay reads its events and keeps its plan and audit record:
//! the tables of migration 0009 (`outbox_replay`, `outbox_replay_row`), on
//! every database, through one [`SqlStore`] and the few words each
//! database says its own way ([`Words`]).

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, ColumnIndex, Database, Decode, Encode, Executor, Pool, Row, Type};

use super::{Selection, State, Summary};
use crate::database::{Backend, DatabaseUrl};
use crate::record::OutboxRecord;
use crate::source::dialect::{Placeholders, RowsAffected};
use crate::source::extra::{self, ExtraColumns, ExtraSelect};
use crate::source::{self, SourceError, SourceOptions};

/// A replay as its audit record holds it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct ReplayRecord {
    /// The replay's id, also sent in the `replayId` header.
    pub id: String,
    /// Who started it (`user@host`).
    pub requested_by: String,
    /// The selection, as the command line gave it.
    pub selection: String,
    /// Where the events went.
    pub destination: String,
    /// `--to`, when given.
    pub topic: Option<String>,
    /// Events selected.
    pub planned: i64,
    /// Events sent and acknowledged.
    pub sent: i64,
    /// The plan's position sent up to.
    pub last_ordinal: i64,
    /// `running`, `interrupted`, `failed` or `done`.
    pub state: String,
    /// When it started (UTC, RFC 3339).
    pub started_at: String,
    /// When it last recorded progress.
    pub updated_at: String,
    /// When it finished, once done.
    pub finished_at: Option<String>,
    /// Why it stopped, when it failed.
    pub last_error: Option<String>,
    /// Seconds since it last recorded progress.
    #[serde(skip)]
    pub idle_seconds: f64,
}

/// A chunk of a replay's plan.
#[derive(Debug, Default)]
pub struct Chunk {
    /// The events still in the outbox, in plan order.
    pub records: Vec<OutboxRecord>,
    /// Planned events no longer in the outbox (deleted by retention since
    /// the plan was made), or that could not be read.
    pub missing: u64,
    /// The plan's position this chunk ends at.
    pub last_ordinal: i64,
}

/// What a replay needs of the database.
#[async_trait]
pub trait Store: Send + Sync {
    /// What `selection` holds: counts per aggregate type and for the
    /// largest aggregates, and the creation times' range.
    async fn summarize(&self, selection: &Selection) -> Result<Summary, sqlx::Error>;

    /// Records replay `new` as running and writes its plan, in one
    /// transaction: the published events `selection` holds, each
    /// aggregate's in its sequence order. Returns how many were planned.
    async fn plan(&self, new: &NewReplay, selection: &Selection) -> Result<i64, sqlx::Error>;

    /// The audit record of replay `id`.
    async fn load(&self, id: &str) -> Result<Option<ReplayRecord>, sqlx::Error>;

    /// Marks replay `id` running again; false when it was done.
    async fn restart(&self, id: &str) -> Result<bool, sqlx::Error>;

    /// The planned events at positions `after + 1 ..= upto`.
    async fn chunk(&self, id: &str, after: i64, upto: i64) -> Result<Chunk, SourceError>;

    /// Records that the plan was sent up to `last_ordinal`, `sent` events
    /// in all.
    async fn advance(&self, id: &str, last_ordinal: i64, sent: i64) -> Result<(), sqlx::Error>;

    /// Records how the replay ended; a done replay's plan is deleted.
    async fn finish(&self, id: &str, state: State, error: Option<&str>) -> Result<(), sqlx::Error>;

    /// The latest replays, newest first; none when the tables do not exist.
    async fn recent(&self, limit: i64) -> Result<Vec<ReplayRecord>, sqlx::Error>;

    /// Closes its connections.
    async fn close(&self);
}

/// A replay about to be planned.
#[derive(Debug, Clone)]
pub struct NewReplay {
    /// Its id.
    pub id: String,
    /// `user@host`.
    pub requested_by: String,
    /// The selection, for the audit record.
    pub selection: String,
    /// Where the events go, for the audit record.
    pub destination: String,
    /// `--to`, when given.
    pub topic: Option<String>,
}

/// Connects to the database of `url`, its outbox table checked.
pub async fn connect(url: &str, extra: &ExtraColumns) -> Result<Box<dyn Store>, SourceError> {
    Ok(match DatabaseUrl::parse(url)?.backend() {
        Backend::Postgres => {
            let source = source::connect_postgres(url, SourceOptions::default()).await?;
            let pool = source.pool().clone();
            let extra = extra::select_of(&pool, extra, &extra::POSTGRES, "o").await?;
            Box::new(SqlStore::new(pool, &POSTGRES, extra))
        }
        Backend::MySql => {
            let source = source::connect_mysql(url, SourceOptions::default()).await?;
            let pool = source.pool().clone();
            let extra = extra::select_of(&pool, extra, &extra::MYSQL, "o").await?;
            Box::new(SqlStore::new(pool, &MYSQL, extra))
        }
        Backend::Sqlite => {
            let source = source::sqlite::SqliteSource::open(url, SourceOptions::default()).await?;
            let pool = source.pool().clone();
            let extra = extra::select_of(&pool, extra, &extra::SQLITE, "o").await?;
            Box::new(SqlStore::new(pool, &SQLITE, extra))
        }
    })
}

/// What each database says its own way.
#[derive(Debug)]
pub struct Words {
    placeholders: Placeholders,
    /// The columns of an [`OutboxRecord`], of the outbox aliased `o`.
    record_columns: &'static str,
    /// A timestamp column as RFC 3339 text in UTC (`{}` is the column).
    time_text: &'static str,
    /// How a bound time is written (chrono's format).
    time_format: &'static str,
    /// A bound time, comparable with `created_at` (`{}` is the
    /// placeholder).
    time_param: &'static str,
    /// A bound event id, comparable with `id`.
    id_param: &'static str,
    /// The time now, as the tables store it.
    now: &'static str,
    /// Seconds since `updated_at`.
    idle_seconds: &'static str,
    /// Run before the plan's transaction begins.
    before_plan: Option<&'static str>,
}

const POSTGRES: Words = Words {
    placeholders: Placeholders::Numbered,
    record_columns: "o.id::text AS id, o.aggregatetype, o.aggregateid, o.type, \
        o.payload::text AS payload, o.event_version, o.aggregate_seq, o.traceparent, o.seq, \
        o.attempts, 0::float8 AS age_at_claim, o.created_at::text AS created_at",
    time_text: "to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
    time_format: "%Y-%m-%dT%H:%M:%S%.6fZ",
    time_param: "CAST({} AS timestamptz)",
    id_param: "CAST({} AS uuid)",
    now: "now()",
    idle_seconds: "EXTRACT(EPOCH FROM now() - updated_at)::float8",
    before_plan: None,
};

const MYSQL: Words = Words {
    placeholders: Placeholders::QuestionMarks,
    record_columns: "o.id, o.aggregatetype, o.aggregateid, o.type, \
        CAST(o.payload AS CHAR) AS payload, o.event_version, o.aggregate_seq, o.traceparent, \
        o.seq, o.attempts, CAST(0 AS DOUBLE) AS age_at_claim, \
        CAST(o.created_at AS CHAR) AS created_at",
    time_text: "DATE_FORMAT({}, '%Y-%m-%dT%H:%i:%s.%fZ')",
    time_format: "%Y-%m-%d %H:%M:%S%.6f",
    time_param: "CAST({} AS DATETIME(6))",
    id_param: "{}",
    now: "UTC_TIMESTAMP(6)",
    idle_seconds: "CAST(TIMESTAMPDIFF(MICROSECOND, updated_at, UTC_TIMESTAMP(6)) AS DOUBLE) / 1e6",
    // A consistent read: no shared locks on the outbox's rows and gaps,
    // which writers' inserts would wait for.
    before_plan: Some("SET TRANSACTION ISOLATION LEVEL READ COMMITTED"),
};

const SQLITE: Words = Words {
    placeholders: Placeholders::QuestionMarks,
    record_columns: "o.id, o.aggregatetype, o.aggregateid, o.type, o.payload, \
        o.event_version, o.aggregate_seq, o.traceparent, o.seq, o.attempts, \
        0.0 AS age_at_claim, o.created_at",
    time_text: "strftime('%Y-%m-%dT%H:%M:%fZ', {})",
    time_format: "%Y-%m-%dT%H:%M:%S%.3fZ",
    time_param: "strftime('%Y-%m-%dT%H:%M:%fZ', {})",
    id_param: "{}",
    now: "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
    idle_seconds: "(julianday('now') - julianday(updated_at)) * 86400.0",
    before_plan: None,
};

impl Words {
    fn nth(&self, n: usize) -> String {
        self.placeholders.nth(n)
    }

    fn time_text(&self, column: &str) -> String {
        self.time_text.replace("{}", column)
    }

    /// The `WHERE` condition of `selection` on the outbox, its parameters
    /// numbered from `first`, with the values to bind in order.
    pub(crate) fn filter(&self, selection: &Selection, first: usize) -> (String, Vec<String>) {
        let mut conditions = vec!["published_at IS NOT NULL".to_owned()];
        let mut values: Vec<String> = Vec::new();
        let next = |values: &mut Vec<String>, value: String| {
            values.push(value);
            self.nth(first + values.len() - 1)
        };
        for (column, list) in [
            ("aggregatetype", &selection.aggregate_types),
            ("aggregateid", &selection.aggregate_ids),
            ("type", &selection.event_types),
        ] {
            if !list.is_empty() {
                let places: Vec<String> = list
                    .iter()
                    .map(|value| next(&mut values, value.clone()))
                    .collect();
                conditions.push(format!("{column} IN ({})", places.join(", ")));
            }
        }
        // SQLite compares its text timestamps in one format: the bound
        // time and the column are both put in it.
        let created_at = if self.time_param.starts_with("strftime") {
            self.time_param.replace("{}", "created_at")
        } else {
            "created_at".to_owned()
        };
        for (op, time) in [(">=", &selection.since), ("<", &selection.until)] {
            if let Some(time) = time {
                let place = next(&mut values, time.format(self.time_format).to_string());
                conditions.push(format!(
                    "{created_at} {op} {}",
                    self.time_param.replace("{}", &place)
                ));
            }
        }
        for (op, id) in [(">=", &selection.from_id), ("<=", &selection.to_id)] {
            if let Some(id) = id {
                let place = next(&mut values, id.clone());
                conditions.push(format!("id {op} {}", self.id_param.replace("{}", &place)));
            }
        }
        (conditions.join(" AND "), values)
    }
}

/// The store of every SQL database.
pub struct SqlStore<DB: Database> {
    pool: Pool<DB>,
    words: &'static Words,
    /// The router's extra columns, read with each planned event.
    extra: ExtraSelect,
}

impl<DB: Database> SqlStore<DB> {
    fn new(pool: Pool<DB>, words: &'static Words, extra: ExtraSelect) -> Self {
        Self { pool, words, extra }
    }
}

/// `sql` with `values` bound in order.
fn bound<'q, DB: Database>(
    sql: &'q str,
    values: &'q [String],
) -> sqlx::query::Query<'q, DB, <DB as Database>::Arguments>
where
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
{
    values
        .iter()
        .fold(sqlx::query(AssertSqlSafe(sql)), |query, value| {
            query.bind(value.as_str())
        })
}

/// The columns of [`ReplayRecord`].
fn replay_columns(words: &Words) -> String {
    format!(
        "id, requested_by, selection, destination, topic, planned, sent, last_ordinal, state, \
         {} AS started_at, {} AS updated_at, {} AS finished_at, last_error, \
         {} AS idle_seconds",
        words.time_text("started_at"),
        words.time_text("updated_at"),
        words.time_text("finished_at"),
        words.idle_seconds
    )
}

/// Rows of the plan deleted per statement once a replay is done.
const CLEAR_BATCH: i64 = 10_000;

#[async_trait]
impl<DB> Store for SqlStore<DB>
where
    DB: Database,
    DB::QueryResult: RowsAffected,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> i32: Decode<'q, DB> + Type<DB>,
    for<'q> f64: Decode<'q, DB> + Type<DB>,
    for<'q> uuid::Uuid: Decode<'q, DB> + Type<DB>,
    for<'q> String: Decode<'q, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
    for<'a> &'a str: ColumnIndex<DB::Row>,
    ReplayRecord: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    async fn summarize(&self, selection: &Selection) -> Result<Summary, sqlx::Error> {
        let words = self.words;
        let (filter, values) = words.filter(selection, 1);
        let totals = format!(
            "SELECT COUNT(*) AS events, {} AS first_created, {} AS last_created \
             FROM outbox WHERE {filter}",
            words.time_text("MIN(created_at)"),
            words.time_text("MAX(created_at)")
        );
        let mut conn = self.pool.acquire().await?;
        let row = bound::<DB>(&totals, &values).fetch_one(&mut *conn).await?;
        let mut summary = Summary {
            events: row.try_get("events")?,
            first_created: row.try_get("first_created")?,
            last_created: row.try_get("last_created")?,
            ..Summary::default()
        };
        let aggregates = format!(
            "SELECT COUNT(*) AS aggregates FROM \
             (SELECT 1 AS one FROM outbox WHERE {filter} GROUP BY aggregatetype, aggregateid) a"
        );
        summary.aggregates = bound::<DB>(&aggregates, &values)
            .fetch_one(&mut *conn)
            .await?
            .try_get("aggregates")?;
        let by_type = format!(
            "SELECT aggregatetype, COUNT(*) AS events FROM outbox WHERE {filter} \
             GROUP BY aggregatetype ORDER BY events DESC, aggregatetype"
        );
        for row in bound::<DB>(&by_type, &values).fetch_all(&mut *conn).await? {
            summary.by_type.push(super::TypeCount {
                aggregate_type: row.try_get("aggregatetype")?,
                events: row.try_get("events")?,
            });
        }
        let largest = format!(
            "SELECT aggregatetype, aggregateid, COUNT(*) AS events FROM outbox WHERE {filter} \
             GROUP BY aggregatetype, aggregateid \
             ORDER BY events DESC, aggregatetype, aggregateid LIMIT {}",
            super::AGGREGATES_SHOWN
        );
        for row in bound::<DB>(&largest, &values).fetch_all(&mut *conn).await? {
            summary.largest.push(super::AggregateCount {
                aggregate_type: row.try_get("aggregatetype")?,
                aggregate_id: row.try_get("aggregateid")?,
                events: row.try_get("events")?,
            });
        }
        Ok(summary)
    }

    async fn plan(&self, new: &NewReplay, selection: &Selection) -> Result<i64, sqlx::Error> {
        let words = self.words;
        let mut conn = self.pool.acquire().await?;
        if let Some(statement) = words.before_plan {
            sqlx::raw_sql(statement).execute(&mut *conn).await?;
        }
        let mut transaction = sqlx::Connection::begin(&mut *conn).await?;
        let planned = plan_in::<DB>(&mut transaction, words, new, selection).await?;
        transaction.commit().await?;
        Ok(planned)
    }

    async fn load(&self, id: &str) -> Result<Option<ReplayRecord>, sqlx::Error> {
        let sql = format!(
            "SELECT {} FROM outbox_replay WHERE id = {}",
            replay_columns(self.words),
            self.words.nth(1)
        );
        sqlx::query_as::<DB, ReplayRecord>(AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&mut *self.pool.acquire().await?)
            .await
    }

    async fn restart(&self, id: &str) -> Result<bool, sqlx::Error> {
        let sql = format!(
            "UPDATE outbox_replay SET state = 'running', last_error = NULL, updated_at = {} \
             WHERE id = {} AND state <> 'done'",
            self.words.now,
            self.words.nth(1)
        );
        let done = sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .execute(&mut *self.pool.acquire().await?)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn chunk(&self, id: &str, after: i64, upto: i64) -> Result<Chunk, SourceError> {
        let words = self.words;
        let sql = format!(
            "SELECT {}{} FROM outbox_replay_row r \
             JOIN outbox o ON o.id = r.id AND o.created_at = r.created_at \
             WHERE r.replay_id = {} AND r.ordinal > {} AND r.ordinal <= {} \
             ORDER BY r.ordinal",
            words.record_columns,
            self.extra.items,
            words.nth(1),
            words.nth(2),
            words.nth(3)
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .bind(after)
            .bind(upto)
            .fetch_all(&mut *self.pool.acquire().await?)
            .await?;
        let decoded = source::decode_records(&rows, |_, _| Ok(()))?;
        for row in &decoded.undecodable {
            tracing::warn!(seq = row.seq, reason = %row.reason, "a planned event cannot be read; it is not replayed");
        }
        let records = decoded.rows;
        Ok(Chunk {
            missing: (upto - after) as u64 - records.len() as u64,
            records,
            last_ordinal: upto,
        })
    }

    async fn advance(&self, id: &str, last_ordinal: i64, sent: i64) -> Result<(), sqlx::Error> {
        let words = self.words;
        let sql = format!(
            "UPDATE outbox_replay SET last_ordinal = {}, sent = {}, updated_at = {} \
             WHERE id = {}",
            words.nth(1),
            words.nth(2),
            words.now,
            words.nth(3)
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(last_ordinal)
            .bind(sent)
            .bind(id)
            .execute(&mut *self.pool.acquire().await?)
            .await?;
        Ok(())
    }

    async fn finish(&self, id: &str, state: State, error: Option<&str>) -> Result<(), sqlx::Error> {
        let words = self.words;
        let finished = if state == State::Done {
            words.now
        } else {
            "NULL"
        };
        let sql = format!(
            "UPDATE outbox_replay SET state = {}, last_error = {}, updated_at = {}, \
             finished_at = {finished} WHERE id = {}",
            words.nth(1),
            words.nth(2),
            words.now,
            words.nth(3)
        );
        let mut conn = self.pool.acquire().await?;
        sqlx::query(AssertSqlSafe(sql))
            .bind(state.as_str())
            .bind(error)
            .bind(id)
            .execute(&mut *conn)
            .await?;
        if state == State::Done {
            clear_plan(&mut conn, words, id).await?;
        }
        Ok(())
    }

    async fn recent(&self, limit: i64) -> Result<Vec<ReplayRecord>, sqlx::Error> {
        let sql = format!(
            "SELECT {} FROM outbox_replay ORDER BY started_at DESC, id DESC LIMIT {limit}",
            replay_columns(self.words)
        );
        let mut conn = self.pool.acquire().await?;
        match sqlx::query_as::<DB, ReplayRecord>(AssertSqlSafe(sql))
            .fetch_all(&mut *conn)
            .await
        {
            Err(error) if source::is_missing_table(&error) => Ok(Vec::new()),
            other => other,
        }
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}

/// [`Store::plan`]'s statements, in the open transaction on `conn`.
async fn plan_in<DB>(
    conn: &mut DB::Connection,
    words: &Words,
    new: &NewReplay,
    selection: &Selection,
) -> Result<i64, sqlx::Error>
where
    DB: Database,
    DB::QueryResult: RowsAffected,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    let insert = format!(
        "INSERT INTO outbox_replay (id, requested_by, selection, destination, topic, state) \
         VALUES ({}, {}, {}, {}, {}, 'running')",
        words.nth(1),
        words.nth(2),
        words.nth(3),
        words.nth(4),
        words.nth(5)
    );
    sqlx::query(AssertSqlSafe(insert))
        .bind(new.id.as_str())
        .bind(new.requested_by.as_str())
        .bind(new.selection.as_str())
        .bind(new.destination.as_str())
        .bind(new.topic.as_deref())
        .execute(&mut *conn)
        .await?;
    // Each aggregate's events in the order the relay sends them: rows
    // written by plain SQL (no aggregate_seq) first, then by aggregate_seq,
    // ties by seq.
    let (filter, values) = words.filter(selection, 2);
    let rows = format!(
        "INSERT INTO outbox_replay_row (replay_id, ordinal, id, created_at) \
         SELECT {}, ROW_NUMBER() OVER \
           (ORDER BY aggregatetype, aggregateid, COALESCE(aggregate_seq, 0), seq), \
           id, created_at \
         FROM outbox WHERE {filter}",
        words.nth(1)
    );
    let values: Vec<String> = std::iter::once(new.id.clone()).chain(values).collect();
    let planned = bound::<DB>(&rows, &values)
        .execute(&mut *conn)
        .await?
        .rows_affected() as i64;
    let update = format!(
        "UPDATE outbox_replay SET planned = {} WHERE id = {}",
        words.nth(1),
        words.nth(2)
    );
    sqlx::query(AssertSqlSafe(update))
        .bind(planned)
        .bind(new.id.as_str())
        .execute(&mut *conn)
        .await?;
    Ok(planned)
}

/// Deletes a done replay's plan, in batches: its ordinals run from 1
/// without a gap, so a batch that deletes nothing was the last.
async fn clear_plan<DB>(
    conn: &mut DB::Connection,
    words: &Words,
    id: &str,
) -> Result<(), sqlx::Error>
where
    DB: Database,
    DB::QueryResult: RowsAffected,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    let sql = format!(
        "DELETE FROM outbox_replay_row WHERE replay_id = {} AND ordinal <= {}",
        words.nth(1),
        words.nth(2)
    );
    let mut upto = 0;
    loop {
        upto += CLEAR_BATCH;
        let deleted = sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(id)
            .bind(upto)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        if deleted == 0 {
            return Ok(());
        }
    }
}
