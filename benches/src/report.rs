//! Printing results: Markdown tables (pasted into `BENCHMARKS.md` as they
//! are), a description of the machine, and the `--json` output.

use std::fmt;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use serde::Serialize;

/// A Markdown table with padded columns.
///
/// ```
/// use outbox_bench::report::Table;
///
/// let mut table = Table::new(["variant", "txn/s"]);
/// table.row(["no events", "812"]);
/// assert_eq!(
///     table.to_string(),
///     "| variant   | txn/s |\n|-----------|-------|\n| no events | 812   |\n"
/// );
/// ```
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column names.
    pub fn new<I>(header: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        Self {
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row; missing cells are left empty.
    pub fn row<I>(&mut self, cells: I)
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let columns = self.header.len();
        let widths: Vec<usize> = (0..columns)
            .map(|column| {
                std::iter::once(&self.header)
                    .chain(&self.rows)
                    .filter_map(|row| row.get(column))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |f: &mut fmt::Formatter<'_>, cells: &[String]| -> fmt::Result {
            for (column, width) in widths.iter().enumerate() {
                let cell = cells.get(column).map(String::as_str).unwrap_or("");
                write!(f, "| {cell:<width$} ")?;
            }
            writeln!(f, "|")
        };
        line(f, &self.header)?;
        for width in &widths {
            write!(f, "|{}", "-".repeat(width + 2))?;
        }
        writeln!(f, "|")?;
        for row in &self.rows {
            line(f, row)?;
        }
        Ok(())
    }
}

/// Where and when a benchmark ran.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// CPUs available to this process.
    pub cpus: usize,
    /// The CPU model from `/proc/cpuinfo`.
    pub cpu_model: String,
    /// The server's `version()`.
    pub postgres: String,
    /// The server's `synchronous_commit` (each commit waits for its WAL flush when `on`).
    pub synchronous_commit: String,
    /// Start of the run, UTC, from the database clock.
    pub started_at: String,
    /// `/proc/loadavg` at the start: other work competing for the CPUs.
    pub load_average_at_start: String,
}

impl Machine {
    /// Describes this machine and the PostgreSQL server behind `db`.
    pub async fn describe(db: &DatabaseConnection) -> Result<Self, sea_orm::DbErr> {
        let row = db
            .query_one_raw(Statement::from_string(
                DbBackend::Postgres,
                "SELECT version(), current_setting('synchronous_commit'), \
                 to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI \"UTC\"')",
            ))
            .await?
            .ok_or_else(|| sea_orm::DbErr::RecordNotFound("SELECT version()".into()))?;
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find(|line| line.starts_with("model name"))
                    .and_then(|line| line.split_once(':'))
                    .map(|(_, model)| model.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".into());
        Ok(Self {
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            cpu_model,
            postgres: row.try_get_by_index(0)?,
            synchronous_commit: row.try_get_by_index(1)?,
            started_at: row.try_get_by_index(2)?,
            load_average_at_start: load_average(),
        })
    }
}

impl fmt::Display for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let postgres = self.postgres.split(" on ").next().unwrap_or(&self.postgres);
        write!(
            f,
            "{} CPUs ({}), {postgres} (synchronous_commit={}), started {}, load average {}",
            self.cpus,
            self.cpu_model,
            self.synchronous_commit,
            self.started_at,
            self.load_average_at_start
        )
    }
}

/// The 1, 5 and 15 minute load averages from `/proc/loadavg`, or `unknown`.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|line| {
            line.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Prints the readable `report` on standard output, or, with `json`, the
/// `results` as JSON on standard output and the report on standard error.
pub fn emit<T: Serialize>(json: bool, report: &str, results: &T) -> anyhow::Result<()> {
    let report = format!("{report}\nload average at the end: {}\n", load_average());
    if json {
        eprint!("{report}");
        println!("{}", serde_json::to_string_pretty(results)?);
    } else {
        print!("{report}");
    }
    Ok(())
}

/// Progress on standard error, so it never mixes with `--json` output.
#[macro_export]
macro_rules! progress {
    ($($arg:tt)*) => {
        eprintln!("[{:>7.1}s] {}", $crate::report::elapsed_seconds(), format_args!($($arg)*))
    };
}

/// Seconds since the first call, for [`progress!`] lines.
pub fn elapsed_seconds() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
}

/// A rate with thousands separators, rounded to a whole number: `12,345`.
///
/// ```
/// assert_eq!(outbox_bench::report::rate(12345.6), "12,346");
/// assert_eq!(outbox_bench::report::rate(812.2), "812");
/// ```
pub fn rate(per_second: f64) -> String {
    let digits = format!("{:.0}", per_second.max(0.0));
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

/// Milliseconds with two decimals: `1.25`.
pub fn ms(milliseconds: f64) -> String {
    format!("{milliseconds:.2}")
}

/// A ratio with two decimals and a trailing `x`: `1.31x`.
pub fn ratio(value: f64) -> String {
    format!("{value:.2}x")
}
