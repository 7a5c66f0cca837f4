//! The day-partitioned outbox (PostgreSQL): `migrate --partitioned` on a
//! new and on a live plain outbox, writers (SeaORM and plain SQL) and the
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

/// `partitions maintain --retain 3d --json`, again while it reports a
/// partition kept for want of the outbox's lock (a relay's claim may hold
/// it for a moment; maintenance then leaves that day for the next run).
fn maintain(t: &TestDb) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, stdout, stderr) =
            relay_command(t, &["partitions", "maintain", "--retain", "3d", "--json"]);
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

/// The partition of a day `offset` days from today (UTC).
fn day_partition(offset: i64) -> String {
    let today = Utc::now().date_naive();
    let day = if offset >= 0 {
        today.checked_add_days(Days::new(offset as u64))
    } else {
        today.checked_sub_days(Days::new(offset.unsigned_abs()))
    };
    format!("outbox_p{}", day.expect("a day").format("%Y%m%d"))
}

/// Inserts a row by plain SQL (Debezium's five columns and `created_at`,
/// an SQL expression), dead-lettered if asked; returns its id.
async fn insert_at(t: &TestDb, aggregate_id: &str, created_at: &str, dead: bool) -> String {
    let id = uuid::Uuid::now_v7().to_string();
    let dead_lettered_at = if dead { "now()" } else { "NULL" };
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

async fn table_exists(t: &TestDb, name: &str) -> bool {
    t.count(&format!("pg_class WHERE oid = to_regclass('{name}')"))
        .await
        > 0
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
                    "SELECT aggregateid || ' seq ' || seq || ' in ' || tableoid::regclass::text \
                     FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL",
                ))
                .await
                .expect("pending rows");
            let rows: Vec<String> = rows
                .iter()
                .map(|row| row.try_get_by_index(0).expect("text"))
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
    assert!(!table_exists(&t, &day_partition(-10)).await);
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

