//! The lock file: the recorded payload schema of every event version a crate
//! has published, `outbox.lock` at the crate root.
//!
//! It is TOML, sorted by event type and version, one field per line, so a
//! change reads well in a diff. `cargo outbox lock` writes it; the derive
//! only reads it. Entries are append-only: a recorded version never loses a
//! field or changes one, it only gains what is additive.
//!
//! ```toml
//! [[event]]
//! event = "OrderPlaced"
//! version = 1
//! aggregate = "Order"
//! fields = [
//!     { name = "order_id", type = "i64" },
//!     { name = "total", type = "Money" },
//!     { name = "coupon", type = "Option<String>", optional = true },
//! ]
//!
//! [event.types.Money]
//! kind = "struct"
//! fields = [
//!     { name = "cents", type = "i64" },
//! ]
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::shape::{FieldShape, Kind};

/// The lock's file name, at the crate root.
pub const LOCK_FILE: &str = "outbox.lock";

/// The environment variable that points the derive and the command at
/// another lock file (absolute, or relative to the crate root).
pub const LOCK_ENV: &str = "OUTBOX_LOCK";

/// The command that records events into the lock.
pub const RECORD_COMMAND: &str = "cargo outbox lock";

/// Where the lock of the crate at `crate_dir` is: `$OUTBOX_LOCK` if given
/// (`env_override`), else `outbox.lock` in the crate root.
pub fn lock_path(crate_dir: &Path, env_override: Option<&str>) -> PathBuf {
    match env_override.map(str::trim).filter(|path| !path.is_empty()) {
        Some(path) => crate_dir.join(path),
        None => crate_dir.join(LOCK_FILE),
    }
}

/// Which changes a recorded version accepts, in a schema registry's terms.
///
/// Every rule is transitive: a change is checked against everything
/// recorded for the version, so readers built from any state of its struct
/// read payloads written by any other.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compat {
    /// The default: readers of the current struct read every recorded
    /// payload (BACKWARD_TRANSITIVE), and readers of any recorded state
    /// read the current payloads (FORWARD_TRANSITIVE) except where an enum
    /// gained a variant: new fields are `Option` or `#[serde(default)]`,
    /// nothing recorded is removed or changed, variants may be added.
    #[default]
    Backward,
    /// FULL_TRANSITIVE: as `Backward`, and a new enum variant needs a new
    /// version too, since a reader of the recorded, closed enum fails on it.
    Full,
}

impl Compat {
    /// The value as written: `backward` or `full`.
    pub fn as_str(self) -> &'static str {
        match self {
            Compat::Backward => "backward",
            Compat::Full => "full",
        }
    }

    /// The rule written `value`, if it is one.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "backward" => Some(Compat::Backward),
            "full" => Some(Compat::Full),
            _ => None,
        }
    }
}

/// The recorded events of one crate.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lock {
    /// The crate's compatibility rule, `compat = "full"` at the top of the
    /// lock; an event's `#[domain_event(compat = "..")]` overrides it.
    /// Kept by the command, which never writes it on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compat: Option<Compat>,
    /// Every recorded (event type, version), sorted.
    #[serde(default, rename = "event")]
    pub events: Vec<EventEntry>,
}

/// The recorded schema of one version of one event type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventEntry {
    /// The event type (`DomainEvent::EVENT_TYPE`).
    pub event: String,
    /// The payload version.
    pub version: u32,
    /// The aggregate type.
    pub aggregate: String,
    /// `#[serde(rename_all = "..")]` on the event struct.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rename_all: Option<String>,
    /// The serialized fields, in declaration order.
    #[serde(default)]
    pub fields: Vec<FieldEntry>,
    /// Every payload type reachable from the fields, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub types: BTreeMap<String, TypeEntry>,
}

/// One serialized field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldEntry {
    /// The name serde writes.
    pub name: String,
    /// The Rust name, when it differs from `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rust: Option<String>,
    /// The normalized type (see `ty::normalize`).
    #[serde(rename = "type")]
    pub ty: String,
    /// The type is an `Option`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub optional: bool,
    /// The field has `#[serde(default)]`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub default: bool,
    /// The field has `#[serde(flatten)]`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub flatten: bool,
    /// The field has `#[serde(skip_serializing_if)]`: its key may be left
    /// out of the JSON.
    #[serde(default, skip_serializing_if = "is_false")]
    pub omittable: bool,
    /// The field has `#[domain_event(opaque)]`: compared by type name only.
    #[serde(default, skip_serializing_if = "is_false")]
    pub opaque: bool,
    /// Other keys a reader of the field accepts (`#[serde(alias)]`). They
    /// change nothing that is written, so the lock does not record them;
    /// `cargo outbox check` reads them from a consumer's decoders.
    #[serde(skip)]
    pub aliases: Vec<String>,
}

