//! Publishes to RabbitMQ (AMQP 0-9-1) through lapin, with publisher
//! confirms: a message counts as published only once the broker acked it.
//!
//! At start the sink declares a durable topic exchange (`outbox` by
//! default; declaring is idempotent, and an exchange of another type or
//! durability stops the relay with one line). Each message goes to that
//! exchange with the topic as routing key (`outbox.event.<aggregatetype>`),
//! persistent (delivery mode 2), `content_type` application/json,
//! `message_id` the event id, `type` the event type, `timestamp` the time
//! of publishing, and as headers the Kafka headers plus `aggregateType` and
//! `aggregateId`. The body is the payload's bytes as stored.
//!
//! Confirms: lapin numbers each publish of a confirm-mode channel (its
//! delivery tag) and resolves that publish's [`lapin::PublisherConfirm`]
//! when an ack or nack names its tag, a `multiple` one included, whatever
//! order they come in. A batch is published whole over one channel with at
//! most `max_unconfirmed` messages awaiting their confirm, never one round
//! trip per message. A nack, a closed channel or connection, or no confirm
//! within the send timeout fails the message as transient: its row stays
//! pending and is retried with backoff. After a closed channel or a
//! timeout, the connection is closed and the next batch opens a new one.
//!
//! Unroutable messages: messages are published with `mandatory`, so a
//! message no queue is bound for comes back (`basic.return`) before its
//! ack. lapin hands a return to whichever confirm of a `multiple` ack it
//! completes first, so returns are matched to messages by their
//! `message_id` (the event id, unique within a batch), not by the confirm
//! that carried them. A returned message fails for good ("unroutable: no
//! queue bound"): retried up to the attempt limit, then dead-lettered.
//! `mandatory` can be turned off, and then RabbitMQ acks and drops a
//! message no queue is bound for.
//!
//! Per-aggregate order: RabbitMQ keeps the order of one channel's messages
//! on each queue. Once a message of an aggregate fails, the aggregate's
//! later messages of the batch that are not sent yet are held back. A nack
//! (a queue with `x-overflow=reject-publish` that is full, or an internal
//! error of a queue) can come after later messages of the aggregate were
//! already sent; those stay pending behind the failed one (the relay marks
//! nothing of an aggregate after a failure) and are sent again after it,
//! so a consumer sees them twice.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use futures::StreamExt;
use futures::future::{Join, Ready, join, ready};
use futures::stream::FuturesUnordered;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties,
    DefaultConnectionBuilder, ExchangeKind, PublisherConfirm,
};

use super::{SendError, Sink};
use outbox_contract::headers;

use crate::cloudevents;
use crate::message::{Message, Wire};
use crate::tls::{self, CertificateFiles, OptionNames};

/// The default AMQP URL: a local broker, user `guest`, vhost `/`.
pub const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// The default exchange.
pub const DEFAULT_EXCHANGE: &str = "outbox";
/// The default bound on messages awaiting their confirm.
pub const DEFAULT_MAX_UNCONFIRMED: usize = 1000;
/// The reason a returned message fails with.
pub const UNROUTABLE: &str = "unroutable: no queue bound";

/// Settings of the RabbitMQ sink.
#[derive(Debug, Clone)]
pub struct RabbitMqOptions {
    /// `amqp://user:password@host:port/vhost` (or `amqps://`).
    pub url: String,
    /// The topic exchange messages are published to.
    pub exchange: String,
    /// Most messages awaiting their confirm at once.
    pub max_unconfirmed: usize,
    /// Publish with `mandatory`, failing messages no queue is bound for.
    pub mandatory: bool,
    /// How long to wait for a batch's confirms (and for a connection)
    /// before failing the unconfirmed messages and reconnecting.
    pub send_timeout: Duration,
}

impl Default for RabbitMqOptions {
    fn default() -> Self {
        Self {
            url: DEFAULT_URL.into(),
            exchange: DEFAULT_EXCHANGE.into(),
            max_unconfirmed: DEFAULT_MAX_UNCONFIRMED,
            mandatory: true,
            send_timeout: Duration::from_secs(30),
        }
    }
}

