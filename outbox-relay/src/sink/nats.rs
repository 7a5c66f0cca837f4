//! Publishes to NATS JetStream through async-nats: a message counts as
//! published only once the stream's PubAck for it came back.
//!
//! At start the sink makes sure of a stream (`OUTBOX` by default). A
//! missing stream is created with file storage, capturing the subject
//! template's fixed tokens followed by `>` (`outbox.event.>`), with a
//! duplicate window of at least two minutes. An existing stream is used as
//! it is configured, but the relay stops with one line when none of its
//! subjects captures every subject of the template, or when its duplicate
//! window is not longer than the relay's longest gap before it sends an
//! event again (see [`ResendBound`]).
//!
//! Each message goes to subject `outbox.event.<aggregatetype>.<aggregateid>`
//! (the [`subject::SubjectTemplate`]; both values encoded as one token each,
//! reversibly), with the header `Nats-Msg-Id` set to the event id, so that
//! the stream drops a re-send inside its duplicate window (a replayed copy's
//! is `<event id>:<replay id>`, a message of its own), and the headers
//! of the other brokers: the Kafka headers (`id`, `eventType`,
//! `eventVersion`, `aggregateSequence` and `traceparent` where present)
//! plus `aggregateType` and `aggregateId` (the original id). The body is the
//! payload's bytes as stored.
//!
//! Acknowledgements: a batch is published whole with at most `max_pending`
//! messages awaiting their PubAck at once, never one round trip per
//! message. A PubAck marked `duplicate` counts as delivered (the stream
//! holds the event from an earlier send). An error answer, no answer
//! within the send timeout, or a lost connection fail the message as
//! transient: its row stays pending and is retried with backoff. A message
//! larger than the server accepts fails for good (dead-lettered after the
//! attempt limit).
//!
//! Per-aggregate order: the messages of one subject are sent one at a time,
//! each only after the previous one's PubAck, while different subjects are
//! in flight together. A failed message therefore never has a later
//! message of its aggregate stored behind it: the later ones of the batch
//! are held back, and its retry (a duplicate the stream drops, if the first
//! send was stored after all) comes before them.

pub mod subject;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{
    CreateStreamErrorKind, GetStreamErrorKind, PublishAckFuture, PublishError, PublishErrorKind,
};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{Config as StreamConfig, StorageType};
use async_nats::{HeaderMap, HeaderValue};
use async_trait::async_trait;
use futures::StreamExt;
use futures::future::{Join, Ready, join, ready};
use futures::stream::FuturesUnordered;

use super::{SendError, Sink};
use crate::cloudevents;
use crate::message::{Message, Wire};
use crate::tls::{self, CertificateFiles, OptionNames};
use outbox_contract::headers;
use subject::{MAX_SUBJECT_BYTES, SubjectTemplate, covers};

/// The default server.
pub const DEFAULT_URL: &str = "nats://127.0.0.1:4222";
/// The default stream.
pub const DEFAULT_STREAM: &str = "OUTBOX";
/// The default bound on messages awaiting their PubAck.
pub const DEFAULT_MAX_PENDING: usize = 256;
/// The shortest duplicate window of a stream the relay creates (the
/// server's own default).
pub const MIN_CREATED_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// The header JetStream deduplicates by.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// The longest time between two sends of one event by the relay, and what
/// it is made of, to check against a stream's duplicate window.
///
/// An event is sent again when its first send was stored but not marked:
/// its PubAck came too late (past the send timeout, then retried after the
/// aggregate's backoff) or the relay stopped between the PubAck and the
/// mark (another relay takes its shards over once its lease ran out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResendBound {
    /// The longest gap.
    pub longest: Duration,
    /// The settings it is made of, for messages (`--send-timeout 30s + ...`).
    pub made_of: String,
}

impl Default for ResendBound {
    fn default() -> Self {
        Self {
            longest: Duration::from_secs(61),
            made_of: "the default settings".into(),
        }
    }
}

/// Settings of the NATS sink.
#[derive(Debug, Clone)]
pub struct NatsOptions {
    /// `nats://[user:password@]host:port` (or `tls://`), several
    /// comma-separated.
    pub url: String,
    /// The stream messages are stored in.
    pub stream: String,
    /// The subject of each message.
    pub subject_template: SubjectTemplate,
    /// Most messages awaiting their PubAck at once.
    pub max_pending: usize,
    /// How long to wait for a batch's PubAcks (and for a connection).
    pub send_timeout: Duration,
    /// What the stream's duplicate window must exceed.
    pub resend_bound: ResendBound,
    /// Root certificates to trust (then only these, and TLS is required),
    /// and a client certificate and key.
    pub tls: CertificateFiles,
}