/// The recorded shape of a payload type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypeEntry {
    /// Struct, tuple, unit or enum.
    pub kind: Kind,
    /// `#[serde(rename_all = "..")]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rename_all: Option<String>,
    /// An enum's representation (see `TypeShape::repr`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repr: Option<String>,
    /// A struct's fields.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<FieldEntry>,
    /// An enum's variants.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<VariantEntry>,
    /// Set on the recorded enums of an event checked under `compat =
    /// "full"` (see [`EventEntry::under`]), never written: its variants are
    /// all its readers know.
    #[serde(skip)]
    pub closed: bool,
}

/// One serialized enum variant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantEntry {
    /// The name serde writes.
    pub name: String,
    /// The Rust name, when it differs from `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rust: Option<String>,
    /// Unit, tuple or struct variant.
    pub kind: Kind,
    /// The variant's fields.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<FieldEntry>,
    /// `#[serde(other)]`: readers read any variant they do not know as
    /// this one, so the enum is open to new variants.
    #[serde(default, skip_serializing_if = "is_false")]
    pub other: bool,
    /// Other names a reader accepts for the variant (`#[serde(alias)]`);
    /// not recorded, like a field's.
    #[serde(skip)]
    pub aliases: Vec<String>,
}

fn is_false(value: &bool) -> bool {
    !value
}

impl FieldEntry {
    /// The Rust field name.
    pub fn rust_name(&self) -> &str {
        self.rust.as_deref().unwrap_or(&self.name)
    }

    /// The field's own facts, without nested payload types; `wire` is
    /// `ty::wire_of(&self.ty)`, which the caller keeps.
    pub fn shape<'a>(&'a self, wire: &'a str) -> FieldShape<'a> {
        FieldShape {
            name: &self.name,
            rust_name: self.rust_name(),
            ty: &self.ty,
            wire,
            optional: self.optional,
            default: self.default,
            flatten: self.flatten,
            omittable: self.omittable,
            types: &[],
        }
    }

    /// A field read from source.
    pub fn new(name: String, rust_name: String, ty: String) -> Self {
        Self {
            rust: (rust_name != name).then_some(rust_name),
            name,
            ty,
            optional: false,
            default: false,
            flatten: false,
            omittable: false,
            opaque: false,
            aliases: Vec::new(),
        }
    }
}

impl VariantEntry {
    /// The Rust variant name.
    pub fn rust_name(&self) -> &str {
        self.rust.as_deref().unwrap_or(&self.name)
    }
}

impl EventEntry {
    /// `event` version `version`, for messages.
    pub fn title(&self) -> String {
        format!("`{}` version {}", self.event, self.version)
    }

    /// The entry as its rule `compat` compares it: under `Full` every
    /// recorded enum is closed (`TypeEntry::closed`), except an internally
    /// tagged one with a `#[serde(other)]` variant, which serde reads any
    /// new variant as. (An externally tagged enum cannot have one, and an
    /// adjacently tagged one reads only new unit variants so.)
    pub fn under(&self, compat: Compat) -> EventEntry {
        let mut entry = self.clone();
        for ty in entry.types.values_mut() {
            let internal = ty
                .repr
                .as_deref()
                .is_some_and(|r| r.starts_with("internal"));
            let open = internal && ty.variants.iter().any(|variant| variant.other);
            ty.closed = compat == Compat::Full && ty.kind == Kind::Enum && !open;
        }
        entry
    }

    /// `self`, recorded over `recorded` (the same version), with no
    /// variant gaining `other`: readers of the version built before a
    /// variant had `#[serde(other)]` do not read new variants, so an enum
    /// recorded closed stays closed. Losing it is recorded (closing is
    /// always safe).
    pub fn keeping_closed(mut self, recorded: &EventEntry) -> EventEntry {
        for (name, ty) in &mut self.types {
            let was = recorded.types.get(name);
            for variant in &mut ty.variants {
                variant.other &= was.is_some_and(|was| {
                    was.variants
                        .iter()
                        .any(|old| old.name == variant.name && old.other)
                });
            }
        }
        self
    }

