//! Computes every event's schema from the sources and brings the lock up to
//! date: new and bumped versions are added, additive changes are recorded
//! into their version's entry, and nothing recorded is ever changed
//! incompatibly.

use std::collections::BTreeMap;

use outbox_schema::compare::{self, Site, Status};
use outbox_schema::ctxt::Ctxt;
use outbox_schema::leaked;
use outbox_schema::model::Event;
use outbox_schema::schema_lock::{EventEntry, Lock};
use outbox_schema::sources::Sources;

/// What recording found.
#[derive(Default)]
pub struct Outcome {
    /// The lock as it should be.
    pub lock: Lock,
    /// One line per entry added or extended.
    pub changes: Vec<String>,
    /// Problems that stop recording: every one, one line each.
    pub errors: Vec<String>,
    /// Remarks that do not stop recording.
    pub notes: Vec<String>,
}

/// Records the events of `sources` into `lock` (named `lock_name`).
pub fn record(sources: &Sources, lock: &Lock, lock_name: &str) -> Outcome {
    let mut outcome = Outcome {
        lock: lock.clone(),
        ..Outcome::default()
    };
    let mut seen: BTreeMap<(String, u32), String> = BTreeMap::new();
    for item in &sources.events {
        let cx = Ctxt::default();
        let event = Event::from_ast(&cx, &item.input);
        if let Err(errors) = cx.check() {
            for error in errors {
                outcome
                    .errors
                    .push(format!("{}: {error}", item.location(error.span())));
            }
            continue;
        }
        let Some(event) = event else { continue };
        let mut actual = event.entry();
        let key = (actual.event.clone(), actual.version);
        let here = item.location(event.ident.span());
        if let Some(first) = seen.insert(key, here.clone()) {
            outcome.errors.push(format!(
                "{here}: {} is also declared at {first}; each event version has one struct",
                actual.title()
            ));
            continue;
        }
        let nested = sources.nested_types(&event, &here);
        outcome.errors.extend(nested.errors);
        outcome.notes.extend(nested.outside);
        actual.types = nested.types;

        let verdict = compare::check_event(lock, &actual, lock_name);
        if !matches!(verdict.status, Status::New | Status::Bumped { .. }) {
            for finding in &verdict.findings {
                let span = finding_span(&event, finding.site);
                outcome
                    .errors
                    .push(format!("{}: {}", item.location(span), finding.message));
            }
        }
        let mut status = verdict.status;
        let compat = event.attrs.compat.or(lock.compat).unwrap_or_default();
        let recorded = lock
            .entry(&actual.event, actual.version)
            .map(|entry| entry.under(compat));
        if let Some(check) = &verdict.object {
            for message in leaked::object_changes(recorded.as_ref(), &actual, check) {
                let here = item.location(event.attrs.version_span);
                outcome.errors.push(format!("{here}: {message}"));
                status = Status::Rejected;
            }
        }
        for unsettled in &verdict.unsettled {
            if let Some(message) = leaked::settle(recorded.as_ref(), &actual, unsettled) {
                let span = finding_span(&event, Site::Field(unsettled.field));
                outcome
                    .errors
                    .push(format!("{}: {message}", item.location(span)));
                status = Status::Rejected;
            }
        }
        let verdict = Verdict {
            status,
            recorded: recorded.as_ref(),
        };
        apply_verdict(verdict, actual, lock, lock_name, &here, &mut outcome);
    }
    let mut seen_errors = std::collections::BTreeSet::new();
    outcome
        .errors
        .retain(|error| seen_errors.insert(error.clone()));
    let mut seen_notes = std::collections::BTreeSet::new();
    outcome.notes.retain(|note| seen_notes.insert(note.clone()));
    outcome
}

/// Where a finding about `event` points: the field, attribute or version
/// it is about, else the struct's name.
fn finding_span(event: &Event<'_>, site: Site) -> proc_macro2::Span {
    match site {
        Site::Field(index) => event.fields[index].source.ident.as_ref().map(|i| i.span()),
        Site::Version => Some(event.attrs.version_span),
        Site::Aggregate => Some(event.attrs.aggregate_span),
        Site::RenameAll | Site::Attribute => None,
    }
    .unwrap_or_else(|| event.ident.span())
}

