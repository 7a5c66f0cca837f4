//! `cargo outbox schema`: the crate's recorded contract as a JSON Schema
//! (2020-12) or AsyncAPI 3 document, for schema registries, documentation
//! and consumers in other languages.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use outbox_schema::export;
use outbox_schema::schema_lock::{LOCK_ENV, Lock, RECORD_COMMAND, lock_path};

/// `cargo outbox schema` options.
#[derive(Args)]
pub struct SchemaArgs {
    /// The document to print.
    #[arg(long, value_enum, default_value_t = Format::JsonSchema)]
    format: Format,
    /// The crate's Cargo.toml (default: the one in or above the current directory).
    #[arg(long, value_name = "PATH")]
    manifest_path: Option<PathBuf>,
    /// The relay's topic template, naming each channel's address (AsyncAPI).
    #[arg(long, value_name = "TEMPLATE", default_value = export::DEFAULT_TOPIC_TEMPLATE)]
    topic_template: String,
    /// Write the document to this file instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// The documents `cargo outbox schema` prints.
#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// A JSON Schema (2020-12) listing every recorded event version.
    JsonSchema,
    /// An AsyncAPI 3.0 document: a channel per aggregate type, a message per event version.
    Asyncapi,
}

/// Prints the document of the crate's lock.
pub fn schema(args: &SchemaArgs) -> anyhow::Result<()> {
    let crate_dir = crate::crate_dir(args.manifest_path.as_deref())?;
    let path = lock_path(&crate_dir, std::env::var(LOCK_ENV).ok().as_deref());
    let lock = Lock::read(&path)?.with_context(|| {
        format!(
            "no lock at {}: run `{RECORD_COMMAND}` first; the documents describe the recorded \
             event versions",
            path.display()
        )
    })?;
    let (name, version) = package(&crate_dir)?;
    let document = match args.format {
        Format::JsonSchema => export::json_schema(&lock, &format!("{name} events")),
        Format::Asyncapi => export::asyncapi(
            &lock,
            &format!("{name} events"),
            &version,
            &args.topic_template,
        ),
    };
    let mut text = serde_json::to_string_pretty(&document).context("cannot write the document")?;
    text.push('\n');
    match &args.output {
        Some(output) => std::fs::write(output, text)
            .with_context(|| format!("cannot write {}", output.display()))?,
        None => print!("{text}"),
    }
    Ok(())
}

/// The package's name and version; a version inherited from the
/// workspace is read there.
fn package(crate_dir: &Path) -> anyhow::Result<(String, String)> {
    let manifest = read_toml(&crate_dir.join("Cargo.toml"))?;
    let package = manifest.get("package");
    let name = package
        .and_then(|package| package.get("name"))
        .and_then(toml::Value::as_str)
        .unwrap_or("events")
        .to_owned();
    let version = match package.and_then(|package| package.get("version")) {
        Some(toml::Value::String(version)) => version.clone(),
        Some(_) => workspace_version(crate_dir).unwrap_or_else(|| "0.0.0".to_owned()),
        None => "0.0.0".to_owned(),
    };
    Ok((name, version))
}

/// `[workspace.package] version` of the nearest workspace above `crate_dir`.
fn workspace_version(crate_dir: &Path) -> Option<String> {
    crate_dir.ancestors().find_map(|dir| {
        let manifest = read_toml(&dir.join("Cargo.toml")).ok()?;
        let version = manifest.get("workspace")?.get("package")?.get("version")?;
        version.as_str().map(str::to_owned)
    })
}

fn read_toml(path: &Path) -> anyhow::Result<toml::Table> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    text.parse()
        .with_context(|| format!("cannot parse {}", path.display()))
}