    /// Whether `other` records the same JSON: equal but for the order of
    /// fields and variants and the spelling of types that write the same
    /// JSON (`Box<Money>` and `Money`), so a change that leaves the JSON as
    /// it was leaves the lock as it was. `self` is the recorded entry: a
    /// variant gaining `#[serde(other)]` leaves it as it was
    /// (`keeping_closed`), losing it does not.
    pub fn same_json(&self, other: &EventEntry) -> bool {
        let same_variant = |a: &VariantEntry, b: &VariantEntry| {
            a.rust == b.rust
                && a.kind == b.kind
                && (!a.other || b.other)
                && same_json(&a.fields, &b.fields)
        };
        let same_type = |name: &String, entry: &TypeEntry| {
            other.types.get(name).is_some_and(|theirs| {
                entry.kind == theirs.kind
                    && entry.rename_all == theirs.rename_all
                    && entry.repr == theirs.repr
                    && same_json(&entry.fields, &theirs.fields)
                    && same_by_name(&entry.variants, &theirs.variants, |v| &v.name, same_variant)
            })
        };
        self.event == other.event
            && self.version == other.version
            && self.aggregate == other.aggregate
            && self.rename_all == other.rename_all
            && same_json(&self.fields, &other.fields)
            && self.types.len() == other.types.len()
            && self
                .types
                .iter()
                .all(|(name, entry)| same_type(name, entry))
    }
}

/// The JSON the type `ty` (a normalized spelling) is written as, spelled
/// as a type: [`crate::ty::wire`], with every newtype among `types` (a
/// tuple struct of one field, or a `#[serde(transparent)]` struct) spelled
/// as what it holds. `struct Sku(String)` makes `Vec<Sku>` `Vec<String>`.
pub fn json_of(ty: &str, types: &BTreeMap<String, TypeEntry>) -> String {
    expand_newtypes(&crate::ty::wire_of(ty), types, &mut Vec::new())
}

