//! The inbox on PostgreSQL, MariaDB and SQLite: each event's effect is
//! applied once per consumer, whatever arrives twice, late, early or at the
//! same time. Each test runs once per backend against a fresh database.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{EventMetadata, Gap, GapPolicy, Inbox, Outcome};
use outbox_tests::{Backend, TestDb, backend_tests};
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, Statement, TransactionTrait};
use uuid::Uuid;

backend_tests!(
    a_duplicate_is_applied_once,
    a_gap_is_reported_and_recorded,
    a_late_event_is_late_never_a_duplicate_or_stale,
    the_apply_late_policy_applies_a_late_event_once,
    the_hold_policy_applies_nothing_after_a_gap,
    events_without_a_sequence_are_deduplicated_by_id,
    consumers_and_topics_keep_separate_records,
    a_failed_effect_records_nothing,
    retention_deletes_ids_and_the_high_water_mark_still_skips,
    concurrent_deliveries_of_one_event_apply_it_once,
    concurrent_deliveries_of_a_late_event_apply_it_once,
);

const TOPIC: &str = "outbox.event.Order";

/// A test database with a table the effects write to.
async fn setup(backend: Backend) -> TestDb {
    let t = TestDb::new(backend).await;
    t.db.execute_unprepared(
        "CREATE TABLE effects (consumer VARCHAR(64) NOT NULL, event_id VARCHAR(36) NOT NULL)",
    )
    .await
    .expect("create effects table");
    t
}

fn event(aggregate_id: &str, sequence: Option<i64>) -> EventMetadata {
    EventMetadata {
        id: Uuid::now_v7(),
        event_type: "OrderPlaced".into(),
        version: 1,
        topic: TOPIC.into(),
        aggregate_id: Some(aggregate_id.into()),
        aggregate_sequence: sequence,
        traceparent: None,
        replay_id: None,
    }
}

/// The effect: one row in `effects`.
async fn effect(
    txn: &DatabaseTransaction,
    inbox: &Inbox,
    event: &EventMetadata,
) -> Result<(), DbErr> {
    txn.execute_raw(Statement::from_sql_and_values(
        txn.get_database_backend(),
        match txn.get_database_backend() {
            sea_orm::DbBackend::Postgres => "INSERT INTO effects VALUES ($1, $2)",
            _ => "INSERT INTO effects VALUES (?, ?)",
        },
        [inbox.consumer().into(), event.id.to_string().into()],
    ))
    .await?;
    Ok(())
}

/// Applies `event` in a transaction of its own and commits.
async fn deliver(t: &TestDb, inbox: &Inbox, event: &EventMetadata) -> Outcome<()> {
    let txn = t.db.begin().await.unwrap();
    let outcome = inbox
        .apply(&txn, event, |txn| effect(txn, inbox, event))
        .await
        .unwrap();
    txn.commit().await.unwrap();
    outcome
}

async fn effects(t: &TestDb) -> i64 {
    t.count("effects").await
}

async fn a_duplicate_is_applied_once(backend: Backend) {
    let t = setup(backend).await;
    let inbox = Inbox::new("summary", GapPolicy::Apply);
    let placed = event("7", Some(1));

    assert_eq!(
        deliver(&t, &inbox, &placed).await,
        Outcome::Applied {
            value: (),
            gap: None
        }
    );
    assert_eq!(deliver(&t, &inbox, &placed).await, Outcome::Duplicate);
    assert_eq!(effects(&t).await, 1);
    assert_eq!(
        inbox.last_applied(&t.db, TOPIC, "7").await.unwrap(),
        Some(1)
    );
    t.drop().await;
}

async fn a_gap_is_reported_and_recorded(backend: Backend) {
    let t = setup(backend).await;
    let inbox = Inbox::new("summary", GapPolicy::Apply);
    let [first, _, third] = [1, 2, 3].map(|sequence| event("7", Some(sequence)));

    assert!(deliver(&t, &inbox, &first).await.is_applied());
    assert_eq!(
        deliver(&t, &inbox, &third).await,
        Outcome::Applied {
            value: (),
            gap: Some(Gap {
                last_applied: 1,
                sequence: 3
            })
        }
    );
    assert_eq!(effects(&t).await, 2);
    assert_eq!(
        inbox.last_applied(&t.db, TOPIC, "7").await.unwrap(),
        Some(3)
    );
    assert_eq!(
        inbox.skipped(&t.db, TOPIC, "7").await.unwrap(),
        [2..=2],
        "the mark skipped 2"
    );

    // An aggregate's first event with a later number is a gap from nothing.
    let fifth_of_another = event("8", Some(5));
    let outcome = deliver(&t, &inbox, &fifth_of_another).await;
    assert_eq!(
        outcome,
        Outcome::Applied {
            value: (),
            gap: Some(Gap {
                last_applied: 0,
                sequence: 5
            })
        }
    );
    assert_eq!(inbox.skipped(&t.db, TOPIC, "8").await.unwrap(), [1..=4]);
    assert!(
        Inbox::new("mailer", GapPolicy::Apply)
            .skipped(&t.db, TOPIC, "8")
            .await
            .unwrap()
            .is_empty(),
        "gaps are per consumer"
    );
    t.drop().await;
}

