//! Migrations for the outbox tables on PostgreSQL, MariaDB/MySQL and SQLite.
//!
//! The DDL lives in plain SQL files under `sql/<backend>/` (apply them with
//! `psql`, `mariadb` or `sqlite3` if you do not use SeaORM); the migrations
//! here run exactly those files. Add [`CreateOutbox`],
//! [`CreateRelayShards`] and (for consumers) [`CreateInbox`] and
//! [`CreateInboxGaps`], and [`CreateReplay`] where `outbox-relay replay`
//! runs, to your own `sea-orm-migration` migrator, or run
//! [`Migrator`] on its own. On PostgreSQL and MariaDB/MySQL,
//! [`PartitionOutbox`] (or [`PartitionedMigrator`]) partitions the outbox
//! by day:
//!
//! ```no_run
//! use outbox_migrations::Migrator;
//! use sea_orm_migration::MigratorTrait;
//!
//! # async fn run(db: &sea_orm_migration::sea_orm::DatabaseConnection) -> Result<(), sea_orm_migration::DbErr> {
//! Migrator::up(db, None).await?;
//! # Ok(()) }
//! ```

use sea_orm_migration::async_trait::async_trait;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};
use sea_orm_migration::sea_query::IntoIden;
use sea_orm_migration::{DbErr, MigrationName, MigrationTrait, MigratorTrait, SchemaManager};

/// The DDL of one migration, per backend.
struct Sql {
    postgres: &'static str,
    mysql: &'static str,
    sqlite: &'static str,
}

impl Sql {
    fn for_backend(&self, backend: DbBackend) -> &'static str {
        match backend {
            DbBackend::Postgres => self.postgres,
            DbBackend::MySql => self.mysql,
            DbBackend::Sqlite => self.sqlite,
            // DbBackend is non-exhaustive; every backend SeaORM ships is listed above.
            #[allow(unreachable_patterns)]
            _ => "",
        }
    }
}

macro_rules! sql_files_without_sqlite {
    ($name:literal) => {
        Sql {
            postgres: include_str!(concat!("../sql/postgres/", $name)),
            mysql: include_str!(concat!("../sql/mysql/", $name)),
            sqlite: "",
        }
    };
}

macro_rules! sql_files {
    ($name:literal) => {
        Sql {
            postgres: include_str!(concat!("../sql/postgres/", $name)),
            mysql: include_str!(concat!("../sql/mysql/", $name)),
            sqlite: include_str!(concat!("../sql/sqlite/", $name)),
        }
    };
}

/// Creates the `outbox` and `outbox_sequence` tables, their indexes and, on
/// PostgreSQL, the trigger that notifies a listening relay.
pub struct CreateOutbox;

impl MigrationName for CreateOutbox {
    fn name(&self) -> &str {
        "m20261129_000001_create_outbox"
    }
}

#[async_trait]
impl MigrationTrait for CreateOutbox {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run(manager, &sql_files!("0001_create_outbox.up.sql")).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run(manager, &sql_files!("0001_create_outbox.down.sql")).await
    }
}

async fn run(manager: &SchemaManager<'_>, sql: &Sql) -> Result<(), DbErr> {
    let backend = manager.get_database_backend();
    let script = sql.for_backend(backend);
    if script.is_empty() {
        return Err(DbErr::Migration(format!(
            "the outbox has no migration for {backend:?}; use PostgreSQL, MariaDB/MySQL or SQLite"
        )));
    }
    manager.get_connection().execute_unprepared(script).await?;
    Ok(())
}

/// Creates the tables through which several relay instances share the
/// work: shard leases with a fencing epoch, and live instances.
pub struct CreateRelayShards;

impl MigrationName for CreateRelayShards {
    fn name(&self) -> &str {
        "m20261129_000002_create_relay_shards"
    }
}

#[async_trait]
impl MigrationTrait for CreateRelayShards {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run(manager, &sql_files!("0002_relay_shards.up.sql")).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run(manager, &sql_files!("0002_relay_shards.down.sql")).await
    }
}

/// Creates the consumers' inbox tables: the ids of the events each consumer
/// applied (`outbox_inbox`) and the highest sequence number applied per
/// aggregate (`outbox_inbox_sequence`), used by `outbox_core::Inbox`.
pub struct CreateInbox;

impl MigrationName for CreateInbox {
    fn name(&self) -> &str {
        "m20261129_000003_create_inbox"
    }
}

#[async_trait]
impl MigrationTrait for CreateInbox {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run(manager, &sql_files!("0003_create_inbox.up.sql")).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run(manager, &sql_files!("0003_create_inbox.down.sql")).await
    }
}

