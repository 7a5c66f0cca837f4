//! Options of Debezium's Outbox Event Router that change where a message
//! goes and what its value is, under Debezium's names and with its
//! defaults, for a team moving from the router to this relay (or running
//! both): given as `--router NAME=VALUE` or in the file's `[router]`
//! table.
//!
//! - `route.by.field` (default `aggregatetype`): the column whose value
//!   routes the row: `aggregatetype`, `aggregateid`, `type`, or another
//!   column of the outbox, read as an extra column
//!   ([`crate::source::extra`]).
//! - `route.topic.regex` (default `(?<routedByValue>.*)`) and
//!   `route.topic.replacement` (default `outbox.event.${routedByValue}`):
//!   when the regex matches the whole routed-by value, the topic is the
//!   replacement with the regex's groups put in (`${name}`, `$1`, and
//!   `\$` for a dollar sign, as in Java); when it does not match, the
//!   topic is the routed-by value itself, as with Kafka Connect's
//!   `RegexRouter`.
//! - `route.tombstone.on.empty.payload` (default `false`): an empty
//!   payload becomes a tombstone (null value, same key). Taken for
//!   compatibility; on the outbox tables of this relay it changes nothing:
//!   a NULL payload is always a null value (as Debezium's router gives
//!   with a JSON converter), and `payload` holds JSON, never empty text.
//! - `table.expand.json.payload` (default `true` here, `false` in
//!   Debezium): whether the value is the payload's JSON as stored (what
//!   Debezium writes with expansion on, and what this relay always wrote)
//!   or, with `false`, a JSON string holding that JSON text (Debezium's
//!   output for a JSON column without expansion).
//!
//! - `table.fields.additional.placement` (`column:placement[:alias]`,
//!   comma-separated) and `table.fields.additional.error.on.missing`
//!   (default `true`): columns added to the outbox, as headers, as members
//!   of an envelope `{"payload": .., "<alias>": ..}`, or as the Kafka
//!   partition.
//!
//! - `table.field.event.timestamp`: a column whose value (a time, or
//!   milliseconds since the epoch) is the message timestamp.
//! - `table.field.event.id`, `table.field.event.key`,
//!   `table.field.event.payload` (defaults `id`, `aggregateid`,
//!   `payload`): the columns the message's event id, Kafka key and payload
//!   come from, for a table whose writers fill other columns than the
//!   relay's. The relay's own bookkeeping (claims, marks, per-aggregate
//!   order) still goes by `id`, `aggregatetype` and `aggregateid`.
//!
//! The topic is the Kafka topic and the RabbitMQ routing key; NATS
//! subjects have their own template (`--nats-subject`).

use std::fmt;

use regex::Regex;

use crate::record::OutboxRecord;
use crate::source::extra::{self, ExtraColumns, is_column_name};

/// The options the relay takes.
pub const OPTIONS: [&str; 11] = [
    ROUTE_BY_FIELD,
    ROUTE_TOPIC_REGEX,
    ROUTE_TOPIC_REPLACEMENT,
    ROUTE_TOMBSTONE_ON_EMPTY_PAYLOAD,
    TABLE_EXPAND_JSON_PAYLOAD,
    TABLE_FIELDS_ADDITIONAL_PLACEMENT,
    TABLE_FIELDS_ADDITIONAL_ERROR_ON_MISSING,
    TABLE_FIELD_EVENT_TIMESTAMP,
    TABLE_FIELD_EVENT_ID,
    TABLE_FIELD_EVENT_KEY,
    TABLE_FIELD_EVENT_PAYLOAD,
];

/// `table.field.event.timestamp`.
pub const TABLE_FIELD_EVENT_TIMESTAMP: &str = "table.field.event.timestamp";
/// `table.field.event.id`.
pub const TABLE_FIELD_EVENT_ID: &str = "table.field.event.id";
/// `table.field.event.key`.
pub const TABLE_FIELD_EVENT_KEY: &str = "table.field.event.key";
/// `table.field.event.payload`.
pub const TABLE_FIELD_EVENT_PAYLOAD: &str = "table.field.event.payload";

/// `table.fields.additional.placement`.
pub const TABLE_FIELDS_ADDITIONAL_PLACEMENT: &str = "table.fields.additional.placement";
/// `table.fields.additional.error.on.missing`.
pub const TABLE_FIELDS_ADDITIONAL_ERROR_ON_MISSING: &str =
    "table.fields.additional.error.on.missing";