/// How the NATS settings that name certificate files are called.
const TLS_OPTIONS: OptionNames = OptionNames {
    root: "--nats-ca",
    client: "--nats-cert and --nats-key",
    name_mismatch: "connect by a name the certificate lists",
};

impl Default for NatsOptions {
    fn default() -> Self {
        Self {
            url: DEFAULT_URL.into(),
            stream: DEFAULT_STREAM.into(),
            subject_template: SubjectTemplate::parse(subject::DEFAULT_TEMPLATE)
                .expect("the default template is valid"),
            max_pending: DEFAULT_MAX_PENDING,
            send_timeout: Duration::from_secs(30),
            resend_bound: ResendBound::default(),
            tls: CertificateFiles::default(),
        }
    }
}

/// A failure to set up the NATS sink.
#[derive(Debug, thiserror::Error)]
pub enum NatsSetupError {
    /// No connection could be opened.
    #[error("cannot connect to NATS at {endpoint}: {reason}")]
    Unreachable {
        /// The servers, without credentials.
        endpoint: String,
        /// What failed.
        reason: String,
    },
    /// JetStream did not answer, or refused the stream.
    #[error("cannot use the JetStream stream {stream:?} at {endpoint}: {reason}")]
    Stream {
        /// The stream.
        stream: String,
        /// The servers, without credentials.
        endpoint: String,
        /// What failed.
        reason: String,
    },
    /// The existing stream does not capture every subject of the template.
    #[error(
        "the JetStream stream {stream:?} captures {subjects:?}, not every subject {pattern}; \
         add a subject such as {capture:?} to it, or choose another stream with --nats-stream"
    )]
    NotCaptured {
        /// The stream.
        stream: String,
        /// What it captures.
        subjects: Vec<String>,
        /// The template's subjects, as a filter.
        pattern: String,
        /// A subject that captures them.
        capture: String,
    },
    /// The stream forgets message ids sooner than the relay may re-send.
    #[error(
        "the JetStream stream {stream:?} drops re-sent events only within its duplicate window \
         of {window}, but the relay may send an event again up to {longest} later ({made_of}); \
         raise the stream's duplicate window above {longest} or lower those settings"
    )]
    DuplicateWindow {
        /// The stream.
        stream: String,
        /// Its duplicate window.
        window: String,
        /// The relay's longest gap between two sends of an event.
        longest: String,
        /// What that gap is made of.
        made_of: String,
    },
}

/// Checks a NATS URL (or several, comma-separated) without connecting;
/// the error never repeats the URL, which may hold a password.
///
/// ```
/// use outbox_relay::sink::nats::check_url;
///
/// assert!(check_url("nats://127.0.0.1:4222").is_ok());
/// assert!(check_url("nats://a:4222,nats://b:4222").is_ok());
/// assert!(check_url("http://127.0.0.1:4222").is_err());
/// ```
pub fn check_url(url: &str) -> Result<(), String> {
    if url.trim().is_empty() {
        return Err("no server given; use nats://host:4222".into());
    }
    for server in url.split(',') {
        let parsed = parse_server(server.trim())?;
        match parsed.scheme() {
            "nats" | "tls" => {}
            other => {
                return Err(format!(
                    "the scheme is {other}://; use nats://user:password@host:4222 or tls://"
                ));
            }
        }
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err("the URL names no host; use nats://host:4222".into());
        }
    }
    Ok(())
}

/// A server address as async-nats reads it: `nats://` when no scheme.
fn parse_server(server: &str) -> Result<url::Url, String> {
    let text = if server.contains("://") {
        server.to_owned()
    } else {
        format!("nats://{server}")
    };
    url::Url::parse(&text).map_err(|error| format!("not a URL ({error})"))
}

