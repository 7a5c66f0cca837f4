//! Appending events in the aggregate's transaction, on PostgreSQL, MariaDB
//! and SQLite: each test runs once per backend against a fresh database.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_core::{ActiveModelOutboxExt, OutboxError, OutboxEvent};
use outbox_tests::entities::{customer, invoice, order};
use outbox_tests::events::{
    CustomerRegistered, InvoiceIssuedV2, OrderPlaced, OrderStatusChanged, Unserializable,
};
use outbox_tests::{Backend, TestDb, backend_tests};
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ConnectionTrait, EntityTrait, IntoActiveModel, Statement,
    TransactionTrait,
};
use serde_json::json;

backend_tests!(
    commit_keeps_aggregate_and_events,
    rollback_drops_aggregate_and_events,
    error_mid_transaction_drops_everything,
    save_outside_transaction_is_refused,
    hooks_append_events_of_saved_rows,
    hooks_refuse_saves_outside_transaction,
    concurrent_writers_get_consecutive_sequences_in_commit_order,
    writers_on_2_aggregates_draw_seq_in_aggregate_order,
    writers_on_20_aggregates_draw_seq_in_aggregate_order,
    plain_sql_insert_of_debezium_columns_gets_defaults,
    unserializable_payload_writes_nothing,
    traceparent_and_explicit_ids_are_stored,
    sequence_survives_deleting_published_rows,
    one_call_numbers_each_aggregate_in_order,
    transient_events_leave_no_row,
    insert_with_events_returns_the_saved_row,
    failed_insert_writes_no_events,
    insert_with_events_runs_the_model_hooks,
    composite_keys_become_aggregate_ids,
    insert_with_many_events_numbers_them_all,
);

fn invoice_model(amount_cents: i64) -> invoice::ActiveModel {
    invoice::ActiveModel {
        amount_cents: Set(amount_cents),
        ..Default::default()
    }
}

fn issued(amount_cents: i64) -> InvoiceIssuedV2 {
    InvoiceIssuedV2 {
        amount_cents,
        note: None,
    }
}

async fn commit_keeps_aggregate_and_events(backend: Backend) {
    let t = TestDb::new(backend).await;
    let txn = t.db.begin().await.unwrap();
    let saved = invoice_model(1200)
        .insert_with_events(&txn, [issued(1200), issued(1300)])
        .await
        .unwrap();
    txn.commit().await.unwrap();

    assert_eq!(t.count("invoices").await, 1);
    let rows = t.outbox_rows().await;
    assert_eq!(rows.len(), 2);
    for (row, expected_seq) in rows.iter().zip(1..) {
        assert_eq!(row.aggregate_type, "Invoice");
        assert_eq!(row.aggregate_id, saved.id.to_string());
        assert_eq!(row.event_type, "InvoiceIssued");
        assert_eq!(row.event_version, 2);
        assert_eq!(row.aggregate_seq, Some(expected_seq));
        let id = uuid::Uuid::parse_str(&row.id).unwrap();
        assert_eq!(id.get_version_num(), 7, "event ids are UUIDv7");
    }
    assert_eq!(
        rows[0].payload,
        Some(json!({"amountCents": 1200, "note": null}))
    );
    t.drop().await;
}

async fn rollback_drops_aggregate_and_events(backend: Backend) {
    let t = TestDb::new(backend).await;
    let txn = t.db.begin().await.unwrap();
    invoice_model(10)
        .insert_with_events(&txn, [issued(10)])
        .await
        .unwrap();
    txn.rollback().await.unwrap();

    assert_eq!(t.count("invoices").await, 0);
    assert_eq!(t.count("outbox").await, 0);
    t.drop().await;
}