/// A failure to set up the RabbitMQ sink.
#[derive(Debug, thiserror::Error)]
pub enum RabbitMqSetupError {
    /// No connection could be opened (unreachable, refused credentials).
    #[error("cannot connect to RabbitMQ at {endpoint}: {reason}")]
    Unreachable {
        /// `scheme://host:port/vhost`, without credentials.
        endpoint: String,
        /// What failed.
        reason: String,
    },
    /// The exchange cannot be declared as a durable topic exchange.
    #[error(
        "cannot declare the durable topic exchange {exchange:?} at {endpoint}: {reason}; \
         if it exists with another type or durability, delete it or choose another with --amqp-exchange"
    )]
    Exchange {
        /// The exchange.
        exchange: String,
        /// `scheme://host:port/vhost`, without credentials.
        endpoint: String,
        /// The broker's answer.
        reason: String,
    },
}

/// Checks an AMQP URL without connecting; the error never repeats the URL,
/// which may hold a password.
///
/// ```
/// use outbox_relay::sink::rabbitmq::check_url;
///
/// assert!(check_url("amqp://guest:guest@127.0.0.1:5672/%2f").is_ok());
/// assert!(check_url("http://127.0.0.1:5672").is_err());
/// ```
pub fn check_url(url: &str) -> Result<(), String> {
    let parsed = url::Url::parse(url).map_err(|error| format!("not a URL ({error})"))?;
    match parsed.scheme() {
        "amqp" | "amqps" => {}
        other => {
            return Err(format!(
                "the scheme is {other}://; use amqp://user:password@host:5672/vhost or amqps://"
            ));
        }
    }
    AMQPUri::from_str(url).map(|_| ()).map_err(|_| {
        "not a valid AMQP URL (check the port, the vhost and the query options)".into()
    })
}

/// `scheme://host:port/vhost` of a URL [`check_url`] accepted, for messages.
fn endpoint(url: &str) -> String {
    match AMQPUri::from_str(url) {
        Ok(uri) => {
            let scheme = match uri.scheme {
                AMQPScheme::AMQP => "amqp",
                AMQPScheme::AMQPS => "amqps",
            };
            format!(
                "{scheme}://{}:{}/{}",
                uri.authority.host,
                uri.authority.port,
                url::form_urlencoded::byte_serialize(uri.vhost.as_bytes()).collect::<String>()
            )
        }
        Err(_) => "the configured URL".into(),
    }
}

/// An open connection and its confirm-mode channel.
struct Link {
    connection: Connection,
    channel: Channel,
}

impl Link {
    fn usable(&self) -> bool {
        self.connection.status().connected() && self.channel.status().connected()
    }

    /// Closes the connection, so nothing more of it reaches the broker
    /// after what the next connection sends.
    async fn close(self, why: &str) {
        let closing = self.connection.close(
            320,
            ShortString::try_new(why.chars().take(200).collect::<String>()).unwrap_or_default(),
        );
        let _ = tokio::time::timeout(Duration::from_secs(5), closing).await;
    }
}

/// Publishes messages to a RabbitMQ exchange with publisher confirms.
pub struct RabbitMqSink {
    options: RabbitMqOptions,
    endpoint: String,
    link: tokio::sync::Mutex<Option<Link>>,
    up: AtomicBool,
}

impl RabbitMqSink {
    /// Connects, enables publisher confirms and declares the exchange.
    pub async fn connect(options: RabbitMqOptions) -> Result<Self, RabbitMqSetupError> {
        let endpoint = endpoint(&options.url);
        let link = open(&options, &endpoint).await?;
        tracing::info!(endpoint = %endpoint, exchange = %options.exchange, "connected to RabbitMQ");
        Ok(Self {
            options,
            endpoint,
            link: tokio::sync::Mutex::new(Some(link)),
            up: AtomicBool::new(true),
        })
    }

