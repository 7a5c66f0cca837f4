//! The NATS JetStream side: a durable pull consumer of the relay's stream,
//! filtered to the order events, acknowledging each message explicitly
//! once its transaction committed. A message not acknowledged within the
//! consumer's ack wait is delivered again, and the inbox skips it if its
//! effect was applied.

use std::future::Future;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, consumer::pull};
use futures::StreamExt;
use outbox_core::IncomingMessage;

use crate::consumer::{OrderHandler, Stats};

/// Where the consumer reads.
#[derive(Debug, Clone)]
pub struct NatsSettings {
    /// `nats://host:port`.
    pub url: String,
    /// The relay's stream (`--nats-stream` of the relay).
    pub stream: String,
    /// The durable consumer's name; created if missing.
    pub durable: String,
    /// The order events' subjects without the aggregate id token,
    /// `outbox.event.Order`: the consumer reads `<topic>.>`.
    pub topic: String,
}

/// A durable pull consumer of the order events.
pub async fn consumer(settings: &NatsSettings) -> anyhow::Result<pull::Stream> {
    let client = async_nats::connect(&settings.url)
        .await
        .context("cannot connect to NATS (--nats-url)")?;
    let jetstream = jetstream::new(client);
    let stream = jetstream
        .get_stream(&settings.stream)
        .await
        .with_context(|| format!("no JetStream stream {:?}", settings.stream))?;
    let consumer = stream
        .get_or_create_consumer(
            &settings.durable,
            pull::Config {
                durable_name: Some(settings.durable.clone()),
                filter_subject: format!("{}.>", settings.topic),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                ..Default::default()
            },
        )
        .await
        .with_context(|| format!("cannot create the consumer {:?}", settings.durable))?;
    consumer
        .messages()
        .await
        .context("cannot pull messages from JetStream")
}

/// The message as the decoder and the inbox read it: the subject without
/// its last token (the encoded aggregate id) as topic, so that it matches
/// the Kafka topic and the RabbitMQ routing key, every header value, the
/// body as payload. The aggregate id is the `aggregateId` header. A
/// JetStream message dereferences to this one.
pub fn incoming(message: &async_nats::Message) -> IncomingMessage<'_> {
    let subject = message.subject.as_str();
    let topic = subject.rsplit_once('.').map_or(subject, |(topic, _)| topic);
    let headers = message
        .headers
        .iter()
        .flat_map(|map| map.iter())
        .flat_map(|(name, values)| values.iter().map(move |value| (name, value)));
    IncomingMessage::new(topic, Some(&message.payload[..])).headers(headers)
}

/// Consumes until `shutdown` completes (after the message in hand) or a
/// message cannot be handled; that message is left unacknowledged, for
/// JetStream to deliver again.
pub async fn run(
    handler: &OrderHandler,
    mut messages: pull::Stream,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<Stats> {
    let mut stats = Stats::default();
    tokio::pin!(shutdown);
    loop {
        let message = tokio::select! {
            () = &mut shutdown => return Ok(stats),
            message = messages.next() => message,
        };
        let message = match message {
            Some(message) => message.map_err(|error| anyhow::anyhow!("JetStream: {error}"))?,
            None => anyhow::bail!("JetStream ended the consumer's messages"),
        };
        let position = match message.info() {
            Ok(info) => format!("{}@{}", info.stream, info.stream_sequence),
            Err(_) => message.subject.to_string(),
        };
        let handled = handler.handle(&incoming(&message), &position).await?;
        stats.count(&handled);
        message
            .ack()
            .await
            .map_err(|error| anyhow::anyhow!("cannot acknowledge {position}: {error}"))?;
    }
}
