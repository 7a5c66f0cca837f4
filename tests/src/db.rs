//! An isolated database per test: a fresh schema on PostgreSQL, a fresh
//! database on MariaDB, a fresh file on SQLite, each with the outbox
//! migrations applied.

use std::path::PathBuf;
use std::time::Duration;

use outbox_migrations::Migrator;
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, Schema};
use sea_orm_migration::MigratorTrait;

/// A database server kind under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// PostgreSQL.
    Postgres,
    /// MariaDB (MySQL protocol).
    MySql,
    /// SQLite file.
    Sqlite,
}

impl Backend {
    /// The URL of the server's shared test database.
    pub fn admin_url(self) -> String {
        match self {
            Backend::Postgres => std::env::var("OUTBOX_TEST_POSTGRES_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
            Backend::MySql => std::env::var("OUTBOX_TEST_MYSQL_URL")
                .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into()),
            Backend::Sqlite => String::new(),
        }
    }
}

/// One test's own database, with the outbox tables and the test entities.
pub struct TestDb {
    /// Which server it lives on.
    pub backend: Backend,
    /// A URL that reaches exactly this database (for a relay process).
    pub url: String,
    /// A pooled SeaORM connection to it.
    pub db: DatabaseConnection,
    name: String,
    sqlite_dir: Option<PathBuf>,
    /// A whole PostgreSQL database rather than a schema.
    own_postgres_database: bool,
}

impl TestDb {
    /// Creates an empty isolated database and applies the outbox migrations
    /// and the tables of [`crate::entities`].
    pub async fn new(backend: Backend) -> Self {
        let name = format!("outbox_t_{}", uuid::Uuid::now_v7().simple());
        let mut sqlite_dir = None;
        let url = match backend {
            Backend::Postgres => {
                on_server(backend, &format!("CREATE SCHEMA {name}"))
                    .await
                    .expect("create schema");
                with_query(
                    &backend.admin_url(),
                    &format!("options=-c%20search_path%3D{name}"),
                )
            }
            Backend::MySql => create_database(backend, &name).await,
            Backend::Sqlite => {
                let dir = std::env::temp_dir().join(&name);
                std::fs::create_dir_all(&dir).expect("create sqlite dir");
                let url = format!("sqlite://{}?mode=rwc", dir.join("outbox.db").display());
                sqlite_dir = Some(dir);
                url
            }
        };
        Self::migrated(backend, url, name, sqlite_dir, false).await
    }

    /// A PostgreSQL database of its own rather than a schema, for a test of
    /// what PostgreSQL shares database-wide: notification channels and
    /// advisory locks, which other tests' relays and writers use too.
    pub async fn new_postgres_database() -> Self {
        let backend = Backend::Postgres;
        let name = format!("outbox_d_{}", uuid::Uuid::now_v7().simple());
        let url = create_database(backend, &name).await;
        Self::migrated(backend, url, name, None, true).await
    }

    async fn migrated(
        backend: Backend,
        url: String,
        name: String,
        sqlite_dir: Option<PathBuf>,
        own_postgres_database: bool,
    ) -> Self {
        let db = connect(&url).await;
        Migrator::up(&db, None).await.expect("outbox migrations");
        crate::entities::create_tables(&db).await;
        Self {
            backend,
            url,
            db,
            name,
            sqlite_dir,
            own_postgres_database,
        }
    }

    /// The database's (on PostgreSQL, the schema's, unless made by
    /// [`TestDb::new_postgres_database`]) own name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The SeaORM backend of the connection.
    pub fn db_backend(&self) -> DbBackend {
        self.db.get_database_backend()
    }

    /// Counts rows with a raw `SELECT COUNT(*) FROM <table> [WHERE ..]`.
    pub async fn count(&self, table_and_filter: &str) -> i64 {
        let sql = format!("SELECT COUNT(*) FROM {table_and_filter}");
        let row = self
            .db
            .query_one_raw(sea_orm::Statement::from_string(self.db_backend(), sql))
            .await
            .expect("count query")
            .expect("count row");
        row.try_get_by_index::<i64>(0).expect("count value")
    }

