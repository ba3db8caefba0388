//! One launch per call for the ranks that share a device: each rank's executor registers its image with the
//! `Launcher` of its call shape; at each call the ranks arrive, the last one runs every rank's blocks as one launch
//! (a cooperative grid on a GPU, every block polled by one thread in the twin) and hands each rank the outcome. A
//! rank of the same call with another fingerprint (another shape or schedule) waits at another launcher, which the
//! others see at once in the call it published (a mismatch, on every rank); a rank that never comes is a timeout
//! naming it.
//!
//! The launcher is the same for the GPU and the twin (`Target`), so the twin checks it on a CPU.

use super::super::host::{describe, mismatch, published_mismatch, waiting_for, waits_on};
use super::super::{Call, Plan};
use super::encode::{code, control, CONTROL_WORDS};
use crate::error::RuntimeError;
use crate::link::Stamp;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// What runs the blocks of a launch.
pub(crate) trait Target: Send + Sync {
    /// One rank's part: its image, state and bases, wherever they live.
    type Entry: Send;
    /// What the target keeps between launches of the same entries (a GPU's launch table).
    type Cached: Send;

    fn blocks(entry: &Self::Entry) -> u32;

    /// Runs the blocks of every entry (in rank order) as one launch of `call`, waits for it, and returns the most
    /// telling fault report of any block (`code::OK` when none), every report cleared for the next launch. `answer`
    /// answers a dump request of the launching rank, for a target that waits.
    fn run(
        &self,
        entries: &[(u32, Self::Entry)],
        cached: &mut Option<Self::Cached>,
        call: &Call,
        peers: &[u32],
        answer: &dyn Fn(),
    ) -> Result<[u64; CONTROL_WORDS], String>;
}

/// The most telling of `reports` fault reports, `word(report, w)` their words: a mismatch over the timeouts and
/// aborts it causes; all `code::OK` when no report has a fault.
pub(crate) fn most_telling(reports: usize, word: impl Fn(usize, usize) -> u64) -> [u64; CONTROL_WORDS] {
    let mut words = [0u64; CONTROL_WORDS];
    for report in 0..reports {
        if severity(word(report, control::CODE)) > severity(words[control::CODE]) {
            for (w, out) in words.iter_mut().enumerate() {
                *out = word(report, w);
            }
        }
    }
    words
}

/// How telling a fault report is: a mismatch over the timeouts and aborts it causes.
fn severity(what: u64) -> u8 {
    match what {
        code::MISMATCH => 4,
        code::TIMEOUT => 3,
        code::BAD_IMAGE => 2,
        code::ABORTED => 1,
        _ => 0,
    }
}

pub(crate) struct Launcher<T: Target> {
    target: T,
    /// The ranks of the launch: every one of them is in each.
    ranks: Vec<u32>,
    inner: Mutex<Round<T>>,
    done: Condvar,
}

struct Round<T: Target> {
    entries: Vec<(u32, T::Entry)>,
    /// The registration each rank's entry came with (`register`'s token), so only its owner removes it.
    tokens: Vec<(u32, u64)>,
    next_token: u64,
    cached: Option<T::Cached>,
    /// The ranks waiting for this round's launch, with their calls' sequence numbers.
    arrived: Vec<(u32, u64)>,
    generation: u64,
    /// The last launch's fault report, or why it could not run.
    outcome: Option<Result<[u64; CONTROL_WORDS], String>>,
}

impl<T: Target> Launcher<T> {
    pub fn new(target: T, ranks: Vec<u32>) -> Launcher<T> {
        let round = Round {
            entries: Vec::new(),
            tokens: Vec::new(),
            next_token: 0,
            cached: None,
            arrived: Vec::new(),
            generation: 0,
            outcome: None,
        };
        Launcher { target, ranks, inner: Mutex::new(round), done: Condvar::new() }
    }

    #[cfg(feature = "cuda")]
    pub fn target(&self) -> &T {
        &self.target
    }

    /// Registers rank `rank`'s entry (in place of an earlier one); the token its executor unregisters with.
    pub fn register(&self, rank: u32, entry: T::Entry) -> u64 {
        let mut round = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        round.entries.retain(|(r, _)| *r != rank);
        round.entries.push((rank, entry));
        round.entries.sort_by_key(|(r, _)| *r);
        round.next_token += 1;
        let token = round.next_token;
        round.tokens.retain(|(r, _)| *r != rank);
        round.tokens.push((rank, token));
        round.cached = None;
        token
    }

    /// Its image, state and bases go with a dropped executor: the next launch must not name them. Only the entry
    /// registered with `token` goes (a later registration of the rank stays).
    pub fn unregister(&self, rank: u32, token: u64) {
        let mut round = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if round.tokens.contains(&(rank, token)) {
            round.entries.retain(|(r, _)| *r != rank);
            round.tokens.retain(|(r, _)| *r != rank);
            round.cached = None;
        }
    }

