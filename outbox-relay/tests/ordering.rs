//! Ordering and delivery under failures, with the relay as a library:
//! rows committed out of sequence order, a crash between the broker's
//! acknowledgement and the mark, and broker errors injected mid-batch with
//! librdkafka's mock cluster.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use outbox_relay::message::TopicTemplate;
use outbox_relay::message::{HEADER_ID, Message};
use outbox_relay::relay::{Relay, RelayOptions};
use outbox_relay::shutdown::Shutdown;
use outbox_relay::sink::kafka::{KafkaOptions, KafkaSink};
use outbox_relay::sink::{SendError, Sink};
use outbox_relay::source::shards::ShardConfig;
use outbox_relay::source::{
    self, AggregateKey, Backlog, Claim, InFlight, Settlement, Source, SourceError, SourceOptions,
    Status,
};
use outbox_tests::kafka;
use outbox_tests::stream::{append_events, check_stream, seed};
use outbox_tests::{Backend, TestDb};
use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use sea_orm::{ConnectionTrait, TransactionTrait};

/// Shows the relay's own logs in a failing test's output (`TEST_LOG` sets
/// the filter).
fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            std::env::var("TEST_LOG").unwrap_or_else(|_| "outbox_relay=info".into()),
        ))
        .with_test_writer()
        .try_init();
}

fn relay_options() -> RelayOptions {
    RelayOptions {
        batch_size: 100,
        poll_interval: Duration::from_millis(50),
        drain: true,
        retention: None,
        ..RelayOptions::default()
    }
}

async fn kafka_sink(brokers: &str) -> Arc<dyn Sink> {
    logs();
    Arc::new(
        KafkaSink::connect(KafkaOptions {
            brokers: brokers.to_owned(),
            send_timeout: Duration::from_secs(10),
            ..KafkaOptions::default()
        })
        .await
        .expect("kafka sink"),
    )
}

async fn drain(t: &TestDb, sink: Arc<dyn Sink>, topics: &str) {
    drain_with(t, sink, topics, relay_options()).await;
}

async fn drain_with(t: &TestDb, sink: Arc<dyn Sink>, topics: &str, options: RelayOptions) {
    let source = source::connect(&t.url, SourceOptions::default())
        .await
        .unwrap();
    let relay = Relay::new(
        Arc::from(source),
        sink,
        TopicTemplate::new(format!("{topics}.{{aggregatetype}}")),
        options,
    );
    let (_trigger, shutdown) = Shutdown::manual();
    relay.run(shutdown).await.expect("relay run");
}

/// A transaction that inserted first but commits last is not skipped: the
/// relay claims by state, not by a "last id seen" cursor.
#[tokio::test(flavor = "multi_thread")]
async fn rows_committed_out_of_sequence_order_are_published() {
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("late");
    let t = TestDb::new(Backend::Postgres).await;

    let early = t.db.begin().await.unwrap();
    let late_commit = outbox_core::append(
        &early,
        [
            outbox_core::OutboxEvent::new(outbox_tests::events::InvoiceIssuedV2 {
                amount_cents: 1,
                note: Some("inserted first, committed last".into()),
            })
            .aggregate_id("slow"),
        ],
    )
    .await
    .unwrap();
    let quick = append_events(&t.db, "quick", 2).await;

    let sink = kafka_sink(&brokers).await;
    drain(&t, sink.clone(), &topics).await;
    assert_eq!(t.count("outbox WHERE published_at IS NOT NULL").await, 2);

    early.commit().await.unwrap();
    drain(&t, sink, &topics).await;

    let messages = kafka::consume(
        &brokers,
        &format!("{topics}.Invoice"),
        3,
        Duration::from_secs(20),
        Duration::from_millis(300),
    );
    let ids: Vec<String> = quick
        .iter()
        .chain(&late_commit)
        .map(|event| event.id.to_string())
        .collect();
    check_stream(&messages, &ids);
    assert_eq!(messages.last().unwrap().key.as_deref(), Some("slow"));
    t.drop().await;
}