    /// On PostgreSQL, what a stalled relay test needs to see: the shard
    /// and instance rows, the pending rows' counts, and every session of
    /// the server that is not idle (what it waits for, what it runs).
    pub async fn describe_ownership(&self) -> String {
        let queries = [
            "SELECT shard::text, coalesce(owner, '-'), epoch::text, \
               coalesce((lease_until - now())::text, '-') FROM outbox_relay_shard ORDER BY shard",
            "SELECT id, (lease_until - now())::text FROM outbox_relay_instance ORDER BY id",
            "SELECT count(*)::text, coalesce(min(seq)::text, '-'), \
               count(*) FILTER (WHERE dead_lettered_at IS NOT NULL)::text \
             FROM outbox WHERE published_at IS NULL",
            "SELECT pid::text, coalesce(application_name, ''), coalesce(state, ''), \
               coalesce(wait_event_type || ':' || wait_event, ''), \
               coalesce((now() - xact_start)::text, ''), left(coalesce(query, ''), 160) \
             FROM pg_stat_activity WHERE backend_type = 'client backend' \
               AND pid <> pg_backend_pid() AND state IS DISTINCT FROM 'idle' ORDER BY pid",
        ];
        let mut out = String::new();
        for sql in queries {
            out.push_str(
                sql.split_whitespace()
                    .take(6)
                    .collect::<Vec<_>>()
                    .join(" ")
                    .as_str(),
            );
            out.push('\n');
            match self
                .db
                .query_all_raw(sea_orm::Statement::from_string(self.db_backend(), sql))
                .await
            {
                Ok(rows) => {
                    for row in rows {
                        let mut cells = Vec::new();
                        for index in 0.. {
                            match row.try_get_by_index::<String>(index) {
                                Ok(cell) => cells.push(cell),
                                Err(_) => break,
                            }
                        }
                        out.push_str(&format!("  {}\n", cells.join(" | ")));
                    }
                }
                Err(error) => out.push_str(&format!("  error: {error}\n")),
            }
        }
        out
    }

    /// Rows not published yet.
    pub async fn pending(&self) -> i64 {
        self.count("outbox WHERE published_at IS NULL").await
    }

    /// Rows published.
    pub async fn published(&self) -> i64 {
        self.count("outbox WHERE published_at IS NOT NULL").await
    }

    /// Waits until no row is pending; fails the test after `timeout`.
    pub async fn wait_until_published(&self, timeout: Duration) {
        crate::wait::until("every row published", timeout, async || {
            self.pending().await == 0
        })
        .await;
    }

    /// The payload text of event `id` exactly as the database stores it.
    pub async fn stored_payload(&self, id: &str) -> String {
        let sql = match self.backend {
            Backend::Postgres => format!("SELECT payload::text FROM outbox WHERE id = '{id}'"),
            Backend::MySql | Backend::Sqlite => {
                format!("SELECT payload FROM outbox WHERE id = '{id}'")
            }
        };
        let row = self
            .db
            .query_one_raw(sea_orm::Statement::from_string(self.db_backend(), sql))
            .await
            .expect("payload query")
            .unwrap_or_else(|| panic!("no outbox row {id}"));
        row.try_get_by_index(0).expect("payload text")
    }

    /// Inserts `per_aggregate` rows for each of `aggregates` aggregates
    /// (`Customer` `cust-0`, `cust-1`, ...) by plain SQL, giving only
    /// Debezium's five columns, interleaved: a statement per round. The
    /// payload is `{"round": n}`. Returns (aggregate id, event id) in
    /// insertion order.
    pub async fn insert_plain_rows(
        &self,
        aggregates: usize,
        per_aggregate: usize,
    ) -> Vec<(String, String)> {
        let mut written = Vec::with_capacity(aggregates * per_aggregate);
        for round in 0..per_aggregate {
            let mut values = Vec::with_capacity(aggregates);
            for aggregate in 0..aggregates {
                let id = uuid::Uuid::now_v7().to_string();
                let aggregate_id = format!("cust-{aggregate}");
                values.push(format!(
                    "('{id}', 'Customer', '{aggregate_id}', 'CustomerUpdated', '{{\"round\": {round}}}')"
                ));
                written.push((aggregate_id, id));
            }
            self.db
                .execute_unprepared(&format!(
                    "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES {}",
                    values.join(", ")
                ))
                .await
                .expect("insert plain rows");
        }
        written
    }

