//! `outbox-relay`: see `outbox-relay --help`.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use outbox_relay::cli::{Cli, LogFormat};
use outbox_relay::config::SettingsError;
use outbox_relay::redact::{self, RedactingStderr, redact_text};
use tracing_subscriber::EnvFilter;

/// clap's exit code for usage errors, used for settings out of range too.
const USAGE_ERROR: u8 = 2;

fn main() -> ExitCode {
    redact::install_panic_hook();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(&error),
    };
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,pgwire_replication=off"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(RedactingStderr);
    match cli.global.log_format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
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
            eprintln!("error: {}", redact_text(&format!("{error:#}")));
            if error.is::<SettingsError>() {
                ExitCode::from(USAGE_ERROR)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Prints clap's message (help and version included) with any credential
/// it echoes masked: a mistyped option may carry a database URL.
fn usage_error(error: &clap::Error) -> ExitCode {
    if error.use_stderr() {
        let rendered = error.render();
        let text = if std::io::stderr().is_terminal() {
            rendered.ansi().to_string()
        } else {
            rendered.to_string()
        };
        eprint!("{}", redact_text(&text));
    } else {
        // Help and version: nothing of the user's is echoed.
        let _ = error.print();
    }
    ExitCode::from(error.exit_code().clamp(0, 255) as u8)
}