/// `scheme://host:port` of each server, for messages.
fn endpoint(url: &str) -> String {
    url.split(',')
        .map(|server| match parse_server(server.trim()) {
            Ok(parsed) => format!(
                "{}://{}:{}",
                parsed.scheme(),
                parsed.host_str().unwrap_or_default(),
                parsed.port().unwrap_or(4222)
            ),
            Err(_) => "the configured URL".into(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Checks a stream name: JetStream refuses white space, `.`, `*`, `>`
/// and path separators.
///
/// ```
/// use outbox_relay::sink::nats::check_stream_name;
///
/// assert!(check_stream_name("OUTBOX").is_ok());
/// assert!(check_stream_name("OUT.BOX").is_err());
/// ```
pub fn check_stream_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 255 {
        return Err(format!("must be 1 to 255 bytes (got {})", name.len()));
    }
    if name
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
    {
        return Err(format!(
            "{name:?} holds white space or one of . * > / \\, which JetStream refuses"
        ));
    }
    Ok(())
}

/// Refuses a duplicate window that does not exceed the relay's longest
/// gap between two sends of an event.
pub fn check_duplicate_window(
    stream: &str,
    window: Duration,
    bound: &ResendBound,
) -> Result<(), NatsSetupError> {
    if window > bound.longest {
        return Ok(());
    }
    Err(NatsSetupError::DuplicateWindow {
        stream: stream.to_owned(),
        window: humantime::format_duration(window).to_string(),
        longest: humantime::format_duration(bound.longest).to_string(),
        made_of: bound.made_of.clone(),
    })
}

/// The duplicate window of a stream the relay creates: twice its longest
/// gap, and at least the server's default.
pub fn created_duplicate_window(bound: &ResendBound) -> Duration {
    (bound.longest * 2).max(MIN_CREATED_DUPLICATE_WINDOW)
}

/// A header value NATS carries unchanged: no line break (the protocol's
/// separator) and no white space at either end (readers trim it).
fn header_value(name: &str, value: &str) -> Result<HeaderValue, SendError> {
    let unchanged = value.trim() == value;
    match value.parse::<HeaderValue>() {
        Ok(parsed) if unchanged => Ok(parsed),
        _ => Err(SendError::permanent(format!(
            "the {name} {value:?} cannot be carried by a NATS header \
             (a line break, or white space at either end)"
        ))),
    }
}

/// The headers of a message: `Nats-Msg-Id`, then in Debezium's shape the
/// Kafka headers, `aggregateType` and `aggregateId`, or for a CloudEvent
/// `content-type` and its attributes under `ce-`. Fails for good when a
/// value cannot be carried by a NATS header.
pub fn message_headers(message: &Message<'_>, wire: &Wire<'_>) -> Result<HeaderMap, SendError> {
    let mut map = HeaderMap::new();
    let header = |wanted: &str| {
        message
            .headers
            .iter()
            .find(|(name, _)| *name == wanted)
            .map(|(_, value)| value.as_ref())
    };
    let id = header(headers::ID).unwrap_or_default();
    // A replayed copy is a message of its own to JetStream's deduplication,
    // which would drop it within the window as the event's first send.
    let msg_id = match header(headers::REPLAY_ID) {
        Some(replay) => format!("{id}:{replay}"),
        None => id.to_owned(),
    };
    map.insert(MSG_ID_HEADER, header_value("event id", &msg_id)?);
    if let Some(content_type) = wire.content_type {
        map.insert("content-type", content_type);
    }
    for (name, value) in &wire.headers {
        map.insert(name.as_ref(), header_value(name, value)?);
    }
    if message.cloudevent.is_none() {
        map.insert(
            headers::AGGREGATE_TYPE,
            header_value("aggregate type", &message.aggregate_type)?,
        );
        map.insert(
            headers::AGGREGATE_ID,
            header_value("aggregate id", &message.key)?,
        );
    }
    Ok(map)
}

/// The order a batch is sent in: one message per subject in flight, the
/// earliest first, and an aggregate's messages held back once one of its
/// messages failed. Decides only; the sink does the sending.
#[derive(Debug)]
pub struct Dispatch<'a> {
    messages: &'a [Message<'a>],
    subjects: Vec<String>,
    /// Per subject, its messages not answered yet, in batch order; the
    /// first is in flight or ready.
    lanes: HashMap<String, VecDeque<usize>>,
    /// Messages first in their lane and not in flight.
    ready: BTreeSet<usize>,
    outcomes: Vec<Option<Result<(), SendError>>>,
    failed: HashSet<(&'a str, &'a str)>,
}

impl<'a> Dispatch<'a> {
    /// A batch whose message `i` goes to `subjects[i]`.
    pub fn new(messages: &'a [Message<'a>], subjects: Vec<String>) -> Self {
        let mut lanes: HashMap<String, VecDeque<usize>> = HashMap::new();
        for (index, subject) in subjects.iter().enumerate() {
            lanes.entry(subject.clone()).or_default().push_back(index);
        }
        let ready = lanes
            .values()
            .filter_map(|lane| lane.front().copied())
            .collect();
        Self {
            messages,
            outcomes: vec![None; subjects.len()],
            subjects,
            lanes,
            ready,
            failed: HashSet::new(),
        }
    }

    /// The subject of message `index`.
    pub fn subject(&self, index: usize) -> &str {
        &self.subjects[index]
    }

    fn aggregate(&self, index: usize) -> (&'a str, &'a str) {
        let message = &self.messages[index];
        (&*message.aggregate_type, &*message.key)
    }

    /// The next message to send: the earliest whose subject has nothing in
    /// flight. Messages behind a failure of their aggregate are held back
    /// on the way.
    pub fn next_to_send(&mut self) -> Option<usize> {
        while let Some(index) = self.ready.pop_first() {
            if self.failed.contains(&self.aggregate(index)) {
                self.outcomes[index] = Some(Err(SendError::held_back()));
                self.advance(index);
                continue;
            }
            return Some(index);
        }
        None
    }

    /// Message `index` was acknowledged: the next of its subject may go.
    pub fn acked(&mut self, index: usize) {
        self.outcomes[index] = Some(Ok(()));
        self.advance(index);
    }

    /// Message `index` failed: its aggregate sends nothing more.
    pub fn fail(&mut self, index: usize, error: SendError) {
        self.failed.insert(self.aggregate(index));
        self.outcomes[index] = Some(Err(error));
        self.advance(index);
    }

    fn advance(&mut self, index: usize) {
        let lane = self
            .lanes
            .get_mut(&self.subjects[index])
            .expect("every message has a lane");
        debug_assert_eq!(lane.front(), Some(&index));
        lane.pop_front();
        if let Some(&next) = lane.front() {
            self.ready.insert(next);
        }
    }

    /// Every message's outcome; those not answered failed with `open`, or
    /// are held back behind a failure of their aggregate.
    pub fn finish(self, open: impl Fn() -> SendError) -> Vec<Result<(), SendError>> {
        let messages = self.messages;
        let failed = self.failed;
        self.outcomes
            .into_iter()
            .enumerate()
            .map(|(index, outcome)| {
                outcome.unwrap_or_else(|| {
                    let message = &messages[index];
                    if failed.contains(&(&*message.aggregate_type, &*message.key)) {
                        Err(SendError::held_back())
                    } else {
                        Err(open())
                    }
                })
            })
            .collect()
    }
}

