//! `bench-brokers`: the relay's three brokers side by side, in one run on
//! one machine: Kafka (idempotent, `acks=all`), RabbitMQ (persistent,
//! `mandatory`, publisher confirms) and NATS JetStream (`Nats-Msg-Id`,
//! PubAcks), each with the relay's default window. For each:
//!
//! - the broker's ceiling: a plain client of that broker publishing the
//!   backlog's messages, awaiting acknowledgements every `--client-batch`;
//! - the relay draining the same backlog, and its ratio to the lower of the
//!   broker's ceiling and the database's (the relay publishing to a sink
//!   that acknowledges at once, measured once at the start);
//! - commit-to-ack latency: writers commit events at `--rate` per second
//!   while the relay runs; p50 and p99.
//!
//! PostgreSQL from `OUTBOX_TEST_POSTGRES_URL` (a schema of its own, dropped
//! at the end); Kafka from `KAFKA_BROKERS` (`scripts/kafka.sh start`),
//! RabbitMQ from `OUTBOX_TEST_AMQP_URL`, NATS from `OUTBOX_TEST_NATS_URL`,
//! each with the tests' defaults. Topics, the exchange and the streams are
//! the run's own.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use lapin::types::FieldTable;
use outbox_bench::brokers::{
    AmqpPublish, Backlog, BacklogOptions, Latency, LatencyOptions, Measured, PlainRow,
    kafka_client, nats_client, rabbitmq_client,
};
use outbox_bench::progress;
use outbox_bench::recording::NoBrokerSink;
use outbox_bench::report::{self, Machine, Table};
use outbox_relay::sink::Sink;
use outbox_relay::sink::kafka::{KafkaOptions, KafkaSink};
use outbox_relay::sink::nats::subject::SubjectTemplate;
use outbox_relay::sink::nats::{NatsOptions, NatsSink};
use outbox_relay::sink::rabbitmq::{RabbitMqOptions, RabbitMqSink};
use outbox_tests::nats::{Scope, Witness, nats_url};
use outbox_tests::rabbitmq::{Broker, amqp_url, unique};
use outbox_tests::{Backend, TestDb};
use serde::Serialize;

/// The brokers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Kind {
    /// A Kafka-API broker.
    Kafka,
    /// RabbitMQ.
    Rabbitmq,
    /// NATS JetStream.
    Nats,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Kafka => "Kafka",
            Kind::Rabbitmq => "RabbitMQ",
            Kind::Nats => "NATS JetStream",
        }
    }
}

/// Kafka, RabbitMQ and NATS side by side: drain rate and commit-to-ack.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "bench-brokers", version)]
struct Options {
    /// The brokers, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Kind::Kafka, Kind::Rabbitmq, Kind::Nats])]
    brokers: Vec<Kind>,
    #[command(flatten)]
    backlog: BacklogOptions,
    #[command(flatten)]
    latency: LatencyOptions,
    /// Print the results as JSON on standard output too.
    #[arg(long)]
    json: bool,
}

/// One broker's measurements.
#[derive(Debug, Serialize)]
struct BrokerResult {
    broker: Kind,
    client: Measured,
    relay: Measured,
    latency: Option<Latency>,
}

#[derive(Debug, Serialize)]
struct Results {
    machine: Machine,
    options: Options,
    database_ceiling: Measured,
    brokers: Vec<BrokerResult>,
}

impl Results {
    fn render(&self) -> String {
        let database = self.database_ceiling.events_per_second;
        let mut table = Table::new([
            "broker",
            "plain client events/s",
            "relay drain events/s",
            "relay vs lower ceiling",
            "commit-to-ack p50 ms",
            "p99 ms",
        ]);
        for result in &self.brokers {
            let ceiling = result.client.events_per_second.min(database);
            let (p50, p99) = result
                .latency
                .as_ref()
                .map_or(("-".into(), "-".into()), |l| {
                    (
                        report::ms(l.commit_to_ack.p50_ms),
                        report::ms(l.commit_to_ack.p99_ms),
                    )
                });
            table.row([
                result.broker.name().to_owned(),
                report::rate(result.client.events_per_second),
                report::rate(result.relay.events_per_second),
                report::ratio(result.relay.events_per_second / ceiling.max(1e-9)),
                p50,
                p99,
            ]);
        }
        let mut out = format!(
            "{}\n{} events over {} aggregates, relay batch {}, client batch {}; database ceiling \
             (no broker) {} events/s\n\n{table}",
            self.machine,
            self.options.backlog.events,
            self.options.backlog.aggregates,
            self.options.backlog.batch_size,
            self.options.backlog.client_batch,
            report::rate(database),
        );
        for result in &self.brokers {
            if let Some(latency) = &result.latency {
                out.push_str(&format!(
                    "\n{}",
                    latency.line(&format!("{} commit-to-ack", result.broker.name()))
                ));
            }
        }
        out.push('\n');
        out
    }
}

/// What each broker's part does, around the relay and the plain client.
struct Bench {
    options: Options,
    backlog: Backlog,
}

impl Bench {
    /// The relay's drain through `sink()` and, with a rate, its latency
    /// through another `sink()`.
    async fn relay(
        &self,
        kind: Kind,
        sink: impl AsyncFn() -> anyhow::Result<Arc<dyn Sink>>,
    ) -> anyhow::Result<(Measured, Option<Latency>)> {
        let drain = self
            .backlog
            .drain(format!("{}: relay", kind.name()), sink().await?)
            .await?;
        let latency = if self.options.latency.rate > 0 {
            Some(
                self.backlog
                    .latency(sink().await?, &self.options.latency)
                    .await?,
            )
        } else {
            None
        };
        Ok((drain, latency))
    }

