//! Options of Debezium's Outbox Event Router that change where a message
//! goes and what its value is, under Debezium's names and with its
//! defaults, for a team moving from the router to this relay (or running
//! both): given as `--router NAME=VALUE` or in the file's `[router]`
//! table.
//!
//! - `route.by.field` (default `aggregatetype`): the column whose value
//!   routes the row: `aggregatetype`, `aggregateid` or `type`.
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
//! The topic is the Kafka topic and the RabbitMQ routing key; NATS
//! subjects have their own template (`--nats-subject`). The router's
//! options about custom column names and additional fields are refused by
//! name (the relay reads its own table's columns).

use std::fmt;

use regex::Regex;

use crate::record::OutboxRecord;

/// The options the relay takes.
pub const OPTIONS: [&str; 5] = [
    ROUTE_BY_FIELD,
    ROUTE_TOPIC_REGEX,
    ROUTE_TOPIC_REPLACEMENT,
    ROUTE_TOMBSTONE_ON_EMPTY_PAYLOAD,
    TABLE_EXPAND_JSON_PAYLOAD,
];

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
const NOT_TAKEN: [&str; 9] = [
    "table.field.event.id",
    "table.field.event.key",
    "table.field.event.payload",
    "table.field.event.timestamp",
    "table.fields.additional.placement",
    "table.fields.additional.error.on.missing",
    "route.topic.regex.flags",
    "table.op.invalid.behavior",
    "debezium.op.invalid.behavior",
];

/// The column a row is routed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteBy {
    /// `aggregatetype`, the default.
    AggregateType,
    /// `aggregateid`.
    AggregateId,
    /// `type`, the event type.
    EventType,
}

impl RouteBy {
    fn parse(value: &str) -> Result<Self, String> {
        match value {
            "aggregatetype" => Ok(Self::AggregateType),
            "aggregateid" => Ok(Self::AggregateId),
            "type" => Ok(Self::EventType),
            other => Err(format!(
                "{ROUTE_BY_FIELD}: the relay routes by aggregatetype, aggregateid or type, \
                 not {other:?}"
            )),
        }
    }

    fn value(self, record: &OutboxRecord) -> &str {
        match self {
            Self::AggregateType => &record.aggregate_type,
            Self::AggregateId => &record.aggregate_id,
            Self::EventType => &record.event_type,
        }
    }

    fn column(self) -> &'static str {
        match self {
            Self::AggregateType => "aggregatetype",
            Self::AggregateId => "aggregateid",
            Self::EventType => "type",
        }
    }
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
        for (name, value) in options {
            match name.as_str() {
                ROUTE_BY_FIELD => route_by = RouteBy::parse(value)?,
                ROUTE_TOPIC_REGEX => regex_text = value.clone(),
                ROUTE_TOPIC_REPLACEMENT => replacement_text = value.clone(),
                ROUTE_TOMBSTONE_ON_EMPTY_PAYLOAD => {
                    tombstone_on_empty_payload = parse_bool(name, value)?
                }
                TABLE_EXPAND_JSON_PAYLOAD => expand_json_payload = parse_bool(name, value)?,
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
        Ok(Self {
            route_by,
            regex_text,
            regex,
            replacement,
            replacement_text,
            tombstone_on_empty_payload,
            expand_json_payload,
            routes,
        })
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
        match self.regex.captures(value) {
            Some(captures) => {
                let mut topic = String::new();
                captures.expand(&self.replacement, &mut topic);
                topic
            }
            None => value.to_owned(),
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
            "router option {name:?} is not supported: the relay reads the columns of its own \
             outbox table; it takes {}",
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
            error(&[("table.field.event.key", "k")])
                .starts_with("router option \"table.field.event.key\" is not supported")
        );
        assert_eq!(
            error(&[(ROUTE_BY_FIELD, "tenant")]),
            "route.by.field: the relay routes by aggregatetype, aggregateid or type, not \"tenant\""
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