/// `route.by.field`.
pub const ROUTE_BY_FIELD: &str = "route.by.field";
/// `route.topic.regex`.
pub const ROUTE_TOPIC_REGEX: &str = "route.topic.regex";
/// `route.topic.replacement`.
pub const ROUTE_TOPIC_REPLACEMENT: &str = "route.topic.replacement";
/// `route.tombstone.on.empty.payload`.
pub const ROUTE_TOMBSTONE_ON_EMPTY_PAYLOAD: &str = "route.tombstone.on.empty.payload";
/// `table.expand.json.payload`.
pub const TABLE_EXPAND_JSON_PAYLOAD: &str = "table.expand.json.payload";

/// The router's default regex.
pub const DEFAULT_REGEX: &str = "(?<routedByValue>.*)";
/// The router's default replacement: the relay's default topic template.
pub const DEFAULT_REPLACEMENT: &str = "outbox.event.${routedByValue}";

/// Debezium router options the relay does not take.
const NOT_TAKEN: [&str; 3] = [
    "route.topic.regex.flags",
    "table.op.invalid.behavior",
    "debezium.op.invalid.behavior",
];

/// The column a row is routed by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteBy {
    /// `aggregatetype`, the default.
    AggregateType,
    /// `aggregateid`.
    AggregateId,
    /// `type`, the event type.
    EventType,
    /// Another column of the outbox table, read as an extra column.
    Column(String),
}

impl RouteBy {
    fn parse(value: &str) -> Result<Self, String> {
        match value {
            "aggregatetype" => Ok(Self::AggregateType),
            "aggregateid" => Ok(Self::AggregateId),
            "type" => Ok(Self::EventType),
            other if is_column_name(other) => Ok(Self::Column(other.to_owned())),
            other => Err(format!(
                "{ROUTE_BY_FIELD}: {other:?} is not a column name (letters, digits and _)"
            )),
        }
    }

    /// The routed-by value of `record`; a NULL column routes by the empty
    /// text.
    fn value<'r>(&self, record: &'r OutboxRecord) -> std::borrow::Cow<'r, str> {
        match self {
            Self::AggregateType => (&record.aggregate_type).into(),
            Self::AggregateId => (&record.aggregate_id).into(),
            Self::EventType => (&record.event_type).into(),
            // The route column is the first extra column.
            Self::Column(_) => record
                .extra
                .first()
                .and_then(|value| json_text(value.as_deref()))
                .unwrap_or_default(),
        }
    }

    fn column(&self) -> &str {
        match self {
            Self::AggregateType => "aggregatetype",
            Self::AggregateId => "aggregateid",
            Self::EventType => "type",
            Self::Column(column) => column,
        }
    }
}

/// Where an additional field goes (`table.fields.additional.placement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// A header named by the alias (else the column).
    Header,
    /// A member of the value's envelope, `{"payload": .., "<alias>": ..}`.
    Envelope,
    /// The Kafka partition (a number).
    Partition,
}

/// One additional field: a column, where it goes, under which name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Additional {
    /// The column.
    pub column: String,
    /// Where its value goes.
    pub placement: Placement,
    /// The header or envelope member's name: the alias, else the column.
    pub name: String,
    /// Its index in [`OutboxRecord::extra`].
    pub index: usize,
}

/// `table.fields.additional.placement`: `column:placement[:alias]`, comma
/// separated.
fn parse_placement(value: &str) -> Result<Vec<(String, Placement, Option<String>)>, String> {
    let mut fields = Vec::new();
    for item in value
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
    {
        let parts: Vec<&str> = item.split(':').map(str::trim).collect();
        let (column, placement, alias) = match parts.as_slice() {
            [column, placement] => (*column, *placement, None),
            [column, placement, alias] => (*column, *placement, Some((*alias).to_owned())),
            _ => {
                return Err(format!(
                    "{TABLE_FIELDS_ADDITIONAL_PLACEMENT}: {item:?} is not column:placement[:alias]"
                ));
            }
        };
        if !is_column_name(column) {
            return Err(format!(
                "{TABLE_FIELDS_ADDITIONAL_PLACEMENT}: {column:?} is not a column name \
                 (letters, digits and _)"
            ));
        }
        let placement = match placement {
            "header" => Placement::Header,
            "envelope" => Placement::Envelope,
            "partition" => Placement::Partition,
            other => {
                return Err(format!(
                    "{TABLE_FIELDS_ADDITIONAL_PLACEMENT}: placement {other:?} of {column:?} is \
                     not header, envelope or partition"
                ));
            }
        };
        if alias.as_deref().is_some_and(str::is_empty) {
            return Err(format!(
                "{TABLE_FIELDS_ADDITIONAL_PLACEMENT}: the alias of {column:?} is empty"
            ));
        }
        fields.push((column.to_owned(), placement, alias));
    }
    Ok(fields)
}

