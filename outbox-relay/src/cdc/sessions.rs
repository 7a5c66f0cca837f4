//! Between replication sessions, without I/O: reading the slot, standing
//! by while another relay reads it, reconnecting after failures, stopping.
//!
//! [`Sessions`] decides what follows the end of a session ([`SessionEnd`]);
//! [`ReaderWatch`] decides, from what a standby sees of the relay reading
//! the slot, when that relay has gone silent and is to be replaced.
//! `CdcRelay::run` and `CdcRelay::slot_in_use` perform what they say.

use std::time::{Duration, Instant};

use super::{CdcError, READER_SILENCE, slot};
use crate::metrics;
use crate::relay::{Backoff, INITIAL_BACKOFF, RelayError};

/// Why a replication session ended.
#[derive(Debug)]
pub(crate) enum SessionEnd {
    /// Shutdown was requested.
    Stopped,
    /// Another relay reads the slot.
    SlotInUse,
    /// Another relay took the slot over while this one was reading it.
    SlotLost,
    /// The sink can take no more messages.
    SinkClosed(String),
    /// The session could not start.
    NotStarted(CdcError),
    /// The session broke after it started.
    Broken(CdcError),
}

/// What follows a session.
#[derive(Debug)]
pub(crate) enum AfterSession {
    /// End the run with this outcome.
    Stop(Result<(), CdcError>),
    /// Wait this long (or until shutdown), then try the slot again.
    Retry(Duration),
}

/// Whether this relay reads the slot, stands by, or reconnects.
#[derive(Debug)]
pub(crate) struct Sessions {
    slot: String,
    standby_retry: Duration,
    backoff: Backoff,
    /// Standing by for another relay: logged once until this one reads.
    standing_by: bool,
    /// Only a first connection that fails is fatal (bad URL, password,
    /// privileges); later failures are outages, retried.
    first_attempt: bool,
    /// What this relay, standing by, saw of the one reading the slot.
    pub(crate) watch: ReaderWatch,
}

impl Sessions {
    /// The sessions on `slot`: a standby checks every `standby_retry`,
    /// reconnects back off up to `max_backoff`.
    pub(crate) fn new(slot: String, standby_retry: Duration, max_backoff: Duration) -> Self {
        Self {
            slot,
            standby_retry,
            backoff: Backoff::new(INITIAL_BACKOFF, max_backoff),
            standing_by: false,
            first_attempt: true,
            watch: ReaderWatch::default(),
        }
    }

    /// Whether to look at the slot's reader before asking for the slot:
    /// a standby asks about it over an ordinary connection rather than
    /// asking for the slot, which the server refuses. The first attempt
    /// asks for the slot, so that a bad connection fails the start.
    pub(crate) fn checks_reader(&self) -> bool {
        !self.first_attempt
    }

    /// What follows a session that ended with `end`.
    pub(crate) fn ended(&mut self, end: SessionEnd) -> AfterSession {
        if !matches!(end, SessionEnd::SlotInUse) {
            self.watch = ReaderWatch::default();
        }
        let pause = match end {
            SessionEnd::Stopped => return AfterSession::Stop(Ok(())),
            SessionEnd::SinkClosed(reason) => {
                return AfterSession::Stop(Err(RelayError::SinkClosed(reason).into()));
            }
            SessionEnd::NotStarted(error) if self.first_attempt => {
                return AfterSession::Stop(Err(error));
            }
            SessionEnd::SlotInUse => self.stand_by(),
            SessionEnd::SlotLost => {
                tracing::warn!(
                    slot = %self.slot,
                    "another relay took the replication slot over while this one made no \
                     progress; what this one had read and not sent is left to it; standing by"
                );
                self.standing_by = true;
                self.standby_retry
            }
            SessionEnd::NotStarted(error) => self.reconnect(&error, false),
            SessionEnd::Broken(error) => self.reconnect(&error, true),
        };
        metrics::record_cdc_reading(false);
        self.first_attempt = false;
        AfterSession::Retry(pause)
    }

    fn stand_by(&mut self) -> Duration {
        if !self.standing_by {
            tracing::info!(
                slot = %self.slot,
                retry_every = ?self.standby_retry,
                "another server process holds the replication slot (another relay, \
                 or this relay's previous session until the server ends it); \
                 standing by until it is released"
            );
            self.standing_by = true;
        }
        self.standby_retry
    }

    /// The pause before reconnecting after `error`; `broken` when the
    /// session had been reading.
    fn reconnect(&mut self, error: &CdcError, broken: bool) -> Duration {
        self.standing_by = false;
        if broken {
            // It had been reading: this failure is a fresh one.
            self.backoff.reset();
        }
        let pause = self.backoff.next();
        tracing::error!(error = %format!("{error:#}"), retry_in = ?pause, "replication stream failed; reconnecting");
        pause
    }
}

/// What a standby saw of the relay reading the slot.
#[derive(Debug, Default)]
pub(crate) struct ReaderWatch {
    /// The reader's server process, the last status update it took in, and
    /// since when both are unchanged.
    seen: Option<(i32, Option<String>, Instant)>,
    /// Consecutive checks that found that process waiting on its client.
    waiting: u32,
    /// The server process whose state was logged already.
    noted: Option<i32>,
}

