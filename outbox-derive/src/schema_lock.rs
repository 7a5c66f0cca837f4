//! Where the derive checks an event against the schema lock.
//!
//! The lock (`outbox.lock` at the crate root, or `$OUTBOX_LOCK`) is only
//! read, never written: editors expand macros too. What the lock decides
//! comes out as tokens after the `DomainEvent` impl:
//!
//! - `include_bytes!` of the lock, so cargo rebuilds the crate when the lock
//!   changes, and `option_env!("OUTBOX_LOCK")`, so it rebuilds when the
//!   variable does;
//! - a `compile_error!` for every problem, at the field it is about (the
//!   version attribute for a removed field);
//! - for an event that matches its entry, a `compile_error!` at the field
//!   for every incompatible change of a payload type nested in it, when the
//!   crate's sources define them all; and in any case a constant per nested
//!   payload type that compares the type's `EventPayload::SHAPE` with its
//!   recorded shape during constant evaluation (the compiler's view, for
//!   types the sources do not show), and one that requires `EventPayload`
//!   of every other;
//! - a constant per field whose type changed its spelling in a way only
//!   those shapes can settle (a newtype, an alias, a copy of a recorded
//!   payload type under another name: `compare::Unsettled`), and one for
//!   the keys of an event that flattens a payload type
//!   (`compare::ObjectCheck`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use outbox_schema::compare::{self, ObjectCheck, Site, Status, Unsettled};
use outbox_schema::ctxt::Ctxt;
use outbox_schema::model::Event;
use outbox_schema::schema_lock::{Compat, EventEntry, LOCK_ENV, LOCK_FILE, Lock, RECORD_COMMAND};
use outbox_schema::{leaked, sources, ty};
use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;

use crate::shape_tokens::{self, with_static_lifetimes};