/// The text of a JSON value read from an extra column: a string's
/// content, another value's JSON; `None` for NULL.
pub fn json_text(json: Option<&str>) -> Option<std::borrow::Cow<'_, str>> {
    let json = json?;
    if json == "null" {
        return None;
    }
    if json.starts_with('"') {
        return serde_json::from_str::<String>(json).ok().map(Into::into);
    }
    Some(json.into())
}

/// Where each row goes and whether an empty payload is a tombstone.
#[derive(Debug, Clone)]
pub struct Router {
    route_by: RouteBy,
    /// The regex as given, for messages.
    regex_text: String,
    /// The regex, anchored at both ends (Java's `Matcher::matches`).
    regex: Regex,
    /// The replacement in `regex`'s expansion syntax.
    replacement: String,
    /// The replacement as given, for messages.
    replacement_text: String,
    tombstone_on_empty_payload: bool,
    /// Whether the payload's JSON is the value (else a JSON string of it).
    expand_json_payload: bool,
    /// Whether any route.* option differs from its default.
    routes: bool,
    /// `table.fields.additional.placement`.
    additional: Vec<Additional>,
    /// The extra columns the claims read: the route column (if not one of
    /// the three), then the additional fields' columns, then the
    /// timestamp column.
    extra: ExtraColumns,
    /// `table.field.event.timestamp`: the index of its column in
    /// [`OutboxRecord::extra`].
    timestamp: Option<usize>,
    /// `table.field.event.id`, `.key` and `.payload` naming another
    /// column than the outbox's own: the index of that column in
    /// [`OutboxRecord::extra`].
    event_columns: EventColumns,
}

/// The columns `table.field.event.id`, `.key` and `.payload` name in
/// place of `id`, `aggregateid` and `payload`, as indexes of extra columns.
#[derive(Debug, Clone, Copy, Default)]
struct EventColumns {
    id: Option<usize>,
    key: Option<usize>,
    payload: Option<usize>,
}

impl Default for Router {
    fn default() -> Self {
        Self::from_options(&[]).expect("the defaults are valid")
    }
}

