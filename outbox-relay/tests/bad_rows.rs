//! One undecodable or mistyped row never stops the relay: it is
//! dead-lettered with a reason naming the column and what it holds, every
//! other row is published, `status` lists it, and `retry` re-drives it once
//! it has been fixed by hand.
//!
//! SQLite is where such rows can exist: a column's declared type is only an
//! affinity, so a BLOB payload (which the table's `json_valid` check
//! accepts when it holds JSON bytes) or text in an integer column is stored
//! as written.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use outbox_relay::source::sqlite::SqliteSource;
use outbox_relay::source::{Settlement, Source, SourceOptions};
use outbox_tests::process::{RelayProcess, run_to_end};
use outbox_tests::stream::{append_events, seed};
use outbox_tests::{Backend, TestDb};
use sea_orm::{ConnectionTrait, Statement};

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");

fn relay() -> &'static Path {
    Path::new(RELAY)
}

/// JSON bytes stored as a BLOB: `{"blob":true}`.
const BLOB_PAYLOAD: &str = "CAST('{\"blob\":true}' AS BLOB)";

async fn execute(t: &TestDb, sql: &str) {
    t.db.execute_unprepared(sql)
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

async fn text_column(t: &TestDb, sql: &str) -> Vec<String> {
    t.db.query_all_raw(Statement::from_string(t.db_backend(), sql.to_owned()))
        .await
        .unwrap()
        .iter()
        .map(|row| row.try_get_by_index(0).unwrap())
        .collect()
}

/// Inserts a row by plain SQL with Debezium's five columns plus `extra`
/// (`column = value SQL` pairs); returns its id.
async fn insert_row(t: &TestDb, aggregate_id: &str, extra: &[(&str, &str)]) -> String {
    let id = uuid::Uuid::now_v7().to_string();
    let mut columns = vec!["id", "aggregatetype", "aggregateid", "type", "payload"];
    let id_sql = format!("'{id}'");
    let aggregate_sql = format!("'{aggregate_id}'");
    let mut values = vec![
        id_sql.as_str(),
        "'Invoice'",
        aggregate_sql.as_str(),
        "'InvoiceIssued'",
        "'{\"plain\":true}'",
    ];
    for (column, value) in extra {
        match columns.iter().position(|c| c == column) {
            Some(at) => values[at] = *value,
            None => {
                columns.push(*column);
                values.push(*value);
            }
        }
    }
    execute(
        t,
        &format!(
            "INSERT INTO outbox ({}) VALUES ({})",
            columns.join(", "),
            values.join(", ")
        ),
    )
    .await;
    id
}

/// `outbox-relay run --drain` to standard output; returns the published
/// event ids in order. A relay stuck on a row fails the test after a minute.
fn drain(t: &TestDb) -> Vec<String> {
    let mut process = RelayProcess::spawn(
        relay(),
        &[
            "run",
            "--drain",
            "--batch-size",
            "4",
            "--poll-interval",
            "100ms",
        ],
        &[("DATABASE_URL", &t.url)],
    );
    let code = process.wait(Duration::from_secs(60));
    assert_eq!(
        code,
        Some(0),
        "relay failed:\n{}",
        process.stderr().join("\n")
    );
    process
        .stdout()
        .iter()
        .map(|line| {
            let message: serde_json::Value =
                serde_json::from_str(line).expect("each stdout line is one JSON object");
            message["headers"]["id"]
                .as_str()
                .expect("an id header")
                .to_owned()
        })
        .collect()
}

fn status_json(t: &TestDb) -> serde_json::Value {
    let (code, stdout, stderr) =
        run_to_end(relay(), &["status", "--json"], &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "status failed:\n{stderr}");
    serde_json::from_str(&stdout).expect("status --json prints JSON")
}

fn position(published: &[String], id: &str) -> usize {
    published
        .iter()
        .position(|published| published == id)
        .unwrap_or_else(|| panic!("{id} was not published"))
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_undecodable_rows_are_dead_lettered_and_everything_else_is_published() {
    let t = TestDb::new(Backend::Sqlite).await;
    let mut good = seed(&t.db, 3, 4, 2).await;
    // A run with a bad row in its middle: `h1` goes out, `h2` is
    // dead-lettered, `h3` follows it in a later claim.
    let holed: Vec<String> = append_events(&t.db, "holed", 3)
        .await
        .iter()
        .map(|event| event.id.to_string())
        .collect();
    execute(
        &t,
        &format!(
            "UPDATE outbox SET payload = {BLOB_PAYLOAD} WHERE id = '{}'",
            holed[1]
        ),
    )
    .await;
    good.push(holed[0].clone());
    good.push(holed[2].clone());
    let bad_version = insert_row(&t, "bad-version", &[("event_version", "'abc'")]).await;
    good.push(insert_row(&t, "plain-1", &[]).await);
    let bad_sequence = insert_row(&t, "bad-sequence", &[("aggregate_seq", "'three'")]).await;
    let blob_aggregate = insert_row(&t, "unused", &[("aggregateid", "CAST('a-1' AS BLOB)")]).await;
    insert_row(&t, "blob-id", &[("id", "X'0102'")]).await;
    good.push(insert_row(&t, "plain-2", &[]).await);
    assert_eq!(
        t.count(
            "outbox WHERE typeof(payload) = 'blob' OR typeof(event_version) = 'text' \
                 OR typeof(aggregate_seq) = 'text' OR typeof(aggregateid) = 'blob' \
                 OR typeof(id) = 'blob'"
        )
        .await,
        5,
        "the bad rows are stored as written"
    );

    let published = drain(&t);
    assert_eq!(
        published.iter().collect::<BTreeSet<_>>(),
        good.iter().collect::<BTreeSet<_>>(),
        "every good row is published once, no bad one"
    );
    assert_eq!(published.len(), good.len(), "no duplicates: {published:?}");
    assert!(position(&published, &holed[0]) < position(&published, &holed[2]));

    // Each bad row is dead-lettered once, with a reason naming its column
    // and what it holds.
    let expected = [
        (format!("id = '{}'", holed[1]), "`payload` holds BLOB"),
        (
            format!("id = '{bad_version}'"),
            "`event_version` holds TEXT",
        ),
        (
            format!("id = '{bad_sequence}'"),
            "`aggregate_seq` holds TEXT",
        ),
        (
            format!("id = '{blob_aggregate}'"),
            "`aggregateid` holds BLOB",
        ),
        ("id = X'0102'".to_owned(), "`id` holds BLOB"),
    ];
    for (filter, reason) in &expected {
        let errors = text_column(
            &t,
            &format!(
                "SELECT last_error FROM outbox WHERE {filter} \
                 AND dead_lettered_at IS NOT NULL AND published_at IS NULL AND attempts = 1"
            ),
        )
        .await;
        assert_eq!(
            errors.len(),
            1,
            "{filter} is dead-lettered once: {errors:?}"
        );
        assert!(
            errors[0].contains(reason) && !errors[0].contains('\n'),
            "{filter}: {:?} names {reason}",
            errors[0]
        );
    }
    assert_eq!(t.count("outbox WHERE published_at IS NULL").await, 5);

    // `status` lists them with their reasons.
    let status = status_json(&t);
    assert_eq!(status["pending"], 0, "{status:#}");
    assert_eq!(status["dead_letters"], 5, "{status:#}");
    let listed = status["dead_letter_rows"].as_array().unwrap();
    assert_eq!(listed.len(), 5, "{status:#}");
    let listed_error = |id: &str| -> String {
        listed
            .iter()
            .find(|row| row["id"] == id)
            .unwrap_or_else(|| panic!("{id} is listed: {status:#}"))["last_error"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(listed_error(&holed[1]).contains("`payload` holds BLOB"));
    assert!(listed_error(&bad_version).contains("`event_version` holds TEXT"));
    // A BLOB id is shown as an SQL literal.
    assert!(listed_error("X'0102'").contains("`id` holds BLOB"));
    let (code, table, stderr) = run_to_end(relay(), &["status"], &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "{stderr}");
    assert!(table.contains("`payload` holds BLOB"), "{table}");

    // Fixed by hand, re-driven, published.
    let fixed_id = uuid::Uuid::now_v7().to_string();
    for fix in [
        format!(
            "UPDATE outbox SET payload = '{{\"fixed\":true}}' WHERE id = '{}'",
            holed[1]
        ),
        "UPDATE outbox SET event_version = 2 WHERE aggregateid = 'bad-version'".to_owned(),
        "UPDATE outbox SET aggregate_seq = NULL WHERE aggregateid = 'bad-sequence'".to_owned(),
        "UPDATE outbox SET aggregateid = 'a-1' WHERE typeof(aggregateid) = 'blob'".to_owned(),
        format!("UPDATE outbox SET id = '{fixed_id}' WHERE id = X'0102'"),
    ] {
        execute(&t, &fix).await;
    }
    let (code, _, stderr) = run_to_end(relay(), &["retry"], &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("5 dead-lettered events are pending again"),
        "{stderr}"
    );
    let republished = drain(&t);
    assert_eq!(
        republished.into_iter().collect::<BTreeSet<_>>(),
        BTreeSet::from([
            holed[1].clone(),
            bad_version,
            bad_sequence,
            blob_aggregate,
            fixed_id,
        ])
    );
    let status = status_json(&t);
    assert_eq!(
        (&status["pending"], &status["dead_letters"]),
        (&serde_json::json!(0), &serde_json::json!(0)),
        "{status:#}"
    );
    t.drop().await;
}

/// A claim leaves out an undecodable row and the rows of its aggregate
/// after it (the hole cuts the run); the row is dead-lettered at once, so
/// the next claim takes them.
#[tokio::test(flavor = "multi_thread")]
async fn sqlite_claims_cut_the_run_at_an_undecodable_row_and_the_next_claim_proceeds() {
    let t = TestDb::new(Backend::Sqlite).await;
    let a: Vec<String> = append_events(&t.db, "a", 3)
        .await
        .iter()
        .map(|event| event.id.to_string())
        .collect();
    let b: Vec<String> = append_events(&t.db, "b", 2)
        .await
        .iter()
        .map(|event| event.id.to_string())
        .collect();
    execute(
        &t,
        &format!(
            "UPDATE outbox SET payload = {BLOB_PAYLOAD} WHERE id = '{}'",
            a[1]
        ),
    )
    .await;

    let source = SqliteSource::connect(&t.url, SourceOptions::default())
        .await
        .unwrap();
    let claim = source.claim(10, &[]).await.expect("the claim succeeds");
    let claimed: Vec<String> = claim.records().iter().map(|r| r.id.clone()).collect();
    assert_eq!(
        claimed,
        [a[0].as_str(), &b[0], &b[1]],
        "a3 waits behind the hole"
    );
    assert_eq!(
        t.count(&format!(
            "outbox WHERE id = '{}' AND dead_lettered_at IS NOT NULL \
             AND last_error LIKE '%`payload` holds BLOB%'",
            a[1]
        ))
        .await,
        1,
        "the bad row is dead-lettered by the claim"
    );
    claim
        .settle(&Settlement {
            published: claimed,
            failed: Vec::new(),
        })
        .await
        .unwrap();

    let claim = source.claim(10, &[]).await.unwrap();
    let claimed: Vec<String> = claim.records().iter().map(|r| r.id.clone()).collect();
    assert_eq!(claimed, [a[2].as_str()], "the dead letter ended a's wait");
    claim
        .settle(&Settlement {
            published: claimed,
            failed: Vec::new(),
        })
        .await
        .unwrap();
    assert!(source.claim(10, &[]).await.unwrap().records().is_empty());
    t.drop().await;
}

/// MariaDB accepts a zero `created_at` by default, and a column changed to
/// bytes can hold text that is not UTF-8: neither stops the relay.
#[tokio::test(flavor = "multi_thread")]
async fn mariadb_unreadable_rows_are_dead_lettered_and_zero_dates_published() {
    let t = TestDb::new(Backend::MySql).await;
    let a: Vec<String> = append_events(&t.db, "a", 3)
        .await
        .iter()
        .map(|event| event.id.to_string())
        .collect();
    let zero_date = insert_row(&t, "zero-date", &[("created_at", "'0000-00-00'")]).await;
    execute(
        &t,
        "ALTER TABLE outbox MODIFY traceparent VARBINARY(255) NULL",
    )
    .await;
    execute(
        &t,
        &format!(
            "UPDATE outbox SET traceparent = X'FF' WHERE id = '{}'",
            a[1]
        ),
    )
    .await;

    let published = drain(&t);
    assert_eq!(
        published.iter().collect::<BTreeSet<_>>(),
        BTreeSet::from([&a[0], &a[2], &zero_date]),
    );
    assert!(position(&published, &a[0]) < position(&published, &a[2]));
    let status = status_json(&t);
    assert_eq!(status["dead_letters"], 1, "{status:#}");
    let reason = status["dead_letter_rows"][0]["last_error"]
        .as_str()
        .unwrap();
    assert!(
        status["dead_letter_rows"][0]["id"] == a[1].as_str()
            && reason.starts_with("undecodable row: column `traceparent` holds VARBINARY"),
        "{status:#}"
    );

    execute(&t, "UPDATE outbox SET traceparent = NULL").await;
    let (code, _, stderr) = run_to_end(relay(), &["retry"], &[("DATABASE_URL", &t.url)]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(drain(&t), [a[1].clone()]);
    t.drop().await;
}

/// PostgreSQL accepts `infinity` and `-infinity` in `created_at`, which
/// cannot be subtracted from now: such rows are published and `status`
/// still answers.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_infinite_created_at_neither_stops_the_relay_nor_status() {
    let t = TestDb::new(Backend::Postgres).await;
    let mut ids: Vec<String> = append_events(&t.db, "a", 2)
        .await
        .iter()
        .map(|event| event.id.to_string())
        .collect();
    ids.push(insert_row(&t, "past", &[("created_at", "'-infinity'")]).await);
    ids.push(insert_row(&t, "future", &[("created_at", "'infinity'")]).await);
    let status = status_json(&t);
    assert_eq!(status["pending"], 4, "{status:#}");
    let published = drain(&t);
    assert_eq!(
        published.into_iter().collect::<BTreeSet<_>>(),
        ids.into_iter().collect::<BTreeSet<_>>()
    );
    t.drop().await;
}
