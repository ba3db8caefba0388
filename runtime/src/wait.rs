//! Waiting without a lock or a syscall on the fast path: spin briefly, then yield the core (so more ranks than
//! cores still make progress), then sleep in short naps; check the clock and the peers' health now and then.

use crate::error::RuntimeError;
use std::time::{Duration, Instant};

/// Idle rounds spent spinning before yielding, when every rank has a core to itself.
pub(crate) const SPINS: u32 = 64;
const YIELDS: u32 = 20_000;
/// How often (in idle rounds past the spinning phase) the clock and peers are looked at.
const CHECK_EVERY: u32 = 128;

pub(crate) struct Backoff {
    rounds: u32,
    spins: u32,
    since: Option<Instant>,
    timeout: Duration,
}

/// Why a wait ended early.
pub(crate) enum Fault {
    Timeout(Duration),
    Peer(u32, String),
}

impl Fault {
    pub fn into_error(self, rank: u32, what: String, at: String, waiting_for: String) -> RuntimeError {
        match self {
            Fault::Timeout(waited) => {
                RuntimeError::Timeout { rank, what, at, seconds: waited.as_secs_f64(), waiting_for }
            }
            Fault::Peer(peer, how) => RuntimeError::PeerFailed { rank, what, at, peer, how },
        }
    }
}

impl Backoff {
    /// `spins`: rounds to spin before yielding; 0 when ranks outnumber cores, since then the peer being waited
    /// for is likely waiting for this core.
    pub fn new(timeout: Duration, spins: u32) -> Self {
        Backoff { rounds: 0, spins, since: None, timeout }
    }

    /// Progress was made: the next wait starts from spinning again.
    pub fn reset(&mut self) {
        self.rounds = 0;
        self.since = None;
    }

    /// One idle round. `health` is asked now and then whether the peers are still there.
    pub fn idle(&mut self, health: impl FnOnce() -> Result<(), (u32, String)>) -> Result<(), Fault> {
        self.rounds = self.rounds.saturating_add(1);
        if self.rounds < self.spins {
            std::hint::spin_loop();
            return Ok(());
        }
        if self.rounds < self.spins + YIELDS {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
        if self.rounds.is_multiple_of(CHECK_EVERY) {
            let since = *self.since.get_or_insert_with(Instant::now);
            health().map_err(|(peer, how)| Fault::Peer(peer, how))?;
            let waited = since.elapsed();
            if waited > self.timeout {
                return Err(Fault::Timeout(waited));
            }
        }
        Ok(())
    }
}
