//! The recorded contract as documents other tools read: a JSON Schema
//! (2020-12) of every recorded event version, and an AsyncAPI 3 document
//! with a channel per aggregate type's topic and a message per event
//! version. `cargo outbox schema` prints them.
//!
//! Both are made from the lock, not from the sources: they describe what
//! was published, every version of it, in the JSON serde writes. A field
//! is required unless it is an `Option`, has `#[serde(default)]` or may be
//! left out (`skip_serializing_if`); `Option<T>` is `T` or `null`; enums
//! follow their serde representation. Objects allow other keys, as a
//! reader built with serde does. A type the lock names but does not
//! describe (an opaque field, a generic parameter, a foreign type outside
//! the well-known ones) accepts any JSON.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};
use syn::Type;

use crate::schema_lock::{EventEntry, FieldEntry, Lock, TypeEntry, VariantEntry};
use crate::shape::Kind;
use crate::ty;

/// The JSON Schema dialect of [`json_schema`].
pub const JSON_SCHEMA_2020_12: &str = "https://json-schema.org/draft/2020-12/schema";

/// The relay's default topic template.
pub const DEFAULT_TOPIC_TEMPLATE: &str = "outbox.event.{aggregatetype}";

/// Headers the relay always sets on a message, with the event's version.
const HEADERS_ALWAYS: [&str; 3] = ["id", "eventType", "eventVersion"];

/// The JSON Schema dialects the documents use.
#[derive(Clone, Copy)]
enum Dialect {
    /// 2020-12: `$defs`, `prefixItems`.
    Draft2020,
    /// AsyncAPI's default schema format, a superset of draft-07:
    /// `definitions`, `items` as an array.
    Draft07,
}

impl Dialect {
    fn defs(self) -> &'static str {
        match self {
            Dialect::Draft2020 => "$defs",
            Dialect::Draft07 => "definitions",
        }
    }

    /// A JSON array of exactly `items`, in order.
    fn tuple(self, items: Vec<Value>) -> Value {
        let len = items.len();
        match self {
            Dialect::Draft2020 => json!({
                "type": "array",
                "prefixItems": items,
                "items": false,
                "minItems": len,
            }),
            Dialect::Draft07 => json!({
                "type": "array",
                "items": items,
                "additionalItems": false,
                "minItems": len,
            }),
        }
    }
}

/// `OrderPlaced.v1`: where an event version is kept in the documents.
pub fn key(entry: &EventEntry) -> String {
    format!("{}.v{}", entry.event, entry.version)
}

/// A JSON Schema (2020-12) document of every event version in `lock`:
/// each under `$defs` by [`key`], the document itself matching a payload
/// of any of them. `title` names the producer.
pub fn json_schema(lock: &Lock, title: &str) -> Value {
    let mut defs = Map::new();
    for entry in &lock.events {
        let at = format!("#/$defs/{}", pointer_token(&key(entry)));
        defs.insert(key(entry), event_schema(entry, &at, Dialect::Draft2020));
    }
    let any_of: Vec<Value> = lock
        .events
        .iter()
        .map(|entry| json!({ "$ref": format!("#/$defs/{}", pointer_token(&key(entry))) }))
        .collect();
    let mut document = json!({
        "$schema": JSON_SCHEMA_2020_12,
        "title": title,
        "description": "The payload of every recorded event version, as outbox.lock records it.",
        "$defs": defs,
    });
    if !any_of.is_empty() {
        document["anyOf"] = Value::Array(any_of);
    }
    document
}