impl Router {
    /// The router of `options` (name, value), later ones winning; fails
    /// with one line on an unknown name (suggesting the closest known
    /// one), an option the relay does not take, or a bad value.
    pub fn from_options(options: &[(String, String)]) -> Result<Self, String> {
        let mut route_by = RouteBy::AggregateType;
        let mut regex_text = DEFAULT_REGEX.to_owned();
        let mut replacement_text = DEFAULT_REPLACEMENT.to_owned();
        let mut tombstone_on_empty_payload = false;
        let mut expand_json_payload = true;
        let mut placements = Vec::new();
        let mut error_on_missing = true;
        let mut timestamp_column = None;
        // (option, the outbox's own column, the column named)
        let mut event_columns: [(&str, &str, Option<String>); 3] = [
            (TABLE_FIELD_EVENT_ID, "id", None),
            (TABLE_FIELD_EVENT_KEY, "aggregateid", None),
            (TABLE_FIELD_EVENT_PAYLOAD, "payload", None),
        ];
        for (name, value) in options {
            match name.as_str() {
                ROUTE_BY_FIELD => route_by = RouteBy::parse(value)?,
                ROUTE_TOPIC_REGEX => regex_text = value.clone(),
                ROUTE_TOPIC_REPLACEMENT => replacement_text = value.clone(),
                ROUTE_TOMBSTONE_ON_EMPTY_PAYLOAD => {
                    tombstone_on_empty_payload = parse_bool(name, value)?
                }
                TABLE_EXPAND_JSON_PAYLOAD => expand_json_payload = parse_bool(name, value)?,
                TABLE_FIELDS_ADDITIONAL_PLACEMENT => placements = parse_placement(value)?,
                TABLE_FIELDS_ADDITIONAL_ERROR_ON_MISSING => {
                    error_on_missing = parse_bool(name, value)?
                }
                TABLE_FIELD_EVENT_TIMESTAMP if value.trim().is_empty() => timestamp_column = None,
                TABLE_FIELD_EVENT_TIMESTAMP if is_column_name(value.trim()) => {
                    timestamp_column = Some(value.trim().to_owned())
                }
                TABLE_FIELD_EVENT_TIMESTAMP => {
                    return Err(format!(
                        "{TABLE_FIELD_EVENT_TIMESTAMP}: {value:?} is not a column name \
                         (letters, digits and _)"
                    ));
                }
                TABLE_FIELD_EVENT_ID | TABLE_FIELD_EVENT_KEY | TABLE_FIELD_EVENT_PAYLOAD => {
                    let column = value.trim();
                    if !is_column_name(column) {
                        return Err(format!(
                            "{name}: {value:?} is not a column name (letters, digits and _)"
                        ));
                    }
                    let entry = event_columns
                        .iter_mut()
                        .find(|(option, _, _)| option == name)
                        .expect("one of the three");
                    // The outbox's own column is the default: nothing to read.
                    entry.2 = (column != entry.1).then(|| column.to_owned());
                }
                other => return Err(unknown(other)),
            }
        }
        let regex = Regex::new(&format!("^(?:{regex_text})$")).map_err(|error| {
            format!(
                "{ROUTE_TOPIC_REGEX}: not a valid regex: {}",
                error.to_string().replace('\n', " ")
            )
        })?;
        let replacement = java_replacement(&replacement_text)?;
        let routes = route_by != RouteBy::AggregateType
            || regex_text != DEFAULT_REGEX
            || replacement_text != DEFAULT_REPLACEMENT;
        let (additional, mut extra) = extra_columns(&route_by, placements, error_on_missing)?;
        let mut index_of = |column: String| {
            extra
                .columns
                .iter()
                .position(|known| *known == column)
                .unwrap_or_else(|| {
                    extra.columns.push(column);
                    extra.columns.len() - 1
                })
        };
        let timestamp = timestamp_column.map(&mut index_of);
        let [id, key, payload] = event_columns.map(|(_, _, column)| column.map(&mut index_of));
        let event_columns = EventColumns { id, key, payload };
        if extra.columns.len() > extra::MAX {
            return Err(format!(
                "the router reads at most {} columns besides the outbox's own",
                extra::MAX
            ));
        }
        Ok(Self {
            route_by,
            regex_text,
            regex,
            replacement,
            replacement_text,
            tombstone_on_empty_payload,
            expand_json_payload,
            routes,
            additional,
            extra,
            timestamp,
            event_columns,
        })
    }

    /// The event id `record`'s message carries (the `id` header, and what
    /// each sink derives from it): the `table.field.event.id` column's
    /// value as text; `None` keeps the row's own `id` (also for a NULL).
    pub fn event_id(&self, record: &OutboxRecord) -> Option<String> {
        let value = record.extra.get(self.event_columns.id?)?.as_deref();
        json_text(value).map(std::borrow::Cow::into_owned)
    }

    /// The message key from the `table.field.event.key` column: `None`
    /// without the option (the aggregate id is the key), `Some(None)` for
    /// a NULL (a message without a key, as Debezium's router sends it).
    pub fn key(&self, record: &OutboxRecord) -> Option<Option<String>> {
        let index = self.event_columns.key?;
        let value = record.extra.get(index).and_then(|value| value.as_deref());
        Some(json_text(value).map(std::borrow::Cow::into_owned))
    }

    /// The payload as stored, which the message value is made of (see
    /// [`Router::payload`]): the outbox's `payload`, or the
    /// `table.field.event.payload` column's value. A JSON column's value
    /// is its JSON text; a text column's is its text, except that with
    /// expansion on, text that is no JSON stays a JSON string (as
    /// Debezium's expansion leaves what it cannot parse).
    fn payload_of(&self, record: &OutboxRecord) -> Option<String> {
        let Some(index) = self.event_columns.payload else {
            return record.payload.clone();
        };
        let json = record.extra.get(index)?.as_deref()?;
        match serde_json::from_str::<serde_json::Value>(json) {
            Ok(serde_json::Value::Null) => None,
            Ok(serde_json::Value::String(text))
                if !self.expand_json_payload
                    || serde_json::from_str::<serde::de::IgnoredAny>(&text).is_ok() =>
            {
                Some(text)
            }
            _ => Some(json.to_owned()),
        }
    }

