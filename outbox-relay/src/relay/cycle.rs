//! The relay loop's decisions, without I/O: claim -> send -> settle -> wait.
//!
//! [`Cycle`] says what the loop does next ([`Step`]) from what the last
//! step came to: a claim that failed or found nothing, a batch the sink
//! answered in part or not at all, a settle refused because another relay
//! took a shard over (fencing), a lease that ran out before the send, a
//! closed sink, a shutdown. [`super::Relay::run`] performs each step and
//! feeds its outcome back; the tests below drive the decisions with plain
//! values in place of claims and answers.

use std::time::Duration;

use super::{Backoff, BatchReport, INITIAL_BACKOFF, RelayError, RelayOptions, Shortened};
use crate::source::SourceError;

/// A claimed batch, as the decisions see it.
pub(crate) trait Batch {
    /// Rows claimed.
    fn rows(&self) -> usize;

    /// How the byte bound shortened the claim, if it did.
    fn shortened(&self) -> Option<Shortened> {
        None
    }
}

/// A batch the sink answered, as the decisions see it.
pub(crate) trait Answer {
    /// What the sink made of the batch.
    fn report(&self) -> &BatchReport;
}

/// What sending a batch came to.
#[derive(Debug)]
pub(crate) enum Sent<A> {
    /// The sink answered every row.
    Answered(A),
    /// The shard lease ran out before the send: nothing was sent, and the
    /// claim is released to the shards' next owner.
    Abandoned,
}

/// How long the loop waits before its next claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Not at all: the last batch was full, or the relay drains.
    Skip,
    /// Until new rows may be pending, at most the poll interval.
    ForRows,
    /// This long, after a failure.
    Backoff(Duration),
}

/// What the relay loop does now. `C` is a claimed batch, `A` a batch the
/// sink answered whose settle has not committed yet.
#[derive(Debug)]
pub(crate) enum Step<C, A> {
    /// Settle `answered`, if any, while waiting as `wait` says (a shutdown
    /// ends the wait); then claim.
    Wait {
        /// The batch answered last.
        answered: Option<A>,
        /// How long to wait.
        wait: Wait,
    },
    /// Claim a batch, leaving out cooling-down aggregates.
    Claim,
    /// Settle an empty claim, which may hold a transaction open.
    ReleaseEmpty(C),
    /// Count the pending rows of the whole table: with `drain`, the run
    /// ends once there are none.
    CheckDrained,
    /// Send `batch`. Meanwhile `answered`, if any, settles and then, if
    /// `claim_ahead`, the next batch is claimed after the rows of this one.
    Send {
        /// The batch to send.
        batch: C,
        /// The batch answered before it.
        answered: Option<A>,
        /// Whether to claim the next batch while this one is at the sink.
        claim_ahead: bool,
    },
    /// Settle `answered`, if any, flush the sink and end with `outcome`.
    Stop {
        /// The batch answered last.
        answered: Option<A>,
        /// How the run ends.
        outcome: Result<(), RelayError>,
    },
}

/// The first step of a run.
pub(crate) fn start<C, A>() -> Step<C, A> {
    Step::Wait {
        answered: None,
        wait: Wait::Skip,
    }
}

/// The relay loop's state between steps: the pause after failures and the
/// settings the decisions read.
#[derive(Debug)]
pub(crate) struct Cycle {
    batch_size: usize,
    drain: bool,
    backoff: Backoff,
}

impl Cycle {
    /// The decisions of a relay run with `options`.
    pub(crate) fn new(options: &RelayOptions) -> Self {
        Self {
            batch_size: options.batch_size,
            drain: options.drain,
            backoff: Backoff::new(INITIAL_BACKOFF, options.max_backoff),
        }
    }

    /// After the wait, during which the previous batch settled (`settled`).
    pub(crate) fn waited<C, A>(
        &mut self,
        settled: Result<(), SourceError>,
        shutdown: bool,
    ) -> Step<C, A> {
        if let Err(error) = settled {
            return self.database_failed(&error);
        }
        if shutdown {
            return stop(None, Ok(()));
        }
        Step::Claim
    }

    /// After a claim.
    pub(crate) fn claimed<C: Batch, A>(&mut self, claimed: Result<C, SourceError>) -> Step<C, A> {
        match claimed {
            Err(error) => self.database_failed(&error),
            Ok(batch) if batch.rows() == 0 => Step::ReleaseEmpty(batch),
            Ok(batch) => Step::Send {
                claim_ahead: self.claims_ahead(&batch),
                batch,
                answered: None,
            },
        }
    }