/// An AsyncAPI 3.0 document of every event version in `lock`: a channel
/// per aggregate type, at the topic `topic_template` names for it (the
/// relay's `--topic-template`), a message per event version with the
/// headers the relay sets and its payload's schema, and a `send`
/// operation per channel. `title` and `version` describe the producer.
pub fn asyncapi(lock: &Lock, title: &str, version: &str, topic_template: &str) -> Value {
    let mut by_aggregate: BTreeMap<&str, Vec<&EventEntry>> = BTreeMap::new();
    for entry in &lock.events {
        by_aggregate
            .entry(&entry.aggregate)
            .or_default()
            .push(entry);
    }
    let mut channels = Map::new();
    let mut operations = Map::new();
    let mut messages = Map::new();
    let mut schemas = Map::new();
    for (aggregate, entries) in &by_aggregate {
        let channel = pointer_token(aggregate);
        let mut channel_messages = Map::new();
        let mut sent = Vec::new();
        for entry in entries {
            let key = key(entry);
            let token = pointer_token(&key);
            let at = format!("#/components/schemas/{token}");
            schemas.insert(key.clone(), event_schema(entry, &at, Dialect::Draft07));
            messages.insert(key.clone(), message(entry, &at));
            channel_messages.insert(
                key.clone(),
                json!({ "$ref": format!("#/components/messages/{token}") }),
            );
            sent.push(json!({ "$ref": format!("#/channels/{channel}/messages/{token}") }));
        }
        channels.insert(
            (*aggregate).to_owned(),
            json!({
                "address": topic_template.replace("{aggregatetype}", aggregate),
                "title": format!("{aggregate} events"),
                "messages": channel_messages,
            }),
        );
        operations.insert(
            format!("send{aggregate}"),
            json!({
                "action": "send",
                "channel": { "$ref": format!("#/channels/{channel}") },
                "summary": format!("The outbox relay publishes {aggregate} events."),
                "messages": sent,
            }),
        );
    }
    json!({
        "asyncapi": "3.0.0",
        "info": {
            "title": title,
            "version": version,
            "description": "Events published through the transactional outbox: every recorded version, as outbox.lock records it.",
        },
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": { "messages": messages, "schemas": schemas },
    })
}

/// `OrderPlaced v1`.
fn title(entry: &EventEntry) -> String {
    format!("{} v{}", entry.event, entry.version)
}

/// The message of one event version: headers, payload, Kafka key.
fn message(entry: &EventEntry, schema_at: &str) -> Value {
    let headers = json!({
        "type": "object",
        "properties": {
            "id": { "type": "string", "format": "uuid", "description": "The event id; consumers deduplicate by it." },
            "eventType": { "const": entry.event },
            "eventVersion": { "const": entry.version.to_string() },
            "aggregateSequence": { "type": "string", "pattern": "^[0-9]+$", "description": "The event's place among its aggregate's events, where recorded." },
            "traceparent": { "type": "string", "description": "W3C trace context, where recorded." },
            "aggregateType": { "const": entry.aggregate, "description": "RabbitMQ and NATS only." },
            "aggregateId": { "type": "string", "description": "RabbitMQ and NATS only." },
        },
        "required": HEADERS_ALWAYS,
    });
    json!({
        "name": entry.event,
        "title": title(entry),
        "contentType": "application/json",
        "headers": headers,
        "payload": { "$ref": schema_at },
        "bindings": {
            "kafka": {
                "key": { "type": "string", "description": "The aggregate id." },
                "bindingVersion": "0.5.0",
            }
        },
    })
}

/// The schema of one event version; `at` is the JSON pointer (as a URI
/// fragment) where the document keeps it, which its nested types' `$ref`s
/// start from.
fn event_schema(entry: &EventEntry, at: &str, dialect: Dialect) -> Value {
    let writer = Writer {
        types: &entry.types,
        defs_at: format!("{at}/{}", dialect.defs()),
        dialect,
    };
    let mut schema = writer.object(&entry.fields);
    schema.insert("title".into(), json!(title(entry)));
    schema.insert("x-event-type".into(), json!(entry.event));
    schema.insert("x-event-version".into(), json!(entry.version));
    schema.insert("x-aggregate-type".into(), json!(entry.aggregate));
    if !entry.types.is_empty() {
        let defs: Map<String, Value> = entry
            .types
            .iter()
            .map(|(name, entry)| (name.clone(), writer.payload_type(name, entry)))
            .collect();
        schema.insert(dialect.defs().into(), Value::Object(defs));
    }
    Value::Object(schema)
}

/// Writes the schemas of one event version's fields and payload types.
struct Writer<'a> {
    types: &'a BTreeMap<String, TypeEntry>,
    /// Where the event's payload types are kept, as a URI fragment.
    defs_at: String,
    dialect: Dialect,
}