fn expand_newtypes(
    wire: &str,
    types: &BTreeMap<String, TypeEntry>,
    within: &mut Vec<String>,
) -> String {
    let mut out = String::with_capacity(wire.len());
    let mut rest = wire;
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphanumeric() || c == '_') {
        out.push_str(&rest[..start]);
        rest = &rest[start..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let (name, after) = rest.split_at(end);
        let inner = types
            .get(name)
            .filter(|_| !after.starts_with('<') && !within.iter().any(|w| w == name))
            .and_then(TypeEntry::newtype_field);
        match inner {
            Some(field) => {
                within.push(name.to_owned());
                out.push_str(&expand_newtypes(
                    &crate::ty::wire_of(&field.ty),
                    types,
                    within,
                ));
                within.pop();
            }
            None => out.push_str(name),
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

impl TypeEntry {
    /// The one field a newtype or `#[serde(transparent)]` struct is
    /// written as, if this is one (see `TypeShape::newtype_field`).
    pub fn newtype_field(&self) -> Option<&FieldEntry> {
        let wraps_one = self.kind == Kind::Tuple || self.repr.as_deref() == Some("transparent");
        match self.fields.as_slice() {
            [only] if wraps_one && !only.flatten => Some(only),
            _ => None,
        }
    }
}

/// Whether two lists of fields record the same JSON: the same fields by
/// name in any order, equal but for the spelling of types that write the
/// same JSON (see `ty::wire`).
pub fn same_json(a: &[FieldEntry], b: &[FieldEntry]) -> bool {
    same_by_name(
        a,
        b,
        |field| &field.name,
        |a, b| {
            let spelled_alike = FieldEntry {
                ty: b.ty.clone(),
                ..a.clone()
            };
            spelled_alike == *b && crate::ty::wire_of(&a.ty) == crate::ty::wire_of(&b.ty)
        },
    )
}

/// Whether `a` and `b` hold the same items by `name`, in any order, each
/// pair `same`.
fn same_by_name<T>(
    a: &[T],
    b: &[T],
    name: impl Fn(&T) -> &String,
    same: impl Fn(&T, &T) -> bool,
) -> bool {
    a.len() == b.len()
        && a.iter().all(|x| {
            b.iter()
                .find(|y| name(y) == name(x))
                .is_some_and(|y| same(x, y))
        })
}

/// A lock file that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

impl std::error::Error for LockError {}

impl Lock {
    /// Reads the lock at `path`; `Ok(None)` if there is no such file.
    pub fn read(path: &Path) -> Result<Option<Self>, LockError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(LockError {
                    path: path.to_owned(),
                    message: error.to_string(),
                });
            }
        };
        Self::parse(&text).map(Some).map_err(|message| LockError {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses a lock file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let lock: Self = toml::from_str(text).map_err(|error| {
            let message = error.message().to_owned();
            match error.span() {
                Some(span) => {
                    let line = text[..span.start.min(text.len())].lines().count().max(1);
                    format!("line {line}: {message}")
                }
                None => message,
            }
        })?;
        let mut seen = std::collections::BTreeSet::new();
        for entry in &lock.events {
            if !seen.insert((&entry.event, entry.version)) {
                return Err(format!(
                    "{} is recorded twice; keep one entry (the one in version control)",
                    entry.title()
                ));
            }
        }
        Ok(lock)
    }

    /// The entry of `event` version `version`.
    pub fn entry(&self, event: &str, version: u32) -> Option<&EventEntry> {
        self.events
            .iter()
            .find(|entry| entry.event == event && entry.version == version)
    }

    /// The version a bump of `event` gives: one past its latest recorded
    /// version (1 for an event not recorded).
    pub fn next_version(&self, event: &str) -> u32 {
        self.versions(event)
            .last()
            .map_or(1, |entry| entry.version + 1)
    }

    /// Every recorded version of `event`, oldest first.
    pub fn versions(&self, event: &str) -> Vec<&EventEntry> {
        let mut versions: Vec<&EventEntry> = self
            .events
            .iter()
            .filter(|entry| entry.event == event)
            .collect();
        versions.sort_by_key(|entry| entry.version);
        versions
    }

    /// Records `entry`, replacing the entry of the same version if any.
    pub fn record(&mut self, entry: EventEntry) {
        self.events
            .retain(|old| !(old.event == entry.event && old.version == entry.version));
        self.events.push(entry);
        self.sort();
    }

    fn sort(&mut self) {
        self.events
            .sort_by(|a, b| (&a.event, a.version).cmp(&(&b.event, b.version)));
    }

    /// The file's text: a header, then the entries sorted by event type and
    /// version, one field per line.
    pub fn to_toml(&self) -> String {
        let mut lock = self.clone();
        lock.sort();
        let mut out = String::from(
            "# The recorded payload schema of every published event version of this crate.\n\
             # Written by `cargo outbox lock`, checked by #[derive(DomainEvent)] on every build.\n\
             # Commit it. Recorded versions are never changed: change a payload incompatibly\n\
             # by bumping the event's version.\n",
        );
        if let Some(compat) = lock.compat {
            let _ = writeln!(out, "\ncompat = {}", toml_str(compat.as_str()));
        }
        for entry in &lock.events {
            out.push_str("\n[[event]]\n");
            let _ = writeln!(out, "event = {}", toml_str(&entry.event));
            let _ = writeln!(out, "version = {}", entry.version);
            let _ = writeln!(out, "aggregate = {}", toml_str(&entry.aggregate));
            if let Some(rule) = &entry.rename_all {
                let _ = writeln!(out, "rename_all = {}", toml_str(rule));
            }
            write_fields(&mut out, &entry.fields);
            for (name, ty) in &entry.types {
                let _ = writeln!(out, "\n[event.types.{}]", toml_key(name));
                let _ = writeln!(out, "kind = {}", toml_str(ty.kind.as_str()));
                if let Some(rule) = &ty.rename_all {
                    let _ = writeln!(out, "rename_all = {}", toml_str(rule));
                }
                if let Some(repr) = &ty.repr {
                    let _ = writeln!(out, "repr = {}", toml_str(repr));
                }
                if !ty.fields.is_empty() {
                    write_fields(&mut out, &ty.fields);
                }
                if !ty.variants.is_empty() {
                    out.push_str("variants = [\n");
                    for variant in &ty.variants {
                        let mut table = vec![("name", toml_str(&variant.name))];
                        if let Some(rust) = &variant.rust {
                            table.push(("rust", toml_str(rust)));
                        }
                        table.push(("kind", toml_str(variant.kind.as_str())));
                        if !variant.fields.is_empty() {
                            let fields: Vec<String> =
                                variant.fields.iter().map(field_table).collect();
                            table.push(("fields", format!("[{}]", fields.join(", "))));
                        }
                        if variant.other {
                            table.push(("other", "true".to_owned()));
                        }
                        let _ = writeln!(out, "    {},", inline_table(&table));
                    }
                    out.push_str("]\n");
                }
            }
        }
        out
    }
}

fn write_fields(out: &mut String, fields: &[FieldEntry]) {
    if fields.is_empty() {
        out.push_str("fields = []\n");
        return;
    }
    out.push_str("fields = [\n");
    for field in fields {
        let _ = writeln!(out, "    {},", field_table(field));
    }
    out.push_str("]\n");
}

fn field_table(field: &FieldEntry) -> String {
    let mut table = vec![("name", toml_str(&field.name))];
    if let Some(rust) = &field.rust {
        table.push(("rust", toml_str(rust)));
    }
    table.push(("type", toml_str(&field.ty)));
    for (key, set) in [
        ("optional", field.optional),
        ("default", field.default),
        ("flatten", field.flatten),
        ("omittable", field.omittable),
        ("opaque", field.opaque),
    ] {
        if set {
            table.push((key, "true".to_owned()));
        }
    }
    inline_table(&table)
}

fn inline_table(pairs: &[(&str, String)]) -> String {
    let pairs: Vec<String> = pairs
        .iter()
        .map(|(key, value)| format!("{key} = {value}"))
        .collect();
    format!("{{ {} }}", pairs.join(", "))
}

/// A TOML basic string.
fn toml_str(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for ch in text.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            ch if ch.is_control() => {
                let _ = write!(out, "\\u{:04X}", ch as u32);
            }
            ch => out.push(ch),
        }
    }
    out.push('"');
    out
}