async fn error_mid_transaction_drops_everything(backend: Backend) {
    let t = TestDb::new(backend).await;
    let result: Result<(), sea_orm::DbErr> = async {
        let txn = t.db.begin().await?;
        let saved = invoice_model(10)
            .insert_with_events(&txn, [issued(10)])
            .await?;
        // The same primary key again: the database refuses it.
        invoice::ActiveModel {
            id: Set(saved.id),
            amount_cents: Set(20),
        }
        .insert(&txn)
        .await?;
        txn.commit().await
    }
    .await;

    assert!(result.is_err(), "the duplicate key must fail");
    assert_eq!(t.count("invoices").await, 0);
    assert_eq!(t.count("outbox").await, 0);
    t.drop().await;
}

async fn save_outside_transaction_is_refused(backend: Backend) {
    let t = TestDb::new(backend).await;
    let error = invoice_model(10)
        .insert_with_events(&t.db, [issued(10)])
        .await
        .unwrap_err();
    assert!(
        matches!(error, OutboxError::NotInTransaction { .. }),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("inside a transaction"),
        "{error}"
    );
    let error = outbox_core::append(&t.db, [OutboxEvent::new(issued(1)).aggregate_id("1")])
        .await
        .unwrap_err();
    assert!(matches!(error, OutboxError::NotInTransaction { .. }));

    assert_eq!(t.count("invoices").await, 0);
    assert_eq!(t.count("outbox").await, 0);
    t.drop().await;
}

async fn hooks_append_events_of_saved_rows(backend: Backend) {
    let t = TestDb::new(backend).await;
    let txn = t.db.begin().await.unwrap();
    let placed = order::ActiveModel {
        customer: Set("ada".into()),
        total_cents: Set(4200),
        status: Set("placed".into()),
        ..Default::default()
    }
    .insert(&txn)
    .await
    .unwrap();
    let mut paid: order::ActiveModel = placed.clone().into();
    paid.status = Set("paid".into());
    paid.update(&txn).await.unwrap();
    txn.commit().await.unwrap();

    let rows = t.outbox_rows().await;
    let summary: Vec<_> = rows
        .iter()
        .map(|row| {
            (
                row.aggregate_id.clone(),
                row.event_type.as_str(),
                row.aggregate_seq,
            )
        })
        .collect();
    let id = placed.id.to_string();
    assert_eq!(
        summary,
        [
            (id.clone(), "OrderPlaced", Some(1)),
            (id.clone(), "OrderStatusChanged", Some(2)),
        ]
    );
    let payload: OrderPlaced = serde_json::from_value(rows[0].payload.clone().unwrap()).unwrap();
    assert_eq!(
        payload,
        OrderPlaced {
            order_id: placed.id,
            customer: "ada".into(),
            total_cents: 4200
        }
    );
    assert_eq!(
        rows[1].payload,
        Some(json!({"order_id": placed.id, "status": "paid"}))
    );
    t.drop().await;
}

async fn hooks_refuse_saves_outside_transaction(backend: Backend) {
    let t = TestDb::new(backend).await;
    let error = order::ActiveModel {
        customer: Set("ada".into()),
        total_cents: Set(1),
        status: Set("placed".into()),
        ..Default::default()
    }
    .insert(&t.db)
    .await
    .unwrap_err();
    assert!(
        error.to_string().contains("inside a transaction"),
        "{error}"
    );
    assert_eq!(t.count("orders").await, 0);
    assert_eq!(t.count("outbox").await, 0);
    t.drop().await;
}