impl Writer<'_> {
    /// A JSON object of `fields`.
    fn object(&self, fields: &[FieldEntry]) -> Map<String, Value> {
        let mut properties = Map::new();
        let mut required = Vec::new();
        let mut all_of = Vec::new();
        for field in fields {
            if field.flatten {
                // A flattened struct's keys are this object's keys; a
                // flattened map or `Option` takes any other keys.
                let wire = parse(&ty::wire_of(&field.ty));
                if let Some(Type::Path(path)) = &wire
                    && let Some(last) = path.path.segments.last()
                    && self.types.contains_key(&last.ident.to_string())
                {
                    all_of.push(self.field(field));
                }
                continue;
            }
            properties.insert(field.name.clone(), self.field(field));
            if !(field.optional || field.default || field.omittable) {
                required.push(json!(field.name));
            }
        }
        let mut object = Map::new();
        object.insert("type".into(), json!("object"));
        object.insert("properties".into(), Value::Object(properties));
        if !required.is_empty() {
            object.insert("required".into(), Value::Array(required));
        }
        if !all_of.is_empty() {
            object.insert("allOf".into(), Value::Array(all_of));
        }
        object
    }

    /// The schema of a field's value.
    fn field(&self, field: &FieldEntry) -> Value {
        if field.opaque {
            return json!({ "description": format!("{}, opaque to the contract", field.ty) });
        }
        match parse(&ty::wire_of(&field.ty)) {
            Some(ty) => self.ty(&ty),
            None => undescribed(&field.ty),
        }
    }

    /// The schema of a value of type `ty`, spelled as [`ty::wire`] spells it.
    fn ty(&self, ty: &Type) -> Value {
        match ty {
            Type::Tuple(tuple) if tuple.elems.is_empty() => json!({ "type": "null" }),
            Type::Tuple(tuple) => self
                .dialect
                .tuple(tuple.elems.iter().map(|elem| self.ty(elem)).collect()),
            Type::Array(array) => {
                let mut schema = json!({ "type": "array", "items": self.ty(&array.elem) });
                if let syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Int(len),
                    ..
                }) = &array.len
                    && let Ok(len) = len.base10_parse::<u64>()
                {
                    schema["minItems"] = json!(len);
                    schema["maxItems"] = json!(len);
                }
                schema
            }
            Type::Path(path) if path.qself.is_none() => match path.path.segments.last() {
                Some(last) => self.named(&last.ident.to_string(), &ty::type_args(last)),
                None => undescribed(&ty::normalize(ty)),
            },
            other => undescribed(&ty::normalize(other)),
        }
    }

    /// The schema of the type `name<args>`.
    fn named(&self, name: &str, args: &[&Type]) -> Value {
        match (name, args) {
            ("Option", [inner]) => json!({ "anyOf": [self.ty(inner), { "type": "null" }] }),
            ("Vec" | "SmallVec" | "ArrayVec", [element, ..]) => {
                json!({ "type": "array", "items": self.ty(element) })
            }
            ("Map", [_, value]) => {
                json!({ "type": "object", "additionalProperties": self.ty(value) })
            }
            ("Result", [ok, error]) => json!({
                "oneOf": [
                    external_variant("Ok", self.ty(ok)),
                    external_variant("Err", self.ty(error)),
                ]
            }),
            ("Range" | "RangeInclusive", [bound]) => json!({
                "type": "object",
                "properties": { "start": self.ty(bound), "end": self.ty(bound) },
                "required": ["start", "end"],
            }),
            _ if self.types.contains_key(name) => {
                json!({ "$ref": format!("{}/{}", self.defs_at, pointer_token(name)) })
            }
            (leaf, _) => well_known(leaf).unwrap_or_else(|| undescribed(leaf)),
        }
    }

    /// The schema of the payload type `name`.
    fn payload_type(&self, name: &str, entry: &TypeEntry) -> Value {
        let mut schema = match entry.kind {
            Kind::Enum => self.enumeration(entry),
            Kind::Unit => json!({ "type": "null" }),
            _ if entry.repr.as_deref() == Some("transparent") || entry.kind == Kind::Tuple => {
                self.unnamed(&entry.fields)
            }
            _ => Value::Object(self.object(&entry.fields)),
        };
        schema["title"] = json!(name);
        schema
    }

    /// A newtype's value, or an array of a tuple's fields.
    fn unnamed(&self, fields: &[FieldEntry]) -> Value {
        match fields {
            [only] => self.field(only),
            fields => self
                .dialect
                .tuple(fields.iter().map(|field| self.field(field)).collect()),
        }
    }

    /// An enum in its serde representation.
    fn enumeration(&self, entry: &TypeEntry) -> Value {
        let repr = entry.repr.as_deref().unwrap_or("external");
        let (tag, content) = tag_and_content(repr);
        let alternatives: Vec<Value> = entry
            .variants
            .iter()
            .map(|variant| {
                let value = self.variant_content(variant);
                match (repr, tag, content) {
                    ("untagged", _, _) => value.unwrap_or_else(|| json!({ "type": "null" })),
                    (_, Some(tag), Some(content)) => adjacent_variant(tag, content, variant, value),
                    (_, Some(tag), None) => internal_variant(tag, variant, value),
                    _ => match value {
                        None => json!({ "const": variant.name }),
                        Some(value) => external_variant(&variant.name, value),
                    },
                }
            })
            .collect();
        match repr {
            "untagged" => json!({ "anyOf": alternatives }),
            _ => json!({ "oneOf": alternatives }),
        }
    }

    /// What a variant holds: none for a unit variant.
    fn variant_content(&self, variant: &VariantEntry) -> Option<Value> {
        match variant.kind {
            Kind::Unit => None,
            Kind::Struct => Some(Value::Object(self.object(&variant.fields))),
            _ => Some(self.unnamed(&variant.fields)),
        }
    }
}