    /// The open link, opening a new one when there is none or it broke.
    async fn ensure_link<'a>(&self, slot: &'a mut Option<Link>) -> Result<&'a Link, SendError> {
        if let Some(link) = slot.take_if(|link| !link.usable()) {
            link.close("replacing a broken connection").await;
        }
        if slot.is_none() {
            match open(&self.options, &self.endpoint).await {
                Ok(link) => {
                    tracing::info!(endpoint = %self.endpoint, "reconnected to RabbitMQ");
                    *slot = Some(link);
                }
                Err(error) => {
                    self.up.store(false, Ordering::Relaxed);
                    return Err(SendError::transient(error.to_string()));
                }
            }
        }
        self.up.store(true, Ordering::Relaxed);
        Ok(slot.as_ref().expect("a link was just opened"))
    }
}

/// How the AMQP URL's query parameters that name certificate files are
/// called (RabbitMQ's own URI parameters).
const TLS_OPTIONS: OptionNames = OptionNames {
    root: "cacertfile in the URL",
    client: "certfile and keyfile in the URL",
    name_mismatch: "connect by a name the certificate lists",
};

/// The TLS settings of an `amqps://` connection: the URL's `cacertfile`
/// added to the trusted roots, its `certfile` and `keyfile` as the client's
/// identity.
fn tls_config(files: &CertificateFiles) -> Result<OwnedTLSConfig, String> {
    let read = |what: &str, path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|error| format!("cannot read {what} {}: {error}", path.display()))
    };
    let cert_chain = match &files.root {
        Some(path) => Some(
            String::from_utf8(read("the root certificates", path)?)
                .map_err(|_| format!("{} is no PEM file", path.display()))?,
        ),
        None => None,
    };
    let identity = match (&files.client_cert, &files.client_key) {
        (Some(cert), Some(key)) => Some(OwnedIdentity::PKCS8 {
            pem: read("the client certificate", cert)?,
            key: read("the client key", key)?,
        }),
        (None, None) => None,
        _ => return Err("certfile and keyfile go together in the URL".into()),
    };
    Ok(OwnedTLSConfig {
        identity,
        cert_chain,
    })
}

/// Why connecting failed: a failed TLS handshake named for the operator,
/// else the client's own words.
fn connect_reason(error: &lapin::Error, url: &str, files: &CertificateFiles) -> String {
    tls::handshake_reason(error, &tls::host_of(url), files, &TLS_OPTIONS)
        .unwrap_or_else(|| one_line(error))
}

/// Opens a connection and a confirm-mode channel, and declares the exchange.
async fn open(options: &RabbitMqOptions, endpoint: &str) -> Result<Link, RabbitMqSetupError> {
    let unreachable = |reason: String| RabbitMqSetupError::Unreachable {
        endpoint: endpoint.to_owned(),
        reason,
    };
    let connect_timeout = options.send_timeout.min(Duration::from_secs(10));
    let properties = ConnectionProperties::default()
        .with_connection_name(format!("outbox-relay pid {}", std::process::id()).into());
    let files = CertificateFiles::of_url(&options.url);
    let builder = DefaultConnectionBuilder::new()
        .map_err(|error| unreachable(one_line(&error)))?
        .with_uri_str(options.url.clone())
        .with_properties(properties)
        .with_tls_config(tls_config(&files).map_err(unreachable)?);
    let connection = tokio::time::timeout(connect_timeout, builder.connect())
        .await
        .map_err(|_| {
            unreachable(format!(
                "no answer within {}",
                humantime::format_duration(connect_timeout)
            ))
        })?
        .map_err(|error| unreachable(connect_reason(&error, &options.url, &files)))?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|error| unreachable(one_line(&error)))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|error| unreachable(one_line(&error)))?;
    let exchange = ShortString::try_new(options.exchange.clone()).map_err(|error| {
        RabbitMqSetupError::Exchange {
            exchange: options.exchange.clone(),
            endpoint: endpoint.to_owned(),
            reason: error.to_string(),
        }
    })?;
    channel
        .exchange_declare(
            exchange,
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|error| RabbitMqSetupError::Exchange {
            exchange: options.exchange.clone(),
            endpoint: endpoint.to_owned(),
            reason: one_line(&error),
        })?;
    Ok(Link {
        connection,
        channel,
    })
}

/// lapin's error on one line.
fn one_line(error: &lapin::Error) -> String {
    error.to_string().replace('\n', " ")
}