impl ReaderWatch {
    /// How long the reader has been silent, once that is [`READER_SILENCE`]
    /// or more: no new status update taken in, while its server process
    /// waits on it (at the last two checks), so it would take one in. A
    /// process busy decoding a large transaction takes none in for a while,
    /// but does not wait on its client meanwhile.
    pub(crate) fn silent_for(
        &mut self,
        reader: &slot::SlotReader,
        now: Instant,
    ) -> Option<Duration> {
        let since = match &self.seen {
            Some((pid, reply, since)) if *pid == reader.pid && *reply == reader.reply_time => {
                *since
            }
            _ => {
                self.seen = Some((reader.pid, reader.reply_time.clone(), now));
                self.waiting = 0;
                now
            }
        };
        self.waiting = if reader.waiting_on_client {
            self.waiting + 1
        } else {
            0
        };
        let silent = now.duration_since(since);
        (silent >= READER_SILENCE && self.waiting >= 2).then_some(silent)
    }

    /// Whether `pid`'s state is news to log: once per server process.
    pub(crate) fn first_note(&mut self, pid: i32) -> bool {
        self.noted.replace(pid) != Some(pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions() -> Sessions {
        Sessions::new(
            "outbox_relay".into(),
            Duration::from_secs(1),
            Duration::from_millis(300),
        )
    }

    fn retry(after: AfterSession) -> u128 {
        match after {
            AfterSession::Retry(pause) => pause.as_millis(),
            AfterSession::Stop(outcome) => panic!("stopped with {outcome:?}"),
        }
    }

    #[test]
    fn a_first_session_that_cannot_start_ends_the_run() {
        let mut sessions = sessions();
        assert!(
            !sessions.checks_reader(),
            "the first attempt asks for the slot"
        );
        match sessions.ended(SessionEnd::NotStarted(CdcError::StreamEnded)) {
            AfterSession::Stop(Err(CdcError::StreamEnded)) => {}
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn later_failures_reconnect_with_backoff_reset_by_reading() {
        let mut sessions = sessions();
        assert_eq!(retry(sessions.ended(SessionEnd::SlotInUse)), 1000);
        assert!(sessions.checks_reader());
        let not_started = || SessionEnd::NotStarted(CdcError::StreamEnded);
        let pauses: Vec<_> = (0..4)
            .map(|_| retry(sessions.ended(not_started())))
            .collect();
        assert_eq!(pauses, [100, 200, 300, 300]);
        // A session that had been reading broke: a fresh failure.
        assert_eq!(
            retry(sessions.ended(SessionEnd::Broken(CdcError::StreamEnded))),
            100
        );
        assert_eq!(retry(sessions.ended(not_started())), 200);
    }

    #[test]
    fn a_slot_in_use_or_lost_means_standing_by() {
        let mut sessions = sessions();
        assert_eq!(retry(sessions.ended(SessionEnd::SlotInUse)), 1000);
        assert!(sessions.standing_by);
        assert_eq!(retry(sessions.ended(SessionEnd::SlotLost)), 1000);
        assert!(sessions.standing_by);
        retry(sessions.ended(SessionEnd::Broken(CdcError::StreamEnded)));
        assert!(!sessions.standing_by);
    }

    #[test]
    fn a_stop_or_a_closed_sink_ends_the_run() {
        let mut sessions = sessions();
        retry(sessions.ended(SessionEnd::SlotInUse));
        assert!(matches!(
            sessions.ended(SessionEnd::Stopped),
            AfterSession::Stop(Ok(()))
        ));
        match sessions.ended(SessionEnd::SinkClosed("gone".into())) {
            AfterSession::Stop(Err(CdcError::Relay(RelayError::SinkClosed(reason)))) => {
                assert_eq!(reason, "gone");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn the_watch_on_the_reader_restarts_unless_the_slot_is_still_in_use() {
        let reader = slot::SlotReader {
            pid: 7,
            is_relay: true,
            visible: true,
            reply_time: Some("1".into()),
            waiting_on_client: true,
        };
        let start = Instant::now();
        let mut sessions = sessions();
        sessions.watch.silent_for(&reader, start);
        retry(sessions.ended(SessionEnd::SlotInUse));
        assert!(sessions.watch.seen.is_some(), "kept while standing by");
        retry(sessions.ended(SessionEnd::Broken(CdcError::StreamEnded)));
        assert!(sessions.watch.seen.is_none(), "restarted after a session");
    }

    #[test]
    fn a_reader_is_silent_once_it_sends_nothing_while_waited_on() {
        let reader = |reply: &str, waiting: bool| slot::SlotReader {
            pid: 7,
            is_relay: true,
            visible: true,
            reply_time: Some(reply.to_owned()),
            waiting_on_client: waiting,
        };
        let start = Instant::now();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        let mut watch = ReaderWatch::default();
        // Replies keep coming: never silent.
        for second in 0..10 {
            let reply = second.to_string();
            assert_eq!(watch.silent_for(&reader(&reply, true), at(second)), None);
        }
        // No reply since second 9; its process waits on it.
        assert_eq!(watch.silent_for(&reader("9", true), at(13)), None);
        assert_eq!(
            watch.silent_for(&reader("9", true), at(14)),
            Some(READER_SILENCE)
        );
        // A process busy decoding takes no replies in: not silence.
        let mut watch = ReaderWatch::default();
        for second in 0..30 {
            assert_eq!(watch.silent_for(&reader("1", false), at(second)), None);
        }
        // Waiting once after a busy stretch is not enough either.
        assert_eq!(watch.silent_for(&reader("1", true), at(30)), None);
        assert!(watch.silent_for(&reader("1", true), at(31)).is_some());
        // Another reader starts the count again.
        let other = slot::SlotReader {
            pid: 8,
            ..reader("1", true)
        };
        assert_eq!(watch.silent_for(&other, at(32)), None);
    }
}