/// Inserts `rows` (aggregate, `aggregate_seq`) of type `Invoice` in the
/// order given, by plain SQL; returns each row's aggregate and number by id.
async fn insert_numbered(
    t: &TestDb,
    rows: &[(&'static str, i64)],
) -> std::collections::BTreeMap<String, (&'static str, i64)> {
    let mut ids = std::collections::BTreeMap::new();
    for &(aggregate, number) in rows {
        let id = uuid::Uuid::now_v7().to_string();
        t.db.execute_unprepared(&format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_seq) \
             VALUES ('{id}', 'Invoice', '{aggregate}', 'InvoiceIssued', '{{}}', {number})"
        ))
        .await
        .unwrap();
        ids.insert(id, (aggregate, number));
    }
    ids
}

/// Each aggregate's numbers in the order their messages arrived on `topic`.
fn arrivals(
    brokers: &str,
    topic: &str,
    ids: &std::collections::BTreeMap<String, (&'static str, i64)>,
) -> std::collections::BTreeMap<&'static str, Vec<i64>> {
    let messages = kafka::consume(
        brokers,
        topic,
        ids.len(),
        Duration::from_secs(20),
        Duration::from_millis(300),
    );
    let mut arrived = std::collections::BTreeMap::<&str, Vec<i64>>::new();
    for message in &messages {
        let (aggregate, number) = ids[&message.event_id().expect("id header")];
        arrived.entry(aggregate).or_default().push(number);
    }
    arrived
}

/// Rows that break the writers' rule (numbered against their insertion
/// order, as a foreign writer or rows restored by hand could leave them)
/// still reach the broker in `aggregate_seq` order when one batch holds
/// them, on every backend.
#[tokio::test(flavor = "multi_thread")]
async fn rows_numbered_against_seq_order_reach_the_broker_in_number_order() {
    let brokers = kafka::brokers();
    for backend in [Backend::Postgres, Backend::MySql, Backend::Sqlite] {
        let topics = kafka::topic_prefix(&format!("inverted-{backend:?}").to_lowercase());
        let t = TestDb::new(backend).await;
        // `hand` numbered 3, 2, 1 in insertion order; `other` in order.
        let ids = insert_numbered(
            &t,
            &[
                ("hand", 3),
                ("other", 1),
                ("hand", 2),
                ("hand", 1),
                ("other", 2),
            ],
        )
        .await;
        // A bound on bytes that lets the first claim take every row.
        let options = RelayOptions {
            max_batch_bytes: 256 << 20,
            ..relay_options()
        };
        drain_with(&t, kafka_sink(&brokers).await, &topics, options).await;
        let arrived = arrivals(&brokers, &format!("{topics}.Invoice"), &ids);
        assert_eq!(arrived["hand"], [1, 2, 3], "{backend:?}");
        assert_eq!(arrived["other"], [1, 2], "{backend:?}");
        t.drop().await;
    }
}

/// An outbox whose pending rows an earlier PostgreSQL append left inverted
/// within their aggregates (a waiting writer drew the lower `seq`) drains
/// in order after the upgrade's migration, batch after batch.
#[tokio::test(flavor = "multi_thread")]
async fn rows_inverted_by_earlier_appends_drain_in_order_after_the_upgrade() {
    use sea_orm_migration::MigratorTrait;
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("upgraded");
    let t = TestDb::new(Backend::Postgres).await;
    outbox_migrations::Migrator::down(&t.db, Some(1))
        .await
        .expect("back to the previous version");
    // As the earlier append left them: 2 before 1, 5 before 3 and 4.
    let ids = insert_numbered(
        &t,
        &[
            ("inv-a", 2),
            ("inv-a", 1),
            ("inv-b", 1),
            ("inv-a", 5),
            ("inv-a", 3),
            ("inv-a", 4),
            ("inv-b", 2),
        ],
    )
    .await;
    // Published history is left alone.
    let published = uuid::Uuid::now_v7();
    t.db.execute_unprepared(&format!(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_seq, \
           published_at) VALUES ('{published}', 'Invoice', 'old', 'InvoiceIssued', '{{}}', 1, now())"
    ))
    .await
    .unwrap();
    outbox_migrations::Migrator::up(&t.db, None)
        .await
        .expect("upgrade");
    // Batches of two rows: every batch boundary falls inside an aggregate.
    let options = RelayOptions {
        batch_size: 2,
        ..relay_options()
    };
    drain_with(&t, kafka_sink(&brokers).await, &topics, options).await;
    let arrived = arrivals(&brokers, &format!("{topics}.Invoice"), &ids);
    assert_eq!(arrived["inv-a"], [1, 2, 3, 4, 5]);
    assert_eq!(arrived["inv-b"], [1, 2]);
    t.drop().await;
}