/// The tag and content keys of a representation as the lock spells it:
/// `internal(type)`, `adjacent(type, data)`.
fn tag_and_content(repr: &str) -> (Option<&str>, Option<&str>) {
    let inside = |prefix: &str| {
        repr.strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(')'))
    };
    if let Some(tag) = inside("internal(") {
        (Some(tag.trim()), None)
    } else if let Some(keys) = inside("adjacent(") {
        match keys.split_once(',') {
            Some((tag, content)) => (Some(tag.trim()), Some(content.trim())),
            None => (Some(keys.trim()), None),
        }
    } else {
        (None, None)
    }
}

/// `{"Name": value}`, serde's default for a variant with content.
fn external_variant(name: &str, value: Value) -> Value {
    json!({
        "type": "object",
        "properties": { name: value },
        "required": [name],
        "additionalProperties": false,
    })
}

/// `{"tag": "Name", "content": value}`.
fn adjacent_variant(
    tag: &str,
    content: &str,
    variant: &VariantEntry,
    value: Option<Value>,
) -> Value {
    let mut properties = Map::new();
    properties.insert(tag.to_owned(), json!({ "const": variant.name }));
    let mut required = vec![json!(tag)];
    if let Some(value) = value {
        properties.insert(content.to_owned(), value);
        required.push(json!(content));
    }
    json!({ "type": "object", "properties": properties, "required": required })
}

/// The variant's own keys with `"tag": "Name"` among them.
fn internal_variant(tag: &str, variant: &VariantEntry, value: Option<Value>) -> Value {
    let tagged = json!({
        "type": "object",
        "properties": { tag: { "const": variant.name } },
        "required": [tag],
    });
    match value {
        None => tagged,
        Some(value) => json!({ "allOf": [tagged, value] }),
    }
}

