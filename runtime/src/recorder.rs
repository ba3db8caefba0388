//! The flight recorder, for hangs: each communicator keeps its last `CALLS` calls, and a call that ends in a
//! timeout, a peer's failure, an abort or a mismatch writes, with them, the state of each of its instructions
//! (done, waiting and for what, blocked on its dependencies) as JSON into `COLLC_DUMP_DIR`
//! (`collc-fr-rank<R>.json`). SIGUSR1 makes every rank of the process write one as it is: a rank inside a call
//! from its next idle round, a rank outside one from the recorder's thread. `collc fr analyze DIR` reads them.

use crate::error::RuntimeError;
use crate::link::CallInfo;
use crate::log::Subsys;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once, Weak};
use std::time::Duration;

/// Calls each recorder keeps.
pub const CALLS: usize = 32;

/// One call as recorded.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CallRecord {
    pub seq: u64,
    /// `allreduce float sum count 1000 root 0 out-of-place`.
    pub call: String,
    pub algorithm: String,
    /// `running`, `done`, or its error.
    pub state: String,
}

/// One instruction of the call in progress.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct InstrState {
    pub index: usize,
    pub op: String,
    pub line: usize,
    /// Its channel (0 in dumps of collc builds that wrote none).
    #[serde(default)]
    pub channel: u8,
    /// `done` (in the current tile), `waiting` (ready; its connection is not), `blocked` (on its dependencies).
    pub state: String,
    /// For a waiting instruction: what it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// The peers it receives from and sends to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recv_from: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_to: Option<u32>,
}

/// Where the call in progress stands.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Current {
    pub seq: u64,
    pub algorithm: String,
    pub tile: usize,
    pub tiles: usize,
    pub instructions: Vec<InstrState>,
}

/// What one rank writes.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Dump {
    pub rank: u32,
    pub n_ranks: u32,
    /// The job's id, the same in every rank's dump (empty in dumps of collc builds that wrote none).
    #[serde(default)]
    pub job: String,
    pub host: String,
    pub pid: u32,
    /// Why it was written: `timeout`, `peer failed`, `mismatch`, `abort`, `SIGUSR1`.
    pub reason: String,
    /// Oldest first.
    pub calls: Vec<CallRecord>,
    pub current: Option<Current>,
}

/// One call in a recorder's ring, in atomics: the owner writes it with plain stores on every call (no lock, no
/// allocation, no clock), the recorder thread reads it when it dumps a rank outside a call.
#[derive(Default)]
struct Slot {
    seq: AtomicU64,
    count: AtomicU64,
    /// As `CallInfo::kind`.
    kind: AtomicU32,
    root: AtomicU32,
    /// Index into `Recorder::names`.
    algorithm: AtomicU32,
    /// 0 running, 1 done, 2 failed.
    state: AtomicU32,
}

/// A communicator's recorder: its last calls, shared with the recorder thread.
pub(crate) struct Recorder {
    rank: u32,
    n_ranks: u32,
    /// The job's id, the same on every rank: `collc fr analyze` keeps one job's dumps apart from a stale run's.
    job: String,
    slots: Vec<Slot>,
    /// Calls started so far.
    started: AtomicU64,
    in_call: AtomicBool,
    /// Algorithm names, interned when a plan is prepared.
    names: Mutex<Vec<String>>,
    /// The errors of the last failed calls: (sequence number, message).
    errors: Mutex<VecDeque<(u64, String)>>,
}

pub(crate) type Shared = Arc<Recorder>;

fn dump_dir() -> Option<PathBuf> {
    std::env::var_os("COLLC_DUMP_DIR").map(PathBuf::from)
}

/// SIGUSR1s received so far.
static REQUESTS: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_usr1(_: libc::c_int) {
    REQUESTS.fetch_add(1, Ordering::Relaxed);
}

/// Recorders of this process, for the thread that answers SIGUSR1 for ranks outside a call.
static ALL: Mutex<Vec<Weak<Recorder>>> = Mutex::new(Vec::new());

/// How many dump requests have come; an executor compares it with the last it answered.
pub(crate) fn requests() -> u64 {
    REQUESTS.load(Ordering::Relaxed)
}

impl Recorder {
    /// A recorder for `rank`, answering SIGUSR1 (`catch_dump_requests`).
    pub fn new(rank: u32, n_ranks: u32, job: &str) -> Shared {
        let shared = Arc::new(Recorder {
            rank,
            n_ranks,
            job: job.to_string(),
            slots: (0..CALLS).map(|_| Slot::default()).collect(),
            started: AtomicU64::new(0),
            in_call: AtomicBool::new(false),
            names: Mutex::new(Vec::new()),
            errors: Mutex::new(VecDeque::new()),
        });
        catch_dump_requests();
        ALL.lock().unwrap_or_else(|p| p.into_inner()).push(Arc::downgrade(&shared));
        shared
    }

    /// The index calls name `algorithm` by.
    pub fn intern(&self, algorithm: &str) -> u32 {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        match names.iter().position(|n| n == algorithm) {
            Some(i) => i as u32,
            None => {
                names.push(algorithm.to_string());
                (names.len() - 1) as u32
            }
        }
    }