/// PostgreSQL: the `NOTIFY` trigger fires only while a relay waits for new
/// rows (it holds the wake-up advisory locks the trigger tries), so that
/// writers pay for no notification while the relay is busy or absent.
/// Nothing to do on MariaDB/MySQL and SQLite, whose relays poll.
pub struct NotifyWaitingRelays;

impl MigrationName for NotifyWaitingRelays {
    fn name(&self) -> &str {
        "m20261130_000004_notify_waiting_relays"
    }
}

#[async_trait]
impl MigrationTrait for NotifyWaitingRelays {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_on_postgres(
            manager,
            include_str!("../sql/postgres/0004_notify_waiting_relays.up.sql"),
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_on_postgres(
            manager,
            include_str!("../sql/postgres/0004_notify_waiting_relays.down.sql"),
        )
        .await
    }
}

/// The index through which the relay claims each aggregate's pending rows
/// in `aggregate_seq` order, so concurrent writers of one aggregate never
/// see its events published out of order.
pub struct ClaimInAggregateOrder;

impl MigrationName for ClaimInAggregateOrder {
    fn name(&self) -> &str {
        "m20261201_000005_claim_in_aggregate_order"
    }
}

#[async_trait]
impl MigrationTrait for ClaimInAggregateOrder {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run(manager, &sql_files!("0005_claim_in_aggregate_order.up.sql")).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run(
            manager,
            &sql_files!("0005_claim_in_aggregate_order.down.sql"),
        )
        .await
    }
}

/// Creates the table of the sequence numbers each inbox consumer's
/// high-water mark skipped over at a gap (`outbox_inbox_gap`), through which
/// `outbox_core::Inbox` tells an event that arrives late, never applied,
/// from a redelivery of one it applied.
pub struct CreateInboxGaps;

impl MigrationName for CreateInboxGaps {
    fn name(&self) -> &str {
        "m20261201_000006_create_inbox_gaps"
    }
}

#[async_trait]
impl MigrationTrait for CreateInboxGaps {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run(manager, &sql_files!("0006_create_inbox_gaps.up.sql")).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run(manager, &sql_files!("0006_create_inbox_gaps.down.sql")).await
    }
}

/// MariaDB/MySQL: the table of each relay instance's database sessions, so
/// that an instance taking over the shards of one whose lease expired can
/// end its sessions. Nothing to do on PostgreSQL (sessions are found by
/// `application_name`) and SQLite (one relay per file).
pub struct RelaySessions;

impl MigrationName for RelaySessions {
    fn name(&self) -> &str {
        "m20261201_000007_relay_sessions"
    }
}

#[async_trait]
impl MigrationTrait for RelaySessions {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_on_mysql(
            manager,
            include_str!("../sql/mysql/0007_relay_sessions.up.sql"),
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_on_mysql(
            manager,
            include_str!("../sql/mysql/0007_relay_sessions.down.sql"),
        )
        .await
    }
}

/// PostgreSQL and MariaDB/MySQL: makes the outbox a table partitioned by
/// day on `created_at`, so that retention drops whole days
/// (`outbox-relay partitions maintain`) instead of deleting rows. Not in
/// [`Migrator`]: run [`PartitionedMigrator`], or add this after the other
/// outbox migrations of your own migrator. An existing plain outbox is
/// converted in place, its rows kept (see the SQL files' headers for what
/// that costs). SQLite refuses it with an error that says so.
pub struct PartitionOutbox;

impl MigrationName for PartitionOutbox {
    fn name(&self) -> &str {
        "m20261203_000008_partition_outbox"
    }
}

#[async_trait]
impl MigrationTrait for PartitionOutbox {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_partitioned(
            manager,
            &sql_files_without_sqlite!("0008_partition_outbox.up.sql"),
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_partitioned(
            manager,
            &sql_files_without_sqlite!("0008_partition_outbox.down.sql"),
        )
        .await
    }
}

/// Creates the audit records of `outbox-relay replay` (`outbox_replay`) and
/// the plans of running replays (`outbox_replay_row`): the selected events
/// in the order a replay sends them, so that it can be resumed where it
/// stopped.
pub struct CreateReplay;

impl MigrationName for CreateReplay {
    fn name(&self) -> &str {
        "m20261203_000009_create_replay"
    }
}

#[async_trait]
impl MigrationTrait for CreateReplay {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run(manager, &sql_files!("0009_create_replay.up.sql")).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run(manager, &sql_files!("0009_create_replay.down.sql")).await
    }
}

