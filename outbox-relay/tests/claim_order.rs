//! What a claim takes, on every backend: the oldest pending rows by `seq`,
//! which writers that follow `outbox_contract::ordering` give in each
//! aggregate's `aggregate_seq` order; rows that break the rule go out in
//! number order within a batch.
//!
//! The rows are written by plain SQL with the sequence numbers a writer
//! would have been given.

use std::time::Duration;

use outbox_relay::source::shards::ShardConfig;
use outbox_relay::source::{self, Settlement, Source, SourceOptions};
use outbox_tests::{Backend, TestDb};
use sea_orm::{ConnectionTrait, Statement};

/// Inserts `(aggregate id, aggregate_seq)` rows of type `Order` in the
/// order given; `None` is a row written by plain SQL with only the five
/// Debezium columns. Each row's event type names it: `<aggregate>-<seq>`,
/// or `<aggregate>-plain<n>` for the n-th row inserted.
async fn insert(t: &TestDb, rows: &[(&str, Option<i64>)]) {
    for (n, (aggregate, sequence)) in rows.iter().enumerate() {
        let id = uuid::Uuid::now_v7().hyphenated().to_string();
        let event_type = match sequence {
            Some(sequence) => format!("{aggregate}-{sequence}"),
            None => format!("{aggregate}-plain{n}"),
        };
        let (sql, values): (&str, Vec<sea_orm::Value>) = match (t.backend, sequence) {
            (Backend::Postgres, Some(sequence)) => (
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_seq) \
                 VALUES ($1::uuid, 'Order', $2, $3, '{}', $4)",
                vec![
                    id.into(),
                    (*aggregate).into(),
                    event_type.into(),
                    (*sequence).into(),
                ],
            ),
            (Backend::Postgres, None) => (
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
                 VALUES ($1::uuid, 'Order', $2, $3, '{}')",
                vec![id.into(), (*aggregate).into(), event_type.into()],
            ),
            (_, Some(sequence)) => (
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_seq) \
                 VALUES (?, 'Order', ?, ?, '{}', ?)",
                vec![
                    id.into(),
                    (*aggregate).into(),
                    event_type.into(),
                    (*sequence).into(),
                ],
            ),
            (_, None) => (
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
                 VALUES (?, 'Order', ?, ?, '{}')",
                vec![id.into(), (*aggregate).into(), event_type.into()],
            ),
        };
        t.db.execute_raw(Statement::from_sql_and_values(t.db_backend(), sql, values))
            .await
            .expect("insert outbox row");
    }
}

/// The event types (`<aggregate>-<seq>`) of a claim of `limit` rows,
/// settled as published.
async fn claim(source: &dyn Source, limit: usize) -> Vec<String> {
    let claim = source.claim(limit, &[]).await.expect("claim");
    let records = claim.records().to_vec();
    let settlement = Settlement {
        published: records.iter().map(|record| record.id.clone()).collect(),
        failed: Vec::new(),
    };
    claim.settle(&settlement).await.expect("settle");
    records
        .into_iter()
        .map(|record| record.event_type)
        .collect()
}

fn sharded() -> SourceOptions {
    SourceOptions {
        shards: Some(ShardConfig {
            count: 4,
            lease: Duration::from_secs(10),
            instance: format!("claim-order-{}", uuid::Uuid::now_v7().simple()),
            batch_timeout: Duration::from_secs(20),
        }),
        ..SourceOptions::default()
    }
}