/// A TOML key: bare when it can be.
fn toml_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-');
    if bare { key.to_owned() } else { toml_str(key) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Lock {
        let mut coupon = FieldEntry::new("coupon".into(), "coupon".into(), "Option<String>".into());
        coupon.optional = true;
        let mut types = BTreeMap::new();
        types.insert(
            "Payment".to_owned(),
            TypeEntry {
                kind: Kind::Enum,
                rename_all: Some("snake_case".into()),
                repr: Some("internal(type)".into()),
                fields: vec![],
                variants: vec![
                    VariantEntry {
                        name: "card".into(),
                        rust: Some("Card".into()),
                        kind: Kind::Unit,
                        fields: vec![],
                        other: false,
                        aliases: Vec::new(),
                    },
                    VariantEntry {
                        name: "transfer".into(),
                        rust: Some("Transfer".into()),
                        kind: Kind::Struct,
                        fields: vec![FieldEntry::new(
                            "iban".into(),
                            "iban".into(),
                            "String".into(),
                        )],
                        other: false,
                        aliases: Vec::new(),
                    },
                ],
                closed: false,
            },
        );
        Lock {
            compat: None,
            events: vec![
                EventEntry {
                    event: "OrderPlaced".into(),
                    version: 2,
                    aggregate: "Order".into(),
                    rename_all: Some("camelCase".into()),
                    fields: vec![
                        FieldEntry::new("orderId".into(), "order_id".into(), "i64".into()),
                        FieldEntry::new("payment".into(), "payment".into(), "Payment".into()),
                        coupon,
                    ],
                    types,
                },
                EventEntry {
                    event: "OrderPlaced".into(),
                    version: 1,
                    aggregate: "Order".into(),
                    rename_all: None,
                    fields: vec![FieldEntry::new(
                        "note \"quoted\"".into(),
                        "note".into(),
                        "String".into(),
                    )],
                    types: BTreeMap::new(),
                },
            ],
        }
    }

    #[test]
    fn writes_sorted_readable_toml_that_reads_back() {
        let lock = sample();
        let text = lock.to_toml();
        let first = text.find("version = 1").unwrap();
        let second = text.find("version = 2").unwrap();
        assert!(first < second, "{text}");
        assert!(
            text.contains("    { name = \"orderId\", rust = \"order_id\", type = \"i64\" },\n")
        );
        assert!(
            text.contains("[event.types.Payment]\nkind = \"enum\"\n"),
            "{text}"
        );
        let mut sorted = lock.clone();
        sorted.sort();
        assert_eq!(Lock::parse(&text).unwrap(), sorted);
        // Writing is stable.
        assert_eq!(Lock::parse(&text).unwrap().to_toml(), text);
    }

    #[test]
    fn reports_the_line_of_a_bad_entry_and_duplicates() {
        let error = Lock::parse("[[event]]\nevent = \"A\"\nversion = \"one\"\n").unwrap_err();
        assert!(error.starts_with("line 3:"), "{error}");
        let entry = "[[event]]\nevent = \"A\"\nversion = 1\naggregate = \"X\"\nfields = []\n";
        let error = Lock::parse(&format!("{entry}{entry}")).unwrap_err();
        assert_eq!(
            error,
            "`A` version 1 is recorded twice; keep one entry (the one in version control)"
        );
    }

    #[test]
    fn the_path_may_be_overridden() {
        let root = Path::new("/crate");
        assert_eq!(lock_path(root, None), Path::new("/crate/outbox.lock"));
        assert_eq!(lock_path(root, Some(" ")), Path::new("/crate/outbox.lock"));
        assert_eq!(
            lock_path(root, Some("locks/a.lock")),
            Path::new("/crate/locks/a.lock")
        );
        assert_eq!(lock_path(root, Some("/abs.lock")), Path::new("/abs.lock"));
    }
}