/// PostgreSQL, on an outbox partitioned by [`PartitionOutbox`]: creating day
/// partitions by hand (`SELECT outbox_create_partitions(7)`) waits for the
/// claims open on the outbox before it moves rows out of the default
/// partition, as `outbox-relay partitions maintain` does, instead of
/// deadlocking with a claim that waits for a moved row. Nothing on
/// MariaDB/MySQL, whose days are split by the relay.
pub struct PartitionCreationWaitsForClaims;

impl MigrationName for PartitionCreationWaitsForClaims {
    fn name(&self) -> &str {
        "m20261204_000010_partition_creation_waits_for_claims"
    }
}

#[async_trait]
impl MigrationTrait for PartitionCreationWaitsForClaims {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_on_postgres(
            manager,
            include_str!("../sql/postgres/0010_partition_creation_waits_for_claims.up.sql"),
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_on_postgres(
            manager,
            include_str!("../sql/postgres/0010_partition_creation_waits_for_claims.down.sql"),
        )
        .await
    }
}

/// PostgreSQL, on an outbox partitioned by [`PartitionOutbox`]: claims
/// leave out the days partition maintenance settled (every row published
/// or dead-lettered, before yesterday): the table `outbox_claim_window`
/// holds the first day claims read, and a settled day's row trigger sets
/// it back when one of its rows becomes pending again. Nothing on
/// MariaDB/MySQL.
pub struct ClaimsSkipSettledDays;

impl MigrationName for ClaimsSkipSettledDays {
    fn name(&self) -> &str {
        "m20261205_000011_claims_skip_settled_days"
    }
}

#[async_trait]
impl MigrationTrait for ClaimsSkipSettledDays {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_on_postgres(
            manager,
            include_str!("../sql/postgres/0011_claims_skip_settled_days.up.sql"),
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_on_postgres(
            manager,
            include_str!("../sql/postgres/0011_claims_skip_settled_days.down.sql"),
        )
        .await
    }
}

/// PostgreSQL, on an outbox partitioned by [`PartitionOutbox`]: one
/// partition maintenance at a time per outbox instead of per database, so
/// that outboxes in other schemas of one database never wait for each
/// other's maintenance. Nothing on MariaDB/MySQL.
pub struct MaintenanceLockPerOutbox;

impl MigrationName for MaintenanceLockPerOutbox {
    fn name(&self) -> &str {
        "m20261206_000012_maintenance_lock_per_outbox"
    }
}

#[async_trait]
impl MigrationTrait for MaintenanceLockPerOutbox {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_on_postgres(
            manager,
            include_str!("../sql/postgres/0012_maintenance_lock_per_outbox.up.sql"),
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_on_postgres(
            manager,
            include_str!("../sql/postgres/0012_maintenance_lock_per_outbox.down.sql"),
        )
        .await
    }
}

/// PostgreSQL: pending rows written by earlier appends, whose `seq` could
/// fall below an earlier-numbered event of their aggregate, trade `seq`
/// values within their aggregate, so that a claim by `seq` takes each
/// aggregate in `aggregate_seq` order. Nothing on MariaDB/MySQL and
/// SQLite, whose appends always drew `seq` under the aggregate's lock.
pub struct PendingRowsInAggregateOrder;

impl MigrationName for PendingRowsInAggregateOrder {
    fn name(&self) -> &str {
        "m20261207_000013_pending_rows_in_aggregate_order"
    }
}

#[async_trait]
impl MigrationTrait for PendingRowsInAggregateOrder {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_on_postgres(
            manager,
            include_str!("../sql/postgres/0013_pending_rows_in_aggregate_order.up.sql"),
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_on_postgres(
            manager,
            include_str!("../sql/postgres/0013_pending_rows_in_aggregate_order.down.sql"),
        )
        .await
    }
}

/// Runs a migration of the partitioned outbox; on SQLite, an error that
/// says why there is none.
async fn run_partitioned(manager: &SchemaManager<'_>, sql: &Sql) -> Result<(), DbErr> {
    if manager.get_database_backend() == DbBackend::Sqlite {
        return Err(DbErr::Migration(
            "a day-partitioned outbox needs PostgreSQL or MariaDB/MySQL: SQLite has no table \
             partitioning; keep the plain outbox and delete published rows with \
             `outbox-relay cleanup`"
                .to_owned(),
        ));
    }
    run(manager, sql).await
}