/// The AMQP properties of a message published at `timestamp` (seconds
/// since the epoch), written as `wire`: in Debezium's shape the Kafka
/// headers plus `aggregateType` and `aggregateId`, for a CloudEvent its
/// attributes under `cloudEvents_` and its content type. Fails for good
/// when a value does not fit AMQP's 255-byte short strings.
pub fn properties(
    message: &Message<'_>,
    wire: &Wire<'_>,
    timestamp: u64,
) -> Result<BasicProperties, SendError> {
    let short = |what: &str, value: &str| {
        ShortString::try_new(value).map_err(|_| {
            SendError::permanent(format!(
                "the {what} is longer than AMQP's 255 bytes ({} bytes)",
                value.len()
            ))
        })
    };
    let header = |name: &str| {
        message
            .headers
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.as_ref())
            .unwrap_or_default()
    };
    let mut table = FieldTable::default();
    for (name, value) in &wire.headers {
        table.insert(
            name.as_ref().into(),
            AMQPValue::LongString(LongString::from(value.as_ref())),
        );
    }
    if message.cloudevent.is_none() {
        table.insert(
            headers::AGGREGATE_TYPE.into(),
            AMQPValue::LongString(LongString::from(&*message.aggregate_type)),
        );
        table.insert(
            headers::AGGREGATE_ID.into(),
            AMQPValue::LongString(LongString::from(&*message.key)),
        );
    }
    Ok(BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type(wire.content_type.unwrap_or(cloudevents::JSON).into())
        .with_message_id(short("event id", header(headers::ID))?)
        .with_type(short("event type", header(headers::EVENT_TYPE))?)
        .with_timestamp(
            message
                .timestamp
                .map_or(timestamp, |millis| (millis.max(0) / 1000) as u64),
        )
        .with_headers(table))
}

/// The outcomes of one batch as its confirms come in: which messages were
/// acked, nacked or returned, and which aggregates must send no more.
#[derive(Debug)]
pub struct Confirms<'a> {
    messages: &'a [Message<'a>],
    outcomes: Vec<Option<Result<(), SendError>>>,
    returned: HashSet<usize>,
    by_id: HashMap<&'a str, usize>,
    failed_keys: HashSet<(&'a str, &'a str)>,
}

impl<'a> Confirms<'a> {
    /// Nothing confirmed yet.
    pub fn new(messages: &'a [Message]) -> Self {
        let by_id = messages
            .iter()
            .enumerate()
            .filter_map(|(index, message)| {
                message
                    .headers
                    .iter()
                    .find(|(name, _)| *name == headers::ID)
                    .map(|(_, id)| (id.as_ref(), index))
            })
            .collect();
        Self {
            messages,
            outcomes: vec![None; messages.len()],
            returned: HashSet::new(),
            by_id,
            failed_keys: HashSet::new(),
        }
    }

    fn key(&self, index: usize) -> (&'a str, &'a str) {
        let message = &self.messages[index];
        (&*message.topic, &*message.key)
    }

    /// Whether message `index` must not be sent: an earlier message of its
    /// aggregate failed.
    pub fn held_back(&self, index: usize) -> bool {
        self.failed_keys.contains(&self.key(index))
    }

    /// Message `index` failed before or after it was sent.
    pub fn fail(&mut self, index: usize, error: SendError) {
        self.failed_keys.insert(self.key(index));
        self.outcomes[index] = Some(Err(error));
    }

    /// Message `index` was not sent, behind an earlier failure.
    pub fn hold_back(&mut self, index: usize) {
        self.outcomes[index] = Some(Err(SendError::held_back()));
    }

    /// The broker's confirm of message `index`: an ack or a nack, and the
    /// `message_id` of a message returned before it, which may name
    /// another message of the batch.
    pub fn confirmed(&mut self, index: usize, acked: bool, returned: Option<&str>) {
        if acked {
            if self.outcomes[index].is_none() {
                self.outcomes[index] = Some(Ok(()));
            }
        } else {
            self.fail(
                index,
                SendError::transient("the broker refused the message (basic.nack)"),
            );
        }
        let Some(id) = returned else {
            return;
        };
        match self.by_id.get(id) {
            Some(&index) => {
                self.returned.insert(index);
                self.failed_keys.insert(self.key(index));
            }
            None => tracing::warn!(
                message_id = id,
                "RabbitMQ returned a message of no batch in flight"
            ),
        }
    }