/// A `seq` sequence that hands each connection a block of values would let
/// a later event of an aggregate take a lower `seq`: the relay refuses to
/// start on it, naming the fix.
#[tokio::test(flavor = "multi_thread")]
async fn a_seq_sequence_that_caches_values_is_refused_at_start() {
    let t = TestDb::new(Backend::Postgres).await;
    t.db.execute_unprepared("ALTER TABLE outbox ALTER COLUMN seq SET CACHE 20")
        .await
        .unwrap();
    let error = match source::connect(&t.url, SourceOptions::default()).await {
        Err(error) => error,
        Ok(_) => panic!("a relay started on a sequence with CACHE 20"),
    };
    assert!(
        matches!(error, SourceError::SequenceCache { cache: 20 }),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .contains("ALTER TABLE outbox ALTER COLUMN seq SET CACHE 1"),
        "{error}"
    );
    t.db.execute_unprepared("ALTER TABLE outbox ALTER COLUMN seq SET CACHE 1")
        .await
        .unwrap();
    assert!(
        source::connect(&t.url, SourceOptions::default())
            .await
            .is_ok()
    );
    t.drop().await;
}

/// The relay dies after the broker acknowledged a batch but before the
/// mark committed: the rows stay pending and are published again. A
/// consumer deduplicating by the `id` header applies each event once.
#[tokio::test(flavor = "multi_thread")]
async fn a_crash_between_ack_and_mark_duplicates_but_loses_nothing() {
    let brokers = kafka::brokers();
    let topics = kafka::topic_prefix("ackmark");
    let t = TestDb::new(Backend::Postgres).await;
    let ids = seed(&t.db, 5, 10, 10).await;
    let sink = kafka_sink(&brokers).await;

    // Claim and publish one batch, then "crash": the claim is dropped
    // unsettled, so its transaction rolls back.
    let source = source::connect(&t.url, SourceOptions::default())
        .await
        .unwrap();
    let claim = source.claim(20, &[]).await.unwrap();
    let template = TopicTemplate::new(format!("{topics}.{{aggregatetype}}"));
    let messages: Vec<_> = claim
        .records()
        .iter()
        .map(|r| template.message(r))
        .collect();
    let outcomes = sink.publish(&messages).await;
    assert!(
        outcomes.iter().all(Result::is_ok),
        "the broker acknowledged the batch"
    );
    drop(claim);
    assert_eq!(t.count("outbox WHERE published_at IS NULL").await, 50);

    drain(&t, sink, &topics).await;
    let consumed = kafka::consume(
        &brokers,
        &format!("{topics}.Invoice"),
        70,
        Duration::from_secs(20),
        Duration::from_millis(500),
    );
    let report = check_stream(&consumed, &ids);
    assert_eq!(
        report.duplicates, 20,
        "the acknowledged batch arrived twice"
    );

    let mut applied = HashSet::new();
    let effects = consumed
        .iter()
        .filter(|message| applied.insert(message.header("id").unwrap().to_owned()))
        .count();
    assert_eq!(
        effects, 50,
        "deduplicating by event id applies each event once"
    );
    t.drop().await;
}

