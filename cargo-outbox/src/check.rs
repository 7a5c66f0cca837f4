//! `cargo outbox check --contract PATH`: a consumer's decoders against a
//! producer's published contract (its `outbox.lock`, pinned in the
//! consumer's repository).
//!
//! The decoders are the consumer's own `#[derive(DomainEvent)]` structs,
//! read from its sources as `cargo outbox lock` reads them. The check
//! fails when a version the contract declares, of an event type the
//! consumer decodes, has no decoder or has one that cannot read every
//! payload of it (`outbox_schema::reader`), and when a decoder names a
//! version or event type the contract does not declare. Event types the
//! consumer does not decode at all are listed as notes: a consumer reads
//! what it needs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use outbox_schema::schema_lock::{EventEntry, Lock};
use outbox_schema::{reader, sources};

use crate::record;

/// `cargo outbox check` options.
#[derive(Args)]
pub struct CheckArgs {
    /// The producer's published contract: its outbox.lock, as pinned here.
    #[arg(long, value_name = "PATH")]
    contract: PathBuf,
    /// The consumer crate's Cargo.toml (default: the one in or above the current directory).
    #[arg(long, value_name = "PATH")]
    manifest_path: Option<PathBuf>,
    /// Directories of the crate to read decoders from.
    #[arg(long = "src", value_name = "DIR", default_values = ["src"])]
    sources: Vec<PathBuf>,
}

/// Checks the crate's decoders against the contract.
pub fn check(args: &CheckArgs) -> anyhow::Result<ExitCode> {
    let contract = Lock::read(&args.contract)?
        .with_context(|| format!("no contract at {}", args.contract.display()))?;
    let crate_dir = crate::crate_dir(args.manifest_path.as_deref())?;
    let sources = sources::scan(&crate_dir, &args.sources).map_err(anyhow::Error::msg)?;
    let recorded = record::record(&sources, &Lock::default(), "the decoders");
    let mut errors = recorded.errors;
    let decoders = recorded.lock.events;
    let outcome = judge(&contract, &decoders);
    errors.extend(outcome.errors);
    for note in &outcome.notes {
        eprintln!("note: {note}");
    }
    let contract_name = args.contract.display();
    if !errors.is_empty() {
        for error in &errors {
            eprintln!("error: {error}");
        }
        eprintln!(
            "error: the decoders of {} do not read {contract_name}: {} problem(s) above",
            crate_dir.display(),
            errors.len()
        );
        return Ok(ExitCode::FAILURE);
    }
    if decoders.is_empty() {
        anyhow::bail!(
            "no #[derive(DomainEvent)] decoder in {} of {}: nothing to check against \
             {contract_name}",
            dirs(&args.sources),
            crate_dir.display()
        );
    }
    println!(
        "{} decoder(s) read all {} version(s) of {} event type(s) in {contract_name}",
        decoders.len(),
        outcome.versions,
        outcome.event_types
    );
    Ok(ExitCode::SUCCESS)
}

fn dirs(dirs: &[PathBuf]) -> String {
    let dirs: Vec<String> = dirs.iter().map(|dir| dir.display().to_string()).collect();
    dirs.join(", ")
}

/// What [`judge`] found.
#[derive(Default)]
struct Judgement {
    errors: Vec<String>,
    notes: Vec<String>,
    /// Contract versions checked.
    versions: usize,
    /// Contract event types the decoders cover.
    event_types: usize,
}

/// The decoders against every version the contract declares.
fn judge(contract: &Lock, decoders: &[EventEntry]) -> Judgement {
    let mut judgement = Judgement::default();
    let mut declared: BTreeMap<&str, Vec<&EventEntry>> = BTreeMap::new();
    for entry in &contract.events {
        declared.entry(&entry.event).or_default().push(entry);
    }
    for (event, versions) in &declared {
        let own: Vec<&EventEntry> = decoders.iter().filter(|d| d.event == *event).collect();
        if own.is_empty() {
            judgement.notes.push(format!(
                "`{event}` ({} version(s) in the contract) has no decoder here; its messages \
                 are not read",
                versions.len()
            ));
            continue;
        }
        judgement.event_types += 1;
        for written in versions {
            judgement.versions += 1;
            let Some(decoder) = own.iter().find(|d| d.version == written.version) else {
                judgement.errors.push(format!(
                    "{} has no decoder: add a struct with #[domain_event(name = \"{event}\", \
                     version = {})] and list it in the consumer's EventDecoder (or upcast it)",
                    written.title(),
                    written.version
                ));
                continue;
            };
            if decoder.aggregate != written.aggregate {
                judgement.errors.push(format!(
                    "{}: the contract's aggregate is `{}`, the decoder's `{}`",
                    written.title(),
                    written.aggregate,
                    decoder.aggregate
                ));
            }
            for problem in reader::problems(written, decoder) {
                judgement
                    .errors
                    .push(format!("{}: {problem}", written.title()));
            }
        }
    }
    for decoder in decoders {
        let known = declared.get(decoder.event.as_str());
        if known.is_none_or(|versions| versions.iter().all(|v| v.version != decoder.version)) {
            let what = match known {
                None => "an event type the contract does not declare",
                Some(_) => "a version the contract does not declare",
            };
            judgement.errors.push(format!(
                "the decoder of {} reads {what}: check its name and version against the \
                 producer's, or pin the producer's newer contract",
                decoder.title()
            ));
        }
    }
    judgement
}