    /// Each outbox row's `created_at` as RFC 3339 text in UTC, by id.
    pub async fn created_at_times(&self) -> std::collections::BTreeMap<String, String> {
        let sql = match self.backend {
            Backend::Postgres => {
                "SELECT id::text, to_char(created_at AT TIME ZONE 'UTC', \
                 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') FROM outbox"
            }
            Backend::MySql => {
                "SELECT id, DATE_FORMAT(created_at, '%Y-%m-%dT%H:%i:%s.%fZ') FROM outbox"
            }
            Backend::Sqlite => "SELECT id, created_at FROM outbox",
        };
        self.db
            .query_all_raw(sea_orm::Statement::from_string(self.db_backend(), sql))
            .await
            .expect("select created_at")
            .iter()
            .map(|row| {
                (
                    row.try_get_by_index(0).expect("id"),
                    row.try_get_by_index(1).expect("created_at"),
                )
            })
            .collect()
    }

    /// Every outbox row, in insertion order.
    pub async fn outbox_rows(&self) -> Vec<OutboxRow> {
        let sql = match self.backend {
            Backend::Postgres => {
                "SELECT id::text, aggregatetype, aggregateid, type, payload::text, \
                 event_version::bigint, aggregate_seq, traceparent FROM outbox ORDER BY seq"
            }
            Backend::MySql | Backend::Sqlite => {
                "SELECT id, aggregatetype, aggregateid, type, payload, \
                 event_version, aggregate_seq, traceparent FROM outbox ORDER BY seq"
            }
        };
        let rows = self
            .db
            .query_all_raw(sea_orm::Statement::from_string(self.db_backend(), sql))
            .await
            .expect("select outbox rows");
        rows.iter()
            .map(|row| OutboxRow {
                id: row.try_get_by_index(0).expect("id"),
                aggregate_type: row.try_get_by_index(1).expect("aggregatetype"),
                aggregate_id: row.try_get_by_index(2).expect("aggregateid"),
                event_type: row.try_get_by_index(3).expect("type"),
                payload: row
                    .try_get_by_index::<Option<String>>(4)
                    .expect("payload")
                    .map(|text| serde_json::from_str(&text).expect("payload is JSON")),
                event_version: row.try_get_by_index(5).expect("event_version"),
                aggregate_seq: row.try_get_by_index(6).expect("aggregate_seq"),
                traceparent: row.try_get_by_index(7).expect("traceparent"),
            })
            .collect()
    }

    /// Starts `outbox-relay run --mode cdc` (the binary at `relay`) with
    /// a slot and publication of its own and `args` after them, and waits
    /// until it reads the slot: rows committed from then on reach it.
    /// Returns the process and the slot's name.
    ///
    /// A slot is `active` from the start of its creation, while the server
    /// still waits for the transactions running then (other tests') to end
    /// before it decodes anything; a row committed in that wait is not in
    /// the slot. So this waits for a replication session (a walsender)
    /// to stream it, which starts once the creation is done.
    pub async fn start_cdc_relay(
        &self,
        relay: &std::path::Path,
        args: &[&str],
    ) -> (crate::process::RelayProcess, String) {
        let slot = format!("s_{}", uuid::Uuid::now_v7().simple());
        let mut all = vec![
            "run",
            "--mode",
            "cdc",
            "--slot",
            &slot,
            "--publication",
            &slot,
        ];
        all.extend_from_slice(args);
        let process =
            crate::process::RelayProcess::spawn(relay, &all, &[("DATABASE_URL", &self.url)]);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let active = format!(
            "pg_replication_slots AS s JOIN pg_stat_activity AS a ON a.pid = s.active_pid \
             WHERE s.slot_name = '{slot}' AND s.active AND a.backend_type = 'walsender'"
        );
        while self.count(&active).await == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the CDC relay did not start reading:\n{}",
                process.stderr().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (process, slot)
    }