/// The schema of a well-known leaf type, as its usual serde
/// implementation writes it; `None` for one written in several ways.
fn well_known(name: &str) -> Option<Value> {
    let integer = |minimum: Option<i128>, maximum: Option<u128>| {
        let mut schema = json!({ "type": "integer" });
        if let Some(minimum) = minimum {
            schema["minimum"] = json!(minimum);
        }
        if let Some(maximum) = maximum {
            schema["maximum"] = json!(maximum);
        }
        schema
    };
    let string = |format: Option<&str>| match format {
        Some(format) => json!({ "type": "string", "format": format }),
        None => json!({ "type": "string" }),
    };
    Some(match name {
        "bool" => json!({ "type": "boolean" }),
        "char" => json!({ "type": "string", "minLength": 1, "maxLength": 1 }),
        "String" | "PathBuf" | "Path" | "NaiveDateTime" | "NaiveTime" | "Weekday" | "Month"
        | "Ulid" | "SocketAddr" | "SocketAddrV4" | "SocketAddrV6" | "Timestamp" | "Zoned" => {
            string(None)
        }
        "i8" => integer(Some(i8::MIN.into()), Some(i8::MAX as u128)),
        "i16" => integer(Some(i16::MIN.into()), Some(i16::MAX as u128)),
        "i32" => integer(Some(i32::MIN.into()), Some(i32::MAX as u128)),
        "i64" | "isize" => integer(Some(i64::MIN.into()), Some(i64::MAX as u128)),
        "u8" => integer(Some(0), Some(u8::MAX.into())),
        "u16" => integer(Some(0), Some(u16::MAX.into())),
        "u32" => integer(Some(0), Some(u32::MAX.into())),
        "u64" | "usize" => integer(Some(0), Some(u64::MAX.into())),
        "u128" => integer(Some(0), None),
        "i128" => integer(None, None),
        "NonZeroU8" | "NonZeroU16" | "NonZeroU32" | "NonZeroU64" | "NonZeroU128"
        | "NonZeroUsize" => integer(Some(1), None),
        "NonZeroI8" | "NonZeroI16" | "NonZeroI32" | "NonZeroI64" | "NonZeroI128"
        | "NonZeroIsize" => json!({ "type": "integer", "not": { "const": 0 } }),
        "f32" | "f64" | "Number" => json!({ "type": "number" }),
        "PhantomData" => json!({ "type": "null" }),
        "Duration" => json!({
            "type": "object",
            "properties": { "secs": integer(Some(0), None), "nanos": integer(Some(0), None) },
            "required": ["secs", "nanos"],
        }),
        "SystemTime" => json!({
            "type": "object",
            "properties": {
                "secs_since_epoch": integer(Some(0), None),
                "nanos_since_epoch": integer(Some(0), None),
            },
            "required": ["secs_since_epoch", "nanos_since_epoch"],
        }),
        "DateTime" => string(Some("date-time")),
        "NaiveDate" => string(Some("date")),
        "Uuid" => string(Some("uuid")),
        "Url" => string(Some("uri")),
        "Ipv4Addr" => string(Some("ipv4")),
        "Ipv6Addr" => string(Some("ipv6")),
        "IpAddr" => json!({ "anyOf": [string(Some("ipv4")), string(Some("ipv6"))] }),
        // A string by default; a number with their float features.
        "Decimal" | "BigDecimal" => json!({ "type": ["string", "number"] }),
        "Bytes" | "ByteBuf" | "ByteArray" => {
            json!({ "type": "array", "items": integer(Some(0), Some(255)) })
        }
        "Value" | "RawValue" => json!({}),
        _ => return None,
    })
}

/// Any JSON, saying which type it stands for.
fn undescribed(ty: &str) -> Value {
    json!({ "description": format!("written by {ty}, which the lock does not describe") })
}

fn parse(spelling: &str) -> Option<Type> {
    syn::parse_str(spelling).ok()
}

/// `name` as one reference token of a JSON pointer inside a URI fragment
/// (RFC 6901): `~` and `/` escaped, then what a fragment may not hold
/// percent-encoded.
fn pointer_token(name: &str) -> String {
    let escaped = name.replace('~', "~0").replace('/', "~1");
    let mut token = String::with_capacity(escaped.len());
    for byte in escaped.bytes() {
        let plain = byte.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@".contains(&byte);
        if plain {
            token.push(byte as char);
        } else {
            token.push_str(&format!("%{byte:02X}"));
        }
    }
    token
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_tokens_escape_what_a_fragment_cannot_hold() {
        assert_eq!(pointer_token("OrderPlaced.v1"), "OrderPlaced.v1");
        assert_eq!(pointer_token("a/b~c"), "a~1b~0c");
        assert_eq!(pointer_token("Page<T>"), "Page%3CT%3E");
    }

    #[test]
    fn representations_name_their_keys() {
        assert_eq!(tag_and_content("external"), (None, None));
        assert_eq!(tag_and_content("internal(type)"), (Some("type"), None));
        assert_eq!(tag_and_content("adjacent(t, c)"), (Some("t"), Some("c")));
    }
}