    /// Every message's outcome; those still open failed with `open`.
    pub fn finish(mut self, open: impl Fn() -> SendError) -> Vec<Result<(), SendError>> {
        for &index in &self.returned {
            let message = &self.messages[index];
            self.outcomes[index] = Some(Err(SendError::permanent(format!(
                "{UNROUTABLE} for routing key {:?}",
                message.topic
            ))));
        }
        self.outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or_else(|| Err(open())))
            .collect()
    }
}

impl RabbitMqSink {
    /// [`Sink::publish`], handing no message to the broker after
    /// `fresh_until` when given.
    async fn send(
        &self,
        messages: &[Message<'_>],
        fresh_until: Option<Instant>,
    ) -> Vec<Result<(), SendError>> {
        let mut slot = self.link.lock().await;
        let channel = match self.ensure_link(&mut slot).await {
            Ok(link) => link.channel.clone(),
            Err(error) => return vec![Err(error); messages.len()],
        };
        let max_unconfirmed = self.options.max_unconfirmed.max(1);
        let mut batch = InFlight::new(&self.options, channel, messages);
        for (index, message) in messages.iter().enumerate() {
            if batch.confirms.held_back(index) {
                batch.confirms.hold_back(index);
                continue;
            }
            while batch.unconfirmed.len() >= max_unconfirmed && batch.await_confirm().await {}
            if fresh_until.is_some_and(|until| Instant::now() >= until) {
                batch.confirms.fail(index, SendError::stale());
                continue;
            }
            batch.send(index, message).await;
        }
        while batch.await_confirm().await {}
        let (outcomes, broken) = batch.finish();
        if let Some(reason) = broken {
            self.up.store(false, Ordering::Relaxed);
            tracing::warn!(%reason, "closing the RabbitMQ connection; the next batch opens a new one");
            if let Some(link) = slot.take() {
                link.close(&reason).await;
            }
        }
        outcomes
    }
}

#[async_trait]
impl Sink for RabbitMqSink {
    async fn publish(&self, messages: &[Message<'_>]) -> Vec<Result<(), SendError>> {
        self.send(messages, None).await
    }

    /// Checks `fresh_until` before each message it hands to the broker.
    async fn publish_until(
        &self,
        messages: &[Message<'_>],
        fresh_until: Instant,
    ) -> Vec<Result<(), SendError>> {
        self.send(messages, Some(fresh_until)).await
    }

    async fn flush(&self, timeout: Duration) {
        // Every publish awaits its confirms, so nothing is in flight here.
        if let Ok(mut slot) = tokio::time::timeout(timeout, self.link.lock()).await
            && let Some(link) = slot.take()
        {
            link.close("relay shutting down").await;
        }
    }

    async fn probe(&self) -> bool {
        match self.link.try_lock() {
            Ok(mut slot) => self.ensure_link(&mut slot).await.is_ok(),
            // A batch is being published: the last known state.
            Err(_) => self.up.load(Ordering::Relaxed),
        }
    }
}

/// A confirm awaited, with the index of its message in the batch.
type Awaited = Join<Ready<usize>, PublisherConfirm>;

/// One batch being published over one channel: the messages awaiting
/// their confirm, and why the channel can take nothing more, once it cannot.
struct InFlight<'a> {
    channel: Channel,
    exchange: ShortString,
    publish: BasicPublishOptions,
    /// The time of publishing, in seconds since the epoch.
    timestamp: u64,
    deadline: tokio::time::Instant,
    send_timeout: Duration,
    confirms: Confirms<'a>,
    unconfirmed: FuturesUnordered<Awaited>,
    broken: Option<String>,
}

impl<'a> InFlight<'a> {
    fn new(options: &RabbitMqOptions, channel: Channel, messages: &'a [Message]) -> Self {
        Self {
            channel,
            exchange: ShortString::try_new(options.exchange.clone()).unwrap_or_default(),
            publish: BasicPublishOptions {
                mandatory: options.mandatory,
                ..BasicPublishOptions::default()
            },
            timestamp: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_secs()),
            deadline: tokio::time::Instant::now() + options.send_timeout,
            send_timeout: options.send_timeout,
            confirms: Confirms::new(messages),
            unconfirmed: FuturesUnordered::new(),
            broken: None,
        }
    }