/// Runs `script` on MariaDB/MySQL; nothing elsewhere.
async fn run_on_mysql(manager: &SchemaManager<'_>, script: &str) -> Result<(), DbErr> {
    if manager.get_database_backend() == DbBackend::MySql {
        manager.get_connection().execute_unprepared(script).await?;
    }
    Ok(())
}

/// Runs `script` on PostgreSQL; nothing elsewhere.
async fn run_on_postgres(manager: &SchemaManager<'_>, script: &str) -> Result<(), DbErr> {
    if manager.get_database_backend() == DbBackend::Postgres {
        manager.get_connection().execute_unprepared(script).await?;
    }
    Ok(())
}

/// Every outbox migration, in order, tracked in its own table
/// (`outbox_migrations`) so that the relay's `migrate` and the
/// application's own migrator never trip over each other's history. The
/// DDL is idempotent, so applying it through both is harmless.
pub struct Migrator;

#[async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(CreateOutbox),
            Box::new(CreateRelayShards),
            Box::new(CreateInbox),
            Box::new(NotifyWaitingRelays),
            Box::new(ClaimInAggregateOrder),
            Box::new(CreateInboxGaps),
            Box::new(RelaySessions),
            Box::new(CreateReplay),
            Box::new(PendingRowsInAggregateOrder),
        ]
    }

    fn migration_table_name() -> sea_orm_migration::sea_orm::DynIden {
        sea_orm_migration::sea_query::Alias::new("outbox_migrations").into_iden()
    }
}

/// [`Migrator`]'s migrations, then [`PartitionOutbox`]: the outbox
/// partitioned by day (PostgreSQL, MariaDB/MySQL). Same history table as [`Migrator`];
/// once it ran, run this one, not [`Migrator`] (which would find a
/// migration it does not know in the history and stop).
pub struct PartitionedMigrator;

#[async_trait]
impl MigratorTrait for PartitionedMigrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        let mut migrations = Migrator::migrations();
        migrations.push(Box::new(PartitionOutbox));
        migrations.push(Box::new(PartitionCreationWaitsForClaims));
        migrations.push(Box::new(ClaimsSkipSettledDays));
        migrations.push(Box::new(MaintenanceLockPerOutbox));
        // In the order of their names, as they were released.
        migrations.sort_by(|a, b| a.name().cmp(b.name()));
        migrations
    }

    fn migration_table_name() -> sea_orm_migration::sea_orm::DynIden {
        Migrator::migration_table_name()
    }
}

#[cfg(test)]
mod tests {
    use outbox_contract::{table, wakeup};

    const CREATE_OUTBOX: &str = include_str!("../sql/postgres/0001_create_outbox.up.sql");
    const NOTIFY_WAITING_RELAYS: &str =
        include_str!("../sql/postgres/0004_notify_waiting_relays.up.sql");

    #[test]
    fn the_trigger_notifies_the_contracts_channel() {
        let notify = format!("pg_notify('{}', '')", wakeup::CHANNEL);
        assert!(CREATE_OUTBOX.contains(&notify), "{notify}");
    }

    #[test]
    fn the_trigger_tries_the_contracts_wakeup_slots() {
        let try_slot = format!(
            "pg_try_advisory_xact_lock({}, pg_backend_pid() % {})",
            wakeup::LOCK_KEY,
            wakeup::SLOTS
        );
        assert!(NOTIFY_WAITING_RELAYS.contains(&try_slot), "{try_slot}");
    }

    #[test]
    fn every_contract_column_is_created() {
        use table::column::*;
        let create = format!("CREATE TABLE IF NOT EXISTS {} (", table::OUTBOX);
        let start = CREATE_OUTBOX.find(&create).expect("the outbox table");
        let body = &CREATE_OUTBOX[start..];
        let body = &body[..body.find(");").expect("the table's end")];
        for column in [
            ID,
            AGGREGATE_TYPE,
            AGGREGATE_ID,
            EVENT_TYPE,
            PAYLOAD,
            SEQ,
            EVENT_VERSION,
            AGGREGATE_SEQ,
            TRACEPARENT,
            CREATED_AT,
            PUBLISHED_AT,
            ATTEMPTS,
            LAST_ERROR,
            DEAD_LETTERED_AT,
        ] {
            assert!(
                body.lines()
                    .any(|line| line.trim_start().starts_with(&format!("{column} "))),
                "column {column} missing from the outbox table"
            );
        }
        assert!(
            CREATE_OUTBOX.contains(&format!("CREATE TABLE IF NOT EXISTS {} (", table::SEQUENCE))
        );
    }
}