/// Produce requests fail mid-stream on librdkafka's mock cluster, with
/// retriable and non-retriable errors: every event arrives, and no event
/// of an aggregate overtakes an earlier one.
#[tokio::test(flavor = "multi_thread")]
async fn injected_broker_errors_mid_batch_keep_per_aggregate_order() {
    let mock = MockCluster::new(1).expect("mock cluster");
    let brokers = mock.bootstrap_servers();
    let topics = kafka::topic_prefix("mock");
    let topic = format!("{topics}.Invoice");
    mock.create_topic(&topic, 3, 1).expect("mock topic");
    let t = TestDb::new(Backend::Postgres).await;
    let ids = seed(&t.db, 20, 50, 10).await;

    let sink = kafka_sink(&brokers).await;
    let source = source::connect(&t.url, SourceOptions::default())
        .await
        .unwrap();
    let relay = Relay::new(
        Arc::from(source),
        sink,
        TopicTemplate::new(format!("{topics}.{{aggregatetype}}")),
        RelayOptions {
            batch_size: 50,
            ..relay_options()
        },
    );
    let run = tokio::spawn(async move {
        let (_trigger, shutdown) = Shutdown::manual();
        relay.run(shutdown).await
    });

    use RDKafkaRespErr::*;
    let bursts: [&[RDKafkaRespErr]; 4] = [
        &[RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; 3],
        &[
            RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
        ],
        &[RD_KAFKA_RESP_ERR_INVALID_RECORD],
        &[RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND; 2],
    ];
    for burst in bursts {
        mock.request_errors(RDKafkaApiKey::Produce, burst);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    run.await.unwrap().expect("relay run");
    assert_eq!(t.count("outbox WHERE published_at IS NULL").await, 0);

    let messages = kafka::consume(
        &brokers,
        &topic,
        ids.len(),
        Duration::from_secs(30),
        Duration::from_millis(500),
    );
    let report = check_stream(&messages, &ids);
    eprintln!(
        "{} messages for {} events ({} duplicates)",
        messages.len(),
        ids.len(),
        report.duplicates
    );
    t.drop().await;
}

/// A sink that refuses one event a few times (as a broker refusing a
/// produce request would: the aggregate's later messages of the batch are
/// held back, not sent) and passes everything else to the real broker.
struct RefuseEvent {
    inner: Arc<dyn Sink>,
    id: String,
    refusals_left: AtomicUsize,
}

#[async_trait]
impl Sink for RefuseEvent {
    async fn publish(&self, messages: &[Message<'_>]) -> Vec<Result<(), SendError>> {
        let mut outcomes: Vec<Option<Result<(), SendError>>> = vec![None; messages.len()];
        let mut refused_key = None;
        let mut forwarded = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            let id = message.headers.iter().find(|(name, _)| *name == HEADER_ID);
            if refused_key.as_ref() == Some(&message.key) {
                outcomes[index] = Some(Err(SendError::held_back()));
            } else if id.is_some_and(|(_, id)| *id == self.id)
                && self
                    .refusals_left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                        left.checked_sub(1)
                    })
                    .is_ok()
            {
                refused_key = Some(message.key.clone());
                outcomes[index] = Some(Err(SendError::transient("injected refusal")));
            } else {
                forwarded.push(index);
            }
        }
        let sent: Vec<Message> = forwarded.iter().map(|&i| messages[i].clone()).collect();
        for (index, outcome) in forwarded.into_iter().zip(self.inner.publish(&sent).await) {
            outcomes[index] = Some(outcome);
        }
        outcomes.into_iter().map(Option::unwrap).collect()
    }

    async fn flush(&self, timeout: Duration) {
        self.inner.flush(timeout).await;
    }
}

/// The PostgreSQL source, counting the batches claimed ahead.
struct CountClaimsAhead {
    inner: Box<dyn Source>,
    ahead: AtomicUsize,
}

#[async_trait]
impl Source for CountClaimsAhead {
    async fn check_table(&self) -> Result<(), SourceError> {
        self.inner.check_table().await
    }

    async fn claim(
        &self,
        limit: usize,
        excluded: &[AggregateKey],
    ) -> Result<Box<dyn Claim>, SourceError> {
        self.inner.claim(limit, excluded).await
    }

    async fn claim_ahead(
        &self,
        limit: usize,
        excluded: &[AggregateKey],
        in_flight: &InFlight,
    ) -> Result<Option<Box<dyn Claim>>, SourceError> {
        let claim = self.inner.claim_ahead(limit, excluded, in_flight).await?;
        if claim
            .as_ref()
            .is_some_and(|claim| !claim.records().is_empty())
        {
            self.ahead.fetch_add(1, Ordering::SeqCst);
        }
        Ok(claim)
    }

    async fn wait_for_rows(&self, timeout: Duration) {
        self.inner.wait_for_rows(timeout).await;
    }

    async fn delete_published(&self, older_than: Duration, limit: u64) -> Result<u64, SourceError> {
        self.inner.delete_published(older_than, limit).await
    }

    async fn backlog(&self) -> Result<Backlog, SourceError> {
        self.inner.backlog().await
    }

    async fn status(&self) -> Result<Status, SourceError> {
        self.inner.status().await
    }

    async fn redrive(
        &self,
        ids: &[String],
        aggregate_type: Option<&str>,
        limit: u64,
    ) -> Result<u64, SourceError> {
        self.inner.redrive(ids, aggregate_type, limit).await
    }
}