    /// Message `index` failed, and the channel can take nothing more.
    fn break_at(&mut self, index: usize, reason: String) {
        self.confirms
            .fail(index, SendError::transient(reason.clone()));
        self.broken = Some(reason);
    }

    /// Waits for the next confirm; false when none can come: nothing
    /// awaits one, or the channel broke.
    async fn await_confirm(&mut self) -> bool {
        if self.broken.is_some() || self.unconfirmed.is_empty() {
            return false;
        }
        match tokio::time::timeout_at(self.deadline, self.unconfirmed.next()).await {
            Ok(Some((done, Ok(confirmation)))) => confirm(&mut self.confirms, done, confirmation),
            Ok(Some((done, Err(error)))) => {
                self.break_at(done, format!("no confirm: {}", one_line(&error)));
            }
            Ok(None) => return false,
            Err(_) => self.broken = Some(no_confirm_within(self.send_timeout)),
        }
        true
    }

    /// Publishes message `index`, unless it is held back behind an
    /// earlier failure of its aggregate or the channel broke.
    async fn send(&mut self, index: usize, message: &Message<'_>) {
        if self.confirms.held_back(index) {
            self.confirms.hold_back(index);
            return;
        }
        if let Some(reason) = &self.broken {
            self.confirms
                .fail(index, SendError::transient(reason.clone()));
            return;
        }
        let (routing_key, properties, wire) = match addressed(message, self.timestamp) {
            Ok(addressed) => addressed,
            Err(error) => {
                self.confirms.fail(index, error);
                return;
            }
        };
        let body = wire.value.as_deref().unwrap_or_default().as_bytes();
        let publishing = self.channel.basic_publish(
            self.exchange.clone(),
            routing_key,
            self.publish,
            body,
            properties,
        );
        match tokio::time::timeout_at(self.deadline, publishing).await {
            Ok(Ok(confirm)) => self.unconfirmed.push(join(ready(index), confirm)),
            Ok(Err(error)) => self.break_at(index, format!("cannot publish: {}", one_line(&error))),
            Err(_) => self.break_at(index, no_confirm_within(self.send_timeout)),
        }
    }

    /// Every message's outcome, and why the channel broke if it did.
    fn finish(self) -> (Vec<Result<(), SendError>>, Option<String>) {
        drop(self.unconfirmed);
        let outcomes = match &self.broken {
            Some(reason) => self
                .confirms
                .finish(|| SendError::transient(reason.clone())),
            None => self.confirms.finish(|| SendError::transient("no confirm")),
        };
        (outcomes, self.broken)
    }
}

/// The routing key, properties and wire form (the body) of a message
/// published at `timestamp`.
fn addressed<'m>(
    message: &'m Message<'_>,
    timestamp: u64,
) -> Result<(ShortString, BasicProperties, Wire<'m>), SendError> {
    let wire = message
        .wire(cloudevents::AMQP_PREFIX)
        .map_err(SendError::permanent)?;
    let properties = properties(message, &wire, timestamp)?;
    let routing_key = ShortString::try_new(message.topic.to_string()).map_err(|_| {
        SendError::permanent(format!(
            "the routing key {:?} is longer than AMQP's 255 bytes",
            message.topic
        ))
    })?;
    Ok((routing_key, properties, wire))
}

/// Notes a confirm lapin resolved.
fn confirm(confirms: &mut Confirms<'_>, index: usize, confirmation: Confirmation) {
    let acked = confirmation.is_ack();
    match confirmation {
        Confirmation::NotRequested => confirms.fail(
            index,
            SendError::transient("the channel is not in confirm mode"),
        ),
        confirmation => {
            let returned = confirmation.take_message();
            let id = returned
                .as_ref()
                .and_then(|message| message.delivery.properties.message_id().as_ref())
                .map(ShortString::as_str);
            confirms.confirmed(index, acked, id);
        }
    }
}