    /// `plan`'s rank arrives for `call`; returns the launch's fault report once it ran. Errors while it waits for
    /// the others name its first instruction and `.coll` line; `answer` answers its dump requests meanwhile.
    pub fn arrive(&self, plan: &Plan, call: &Call, answer: &dyn Fn()) -> Result<[u64; CONTROL_WORDS], RuntimeError> {
        let (rank, peers) = (plan.rank, &plan.peers);
        let mut round = self.inner.lock().map_err(|_| RuntimeError::Poisoned)?;
        let generation = round.generation;
        round.arrived.push((rank, call.seq));
        if round.arrived.len() == self.ranks.len() {
            let outcome = self.launch(&mut round, call, peers, answer);
            round.arrived.clear();
            round.generation += 1;
            round.outcome = Some(outcome.clone());
            self.done.notify_all();
            return outcome.map_err(RuntimeError::Config);
        }
        let started = Instant::now();
        loop {
            let (next, _) =
                self.done.wait_timeout(round, Duration::from_millis(1)).map_err(|_| RuntimeError::Poisoned)?;
            round = next;
            if round.generation != generation {
                break;
            }
            answer();
            let missing: Vec<u32> =
                self.ranks.iter().copied().filter(|r| !round.arrived.iter().any(|(a, _)| a == r)).collect();
            let fault = self.check_missing(plan, call, &missing, started);
            if let Some(fault) = fault {
                round.arrived.retain(|&(r, _)| r != rank);
                return Err(fault);
            }
        }
        round.outcome.clone().expect("a finished round has an outcome").map_err(RuntimeError::Config)
    }

    /// While `plan`'s rank waits for `missing`: a rank of the same call with another fingerprint (it waits at
    /// another launcher: a mismatch), a failed peer, or the timeout.
    fn check_missing(&self, plan: &Plan, call: &Call, missing: &[u32], started: Instant) -> Option<RuntimeError> {
        let rank = plan.rank;
        let what = || describe(plan, 0);
        let health = call.bootstrap.health(&plan.peers);
        // After the health check: a rank that aborted over a mismatch published its call before. While all is well,
        // a rank in this call with another fingerprint waits at another launcher: it is among the missing.
        let everyone = 0..if health.is_ok() { 0 } else { plan.n_ranks };
        if let Some(mismatch) = published_mismatch(plan, call, missing.iter().copied().chain(everyone)) {
            return Some(mismatch);
        }
        let at = || format!("the launch of call #{}", call.seq);
        if let Err((peer, how)) = health {
            return Some(RuntimeError::PeerFailed { rank, what: what(), at: at(), peer, how });
        }
        (started.elapsed() > call.timeout).then(|| RuntimeError::Timeout {
            rank,
            what: what(),
            at: at(),
            seconds: started.elapsed().as_secs_f64(),
            waiting_for: format!("the ranks it launches with to make the same call (not arrived: {missing:?})"),
            waits_on: missing.first().copied(),
        })
    }

    fn launch(
        &self,
        round: &mut Round<T>,
        call: &Call,
        peers: &[u32],
        answer: &dyn Fn(),
    ) -> Result<[u64; CONTROL_WORDS], String> {
        if round.entries.len() != self.ranks.len() {
            return Err(format!(
                "{} of the {} ranks of this launch prepared this call shape: mismatched calls",
                round.entries.len(),
                self.ranks.len()
            ));
        }
        if let Some(&(other, seq)) = round.arrived.iter().find(|&&(_, seq)| seq != call.seq) {
            return Err(format!(
                "the ranks of a launch are at different calls: rank {other} at call #{seq}, another at #{}",
                call.seq
            ));
        }
        if round.entries.iter().all(|(_, e)| T::blocks(e) == 0) {
            return Ok([0; CONTROL_WORDS]);
        }
        self.target.run(&round.entries, &mut round.cached, call, peers, answer)
    }
}

/// The error (or not) of a launch's fault report for `plan`'s rank.
pub(crate) fn outcome(plan: &Plan, words: &[u64; CONTROL_WORDS], call: &Call) -> Result<(), RuntimeError> {
    let what = words[control::CODE];
    if what == code::OK {
        return Ok(());
    }
    let (faulted, i, tile) = (words[control::RANK] as u32, words[control::INSTR] as usize, words[control::TILE]);
    if faulted != plan.rank {
        let how = format!("stopped the launch this rank shares ({})", describe_code(what));
        return Err(RuntimeError::PeerFailed {
            rank: plan.rank,
            what: describe(plan, 0),
            at: "the launch".into(),
            peer: faulted,
            how,
        });
    }
    let at = format!("tile {tile}");
    Err(match what {
        code::MISMATCH => {
            let got = Stamp { seq: words[control::GOT_SEQ], fingerprint: words[control::GOT_FP] };
            let ours = Stamp { seq: call.seq, fingerprint: plan.fingerprint };
            let link = plan.links.get(words[control::LINK] as usize).map_or(faulted, |l| l.from);
            mismatch(plan, link, got, None, ours, call)
        }
        code::TIMEOUT => RuntimeError::Timeout {
            rank: plan.rank,
            what: describe(plan, i),
            at,
            seconds: call.timeout.as_secs_f64(),
            waiting_for: waiting_for(plan, i),
            waits_on: waits_on(plan, i),
        },
        code::ABORTED => match call.bootstrap.health(&plan.peers) {
            Err((peer, how)) => RuntimeError::PeerFailed { rank: plan.rank, what: describe(plan, i), at, peer, how },
            Ok(()) => RuntimeError::Config(format!("rank {}: aborted at {} in {at}", plan.rank, describe(plan, i))),
        },
        other => RuntimeError::Config(format!("rank {}: the interpreter refused the image (fault {other})", plan.rank)),
    })
}

fn describe_code(what: u64) -> &'static str {
    match what {
        code::MISMATCH => "a mismatched message",
        code::TIMEOUT => "a timeout",
        code::ABORTED => "an abort",
        _ => "a fault",
    }
}