/// Eight transactions append to one aggregate at once, each holding its
/// transaction open for a while. An observer polling committed rows must
/// always see the numbers 1..=k with no gap: numbers are handed out in
/// commit order, never twice.
async fn concurrent_writers_get_consecutive_sequences_in_commit_order(backend: Backend) {
    const WRITERS: usize = 8;
    let t = TestDb::new(backend).await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let observations = Arc::new(Mutex::new(Vec::<Vec<i64>>::new()));

    let observer = {
        let db = t.db.clone();
        let done = done.clone();
        let observations = observations.clone();
        tokio::spawn(async move {
            let sql = "SELECT aggregate_seq FROM outbox WHERE aggregateid = 'shared' ORDER BY aggregate_seq";
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let rows = db
                    .query_all_raw(Statement::from_string(db.get_database_backend(), sql))
                    .await
                    .expect("observer query");
                let seen: Vec<i64> = rows
                    .iter()
                    .map(|row| row.try_get_by_index::<i64>(0).unwrap())
                    .collect();
                observations.lock().unwrap().push(seen);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };

    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let db = t.db.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis((writer as u64 * 7) % 23)).await;
                let txn = db.begin().await.expect("begin");
                let appended = invoice_model(writer as i64)
                    .insert_with_events(
                        &txn,
                        [OutboxEvent::new(issued(writer as i64)).aggregate_id("shared")],
                    )
                    .await
                    .expect("append");
                // Hold the transaction open so that others queue behind it.
                tokio::time::sleep(Duration::from_millis(20)).await;
                txn.commit().await.expect("commit");
                appended
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    observer.await.unwrap();

    let mut sequences: Vec<i64> = t
        .outbox_rows()
        .await
        .iter()
        .map(|row| row.aggregate_seq.unwrap())
        .collect();
    sequences.sort_unstable();
    assert_eq!(sequences, (1..=WRITERS as i64).collect::<Vec<_>>());
    let observations = observations.lock().unwrap().clone();
    assert!(observations.len() > 1, "the observer ran during the writes");
    for seen in &observations {
        let prefix: Vec<i64> = (1..=seen.len() as i64).collect();
        assert_eq!(
            seen, &prefix,
            "committed sequence numbers must never have a gap"
        );
    }
    t.drop().await;
}

async fn writers_on_2_aggregates_draw_seq_in_aggregate_order(backend: Backend) {
    writers_draw_seq_in_aggregate_order(backend, 2).await;
}

async fn writers_on_20_aggregates_draw_seq_in_aggregate_order(backend: Backend) {
    writers_draw_seq_in_aggregate_order(backend, 20).await;
}

/// The write side of per-aggregate order (`outbox_contract::ordering`):
/// eight writers on `aggregates` aggregates, each transaction appending
/// to one aggregate two or three times (through `append` and through
/// `insert_with_events`, one to three events a call) with pauses between,
/// so that writers queue on the aggregate's sequence row while its holder
/// still appends. The table itself must then read, per aggregate in `seq`
/// order, the numbers 1, 2, 3, ...: `seq` order is `aggregate_seq` order.
async fn writers_draw_seq_in_aggregate_order(backend: Backend, aggregates: usize) {
    const WRITERS: usize = 8;
    const ROUNDS: usize = 12;
    let t = TestDb::new(backend).await;
    let sqlite = backend == Backend::Sqlite;
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let db = t.db.clone();
            tokio::spawn(async move {
                let mut retries = 0;
                let mut round = 0;
                while round < ROUNDS {
                    let aggregate = format!("agg-{}", (writer * 7 + round * 3) % aggregates);
                    match write_round(&db, writer, round, &aggregate).await {
                        Ok(()) => round += 1,
                        // SQLite turns a second writer away instead of
                        // queueing it; nothing was committed, so try again.
                        Err(error)
                            if sqlite && error.to_string().contains("database is locked") =>
                        {
                            retries += 1;
                            assert!(retries < 500, "SQLite stayed locked: {error}");
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        Err(error) => panic!("writer {writer} round {round}: {error}"),
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }

    let mut by_aggregate: HashMap<String, Vec<i64>> = HashMap::new();
    for row in t.outbox_rows().await {
        by_aggregate
            .entry(row.aggregate_id)
            .or_default()
            .push(row.aggregate_seq.expect("numbered"));
    }
    assert!(by_aggregate.len() > 1, "{by_aggregate:?}");
    for (aggregate, numbers) in &by_aggregate {
        let expected: Vec<i64> = (1..=numbers.len() as i64).collect();
        assert_eq!(
            numbers, &expected,
            "{aggregate}: aggregate_seq in seq order (the table's insertion order)"
        );
    }
    t.drop().await;
}

/// One transaction of [`writers_draw_seq_in_aggregate_order`].
async fn write_round(
    db: &sea_orm::DatabaseConnection,
    writer: usize,
    round: usize,
    aggregate: &str,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let txn = db.begin().await?;
    let calls = 2 + (writer + round) % 2;
    for call in 0..calls {
        let count = 1 + (writer + round + call) % 3;
        let events: Vec<OutboxEvent> = (0..count)
            .map(|n| {
                OutboxEvent::new(issued((writer * 1000 + round * 10 + n) as i64))
                    .aggregate_id(aggregate.to_owned())
            })
            .collect();
        if call % 2 == 0 {
            outbox_core::append(&txn, events).await?;
        } else {
            invoice_model(writer as i64)
                .insert_with_events(&txn, events)
                .await?;
        }
        tokio::time::sleep(Duration::from_millis(1 + (writer % 3) as u64)).await;
    }
    txn.commit().await?;
    Ok(())
}

async fn plain_sql_insert_of_debezium_columns_gets_defaults(backend: Backend) {
    let t = TestDb::new(backend).await;
    let id = uuid::Uuid::now_v7().to_string();
    let sql = format!(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
         VALUES ('{id}', 'Customer', 'c-1', 'CustomerRegistered', '{{\"name\": \"ada\"}}')"
    );
    t.db.execute_unprepared(&sql).await.unwrap();

    let pending_sql = "SELECT COUNT(*) FROM outbox WHERE published_at IS NULL \
         AND dead_lettered_at IS NULL AND attempts = 0 AND created_at IS NOT NULL \
         AND seq IS NOT NULL AND last_error IS NULL";
    let row =
        t.db.query_one_raw(Statement::from_string(t.db_backend(), pending_sql))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(
        row.try_get_by_index::<i64>(0).unwrap(),
        1,
        "a pending row with defaults"
    );
    let rows = t.outbox_rows().await;
    assert_eq!(rows[0].id, id);
    assert_eq!(rows[0].event_version, 1);
    assert_eq!(rows[0].aggregate_seq, None);
    assert_eq!(rows[0].payload, Some(json!({"name": "ada"})));
    t.drop().await;
}

async fn unserializable_payload_writes_nothing(backend: Backend) {
    let t = TestDb::new(backend).await;
    let txn = t.db.begin().await.unwrap();
    let bad = Unserializable {
        by_bytes: [(vec![1u8], 1u8)].into(),
    };
    let events = [OutboxEvent::new(issued(5)), OutboxEvent::new(bad)];
    let error = invoice_model(5)
        .insert_with_events(&txn, events)
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            OutboxError::Serialize {
                event_type: "Unserializable",
                ..
            }
        ),
        "{error:?}"
    );
    // Refused before the aggregate was written, even inside the transaction.
    let in_txn = txn
        .query_one_raw(Statement::from_string(
            t.db_backend(),
            "SELECT COUNT(*) FROM invoices",
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(in_txn.try_get_by_index::<i64>(0).unwrap(), 0);
    txn.commit().await.unwrap();
    assert_eq!(t.count("invoices").await, 0);
    assert_eq!(t.count("outbox").await, 0);
    t.drop().await;
}

async fn traceparent_and_explicit_ids_are_stored(backend: Backend) {
    let t = TestDb::new(backend).await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let id = uuid::Uuid::now_v7();
    let txn = t.db.begin().await.unwrap();
    let appended = outbox_core::append(
        &txn,
        [OutboxEvent::new(issued(7))
            .aggregate_id("inv-7")
            .traceparent(traceparent)
            .id(id)],
    )
    .await
    .unwrap();
    let error = outbox_core::append(
        &txn,
        [OutboxEvent::new(issued(8))
            .aggregate_id("x")
            .traceparent("nope")],
    )
    .await
    .unwrap_err();
    assert!(
        matches!(error, OutboxError::InvalidTraceparent { .. }),
        "{error:?}"
    );
    let error = outbox_core::append(&txn, [issued(9)]).await.unwrap_err();
    assert!(
        matches!(error, OutboxError::MissingAggregateId { .. }),
        "{error:?}"
    );
    txn.commit().await.unwrap();

    assert_eq!(appended[0].id, id);
    assert_eq!(appended[0].sequence, 1);
    let rows = t.outbox_rows().await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].id, id.to_string());
    assert_eq!(rows[0].aggregate_id, "inv-7");
    assert_eq!(rows[0].traceparent.as_deref(), Some(traceparent));
    t.drop().await;
}

async fn sequence_survives_deleting_published_rows(backend: Backend) {
    let t = TestDb::new(backend).await;
    let append_one = || async {
        let txn = t.db.begin().await.unwrap();
        let appended =
            outbox_core::append(&txn, [OutboxEvent::new(issued(1)).aggregate_id("kept")])
                .await
                .unwrap();
        txn.commit().await.unwrap();
        appended[0].sequence
    };
    assert_eq!(append_one().await, 1);
    assert_eq!(append_one().await, 2);
    t.db.execute_unprepared("DELETE FROM outbox").await.unwrap();
    assert_eq!(append_one().await, 3);
    assert_eq!(invoice::Entity::find().all(&t.db).await.unwrap().len(), 0);
    t.drop().await;
}

/// One call with the events of several aggregates interleaved, twice, and
/// once more with more rows than one insert statement holds: every
/// aggregate's events are numbered in the order given, continuing from the
/// last call, and the returned numbers are the stored ones.
async fn one_call_numbers_each_aggregate_in_order(backend: Backend) {
    let t = TestDb::new(backend).await;
    let calls: Vec<Vec<&str>> = vec![
        vec!["a", "b", "a", "c", "a"],
        vec!["b", "a", "b"],
        (0..1200).map(|n| ["a", "b", "d"][n % 3]).collect(),
    ];
    let mut last: HashMap<&str, i64> = HashMap::new();
    let mut expected: HashMap<String, i64> = HashMap::new();
    let mut appended_in_order = Vec::new();
    for aggregates in calls {
        let events = aggregates
            .iter()
            .zip(1..)
            .map(|(aggregate, amount)| OutboxEvent::new(issued(amount)).aggregate_id(*aggregate));
        let txn = t.db.begin().await.unwrap();
        let appended = outbox_core::append(&txn, events).await.unwrap();
        txn.commit().await.unwrap();
        assert_eq!(appended.len(), aggregates.len());
        for (aggregate, event) in aggregates.iter().zip(&appended) {
            assert_eq!(event.aggregate_id, *aggregate);
            let next = last.entry(aggregate).or_default();
            *next += 1;
            assert_eq!(event.sequence, *next, "aggregate {aggregate}");
            expected.insert(event.id.to_string(), *next);
            appended_in_order.push(event.id.to_string());
        }
    }
    let rows = t.outbox_rows().await;
    // The insertion sequence (`seq`, the relay's claim order) follows the
    // order of the calls and of the events in each.
    let stored_in_order: Vec<&str> = rows.iter().map(|row| row.id.as_str()).collect();
    assert_eq!(stored_in_order, appended_in_order);
    let stored: HashMap<String, i64> = rows
        .into_iter()
        .map(|row| (row.id, row.aggregate_seq.unwrap()))
        .collect();
    assert_eq!(stored, expected);
    t.drop().await;
}

/// `append_transient` (the insert+delete idiom) leaves the table empty and
/// still numbers the aggregate's events; without PostgreSQL's write-ahead
/// log to publish from, it is refused before any write.
async fn transient_events_leave_no_row(backend: Backend) {
    let t = TestDb::new(backend).await;
    let txn = t.db.begin().await.unwrap();
    let result = outbox_core::append_transient(
        &txn,
        [
            OutboxEvent::new(issued(1)).aggregate_id("t-1"),
            OutboxEvent::new(issued(2)).aggregate_id("t-1"),
        ],
    )
    .await;
    match backend {
        Backend::Postgres => {
            let appended = result.unwrap();
            let sequences: Vec<i64> = appended.iter().map(|event| event.sequence).collect();
            assert_eq!(sequences, [1, 2]);
            let later =
                outbox_core::append(&txn, [OutboxEvent::new(issued(3)).aggregate_id("t-1")])
                    .await
                    .unwrap();
            assert_eq!(later[0].sequence, 3, "the sequence went on");
        }
        Backend::MySql | Backend::Sqlite => {
            let error = result.unwrap_err();
            assert!(
                matches!(error, OutboxError::TransientNeedsPostgres { .. }),
                "{error:?}"
            );
            assert!(error.to_string().contains("use `append`"), "{error}");
        }
    }
    txn.commit().await.unwrap();
    let expected = if backend == Backend::Postgres { 1 } else { 0 };
    assert_eq!(
        t.count("outbox").await,
        expected,
        "only the plain append stays"
    );
    t.drop().await;
}

/// The `(aggregateid, type, aggregate_seq)` of every outbox row, in insertion order.
async fn summary(t: &TestDb) -> Vec<(String, String, Option<i64>)> {
    t.outbox_rows()
        .await
        .into_iter()
        .map(|row| (row.aggregate_id, row.event_type, row.aggregate_seq))
        .collect()
}

/// PostgreSQL: how many of the outbox rows of saved invoices were written
/// by the statement that inserted the invoice. The parts of one statement
/// share its command id (`cmin`); each further statement of the
/// transaction has the next one.
async fn events_written_with_their_invoice(t: &TestDb) -> i64 {
    let sql = "SELECT COUNT(*) FROM outbox o \
         JOIN invoices i ON o.aggregateid = i.id::text \
         JOIN outbox_sequence s ON (s.aggregatetype, s.aggregateid) = (o.aggregatetype, o.aggregateid) \
         WHERE o.cmin::text = i.cmin::text AND s.cmin::text = i.cmin::text";
    let row =
        t.db.query_one_raw(Statement::from_string(t.db_backend(), sql))
            .await
            .unwrap()
            .unwrap();
    row.try_get_by_index::<i64>(0).unwrap()
}

/// The model `insert_with_events` returns is the stored row with its
/// generated key (on PostgreSQL decoded from the one statement that also
/// appends), and each event's aggregate id is that key.
async fn insert_with_events_returns_the_saved_row(backend: Backend) {
    let t = TestDb::new(backend).await;
    let txn = t.db.begin().await.unwrap();
    let first = invoice_model(100)
        .insert_with_events(&txn, [issued(100)])
        .await
        .unwrap();
    let second = invoice_model(200)
        .insert_with_events(&txn, [issued(200), issued(201)])
        .await
        .unwrap();
    txn.commit().await.unwrap();

    assert_ne!(first.id, second.id, "each insert returns its own key");
    for saved in [&first, &second] {
        let stored = invoice::Entity::find_by_id(saved.id)
            .one(&t.db)
            .await
            .unwrap()
            .expect("the returned key is the stored row's");
        assert_eq!(&stored, saved);
    }
    let (first_id, second_id) = (first.id.to_string(), second.id.to_string());
    let expected = [
        (first_id, "InvoiceIssued".to_owned(), Some(1)),
        (second_id.clone(), "InvoiceIssued".to_owned(), Some(1)),
        (second_id.clone(), "InvoiceIssued".to_owned(), Some(2)),
    ];
    assert_eq!(summary(&t).await, expected);
    let amounts: Vec<_> = t
        .outbox_rows()
        .await
        .into_iter()
        .map(|row| row.payload.unwrap()["amountCents"].clone())
        .collect();
    assert_eq!(amounts, [json!(100), json!(200), json!(201)]);
    if backend == Backend::Postgres {
        assert_eq!(
            events_written_with_their_invoice(&t).await,
            3,
            "each invoice and its events are one statement"
        );
    }

    // The aggregate's sequence goes on in a later transaction.
    let txn = t.db.begin().await.unwrap();
    let mut paid = second.clone().into_active_model();
    paid.amount_cents = Set(250);
    paid.update_with_events(&txn, [issued(250)]).await.unwrap();
    txn.commit().await.unwrap();
    let last = summary(&t).await.pop().unwrap();
    assert_eq!(last, (second_id, "InvoiceIssued".to_owned(), Some(3)));
    t.drop().await;
}

/// An insert the database refuses (a duplicate key) writes none of its
/// events, reserves no sequence numbers, and the transaction goes on.
async fn failed_insert_writes_no_events(backend: Backend) {
    let t = TestDb::new(backend).await;
    let txn = t.db.begin().await.unwrap();
    let saved = invoice_model(10)
        .insert_with_events(&txn, [OutboxEvent::new(issued(10)).aggregate_id("kept")])
        .await
        .unwrap();

    // A savepoint, so that PostgreSQL's transaction survives the error.
    let savepoint = txn.begin().await.unwrap();
    let duplicate = invoice::ActiveModel {
        id: Set(saved.id),
        amount_cents: Set(20),
    };
    let events = [
        OutboxEvent::new(issued(20)),
        OutboxEvent::new(issued(21)).aggregate_id("kept"),
    ];
    let error = duplicate
        .insert_with_events(&savepoint, events)
        .await
        .unwrap_err();
    assert!(matches!(error, OutboxError::Db(_)), "{error:?}");
    if backend != Backend::Postgres {
        // Only PostgreSQL aborts the transaction on an error; elsewhere
        // the failed call's effects would show here.
        let row = savepoint
            .query_one_raw(Statement::from_string(
                t.db_backend(),
                "SELECT COUNT(*) FROM outbox",
            ))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.try_get_by_index::<i64>(0).unwrap(), 1);
    }
    savepoint.rollback().await.unwrap();

    let later = outbox_core::append(&txn, [OutboxEvent::new(issued(30)).aggregate_id("kept")])
        .await
        .unwrap();
    assert_eq!(
        later[0].sequence, 2,
        "no number was taken by the failed call"
    );
    txn.commit().await.unwrap();

    assert_eq!(t.count("invoices").await, 1);
    let expected = [
        ("kept".to_owned(), "InvoiceIssued".to_owned(), Some(1)),
        ("kept".to_owned(), "InvoiceIssued".to_owned(), Some(2)),
    ];
    assert_eq!(summary(&t).await, expected);
    t.drop().await;
}

/// `before_save` runs before the row is written (its changes are saved) and
/// `after_save` after the row and the given events are (the order hooks'
/// `OrderPlaced` follows the event given to `insert_with_events`).
async fn insert_with_events_runs_the_model_hooks(backend: Backend) {
    let t = TestDb::new(backend).await;
    let txn = t.db.begin().await.unwrap();
    let placed = order::ActiveModel {
        customer: Set("ada".into()),
        total_cents: Set(4200),
        status: Set("placed".into()),
        ..Default::default()
    }
    .insert_with_events(
        &txn,
        [OrderStatusChanged {
            order_id: 0,
            status: "placed".into(),
        }],
    )
    .await
    .unwrap();
    let customer = customer::ActiveModel {
        tenant: Set("acme".into()),
        id: Set(uuid::Uuid::now_v7()),
        name: Set("  Ada Lovelace ".into()),
    }
    .insert_with_events(&txn, [registered(1)])
    .await
    .unwrap();
    txn.commit().await.unwrap();

    let id = placed.id.to_string();
    let customer_id = format!("{}:{}", customer.tenant, customer.id);
    let expected = [
        (id.clone(), "OrderStatusChanged".to_owned(), Some(1)),
        (id, "OrderPlaced".to_owned(), Some(2)),
        (customer_id, "CustomerRegistered".to_owned(), Some(1)),
    ];
    assert_eq!(summary(&t).await, expected);
    assert_eq!(
        customer.name, "Ada Lovelace",
        "before_save trimmed the name"
    );
    let stored = customer::Entity::find_by_id((customer.tenant.clone(), customer.id))
        .one(&t.db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored, customer);

    // Outside a transaction the save is refused before anything is
    // written, even with no events to append.
    let error = order::ActiveModel {
        customer: Set("grace".into()),
        total_cents: Set(1),
        status: Set("placed".into()),
        ..Default::default()
    }
    .insert_with_events(&t.db, Vec::<OutboxEvent>::new())
    .await
    .unwrap_err();
    assert!(
        matches!(error, OutboxError::NotInTransaction { .. }),
        "{error:?}"
    );
    assert_eq!(t.count("orders").await, 1);
    t.drop().await;
}

fn registered(customer_id: i64) -> CustomerRegistered {
    CustomerRegistered {
        customer_id,
        first_name: "Ada".into(),
        last_name: "Lovelace".into(),
    }
}

/// A composite key of a string and a UUID becomes `<tenant>:<uuid>`, the
/// UUID hyphenated in lower case, as the key formats in Rust; the saved
/// row's key and given ids mix in one call, in one aggregate type or in
/// several.
async fn composite_keys_become_aggregate_ids(backend: Backend) {
    let t = TestDb::new(backend).await;
    let uuid = uuid::Uuid::parse_str("0190A0B1-C2D3-7E4F-8A9B-0C1D2E3F4A5B").unwrap();
    let new_customer = |tenant: &str, id| customer::ActiveModel {
        tenant: Set(tenant.into()),
        id: Set(id),
        name: Set("ada".into()),
    };
    let txn = t.db.begin().await.unwrap();
    new_customer("acme", uuid)
        .insert_with_events(
            &txn,
            [
                OutboxEvent::new(registered(1)),
                OutboxEvent::new(issued(1)).aggregate_id("inv-1"),
                OutboxEvent::new(registered(2)),
            ],
        )
        .await
        .unwrap();
    // One aggregate type with the row's key and a given id: the given id
    // happens to be the row's own key, so all three are one aggregate.
    let other = uuid::Uuid::now_v7();
    let other_id = format!("globex:{other}");
    new_customer("globex", other)
        .insert_with_events(
            &txn,
            [
                OutboxEvent::new(registered(3)),
                OutboxEvent::new(registered(4)).aggregate_id(other_id.clone()),
                OutboxEvent::new(registered(5)),
            ],
        )
        .await
        .unwrap();
    txn.commit().await.unwrap();

    let acme = "acme:0190a0b1-c2d3-7e4f-8a9b-0c1d2e3f4a5b".to_owned();
    let customer = "CustomerRegistered".to_owned();
    let expected = [
        (acme.clone(), customer.clone(), Some(1)),
        ("inv-1".to_owned(), "InvoiceIssued".to_owned(), Some(1)),
        (acme, customer.clone(), Some(2)),
        (other_id.clone(), customer.clone(), Some(1)),
        (other_id.clone(), customer.clone(), Some(2)),
        (other_id, customer, Some(3)),
    ];
    assert_eq!(summary(&t).await, expected);
    t.drop().await;
}

/// More events than one statement holds: the insert and the append take a
/// statement each, and the events are numbered all the same.
async fn insert_with_many_events_numbers_them_all(backend: Backend) {
    const EVENTS: i64 = 1200;
    let t = TestDb::new(backend).await;
    let txn = t.db.begin().await.unwrap();
    let saved = invoice_model(1)
        .insert_with_events(&txn, (1..=EVENTS).map(issued))
        .await
        .unwrap();
    txn.commit().await.unwrap();

    let rows = summary(&t).await;
    assert_eq!(rows.len(), EVENTS as usize);
    if backend == Backend::Postgres {
        assert_eq!(events_written_with_their_invoice(&t).await, 0);
    }
    for (row, expected) in rows.iter().zip(1..) {
        assert_eq!(row.0, saved.id.to_string());
        assert_eq!(row.2, Some(expected));
    }
    t.drop().await;
}
