//! `cargo outbox lock`: records the payload schema of every event of a crate
//! in its `outbox.lock`, which `#[derive(DomainEvent)]` checks on every
//! build; `cargo outbox lock --check` fails when the lock is stale (for CI).
//!
//! It reads the crate's sources with the same model the derive uses
//! (`outbox-schema`), so both agree on every schema. Recorded versions are
//! never changed incompatibly: such a change is an error telling to bump the
//! version.
//!
//! `cargo outbox schema` prints the recorded events as a JSON Schema or
//! AsyncAPI document; `cargo outbox check --contract PATH` checks a
//! consumer's decoders against a producer's published lock.

mod check;
mod record;
mod schema;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use outbox_schema::schema_lock::{LOCK_ENV, LOCK_FILE, Lock, RECORD_COMMAND, lock_path};
use outbox_schema::sources;

/// Invoked by cargo as `cargo outbox ...`.
#[derive(Parser)]
#[command(name = "cargo", bin_name = "cargo", version, about)]
enum Cargo {
    /// Outbox tooling.
    #[command(subcommand)]
    Outbox(Command),
}

#[derive(Subcommand)]
enum Command {
    /// Record new and bumped event versions (and additive changes) in outbox.lock.
    Lock(LockArgs),
    /// Print the recorded event versions as a JSON Schema or AsyncAPI document.
    Schema(schema::SchemaArgs),
    /// Check this crate's decoders against a producer's published outbox.lock.
    Check(check::CheckArgs),
}

#[derive(Args)]
struct LockArgs {
    /// Change nothing; exit 1 if outbox.lock is not up to date (for CI).
    #[arg(long)]
    check: bool,
    /// The crate's Cargo.toml (default: the one in or above the current directory).
    #[arg(long, value_name = "PATH")]
    manifest_path: Option<PathBuf>,
    /// Directories of the crate to read events from.
    #[arg(long = "src", value_name = "DIR", default_values = ["src", "tests", "examples", "benches"])]
    sources: Vec<PathBuf>,
}

fn main() -> ExitCode {
    // cargo runs `cargo-outbox outbox lock ..`; accept `cargo-outbox lock ..` too.
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|arg| arg != "outbox") {
        argv.insert(1, "outbox".into());
    }
    let Cargo::Outbox(command) = Cargo::parse_from(argv);
    let done = match command {
        Command::Lock(args) => lock(&args),
        Command::Schema(args) => schema::schema(&args).map(|()| ExitCode::SUCCESS),
        Command::Check(args) => check::check(&args),
    };
    match done {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn lock(args: &LockArgs) -> anyhow::Result<ExitCode> {
    let crate_dir = crate_dir(args.manifest_path.as_deref())?;
    let env_override = std::env::var(LOCK_ENV).ok();
    let path = lock_path(&crate_dir, env_override.as_deref());
    // Messages name the lock as the user did.
    let lock_name = match env_override.as_deref().map(str::trim) {
        Some(given) if !given.is_empty() => given.to_owned(),
        _ => LOCK_FILE.to_owned(),
    };
    let lock = Lock::read(&path)?.unwrap_or_default();
    let sources = sources::scan(&crate_dir, &args.sources).map_err(anyhow::Error::msg)?;
    if sources.events.is_empty() && lock.events.is_empty() {
        let dirs: Vec<String> = args
            .sources
            .iter()
            .map(|dir| dir.display().to_string())
            .collect();
        println!(
            "no #[derive(DomainEvent)] in {} of {}: nothing to record",
            dirs.join(", "),
            crate_dir.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let outcome = record::record(&sources, &lock, &lock_name);

    for note in &outcome.notes {
        eprintln!("note: {note}");
    }
    if !outcome.errors.is_empty() {
        for error in &outcome.errors {
            eprintln!("error: {error}");
        }
        eprintln!(
            "error: {lock_name} was not changed: {} problem(s) above",
            outcome.errors.len()
        );
        return Ok(ExitCode::FAILURE);
    }
    let text = outcome.lock.to_toml();
    let current = std::fs::read_to_string(&path).ok();
    let up_to_date = current.as_deref() == Some(text.as_str());
    if args.check {
        if up_to_date {
            println!(
                "{lock_name} is up to date ({} recorded event versions)",
                outcome.lock.events.len()
            );
            return Ok(ExitCode::SUCCESS);
        }
        let stale = if outcome.changes.is_empty() {
            vec!["its formatting differs from what the command writes".to_owned()]
        } else {
            outcome
                .changes
                .iter()
                .map(|change| change.replacen("recorded", "not recorded:", 1))
                .collect()
        };
        for reason in stale {
            eprintln!("error: {lock_name} is stale: {reason}");
        }
        eprintln!("error: run `{RECORD_COMMAND}` and commit {lock_name}");
        return Ok(ExitCode::FAILURE);
    }
    if !up_to_date {
        std::fs::write(&path, &text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    for change in &outcome.changes {
        println!("{change} in {lock_name}");
    }
    if outcome.changes.is_empty() {
        println!(
            "{lock_name} is up to date ({} recorded event versions)",
            outcome.lock.events.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The directory of the package whose manifest is `manifest_path`, or of the
/// nearest `Cargo.toml` with a `[package]` from the current directory up.
fn crate_dir(manifest_path: Option<&Path>) -> anyhow::Result<PathBuf> {
    let manifest = match manifest_path {
        Some(path) => {
            let path = if path.is_dir() {
                path.join("Cargo.toml")
            } else {
                path.to_owned()
            };
            anyhow::ensure!(path.is_file(), "no manifest at {}", path.display());
            path
        }
        None => {
            let cwd = std::env::current_dir().context("cannot read the current directory")?;
            cwd.ancestors()
                .map(|dir| dir.join("Cargo.toml"))
                .find(|path| path.is_file())
                .with_context(|| {
                    format!(
                        "no Cargo.toml in {} or above; pass --manifest-path",
                        cwd.display()
                    )
                })?
        }
    };
    let text = std::fs::read_to_string(&manifest)
        .with_context(|| format!("cannot read {}", manifest.display()))?;
    anyhow::ensure!(
        text.lines().any(|line| line.trim() == "[package]"),
        "{} has no [package]: run the command in the crate that defines the events, or pass \
         --manifest-path <crate>/Cargo.toml",
        manifest.display()
    );
    let dir = manifest.parent().map(Path::to_owned).unwrap_or_default();
    Ok(if dir.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        dir
    })
}
