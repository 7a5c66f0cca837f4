//! The RabbitMQ side: a durable queue bound to the relay's exchange for the
//! order events, consumed with manual acknowledgements. A delivery is acked
//! only after its transaction committed; a crash before that leaves it
//! unacked, RabbitMQ delivers it again, and the inbox finds it applied or
//! not, as the transaction left it.

use std::future::Future;

use anyhow::Context;
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties};
use outbox_core::IncomingMessage;

use crate::consumer::{OrderHandler, Stats};

/// Where the consumer reads.
#[derive(Debug, Clone)]
pub struct RabbitMqSettings {
    /// `amqp://user:password@host:port/vhost`.
    pub url: String,
    /// The relay's exchange (`--amqp-exchange` of the relay).
    pub exchange: String,
    /// The consumer's own durable queue, declared if missing.
    pub queue: String,
    /// The routing key the queue is bound for: the topic of the order
    /// events, `outbox.event.Order`.
    pub routing_key: String,
}

/// Unacked deliveries the broker sends ahead; they are handled one by one,
/// in order.
const PREFETCH: u16 = 100;

/// Connects, declares the queue and binds it to the exchange (which the
/// relay declares; declaring it here too lets the consumer start first).
pub async fn channel(settings: &RabbitMqSettings) -> anyhow::Result<(Connection, Channel)> {
    let connection = Connection::connect(&settings.url, ConnectionProperties::default())
        .await
        .context("cannot connect to RabbitMQ (--amqp-url)")?;
    let channel = connection.create_channel().await?;
    channel
        .exchange_declare(
            settings.exchange.as_str().into(),
            lapin::ExchangeKind::Topic,
            lapin::options::ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("cannot declare the exchange {:?}", settings.exchange))?;
    channel
        .queue_declare(
            settings.queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("cannot declare the queue {:?}", settings.queue))?;
    channel
        .queue_bind(
            settings.queue.as_str().into(),
            settings.exchange.as_str().into(),
            settings.routing_key.as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .context("cannot bind the queue")?;
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await?;
    Ok((connection, channel))
}

/// The delivery as the decoder and the inbox read it: the routing key as
/// topic, the text headers (the relay writes every header as a long
/// string), the body as payload. The aggregate id is the `aggregateId`
/// header.
pub fn incoming(delivery: &Delivery) -> IncomingMessage<'_> {
    let headers = delivery
        .properties
        .headers()
        .as_ref()
        .map(|table| table.inner().iter())
        .into_iter()
        .flatten()
        .filter_map(|(name, value)| match value {
            AMQPValue::LongString(text) => Some((name.as_str(), text.as_bytes())),
            _ => None,
        });
    IncomingMessage::new(
        delivery.routing_key.as_str(),
        Some(delivery.data.as_slice()),
    )
    .headers(headers)
}

/// Consumes the queue until `shutdown` completes (after the message in
/// hand) or a message cannot be handled; that message is returned to the
/// queue unacknowledged.
pub async fn run(
    handler: &OrderHandler,
    channel: &Channel,
    queue: &str,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<Stats> {
    let mut deliveries = channel
        .basic_consume(
            queue.into(),
            "order-consumer".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("cannot consume the queue {queue:?}"))?;
    let mut stats = Stats::default();
    tokio::pin!(shutdown);
    loop {
        let delivery = tokio::select! {
            () = &mut shutdown => return Ok(stats),
            delivery = deliveries.next() => delivery,
        };
        let delivery = match delivery {
            Some(delivery) => delivery.context("the RabbitMQ connection failed")?,
            None => anyhow::bail!("RabbitMQ closed the consumer of {queue:?}"),
        };
        let position = format!("{queue}#{}", delivery.delivery_tag);
        match handler.handle(&incoming(&delivery), &position).await {
            Ok(handled) => {
                stats.count(&handled);
                delivery.ack(BasicAckOptions::default()).await?;
            }
            Err(error) => {
                let requeue = BasicNackOptions {
                    requeue: true,
                    ..Default::default()
                };
                let _ = delivery.nack(requeue).await;
                return Err(error);
            }
        }
    }
}