    async fn kafka(&self) -> anyhow::Result<BrokerResult> {
        let brokers = outbox_tests::kafka::brokers();
        let topic = self.backlog.topic();
        outbox_tests::kafka::create_topic(&brokers, &topic, 1).await;
        let rows = self.backlog.rows().await?;
        let client = kafka_client(
            "Kafka: plain client",
            &brokers,
            &topic,
            &rows,
            self.options.backlog.client_batch,
        )
        .await?;
        let (relay, latency) = self
            .relay(Kind::Kafka, async || {
                let sink = KafkaSink::connect(KafkaOptions {
                    brokers: brokers.clone(),
                    ..KafkaOptions::default()
                })
                .await
                .context("the Kafka-API broker (start it with `scripts/kafka.sh start`)")?;
                Ok(Arc::new(sink) as Arc<dyn Sink>)
            })
            .await?;
        Ok(BrokerResult {
            broker: Kind::Kafka,
            client,
            relay,
            latency,
        })
    }

    async fn rabbitmq(&self) -> anyhow::Result<BrokerResult> {
        let broker = Broker::connect().await;
        let exchange = unique("bench");
        let queue = unique("bench-q");
        // One durable queue bound to everything, emptied between parts.
        broker
            .bind_queue(&exchange, &queue, "#", FieldTable::default())
            .await;
        let outcome = self.rabbitmq_parts(&broker, &exchange, &queue).await;
        broker.clean_up(&exchange, &[&queue]).await;
        outcome
    }

    async fn rabbitmq_parts(
        &self,
        broker: &Broker,
        exchange: &str,
        queue: &str,
    ) -> anyhow::Result<BrokerResult> {
        let rows = self.backlog.rows().await?;
        let publish = AmqpPublish {
            mandatory: true,
            persistent: true,
            batch: self.options.backlog.client_batch,
        };
        let client = rabbitmq_client(
            "RabbitMQ: plain client",
            &amqp_url(),
            exchange,
            &self.backlog.topic(),
            &rows,
            publish,
        )
        .await?;
        broker.purge_queue(queue).await;
        let (relay, latency) = self
            .relay(Kind::Rabbitmq, async || {
                broker.purge_queue(queue).await;
                let sink = RabbitMqSink::connect(RabbitMqOptions {
                    url: amqp_url(),
                    exchange: exchange.to_owned(),
                    ..RabbitMqOptions::default()
                })
                .await?;
                Ok(Arc::new(sink) as Arc<dyn Sink>)
            })
            .await?;
        Ok(BrokerResult {
            broker: Kind::Rabbitmq,
            client,
            relay,
            latency,
        })
    }

    async fn nats(&self) -> anyhow::Result<BrokerResult> {
        let witness = Witness::connect().await;
        let mut scopes = Vec::new();
        let outcome = self.nats_parts(&witness, &mut scopes).await;
        for scope in &scopes {
            witness.delete_stream(&scope.stream).await;
        }
        outcome
    }

    async fn nats_parts(
        &self,
        witness: &Witness,
        scopes: &mut Vec<Scope>,
    ) -> anyhow::Result<BrokerResult> {
        let rows: Vec<PlainRow> = self.backlog.rows().await?;
        let scope = Scope::new("bench_client");
        scopes.push(scope.clone());
        witness
            .create_stream(&scope.stream, &[&scope.capture()], Duration::from_secs(120))
            .await;
        let client = nats_client(
            "NATS: plain client",
            witness.jetstream(),
            &scope,
            &rows,
            self.options.backlog.client_batch,
        )
        .await?;
        // Each sink gets a stream of its own, so a part stores only its
        // own messages.
        let streams = std::sync::Mutex::new(Vec::new());
        let measured = self
            .relay(Kind::Nats, async || {
                let scope = Scope::new("bench_relay");
                streams.lock().expect("streams").push(scope.clone());
                let sink = NatsSink::connect(NatsOptions {
                    url: nats_url(),
                    stream: scope.stream.clone(),
                    subject_template: SubjectTemplate::parse(&scope.template())
                        .map_err(anyhow::Error::msg)?,
                    ..NatsOptions::default()
                })
                .await?;
                Ok(Arc::new(sink) as Arc<dyn Sink>)
            })
            .await;
        scopes.extend(streams.into_inner().expect("streams"));
        let (relay, latency) = measured?;
        Ok(BrokerResult {
            broker: Kind::Nats,
            client,
            relay,
            latency,
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    report::elapsed_seconds();
    let options = Options::parse();
    let schema = TestDb::new(Backend::Postgres).await;
    let machine = Machine::describe(&schema.db).await?;
    progress!("{machine}");
    let outcome = run(&options, &schema, machine).await;
    schema.drop().await;
    let results = outcome?;
    report::emit(options.json, &results.render(), &results)
}

async fn run(options: &Options, schema: &TestDb, machine: Machine) -> anyhow::Result<Results> {
    let backlog = Backlog::connect(schema, options.backlog).await?;
    let bench = Bench {
        options: options.clone(),
        backlog,
    };
    let database_ceiling = bench
        .backlog
        .drain(
            "database ceiling (no broker)".into(),
            Arc::new(NoBrokerSink),
        )
        .await?;
    let mut brokers = Vec::new();
    for &kind in &options.brokers {
        let result = match kind {
            Kind::Kafka => bench.kafka().await,
            Kind::Rabbitmq => bench.rabbitmq().await,
            Kind::Nats => bench.nats().await,
        };
        brokers.push(result.with_context(|| format!("measuring {}", kind.name()))?);
    }
    bench.backlog.close().await;
    Ok(Results {
        machine,
        options: options.clone(),
        database_ceiling,
        brokers,
    })
}