    pub fn start(&self, call: &CallInfo, algorithm: u32) {
        // One writer (the rank's thread): a load and a store, not a read-modify-write, on every call.
        let n = self.started.load(Ordering::Relaxed);
        self.started.store(n + 1, Ordering::Release);
        let slot = &self.slots[n as usize % CALLS];
        slot.state.store(0, Ordering::Relaxed);
        slot.count.store(call.count, Ordering::Relaxed);
        slot.kind.store(call.kind, Ordering::Relaxed);
        slot.root.store(call.root, Ordering::Relaxed);
        slot.algorithm.store(algorithm, Ordering::Relaxed);
        slot.seq.store(call.seq, Ordering::Release);
        self.in_call.store(true, Ordering::Release);
    }

    /// The call started last has ended: well, or with `error`.
    pub fn finish(&self, error: Option<&RuntimeError>) {
        let n = self.started.load(Ordering::Relaxed).wrapping_sub(1);
        let slot = &self.slots[n as usize % CALLS];
        slot.state.store(if error.is_some() { 2 } else { 1 }, Ordering::Release);
        if let Some(error) = error {
            let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
            if errors.len() == 4 {
                errors.pop_front();
            }
            errors.push_back((slot.seq.load(Ordering::Relaxed), error.to_string()));
        }
        self.in_call.store(false, Ordering::Release);
    }

    fn calls(&self) -> Vec<CallRecord> {
        let started = self.started.load(Ordering::Acquire);
        let names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        let errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        (started.saturating_sub(CALLS as u64)..started)
            .map(|n| {
                let slot = &self.slots[n as usize % CALLS];
                let seq = slot.seq.load(Ordering::Acquire);
                let state = match slot.state.load(Ordering::Acquire) {
                    0 => "running".to_string(),
                    1 => "done".to_string(),
                    _ => errors.iter().find(|(s, _)| *s == seq).map_or("failed".into(), |(_, e)| e.clone()),
                };
                let (count, kind, root) = (
                    slot.count.load(Ordering::Relaxed),
                    slot.kind.load(Ordering::Relaxed),
                    slot.root.load(Ordering::Relaxed),
                );
                CallRecord {
                    seq,
                    call: crate::link::describe_kind(kind, count, root),
                    algorithm: names.get(slot.algorithm.load(Ordering::Relaxed) as usize).cloned().unwrap_or_default(),
                    state,
                }
            })
            .collect()
    }

    /// Writes this rank's dump into `COLLC_DUMP_DIR`, if set; the path written.
    pub fn dump(&self, reason: &str, current: Option<Current>) -> Option<PathBuf> {
        let Some(dir) = dump_dir() else {
            if reason == "SIGUSR1" {
                let rank = self.rank;
                crate::log::warn(
                    Subsys::Coll,
                    format_args!("rank {rank}: SIGUSR1 asks for the flight recorder; set COLLC_DUMP_DIR to a folder to have it written"),
                );
            }
            return None;
        };
        let dump = Dump {
            rank: self.rank,
            n_ranks: self.n_ranks,
            job: self.job.clone(),
            host: crate::log::host().to_string(),
            pid: std::process::id(),
            reason: reason.to_string(),
            calls: self.calls(),
            current,
        };
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(format!("collc-fr-rank{}.json", self.rank));
        let text = serde_json::to_string_pretty(&dump).ok()?;
        // Written whole, then renamed: an analyser never reads half a dump.
        let partial = path.with_extension("json.partial");
        std::fs::write(&partial, text).ok()?;
        std::fs::rename(&partial, &path).ok()?;
        let shown = path.display();
        crate::log::warn(
            Subsys::Coll,
            format_args!("rank {}: flight recorder ({reason}) written to {shown}", self.rank),
        );
        Some(path)
    }
}

/// Catches SIGUSR1 from now on in this process, so that it never kills a rank (in its rendezvous or later, with or
/// without `COLLC_DUMP_DIR`): each one is a request that every rank of the process dump its recorder. Idempotent;
/// communicators call it before they join, a launcher's rank process may call it at once. A program that handles
/// (or ignores) SIGUSR1 itself keeps its handler: only the default disposition, which would kill, is replaced.
pub fn catch_dump_requests() {
    static WATCH: Once = Once::new();
    WATCH.call_once(|| {
        // SAFETY: `sigaction` is plain data, for which all zeroes is a valid value.
        let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: with a null new action, sigaction only reads the current one into `current`.
        let read = unsafe { libc::sigaction(libc::SIGUSR1, std::ptr::null(), &mut current) };
        if read != 0 || current.sa_sigaction != libc::SIG_DFL {
            crate::log::info(Subsys::Init, format_args!("SIGUSR1 has a handler of this program's: no dumps on it"));
            return;
        }
        // SAFETY: the handler only adds to an atomic, which is async-signal-safe.
        unsafe { libc::signal(libc::SIGUSR1, on_usr1 as extern "C" fn(libc::c_int) as libc::sighandler_t) };
        let _ = std::thread::Builder::new().name("collc recorder".into()).spawn(answer_requests);
    });
}

/// The recorder thread: on each SIGUSR1, dumps the recorders of ranks outside a call (those inside one dump
/// themselves, with their instructions).
fn answer_requests() {
    let mut answered = 0;
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now = requests();
        if now == answered {
            continue;
        }
        answered = now;
        let mut all = ALL.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|weak| weak.strong_count() > 0);
        for recorder in all.iter().filter_map(Weak::upgrade) {
            if !recorder.in_call.load(Ordering::Acquire) {
                recorder.dump("SIGUSR1", None);
            }
        }
    }
}