/// While a full batch is at the broker the relay claims the next one, of
/// other aggregates; when an event of the batch at the broker is refused,
/// nothing of its aggregate goes before it, and the batch claimed ahead is
/// released and claimed again.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_claimed_ahead_never_overtakes_a_refused_event() {
    for sharded in [false, true] {
        let brokers = kafka::brokers();
        let topics = kafka::topic_prefix("ahead");
        let t = TestDb::new(Backend::Postgres).await;
        // 8 aggregates, 5 events each in turn: a batch of 20 holds 5
        // consecutive events of 4 aggregates, and the batch claimed ahead
        // those of the 4 others.
        let ids = seed(&t.db, 8, 30, 5).await;
        // agg-5's 8th event, in a batch with claims ahead around it.
        let refused = ids[3 * 20 + 5 + 2].clone();

        let options = SourceOptions {
            shards: sharded.then(|| ShardConfig {
                count: 4,
                lease: Duration::from_secs(10),
                instance: "ahead-test".into(),
                batch_timeout: Duration::from_secs(20),
            }),
            ..SourceOptions::default()
        };
        let source = Arc::new(CountClaimsAhead {
            inner: source::connect(&t.url, options).await.unwrap(),
            ahead: AtomicUsize::new(0),
        });
        let sink = Arc::new(RefuseEvent {
            inner: kafka_sink(&brokers).await,
            id: refused,
            refusals_left: AtomicUsize::new(2),
        });
        let relay = Relay::new(
            source.clone(),
            sink,
            TopicTemplate::new(format!("{topics}.{{aggregatetype}}")),
            RelayOptions {
                batch_size: 20,
                ..relay_options()
            },
        );
        let (_trigger, shutdown) = Shutdown::manual();
        relay.run(shutdown).await.expect("relay run");
        source.inner.close().await;
        assert_eq!(t.count("outbox WHERE published_at IS NULL").await, 0);
        assert!(
            source.ahead.load(Ordering::SeqCst) >= 5,
            "the relay claimed {} batches ahead (sharded: {sharded})",
            source.ahead.load(Ordering::SeqCst)
        );

        let messages = kafka::consume(
            &brokers,
            &format!("{topics}.Invoice"),
            ids.len(),
            Duration::from_secs(30),
            Duration::from_millis(300),
        );
        let report = check_stream(&messages, &ids);
        assert_eq!(report.distinct, ids.len());
        t.drop().await;
    }
}

#[test]
fn settlement_is_empty_by_default() {
    assert!(Settlement::default().is_empty());
}

/// A Kafka sink asked to send only until a moment already past (what CDC
/// mode asks of a process paused after it last confirmed its slot) hands
/// nothing to the broker: every message fails as transient, and the same
/// messages sent again arrive once each, in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_kafka_sink_hands_nothing_over_past_its_send_window() {
    let brokers = kafka::brokers();
    let topic = format!("{}.Window", kafka::topic_prefix("window"));
    let sink = kafka_sink(&brokers).await;
    let messages: Vec<Message> = (0..5)
        .map(|n| Message {
            topic: topic.as_str().into(),
            key: "agg-1".into(),
            key_column: None,
            aggregate_type: "Window".into(),
            headers: vec![(HEADER_ID, format!("event-{n}").into())],
            payload: Some(format!("{{\"n\":{n}}}").into()),
            cloudevent: None,
            extra_headers: Vec::new(),
            partition: None,
            timestamp: None,
        })
        .collect();
    let past = std::time::Instant::now() - Duration::from_millis(1);
    let outcomes = sink.publish_until(&messages, past).await;
    assert!(
        outcomes.iter().all(|outcome| outcome
            .as_ref()
            .is_err_and(|error| error.kind == outbox_relay::sink::FailureKind::Transient)),
        "{outcomes:?}"
    );
    let later = std::time::Instant::now() + Duration::from_secs(30);
    let outcomes = sink.publish_until(&messages, later).await;
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");

    let consumed = kafka::consume(
        &brokers,
        &topic,
        5,
        Duration::from_secs(30),
        Duration::from_secs(2),
    );
    let ids: Vec<&str> = consumed
        .iter()
        .map(|message| message.header(HEADER_ID).expect("an id"))
        .collect();
    assert_eq!(ids, ["event-0", "event-1", "event-2", "event-3", "event-4"]);
}