/// An aggregate's events 1, 4, 3 (2 and 3 reordered behind 4): 3 was never
/// applied, so it is late, not a redelivery, and stays so however often it
/// comes and whatever retention deletes; redeliveries of 1 and 4 stay
/// duplicates (then stale, once their ids are deleted).
async fn a_late_event_is_late_never_a_duplicate_or_stale(backend: Backend) {
    let t = setup(backend).await;
    let inbox = Inbox::new("summary", GapPolicy::Apply);
    let [first, _, third, fourth] = [1, 2, 3, 4].map(|sequence| event("7", Some(sequence)));
    assert!(deliver(&t, &inbox, &first).await.is_applied());
    assert!(deliver(&t, &inbox, &fourth).await.is_applied());

    let late = Outcome::Late {
        sequence: 3,
        last_applied: 4,
    };
    for delivery in 1..=2 {
        assert_eq!(
            deliver(&t, &inbox, &third).await,
            late,
            "delivery {delivery}: never applied, so neither a duplicate nor stale"
        );
    }
    assert_eq!(effects(&t).await, 2, "GapPolicy::Apply does not apply it");
    assert_eq!(inbox.skipped(&t.db, TOPIC, "7").await.unwrap(), [2..=3]);

    assert_eq!(deliver(&t, &inbox, &fourth).await, Outcome::Duplicate);
    assert_eq!(deliver(&t, &inbox, &first).await, Outcome::Duplicate);

    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        inbox.delete_processed(&t.db, Duration::ZERO).await.unwrap(),
        2
    );
    assert_eq!(
        deliver(&t, &inbox, &third).await,
        late,
        "retention does not turn a late event into a stale one"
    );
    assert_eq!(
        deliver(&t, &inbox, &fourth).await,
        Outcome::Stale { last_applied: 4 },
        "a redelivery whose id was deleted"
    );
    assert_eq!(
        deliver(&t, &inbox, &first).await,
        Outcome::Stale { last_applied: 4 }
    );

    // The same consumer, now holding gaps: a gap it skipped before is
    // still late, and still not applied.
    let holding = Inbox::new("summary", GapPolicy::Hold);
    assert_eq!(deliver(&t, &holding, &third).await, late);
    assert_eq!(effects(&t).await, 2);
    t.drop().await;
}

/// `GapPolicy::ApplyLate`: events 1, 5, then 3, 2, 4 late. Each late event
/// is applied once, leaves the recorded gap, and its redelivery is a
/// duplicate (stale once its id is deleted), never applied again.
async fn the_apply_late_policy_applies_a_late_event_once(backend: Backend) {
    let t = setup(backend).await;
    let inbox = Inbox::new("counts", GapPolicy::ApplyLate);
    let events = [1, 2, 3, 4, 5].map(|sequence| event("7", Some(sequence)));
    let [first, second, third, fourth, fifth] = &events;

    assert!(deliver(&t, &inbox, first).await.is_applied());
    assert_eq!(
        deliver(&t, &inbox, fifth).await,
        Outcome::Applied {
            value: (),
            gap: Some(Gap {
                last_applied: 1,
                sequence: 5
            })
        }
    );
    assert_eq!(
        deliver(&t, &inbox, third).await,
        Outcome::AppliedLate {
            value: (),
            sequence: 3,
            last_applied: 5
        }
    );
    assert_eq!(
        inbox.skipped(&t.db, TOPIC, "7").await.unwrap(),
        [2..=2, 4..=4]
    );
    assert_eq!(deliver(&t, &inbox, third).await, Outcome::Duplicate);
    assert_eq!(effects(&t).await, 3);

    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        inbox.delete_processed(&t.db, Duration::ZERO).await.unwrap(),
        3
    );
    assert_eq!(
        deliver(&t, &inbox, third).await,
        Outcome::Stale { last_applied: 5 },
        "applied late once; after retention its redelivery is stale"
    );

    for (late, sequence) in [(second, 2), (fourth, 4)] {
        assert_eq!(
            deliver(&t, &inbox, late).await,
            Outcome::AppliedLate {
                value: (),
                sequence,
                last_applied: 5
            }
        );
    }
    assert!(inbox.skipped(&t.db, TOPIC, "7").await.unwrap().is_empty());
    assert_eq!(effects(&t).await, 5, "every event applied once");
    assert_eq!(
        inbox.last_applied(&t.db, TOPIC, "7").await.unwrap(),
        Some(5),
        "late events leave the mark where it is"
    );
    t.drop().await;
}