    /// The message timestamp of `record` in milliseconds since the epoch,
    /// from the `table.field.event.timestamp` column: a time, or a number
    /// of milliseconds; `None` (the broker's or producer's time) without
    /// the option or for a value that is neither.
    pub fn timestamp(&self, record: &OutboxRecord) -> Option<i64> {
        let value = record.extra.get(self.timestamp?)?.as_deref();
        let text = json_text(value)?;
        match text.parse::<i64>() {
            Ok(millis) => Some(millis),
            Err(_) => crate::cloudevents::parse_time(&text).map(|time| time.timestamp_millis()),
        }
    }

    /// The extra columns the claims must read for this router.
    pub fn extra_columns(&self) -> &ExtraColumns {
        &self.extra
    }

    /// Whether an additional field sets the Kafka partition.
    pub fn places_partitions(&self) -> bool {
        self.additional
            .iter()
            .any(|field| field.placement == Placement::Partition)
    }

    /// The additional fields of `record` placed in headers, (name, text);
    /// a NULL value adds no header.
    pub fn headers(&self, record: &OutboxRecord) -> Vec<(String, String)> {
        self.placed(Placement::Header)
            .filter_map(|field| {
                let value = json_text(record.extra.get(field.index)?.as_deref())?;
                Some((field.name.clone(), value.into_owned()))
            })
            .collect()
    }

    /// The Kafka partition `record`'s partition field names, if one is
    /// placed: a number from 0, else an error for the message.
    pub fn partition(&self, record: &OutboxRecord) -> Option<Result<i32, String>> {
        let field = self.placed(Placement::Partition).next()?;
        let value = record
            .extra
            .get(field.index)
            .and_then(|value| value.as_deref());
        Some(
            json_text(value)
                .and_then(|text| text.parse::<i32>().ok())
                .filter(|partition| *partition >= 0)
                .ok_or_else(|| {
                    format!(
                        "the partition column `{}` holds {}, not a partition number",
                        field.column,
                        value.unwrap_or("NULL")
                    )
                }),
        )
    }

    /// The message value: the payload (see [`Router::payload`]), in an
    /// envelope `{"payload": .., "<name>": ..}` when fields are placed
    /// there; a tombstone stays a tombstone.
    pub fn value(&self, record: &OutboxRecord) -> Option<String> {
        let payload = self.payload(&self.payload_of(record))?;
        let mut envelope = self.placed(Placement::Envelope).peekable();
        if envelope.peek().is_none() {
            return Some(payload);
        }
        let mut value = String::from("{\"payload\":");
        value.push_str(&payload);
        for field in envelope {
            let json = record
                .extra
                .get(field.index)
                .and_then(|value| value.as_deref())
                .unwrap_or("null");
            value.push(',');
            value.push_str(&serde_json::Value::String(field.name.clone()).to_string());
            value.push(':');
            value.push_str(json);
        }
        value.push('}');
        Some(value)
    }

    fn placed(&self, placement: Placement) -> impl Iterator<Item = &Additional> {
        self.additional
            .iter()
            .filter(move |field| field.placement == placement)
    }

    /// Whether any option changes the topic from the default.
    pub fn routes(&self) -> bool {
        self.routes
    }

    /// The same payload options without the routing: every row to the
    /// topic a template names (a replay's `--to`).
    pub fn without_routes(&self) -> Self {
        Self {
            routes: false,
            ..self.clone()
        }
    }

    /// The topic of a row.
    pub fn topic(&self, record: &OutboxRecord) -> String {
        let value = self.route_by.value(record);
        match self.regex.captures(&value) {
            Some(captures) => {
                let mut topic = String::new();
                captures.expand(&self.replacement, &mut topic);
                topic
            }
            None => value.into_owned(),
        }
    }

    /// The message value of a row's payload: `None` for a tombstone; the
    /// JSON as stored, or a JSON string of it without expansion.
    pub fn payload(&self, payload: &Option<String>) -> Option<String> {
        match payload {
            Some(text) if text.is_empty() && self.tombstone_on_empty_payload => None,
            Some(text) if !self.expand_json_payload => {
                Some(serde_json::Value::String(text.clone()).to_string())
            }
            other => other.clone(),
        }
    }
}

impl fmt::Display for Router {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} matching {:?} -> {:?}",
            self.route_by.column(),
            self.regex_text,
            self.replacement_text
        )?;
        if self.tombstone_on_empty_payload {
            f.write_str(", empty payloads as tombstones")?;
        }
        if !self.expand_json_payload {
            f.write_str(", payloads as JSON strings")?;
        }
        Ok(())
    }
}

