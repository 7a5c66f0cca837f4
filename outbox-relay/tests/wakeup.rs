//! Waking the relay on PostgreSQL: the outbox trigger notifies only while a
//! relay waits (it holds the wake-up advisory locks), and a relay that
//! waits misses no commit, even one in flight while it starts waiting.
//!
//! Each test has a database of its own: notification channels and advisory
//! locks are shared by every schema of a database, so other tests' relays
//! and writers would otherwise notify too.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use outbox_relay::source::postgres::PostgresSource;
use outbox_relay::source::{Settlement, Source, SourceOptions};
use outbox_tests::TestDb;
use outbox_tests::process::RelayProcess;
use outbox_tests::stream::append_events;
use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait};
use sqlx::postgres::PgListener;

const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");

/// Long enough for a notification sent at commit to arrive on loopback.
const QUIET: Duration = Duration::from_millis(500);
const PATIENCE: Duration = Duration::from_secs(20);
const HOUR: Duration = Duration::from_secs(3600);

/// A connection listening on the channel the trigger notifies.
async fn observer(t: &TestDb) -> PgListener {
    let mut listener = PgListener::connect(&t.url).await.expect("connect");
    listener.listen("outbox").await.expect("LISTEN outbox");
    listener
}

/// Whether a notification arrives within [`QUIET`].
async fn notified(observer: &mut PgListener) -> bool {
    match tokio::time::timeout(QUIET, observer.recv()).await {
        Ok(notification) => {
            notification.expect("the observer's connection");
            while observer.next_buffered().is_some() {}
            true
        }
        Err(_elapsed) => false,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn writers_notify_only_while_a_relay_waits() {
    let t = TestDb::new_postgres_database().await;
    let mut observer = observer(&t).await;

    append_events(&t.db, "nobody-waits", 1).await;
    assert!(
        !notified(&mut observer).await,
        "with no relay waiting, a commit notifies nobody"
    );
    t.db.execute_unprepared("DELETE FROM outbox").await.unwrap();

    let source = source(&t).await;
    about_to_wait(&source).await;

    let waiting = wait_in_background(&source);
    append_events(&t.db, "relay-waits", 1).await;
    assert!(
        notified(&mut observer).await,
        "a commit while the relay waits notifies"
    );
    tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("the notification ends the relay's wait")
        .unwrap();

    // A claim that finds rows releases the slots: the relay is busy.
    let claim = source.claim(10, &[]).await.unwrap();
    assert_eq!(claim.records().len(), 1);
    append_events(&t.db, "relay-busy", 1).await;
    assert!(
        !notified(&mut observer).await,
        "a commit while the relay is busy notifies nobody"
    );
    drop(claim);

    // Waiting again: the slots are taken again, and the next claim sees
    // both rows committed meanwhile.
    tokio::time::timeout(PATIENCE, source.wait_for_rows(HOUR))
        .await
        .expect("the slots are free again");
    let claim = source.claim(10, &[]).await.unwrap();
    assert_eq!(claim.records().len(), 2);
    drop(claim);
    t.drop().await;
}

/// The relay's source for the test's database, with a one-hour poll
/// interval in the calls below: only notifications end its waits.
async fn source(t: &TestDb) -> Arc<PostgresSource> {
    Arc::new(
        PostgresSource::connect(&t.url, SourceOptions::default())
            .await
            .expect("source"),
    )
}

/// What the relay does when it is about to wait: it takes the wake-up
/// slots (the first call returns at once) and claims once more, finding
/// nothing.
async fn about_to_wait(source: &PostgresSource) {
    tokio::time::timeout(PATIENCE, source.wait_for_rows(HOUR))
        .await
        .expect("the first call returns once the slots are held");
    let claim = source.claim(10, &[]).await.unwrap();
    assert!(claim.records().is_empty());
    claim.settle(&Settlement::default()).await.unwrap();
}

/// The relay's wait for rows, which ends on a notification.
fn wait_in_background(source: &Arc<PostgresSource>) -> tokio::task::JoinHandle<()> {
    let source = source.clone();
    tokio::spawn(async move { source.wait_for_rows(HOUR).await })
}

/// The wake-up slots held in this test's database, as `pg_locks` shows
/// them: 64 while a relay waits.
async fn slots_held(t: &TestDb) -> i64 {
    t.count(
        "pg_locks WHERE locktype = 'advisory' AND mode = 'ShareLock' \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .await
}

/// The relay's `LISTEN` connection dies while it waits (a restart, a
/// network cut, an administrator's `pg_terminate_backend`): its slots go
/// with it, and the relay takes them again on a new connection before it
/// waits again, so a later commit still wakes it.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_listen_connection_is_replaced_with_its_slots() {
    let t = TestDb::new_postgres_database().await;
    let source = source(&t).await;
    about_to_wait(&source).await;
    assert_eq!(slots_held(&t).await, 64);

    let waiting = wait_in_background(&source);
    t.db.execute_unprepared(
        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' \
         AND mode = 'ShareLock' \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .await
    .unwrap();
    tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("a lost connection ends the wait")
        .unwrap();

    // As the relay loop does: claim, then wait again.
    about_to_wait(&source).await;
    assert_eq!(slots_held(&t).await, 64, "the slots are held again");
    let waiting = wait_in_background(&source);
    append_events(&t.db, "after-the-cut", 1).await;
    tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("the commit notifies the new connection")
        .unwrap();
    drop(source);
    t.drop().await;
}

/// After `start`, appends one event and commits after `hold`: a writer
/// whose transaction holds its wake-up slot while the relay, busy with the
/// rows of the writers before it, starts waiting.
async fn slow_writer(
    db: DatabaseConnection,
    aggregate_id: String,
    start: Duration,
    hold: Duration,
) {
    tokio::time::sleep(start).await;
    let txn = db.begin().await.expect("begin");
    let event = outbox_core::OutboxEvent::new(outbox_tests::events::InvoiceIssuedV2 {
        amount_cents: 1,
        note: None,
    })
    .aggregate_id(aggregate_id);
    outbox_core::append(&txn, [event]).await.expect("append");
    tokio::time::sleep(hold).await;
    txn.commit().await.expect("commit");
}

const ROUNDS: u64 = 40;
const WRITERS: u64 = 5;

/// With a one-hour poll interval only notifications wake the relay. In
/// each round a first commit wakes the relay; while it is busy publishing
/// that row (not holding the wake-up slots), later writers append and hold
/// their transactions open until after it starts waiting again, one in
/// some rounds for longer than the relay waits for writers. Each round
/// must be published before the next starts, so a commit the relay missed
/// would stall the test.
#[tokio::test(flavor = "multi_thread")]
async fn a_waiting_relay_misses_no_commit() {
    let t = TestDb::new_postgres_database().await;
    let relay = RelayProcess::spawn(
        Path::new(RELAY),
        &["run", "--sink", "stdout", "--poll-interval", "1h"],
        &[("DATABASE_URL", &t.url)],
    );
    for round in 0..ROUNDS {
        let writers: Vec<_> = (0..WRITERS)
            .map(|writer| {
                let (start, hold) = match writer {
                    0 => (0, 0),
                    1 if round % 5 == 4 => (2, 250),
                    _ => ((round + writer * 3) % 10, 5 + (round * writer) % 20),
                };
                tokio::spawn(slow_writer(
                    t.db.clone(),
                    format!("round-{round}-writer-{writer}"),
                    Duration::from_millis(start),
                    Duration::from_millis(hold),
                ))
            })
            .collect();
        for writer in writers {
            writer.await.unwrap();
        }
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while t.count("outbox WHERE published_at IS NULL").await > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "round {round}: committed rows stayed unpublished (no wake-up)\n{}",
                relay.stderr().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let events = (ROUNDS * WRITERS) as i64;
    assert_eq!(
        t.count("outbox WHERE published_at IS NOT NULL").await,
        events
    );
    assert_eq!(relay.stdout().len() as i64, events, "one message per event");
    drop(relay);
    t.drop().await;
}