    /// After an empty claim was settled.
    pub(crate) fn released<C, A>(&mut self, settled: Result<(), SourceError>) -> Step<C, A> {
        if let Err(error) = settled {
            return self.database_failed(&error);
        }
        // Other instances' shards (or shards whose dead owner's lease has
        // not expired yet) may still hold rows.
        if self.drain {
            return Step::CheckDrained;
        }
        self.idle()
    }

    /// After counting the pending rows (`drain` only).
    pub(crate) fn checked_drained<C, A>(&mut self, nothing_pending: bool) -> Step<C, A> {
        if nothing_pending {
            return stop(None, Ok(()));
        }
        self.idle()
    }

    /// After a send, and what ran beside it: the previous batch's settle
    /// and the claim ahead (`None` when not attempted or empty).
    pub(crate) fn sent<C: Batch, A: Answer>(
        &mut self,
        sent: Sent<A>,
        settled: Result<(), SourceError>,
        ahead: Result<Option<C>, SourceError>,
        shutdown: bool,
    ) -> Step<C, A> {
        if let Err(error) = settled {
            // Both batches stay pending (their claims are released), so no
            // aggregate has a later event marked while an earlier one is not.
            return self.database_failed(&error);
        }
        let ahead = ahead.unwrap_or_else(|error| {
            tracing::warn!(%error, "cannot claim the next batch ahead; claiming after the settle");
            None
        });
        let answered = match sent {
            Sent::Answered(answered) => answered,
            Sent::Abandoned => {
                return Step::Wait {
                    answered: None,
                    wait: Wait::Skip,
                };
            }
        };
        let report = answered.report();
        if let Some(reason) = report.sink_closed.clone() {
            return stop(Some(answered), Err(RelayError::SinkClosed(reason)));
        }
        let wait = self.wait_after(report);
        // A batch claimed ahead is sent only if every row before it was
        // published: otherwise an aggregate's later event could overtake a
        // failed one. Dropped, it is released and claimed again.
        let ahead = ahead.filter(|_| report.published == report.claimed && !shutdown);
        match ahead {
            Some(batch) => Step::Send {
                claim_ahead: self.claims_ahead(&batch),
                batch,
                answered: Some(answered),
            },
            None => Step::Wait {
                answered: Some(answered),
                wait,
            },
        }
    }

    /// The wait after a batch the sink answered.
    fn wait_after(&mut self, report: &BatchReport) -> Wait {
        if report.failed > 0 && report.published == 0 {
            // Nothing got through: an outage, not a poison message.
            return Wait::Backoff(self.backoff.next());
        }
        self.backoff.reset();
        if self.more_pending(report.claimed, report.shortened) || self.drain {
            Wait::Skip
        } else {
            Wait::ForRows
        }
    }

    /// A full batch (in rows or bytes) suggests more rows.
    fn more_pending(&self, rows: usize, shortened: Option<Shortened>) -> bool {
        rows == self.batch_size || shortened.is_some()
    }

    /// Whether to claim the next batch while `batch` is at the sink: when
    /// it is full, unless rows were cut off its end, which its claim holds
    /// until it is settled (see `relay/byte_bound.rs`).
    fn claims_ahead(&self, batch: &impl Batch) -> bool {
        self.more_pending(batch.rows(), batch.shortened())
            && batch.shortened() != Some(Shortened::Cut)
    }

    /// Nothing to claim: wait for rows.
    fn idle<C, A>(&mut self) -> Step<C, A> {
        self.backoff.reset();
        Step::Wait {
            answered: None,
            wait: Wait::ForRows,
        }
    }

    /// Logs a failed claim or settle and pauses before the next try.
    fn database_failed<C, A>(&mut self, error: &SourceError) -> Step<C, A> {
        let pause = self.backoff.next();
        tracing::error!(%error, retry_in = ?pause, "cannot claim or mark outbox rows");
        Step::Wait {
            answered: None,
            wait: Wait::Backoff(pause),
        }
    }
}

