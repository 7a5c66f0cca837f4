//! `outbox-relay`: see `outbox-relay --help`.

use std::fmt;
use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use outbox_relay::cli::{Cli, LogFormat, usage_error_line};
use outbox_relay::redact::{self, RedactingStderr, redact_text};
use tracing::field::{Field, Visit};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;

/// Makes glibc's allocator map every allocation of 128 KiB or more on its
/// own and return it to the system when it is freed. By default glibc
/// raises that threshold (up to 32 MiB) after the first large block is
/// freed, and from then on keeps large payloads in its heaps, one per
/// thread, which hold on to the memory of a burst of large rows.
///
/// It also keeps one heap for all threads. By default each thread that
/// allocates while another holds the heap gets a heap of its own (up to
/// eight per core), and librdkafka's, tokio's and the TLS threads' heaps
/// each keep freed memory: one heap takes about 3 MB off the peak of a
/// CDC relay reading a 200,000-event transaction, at the same drain rate
/// (per-thread caches serve most small allocations without the lock;
/// BENCHMARKS.md, "Memory, release build").
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_large_allocations() {
    // SAFETY: mallopt only tunes the allocator; it is called before any
    // other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Elsewhere the allocator's own behaviour stands.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_large_allocations() {}

/// clap's exit code for usage errors, used for settings out of range too.
const USAGE_ERROR: u8 = 2;

fn main() -> ExitCode {
    release_large_allocations();
    redact::install_panic_hook();
    outbox_relay::tls::install_crypto_provider();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(&error),
    };
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,pgwire_replication=off,lapin=off"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(RedactingStderr);
    match cli.global.log_format {
        LogFormat::Text => logs
            .fmt_fields(WithoutStatements)
            .with_ansi(std::io::stderr().is_terminal())
            .init(),
        LogFormat::Json => logs.json().init(),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(outbox_relay::commands::execute(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let usage = error.is_usage();
            // The whole chain of causes, on one line, each cause once.
            let error = anyhow::Error::from(error);
            eprintln!("error: {}", redact_text(&error_line(&error)));
            if usage {
                ExitCode::from(USAGE_ERROR)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// `error` and its causes on one line, each cause once: a cause whose text
/// its error already quotes is not repeated.
fn error_line(error: &anyhow::Error) -> String {
    let mut line = error.to_string();
    for cause in error.chain().skip(1) {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    line
}

/// The text log's fields without `db.statement`: sqlx's slow-statement
/// warning then shows the statement's summary (its first words), its
/// duration and the threshold on one line, not the whole multi-line SQL.
struct WithoutStatements;

impl<'writer> FormatFields<'writer> for WithoutStatements {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = FieldWriter {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct FieldWriter<'writer> {
    writer: Writer<'writer>,
    first: bool,
    result: fmt::Result,
}

impl Visit for FieldWriter<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let name = field.name();
        if self.result.is_err() || name == "db.statement" || name.starts_with("log.") {
            return;
        }
        let separator = if std::mem::take(&mut self.first) {
            ""
        } else {
            " "
        };
        self.result = if name == "message" {
            write!(self.writer, "{separator}{value:?}")
        } else {
            write!(self.writer, "{separator}{name}={value:?}")
        };
    }
}

/// Prints clap's message (help and version included) with any credential
/// it echoes masked: a mistyped option may carry a database URL. An error
/// is one line, like every other error of the relay.
fn usage_error(error: &clap::Error) -> ExitCode {
    if error.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        // The help, asked for by giving no subcommand: several lines by nature.
        eprint!("{}", redact_text(&error.render().to_string()));
    } else if error.use_stderr() {
        eprintln!("{}", redact_text(&usage_error_line(error)));
    } else {
        // Help and version: nothing of the user's is echoed.
        let _ = error.print();
    }
    ExitCode::from(error.exit_code().clamp(0, 255) as u8)
}