fn no_confirm_within(timeout: Duration) -> String {
    format!("no confirm within {}", humantime::format_duration(timeout))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::test_message as message;
    use crate::sink::FailureKind;

    #[test]
    fn properties_carry_the_contract() {
        let plain = message("e-1", "42");
        let properties = properties(&plain, &plain.wire("").unwrap(), 1_700_000_000).unwrap();
        assert_eq!(*properties.delivery_mode(), Some(2));
        assert_eq!(
            properties.content_type().as_ref().map(ShortString::as_str),
            Some("application/json")
        );
        assert_eq!(
            properties.message_id().as_ref().map(ShortString::as_str),
            Some("e-1")
        );
        assert_eq!(
            properties.kind().as_ref().map(ShortString::as_str),
            Some("OrderPlaced")
        );
        assert_eq!(*properties.timestamp(), Some(1_700_000_000));
        let headers = properties.headers().clone().unwrap();
        let text = |name: &str| match headers.inner().get(name) {
            Some(AMQPValue::LongString(value)) => {
                String::from_utf8(value.as_bytes().to_vec()).unwrap()
            }
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(text("id"), "e-1");
        assert_eq!(text("eventType"), "OrderPlaced");
        assert_eq!(text("eventVersion"), "2");
        assert_eq!(text("aggregateSequence"), "7");
        assert_eq!(text("aggregateType"), "Order");
        assert_eq!(text("aggregateId"), "42");
        assert!(!headers.inner().contains_key("traceparent"));
    }

    #[test]
    fn an_event_type_too_long_for_amqp_fails_for_good() {
        let mut long = message("e-1", "42");
        long.headers[1].1 = "E".repeat(256).into();
        let error = properties(&long, &long.wire("").unwrap(), 0).unwrap_err();
        assert_eq!(error.kind, FailureKind::Permanent);
    }

    #[test]
    fn a_return_fails_the_message_it_names_not_the_one_whose_ack_carried_it() {
        let messages = [
            message("e-1", "a"),
            message("e-2", "b"),
            message("e-3", "c"),
        ];
        let mut confirms = Confirms::new(&messages);
        // A multiple ack: lapin attached e-2's return to e-3's confirm.
        confirms.confirmed(0, true, None);
        confirms.confirmed(2, true, Some("e-2"));
        confirms.confirmed(1, true, None);
        let outcomes = confirms.finish(|| SendError::transient("open"));
        assert_eq!(outcomes[0], Ok(()));
        let error = outcomes[1].clone().unwrap_err();
        assert_eq!(error.kind, FailureKind::Permanent);
        assert!(error.reason.starts_with(UNROUTABLE), "{}", error.reason);
        assert_eq!(outcomes[2], Ok(()));
    }

    #[test]
    fn a_nack_holds_back_the_aggregates_later_messages_and_open_ones_fail() {
        let messages = [
            message("e-1", "a"),
            message("e-2", "a"),
            message("e-3", "b"),
        ];
        let mut confirms = Confirms::new(&messages);
        confirms.confirmed(0, false, None);
        assert!(confirms.held_back(1));
        assert!(!confirms.held_back(2));
        confirms.hold_back(1);
        let outcomes = confirms.finish(|| SendError::transient("no confirm within 1s"));
        assert_eq!(
            outcomes[0].clone().unwrap_err().kind,
            FailureKind::Transient
        );
        assert_eq!(outcomes[1].clone().unwrap_err().kind, FailureKind::HeldBack);
        assert_eq!(
            outcomes[2].clone().unwrap_err().reason,
            "no confirm within 1s"
        );
    }

    #[test]
    fn urls_are_checked_without_echoing_them() {
        assert!(check_url("amqp://127.0.0.1").is_ok());
        let error = check_url("amqp://user:s3cret@host:notaport/").unwrap_err();
        assert!(!error.contains("s3cret"), "{error}");
        let error = check_url("kafka://user:s3cret@host:9092").unwrap_err();
        assert!(
            error.contains("kafka://") && !error.contains("s3cret"),
            "{error}"
        );
        assert_eq!(
            endpoint("amqp://guest:guest@127.0.0.1:5672/%2f"),
            "amqp://127.0.0.1:5672/%2F"
        );
    }
}