#[tokio::test(flavor = "multi_thread")]
async fn rows_at_the_edges_of_days_and_far_ahead_are_kept_and_published() {
    let t = TestDb::new(Backend::Postgres).await;
    migrate_partitioned(&t);
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
    let at = |time: chrono::DateTime<Utc>| format!("'{}'", time.to_rfc3339());
    let before_midnight = insert_at(&t, "edge", &at(last_instant), false).await;
    let at_midnight = insert_at(&t, "edge", &at(midnight), false).await;
    let in_a_month = insert_at(
        &t,
        "far",
        &at(day(40).and_time(NaiveTime::MIN).and_utc()),
        false,
    )
    .await;
    let far = insert_at(&t, "far", "'2999-06-01 12:00:00+00'", false).await;
    let infinite = insert_at(&t, "far", "'infinity'", false).await;
    assert_eq!(partition_of(&t, &before_midnight).await, day_partition(3));
    assert_eq!(partition_of(&t, &at_midnight).await, day_partition(4));
    for id in [&in_a_month, &far, &infinite] {
        assert_eq!(partition_of(&t, id).await, "outbox_default");
    }

    let done = maintain(&t);
    assert_eq!(done["created"].as_i64(), Some(2), "{done}");
    assert_eq!(done["default_rows"].as_i64(), Some(1), "{done}");
    assert_eq!(partition_of(&t, &in_a_month).await, day_partition(40));
    assert_eq!(partition_of(&t, &far).await, "outbox_p29990601");
    assert_eq!(partition_of(&t, &infinite).await, "outbox_default");

    let (code, stdout, stderr) = relay_command(&t, &["run", "--drain", "--sink", "stdout"]);
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
    check_printed(
        &lines,
        &[before_midnight, at_midnight, in_a_month, far, infinite],
    );
    assert_eq!(t.pending().await, 0);

    // The table listing reads the same partitions.
    let (code, table, stderr) = relay_command(&t, &["partitions"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(table.contains("outbox_p29990601"), "{table}");
    assert!(table.contains("days from today have partitions"), "{table}");
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_live_plain_outbox_converts_without_losing_or_reordering_an_event() {
    let t = TestDb::new(Backend::Postgres).await;
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
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..3)
        .map(|writer| {
            let db = t.db.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut ids = Vec::new();
                let mut round = 0;
                while !stop.load(Ordering::Relaxed) {
                    let aggregate = format!("acct-{}", (writer + round) % 4);
                    let appended = append_events(&db, &aggregate, 3).await;
                    ids.extend(appended.iter().map(|event| event.id.to_string()));
                    round += 1;
                }
                ids
            })
        })
        .collect();
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
        names(&listed, "partitions").contains(&"outbox_unpartitioned".to_owned()),
        "{listed}"
    );
    assert_eq!(t.count("outbox").await, written.len() as i64);
    relay.terminate();
    check_printed(&relay.stdout(), &written);
    t.drop().await;
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
async fn the_running_relay_warns_when_days_run_short_and_maintains_them_when_asked() {
    let t = TestDb::new(Backend::Postgres).await;
    migrate_partitioned(&t);
    // Only today and tomorrow have partitions; an old day's rows wait in
    // the default partition.
    for offset in 2..=7 {
        t.db.execute_unprepared(&format!("DROP TABLE {}", day_partition(offset)))
            .await
            .unwrap();
    }
    let old = insert_at(&t, "old-10", "now() - interval '10 days'", false).await;
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
    assert_eq!(sample(&metrics, "outbox_partition_default_rows"), Some(1.0));
    relay.terminate();
    let mut printed = relay.stdout();

    let mut maintaining = watching.to_vec();
    maintaining.extend([
        "--partition-maintenance",
        "--retention",
        "3d",
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
    // The old day got its partition, its row was published, then the day
    // was dropped whole.
    assert!(!table_exists(&t, &day_partition(-10)).await);
    assert_eq!(t.count(&format!("outbox WHERE id = '{old}'")).await, 0);
    relay.terminate();
    printed.extend(relay.stdout());
    check_printed(&printed, &[old]);
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn partitions_are_refused_where_they_cannot_work() {
    let plain = TestDb::new(Backend::Postgres).await;
    assert_refused(
        Path::new(RELAY),
        &["partitions"],
        &[("DATABASE_URL", &plain.url)],
        1,
        "error: the outbox table is not partitioned; run `outbox-relay migrate --partitioned`",
        "\u{0}",
    );
    assert_refused(
        Path::new(RELAY),
        &["run", "--sink", "stdout", "--partition-maintenance"],
        &[("DATABASE_URL", &plain.url)],
        1,
        "error: the outbox table is not partitioned",
        "\u{0}",
    );
    plain.drop().await;
    for backend in [Backend::Sqlite, Backend::MySql] {
        let t = TestDb::new(backend).await;
        assert_refused(
            Path::new(RELAY),
            &["migrate", "--partitioned"],
            &[("DATABASE_URL", &t.url)],
            1,
            "error: migrating",
            "\u{0}",
        );
        let (_, _, stderr) = relay_command(&t, &["migrate", "--partitioned"]);
        assert!(stderr.contains("day-partitioned outbox"), "{stderr}");
        assert_refused(
            Path::new(RELAY),
            &["partitions", "maintain"],
            &[("DATABASE_URL", &t.url)],
            1,
            "error: a day-partitioned outbox is available on PostgreSQL only",
            "\u{0}",
        );
        assert_refused(
            Path::new(RELAY),
            &["run", "--sink", "stdout", "--partition-maintenance"],
            &[("DATABASE_URL", &t.url)],
            1,
            "error: --partition-maintenance keeps a day-partitioned outbox",
            "\u{0}",
        );
        // The plain outbox still works.
        let (code, _, stderr) = relay_command(&t, &["migrate"]);
        assert_eq!(code, 0, "{stderr}");
        t.drop().await;
    }
}