    /// Drops replication slot `slot` once no relay reads it.
    pub async fn drop_slot(&self, slot: &str) {
        self.db
            .execute_unprepared(&format!(
                "SELECT pg_drop_replication_slot('{slot}') FROM pg_replication_slots \
                 WHERE slot_name = '{slot}' AND NOT active"
            ))
            .await
            .expect("drop the slot");
    }

    /// Drops the database. Call at the end of a test; a failed test leaves
    /// its database behind for inspection (names start with `outbox_t_`).
    pub async fn drop(self) {
        self.db.close().await.ok();
        match self.backend {
            Backend::Postgres => {
                let drop = if self.own_postgres_database {
                    format!("DROP DATABASE {} WITH (FORCE)", self.name)
                } else {
                    format!("DROP SCHEMA {} CASCADE", self.name)
                };
                on_server(self.backend, &drop).await.ok();
            }
            Backend::MySql => {
                on_server(self.backend, &format!("DROP DATABASE {}", self.name))
                    .await
                    .ok();
            }
            Backend::Sqlite => {
                if let Some(dir) = self.sqlite_dir {
                    std::fs::remove_dir_all(dir).ok();
                }
            }
        }
    }
}

/// An outbox row as the tests read it back.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxRow {
    /// `id`, hyphenated.
    pub id: String,
    /// `aggregatetype`.
    pub aggregate_type: String,
    /// `aggregateid`.
    pub aggregate_id: String,
    /// `type`.
    pub event_type: String,
    /// `payload`, parsed.
    pub payload: Option<serde_json::Value>,
    /// `event_version`.
    pub event_version: i64,
    /// `aggregate_seq`.
    pub aggregate_seq: Option<i64>,
    /// `traceparent`.
    pub traceparent: Option<String>,
}

/// Connects or fails the test with the URL and the way to fix it.
pub async fn connect(url: &str) -> DatabaseConnection {
    let mut options = ConnectOptions::new(url);
    options
        .max_connections(16)
        .connect_timeout(Duration::from_secs(10))
        .sqlx_logging(false);
    match Database::connect(options).await {
        Ok(db) => db,
        Err(error) => panic!(
            "cannot connect to {url}: {error}. The integration tests need the local PostgreSQL \
             and MariaDB servers (see README, \"Running the tests\")"
        ),
    }
}

/// Creates database `name` on the server of `backend` and returns its URL
/// (the server's test URL with the database swapped, options kept).
async fn create_database(backend: Backend, name: &str) -> String {
    on_server(backend, &format!("CREATE DATABASE {name}"))
        .await
        .expect("create database");
    let base = backend.admin_url();
    let (server, query) = match base.split_once('?') {
        Some((server, query)) => (server, format!("?{query}")),
        None => (base.as_str(), String::new()),
    };
    let server = server.rsplit_once('/').map_or(server, |(server, _)| server);
    format!("{server}/{name}{query}")
}

/// Runs `sql` on the shared test database of `backend`'s server, on a
/// connection of its own.
async fn on_server(backend: Backend, sql: &str) -> Result<(), sea_orm::DbErr> {
    let admin = connect(&backend.admin_url()).await;
    let done = admin.execute_unprepared(sql).await.map(drop);
    admin.close().await.ok();
    done
}

fn with_query(url: &str, query: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{query}")
}

/// Creates the table of an entity on `db`.
pub async fn create_table<E: sea_orm::EntityTrait>(db: &DatabaseConnection, entity: E) {
    let backend = db.get_database_backend();
    let statement = Schema::new(backend).create_table_from_entity(entity);
    db.execute(&statement).await.expect("create test table");
}
