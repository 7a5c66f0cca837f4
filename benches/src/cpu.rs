//! CPU time by process group, read from `/proc`: on a small machine shared
//! by the database, the broker and the relay, where the CPU goes explains
//! the throughput.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

/// Linux reports process times in clock ticks of `USER_HZ`, 100 per second
/// on every architecture Rust supports.
const TICKS_PER_SECOND: u64 = 100;

/// Cumulative CPU time (user + system) of this process and, per process
/// id, of every `postgres` process, of some PostgreSQL backends and of
/// every `tansu` process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// This process: the relay (with librdkafka's threads) or the writers.
    pub this_process: Duration,
    /// Every PostgreSQL server process, including other clients' backends.
    pub postgres: BTreeMap<u32, Duration>,
    /// The PostgreSQL backends asked for.
    pub backends: BTreeMap<u32, Duration>,
    /// The Kafka-API broker.
    pub broker: BTreeMap<u32, Duration>,
}

impl CpuTimes {
    /// Reads the current times, with those of the PostgreSQL `backends`
    /// (from `pg_stat_activity.pid`); processes that cannot be read are
    /// left out.
    pub fn now(backends: &[u32]) -> Self {
        let mut times = Self {
            this_process: process_time("self").unwrap_or_default(),
            backends: backends
                .iter()
                .filter_map(|&pid| Some((pid, process_time(&pid.to_string())?)))
                .collect(),
            ..Self::default()
        };
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return times;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|pid| pid.parse::<u32>().ok())
            else {
                continue;
            };
            let command = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let group = match command.trim() {
                "postgres" => &mut times.postgres,
                "tansu" => &mut times.broker,
                _ => continue,
            };
            if let Some(time) = process_time(&pid.to_string()) {
                group.insert(pid, time);
            }
        }
        times
    }

    /// The CPU used since `earlier`, as milliseconds per 1,000 `items`.
    /// Processes are compared one by one: one that started since counts
    /// whole, one that exited since is lost (its last slice with it).
    pub fn per_thousand_since(&self, earlier: &CpuTimes, items: usize) -> CpuPerThousand {
        let per_thousand = |used: Duration| {
            if items == 0 {
                0.0
            } else {
                used.as_secs_f64() * 1000.0 * 1000.0 / items as f64
            }
        };
        CpuPerThousand {
            this_process_ms: per_thousand(self.this_process.saturating_sub(earlier.this_process)),
            postgres_ms: per_thousand(used_since(&self.postgres, &earlier.postgres)),
            backends_ms: per_thousand(used_since(&self.backends, &earlier.backends)),
            broker_ms: per_thousand(used_since(&self.broker, &earlier.broker)),
        }
    }
}

/// CPU used by each process of `now` since `earlier`, summed.
fn used_since(now: &BTreeMap<u32, Duration>, earlier: &BTreeMap<u32, Duration>) -> Duration {
    now.iter()
        .map(|(pid, &time)| time.saturating_sub(earlier.get(pid).copied().unwrap_or_default()))
        .sum()
}

/// CPU milliseconds spent per 1,000 items (events or transactions).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CpuPerThousand {
    /// In this process.
    pub this_process_ms: f64,
    /// In PostgreSQL (every process of the server, so other clients add noise).
    pub postgres_ms: f64,
    /// In the PostgreSQL backends asked for.
    pub backends_ms: f64,
    /// In the broker.
    pub broker_ms: f64,
}

/// User plus system time of `/proc/<pid>/stat`.
fn process_time(pid: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields resume after its ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After the name: state is field 3 of the man page, utime 14, stime 15.
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis(
        (user + system) * 1000 / TICKS_PER_SECOND,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_used_some_cpu() {
        let spin: u64 = (0..5_000_000u64).fold(0, |sum, n| sum.wrapping_add(n * n));
        assert!(spin > 0);
        assert!(process_time("self").is_some());
    }

    #[test]
    fn cpu_per_thousand_items() {
        let earlier = CpuTimes {
            postgres: BTreeMap::from([(7, Duration::from_secs(1)), (8, Duration::from_secs(5))]),
            ..CpuTimes::default()
        };
        let later = CpuTimes {
            this_process: Duration::from_millis(500),
            // 8 exited, 9 started.
            postgres: BTreeMap::from([(7, Duration::from_secs(2)), (9, Duration::from_secs(1))]),
            backends: BTreeMap::from([(7, Duration::from_secs(2))]),
            broker: BTreeMap::new(),
        };
        let used = later.per_thousand_since(&earlier, 10_000);
        assert_eq!(used.this_process_ms, 50.0);
        assert_eq!(used.postgres_ms, 200.0);
        assert_eq!(used.backends_ms, 200.0);
        assert_eq!(used.broker_ms, 0.0);
    }
}