/// The additional fields with their extra-column indexes, and the extra
/// columns: the route column first (when it is not one of the three),
/// then each other column once.
fn extra_columns(
    route_by: &RouteBy,
    placements: Vec<(String, Placement, Option<String>)>,
    error_on_missing: bool,
) -> Result<(Vec<Additional>, ExtraColumns), String> {
    let mut columns: Vec<String> = match route_by {
        RouteBy::Column(column) => vec![column.clone()],
        _ => Vec::new(),
    };
    let mut additional = Vec::new();
    for (column, placement, alias) in placements {
        let index = match columns.iter().position(|known| *known == column) {
            Some(index) => index,
            None => {
                columns.push(column.clone());
                columns.len() - 1
            }
        };
        if placement == Placement::Partition
            && additional
                .iter()
                .any(|field: &Additional| field.placement == Placement::Partition)
        {
            return Err(format!(
                "{TABLE_FIELDS_ADDITIONAL_PLACEMENT}: one column sets the partition, not two"
            ));
        }
        additional.push(Additional {
            name: alias.unwrap_or_else(|| column.clone()),
            column,
            placement,
            index,
        });
    }
    if columns.len() > extra::MAX {
        return Err(format!(
            "{TABLE_FIELDS_ADDITIONAL_PLACEMENT}: at most {} columns",
            extra::MAX
        ));
    }
    Ok((
        additional,
        ExtraColumns {
            columns,
            error_on_missing,
        },
    ))
}

fn parse_bool(name: &str, value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{name}: expected true or false, not {value:?}")),
    }
}

/// The error for an option the relay does not know or does not take.
fn unknown(name: &str) -> String {
    if NOT_TAKEN.contains(&name) {
        return format!(
            "router option {name:?} is not supported: it concerns Kafka Connect's \
             records or Java regex flags, which the relay has none of; it takes {}",
            OPTIONS.join(", ")
        );
    }
    let closest = OPTIONS
        .iter()
        .chain(NOT_TAKEN.iter())
        .map(|known| (strsim::levenshtein(name, known), *known))
        .min()
        .filter(|(distance, _)| *distance <= 4);
    match closest {
        Some((_, known)) if OPTIONS.contains(&known) => {
            format!("unknown router option {name:?}; did you mean {known:?}?")
        }
        _ => format!(
            "unknown router option {name:?}; the relay takes {}",
            OPTIONS.join(", ")
        ),
    }
}

