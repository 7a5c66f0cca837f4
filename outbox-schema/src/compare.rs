//! An event's current schema against the lock: recorded, additive, new,
//! bumped or rejected, with a message for every problem.
//!
//! The per-field rules are those of [`crate::shape`]; this module adds what
//! only an event has: versions, aggregates, and every problem at once, each
//! located so the derive can point at the field (or the version attribute
//! for removals).

use crate::schema_lock::{EventEntry, FieldEntry, Lock, RECORD_COMMAND, json_of, same_json};
use crate::shape::{Change, Message, Problem, field_problem};
use crate::ty;

/// Where in the event struct a finding belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    /// The current field at this index of `EventEntry::fields`.
    Field(usize),
    /// `version = N`.
    Version,
    /// `aggregate = ".."`.
    Aggregate,
    /// `#[serde(rename_all = "..")]` (or the struct, if there is none now).
    RenameAll,
    /// The `#[domain_event(..)]` attribute.
    Attribute,
}

/// One problem with an event against the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Where it belongs.
    pub site: Site,
    /// The full message: what changed, and the fix.
    pub message: String,
}

/// How an event stands against the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Recorded exactly as it is.
    Recorded,
    /// Recorded, and changed only additively since: compiles, and
    /// `cargo outbox lock` records the additions.
    Additive,
    /// No version of the event type is recorded.
    New,
    /// Older versions are recorded, this one is not yet.
    Bumped {
        /// The latest recorded version.
        latest: u32,
    },
    /// Changed incompatibly, or its version or aggregate is not allowed.
    Rejected,
}

/// The outcome of [`check_event`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// How the event stands.
    pub status: Status,
    /// Every problem, in field order; empty for `Recorded` and `Additive`.
    pub findings: Vec<Finding>,
    /// Fields whose type changed its spelling in a way only the payload
    /// types inside it can settle: `String` recorded, `Sku` now, which
    /// writes the same JSON if `Sku` is a newtype of `String`, or `Money`
    /// recorded and `MoneyV1` now. The derive settles them while the crate
    /// compiles, the lock command with every type's shape
    /// (`shape::json_eq`).
    pub unsettled: Vec<Unsettled>,
    /// The recorded or the current struct flattens a payload type, so
    /// which keys its JSON object holds is settled as [`Verdict::unsettled`]
    /// is, comparing the two field lists as objects
    /// (`shape::object_mismatch`), with these message parts.
    pub object: Option<ObjectCheck>,
}

/// How to settle the keys of an event that flattens a payload type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectCheck {
    /// How its message starts (see [`mismatch`]).
    pub prefix: String,
    /// The fix it gives (see [`bump_fix`]).
    pub fix: String,
}

/// A field's type to compare once the payload types inside it are known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsettled {
    /// The current field at this index of `EventEntry::fields`.
    pub field: usize,
    /// The recorded field's name.
    pub recorded_field: String,
    /// The recorded JSON type (see `schema_lock::json_of`).
    pub recorded: String,
    /// The current type's wire spelling (see `ty::wire`).
    pub actual: String,
    /// The message if the two write different JSON.
    pub message: String,
    /// How a message about a change inside a payload type of the field
    /// starts (see [`mismatch`]).
    pub nested_prefix: String,
    /// The fix such a message gives (see [`bump_fix`]).
    pub fix: String,
}