/// How an event stands against the lock, with its recorded entry as its
/// compatibility rule compares it.
struct Verdict<'a> {
    status: Status,
    recorded: Option<&'a EventEntry>,
}

/// Records `actual` into the outcome's lock as `verdict` allows: new and
/// bumped versions are added, additive changes extend their entry unless a
/// nested payload type changed incompatibly (reported at `here`).
fn apply_verdict(
    verdict: Verdict<'_>,
    actual: EventEntry,
    lock: &Lock,
    lock_name: &str,
    here: &str,
    outcome: &mut Outcome,
) {
    match verdict.status {
        Status::Rejected => {}
        Status::New => {
            outcome
                .changes
                .push(format!("recorded new {}", actual.title()));
            outcome.lock.record(actual);
        }
        Status::Bumped { latest } => {
            outcome.changes.push(format!(
                "recorded {} (bumped from version {latest})",
                actual.title()
            ));
            outcome.lock.record(actual);
        }
        Status::Recorded | Status::Additive => {
            let Some(recorded) = verdict.recorded else {
                return;
            };
            let next = lock.next_version(&actual.event);
            let problems = leaked::nested_problems(recorded, &actual, None, lock_name, next);
            let rejected = !problems.is_empty();
            for message in problems {
                outcome.errors.push(format!("{here}: {message}"));
            }
            if !rejected && !recorded.same_json(&actual) {
                outcome
                    .changes
                    .push(format!("recorded additive changes of {}", actual.title()));
                outcome.lock.record(actual.keeping_closed(recorded));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use outbox_schema::schema_lock::Compat;

    fn sources(text: &str) -> Sources {
        let mut sources = Sources::default();
        sources.add_file(Path::new("src/lib.rs"), text).unwrap();
        sources.resolve_aliases();
        sources
    }

    fn record_text(lock: &Lock, text: &str) -> Outcome {
        record(&sources(text), lock, "outbox.lock")
    }

    const V1: &str = r#"
        #[derive(EventPayload)]
        #[serde(tag = "kind")]
        enum Payment { Card { last4: String }, Cash }

        #[derive(EventPayload)]
        struct Line { sku: String, payment: Payment }

        #[derive(DomainEvent)]
        #[domain_event(aggregate = "Order", version = 1)]
        struct OrderPlaced { order_id: i64, lines: Vec<Line>, at: chrono::DateTime<chrono::Utc> }
    "#;

    #[test]
    fn records_events_with_every_nested_payload_type() {
        let outcome = record_text(&Lock::default(), V1);
        assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
        assert_eq!(outcome.changes, ["recorded new `OrderPlaced` version 1"]);
        let entry = outcome.lock.entry("OrderPlaced", 1).unwrap();
        let types: Vec<&str> = entry.types.keys().map(String::as_str).collect();
        assert_eq!(types, ["Line", "Payment"]);
        assert_eq!(
            entry.types["Payment"].repr.as_deref(),
            Some("internal(kind)")
        );
        assert_eq!(entry.fields[2].ty, "DateTime<Utc>");

        // Recording again changes nothing.
        let again = record_text(&outcome.lock, V1);
        assert!(again.changes.is_empty() && again.errors.is_empty());
        assert_eq!(again.lock, outcome.lock);
    }

    #[test]
    fn records_additive_changes_and_refuses_breaking_ones() {
        let v1 = record_text(&Lock::default(), V1).lock;
        let additive = V1
            .replace("Cash }", "Cash, Voucher(String) }")
            .replace("sku: String,", "sku: String, note: Option<String>,");
        let outcome = record_text(&v1, &additive);
        assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
        assert_eq!(
            outcome.changes,
            ["recorded additive changes of `OrderPlaced` version 1"]
        );
        let line = &outcome.lock.entry("OrderPlaced", 1).unwrap().types["Line"];
        assert_eq!(line.fields[1].name, "note");

        let breaking = V1.replace("Card { last4: String }, ", "");
        let outcome = record_text(&v1, &breaking);
        assert_eq!(outcome.lock, v1, "nothing is recorded");
        assert_eq!(
            outcome.errors,
            [
                "src/lib.rs:11: `OrderPlaced` version 1 no longer matches outbox.lock through field \
              `lines`: in `Payment`, variant `Card` was removed or renamed; bump to `version = 2` \
              and run `cargo outbox lock`, or keep the variant"
            ]
        );
    }

    #[test]
    fn under_compat_full_a_new_variant_needs_a_bump() {
        let v1 = record_text(&Lock::default(), V1).lock;
        let added = V1.replace("Cash }", "Cash, Voucher(String) }");
        let refused = "src/lib.rs:11: `OrderPlaced` version 1 no longer matches outbox.lock \
            through field `lines`: in `Payment`, variant `Voucher` was added, which readers of \
            the recorded version cannot read under `compat = \"full\"`; bump to `version = 2` \
            and run `cargo outbox lock`, or leave the variant out of this version's enum";

        // The crate's rule, at the top of the lock, is kept by the command.
        let full = Lock {
            compat: Some(Compat::Full),
            ..v1.clone()
        };
        let outcome = record_text(&full, &added);
        assert_eq!(outcome.errors, [refused]);
        assert_eq!(outcome.lock, full, "nothing is recorded");
        assert!(
            outcome
                .lock
                .to_toml()
                .contains("\ncompat = \"full\"\n\n[[event]]")
        );
        assert_eq!(
            Lock::parse(&outcome.lock.to_toml()).unwrap().compat,
            Some(Compat::Full)
        );

        // An event's own rule overrides the crate's, both ways.
        let own_full = added.replace("version = 1)]", "version = 1, compat = \"full\")]");
        assert_eq!(record_text(&v1, &own_full).errors, [refused]);
        let own_backward = added.replace("version = 1)]", "version = 1, compat = \"backward\")]");
        let outcome = record_text(&full, &own_backward);
        assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
        assert_eq!(
            outcome.changes,
            ["recorded additive changes of `OrderPlaced` version 1"]
        );

        // A bump records the new variant under either rule.
        let bumped = added.replace("version = 1)]", "version = 2)]");
        let outcome = record_text(&full, &bumped);
        assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
        assert_eq!(
            outcome.changes,
            ["recorded `OrderPlaced` version 2 (bumped from version 1)"]
        );
    }

    #[test]
    fn under_compat_full_an_enum_with_an_other_variant_takes_new_variants() {
        let open = V1.replace("Cash }", "Cash, #[serde(other)] Unknown }");
        let v1 = Lock {
            compat: Some(Compat::Full),
            ..record_text(&Lock::default(), &open).lock
        };
        assert!(
            v1.to_toml()
                .contains("{ name = \"Unknown\", kind = \"unit\", other = true }"),
            "{}",
            v1.to_toml()
        );
        let added = open.replace("Cash,", "Cash, Voucher { code: String },");
        let outcome = record_text(&v1, &added);
        assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
        assert_eq!(
            outcome.changes,
            ["recorded additive changes of `OrderPlaced` version 1"]
        );

        // Taking `other` away closes the enum again: a change of what
        // readers accept, recorded like any other.
        let closed = added.replace("#[serde(other)] ", "");
        let outcome = record_text(&outcome.lock, &closed);
        assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
        assert!(!outcome.lock.to_toml().contains("other = true"));
    }

    #[test]
    fn under_compat_full_other_added_later_or_on_an_external_enum_opens_nothing() {
        let added_variant = |text: &str| text.replace("Cash", "Cash, Voucher");
        let refused = |outcome: &Outcome| {
            outcome.errors.len() == 1 && outcome.errors[0].contains("variant `Voucher` was added")
        };
        // Recorded closed, then given `other`: readers of the first state
        // still fail on a new variant.
        let unknown = V1.replace("Cash }", "Cash, Unknown }");
        let closed = Lock {
            compat: Some(Compat::Full),
            ..record_text(&Lock::default(), &unknown).lock
        };
        let with_other = unknown.replace("Unknown }", "#[serde(other)] Unknown }");
        let outcome = record_text(&closed, &with_other);
        assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
        assert!(!outcome.lock.to_toml().contains("other = true"));
        let outcome = record_text(&outcome.lock, &added_variant(&with_other));
        assert!(refused(&outcome), "{:?}", outcome.errors);

        // An externally tagged enum reads no unknown variant as `other`.
        let external = V1.replace("#[serde(tag = \"kind\")]", "");
        let external_other = external.replace("Cash }", "Cash, #[serde(other)] Unknown }");
        let recorded = Lock {
            compat: Some(Compat::Full),
            ..record_text(&Lock::default(), &external_other).lock
        };
        let outcome = record_text(&recorded, &added_variant(&external_other));
        assert!(refused(&outcome), "{:?}", outcome.errors);
    }

    #[test]
    fn an_alias_defined_twice_as_different_types_is_not_guessed() {
        let mut sources = Sources::default();
        let line = r#"
            pub type Q = u32;
            #[derive(EventPayload)]
            struct Line { sku: String, qty: Q }
            #[derive(DomainEvent)]
            #[domain_event(aggregate = "Order", version = 1)]
            struct OrderPlaced { order_id: i64, lines: Vec<Line> }
        "#;
        sources.add_file(Path::new("src/lib.rs"), line).unwrap();
        sources
            .add_file(Path::new("src/zz.rs"), "pub type Q = String;")
            .unwrap();
        sources.resolve_aliases();
        let outcome = record(&sources, &Lock::default(), "outbox.lock");
        assert_eq!(outcome.errors.len(), 1, "{:?}", outcome.errors);
        assert!(
            outcome.errors[0].contains("`Q`")
                && outcome.errors[0].contains("type alias defined more than once"),
            "{}",
            outcome.errors[0]
        );
    }

    #[test]
    fn changes_that_write_the_same_json_leave_the_lock_as_it_was() {
        let v1 = record_text(&Lock::default(), V1).lock;
        let same_json = V1
            .replace("sku: String,", "sku: Box<str>,")
            .replace("payment: Payment }", "payment: std::sync::Arc<Payment> }")
            .replace(
                "lines: Vec<Line>",
                "lines: std::collections::VecDeque<Box<Line>>",
            );
        let outcome = record_text(&v1, &same_json);
        assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
        assert!(outcome.changes.is_empty(), "{:?}", outcome.changes);
        assert_eq!(outcome.lock, v1);

        // Nor does reordering fields or variants.
        let reordered = V1
            .replace(
                "Card { last4: String }, Cash",
                "Cash, Card { last4: String }",
            )
            .replace(
                "sku: String, payment: Payment",
                "payment: Payment, sku: String",
            )
            .replace(
                "order_id: i64, lines: Vec<Line>,",
                "lines: Vec<Line>, order_id: i64,",
            );
        assert_ne!(reordered, V1);
        let outcome = record_text(&v1, &reordered);
        assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
        assert!(outcome.changes.is_empty(), "{:?}", outcome.changes);
        assert_eq!(outcome.lock, v1);

        // A newtype of the recorded type: recorded as the new spelling.
        let newtype = format!(
            "{}\n#[derive(EventPayload)] struct Sku(Box<str>);",
            V1.replace("sku: String,", "sku: Sku,")
        );
        let outcome = record_text(&v1, &newtype);
        assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
        let line = &outcome.lock.entry("OrderPlaced", 1).unwrap().types["Line"];
        assert_eq!(line.fields[0].ty, "Sku");
        let wrong = newtype.replace("Sku(Box<str>)", "Sku(u64)");
        let outcome = record_text(&v1, &wrong);
        assert_eq!(outcome.lock, v1, "nothing is recorded");
        assert!(
            outcome.errors[0]
                .contains("in `Line`, field `sku` changed type from `String` to `Sku`"),
            "{:?}",
            outcome.errors
        );

        // Another JSON type is still a breaking change.
        let retyped = V1.replace("sku: String,", "sku: Vec<String>,");
        let outcome = record_text(&v1, &retyped);
        assert_eq!(outcome.lock, v1, "nothing is recorded");
        assert_eq!(outcome.errors.len(), 1, "{:?}", outcome.errors);
        assert!(
            outcome.errors[0].contains("field `sku` changed type from `String` to `Vec<String>`"),
            "{:?}",
            outcome.errors
        );
    }

    #[test]
    fn a_decoder_kept_for_an_old_version_may_copy_its_nested_types() {
        let v1 = record_text(&Lock::default(), V1).lock;
        // Version 2 gives `Line` a required field; version 1 keeps a decoder
        // with its own copy of the old `Line`.
        let bumped = V1
            .replace("sku: String,", "sku: String, qty: u32,")
            .replace("version = 1", "version = 2")
            + r#"
            #[derive(EventPayload)]
            struct LineV1 { sku: String, payment: Payment }

            #[derive(DomainEvent)]
            #[domain_event(aggregate = "Order", version = 1, name = "OrderPlaced")]
            struct OrderPlacedV1 { order_id: i64, lines: Vec<LineV1>, at: chrono::DateTime<chrono::Utc> }
        "#;
        let outcome = record_text(&v1, &bumped);
        assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
        assert!(outcome.lock.entry("OrderPlaced", 2).is_some());

        // A copy that reads other JSON is refused.
        let wrong = bumped.replace("struct LineV1 { sku: String,", "struct LineV1 { sku: u64,");
        let outcome = record_text(&v1, &wrong);
        assert_eq!(outcome.errors.len(), 1, "{:?}", outcome.errors);
        assert!(
            outcome.errors[0].contains(
                "through field `lines`: in `LineV1`, field `sku` changed type from `String` to `u64`"
            ),
            "{:?}",
            outcome.errors
        );
    }

    #[test]
    fn aliases_are_recorded_as_what_they_name() {
        let aliased = V1
            .replace("sku: String,", "sku: Sku,")
            .replace("lines: Vec<Line>", "lines: Lines")
            + "\ntype Sku = String;\ntype Lines = Vec<crate::Line>;";
        let v1 = record_text(&Lock::default(), V1).lock;
        assert_eq!(record_text(&Lock::default(), &aliased).lock, v1);
        let outcome = record_text(&v1, &aliased);
        assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
        assert!(outcome.changes.is_empty(), "{:?}", outcome.changes);
        // An alias of another JSON type is a breaking change.
        let outcome = record_text(
            &v1,
            &aliased.replace("type Sku = String;", "type Sku = u64;"),
        );
        assert_eq!(outcome.errors.len(), 1, "{:?}", outcome.errors);
    }

    #[test]
    fn fields_may_move_into_a_flattened_struct() {
        let v1 = record_text(&Lock::default(), V1).lock;
        let moved = V1.replace(
            "struct OrderPlaced { order_id: i64, lines: Vec<Line>,",
            "struct OrderPlaced { #[serde(flatten)] head: Head,",
        ) + "\n#[derive(EventPayload)] struct Head { order_id: i64, lines: Vec<Line> }";
        let outcome = record_text(&v1, &moved);
        assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
        let entry = outcome.lock.entry("OrderPlaced", 1).unwrap();
        assert!(entry.fields[0].flatten && entry.types.contains_key("Head"));

        let lost = moved.replace("struct Head { order_id: i64,", "struct Head {");
        let outcome = record_text(&v1, &lost);
        assert_eq!(outcome.lock, v1, "nothing is recorded");
        assert_eq!(
            outcome.errors,
            [
                "src/lib.rs:10: `OrderPlaced` version 1 no longer matches outbox.lock: field \
                 `order_id` was removed; bump to `version = 2` and run `cargo outbox lock`, or \
                 keep the field"
            ]
        );
    }

    #[test]
    fn reports_duplicates_missing_derives_and_external_types() {
        let text = r#"
            struct Money { cents: i64 }

            #[derive(DomainEvent)]
            #[domain_event(aggregate = "Order", version = 1)]
            struct OrderPaid { amount: Money, receipt: other::Receipt }

            #[derive(DomainEvent)]
            #[domain_event(aggregate = "Order", version = 1, name = "OrderPaid")]
            struct OrderPaidAgain { order_id: i64 }
        "#;
        let outcome = record_text(&Lock::default(), text);
        assert_eq!(
            outcome.errors,
            [
                "src/lib.rs:2: `Money` is nested in event payloads but does not derive \
                 EventPayload; add #[derive(EventPayload)] so its shape is recorded and checked",
                "src/lib.rs:10: `OrderPaid` version 1 is also declared at src/lib.rs:6; each \
                 event version has one struct",
            ]
        );
        assert_eq!(
            outcome.notes,
            [
                "`Receipt`, used by field `receipt` of `OrderPaid` version 1 (src/lib.rs:6), is not \
              defined in this crate: its shape is not recorded, so it is compared by name only"
            ]
        );
    }
}