/// Rows inserted as the writers' rule gives them are claimed by `seq`,
/// batch after batch, each aggregate in its order; rows inserted against
/// their numbers go out in number order within one batch.
async fn inverted_inserts_are_claimed_in_sequence_order(backend: Backend, options: SourceOptions) {
    let t = TestDb::new(backend).await;
    insert(
        &t,
        &[
            ("a", Some(1)),
            ("b", Some(1)),
            ("a", Some(2)),
            ("a", Some(3)),
            ("b", Some(2)),
        ],
    )
    .await;
    let source = source::connect(&t.url, options).await.expect("source");
    assert_eq!(claim(source.as_ref(), 1).await, ["a-1"]);
    assert_eq!(claim(source.as_ref(), 3).await, ["b-1", "a-2", "a-3"]);
    assert_eq!(claim(source.as_ref(), 10).await, ["b-2"]);
    assert!(claim(source.as_ref(), 10).await.is_empty());
    // Against the rule: a's numbers fall as `seq` rises.
    insert(
        &t,
        &[
            ("a", Some(5)),
            ("b", Some(3)),
            ("a", Some(4)),
            ("a", Some(7)),
            ("a", Some(6)),
            ("b", Some(4)),
        ],
    )
    .await;
    assert_eq!(
        claim(source.as_ref(), 10).await,
        ["a-4", "b-3", "a-5", "a-6", "a-7", "b-4"]
    );
    source.close().await;
    t.drop().await;
}

/// Rows written by plain SQL (no `aggregate_seq`) keep insertion order.
async fn plain_sql_rows_keep_insertion_order(backend: Backend) {
    let t = TestDb::new(backend).await;
    insert(&t, &[("p", None), ("q", None), ("p", None), ("p", None)]).await;
    let source = source::connect(&t.url, SourceOptions::default())
        .await
        .expect("source");
    assert_eq!(
        claim(source.as_ref(), 3).await,
        ["p-plain0", "q-plain1", "p-plain2"]
    );
    assert_eq!(claim(source.as_ref(), 10).await, ["p-plain3"]);
    t.drop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_claims_in_sequence_order() {
    inverted_inserts_are_claimed_in_sequence_order(Backend::Postgres, SourceOptions::default())
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_sharded_claims_in_sequence_order() {
    inverted_inserts_are_claimed_in_sequence_order(Backend::Postgres, sharded()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mysql_claims_in_sequence_order() {
    inverted_inserts_are_claimed_in_sequence_order(Backend::MySql, SourceOptions::default()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mysql_sharded_claims_in_sequence_order() {
    inverted_inserts_are_claimed_in_sequence_order(Backend::MySql, sharded()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_claims_in_sequence_order() {
    inverted_inserts_are_claimed_in_sequence_order(Backend::Sqlite, SourceOptions::default()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_plain_sql_rows_keep_insertion_order() {
    plain_sql_rows_keep_insertion_order(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mysql_plain_sql_rows_keep_insertion_order() {
    plain_sql_rows_keep_insertion_order(Backend::MySql).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_plain_sql_rows_keep_insertion_order() {
    plain_sql_rows_keep_insertion_order(Backend::Sqlite).await;
}

fn event_types(records: &[outbox_relay::record::OutboxRecord]) -> Vec<String> {
    records
        .iter()
        .map(|record| record.event_type.clone())
        .collect()
}

/// A claim made while an earlier one is at the broker takes the rows after
/// those in flight, without waiting for them.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_claims_ahead_continue_each_run() {
    let t = TestDb::new(Backend::Postgres).await;
    insert(
        &t,
        &[
            ("a", Some(1)),
            ("a", Some(2)),
            ("b", Some(1)),
            ("a", Some(3)),
            ("a", Some(4)),
        ],
    )
    .await;
    let source = source::connect(&t.url, sharded()).await.expect("source");
    let first = source.claim(2, &[]).await.expect("claim");
    assert_eq!(event_types(first.records()), ["a-1", "a-2"]);
    let ahead = source
        .claim_ahead(10, &[], &first.in_flight())
        .await
        .expect("claim ahead")
        .expect("PostgreSQL claims ahead");
    // By `seq`, after the rows in flight.
    assert_eq!(event_types(ahead.records()), ["b-1", "a-3", "a-4"]);
    drop(ahead);
    drop(first);
    assert_eq!(
        claim(source.as_ref(), 10).await,
        ["a-1", "a-2", "b-1", "a-3", "a-4"]
    );
    source.close().await;
    t.drop().await;
}