/// Checks `actual` (an event's current schema, as the model reads it)
/// against `lock`, named `lock_name` in messages.
pub fn check_event(lock: &Lock, actual: &EventEntry, lock_name: &str) -> Verdict {
    let versions = lock.versions(&actual.event);
    let mut findings = Vec::new();
    let mut unsettled = Vec::new();
    let mut object = None;
    findings.extend(moved_aggregate(&versions, actual, lock_name));
    let latest = versions.iter().map(|entry| entry.version).max();
    let status = match (
        versions.iter().find(|e| e.version == actual.version),
        latest,
    ) {
        (Some(recorded), Some(latest)) => {
            let found = compare_fields(recorded, actual, latest + 1, lock_name);
            findings.extend(found.findings);
            unsettled = found.unsettled;
            object = found.object;
            if !findings.is_empty() {
                Status::Rejected
            } else if recorded.rename_all == actual.rename_all
                && same_json(&recorded.fields, &actual.fields)
            {
                Status::Recorded
            } else {
                Status::Additive
            }
        }
        (None, Some(latest)) if latest > actual.version => {
            findings.push(Finding {
                site: Site::Version,
                message: format!(
                    "{} is not recorded in {lock_name}, but version {latest} is: versions only \
                     go up, so readers never see an older version with a newer meaning; use \
                     `version = {}` for a new payload",
                    actual.title(),
                    latest + 1,
                ),
            });
            Status::Rejected
        }
        (None, _) if !findings.is_empty() => Status::Rejected,
        (None, latest) => {
            let recorded = match latest {
                Some(latest) => format!(" (latest recorded: version {latest})"),
                None => String::new(),
            };
            findings.push(Finding {
                site: Site::Attribute,
                message: format!(
                    "{} is not recorded in {lock_name} yet{recorded}; run `{RECORD_COMMAND}` to \
                     record it, and commit {lock_name}",
                    actual.title(),
                ),
            });
            match latest {
                Some(latest) => Status::Bumped { latest },
                None => Status::New,
            }
        }
        (Some(_), None) => unreachable!("a recorded version implies a latest one"),
    };
    let status = if findings.iter().any(|f| f.site == Site::Aggregate) {
        Status::Rejected
    } else {
        status
    };
    Verdict {
        status,
        findings,
        unsettled,
        object,
    }
}

/// The finding for an event type recorded under another aggregate.
fn moved_aggregate(
    versions: &[&EventEntry],
    actual: &EventEntry,
    lock_name: &str,
) -> Option<Finding> {
    let other = versions
        .iter()
        .find(|entry| entry.aggregate != actual.aggregate)?;
    Some(Finding {
        site: Site::Aggregate,
        message: format!(
            "event `{}` belongs to aggregate `{}` in {lock_name} (version {}): an event type \
             cannot move to another aggregate, its consumers read `{}`'s stream; keep \
             `aggregate = \"{}\"`, or publish a new event type (another struct name, or \
             `name = \"..\"`)",
            actual.event, other.aggregate, other.version, other.aggregate, other.aggregate,
        ),
    })
}

/// How a message about an incompatible change to `recorded` starts:
/// "`E` version N no longer matches outbox.lock: ", or, for a change inside a
/// payload type nested in `field`, "... through field `f`: ".
pub fn mismatch(recorded: &EventEntry, lock_name: &str, field: Option<&str>) -> String {
    match field {
        Some(field) => format!(
            "{} no longer matches {lock_name} through field `{field}`: ",
            recorded.title()
        ),
        None => format!("{} no longer matches {lock_name}: ", recorded.title()),
    }
}

/// The fix that follows what changed: "; bump to `version = M` and run
/// `cargo outbox lock`, " (a way to keep the old shape follows).
pub fn bump_fix(next: u32) -> String {
    format!("; bump to `version = {next}` and run `{RECORD_COMMAND}`, ")
}

/// What [`compare_fields`] finds: problems, and types left to settle.
#[derive(Default)]
struct Found {
    findings: Vec<Finding>,
    unsettled: Vec<Unsettled>,
    object: Option<ObjectCheck>,
}

/// One recorded event version against the current struct, with what every
/// message about it says.
struct Versions<'e> {
    recorded: &'e EventEntry,
    actual: &'e EventEntry,
    lock_name: &'e str,
    /// How every message starts (see [`mismatch`]).
    prefix: String,
    /// The fix every message gives (see [`bump_fix`]).
    fix: String,
}