async fn the_hold_policy_applies_nothing_after_a_gap(backend: Backend) {
    let t = setup(backend).await;
    let inbox = Inbox::new("ledger", GapPolicy::Hold);
    let [first, second, third] = [1, 2, 3].map(|sequence| event("7", Some(sequence)));

    assert!(deliver(&t, &inbox, &first).await.is_applied());
    let gap = Gap {
        last_applied: 1,
        sequence: 3,
    };
    assert_eq!(deliver(&t, &inbox, &third).await, Outcome::Held { gap });
    assert_eq!(effects(&t).await, 1, "a held event is not applied");
    assert_eq!(
        inbox.last_applied(&t.db, TOPIC, "7").await.unwrap(),
        Some(1)
    );

    // The missing event arrives; the held one applies after it.
    assert_eq!(
        deliver(&t, &inbox, &second).await,
        Outcome::Applied {
            value: (),
            gap: None
        }
    );
    assert_eq!(
        deliver(&t, &inbox, &third).await,
        Outcome::Applied {
            value: (),
            gap: None
        }
    );
    assert_eq!(effects(&t).await, 3);
    assert_eq!(
        inbox.last_applied(&t.db, TOPIC, "7").await.unwrap(),
        Some(3)
    );

    let not_first = event("9", Some(2));
    assert!(matches!(
        deliver(&t, &inbox, &not_first).await,
        Outcome::Held {
            gap: Gap {
                last_applied: 0,
                sequence: 2
            }
        }
    ));
    assert_eq!(inbox.last_applied(&t.db, TOPIC, "9").await.unwrap(), None);
    t.drop().await;
}

async fn events_without_a_sequence_are_deduplicated_by_id(backend: Backend) {
    let t = setup(backend).await;
    let inbox = Inbox::new("summary", GapPolicy::Hold);
    let unsequenced = event("7", None);
    let mut keyless = event("7", Some(3));
    keyless.aggregate_id = None;

    for event in [&unsequenced, &keyless] {
        assert_eq!(
            deliver(&t, &inbox, event).await,
            Outcome::Applied {
                value: (),
                gap: None
            },
            "no sequence, no gap"
        );
        assert_eq!(deliver(&t, &inbox, event).await, Outcome::Duplicate);
    }
    assert_eq!(effects(&t).await, 2);
    assert_eq!(inbox.last_applied(&t.db, TOPIC, "7").await.unwrap(), None);
    t.drop().await;
}

async fn consumers_and_topics_keep_separate_records(backend: Backend) {
    let t = setup(backend).await;
    let summary = Inbox::new("summary", GapPolicy::Apply);
    let mailer = Inbox::new("mailer", GapPolicy::Apply);
    let placed = event("7", Some(1));

    assert!(deliver(&t, &summary, &placed).await.is_applied());
    assert!(
        deliver(&t, &mailer, &placed).await.is_applied(),
        "another consumer applies it too"
    );
    assert_eq!(deliver(&t, &mailer, &placed).await, Outcome::Duplicate);

    // Aggregate "7" of another aggregate type (topic) has its own numbers.
    let mut invoice = event("7", Some(1));
    invoice.topic = "outbox.event.Invoice".into();
    assert!(deliver(&t, &summary, &invoice).await.is_applied());
    assert_eq!(effects(&t).await, 3);
    t.drop().await;
}

async fn a_failed_effect_records_nothing(backend: Backend) {
    let t = setup(backend).await;
    let inbox = Inbox::new("summary", GapPolicy::Apply);
    let placed = event("7", Some(1));

    let txn = t.db.begin().await.unwrap();
    let failed = inbox
        .apply(&txn, &placed, |_txn| async {
            Err::<(), _>(DbErr::Custom("the effect failed".into()))
        })
        .await;
    assert!(matches!(failed, Err(DbErr::Custom(message)) if message == "the effect failed"));
    txn.rollback().await.unwrap();

    assert!(
        deliver(&t, &inbox, &placed).await.is_applied(),
        "applied on the next delivery"
    );
    assert_eq!(effects(&t).await, 1);
    t.drop().await;
}