/// Publishes messages to a JetStream stream, marking each only after its
/// PubAck.
pub struct NatsSink {
    options: NatsOptions,
    endpoint: String,
    client: async_nats::Client,
    jetstream: async_nats::jetstream::Context,
    /// Set when a publish found no stream: the next batch makes sure of it
    /// again.
    stream_lost: AtomicBool,
}

impl NatsSink {
    /// Connects and makes sure of the stream.
    pub async fn connect(options: NatsOptions) -> Result<Self, NatsSetupError> {
        let endpoint = endpoint(&options.url);
        let connect_timeout = options.send_timeout.min(Duration::from_secs(10));
        let mut connect = async_nats::ConnectOptions::new();
        if let Some(root) = &options.tls.root {
            connect = connect
                .add_root_certificates(root.clone())
                .require_tls(true);
        }
        if let (Some(cert), Some(key)) = (&options.tls.client_cert, &options.tls.client_key) {
            connect = connect.add_client_certificate(cert.clone(), key.clone());
        }
        let client = connect
            .name(format!("outbox-relay pid {}", std::process::id()))
            .connection_timeout(connect_timeout)
            .max_reconnects(None)
            .event_callback(|event| async move {
                match event {
                    async_nats::Event::Connected => tracing::info!("reconnected to NATS"),
                    async_nats::Event::Disconnected => {
                        tracing::warn!("lost the connection to NATS; reconnecting")
                    }
                    other => tracing::warn!(event = %other, "NATS connection event"),
                }
            })
            .connect(options.url.as_str())
            .await
            .map_err(|error| NatsSetupError::Unreachable {
                endpoint: endpoint.clone(),
                reason: connect_reason(&error, &options),
            })?;
        let jetstream = async_nats::jetstream::ContextBuilder::new()
            .timeout(options.send_timeout)
            .ack_timeout(options.send_timeout)
            .max_ack_inflight(options.max_pending.max(1) * 2)
            .backpressure_on_inflight(true)
            .build(client.clone());
        let sink = Self {
            options,
            endpoint,
            client,
            jetstream,
            stream_lost: AtomicBool::new(false),
        };
        sink.ensure_stream().await?;
        tracing::info!(
            endpoint = %sink.endpoint,
            stream = %sink.options.stream,
            subjects = %sink.options.subject_template.as_str(),
            "connected to NATS JetStream"
        );
        Ok(sink)
    }

