//! The day-partitioned outbox (PostgreSQL, MariaDB): `migrate
//! --partitioned` on a new and on a live plain outbox, writers (SeaORM and plain SQL) and the
//! relay working on it unchanged, rows at the edges of days, and
//! maintenance that drops a past day only once every row in it is
//! published. What the relay published is read from its standard output
//! and compared, by event id, with what the writers wrote.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::{Days, NaiveTime, Utc};
use outbox_tests::http::{get, sample};
use outbox_tests::kafka::free_port;
use outbox_tests::process::{RelayProcess, assert_refused, run_to_end};
use outbox_tests::stream::{append_events, check_printed};
use outbox_tests::{Backend, TestDb};
use sea_orm::ConnectionTrait;
use serde_json::Value;

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");

fn relay_command(t: &TestDb, args: &[&str]) -> (i32, String, String) {
    run_to_end(Path::new(RELAY), args, &[("DATABASE_URL", &t.url)])
}

fn migrate_partitioned(t: &TestDb) {
    let (code, _, stderr) = relay_command(t, &["migrate", "--partitioned"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("(partitioned by day)"), "{stderr}");
}

/// `partitions --json`.
fn partitions(t: &TestDb) -> Value {
    let (code, stdout, stderr) = relay_command(t, &["partitions", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).expect("partitions --json prints JSON")
}

/// `partitions maintain --retain 3d --json`.
fn maintain(t: &TestDb) -> Value {
    maintain_retaining(t, "3d")
}

/// `partitions maintain --retain <retain> --json`, again while it reports a
/// partition kept for want of the outbox's lock (a relay's claim may hold
/// it for a moment; maintenance then leaves that day for the next run).
fn maintain_retaining(t: &TestDb, retain: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, stdout, stderr) =
            relay_command(t, &["partitions", "maintain", "--retain", retain, "--json"]);
        assert_eq!(code, 0, "{stderr}");
        let done: Value =
            serde_json::from_str(&stdout).expect("partitions maintain --json prints JSON");
        let busy = done["kept"]
            .as_array()
            .expect("kept")
            .iter()
            .any(|kept| kept["reason"].as_str().is_some_and(|r| r.contains("lock")));
        if !busy || Instant::now() > deadline {
            return done;
        }
    }
}

fn names(list: &Value, key: &str) -> Vec<String> {
    list[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} in {list}"))
        .iter()
        .map(|entry| entry["name"].as_str().expect("a name").to_owned())
        .collect()
}

/// The PostgreSQL partition of a day `offset` days from today (UTC).
fn day_partition(offset: i64) -> String {
    format!("outbox_{}", mariadb_day(offset))
}

/// The MariaDB partition of a day `offset` days from today (UTC).
fn mariadb_day(offset: i64) -> String {
    let today = Utc::now().date_naive();
    let day = if offset >= 0 {
        today.checked_add_days(Days::new(offset as u64))
    } else {
        today.checked_sub_days(Days::new(offset.unsigned_abs()))
    };
    format!("p{}", day.expect("a day").format("%Y%m%d"))
}

/// SQL for `days` days before now, on `t`'s backend.
fn days_ago(t: &TestDb, days: i64) -> String {
    match t.backend {
        Backend::MySql => format!("UTC_TIMESTAMP(6) - INTERVAL {days} DAY"),
        _ => format!("now() - interval '{days} days'"),
    }
}

/// SQL for the instant `at`, on `t`'s backend (MariaDB's `DATETIME`
/// holds UTC).
fn instant(t: &TestDb, at: chrono::DateTime<Utc>) -> String {
    match t.backend {
        Backend::MySql => format!("'{}'", at.format("%Y-%m-%d %H:%M:%S%.6f")),
        _ => format!("'{}'", at.to_rfc3339()),
    }
}

/// Inserts a row by plain SQL (Debezium's five columns and `created_at`,
/// an SQL expression), dead-lettered if asked; returns its id.
async fn insert_at(t: &TestDb, aggregate_id: &str, created_at: &str, dead: bool) -> String {
    let id = uuid::Uuid::now_v7().to_string();
    let dead_lettered_at = if dead { "CURRENT_TIMESTAMP" } else { "NULL" };
    t.db.execute_unprepared(&format!(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at, \
         dead_lettered_at) VALUES ('{id}', 'Ledger', '{aggregate_id}', 'LedgerPosted', \
         '{{}}', {created_at}, {dead_lettered_at})"
    ))
    .await
    .expect("insert a row by plain SQL");
    id
}

/// The partition holding row `id`.
async fn partition_of(t: &TestDb, id: &str) -> String {
    if t.backend == Backend::MySql {
        for name in names(&partitions(t), "partitions") {
            if t.count(&format!("outbox PARTITION ({name}) WHERE id = '{id}'"))
                .await
                > 0
            {
                return name;
            }
        }
        panic!("row {id} is gone");
    }
    let row =
        t.db.query_one_raw(sea_orm::Statement::from_string(
            t.db_backend(),
            format!("SELECT tableoid::regclass::text FROM outbox WHERE id = '{id}'"),
        ))
        .await
        .expect("select the row's partition")
        .unwrap_or_else(|| panic!("row {id} is gone"));
    row.try_get_by_index(0).expect("partition name")
}

/// Whether partition `name` exists.
async fn partition_exists(t: &TestDb, name: &str) -> bool {
    names(&partitions(t), "partitions")
        .iter()
        .any(|n| n == name)
}