impl Versions<'_> {
    /// The message for `problem`.
    fn render(&self, problem: &Problem<'_>) -> String {
        Message::report(&self.prefix, problem, &self.fix)
            .as_str()
            .to_owned()
    }

    fn report(&self, found: &mut Found, site: Site, problem: &Problem<'_>) {
        found.findings.push(Finding {
            site,
            message: self.render(problem),
        });
    }

    /// Compares the recorded field `old` with the current field at `index`
    /// (the same name).
    fn compare_field(&self, old: &FieldEntry, index: usize, found: &mut Found) {
        let new = &self.actual.fields[index];
        let (old_json, new_json) = (
            json_of(&old.ty, &self.recorded.types),
            json_of(&new.ty, &self.actual.types),
        );
        let shape = new.shape(&new_json);
        let Some(problem) = field_problem("", "", &old.shape(&old_json), &shape) else {
            return;
        };
        if problem.change == Change::TypeChanged
            && has_payload_types(new)
            && ty::could_be(&old_json, &new_json)
        {
            found.unsettled.push(Unsettled {
                field: index,
                recorded_field: old.name.clone(),
                message: self.render(&problem),
                recorded: old_json,
                actual: new_json,
                nested_prefix: mismatch(self.recorded, self.lock_name, Some(&old.name)),
                fix: self.fix.clone(),
            });
        } else {
            self.report(found, Site::Field(index), &problem);
        }
    }

    /// Compares an event that flattens a payload type: which keys its
    /// object holds depends on the flattened types, so that is left to
    /// [`Verdict::object`]; fields kept under their name are compared here.
    fn compare_flattening(&self, found: &mut Found) {
        found.object = Some(ObjectCheck {
            prefix: self.prefix.clone(),
            fix: self.fix.clone(),
        });
        for (index, field) in self.actual.fields.iter().enumerate() {
            if let Some(old) = self
                .recorded
                .fields
                .iter()
                .find(|old| old.name == field.name)
                && old.flatten == field.flatten
            {
                self.compare_field(old, index, found);
            }
        }
    }
}

/// Pushes a finding for every incompatible change from `recorded` to
/// `actual` (the same event version), and every type change only the
/// compiler can settle. `next` is the version to bump to.
fn compare_fields(recorded: &EventEntry, actual: &EventEntry, next: u32, lock_name: &str) -> Found {
    let mut found = Found::default();
    let versions = Versions {
        recorded,
        actual,
        lock_name,
        prefix: mismatch(recorded, lock_name, None),
        fix: bump_fix(next),
    };
    if recorded.rename_all != actual.rename_all {
        let problem = Problem {
            change: Change::RenameAllChanged,
            ty: "",
            variant: "",
            item: "",
            from: recorded.rename_all.as_deref().unwrap_or(""),
            to: actual.rename_all.as_deref().unwrap_or(""),
        };
        // Every name moved; per-field findings would only repeat this one.
        versions.report(&mut found, Site::RenameAll, &problem);
        return found;
    }

    if recorded
        .fields
        .iter()
        .chain(&actual.fields)
        .any(|field| field.flatten)
    {
        versions.compare_flattening(&mut found);
        return found;
    }
    let position = |name: &str| actual.fields.iter().position(|field| field.name == name);
    let unrecorded: Vec<usize> = (0..actual.fields.len())
        .filter(|&i| {
            !recorded
                .fields
                .iter()
                .any(|r| r.name == actual.fields[i].name)
        })
        .collect();
    let mut renamed_to = Vec::new();
    for old in &recorded.fields {
        if let Some(index) = position(&old.name) {
            versions.compare_field(old, index, &mut found);
        } else {
            let (site, problem) = gone_field(old, recorded, actual, &unrecorded, &mut renamed_to);
            versions.report(&mut found, site, &problem);
        }
    }
    for index in unrecorded {
        let field = &actual.fields[index];
        if renamed_to.contains(&index) || field.shape("").tolerant() {
            continue;
        }
        let problem = Problem {
            change: Change::NewRequiredField,
            ty: "",
            variant: "",
            item: &field.name,
            from: "",
            to: "",
        };
        versions.report(&mut found, Site::Field(index), &problem);
    }
    found.findings.sort_by_key(|finding| match finding.site {
        Site::Field(index) => index,
        _ => usize::MAX,
    });
    found
}

/// Whether `field`'s type names payload types, whose shapes may make it
/// write what the recorded type wrote (a newtype of it, or a copy of the
/// recorded payload type under another name).
fn has_payload_types(field: &FieldEntry) -> bool {
    !field.opaque && !ty::payload_names_in(&field.ty, &[]).is_empty()
}