    /// Uses the stream if it exists and suits the relay, else creates it.
    async fn ensure_stream(&self) -> Result<(), NatsSetupError> {
        let options = &self.options;
        let stream_error = |reason: String| NatsSetupError::Stream {
            stream: options.stream.clone(),
            endpoint: self.endpoint.clone(),
            reason,
        };
        let info = match self.jetstream.get_stream(&options.stream).await {
            Ok(stream) => stream.cached_info().clone(),
            Err(error) if is_stream_not_found(&error.kind()) => {
                let config = StreamConfig {
                    name: options.stream.clone(),
                    subjects: vec![options.subject_template.capture()],
                    storage: StorageType::File,
                    duplicate_window: created_duplicate_window(&options.resend_bound),
                    description: Some("Events published by outbox-relay".into()),
                    ..StreamConfig::default()
                };
                match self.jetstream.create_stream(config).await {
                    Ok(stream) => {
                        tracing::info!(stream = %options.stream, "created the JetStream stream");
                        stream.cached_info().clone()
                    }
                    // Another relay created it meanwhile.
                    Err(error) if is_name_taken(&error.kind()) => self
                        .jetstream
                        .get_stream(&options.stream)
                        .await
                        .map_err(|error| stream_error(one_line(&error)))?
                        .cached_info()
                        .clone(),
                    Err(error) => return Err(stream_error(one_line(&error))),
                }
            }
            Err(error) => return Err(stream_error(one_line(&error))),
        };
        let pattern = options.subject_template.pattern();
        if !info
            .config
            .subjects
            .iter()
            .any(|filter| covers(filter, &pattern))
        {
            return Err(NatsSetupError::NotCaptured {
                stream: options.stream.clone(),
                subjects: info.config.subjects.clone(),
                pattern,
                capture: options.subject_template.capture(),
            });
        }
        check_duplicate_window(
            &options.stream,
            info.config.duplicate_window,
            &options.resend_bound,
        )
    }

    /// Makes sure of the stream again after a publish found none.
    async fn recover_stream(&self) -> Result<(), SendError> {
        if !self.stream_lost.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.ensure_stream()
            .await
            .map_err(|error| SendError::transient(error.to_string()))?;
        self.stream_lost.store(false, Ordering::Relaxed);
        tracing::info!(stream = %self.options.stream, "the JetStream stream is back");
        Ok(())
    }

    /// What a failed publish or PubAck means for the message.
    fn failure(&self, subject: &str, error: &PublishError) -> SendError {
        match error.kind() {
            PublishErrorKind::MaxPayloadExceeded => SendError::permanent(format!(
                "the message is larger than the NATS server accepts: {}",
                one_line(error)
            )),
            PublishErrorKind::StreamNotFound => {
                self.stream_lost.store(true, Ordering::Relaxed);
                SendError::transient(format!(
                    "no JetStream stream captures {subject} (was the stream {:?} deleted?)",
                    self.options.stream
                ))
            }
            PublishErrorKind::TimedOut => {
                SendError::transient(no_ack_within(self.options.send_timeout))
            }
            _ if jetstream_code(error) == Some(ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM) => {
                SendError::permanent(format!(
                    "the message is larger than the stream {:?} accepts: {}",
                    self.options.stream,
                    one_line(error)
                ))
            }
            _ => SendError::transient(format!("not stored by JetStream: {}", one_line(error))),
        }
    }
}

/// The JetStream error code behind a publish error, if the server answered one.
fn jetstream_code(error: &PublishError) -> Option<ErrorCode> {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>())
        .map(async_nats::jetstream::Error::error_code)
}