fn stop<C, A>(answered: Option<A>, outcome: Result<(), RelayError>) -> Step<C, A> {
    Step::Stop { answered, outcome }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claimed batch of this many rows.
    impl Batch for usize {
        fn rows(&self) -> usize {
            *self
        }
    }

    impl Answer for BatchReport {
        fn report(&self) -> &BatchReport {
            self
        }
    }

    /// A claimed batch of this many rows, shortened by the byte bound.
    impl Batch for (usize, Shortened) {
        fn rows(&self) -> usize {
            self.0
        }

        fn shortened(&self) -> Option<Shortened> {
            Some(self.1)
        }
    }

    type TestStep = Step<usize, BatchReport>;

    fn cycle(drain: bool) -> Cycle {
        Cycle::new(&RelayOptions {
            batch_size: 10,
            max_backoff: Duration::from_millis(400),
            drain,
            ..RelayOptions::default()
        })
    }

    fn report(claimed: usize, published: usize, failed: usize) -> BatchReport {
        BatchReport {
            claimed,
            published,
            failed,
            ..BatchReport::default()
        }
    }

    fn fenced() -> SourceError {
        SourceError::Fenced(vec![3])
    }

    fn backoff(step: &TestStep) -> Option<u128> {
        match step {
            Step::Wait {
                answered: None,
                wait: Wait::Backoff(pause),
            } => Some(pause.as_millis()),
            _ => None,
        }
    }

    /// The step after the sink answered a batch with `answer`, with no
    /// claim ahead.
    fn send(cycle: &mut Cycle, answer: BatchReport) -> TestStep {
        cycle.sent(Sent::Answered(answer), Ok(()), Ok(None), false)
    }

    #[test]
    fn a_run_claims_at_once_and_stops_on_shutdown_after_its_wait() {
        let mut cycle = cycle(false);
        assert!(matches!(
            start::<usize, BatchReport>(),
            Step::Wait {
                answered: None,
                wait: Wait::Skip
            }
        ));
        assert!(matches!(
            cycle.waited::<usize, BatchReport>(Ok(()), false),
            Step::Claim
        ));
        assert!(matches!(
            cycle.waited::<usize, BatchReport>(Ok(()), true),
            Step::Stop {
                answered: None,
                outcome: Ok(())
            }
        ));
    }

    #[test]
    fn a_claim_is_sent_and_a_full_one_is_followed_by_a_claim_ahead() {
        let mut cycle = cycle(false);
        let step: TestStep = cycle.claimed(Ok(4));
        assert!(matches!(
            step,
            Step::Send {
                batch: 4,
                answered: None,
                claim_ahead: false
            }
        ));
        let step: TestStep = cycle.claimed(Ok(10));
        assert!(matches!(
            step,
            Step::Send {
                batch: 10,
                claim_ahead: true,
                ..
            }
        ));
    }

    #[test]
    fn a_batch_the_byte_bound_shortened_is_followed_by_a_claim_at_once() {
        let mut cycle = cycle(false);
        let step: Step<(usize, Shortened), BatchReport> =
            cycle.claimed(Ok((3, Shortened::Limited)));
        assert!(matches!(
            step,
            Step::Send {
                claim_ahead: true,
                ..
            }
        ));
        // Rows cut off the end stay held by the claim until its settle: no
        // claim ahead of it.
        let step: Step<(usize, Shortened), BatchReport> = cycle.claimed(Ok((3, Shortened::Cut)));
        assert!(matches!(
            step,
            Step::Send {
                claim_ahead: false,
                ..
            }
        ));
        let cut = BatchReport {
            shortened: Some(Shortened::Cut),
            ..report(3, 3, 0)
        };
        assert!(matches!(
            send(&mut cycle, cut),
            Step::Wait {
                answered: Some(_),
                wait: Wait::Skip
            }
        ));
        // Three rows with nothing shortened: the backlog is drained.
        assert!(matches!(
            send(&mut cycle, report(3, 3, 0)),
            Step::Wait {
                wait: Wait::ForRows,
                ..
            }
        ));
    }

    #[test]
    fn an_empty_claim_is_released_then_the_relay_waits_for_rows() {
        let mut cycle = cycle(false);
        let step: TestStep = cycle.claimed(Ok(0));
        assert!(matches!(step, Step::ReleaseEmpty(0)));
        let step: TestStep = cycle.released(Ok(()));
        assert!(matches!(
            step,
            Step::Wait {
                answered: None,
                wait: Wait::ForRows
            }
        ));
    }

    #[test]
    fn a_draining_relay_stops_once_nothing_is_pending_anywhere() {
        let mut cycle = cycle(true);
        let step: TestStep = cycle.released(Ok(()));
        assert!(matches!(step, Step::CheckDrained));
        // Another instance's shards still hold rows: keep waiting.
        let step: TestStep = cycle.checked_drained(false);
        assert!(matches!(
            step,
            Step::Wait {
                wait: Wait::ForRows,
                ..
            }
        ));
        let step: TestStep = cycle.checked_drained(true);
        assert!(matches!(
            step,
            Step::Stop {
                answered: None,
                outcome: Ok(())
            }
        ));
        // Draining, even a partial batch is followed by a claim at once.
        let step = send(&mut cycle, report(3, 3, 0));
        assert!(matches!(
            step,
            Step::Wait {
                answered: Some(_),
                wait: Wait::Skip
            }
        ));
    }

    #[test]
    fn database_failures_back_off_exponentially_until_a_success() {
        let mut cycle = cycle(false);
        let pauses: Vec<_> = [
            cycle.claimed(Err(fenced())),
            cycle.waited(Err(fenced()), false),
            cycle.released(Err(fenced())),
            cycle.sent(
                Sent::Answered(report(5, 5, 0)),
                Err(fenced()),
                Ok(Some(10)),
                false,
            ),
        ]
        .iter()
        .map(backoff)
        .collect();
        assert_eq!(
            pauses,
            [Some(100), Some(200), Some(400), Some(400)],
            "a failed settle drops the answered batch and the batch claimed ahead"
        );
        // A batch that got through resets the pause.
        send(&mut cycle, report(5, 5, 0));
        assert_eq!(backoff(&cycle.claimed(Err(fenced()))), Some(100));
        // So does an empty claim.
        let _: TestStep = cycle.released(Ok(()));
        assert_eq!(backoff(&cycle.claimed(Err(fenced()))), Some(100));
    }

    #[test]
    fn a_batch_that_published_nothing_is_an_outage_and_backs_off() {
        let mut cycle = cycle(false);
        for expected in [100, 200, 400, 400] {
            match send(&mut cycle, report(5, 0, 5)) {
                Step::Wait {
                    answered: Some(answered),
                    wait: Wait::Backoff(pause),
                } => {
                    assert_eq!(pause.as_millis(), expected);
                    assert_eq!(answered.failed, 5, "the failures are settled all the same");
                }
                other => panic!("unexpected step {other:?}"),
            }
        }
        // A poison message among published ones is no outage.
        let step = send(&mut cycle, report(5, 4, 1));
        assert!(matches!(
            step,
            Step::Wait {
                wait: Wait::ForRows,
                ..
            }
        ));
        let step = send(&mut cycle, report(10, 9, 1));
        assert!(matches!(
            step,
            Step::Wait {
                wait: Wait::Skip,
                ..
            }
        ));
    }

    #[test]
    fn a_batch_claimed_ahead_is_sent_only_after_a_fully_published_one() {
        let mut cycle = cycle(false);
        let step = cycle.sent(
            Sent::Answered(report(10, 10, 0)),
            Ok(()),
            Ok(Some(10)),
            false,
        );
        assert!(matches!(
            step,
            Step::Send {
                batch: 10,
                answered: Some(_),
                claim_ahead: true
            }
        ));
        let step = cycle.sent(
            Sent::Answered(report(10, 10, 0)),
            Ok(()),
            Ok(Some(3)),
            false,
        );
        assert!(matches!(
            step,
            Step::Send {
                batch: 3,
                claim_ahead: false,
                ..
            }
        ));
        // A failure in the batch: the batch ahead is released, not sent.
        let step = cycle.sent(
            Sent::Answered(report(10, 9, 1)),
            Ok(()),
            Ok(Some(10)),
            false,
        );
        assert!(matches!(
            step,
            Step::Wait {
                answered: Some(_),
                wait: Wait::Skip
            }
        ));
        // Held-back rows count as unpublished too.
        let step = cycle.sent(
            Sent::Answered(report(10, 8, 1)),
            Ok(()),
            Ok(Some(10)),
            false,
        );
        assert!(matches!(step, Step::Wait { .. }));
        // A shutdown: the answered batch settles, the one ahead is released.
        let step = cycle.sent(
            Sent::Answered(report(10, 10, 0)),
            Ok(()),
            Ok(Some(10)),
            true,
        );
        assert!(matches!(
            step,
            Step::Wait {
                answered: Some(_),
                ..
            }
        ));
        // A claim ahead that failed only means claiming after the settle.
        let step: TestStep = cycle.sent(
            Sent::Answered(report(10, 10, 0)),
            Ok(()),
            Err(fenced()),
            false,
        );
        assert!(matches!(
            step,
            Step::Wait {
                answered: Some(_),
                wait: Wait::Skip
            }
        ));
    }

    #[test]
    fn a_batch_whose_lease_ran_out_is_abandoned_and_the_relay_claims_again() {
        let mut cycle = cycle(false);
        let step = cycle.sent::<usize, BatchReport>(Sent::Abandoned, Ok(()), Ok(Some(10)), false);
        assert!(matches!(
            step,
            Step::Wait {
                answered: None,
                wait: Wait::Skip
            }
        ));
    }

    #[test]
    fn a_closed_sink_settles_what_was_acknowledged_and_ends_the_run() {
        let mut cycle = cycle(false);
        let closed = BatchReport {
            sink_closed: Some("producer fenced".into()),
            ..report(10, 4, 0)
        };
        let step = cycle.sent(Sent::Answered(closed), Ok(()), Ok(Some(10)), false);
        match step {
            Step::Stop {
                answered: Some(answered),
                outcome: Err(RelayError::SinkClosed(reason)),
            } => {
                assert_eq!(answered.published, 4);
                assert_eq!(reason, "producer fenced");
            }
            other => panic!("unexpected step {other:?}"),
        }
    }
}