async fn retention_deletes_ids_and_the_high_water_mark_still_skips(backend: Backend) {
    let t = setup(backend).await;
    let inbox = Inbox::new("summary", GapPolicy::Apply);
    let other = Inbox::new("mailer", GapPolicy::Apply);
    let [first, second] = [1, 2].map(|sequence| event("7", Some(sequence)));
    let unsequenced = event("8", None);
    for event in [&first, &second, &unsequenced] {
        assert!(deliver(&t, &inbox, event).await.is_applied());
    }
    assert!(deliver(&t, &other, &first).await.is_applied());

    let hour = Duration::from_secs(3600);
    assert_eq!(inbox.delete_processed(&t.db, hour).await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        inbox.delete_processed(&t.db, Duration::ZERO).await.unwrap(),
        3
    );
    assert_eq!(
        t.count("outbox_inbox").await,
        1,
        "the other consumer's id stays"
    );

    assert_eq!(
        deliver(&t, &inbox, &second).await,
        Outcome::Stale { last_applied: 2 },
        "the high-water mark still recognises the redelivery"
    );
    assert!(
        deliver(&t, &inbox, &unsequenced).await.is_applied(),
        "without a sequence, dedupe ends with the id's retention"
    );
    assert_eq!(effects(&t).await, 5);
    t.drop().await;
}

async fn concurrent_deliveries_of_one_event_apply_it_once(backend: Backend) {
    let t = Arc::new(setup(backend).await);
    let inbox = Arc::new(Inbox::new("summary", GapPolicy::Apply));
    for sequence in [Some(1), None] {
        let event = Arc::new(event("7", sequence));
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let (t, inbox, event) = (t.clone(), inbox.clone(), event.clone());
                tokio::spawn(async move {
                    let txn = t.db.begin().await.unwrap();
                    let outcome = inbox
                        .apply(&txn, &event, |txn| async {
                            effect(txn, &inbox, &event).await?;
                            // Hold the transaction open while the others try.
                            tokio::time::sleep(Duration::from_millis(150)).await;
                            Ok::<_, DbErr>(())
                        })
                        .await
                        .unwrap();
                    txn.commit().await.unwrap();
                    outcome
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.unwrap());
        }
        let applied = outcomes.iter().filter(|o| o.is_applied()).count();
        assert_eq!(applied, 1, "{sequence:?}: {outcomes:?}");
        assert!(
            outcomes
                .iter()
                .all(|o| o.is_applied() || *o == Outcome::Duplicate),
            "{outcomes:?}"
        );
    }
    assert_eq!(effects(&t).await, 2);
    Arc::into_inner(t).unwrap().drop().await;
}

async fn concurrent_deliveries_of_a_late_event_apply_it_once(backend: Backend) {
    let t = Arc::new(setup(backend).await);
    let inbox = Arc::new(Inbox::new("counts", GapPolicy::ApplyLate));
    for sequence in [1, 3] {
        assert!(
            deliver(&t, &inbox, &event("7", Some(sequence)))
                .await
                .is_applied()
        );
    }
    let late = Arc::new(event("7", Some(2)));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (t, inbox, late) = (t.clone(), inbox.clone(), late.clone());
            tokio::spawn(async move {
                let txn = t.db.begin().await.unwrap();
                let outcome = inbox
                    .apply(&txn, &late, |txn| async {
                        effect(txn, &inbox, &late).await?;
                        // Hold the transaction open while the others try.
                        tokio::time::sleep(Duration::from_millis(150)).await;
                        Ok::<_, DbErr>(())
                    })
                    .await
                    .unwrap();
                txn.commit().await.unwrap();
                outcome
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    let applied_late = Outcome::AppliedLate {
        value: (),
        sequence: 2,
        last_applied: 3,
    };
    assert_eq!(
        outcomes.iter().filter(|o| **o == applied_late).count(),
        1,
        "{outcomes:?}"
    );
    assert!(
        outcomes
            .iter()
            .all(|o| *o == applied_late || *o == Outcome::Duplicate),
        "{outcomes:?}"
    );
    assert_eq!(effects(&t).await, 3);
    Arc::into_inner(t).unwrap().drop().await;
}