fn is_stream_not_found(kind: &GetStreamErrorKind) -> bool {
    matches!(kind, GetStreamErrorKind::JetStream(error) if error.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

fn is_name_taken(kind: &CreateStreamErrorKind) -> bool {
    matches!(kind, CreateStreamErrorKind::JetStream(error) if error.error_code() == ErrorCode::STREAM_NAME_EXIST)
}

/// Why connecting failed: a failed TLS handshake named for the operator,
/// else the client's own words.
fn connect_reason(error: &async_nats::ConnectError, options: &NatsOptions) -> String {
    let host = options
        .url
        .split(',')
        .next()
        .and_then(|server| parse_server(server.trim()).ok())
        .and_then(|parsed| parsed.host_str().map(str::to_owned))
        .unwrap_or_default();
    tls::handshake_reason(error, &host, &options.tls, &TLS_OPTIONS)
        .unwrap_or_else(|| one_line(error))
}

/// An error on one line.
fn one_line(error: &impl std::fmt::Display) -> String {
    error.to_string().replace(['\r', '\n'], " ")
}

fn no_ack_within(timeout: Duration) -> String {
    format!("no PubAck within {}", humantime::format_duration(timeout))
}

/// The subject, headers and body of message `index`; fails for good when
/// NATS cannot carry it.
fn prepare(message: &Message<'_>, subject: &str) -> Result<PublishMessage, SendError> {
    if subject.len() > MAX_SUBJECT_BYTES {
        return Err(SendError::permanent(format!(
            "the subject is {} bytes, longer than the {MAX_SUBJECT_BYTES} the relay publishes to",
            subject.len()
        )));
    }
    let wire = message
        .wire(cloudevents::NATS_PREFIX)
        .map_err(SendError::permanent)?;
    let body = wire
        .value
        .as_deref()
        .unwrap_or_default()
        .as_bytes()
        .to_vec();
    Ok(PublishMessage::build()
        .payload(body.into())
        .headers(message_headers(message, &wire)?))
}

/// A PubAck awaited, with the index of its message in the batch.
type Awaited = Join<Ready<usize>, <PublishAckFuture as IntoFuture>::IntoFuture>;

/// One batch being published: what [`Dispatch`] decided so far, the
/// messages awaiting their PubAck, and why nothing more is sent, once so.
struct InFlight<'a> {
    dispatch: Dispatch<'a>,
    deadline: tokio::time::Instant,
    awaited: FuturesUnordered<Awaited>,
    duplicates: usize,
    stopped: Option<String>,
}

impl NatsSink {
    /// Publishes message `index` of the batch, without awaiting its PubAck.
    async fn send(&self, batch: &mut InFlight<'_>, index: usize, message: &Message<'_>) {
        let subject = batch.dispatch.subject(index).to_owned();
        let publish = match prepare(message, &subject) {
            Ok(publish) => publish,
            Err(error) => {
                batch.dispatch.fail(index, error);
                return;
            }
        };
        let sent = tokio::time::timeout_at(
            batch.deadline,
            self.jetstream.send_publish(subject.clone(), publish),
        )
        .await;
        match sent {
            Ok(Ok(ack)) => batch.awaited.push(join(ready(index), ack.into_future())),
            Ok(Err(error)) => {
                let failure = self.failure(&subject, &error);
                if failure.kind != super::FailureKind::Permanent {
                    batch.stopped = Some(failure.reason.clone());
                }
                batch.dispatch.fail(index, failure);
            }
            Err(_) => {
                let reason = no_ack_within(self.options.send_timeout);
                batch
                    .dispatch
                    .fail(index, SendError::transient(reason.clone()));
                batch.stopped = Some(reason);
            }
        }
    }

    /// Waits for the next PubAck; false when none can come: nothing
    /// awaits one, or the send timeout passed.
    async fn await_ack(&self, batch: &mut InFlight<'_>) -> bool {
        if batch.awaited.is_empty() {
            return false;
        }
        match tokio::time::timeout_at(batch.deadline, batch.awaited.next()).await {
            Ok(Some((index, Ok(ack)))) => {
                batch.duplicates += usize::from(ack.duplicate);
                batch.dispatch.acked(index);
            }
            Ok(Some((index, Err(error)))) => {
                let subject = batch.dispatch.subject(index).to_owned();
                let failure = self.failure(&subject, &error);
                batch.dispatch.fail(index, failure);
            }
            Ok(None) => return false,
            Err(_) => {
                batch.stopped = Some(no_ack_within(self.options.send_timeout));
                return false;
            }
        }
        true
    }

    /// [`Sink::publish`], handing no message to the server after
    /// `fresh_until` when given.
    async fn send_batch(
        &self,
        messages: &[Message<'_>],
        fresh_until: Option<Instant>,
    ) -> Vec<Result<(), SendError>> {
        if let Err(error) = self.recover_stream().await {
            return vec![Err(error); messages.len()];
        }
        let template = &self.options.subject_template;
        let subjects = messages
            .iter()
            .map(|message| template.subject(&message.aggregate_type, &message.key))
            .collect();
        let mut batch = InFlight {
            dispatch: Dispatch::new(messages, subjects),
            deadline: tokio::time::Instant::now() + self.options.send_timeout,
            awaited: FuturesUnordered::new(),
            duplicates: 0,
            stopped: None,
        };
        let max_pending = self.options.max_pending.max(1);
        loop {
            while batch.stopped.is_none() && batch.awaited.len() < max_pending {
                let Some(index) = batch.dispatch.next_to_send() else {
                    break;
                };
                if fresh_until.is_some_and(|until| Instant::now() >= until) {
                    batch.dispatch.fail(index, SendError::stale());
                    continue;
                }
                self.send(&mut batch, index, &messages[index]).await;
            }
            if !self.await_ack(&mut batch).await {
                break;
            }
        }
        self.finish(batch)
    }

    /// Every message's outcome, those still open failed.
    fn finish(&self, batch: InFlight<'_>) -> Vec<Result<(), SendError>> {
        drop(batch.awaited);
        if batch.duplicates > 0 {
            tracing::info!(
                duplicates = batch.duplicates,
                stream = %self.options.stream,
                "events sent before were dropped by the stream's duplicate window"
            );
        }
        match batch.stopped {
            Some(reason) => {
                tracing::warn!(%reason, "NATS publishing stopped for this batch");
                batch
                    .dispatch
                    .finish(|| SendError::transient(reason.clone()))
            }
            None => batch.dispatch.finish(|| SendError::transient("no PubAck")),
        }
    }
}

#[async_trait]
impl Sink for NatsSink {
    async fn publish(&self, messages: &[Message<'_>]) -> Vec<Result<(), SendError>> {
        self.send_batch(messages, None).await
    }

    /// Checks `fresh_until` before each message it hands to the server.
    async fn publish_until(
        &self,
        messages: &[Message<'_>],
        fresh_until: Instant,
    ) -> Vec<Result<(), SendError>> {
        self.send_batch(messages, Some(fresh_until)).await
    }

    async fn flush(&self, timeout: Duration) {
        // Every publish awaits its PubAcks, so nothing is in flight here.
        let _ = tokio::time::timeout(timeout, self.client.flush()).await;
    }

    async fn probe(&self) -> bool {
        if self.client.connection_state() != async_nats::connection::State::Connected {
            return false;
        }
        let timeout = self.options.send_timeout.min(Duration::from_secs(5));
        matches!(
            tokio::time::timeout(timeout, self.jetstream.get_stream(&self.options.stream)).await,
            Ok(Ok(_))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::test_message as message;
    use crate::sink::FailureKind;

    fn subjects(messages: &[Message<'_>]) -> Vec<String> {
        let template = SubjectTemplate::parse(subject::DEFAULT_TEMPLATE).unwrap();
        messages
            .iter()
            .map(|m| template.subject(&m.aggregate_type, &m.key))
            .collect()
    }

    fn headers_of(message: &Message<'_>) -> Result<HeaderMap, SendError> {
        message_headers(message, &message.wire(cloudevents::NATS_PREFIX).unwrap())
    }

    #[test]
    fn headers_carry_the_contract_and_the_message_id() {
        let mut with_trace = message("e-1", "a.b c");
        with_trace
            .headers
            .push(("traceparent", "00-ab-cd-01".into()));
        let map = headers_of(&with_trace).unwrap();
        let text = |name: &str| map.get(name).map(|value| value.as_str().to_owned());
        assert_eq!(text("Nats-Msg-Id").as_deref(), Some("e-1"));
        assert_eq!(text("id").as_deref(), Some("e-1"));
        assert_eq!(text("eventType").as_deref(), Some("OrderPlaced"));
        assert_eq!(text("eventVersion").as_deref(), Some("2"));
        assert_eq!(text("aggregateSequence").as_deref(), Some("7"));
        assert_eq!(text("traceparent").as_deref(), Some("00-ab-cd-01"));
        assert_eq!(text("aggregateType").as_deref(), Some("Order"));
        assert_eq!(
            text("aggregateId").as_deref(),
            Some("a.b c"),
            "the original id"
        );
        let plain = headers_of(&message("e-2", "42")).unwrap();
        assert!(plain.get("traceparent").is_none());
    }

    #[test]
    fn a_value_no_header_can_carry_fails_for_good_instead_of_panicking() {
        for key in ["line\nbreak", "carriage\rreturn", " padded", "padded\t"] {
            let error = headers_of(&message("e-1", key)).unwrap_err();
            assert_eq!(error.kind, FailureKind::Permanent, "{key:?}");
            assert!(error.reason.contains("aggregate id"), "{}", error.reason);
        }
        assert!(headers_of(&message("e-1", "in\tside")).is_ok());
    }

    #[test]
    fn one_message_per_subject_is_in_flight_and_batch_order_is_kept() {
        let messages = [
            message("e-1", "a"),
            message("e-2", "a"),
            message("e-3", "b"),
            message("e-4", "a"),
        ];
        let mut dispatch = Dispatch::new(&messages, subjects(&messages));
        assert_eq!(dispatch.next_to_send(), Some(0));
        assert_eq!(
            dispatch.next_to_send(),
            Some(2),
            "b's first goes while a's is in flight"
        );
        assert_eq!(
            dispatch.next_to_send(),
            None,
            "a's second waits for the first PubAck"
        );
        dispatch.acked(0);
        assert_eq!(dispatch.next_to_send(), Some(1));
        assert_eq!(dispatch.next_to_send(), None);
        dispatch.acked(1);
        dispatch.acked(2);
        assert_eq!(dispatch.next_to_send(), Some(3));
        dispatch.acked(3);
        assert_eq!(dispatch.next_to_send(), None);
        let outcomes = dispatch.finish(|| SendError::transient("open"));
        assert!(outcomes.iter().all(Result::is_ok));
    }

    #[test]
    fn a_failure_holds_back_the_rest_of_its_aggregate_only() {
        let messages = [
            message("e-1", "a"),
            message("e-2", "a"),
            message("e-3", "b"),
            message("e-4", "b"),
        ];
        let mut dispatch = Dispatch::new(&messages, subjects(&messages));
        assert_eq!(dispatch.next_to_send(), Some(0));
        assert_eq!(dispatch.next_to_send(), Some(2));
        dispatch.fail(0, SendError::transient("no PubAck within 1s"));
        dispatch.acked(2);
        assert_eq!(
            dispatch.next_to_send(),
            Some(3),
            "a's second is held back, not sent"
        );
        dispatch.acked(3);
        assert_eq!(dispatch.next_to_send(), None);
        let outcomes = dispatch.finish(|| SendError::transient("open"));
        assert_eq!(
            outcomes[0].clone().unwrap_err().kind,
            FailureKind::Transient
        );
        assert_eq!(outcomes[1].clone().unwrap_err().kind, FailureKind::HeldBack);
        assert_eq!(outcomes[2], Ok(()));
        assert_eq!(outcomes[3], Ok(()));
    }

    #[test]
    fn messages_left_when_sending_stops_fail_with_the_reason() {
        let messages = [
            message("e-1", "a"),
            message("e-2", "a"),
            message("e-3", "b"),
        ];
        let mut dispatch = Dispatch::new(&messages, subjects(&messages));
        assert_eq!(dispatch.next_to_send(), Some(0));
        dispatch.fail(0, SendError::transient("connection lost"));
        let outcomes = dispatch.finish(|| SendError::transient("no PubAck within 1s"));
        assert_eq!(outcomes[1].clone().unwrap_err().kind, FailureKind::HeldBack);
        assert_eq!(
            outcomes[2].clone().unwrap_err().reason,
            "no PubAck within 1s"
        );
    }

    #[test]
    fn the_duplicate_window_must_exceed_the_longest_resend_gap() {
        let bound = ResendBound {
            longest: Duration::from_secs(61),
            made_of: "--send-timeout 30s + 30s backoff cap + --poll-interval 1s".into(),
        };
        assert!(check_duplicate_window("OUTBOX", Duration::from_secs(120), &bound).is_ok());
        let error = check_duplicate_window("OUTBOX", Duration::from_secs(60), &bound)
            .unwrap_err()
            .to_string();
        assert!(!error.contains('\n'));
        assert!(error.contains("duplicate window of 1m"), "{error}");
        assert!(
            error.contains("up to 1m 1s later (--send-timeout 30s"),
            "{error}"
        );
        assert!(check_duplicate_window("OUTBOX", Duration::from_secs(61), &bound).is_err());
        assert_eq!(created_duplicate_window(&bound), Duration::from_secs(122));
        let short = ResendBound {
            longest: Duration::from_secs(5),
            made_of: String::new(),
        };
        assert_eq!(
            created_duplicate_window(&short),
            MIN_CREATED_DUPLICATE_WINDOW
        );
    }

    #[test]
    fn urls_and_stream_names_are_checked_without_echoing_secrets() {
        assert!(check_url("nats://127.0.0.1:4222").is_ok());
        assert!(check_url("127.0.0.1:4222").is_ok());
        assert!(check_url("tls://user:pw@nats.example:4222").is_ok());
        let error = check_url("nats://user:s3cret@host:notaport").unwrap_err();
        assert!(
            error.starts_with("not a URL") && !error.contains("s3cret"),
            "{error}"
        );
        let error = check_url("amqp://user:s3cret@host:5672").unwrap_err();
        assert!(
            error.contains("amqp://") && !error.contains("s3cret"),
            "{error}"
        );
        assert!(check_url("").is_err());
        assert_eq!(
            endpoint("nats://u:p@a:4222, nats://b"),
            "nats://a:4222,nats://b:4222"
        );
        for bad in ["", "A B", "A.B", "A*", "A>", "A/B"] {
            assert!(check_stream_name(bad).is_err(), "{bad:?}");
        }
    }
}
