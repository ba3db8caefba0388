//! Waiting without a lock or a syscall on the fast path: spin briefly, then yield the core (so more ranks than
//! cores still make progress), and only after a long wait sleep in short naps (a nap wakes up tens of
//! microseconds late, which a rank waiting at a barrier for a slower peer must not add to its next call); check
//! the clock and the peers' health now and then.

use crate::error::RuntimeError;
use std::time::{Duration, Instant};

/// Idle rounds spent spinning before yielding, when every rank has a core to itself.
pub(crate) const SPINS: u32 = 64;
/// Waiting longer than this, a rank naps instead of yielding: it is waiting for something slow.
const NAP_AFTER: Duration = Duration::from_millis(200);
/// Idle rounds, in units of `spins`, before a socket transport sleeps in `poll`.
const SLEEP_AFTER: u32 = 64;
/// How often (in idle rounds past the spinning phase) the clock and peers are looked at.
const CHECK_EVERY: u32 = 128;

pub(crate) struct Backoff {
    rounds: u32,
    spins: u32,
    since: Option<Instant>,
    napping: bool,
    timeout: Duration,
}

/// Why a wait ended early: the timeout, or what the check of the peers found (by default the peer that failed and
/// how).
pub(crate) enum Fault<E = (u32, String)> {
    Timeout(Duration),
    Peer(E),
}

impl Fault {
    /// The error of a wait by `rank` at `what` (`at`) for `waiting_for` (`waits_on`: the rank that is, where one is).
    pub fn into_error(
        self,
        (rank, what, at): (u32, String, String),
        waiting_for: String,
        waits_on: Option<u32>,
    ) -> RuntimeError {
        match self {
            Fault::Timeout(waited) => {
                RuntimeError::Timeout { rank, what, at, seconds: waited.as_secs_f64(), waiting_for, waits_on }
            }
            Fault::Peer((peer, how)) => RuntimeError::PeerFailed { rank, what, at, peer, how },
        }
    }
}

impl Backoff {
    /// `spins`: rounds to spin before yielding; 0 when ranks outnumber cores, since then the peer being waited
    /// for is likely waiting for this core.
    pub fn new(timeout: Duration, spins: u32) -> Self {
        Backoff { rounds: 0, spins, since: None, napping: false, timeout }
    }

    /// Progress was made: the next wait starts from spinning again.
    pub fn reset(&mut self) {
        self.rounds = 0;
        self.since = None;
        self.napping = false;
    }

    /// Whether a transport that can sleep until data comes (sockets) should now: with a core per rank, after
    /// `SLEEP_AFTER` times the spinning rounds (waking from a sleep costs more than a message takes to come in
    /// a stream), at once when ranks outnumber cores (`spins` 0).
    pub fn may_sleep(&self) -> bool {
        self.rounds >= self.spins.saturating_mul(SLEEP_AFTER)
    }

    /// One idle round. `health` is asked now and then whether the peers are still there (and, for a caller that
    /// checks more, whether they are in the same call).
    pub fn idle<E>(&mut self, health: impl FnOnce() -> Result<(), E>) -> Result<(), Fault<E>> {
        self.rounds = self.rounds.saturating_add(1);
        if self.rounds < self.spins {
            std::hint::spin_loop();
            return Ok(());
        }
        if self.napping {
            std::thread::sleep(Duration::from_micros(50));
        } else {
            std::thread::yield_now();
        }
        if self.rounds.is_multiple_of(CHECK_EVERY) {
            let since = *self.since.get_or_insert_with(Instant::now);
            health().map_err(Fault::Peer)?;
            let waited = since.elapsed();
            self.napping = waited > NAP_AFTER;
            if waited > self.timeout {
                return Err(Fault::Timeout(waited));
            }
        }
        Ok(())
    }
}
