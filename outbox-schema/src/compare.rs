//! An event's current schema against the lock: recorded, additive, new,
//! bumped or rejected, with a message for every problem.
//!
//! The per-field rules are those of [`crate::shape`]; this module adds what
//! only an event has: versions, aggregates, and every problem at once, each
//! located so the derive can point at the field (or the version attribute
//! for removals).

use crate::schema_lock::{EventEntry, FieldEntry, Lock, RECORD_COMMAND};
use crate::shape::{Change, Message, Problem, field_problem};

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
}

/// Checks `actual` (an event's current schema, as the model reads it)
/// against `lock`, named `lock_name` in messages.
pub fn check_event(lock: &Lock, actual: &EventEntry, lock_name: &str) -> Verdict {
    let versions = lock.versions(&actual.event);
    let mut findings = Vec::new();
    if let Some(other) = versions
        .iter()
        .find(|entry| entry.aggregate != actual.aggregate)
    {
        findings.push(Finding {
            site: Site::Aggregate,
            message: format!(
                "event `{}` belongs to aggregate `{}` in {lock_name} (version {}): an event type \
                 cannot move to another aggregate, its consumers read `{}`'s stream; keep \
                 `aggregate = \"{}\"`, or publish a new event type (another struct name, or \
                 `name = \"..\"`)",
                actual.event, other.aggregate, other.version, other.aggregate, other.aggregate,
            ),
        });
    }
    let latest = versions.iter().map(|entry| entry.version).max();
    let status = match (
        versions.iter().find(|e| e.version == actual.version),
        latest,
    ) {
        (Some(recorded), Some(latest)) => {
            compare_fields(recorded, actual, latest + 1, lock_name, &mut findings);
            if !findings.is_empty() {
                Status::Rejected
            } else if recorded.fields == actual.fields && recorded.rename_all == actual.rename_all {
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
    Verdict { status, findings }
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

/// Pushes a finding for every incompatible change from `recorded` to
/// `actual` (the same event version). `next` is the version to bump to.
fn compare_fields(
    recorded: &EventEntry,
    actual: &EventEntry,
    next: u32,
    lock_name: &str,
    findings: &mut Vec<Finding>,
) {
    let prefix = mismatch(recorded, lock_name, None);
    let fix = bump_fix(next);
    let report = |findings: &mut Vec<Finding>, site, problem: &Problem<'_>| {
        let message = Message::new()
            .push(&prefix)
            .describe(problem)
            .push(&fix)
            .hint(problem);
        findings.push(Finding {
            site,
            message: message.as_str().to_owned(),
        });
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
        report(findings, Site::RenameAll, &problem);
        return;
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
            let shape = actual.fields[index].shape();
            if let Some(problem) = field_problem("", "", &old.shape(), &shape) {
                report(findings, Site::Field(index), &problem);
            }
        } else {
            let (site, problem) = gone_field(old, actual, &unrecorded, &mut renamed_to);
            report(findings, site, &problem);
        }
    }
    for index in unrecorded {
        let field = &actual.fields[index];
        if renamed_to.contains(&index) || field.shape().tolerant() {
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
        report(findings, Site::Field(index), &problem);
    }
    findings.sort_by_key(|finding| match finding.site {
        Site::Field(index) => index,
        _ => usize::MAX,
    });
}

/// The finding for a recorded field gone under its name: renamed if a new
/// field (`unrecorded`, by index) has its Rust name, or is the only new
/// field of its type; else removed. `renamed_to` collects the new fields
/// taken as renames.
fn gone_field<'a>(
    old: &'a FieldEntry,
    actual: &'a EventEntry,
    unrecorded: &[usize],
    renamed_to: &mut Vec<usize>,
) -> (Site, Problem<'a>) {
    let same_rust = unrecorded
        .iter()
        .copied()
        .find(|&i| actual.fields[i].rust_name() == old.rust_name());
    let same_type: Vec<usize> = unrecorded
        .iter()
        .copied()
        .filter(|&i| actual.fields[i].ty == old.ty && !renamed_to.contains(&i))
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
        Lock { events: entries }
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