/// The tokens that check `event` against the lock.
pub fn check_event(event: &Event<'_>) -> TokenStream {
    if compiled_by_rustdoc() {
        // A doctest's events are examples, not the crate's published
        // contract, and no command can record them.
        return TokenStream::new();
    }
    let track_env = quote! {
        const _: ::core::option::Option<&str> = ::core::option_env!(#LOCK_ENV);
    };
    let Some(crate_dir) = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from) else {
        let message = format!(
            "#[derive(DomainEvent)] checks events against {LOCK_FILE} at the crate root, but \
             CARGO_MANIFEST_DIR is not set: build with cargo, or set {LOCK_ENV} to the lock's path"
        );
        return error_at(event, Site::Attribute, &message);
    };
    let env_override = std::env::var(LOCK_ENV).ok();
    let path = outbox_schema::schema_lock::lock_path(&crate_dir, env_override.as_deref());
    // Messages name the lock as the user did.
    let lock_name = match env_override.as_deref().map(str::trim) {
        Some(given) if !given.is_empty() => given.to_owned(),
        _ => LOCK_FILE.to_owned(),
    };
    let lock = match Lock::read(&path) {
        Ok(Some(lock)) => lock,
        Ok(None) => {
            let message = format!(
                "no {lock_name} in {}: #[derive(DomainEvent)] checks every event against the \
                 payload schemas recorded there; run `{RECORD_COMMAND}` in this crate to create \
                 it, and commit it",
                crate_dir.display()
            );
            let error = error_at(event, Site::Attribute, &message);
            return quote!(#error #track_env);
        }
        Err(error) => {
            let message = format!(
                "cannot read {error}; restore it from version control, or delete it and run \
                 `{RECORD_COMMAND}`"
            );
            let error = error_at(event, Site::Attribute, &message);
            let include = include_lock(&path);
            return quote!(#error #include #track_env);
        }
    };

    let actual = event.entry();
    let compat = event.attrs.compat.or(lock.compat).unwrap_or_default();
    let verdict = compare::check_event(&lock, &actual, &lock_name);
    let errors = verdict
        .findings
        .iter()
        .map(|finding| error_at(event, finding.site, &finding.message));
    let recorded = lock
        .entry(&event.attrs.name, event.attrs.version)
        .map(|entry| entry.under(compat));
    let nests = matches!(verdict.status, Status::Recorded | Status::Additive)
        && event.type_params().is_empty()
        && event
            .fields
            .iter()
            .any(|field| !field.payload_types(&[]).is_empty());
    if nests || !verdict.unsettled.is_empty() || verdict.object.is_some() {
        let in_sources = Recorded {
            lock: &lock,
            name: &lock_name,
            crate_dir: &crate_dir,
        };
        let rejected = !verdict.findings.is_empty();
        let judged = problems_in_sources(event, &in_sources, compat, rejected).unwrap_or_default();
        if !judged.is_empty() {
            // Judged from the sources: each problem is an error at its
            // field, and the constants would only say the same again.
            let include = include_lock(&path);
            return quote!(#(#errors)* #(#judged)* #include #track_env);
        }
    }
    let nested = match (nests, &recorded) {
        (true, Some(recorded)) => nested_checks(event, &lock, recorded, &lock_name),
        _ => TokenStream::new(),
    };
    let settle = verdict
        .unsettled
        .iter()
        .map(|unsettled| settle_check(event, recorded.as_ref(), unsettled));
    let object = match (&verdict.object, &recorded) {
        (Some(check), Some(recorded)) => object_check(event, recorded, check),
        _ => TokenStream::new(),
    };
    let include = include_lock(&path);
    quote!(#(#errors)* #nested #(#settle)* #object #include #track_env)
}

/// A constant that compares the keys of the event's JSON object with the
/// recorded ones once the flattened payload types are known, and fails the
/// build with what changed (`shape::object_mismatch`).
fn object_check(event: &Event<'_>, recorded: &EventEntry, check: &ObjectCheck) -> TokenStream {
    if !event.type_params().is_empty() {
        // A type parameter's payload types are only known per use.
        return TokenStream::new();
    }
    let recorded_fields = shape_tokens::recorded_fields(recorded);
    // The fields of the model and of its entry are in the same order.
    let mut sources = event.fields.iter();
    let actual_fields = shape_tokens::current_fields(&event.entry().fields, &mut |_| {
        sources.next().map_or_else(Vec::new, |field| {
            field
                .payload_types(&[])
                .into_iter()
                .map(shape_tokens::current)
                .collect()
        })
    });
    let (prefix, fix) = (&check.prefix, &check.fix);
    let span = event.attrs.version_span;
    each_problem(
        span,
        quote_spanned! {span=>
            const RECORDED: &[::outbox_core::shape::FieldShape<'static>] = #recorded_fields;
            const ACTUAL: &[::outbox_core::shape::FieldShape<'static>] = #actual_fields;
        },
        |n| quote!(::outbox_core::shape::object_mismatch(RECORDED, ACTUAL, #n, #prefix, #fix)),
    )
}

/// How many problems of one comparison a build reports, each as its own
/// error.
const REPORTED: usize = 8;

/// A constant holding `setup` (the shapes to compare) and one constant per
/// problem a build reports (`REPORTED`), each failing with the message
/// `mismatch(n)` gives for the `n`th problem, if there is one.
fn each_problem(
    span: proc_macro2::Span,
    setup: TokenStream,
    mismatch: impl Fn(usize) -> TokenStream,
) -> TokenStream {
    let checks = (0..REPORTED).map(|n| {
        let mismatch = mismatch(n);
        quote_spanned! {span=>
            const _: () = match #mismatch {
                ::core::option::Option::Some(message) => ::core::panic!("{}", message.as_str()),
                ::core::option::Option::None => (),
            };
        }
    });
    quote_spanned! {span=>
        const _: () = {
            #setup
            #(#checks)*
        };
    }
}

/// A constant that compares a field's type with its recorded JSON type
/// once the payload types inside it are known, and fails the build with
/// the type change's message if readers of the recorded type could not
/// read it (`shape::json_eq`).
fn settle_check(
    event: &Event<'_>,
    recorded: Option<&EventEntry>,
    unsettled: &Unsettled,
) -> TokenStream {
    let (Some(field), Some(recorded)) = (event.fields.get(unsettled.field), recorded) else {
        return TokenStream::new();
    };
    let recorded_types = recorded
        .fields
        .iter()
        .find(|field| field.name == unsettled.recorded_field)
        .map(|field| shape_tokens::recorded_types_in(&field.ty, &recorded.types, &[]))
        .unwrap_or_default();
    let actual_types = field
        .payload_types(&event.type_params())
        .into_iter()
        .map(shape_tokens::current);
    let (json, actual, message) = (&unsettled.recorded, &unsettled.actual, &unsettled.message);
    let (nested_prefix, fix) = (&unsettled.nested_prefix, &unsettled.fix);
    let span = field.ty.span();
    quote_spanned! {span=>
        const _: () = match ::outbox_core::shape::settle_mismatch(
            #json,
            &[#(#recorded_types),*],
            #actual,
            &[#(#actual_types),*],
            #nested_prefix,
            #fix,
            #message,
        ) {
            ::core::option::Option::Some(message) => ::core::panic!("{}", message.as_str()),
            ::core::option::Option::None => (),
        };
    }
}

/// The lock an event is checked against, and where.
struct Recorded<'a> {
    lock: &'a Lock,
    /// The lock as messages name it.
    name: &'a str,
    crate_dir: &'a Path,
}

/// Every problem of `event` that the compiled types would settle (its
/// nested payload types, newtypes and aliases in its fields, the keys of
/// flattened types), judged instead from the crate's sources as `cargo
/// outbox lock` judges them, as compile errors where they are reported;
/// when the event's own fields already showed problems (`rejected`), only
/// those the compiled types would settle. `None` when the sources do not
/// define the event and every payload type reachable from it exactly once:
/// then only the compiled shapes can tell.
fn problems_in_sources(
    event: &Event<'_>,
    lock: &Recorded<'_>,
    compat: Compat,
    rejected: bool,
) -> Option<Vec<TokenStream>> {
    let actual = event_in_sources(event, lock.crate_dir)?;
    let verdict = compare::check_event(lock.lock, &actual, lock.name);
    let recorded = lock
        .lock
        .entry(&actual.event, actual.version)
        .map(|entry| entry.under(compat));
    // Errors underline a whole type (`line::Line`), not its first token.
    let error = |tokens: &dyn quote::ToTokens, message: String| {
        syn::Error::new_spanned(tokens, message).to_compile_error()
    };
    // What the sources settle that the event's own fields did not (an
    // alias's or a newtype's contents), when the event's own fields showed
    // no problem: otherwise the same problem could come twice, in other
    // words.
    let mut problems: Vec<TokenStream> = verdict
        .findings
        .iter()
        .filter(|_| !rejected)
        .map(|finding| error_at(event, finding.site, &finding.message))
        .collect();
    for unsettled in &verdict.unsettled {
        if let Some(message) = leaked::settle(recorded.as_ref(), &actual, unsettled) {
            problems.push(error(&event.fields.get(unsettled.field)?.ty, message));
        }
    }
    if let Some(check) = &verdict.object {
        for message in leaked::object_changes(recorded.as_ref(), &actual, check) {
            let span = event.attrs.version_span;
            problems.push(syn::Error::new(span, message).to_compile_error());
        }
    }
    if let (Status::Recorded | Status::Additive, Some(recorded)) = (&verdict.status, &recorded) {
        let next = lock.lock.next_version(&actual.event);
        for field in &event.fields {
            let inners = field.payload_types(&[]);
            let at: &dyn quote::ToTokens = match inners.first() {
                Some(inner) => inner,
                None => field.ty,
            };
            for message in
                leaked::nested_problems(recorded, &actual, Some(&field.name), lock.name, next)
            {
                problems.push(error(at, message));
            }
        }
    }
    Some(problems)
}

/// `event` as the crate's sources declare it (the files under `src` and the
/// file the derive is expanded in), with every payload type nested in it,
/// as `cargo outbox lock` records it. `None` unless the sources declare it
/// once, with the fields the derive sees, and define each of its payload
/// types once (or when they cannot be read).
fn event_in_sources(event: &Event<'_>, crate_dir: &Path) -> Option<EventEntry> {
    let declared = declared_events(crate_dir)?;
    let ident = event.ident.to_string();
    let mut found = declared.iter().filter(|declared| {
        declared.ident == ident
            && declared.name == event.attrs.name
            && declared.version == event.attrs.version
            && declared.fields == event.fields.len()
    });
    let entry = found.next()?.entry.clone()?;
    found.next().is_none().then_some(entry)
}

/// An event the sources declare.
struct Declared {
    ident: String,
    name: String,
    version: u32,
    /// How many fields it has.
    fields: usize,
    /// Its entry with every nested payload type, if the sources define
    /// each of them once.
    entry: Option<EventEntry>,
}

/// Each source file's path, size and modification time.
type Fingerprint = Vec<(PathBuf, Option<(u64, std::time::SystemTime)>)>;

/// The events the sources declare, by crate directory and the file a
/// derive is expanded in, with the fingerprint of the files they were read
/// from: a compiler expands every derive of a crate in one process, and an
/// editor's macro server for hours, while the files change.
type DeclaredCache = BTreeMap<(PathBuf, Option<PathBuf>), (Fingerprint, Arc<Vec<Declared>>)>;

static DECLARED: Mutex<DeclaredCache> = Mutex::new(BTreeMap::new());

/// The events declared in the files under `src` of `crate_dir` and in the
/// file the derive is expanded in, read once per set of files.
fn declared_events(crate_dir: &Path) -> Option<Arc<Vec<Declared>>> {
    let src = crate_dir.join("src");
    let mut files = sources::files(crate_dir, &[PathBuf::from("src")]).ok()?;
    // Relative to the compiler's working directory, which is the macro's.
    let invoked_in = proc_macro::is_available()
        .then(|| proc_macro::Span::call_site().local_file())
        .flatten()
        .and_then(|file| std::fs::canonicalize(file).ok())
        .filter(|file| !std::fs::canonicalize(&src).is_ok_and(|src| file.starts_with(src)));
    files.extend(invoked_in.clone());
    let fingerprint: Fingerprint = files
        .iter()
        .map(|file| {
            let metadata = std::fs::metadata(file).ok();
            let stamp = metadata.and_then(|m| Some((m.len(), m.modified().ok()?)));
            (file.clone(), stamp)
        })
        .collect();
    let key = (crate_dir.to_owned(), invoked_in);
    let mut cache = DECLARED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((read_from, declared)) = cache.get(&key)
        && *read_from == fingerprint
    {
        return Some(Arc::clone(declared));
    }
    let sources = sources::read(crate_dir, &files).ok()?;
    let declared: Vec<Declared> = sources
        .events
        .iter()
        .filter_map(|item| {
            let cx = Ctxt::default();
            let event = Event::from_ast(&cx, &item.input);
            cx.check().ok()?;
            let event = event?;
            let nested = sources.nested_types(&event, "");
            let complete = nested.complete();
            let mut entry = event.entry();
            entry.types = nested.types;
            Some(Declared {
                ident: event.ident.to_string(),
                name: event.attrs.name.clone(),
                version: event.attrs.version,
                fields: event.fields.len(),
                // Only judged when every payload type is known.
                entry: complete.then_some(entry),
            })
        })
        .collect();
    let declared = Arc::new(declared);
    cache.insert(key, (fingerprint, Arc::clone(&declared)));
    Some(declared)
}

/// The checks of the payload types nested in the fields of `event`, which
/// matches its entry `recorded` (under the event's compatibility rule) in
/// `lock`: a constant per nested payload type that compares its compiled
/// `EventPayload::SHAPE` with its recorded shape, and one that requires
/// `EventPayload` of every other.
fn nested_checks(
    event: &Event<'_>,
    lock: &Lock,
    recorded: &EventEntry,
    lock_name: &str,
) -> TokenStream {
    let fix = compare::bump_fix(lock.next_version(&event.attrs.name));
    let mut checks = TokenStream::new();
    for field in &event.fields {
        let recorded_field = recorded.fields.iter().find(|r| r.name == field.name);
        for inner in field.payload_types(&[]) {
            let name = ty::payload_name(inner);
            let inner = with_static_lifetimes(inner);
            let span = inner.span();
            let recorded_shape = recorded_field
                .filter(|r| !r.opaque)
                .and_then(|_| shape_tokens::recorded(&name, &recorded.types, &mut Vec::new()));
            checks.extend(match recorded_shape {
                Some(shape) => {
                    let prefix = compare::mismatch(recorded, lock_name, Some(&field.name));
                    each_problem(
                        span,
                        quote_spanned! {span=>
                            const RECORDED: ::outbox_core::shape::TypeShape<'static> = #shape;
                            const ACTUAL: &::outbox_core::shape::TypeShape<'static> =
                                <#inner as ::outbox_core::EventPayload>::SHAPE;
                        },
                        |n| {
                            quote! {
                                ::outbox_core::shape::nested_mismatch(
                                    &RECORDED, ACTUAL, #n, #prefix, #fix,
                                )
                            }
                        },
                    )
                }
                None => quote_spanned! {span=>
                    const _: &::outbox_core::shape::TypeShape<'static> =
                        <#inner as ::outbox_core::EventPayload>::SHAPE;
                },
            });
        }
    }
    checks
}

/// `const _: &[u8] = include_bytes!(lock)`: cargo rebuilds when it changes.
fn include_lock(path: &Path) -> TokenStream {
    let path = path.display().to_string();
    quote!(
        const _: &[u8] = ::core::include_bytes!(#path);
    )
}

/// A compile error with `message` at `site` of `event`.
fn error_at(event: &Event<'_>, site: Site, message: &str) -> TokenStream {
    let error = match site {
        Site::Field(index) => match event.fields.get(index) {
            Some(field) => syn::Error::new_spanned(field.site(), message),
            None => syn::Error::new_spanned(&event.attrs.attribute, message),
        },
        Site::Version => syn::Error::new(event.attrs.version_span, message),
        Site::Aggregate => syn::Error::new(event.attrs.aggregate_span, message),
        Site::RenameAll => {
            let span = event
                .serde
                .rename_all_span
                .unwrap_or_else(|| event.ident.span());
            syn::Error::new(span, message)
        }
        Site::Attribute => syn::Error::new_spanned(&event.attrs.attribute, message),
    };
    error.to_compile_error()
}

/// Whether rustdoc is compiling a doctest: it sets
/// `UNSTABLE_RUSTDOC_TEST_PATH` for a doctest compiled on its own, and
/// compiles merged doctests from a `doctest_bundle_*.rs` in a temporary
/// directory.
fn compiled_by_rustdoc() -> bool {
    if std::env::var_os("UNSTABLE_RUSTDOC_TEST_PATH").is_some() {
        return true;
    }
    if !proc_macro::is_available() {
        return false;
    }
    let file = proc_macro::Span::call_site().local_file();
    file.as_deref()
        .and_then(Path::file_name)
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.starts_with("doctest_bundle_"))
}