/// The finding for a recorded field gone under its name: renamed if a new
/// field (`unrecorded`, by index) has its Rust name, or is the only new
/// field of its type; else removed. `renamed_to` collects the new fields
/// taken as renames.
fn gone_field<'a>(
    old: &'a FieldEntry,
    recorded: &EventEntry,
    actual: &'a EventEntry,
    unrecorded: &[usize],
    renamed_to: &mut Vec<usize>,
) -> (Site, Problem<'a>) {
    let old_json = json_of(&old.ty, &recorded.types);
    let same_rust = unrecorded
        .iter()
        .copied()
        .find(|&i| actual.fields[i].rust_name() == old.rust_name());
    let same_type: Vec<usize> = unrecorded
        .iter()
        .copied()
        .filter(|&i| {
            json_of(&actual.fields[i].ty, &actual.types) == old_json && !renamed_to.contains(&i)
        })
        .collect();
    let renamed = same_rust.or(match same_type.as_slice() {
        [only] => Some(*only),
        _ => None,
    });
    match renamed {
        Some(index) if !renamed_to.contains(&index) => {
            renamed_to.push(index);
            let problem = Problem {
                change: Change::FieldRenamed,
                ty: "",
                variant: "",
                item: &actual.fields[index].name,
                from: &old.name,
                to: &actual.fields[index].name,
            };
            (Site::Field(index), problem)
        }
        _ => {
            let problem = Problem {
                change: Change::FieldRemoved,
                ty: "",
                variant: "",
                item: &old.name,
                from: "",
                to: "",
            };
            (Site::Version, problem)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::schema_lock::FieldEntry;

    fn field(name: &str, ty: &str) -> FieldEntry {
        let mut field = FieldEntry::new(name.into(), name.into(), ty.into());
        field.optional = ty.starts_with("Option<");
        field
    }

    fn event(version: u32, fields: Vec<FieldEntry>) -> EventEntry {
        EventEntry {
            event: "OrderPlaced".into(),
            version,
            aggregate: "Order".into(),
            rename_all: None,
            fields,
            types: BTreeMap::new(),
        }
    }

    fn lock(entries: Vec<EventEntry>) -> Lock {
        Lock {
            events: entries,
            ..Lock::default()
        }
    }

    fn v1() -> EventEntry {
        event(
            1,
            vec![field("order_id", "i64"), field("customer", "String")],
        )
    }

    fn messages(verdict: &Verdict) -> Vec<(Site, &str)> {
        verdict
            .findings
            .iter()
            .map(|finding| (finding.site, finding.message.as_str()))
            .collect()
    }

    #[test]
    fn a_recorded_event_passes_and_additive_fields_compile() {
        let lock = lock(vec![v1()]);
        let verdict = check_event(&lock, &v1(), "outbox.lock");
        assert_eq!(verdict.status, Status::Recorded);

        let mut added = v1();
        added.fields.push(field("coupon", "Option<String>"));
        let mut defaulted = field("priority", "u8");
        defaulted.default = true;
        added.fields.push(defaulted);
        let verdict = check_event(&lock, &added, "outbox.lock");
        assert_eq!(
            (verdict.status, verdict.findings.len()),
            (Status::Additive, 0)
        );
    }

    #[test]
    fn a_change_that_writes_the_same_json_leaves_the_event_recorded() {
        let recorded = event(
            1,
            vec![
                field("customer", "Box<Customer>"),
                field("lines", "Vec<Line>"),
                field("tags", "BTreeMap<String, String>"),
                field("note", "Option<Cow<str>>"),
            ],
        );
        let lock = lock(vec![recorded]);
        let actual = event(
            1,
            vec![
                field("customer", "Customer"),
                field("lines", "Arc<[Line]>"),
                field("tags", "HashMap<String, Box<str>>"),
                field("note", "Option<String>"),
            ],
        );
        let verdict = check_event(&lock, &actual, "outbox.lock");
        assert_eq!(
            (verdict.status, verdict.findings),
            (Status::Recorded, vec![])
        );

        // A rename keeps being found by the JSON type, too.
        let renamed = event(
            1,
            vec![
                field("client", "Arc<Customer>"),
                field("lines", "Vec<Line>"),
                field("tags", "BTreeMap<String, String>"),
                field("note", "Option<String>"),
            ],
        );
        let verdict = check_event(&lock, &renamed, "outbox.lock");
        assert_eq!(verdict.status, Status::Rejected);
        assert!(
            verdict.findings[0]
                .message
                .contains("field `customer` was renamed to `client`"),
            "{:?}",
            verdict.findings
        );
    }

    #[test]
    fn a_newtype_of_the_recorded_type_is_settled_once_its_shape_is_known() {
        use crate::schema_lock::TypeEntry;
        use crate::shape::Kind;

        let newtype = |inner: &str| TypeEntry {
            kind: Kind::Tuple,
            rename_all: None,
            repr: None,
            fields: vec![field("0", inner)],
            variants: Vec::new(),
            closed: false,
        };
        let lock = lock(vec![v1()]);
        let actual = event(
            1,
            vec![field("order_id", "OrderId"), field("customer", "String")],
        );
        // One struct at a time (the derive): left to the compiler.
        let verdict = check_event(&lock, &actual, "outbox.lock");
        assert_eq!(
            (verdict.status, verdict.findings),
            (Status::Additive, vec![])
        );
        assert_eq!(verdict.unsettled.len(), 1);
        let unsettled = &verdict.unsettled[0];
        assert_eq!(
            (
                unsettled.field,
                unsettled.recorded.as_str(),
                unsettled.actual.as_str()
            ),
            (0, "i64", "OrderId")
        );
        assert!(
            unsettled
                .message
                .contains("field `order_id` changed type from `i64` to `OrderId`"),
            "{}",
            unsettled.message
        );

        // With the newtype's shape (the lock command), it is spelled as
        // what it holds: equal, or plainly another type.
        let mut known = actual.clone();
        known.types.insert("OrderId".into(), newtype("i64"));
        let verdict = check_event(&lock, &known, "outbox.lock");
        assert_eq!(
            (
                verdict.status,
                verdict.findings.len(),
                verdict.unsettled.len()
            ),
            (Status::Additive, 0, 0)
        );
        known.types.insert("OrderId".into(), newtype("String"));
        let verdict = check_event(&lock, &known, "outbox.lock");
        assert_eq!(
            (
                verdict.status,
                verdict.findings.len(),
                verdict.unsettled.len()
            ),
            (Status::Rejected, 1, 0)
        );

        // A type no payload type can make the recorded one is refused at once.
        let wrapped = event(
            1,
            vec![
                field("order_id", "Vec<OrderId>"),
                field("customer", "String"),
            ],
        );
        let verdict = check_event(&lock, &wrapped, "outbox.lock");
        assert_eq!((verdict.findings.len(), verdict.unsettled.len()), (1, 0));

        // And back: the newtype recorded, its field's type now.
        let lock = super::Lock {
            events: vec![known_with(newtype("i64"))],
            ..super::Lock::default()
        };
        let verdict = check_event(&lock, &v1(), "outbox.lock");
        assert_eq!((verdict.findings, verdict.unsettled), (vec![], vec![]));

        fn known_with(entry: TypeEntry) -> EventEntry {
            let mut recorded = event(
                1,
                vec![field("order_id", "OrderId"), field("customer", "String")],
            );
            recorded.types.insert("OrderId".into(), entry);
            recorded
        }
    }

    #[test]
    fn every_breaking_change_is_reported_at_its_field() {
        let lock = lock(vec![v1(), event(2, vec![field("order_id", "i64")])]);
        let actual = event(
            1,
            vec![
                field("order_id", "u64"),
                field("note", "String"),
                field("total", "i64"),
            ],
        );
        let verdict = check_event(&lock, &actual, "outbox.lock");
        assert_eq!(verdict.status, Status::Rejected);
        let start = "`OrderPlaced` version 1 no longer matches outbox.lock:";
        let fix = "; bump to `version = 3` and run `cargo outbox lock`";
        assert_eq!(
            messages(&verdict),
            [
                (
                    Site::Field(0),
                    format!(
                        "{start} field `order_id` changed type from `i64` to `u64`{fix}, or \
                         keep `i64` and add the new data as an `Option<_>` field"
                    )
                    .as_str()
                ),
                (
                    Site::Field(1),
                    format!(
                        "{start} field `customer` was renamed to `note`{fix}, or keep the old \
                         name with `#[serde(rename = \"customer\")]`"
                    )
                    .as_str()
                ),
                (
                    Site::Field(2),
                    format!(
                        "{start} new field `total` is required (neither `Option<_>` nor \
                         `#[serde(default)]`), so recorded payloads without it do not \
                         decode{fix}, or make it additive: `Option<_>` or `#[serde(default)]`"
                    )
                    .as_str()
                ),
            ]
        );
    }

    #[test]
    fn a_removed_field_is_reported_at_the_version() {
        let lock = lock(vec![v1()]);
        let verdict = check_event(
            &lock,
            &event(1, vec![field("order_id", "i64")]),
            "outbox.lock",
        );
        assert_eq!(
            messages(&verdict),
            [(
                Site::Version,
                "`OrderPlaced` version 1 no longer matches outbox.lock: field `customer` was \
                 removed; bump to `version = 2` and run `cargo outbox lock`, or keep the field"
            )]
        );
    }

    #[test]
    fn a_serde_rename_is_a_rename() {
        let lock = lock(vec![v1()]);
        let mut renamed = v1();
        renamed.fields[1] = FieldEntry::new("buyer".into(), "customer".into(), "String".into());
        let verdict = check_event(&lock, &renamed, "outbox.lock");
        assert_eq!(verdict.findings.len(), 1);
        assert!(
            verdict.findings[0]
                .message
                .contains(": field `customer` was renamed to `buyer`;")
        );
        // A Rust rename that keeps the wire name changes nothing.
        let mut rust_only = v1();
        rust_only.fields[1] = FieldEntry::new("customer".into(), "buyer".into(), "String".into());
        let verdict = check_event(&lock, &rust_only, "outbox.lock");
        assert!(verdict.findings.is_empty(), "{verdict:?}");
    }

    #[test]
    fn a_changed_rename_all_is_one_finding() {
        let lock = lock(vec![v1()]);
        let mut camel = v1();
        camel.rename_all = Some("camelCase".into());
        camel.fields[0].name = "orderId".into();
        let verdict = check_event(&lock, &camel, "outbox.lock");
        assert_eq!(verdict.findings.len(), 1);
        assert_eq!(verdict.findings[0].site, Site::RenameAll);
        assert!(
            verdict.findings[0]
                .message
                .contains(": `#[serde(rename_all)]` changed from none to `camelCase`")
        );
    }

    #[test]
    fn versions_are_new_bumped_or_lowered() {
        let empty = lock(vec![]);
        let verdict = check_event(&empty, &v1(), "outbox.lock");
        assert_eq!(verdict.status, Status::New);
        assert_eq!(
            verdict.findings[0].message,
            "`OrderPlaced` version 1 is not recorded in outbox.lock yet; run `cargo outbox lock` \
             to record it, and commit outbox.lock"
        );

        let recorded = lock(vec![v1()]);
        let verdict = check_event(&recorded, &event(2, vec![]), "outbox.lock");
        assert_eq!(verdict.status, Status::Bumped { latest: 1 });
        assert!(
            verdict.findings[0]
                .message
                .contains("(latest recorded: version 1)")
        );

        let later = lock(vec![event(2, vec![])]);
        let verdict = check_event(&later, &v1(), "outbox.lock");
        assert_eq!(verdict.status, Status::Rejected);
        assert_eq!(verdict.findings[0].site, Site::Version);
        assert!(verdict.findings[0].message.contains("use `version = 3`"));
    }

    #[test]
    fn an_event_type_keeps_its_aggregate() {
        let recorded = lock(vec![v1()]);
        let mut moved = event(2, vec![]);
        moved.aggregate = "Invoice".into();
        let verdict = check_event(&recorded, &moved, "outbox.lock");
        assert_eq!(verdict.status, Status::Rejected);
        assert_eq!(verdict.findings.len(), 1, "{verdict:?}");
        assert_eq!(verdict.findings[0].site, Site::Aggregate);
        assert!(
            verdict.findings[0]
                .message
                .starts_with("event `OrderPlaced` belongs to aggregate `Order` in outbox.lock")
        );
    }
}