/// Waits until no row is pending, the relay still running.
async fn wait_until_drained(t: &TestDb, relay: &mut RelayProcess) {
    let deadline = Instant::now() + Duration::from_secs(90);
    let pending = "outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL";
    while t.count(pending).await > 0 {
        if !relay.is_running() || Instant::now() > deadline {
            let rows =
                t.db.query_all_raw(sea_orm::Statement::from_string(
                    t.db_backend(),
                    "SELECT aggregateid, seq FROM outbox \
                     WHERE published_at IS NULL AND dead_lettered_at IS NULL",
                ))
                .await
                .expect("pending rows");
            let rows: Vec<(String, i64)> = rows
                .iter()
                .map(|row| {
                    (
                        row.try_get_by_index(0).expect("aggregateid"),
                        row.try_get_by_index(1).expect("seq"),
                    )
                })
                .collect();
            panic!(
                "rows still pending: {rows:?}; ownership: {}; relay stderr:\n{}",
                t.describe_ownership().await,
                relay.stderr().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn maintenance_drops_a_past_day_only_once_every_row_in_it_is_published() {
    let t = TestDb::new(Backend::Postgres).await;
    migrate_partitioned(&t);
    let listed = partitions(&t);
    let all = names(&listed, "partitions");
    assert!(all.contains(&day_partition(0)), "{all:?}");
    assert!(all.contains(&day_partition(7)), "{all:?}");
    assert!(all.contains(&"outbox_default".to_owned()), "{all:?}");
    assert!(listed["days_ahead"].as_i64().unwrap() >= 8, "{listed}");

    // Rows of past days (as if written before the clock moved on), caught
    // by the default partition: maintenance gives each day its partition.
    let mut written = Vec::new();
    for (aggregate, days) in [("old-10", 10), ("old-9", 9)] {
        for _ in 0..2 {
            let at = format!("now() - interval '{days} days'");
            written.push(insert_at(&t, aggregate, &at, false).await);
        }
    }
    assert_eq!(partition_of(&t, &written[0]).await, "outbox_default");
    let first = maintain(&t);
    assert_eq!(first["created"].as_i64(), Some(2), "{first}");
    assert!(names(&first, "dropped").is_empty(), "pending days: {first}");
    assert_eq!(
        names(&first, "kept"),
        [day_partition(-10), day_partition(-9)],
        "{first}"
    );
    assert_eq!(partition_of(&t, &written[0]).await, day_partition(-10));
    assert_eq!(partition_of(&t, &written[3]).await, day_partition(-9));

    // The relay publishes everything, SeaORM's and plain SQL's rows alike.
    let mut relay = RelayProcess::spawn(
        Path::new(RELAY),
        &["run", "--sink", "stdout", "--poll-interval", "100ms"],
        &[("DATABASE_URL", &t.url)],
    );
    for aggregate in ["inv-a", "inv-b"] {
        let appended = append_events(&t.db, aggregate, 10).await;
        written.extend(appended.iter().map(|event| event.id.to_string()));
    }
    written.extend(
        t.insert_plain_rows(3, 4)
            .await
            .into_iter()
            .map(|(_, id)| id),
    );
    wait_until_drained(&t, &mut relay).await;

    // Paused, the relay leaves a new row of nine days ago pending; a
    // dead-lettered row of eight days ago is no more published.
    relay.signal("STOP");
    let late = insert_at(&t, "old-9", "now() - interval '9 days'", false).await;
    written.push(late.clone());
    let dead = insert_at(&t, "old-8", "now() - interval '8 days'", true).await;
    let second = maintain(&t);
    assert_eq!(names(&second, "dropped"), [day_partition(-10)], "{second}");
    assert_eq!(
        names(&second, "kept"),
        [day_partition(-9), day_partition(-8)],
        "{second}"
    );
    let kept = &second["kept"];
    assert_eq!(kept[0]["pending"].as_i64(), Some(1), "{second}");
    assert_eq!(kept[1]["dead_letters"].as_i64(), Some(1), "{second}");
    assert!(!partition_exists(&t, &day_partition(-10)).await);
    assert_eq!(partition_of(&t, &late).await, day_partition(-9));
    assert_eq!(partition_of(&t, &dead).await, day_partition(-8));

    // Resumed, the relay publishes the late row; the next maintenance
    // drops its day and keeps the dead letter's.
    relay.signal("CONT");
    let during = append_events(&t.db, "inv-a", 5).await;
    written.extend(during.iter().map(|event| event.id.to_string()));
    wait_until_drained(&t, &mut relay).await;
    let third = maintain(&t);
    assert_eq!(names(&third, "dropped"), [day_partition(-9)], "{third}");
    assert_eq!(names(&third, "kept"), [day_partition(-8)], "{third}");
    assert_eq!(partition_of(&t, &dead).await, day_partition(-8));

    relay.terminate();
    check_printed(&relay.stdout(), &written);
    t.drop().await;
}

/// MariaDB: the rows of a converted outbox are in its first partition,
/// `p_before`; maintenance keeps it while one of them is dead-lettered or
/// pending and drops it once all are published; a row older than every
/// partition then lands in the next one, never failing.
#[tokio::test(flavor = "multi_thread")]
async fn mariadb_maintenance_drops_the_first_partition_only_once_every_row_in_it_is_published() {
    let t = TestDb::new(Backend::MySql).await;
    let mut written = Vec::new();
    for (aggregate, days) in [("old-10", 10), ("old-9", 9)] {
        written.push(insert_at(&t, aggregate, &days_ago(&t, days), false).await);
    }
    let dead = insert_at(&t, "old-8", &days_ago(&t, 8), true).await;
    written.push(dead.clone());
    migrate_partitioned(&t);
    let listed = partitions(&t);
    let all = names(&listed, "partitions");
    for name in ["p_before", &mariadb_day(0), &mariadb_day(7), "p_future"] {
        assert!(all.iter().any(|n| n == name), "{name} in {all:?}");
    }
    assert!(listed["days_ahead"].as_i64().unwrap() >= 8, "{listed}");
    assert_eq!(partition_of(&t, &written[0]).await, "p_before");

    let mut relay = RelayProcess::spawn(
        Path::new(RELAY),
        &["run", "--sink", "stdout", "--poll-interval", "100ms"],
        &[("DATABASE_URL", &t.url)],
    );
    for aggregate in ["inv-a", "inv-b"] {
        let appended = append_events(&t.db, aggregate, 10).await;
        written.extend(appended.iter().map(|event| event.id.to_string()));
    }
    wait_until_drained(&t, &mut relay).await;
    let first = maintain_retaining(&t, "0s");
    assert!(names(&first, "dropped").is_empty(), "{first}");
    assert_eq!(names(&first, "kept"), ["p_before"], "{first}");
    assert_eq!(
        first["kept"][0]["dead_letters"].as_i64(),
        Some(1),
        "{first}"
    );

    // Re-driven, the dead letter is published; paused, the relay leaves a
    // new old row pending, which keeps the partition.
    let (code, _, stderr) = relay_command(&t, &["retry"]);
    assert_eq!(code, 0, "{stderr}");
    wait_until_drained(&t, &mut relay).await;
    relay.signal("STOP");
    let late = insert_at(&t, "old-9", &days_ago(&t, 9), false).await;
    written.push(late.clone());
    let second = maintain_retaining(&t, "0s");
    assert!(names(&second, "dropped").is_empty(), "{second}");
    assert_eq!(second["kept"][0]["pending"].as_i64(), Some(1), "{second}");
    assert_eq!(partition_of(&t, &late).await, "p_before");

    relay.signal("CONT");
    wait_until_drained(&t, &mut relay).await;
    // What a drop interrupted after its swap leaves: the swapped-out
    // table, which the next drop replaces.
    for statement in [
        "CREATE TABLE outbox_retired_p_before LIKE outbox",
        "ALTER TABLE outbox_retired_p_before REMOVE PARTITIONING",
    ] {
        t.db.execute_unprepared(statement)
            .await
            .expect("a leftover swapped-out table");
    }
    let third = maintain_retaining(&t, "0s");
    assert_eq!(names(&third, "dropped"), ["p_before"], "{third}");
    assert!(!partition_exists(&t, "p_before").await);
    // The table the day's rows were swapped into is gone with them.
    let retired = "information_schema.tables WHERE table_schema = DATABASE() \
                   AND table_name LIKE 'outbox\\_retired\\_%'";
    assert_eq!(t.count(retired).await, 0);
    let older = insert_at(&t, "old-20", &days_ago(&t, 20), false).await;
    written.push(older.clone());
    assert_eq!(partition_of(&t, &older).await, mariadb_day(0));
    wait_until_drained(&t, &mut relay).await;

    relay.terminate();
    check_printed(&relay.stdout(), &written);
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_at_the_edges_of_days_and_far_ahead_are_kept_and_published_postgres() {
    rows_at_the_edges_of_days_and_far_ahead(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_at_the_edges_of_days_and_far_ahead_are_kept_and_published_mariadb() {
    rows_at_the_edges_of_days_and_far_ahead(Backend::MySql).await;
}

/// Rows at 23:59:59.999 and at midnight land in their own days; rows far
/// ahead never fail: PostgreSQL's default partition takes them and
/// maintenance gives each its day (`infinity` stays); MariaDB's `p_future`
/// keeps them. All are published.
async fn rows_at_the_edges_of_days_and_far_ahead(backend: Backend) {
    let t = TestDb::new(backend).await;
    migrate_partitioned(&t);
    let (day_name, catch_all) = match backend {
        Backend::MySql => (mariadb_day as fn(i64) -> String, "p_future"),
        _ => (day_partition as fn(i64) -> String, "outbox_default"),
    };
    let day = |offset: u64| {
        Utc::now()
            .date_naive()
            .checked_add_days(Days::new(offset))
            .expect("a day")
    };
    let last_instant = day(3)
        .and_time(NaiveTime::from_hms_milli_opt(23, 59, 59, 999).unwrap())
        .and_utc();
    let midnight = day(4).and_time(NaiveTime::MIN).and_utc();
    let in_a_month_at = day(40).and_time(NaiveTime::MIN).and_utc();
    let far_at: chrono::DateTime<Utc> = "2999-06-01T12:00:00Z".parse().unwrap();
    let before_midnight = insert_at(&t, "edge", &instant(&t, last_instant), false).await;
    let at_midnight = insert_at(&t, "edge", &instant(&t, midnight), false).await;
    let in_a_month = insert_at(&t, "far", &instant(&t, in_a_month_at), false).await;
    let far = insert_at(&t, "far", &instant(&t, far_at), false).await;
    let mut written = vec![
        before_midnight.clone(),
        at_midnight.clone(),
        in_a_month.clone(),
        far.clone(),
    ];
    assert_eq!(partition_of(&t, &before_midnight).await, day_name(3));
    // A dead-lettered row with the first row's id in the same partition
    // (the primary key is the id and the creation time): the mark of the
    // claimed row must leave it as it is.
    let twin_at = last_instant - chrono::Duration::seconds(1);
    t.db.execute_unprepared(&format!(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at, \
         dead_lettered_at) VALUES ('{before_midnight}', 'Ledger', 'twin', 'LedgerPosted', \
         '{{}}', {}, CURRENT_TIMESTAMP)",
        instant(&t, twin_at)
    ))
    .await
    .expect("insert a dead-lettered row sharing an id");
    let twin = format!(
        "outbox WHERE id = '{before_midnight}' AND aggregateid = 'twin' \
         AND published_at IS NULL AND dead_lettered_at IS NOT NULL"
    );
    assert_eq!(t.count(&twin).await, 1);
    assert_eq!(partition_of(&t, &at_midnight).await, day_name(4));
    for id in [&in_a_month, &far] {
        assert_eq!(partition_of(&t, id).await, catch_all);
    }

    if backend == Backend::Postgres {
        let infinite = insert_at(&t, "far", "'infinity'", false).await;
        written.push(infinite.clone());
        let done = maintain(&t);
        assert_eq!(done["created"].as_i64(), Some(2), "{done}");
        assert_eq!(done["default_rows"].as_i64(), Some(1), "{done}");
        assert_eq!(partition_of(&t, &in_a_month).await, day_partition(40));
        assert_eq!(partition_of(&t, &far).await, "outbox_p29990601");
        assert_eq!(partition_of(&t, &infinite).await, catch_all);
    } else {
        let done = maintain(&t);
        assert_eq!(done["created"].as_i64(), Some(0), "{done}");
        assert_eq!(done["default_rows"].as_i64(), Some(2), "{done}");
        assert_eq!(partition_of(&t, &in_a_month).await, catch_all);
    }

    let (code, stdout, stderr) = relay_command(&t, &["run", "--drain", "--sink", "stdout"]);
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
    check_printed(&lines, &written);
    // One claim holds rows of five partitions; each row is marked where it
    // is, so a drain without faults sends none of them twice.
    assert_eq!(lines.len(), written.len(), "each row sent once:\n{stdout}");
    let pending = "outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL";
    assert_eq!(t.count(pending).await, 0);
    assert_eq!(
        t.count(&twin).await,
        1,
        "the twin of a published row is untouched"
    );

    // The table listing reads the same partitions.
    let (code, table, stderr) = relay_command(&t, &["partitions"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(table.contains(&day_name(4)), "{table}");
    assert!(table.contains(catch_all), "{table}");
    assert!(table.contains("days from today have partitions"), "{table}");
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_live_plain_outbox_converts_without_losing_or_reordering_an_event_postgres() {
    a_live_plain_outbox_converts(Backend::Postgres, "outbox_unpartitioned").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_live_plain_outbox_converts_without_losing_or_reordering_an_event_mariadb() {
    a_live_plain_outbox_converts(Backend::MySql, "p_before").await;
}

/// `migrate --partitioned` while writers append to a few aggregates and a
/// relay publishes: every event arrives, each aggregate in order, and the
/// rows written before are in the partition `earlier` of all that came
/// before.
async fn a_live_plain_outbox_converts(backend: Backend, earlier: &str) {
    let t = TestDb::new(backend).await;
    let mut written: Vec<String> = Vec::new();
    for aggregate in ["acct-0", "acct-1"] {
        let appended = append_events(&t.db, aggregate, 10).await;
        written.extend(appended.iter().map(|event| event.id.to_string()));
    }
    written.extend(
        t.insert_plain_rows(2, 3)
            .await
            .into_iter()
            .map(|(_, id)| id),
    );

    let mut relay = RelayProcess::spawn(
        Path::new(RELAY),
        &["run", "--sink", "stdout", "--batch-size", "5"],
        &[("DATABASE_URL", &t.url)],
    );
    // Writers keep appending to the same few aggregates throughout.
    let (stop, writers) = spawn_writers(&t, "acct", 4);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = t.count("outbox").await;
    migrate_partitioned(&t);
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        written.extend(writer.await.expect("writer"));
    }
    assert!(t.count("outbox").await > before, "writers kept writing");
    wait_until_drained(&t, &mut relay).await;

    let listed = partitions(&t);
    assert!(
        names(&listed, "partitions").contains(&earlier.to_owned()),
        "{listed}"
    );
    assert_eq!(t.count("outbox").await, written.len() as i64);
    // `status` reads the partitioned table as the plain one.
    let (code, stdout, stderr) = relay_command(&t, &["status", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let status: Value = serde_json::from_str(&stdout).expect("status --json prints JSON");
    assert_eq!(status["pending"].as_i64(), Some(0), "{status}");
    assert_eq!(
        status["published"].as_i64(),
        Some(written.len() as i64),
        "{status}"
    );
    relay.terminate();
    check_printed(&relay.stdout(), &written);
    t.drop().await;
}

/// Three writers appending three events at a time to `aggregates`
/// aggregates (`<prefix>-0`, ...) in turn until `stop` is set; each returns
/// the ids it wrote.
fn spawn_writers(
    t: &TestDb,
    prefix: &'static str,
    aggregates: usize,
) -> (Arc<AtomicBool>, Vec<tokio::task::JoinHandle<Vec<String>>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let writers = (0..3)
        .map(|writer| {
            let db = t.db.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut ids = Vec::new();
                let mut round = 0;
                while !stop.load(Ordering::Relaxed) {
                    let aggregate = format!("{prefix}-{}", (writer + round) % aggregates);
                    let appended = append_events(&db, &aggregate, 3).await;
                    ids.extend(appended.iter().map(|event| event.id.to_string()));
                    round += 1;
                }
                ids
            })
        })
        .collect();
    (stop, writers)
}

/// Waits until `/readyz` answers 200 with a body `check` accepts, and
/// `/metrics` too; returns both bodies.
async fn wait_for_endpoints(
    addr: &str,
    relay: &mut RelayProcess,
    check: impl Fn(&str, &str) -> bool,
) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let (Some((200, ready)), Some((200, metrics))) =
            (get(addr, "/readyz"), get(addr, "/metrics"))
            && check(&ready, &metrics)
        {
            return (ready, metrics);
        }
        assert!(
            relay.is_running() && Instant::now() < deadline,
            "readyz: {:?}; relay stderr:\n{}",
            get(addr, "/readyz"),
            relay.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_running_relay_warns_when_days_run_short_and_maintains_them_when_asked_postgres() {
    the_running_relay_keeps_partitions(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_running_relay_warns_when_days_run_short_and_maintains_them_when_asked_mariadb() {
    the_running_relay_keeps_partitions(Backend::MySql).await;
}

/// With only today and tomorrow partitioned, `/readyz` warns and the
/// gauges say so; with `--partition-maintenance` the relay creates the
/// coming days, publishes an old row and then drops the partition that
/// held it.
async fn the_running_relay_keeps_partitions(backend: Backend) {
    let t = TestDb::new(backend).await;
    migrate_partitioned(&t);
    let coming: Vec<String> = (2..=7)
        .map(|offset| match backend {
            Backend::MySql => mariadb_day(offset),
            _ => day_partition(offset),
        })
        .collect();
    let drop = match backend {
        Backend::MySql => format!("ALTER TABLE outbox DROP PARTITION {}", coming.join(", ")),
        _ => format!("DROP TABLE {}", coming.join(", ")),
    };
    t.db.execute_unprepared(&drop).await.unwrap();
    // PostgreSQL: in the default partition until maintenance gives its day
    // one; MariaDB: in the first partition, which holds every earlier row.
    let old = insert_at(&t, "old-10", &days_ago(&t, 10), false).await;
    let (old_partition, waiting) = match backend {
        Backend::MySql => ("p_before".to_owned(), 0.0),
        _ => (day_partition(-10), 1.0),
    };
    let addr = format!("127.0.0.1:{}", free_port());
    let env = [("DATABASE_URL", t.url.as_str())];
    let watching = [
        "run",
        "--sink",
        "stdout",
        "--metrics-addr",
        &addr,
        "--metrics-interval",
        "200ms",
    ];
    let mut relay = RelayProcess::spawn(Path::new(RELAY), &watching, &env);
    let (ready, metrics) = wait_for_endpoints(&addr, &mut relay, |ready, _| {
        ready.contains("partitions 2 days ahead")
    })
    .await;
    assert!(
        ready.contains("warning: fewer than 3 days have partitions"),
        "{ready}"
    );
    assert_eq!(sample(&metrics, "outbox_partition_days_ahead"), Some(2.0));
    assert_eq!(
        sample(&metrics, "outbox_partition_default_rows"),
        Some(waiting)
    );
    relay.terminate();
    let mut printed = relay.stdout();

    let mut maintaining = watching.to_vec();
    maintaining.extend([
        "--partition-maintenance",
        "--retention",
        "0s",
        "--cleanup-interval",
        "1s",
    ]);
    let mut relay = RelayProcess::spawn(Path::new(RELAY), &maintaining, &env);
    let (ready, metrics) = wait_for_endpoints(&addr, &mut relay, |ready, metrics| {
        ready.contains("partitions 8 days ahead")
            && sample(metrics, "outbox_partitions_dropped_total") == Some(1.0)
    })
    .await;
    assert!(!ready.contains("warning"), "{ready}");
    assert_eq!(sample(&metrics, "outbox_partition_default_rows"), Some(0.0));
    // The old row's partition was dropped whole once it was published;
    // today's stays.
    assert!(!partition_exists(&t, &old_partition).await);
    assert_eq!(t.count(&format!("outbox WHERE id = '{old}'")).await, 0);
    relay.terminate();
    printed.extend(relay.stdout());
    check_printed(&printed, &[old]);
    // An insert older than every partition still lands somewhere.
    insert_at(&t, "old-20", &days_ago(&t, 20), false).await;
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn partitions_are_refused_where_they_cannot_work() {
    for backend in [Backend::Postgres, Backend::MySql] {
        let plain = TestDb::new(backend).await;
        for args in [
            &["partitions"][..],
            &["partitions", "maintain"],
            &["run", "--sink", "stdout", "--partition-maintenance"],
        ] {
            assert_refused(
                Path::new(RELAY),
                args,
                &[("DATABASE_URL", &plain.url)],
                1,
                "error: the outbox table is not partitioned; run `outbox-relay migrate \
                 --partitioned`",
                "\u{0}",
            );
        }
        plain.drop().await;
    }
    let t = TestDb::new(Backend::Sqlite).await;
    let env = [("DATABASE_URL", t.url.as_str())];
    assert_refused(
        Path::new(RELAY),
        &["migrate", "--partitioned"],
        &env,
        1,
        "error: migrating",
        "\u{0}",
    );
    let (_, _, stderr) = relay_command(&t, &["migrate", "--partitioned"]);
    assert!(
        stderr.contains("needs PostgreSQL or MariaDB/MySQL: SQLite has no table partitioning"),
        "{stderr}"
    );
    assert_refused(
        Path::new(RELAY),
        &["partitions", "maintain"],
        &env,
        1,
        "error: a day-partitioned outbox needs PostgreSQL or MariaDB/MySQL",
        "\u{0}",
    );
    assert_refused(
        Path::new(RELAY),
        &["run", "--sink", "stdout", "--partition-maintenance"],
        &env,
        1,
        "error: --partition-maintenance keeps a day-partitioned outbox",
        "\u{0}",
    );
    // The plain outbox still works.
    let (code, _, stderr) = relay_command(&t, &["migrate"]);
    assert_eq!(code, 0, "{stderr}");
    t.drop().await;
}

/// Two relays sharing a partitioned outbox by shards, each with partition
/// maintenance on a one-second schedule (so both try to maintain at once,
/// and often),
/// while writers append to the same few aggregates and rows of a past day
/// wait to be published and their day dropped. A separate Kafka consumer
/// reads every written event, each aggregate's in the order its writers
/// numbered them; the past day is dropped once published, and no
/// maintenance run fails.
async fn sharded_relays_maintain_a_partitioned_outbox_together(backend: Backend) {
    let brokers = outbox_tests::kafka::brokers();
    let prefix = outbox_tests::kafka::topic_prefix("partitioned-shards");
    let template = format!("{prefix}.{{aggregatetype}}");
    let t = TestDb::new(backend).await;
    migrate_partitioned(&t);
    let mut written = Vec::new();
    for _ in 0..3 {
        written.push(insert_at(&t, "old-10", &days_ago(&t, 10), false).await);
    }
    let args = [
        "run",
        "--sink",
        "kafka",
        "--brokers",
        brokers.as_str(),
        "--topic-template",
        template.as_str(),
        "--shards",
        "4",
        "--batch-size",
        "20",
        "--partition-maintenance",
        "--retention",
        "0s",
        "--cleanup-interval",
        "1s",
    ];
    let mut relays: Vec<RelayProcess> = (0..2)
        .map(|_| RelayProcess::spawn(Path::new(RELAY), &args, &[("DATABASE_URL", &t.url)]))
        .collect();
    let (stop, writers) = spawn_writers(&t, "inv", 5);
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        written.extend(writer.await.expect("writer"));
    }
    // Published, the past day's rows go with their partition.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pending = t.pending().await;
        let old_rows = t
            .count(&format!(
                "outbox WHERE aggregateid = 'old-10' AND created_at < {}",
                days_ago(&t, 5)
            ))
            .await;
        if pending == 0 && old_rows == 0 {
            break;
        }
        for relay in &mut relays {
            assert!(
                relay.is_running(),
                "a relay stopped:\n{}",
                relay.terminate()
            );
        }
        if Instant::now() > deadline {
            let listed = names(&partitions(&t), "partitions");
            let ownership = t.describe_ownership().await;
            let logs: Vec<String> = relays.iter_mut().map(RelayProcess::terminate).collect();
            panic!(
                "{pending} pending, {old_rows} rows of the past day left; partitions {listed:?}\n\
                 {ownership}\n{}",
                logs.join("\n----\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for relay in &mut relays {
        let stderr = relay.terminate();
        assert!(
            !stderr.contains("partition maintenance failed"),
            "a maintenance run failed:\n{stderr}"
        );
    }
    let messages = outbox_tests::kafka::consume(
        &brokers,
        &format!("{prefix}.Invoice"),
        written.len() - 3,
        Duration::from_secs(60),
        Duration::from_secs(2),
    );
    let mut lines: Vec<String> = messages
        .iter()
        .map(|message| {
            serde_json::json!({ "key": message.key, "headers": message.headers }).to_string()
        })
        .collect();
    let ledger = outbox_tests::kafka::consume(
        &brokers,
        &format!("{prefix}.Ledger"),
        3,
        Duration::from_secs(60),
        Duration::from_secs(1),
    );
    lines.extend(ledger.iter().map(|message| {
        serde_json::json!({ "key": message.key, "headers": message.headers }).to_string()
    }));
    check_printed(&lines, &written);
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sharded_relays_maintain_a_partitioned_outbox_together_postgres() {
    sharded_relays_maintain_a_partitioned_outbox_together(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sharded_relays_maintain_a_partitioned_outbox_together_mariadb() {
    sharded_relays_maintain_a_partitioned_outbox_together(Backend::MySql).await;
}

/// Rows waiting in PostgreSQL's default partition while two claims are
/// open, as a relay claiming ahead holds them: one holds a row the
/// maintenance must move into its day's partition, the other starts while
/// the maintenance waits. Moving the rows locks them and attaching the day
/// needs the default partition to itself, so without waiting for the
/// claims first the maintenance and the second claim deadlock (one of them
/// fails after a second). Here both succeed: the maintenance waits for the
/// open claim, the second claim for the maintenance.
#[tokio::test(flavor = "multi_thread")]
async fn creating_a_day_for_rows_of_the_default_partition_waits_for_open_claims() {
    creating_a_day_waits_for_open_claims(Creation::Relay).await;
}

/// The same with the days created by hand in SQL
/// (`SELECT outbox_create_partitions(7)`), as an operator or a scheduled
/// job of the database may: the function waits for the open claims too.
#[tokio::test(flavor = "multi_thread")]
async fn creating_days_by_hand_in_sql_waits_for_open_claims() {
    creating_a_day_waits_for_open_claims(Creation::Sql).await;
}

/// Who creates the day partitions.
#[derive(Clone, Copy)]
enum Creation {
    /// `outbox-relay partitions maintain`.
    Relay,
    /// `SELECT outbox_create_partitions(7)` in a session of its own.
    Sql,
}

async fn creating_a_day_waits_for_open_claims(creation: Creation) {
    use sea_orm::TransactionTrait;

    let t = TestDb::new(Backend::Postgres).await;
    migrate_partitioned(&t);
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(insert_at(&t, &format!("old-{n}"), &days_ago(&t, 20), false).await);
    }
    assert_eq!(partition_of(&t, &ids[5]).await, "outbox_default");
    // What every claim's first statement takes (`source/postgres/claim.rs`).
    let claim_lock = format!(
        "SELECT pg_advisory_xact_lock_shared({}::bigint | 'outbox'::regclass::oid::bigint)",
        outbox_relay::partitions::DROP_LOCK
    );
    let first = t.db.begin().await.expect("the first claim");
    first.execute_unprepared(&claim_lock).await.expect("lock");
    first
        .execute_unprepared(&format!(
            "SELECT id FROM outbox WHERE id = '{}' FOR UPDATE",
            ids[5]
        ))
        .await
        .expect("the first claim's row");

    let name = format!("maintain-{}", uuid::Uuid::now_v7().simple());
    let url = format!("{}&application_name={name}", t.url);
    let maintenance = tokio::spawn(async move {
        match creation {
            Creation::Relay => tokio::task::spawn_blocking(move || {
                let (code, stdout, stderr) = run_to_end(
                    Path::new(RELAY),
                    &["partitions", "maintain", "--retain", "365d", "--json"],
                    &[("DATABASE_URL", &url)],
                );
                assert_eq!(code, 0, "{stderr}");
                let done: Value = serde_json::from_str(&stdout).expect("JSON");
                done["created"].as_i64().expect("created")
            })
            .await
            .expect("the maintenance"),
            Creation::Sql => {
                let db = sea_orm::Database::connect(&url).await.expect("a session");
                let created = db
                    .query_one_raw(sea_orm::Statement::from_string(
                        sea_orm::DbBackend::Postgres,
                        "SELECT outbox_create_partitions(7)::int8 AS created",
                    ))
                    .await
                    .expect("outbox_create_partitions ends without a deadlock")
                    .expect("a row");
                let created: i64 = created.try_get("", "created").expect("created");
                db.close().await.expect("close");
                created
            }
        }
    });
    let waiting = |application: String| {
        format!(
            "pg_stat_activity WHERE application_name = '{application}' AND wait_event_type = 'Lock'"
        )
    };
    wait_for_count(&t, &waiting(name.clone())).await;

    let second_name = format!("claim-{}", uuid::Uuid::now_v7().simple());
    let second = {
        let (db, claim_lock, second_name) = (t.db.clone(), claim_lock.clone(), second_name.clone());
        tokio::spawn(async move {
            let second = db.begin().await?;
            second
                .execute_unprepared(&format!("SET LOCAL application_name = '{second_name}'"))
                .await?;
            second.execute_unprepared(&claim_lock).await?;
            second
                .execute_unprepared(
                    "SELECT id FROM outbox WHERE published_at IS NULL ORDER BY seq LIMIT 2 FOR UPDATE",
                )
                .await?;
            second.commit().await
        })
    };
    wait_for_count(&t, &waiting(second_name)).await;
    first
        .execute_unprepared(&format!(
            "UPDATE outbox SET published_at = now() WHERE id = '{}'",
            ids[5]
        ))
        .await
        .expect("the first claim's mark");
    first.commit().await.expect("the first claim ends");

    let created = maintenance.await.expect("the maintenance");
    assert!(created >= 1, "{created} partitions created");
    second
        .await
        .expect("the second claim")
        .expect("the second claim ends without a deadlock");
    for id in &ids {
        assert_eq!(partition_of(&t, id).await, day_partition(-20));
    }
    t.drop().await;
}

/// Waits (up to a minute) until `table_and_filter` counts a row.
async fn wait_for_count(t: &TestDb, table_and_filter: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while t.count(table_and_filter).await == 0 {
        assert!(Instant::now() < deadline, "nothing in {table_and_filter}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `outbox-relay run --drain` until no row is pending, failing after
/// 30 s with the relay's log.
async fn drain_within_30s(t: &TestDb, why: &str) {
    let mut relay = RelayProcess::spawn(
        Path::new(RELAY),
        &["run", "--drain", "--sink", "stdout"],
        &[("DATABASE_URL", &t.url)],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let pending = "outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL";
    while t.count(pending).await > 0 {
        assert!(
            Instant::now() < deadline,
            "{why}: rows still pending after 30 s; relay:\n{}",
            relay.stderr().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    relay.terminate();
}

/// Creates the partitions of the days `days` days before today (UTC).
async fn create_past_days(t: &TestDb, days: std::ops::RangeInclusive<i64>) {
    for days in days {
        t.db.execute_unprepared(&format!(
            "SELECT outbox_create_day_partition(((now() AT TIME ZONE 'UTC')::date - {days}))"
        ))
        .await
        .expect("create a past day");
    }
}

/// The claim window's lower bound (`None`: -infinity) and version.
async fn claim_window(t: &TestDb) -> (Option<String>, i64) {
    let row =
        t.db.query_one_raw(sea_orm::Statement::from_string(
            t.db_backend(),
            "SELECT CASE WHEN isfinite(low) THEN to_char(low AT TIME ZONE 'UTC', 'YYYY-MM-DD') END, \
               version FROM outbox_claim_window",
        ))
        .await
        .expect("read the claim window")
        .expect("the claim window's row");
    (
        row.try_get_by_index(0).expect("low"),
        row.try_get_by_index(1).expect("version"),
    )
}

/// PostgreSQL: maintenance settles the days before yesterday once none of
/// their rows is pending, and claims leave them out: a drain goes through
/// while another session holds a settled day's partition in a lock that
/// any claim reading it would wait for. A row that becomes pending in a
/// settled day (written there by plain SQL, a dead letter re-driven)
/// reopens the window and is published.
#[tokio::test(flavor = "multi_thread")]
async fn claims_leave_out_settled_days_and_a_row_pending_there_reopens_them() {
    let t = TestDb::new(Backend::Postgres).await;
    migrate_partitioned(&t);
    create_past_days(&t, 2..=5).await;
    // Day -4 holds a published row, day -3 a dead letter.
    let published = insert_at(&t, "led-1", &days_ago(&t, 4), false).await;
    t.db.execute_unprepared(&format!(
        "UPDATE outbox SET published_at = now() WHERE id = '{published}'"
    ))
    .await
    .expect("publish");
    let dead = insert_at(&t, "led-2", &days_ago(&t, 3), true).await;
    assert_eq!(claim_window(&t).await.0, None, "every day is read at first");

    let done = maintain_retaining(&t, "30d");
    let yesterday = (Utc::now().date_naive() - Days::new(1))
        .format("%Y-%m-%d")
        .to_string();
    assert_eq!(
        done["claims_from"]
            .as_str()
            .map(|from| from[..10].to_owned()),
        Some(yesterday.clone()),
        "{done}"
    );
    let (low, settled_version) = claim_window(&t).await;
    assert_eq!(low, Some(yesterday.clone()));

    // A claim reading a settled day would wait for this lock (its row
    // locks need ROW SHARE); plain reads do not.
    let locker = sea_orm::TransactionTrait::begin(&t.db)
        .await
        .expect("begin");
    locker
        .execute_unprepared(&format!(
            "LOCK TABLE {} IN EXCLUSIVE MODE",
            day_partition(-5)
        ))
        .await
        .expect("lock a settled day");
    let mut written = Vec::new();
    for n in 0..3 {
        written.push(insert_at(&t, &format!("led-{n}"), "now()", false).await);
    }
    drain_within_30s(&t, "a settled day locked").await;
    locker.rollback().await.expect("unlock");

    // Written into a settled day by plain SQL.
    let late = insert_at(&t, "led-1", &days_ago(&t, 4), false).await;
    let (low, version) = claim_window(&t).await;
    assert_eq!(
        low, None,
        "a pending row in a settled day reopens the window"
    );
    assert!(version > settled_version);
    // Another, while the window is open: the version moves all the same,
    // so that a maintenance settling days meanwhile gives up.
    written.push(insert_at(&t, "led-3", &days_ago(&t, 4), false).await);
    assert!(
        claim_window(&t).await.1 > version,
        "every pending row there bumps the version"
    );
    drain_within_30s(&t, "a row written into a settled day").await;
    assert_eq!(partition_of(&t, &late).await, day_partition(-4));

    // Settled again, then a dead letter of a settled day re-driven.
    maintain_retaining(&t, "30d");
    assert_eq!(claim_window(&t).await.0, Some(yesterday));
    t.db.execute_unprepared(&format!(
        "UPDATE outbox SET dead_lettered_at = NULL, attempts = 0 WHERE id = '{dead}'"
    ))
    .await
    .expect("redrive");
    assert_eq!(
        claim_window(&t).await.0,
        None,
        "a redrive reopens the window"
    );
    drain_within_30s(&t, "a dead letter re-driven in a settled day").await;
    assert_eq!(
        t.count(&format!(
            "outbox WHERE id IN ('{late}', '{dead}', '{}') AND published_at IS NOT NULL",
            written.join("', '")
        ))
        .await,
        6
    );
    t.drop().await;
}

/// PostgreSQL: a running relay that read the claim window keeps an
/// aggregate's plain-SQL rows in insertion order when the first of them
/// goes into a settled day and reopens the window: its claims, made for
/// the window it read, find nothing while the window changed, and read it
/// again, rather than take the aggregate's later row of today first.
#[tokio::test(flavor = "multi_thread")]
async fn a_row_reopening_the_window_goes_out_before_its_aggregates_later_rows() {
    let t = TestDb::new(Backend::Postgres).await;
    migrate_partitioned(&t);
    create_past_days(&t, 2..=4).await;
    maintain_retaining(&t, "30d");
    assert!(claim_window(&t).await.0.is_some(), "days settled");
    let mut relay = RelayProcess::spawn(
        Path::new(RELAY),
        &["run", "--sink", "stdout", "--poll-interval", "100ms"],
        &[("DATABASE_URL", &t.url)],
    );
    // The relay has read the window once it published this.
    insert_at(&t, "warm-up", "now()", false).await;
    wait_until_drained(&t, &mut relay).await;

    let (late, later) = {
        let txn = sea_orm::TransactionTrait::begin(&t.db)
            .await
            .expect("begin");
        let mut ids = Vec::new();
        for created_at in [days_ago(&t, 3), "now()".to_owned()] {
            let id = uuid::Uuid::now_v7().to_string();
            txn.execute_unprepared(&format!(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) \
                 VALUES ('{id}', 'Ledger', 'led-9', 'LedgerPosted', '{{}}', {created_at})"
            ))
            .await
            .expect("insert");
            ids.push(id);
        }
        txn.commit().await.expect("commit");
        (ids[0].clone(), ids[1].clone())
    };
    wait_until_drained(&t, &mut relay).await;
    relay.terminate();
    let stdout = relay.stdout().join("\n");
    let position = |id: &str| {
        stdout
            .lines()
            .position(|line| line.contains(id))
            .unwrap_or_else(|| panic!("{id} not published:\n{stdout}"))
    };
    assert!(
        position(&late) < position(&later),
        "the aggregate's rows out of insertion order:\n{stdout}"
    );
    t.drop().await;
}

/// One PostgreSQL database, two partitioned outboxes (two schemas): a
/// maintenance of one in progress (its transaction open after
/// `outbox_create_partitions`) leaves the other's maintenance free to move
/// rows out of its default partition. The maintenance lock names its
/// outbox; a lock of the whole database would make the second wait past
/// its timeout and leave its days for the next run.
#[tokio::test(flavor = "multi_thread")]
async fn maintenances_of_outboxes_in_other_schemas_never_wait_for_each_other() {
    use sea_orm::TransactionTrait;

    let t = TestDb::new(Backend::Postgres).await;
    let other = TestDb::new(Backend::Postgres).await;
    migrate_partitioned(&t);
    migrate_partitioned(&other);
    let id = insert_at(&t, "old-1", &days_ago(&t, 10), false).await;
    assert_eq!(partition_of(&t, &id).await, "outbox_default");

    let running = other.db.begin().await.expect("the other maintenance");
    running
        .execute_unprepared("SELECT outbox_create_partitions(7)")
        .await
        .expect("the other outbox's maintenance");
    let (code, stdout, stderr) = relay_command(
        &t,
        &["partitions", "maintain", "--retain", "365d", "--json"],
    );
    assert_eq!(code, 0, "{stderr}");
    let done: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(done["created"].as_i64(), Some(1), "{done}\n{stderr}");
    assert_eq!(partition_of(&t, &id).await, day_partition(-10));
    running.commit().await.expect("the other maintenance ends");
    other.drop().await;
    t.drop().await;
}