/// A Java `Matcher` replacement (`${name}`, `$1`, `\$`, `\\`) in the
/// syntax of [`regex::Captures::expand`].
fn java_replacement(java: &str) -> Result<String, String> {
    let mut out = String::with_capacity(java.len());
    let mut chars = java.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('$') => out.push_str("$$"),
                Some(escaped) => out.push(escaped),
                None => {
                    return Err(format!(
                        "{ROUTE_TOPIC_REPLACEMENT}: a trailing backslash escapes nothing"
                    ));
                }
            },
            '$' => match chars.peek() {
                Some('{') => {
                    out.push('$');
                    for c in chars.by_ref() {
                        out.push(c);
                        if c == '}' {
                            break;
                        }
                    }
                    if !out.ends_with('}') {
                        return Err(format!(
                            "{ROUTE_TOPIC_REPLACEMENT}: a group reference ${{...}} is not closed"
                        ));
                    }
                }
                Some(d) if d.is_ascii_digit() => {
                    out.push_str("${");
                    while let Some(d) = chars.next_if(char::is_ascii_digit) {
                        out.push(d);
                    }
                    out.push('}');
                }
                _ => {
                    return Err(format!(
                        "{ROUTE_TOPIC_REPLACEMENT}: a $ must start a group reference \
                         (${{name}} or $1); write \\$ for a dollar sign"
                    ));
                }
            },
            other => out.push(other),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::test_record;

    fn options(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect()
    }

    fn row(aggregate_type: &str, aggregate_id: &str, event_type: &str) -> OutboxRecord {
        let mut row = test_record("e-1", aggregate_id, 0);
        row.aggregate_type = aggregate_type.into();
        row.event_type = event_type.into();
        row
    }

    #[test]
    fn the_defaults_route_as_the_default_topic_template() {
        let router = Router::default();
        assert!(!router.routes());
        assert_eq!(
            router.topic(&row("Order", "42", "OrderPlaced")),
            "outbox.event.Order"
        );
    }

    #[test]
    fn a_regex_and_replacement_route_as_debeziums_examples() {
        let router = Router::from_options(&options(&[
            (ROUTE_TOPIC_REGEX, "(?<routedByValue>.*)"),
            (ROUTE_TOPIC_REPLACEMENT, "${routedByValue}.events"),
        ]))
        .unwrap();
        assert_eq!(
            router.topic(&row("customers", "1", "x")),
            "customers.events"
        );

        let by_type = Router::from_options(&options(&[
            (ROUTE_BY_FIELD, "type"),
            (ROUTE_TOPIC_REGEX, "(Order|Invoice)(.*)"),
            (ROUTE_TOPIC_REPLACEMENT, "billing.$1.\\$v2"),
        ]))
        .unwrap();
        assert!(by_type.routes());
        assert_eq!(
            by_type.topic(&row("Order", "1", "OrderPlaced")),
            "billing.Order.$v2"
        );
        // No match: the routed-by value itself, as Kafka Connect's RegexRouter.
        assert_eq!(by_type.topic(&row("Order", "1", "Shipped")), "Shipped");
    }

    #[test]
    fn the_regex_must_match_the_whole_value() {
        let router = Router::from_options(&options(&[
            (ROUTE_TOPIC_REGEX, "Ord"),
            (ROUTE_TOPIC_REPLACEMENT, "matched"),
        ]))
        .unwrap();
        assert_eq!(router.topic(&row("Order", "1", "x")), "Order");
        assert_eq!(router.topic(&row("Ord", "1", "x")), "matched");
    }

    #[test]
    fn empty_payloads_become_tombstones_only_when_asked() {
        let default = Router::default();
        assert_eq!(default.payload(&Some(String::new())), Some(String::new()));
        assert_eq!(default.payload(&None), None);
        let tombstones =
            Router::from_options(&options(&[(ROUTE_TOMBSTONE_ON_EMPTY_PAYLOAD, "true")])).unwrap();
        assert!(!tombstones.routes());
        assert_eq!(tombstones.payload(&Some(String::new())), None);
        assert_eq!(tombstones.payload(&Some("{}".into())), Some("{}".into()));
    }

    #[test]
    fn without_expansion_the_value_is_a_json_string_of_the_payload() {
        let expanded = Router::default();
        assert_eq!(
            expanded.payload(&Some(r#"{"a":"b"}"#.into())),
            Some(r#"{"a":"b"}"#.into())
        );
        let strings =
            Router::from_options(&options(&[(TABLE_EXPAND_JSON_PAYLOAD, "false")])).unwrap();
        assert!(!strings.routes());
        assert_eq!(
            strings.payload(&Some(r#"{"a":"b"}"#.into())),
            Some(r#""{\"a\":\"b\"}""#.into())
        );
        assert_eq!(
            strings.payload(&None),
            None,
            "a NULL payload stays a tombstone"
        );
    }

    #[test]
    fn the_timestamp_column_gives_times_and_epoch_milliseconds() {
        let router =
            Router::from_options(&options(&[(TABLE_FIELD_EVENT_TIMESTAMP, "at")])).unwrap();
        assert_eq!(router.extra_columns().columns, ["at"]);
        let mut record = test_record("e-1", "42", 0);
        for (json, millis) in [
            (
                r#""2026-12-03T15:57:31.123456+00:00""#,
                Some(1_796_313_451_123),
            ),
            (r#""2026-12-03 15:57:31.123456""#, Some(1_796_313_451_123)),
            ("1796313451123", Some(1_796_313_451_123)),
            (r#""not a time""#, None),
            ("null", None),
        ] {
            record.extra = vec![Some(json.to_owned())];
            assert_eq!(router.timestamp(&record), millis, "{json}");
        }
        assert_eq!(Router::default().timestamp(&record), None);
    }

    #[test]
    fn the_event_columns_give_the_id_key_and_payload() {
        let router = Router::from_options(&options(&[
            (TABLE_FIELD_EVENT_ID, "event_uuid"),
            (TABLE_FIELD_EVENT_KEY, "partition_key"),
            (TABLE_FIELD_EVENT_PAYLOAD, "body"),
        ]))
        .unwrap();
        assert_eq!(
            router.extra_columns().columns,
            ["event_uuid", "partition_key", "body"]
        );
        let mut record = test_record("e-1", "42", 0);
        record.extra = vec![
            Some(r#""legacy-7""#.into()),
            Some(r#""tenant-3""#.into()),
            Some(r#"{"total": 10}"#.into()),
        ];
        assert_eq!(router.event_id(&record).as_deref(), Some("legacy-7"));
        assert_eq!(router.key(&record), Some(Some("tenant-3".into())));
        assert_eq!(router.value(&record).as_deref(), Some(r#"{"total": 10}"#));
        // A text column holding JSON is expanded; text that is none stays
        // a string; a NULL key is no key, a NULL payload a tombstone, a
        // NULL id the row's own.
        record.extra = vec![None, None, Some(r#""{\"total\": 11}""#.into())];
        assert_eq!(router.event_id(&record), None);
        assert_eq!(router.key(&record), Some(None));
        assert_eq!(router.value(&record).as_deref(), Some(r#"{"total": 11}"#));
        record.extra[2] = Some(r#""plain text""#.into());
        assert_eq!(router.value(&record).as_deref(), Some(r#""plain text""#));
        record.extra[2] = None;
        assert_eq!(router.value(&record), None);
        // Without expansion, the value is a JSON string of the text.
        let unexpanded = Router::from_options(&options(&[
            (TABLE_FIELD_EVENT_PAYLOAD, "body"),
            (TABLE_EXPAND_JSON_PAYLOAD, "false"),
        ]))
        .unwrap();
        record.extra = vec![Some(r#""plain text""#.into())];
        assert_eq!(
            unexpanded.value(&record).as_deref(),
            Some(r#""plain text""#)
        );
        record.extra = vec![Some(r#"{"total": 12}"#.into())];
        assert_eq!(
            unexpanded.value(&record).as_deref(),
            Some(r#""{\"total\": 12}""#)
        );
        // The outbox's own columns read nothing extra.
        let defaults = Router::from_options(&options(&[
            (TABLE_FIELD_EVENT_ID, "id"),
            (TABLE_FIELD_EVENT_KEY, "aggregateid"),
            (TABLE_FIELD_EVENT_PAYLOAD, "payload"),
        ]))
        .unwrap();
        assert!(defaults.extra_columns().columns.is_empty());
        assert_eq!(defaults.key(&record), None);
        assert_eq!(defaults.event_id(&record), None);
    }

    #[test]
    fn unknown_and_bad_options_are_refused_in_one_line() {
        let error = |pairs: &[(&str, &str)]| Router::from_options(&options(pairs)).unwrap_err();
        assert_eq!(
            error(&[("route.topic.regx", "x")]),
            "unknown router option \"route.topic.regx\"; did you mean \"route.topic.regex\"?"
        );
        assert!(error(&[("compression", "x")]).starts_with(
            "unknown router option \"compression\"; the relay takes route.by.field, "
        ));
        assert!(
            error(&[("route.topic.regex.flags", "i")])
                .starts_with("router option \"route.topic.regex.flags\" is not supported")
        );
        assert_eq!(
            error(&[(TABLE_FIELD_EVENT_KEY, "order key")]),
            "table.field.event.key: \"order key\" is not a column name (letters, digits and _)"
        );
        assert_eq!(
            error(&[(ROUTE_BY_FIELD, "ten ant")]),
            "route.by.field: \"ten ant\" is not a column name (letters, digits and _)"
        );
        assert!(
            error(&[(ROUTE_TOPIC_REGEX, "(")]).starts_with("route.topic.regex: not a valid regex")
        );
        assert!(error(&[(ROUTE_TOPIC_REPLACEMENT, "a$b")]).contains("write \\$ for a dollar sign"));
        assert_eq!(
            error(&[(ROUTE_TOMBSTONE_ON_EMPTY_PAYLOAD, "yes")]),
            "route.tombstone.on.empty.payload: expected true or false, not \"yes\""
        );
        for pairs in [
            &[("route.topic.regx", "x")][..],
            &[(ROUTE_TOPIC_REGEX, "(")],
            &[(ROUTE_TOPIC_REPLACEMENT, "${open")],
        ] {
            assert!(!error(pairs).contains('\n'), "{pairs:?}");
        }
    }

    #[test]
    fn java_replacements_translate() {
        assert_eq!(java_replacement("a.${x}.$12b").unwrap(), "a.${x}.${12}b");
        assert_eq!(java_replacement("\\$\\\\").unwrap(), "$$\\");
        assert!(java_replacement("trailing\\").is_err());
    }
}
