//! Pauses after failures: the relay's own exponential backoff, and the
//! cooldown of each aggregate whose last send failed.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::record::OutboxRecord;
use crate::source::{AggregateKey, FailedRow, Settlement};

/// The first pause after a failure, for the relay and for an aggregate.
pub(crate) const INITIAL_BACKOFF: Duration = Duration::from_millis(100);

/// Aggregates whose last attempt failed, with when they may be tried again.
#[derive(Debug)]
pub(super) struct Cooldown {
    initial: Duration,
    max: Duration,
    aggregates: HashMap<AggregateKey, (Instant, Duration)>,
}

impl Cooldown {
    pub(super) fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            aggregates: HashMap::new(),
        }
    }

    /// Aggregates still cooling down at `now`, to leave out of the claim.
    pub(super) fn cooling(&self, now: Instant) -> Vec<AggregateKey> {
        let mut cooling: Vec<AggregateKey> = self
            .aggregates
            .iter()
            .filter(|(_, (until, _))| *until > now)
            .map(|(key, _)| key.clone())
            .collect();
        cooling.sort();
        cooling
    }

    /// A published row ends its aggregate's cooldown; a failed one starts
    /// or doubles it; a dead-lettered one ends it, so later events proceed.
    pub(super) fn record(
        &mut self,
        records: &[OutboxRecord],
        settlement: &Settlement,
        now: Instant,
    ) {
        // The usual batch: nothing failed and no aggregate cools down, so
        // there is no cooldown to start or end.
        if settlement.failed.is_empty() && self.aggregates.is_empty() {
            return;
        }
        let published: HashSet<&str> = settlement.published.iter().map(String::as_str).collect();
        let failed: HashMap<&str, &FailedRow> = settlement
            .failed
            .iter()
            .map(|row| (row.id.as_str(), row))
            .collect();
        for record in records {
            let key = AggregateKey::of(record);
            if published.contains(record.id.as_str()) {
                self.aggregates.remove(&key);
            } else if let Some(row) = failed.get(record.id.as_str()) {
                if row.dead_letter {
                    self.aggregates.remove(&key);
                } else {
                    let pause = match self.aggregates.get(&key) {
                        Some((_, previous)) => (*previous * 2).min(self.max),
                        None => self.initial,
                    };
                    self.aggregates.insert(key, (now + pause, pause));
                }
            }
        }
    }
}

/// Exponential backoff with a cap.
#[derive(Debug)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            current: initial,
        }
    }

    pub(crate) fn next(&mut self) -> Duration {
        let pause = self.current;
        self.current = (self.current * 2).min(self.max);
        pause
    }

    pub(crate) fn reset(&mut self) {
        self.current = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::test_record as record;

    #[test]
    fn failing_aggregates_cool_down_and_recover() {
        let mut cooldown = Cooldown::new(Duration::from_millis(100), Duration::from_millis(300));
        let records = [record("a1", "a", 0), record("b1", "b", 0)];
        let failed_a = Settlement {
            published: vec!["b1".into()],
            failed: vec![FailedRow {
                id: "a1".into(),
                error: "refused".into(),
                dead_letter: false,
            }],
        };
        let start = Instant::now();
        cooldown.record(&records, &failed_a, start);
        let keys = |keys: Vec<AggregateKey>| -> Vec<String> {
            keys.into_iter().map(|key| key.aggregate_id).collect()
        };
        assert_eq!(keys(cooldown.cooling(start)), ["a"]);
        assert!(
            cooldown
                .cooling(start + Duration::from_millis(150))
                .is_empty()
        );
        // Failing again doubles the pause, up to the cap.
        cooldown.record(&records, &failed_a, start);
        cooldown.record(&records, &failed_a, start);
        cooldown.record(&records, &failed_a, start);
        assert_eq!(
            keys(cooldown.cooling(start + Duration::from_millis(250))),
            ["a"]
        );
        assert!(
            cooldown
                .cooling(start + Duration::from_millis(350))
                .is_empty()
        );
        // Success or a dead letter ends it.
        let a_published = Settlement {
            published: vec!["a1".into()],
            failed: vec![],
        };
        cooldown.record(&records, &a_published, start);
        assert!(cooldown.cooling(start).is_empty());
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let pauses: Vec<_> = (0..4).map(|_| backoff.next().as_millis()).collect();
        assert_eq!(pauses, [100, 200, 350, 350]);
        backoff.reset();
        assert_eq!(backoff.next().as_millis(), 100);
    }
}
