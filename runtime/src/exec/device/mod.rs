//! The device executor's side in Rust: the encoding of plans the CUDA interpreter reads (`encode.rs`) and the host
//! twin of that interpreter (`twin.rs`), which runs the same encoding with the same flag protocol on the CPU, and the
//! launcher both share (`launch.rs`). The `twin` transport runs every call as the GPU does, one launch of every
//! rank's blocks (ranks as threads, connection records on the heap), so the whole device path short of the GPU is
//! checked against the reference by the runtime matrix.

#[cfg(feature = "cuda")]
pub mod cuda;
pub(crate) mod encode;
mod launch;
pub(crate) mod twin;

pub(crate) use launch::Launcher;

use super::host::instr_state;
use super::{answer_dump_request, Call, Executor, Plan};
use crate::error::RuntimeError;
use crate::recorder::Current;
use encode::{conn, Image, PlanDesc, CONTROL_WORDS};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use twin::Launch;

/// Builds a CUDA driver for the CPU into `dir` (`libcuda.so`, `libcuda.so.1`): the driver entry points collc calls,
/// over host memory, running the CUDA kernels compiled for the CPU with this build's layout
/// (`collc_kernels::cuda_host::build_driver`). A process started with `dir` first on `LD_LIBRARY_PATH` runs the
/// cuda transport on it; tests do, where no GPU is.
#[cfg(feature = "cuda-host")]
pub fn build_host_driver(dir: &std::path::Path) -> Result<(), String> {
    collc_kernels::cuda_host::build_driver(&encode::layout_defines(), dir)
}

/// Lanes of the twin transport: two, so the runtime matrix runs calls of several tiles on two lanes.
const TWIN_LANES: u32 = 2;

/// One connection's record and slots in host memory, shared by the executors of its two ends: the record's words,
/// then (`RECORD_BYTES` in) its slots, in one allocation of 8-byte words, 256-byte aligned.
pub(crate) struct ConnMemory {
    storage: Box<[AtomicU64]>,
    at: usize,
}

// SAFETY: the slots are written by the sender and read by the receiver only as the record's counters allow
// (release/acquire on `tail` and `head`); every access goes through the record's address.
unsafe impl Send for ConnMemory {}
unsafe impl Sync for ConnMemory {}

impl ConnMemory {
    fn new(slot_bytes: usize) -> ConnMemory {
        let words = encode::record_bytes(slot_bytes).div_ceil(8) + 32;
        let storage: Box<[AtomicU64]> = (0..words).map(|_| AtomicU64::new(0)).collect();
        let at = (storage.as_ptr() as usize).next_multiple_of(256) - storage.as_ptr() as usize;
        let memory = ConnMemory { storage, at: at / 8 };
        memory.storage[memory.at + conn::SLOT_BYTES].store(slot_bytes as u64, Ordering::Relaxed);
        memory
    }

    fn address(&self) -> u64 {
        self.storage[self.at..].as_ptr() as u64
    }
}

/// A connection's record: sender, receiver, channel, slot bytes, lane.
pub(crate) type ConnKey = (u32, u32, u8, usize, u32);

/// The `twin` transport's connection records, one per (sender, receiver, channel, slot size, lane), on the heap.
pub(crate) type TwinConns = Mutex<HashMap<ConnKey, Arc<ConnMemory>>>;
/// The `twin` transport's launchers, one per call shape (fingerprint), each running every rank's blocks in one
/// launch, as ranks sharing a GPU do.
pub(crate) type TwinLaunchers = Mutex<HashMap<u64, Arc<Launcher<TwinTarget>>>>;

/// `plan` as the host twin runs it, over the records in `conns` and the launcher of its shape in `launchers` (each
/// made by the first of the `n_ranks` ranks that needs it).
pub(crate) fn twin_executor(
    plan: Plan,
    n_ranks: u32,
    conns: &TwinConns,
    launchers: &TwinLaunchers,
) -> Result<Box<dyn Executor>, RuntimeError> {
    // The twin's ranks are threads of this process, their buffers in its memory: a send whose source stays goes by
    // reference (single copy), as between ranks of one GPU.
    let image = Arc::new(encode::encode(&[&plan], TWIN_LANES, &|_| true).map_err(RuntimeError::Config)?);
    let conns: Vec<Arc<ConnMemory>> = {
        let mut registry = conns.lock().map_err(|_| RuntimeError::Poisoned)?;
        image
            .conns
            .iter()
            .map(|&(from, to, channel, slot_bytes, lane)| {
                registry
                    .entry((from, to, channel, slot_bytes, lane))
                    .or_insert_with(|| Arc::new(ConnMemory::new(slot_bytes)))
                    .clone()
            })
            .collect()
    };
    let state: Arc<[AtomicU64]> = (0..image.state_words()).map(|_| AtomicU64::new(0)).collect();
    for (c, memory) in conns.iter().enumerate() {
        state[image.conn_table_at() + c].store(memory.address(), Ordering::Relaxed);
    }
    let bases: Arc<[AtomicU64]> = (0..image.bases_words()).map(|_| AtomicU64::new(0)).collect();
    let launcher = {
        let mut launchers = launchers.lock().map_err(|_| RuntimeError::Poisoned)?;
        let ranks = (0..n_ranks).collect();
        launchers.entry(plan.fingerprint).or_insert_with(|| Arc::new(Launcher::new(TwinTarget, ranks))).clone()
    };
    let tracer = plan.tracer.clone();
    let entry = TwinEntry { image: image.clone(), state: state.clone(), bases: bases.clone(), tracer };
    let token = launcher.register(plan.rank, entry);
    Ok(Box::new(Twin { plan, image, state, bases, launcher, token, _conns: conns }))
}

/// One rank's part in a twin launch.
pub(crate) struct TwinEntry {
    image: Arc<Image>,
    state: Arc<[AtomicU64]>,
    bases: Arc<[AtomicU64]>,
    /// Its rank's run trace, if the communicator keeps one.
    tracer: Option<Arc<crate::trace::Tracer>>,
}

/// The host as a launch target: every block of the launch polled in turn by the thread that launches.
pub(crate) struct TwinTarget;

impl launch::Target for TwinTarget {
    type Entry = TwinEntry;
    type Cached = ();

    fn blocks(entry: &TwinEntry) -> u32 {
        entry.image.header().n_blocks
    }

    fn run(
        &self,
        entries: &[(u32, TwinEntry)],
        _cached: &mut Option<()>,
        call: &Call,
        _peers: &[u32],
        _answer: &dyn Fn(),
    ) -> Result<[u64; CONTROL_WORDS], String> {
        let controls: Vec<Vec<AtomicU64>> =
            entries.iter().map(|_| (0..CONTROL_WORDS).map(|_| AtomicU64::new(0)).collect()).collect();
        let launches: Vec<Launch> = entries
            .iter()
            .zip(&controls)
            .map(|((_, e), control)| Launch {
                image: &e.image,
                state: &e.state,
                bases: &e.bases,
                control,
                seq: call.seq,
            })
            .collect();
        // The recorded ranks' trace logs, held for the launch (their ranks wait for it).
        let mut logs: Vec<_> = (entries.iter())
            .map(|(_, e)| e.tracer.as_deref().filter(|tracer| tracer.recording()).map(crate::trace::Tracer::log))
            .collect();
        let mut traces: Vec<_> = logs.iter_mut().map(|log| log.as_deref_mut()).collect();
        // SAFETY: every entry's state holds its plan's buffers (checked by each rank's call against its plan) and the
        // records of its connections, which the executors keep alive and which wait for this launch.
        unsafe { twin::run_all(&launches, &mut traces) };
        Ok(launch::most_telling(controls.len(), |report, w| controls[report][w].load(Ordering::Acquire)))
    }
}

/// One rank's plan run by the host twin of the device interpreter, in the launches of its call shape.
pub(crate) struct Twin {
    plan: Plan,
    image: Arc<Image>,
    state: Arc<[AtomicU64]>,
    /// The plan's buffer addresses, written before each call.
    bases: Arc<[AtomicU64]>,
    launcher: Arc<Launcher<TwinTarget>>,
    token: u64,
    _conns: Vec<Arc<ConnMemory>>,
}

impl Drop for Twin {
    fn drop(&mut self) {
        self.launcher.unregister(self.plan.rank, self.token);
    }
}

impl Executor for Twin {
    fn plan_mut(&mut self) -> &mut Plan {
        &mut self.plan
    }

    fn run(&mut self, call: &Call) -> Result<(), RuntimeError> {
        for (word, &base) in self.bases.iter().zip(&self.plan.bases) {
            word.store(base as u64, Ordering::Relaxed);
        }
        let answer = || answer_dump_request(call, || self.snapshot(call.seq));
        answer();
        let words = self.launcher.arrive(&self.plan, call, &answer)?;
        launch::outcome(&self.plan, &words, call)
    }

    fn snapshot(&self, seq: u64) -> Current {
        snapshot(&self.plan, &self.image.plan(0), seq, |word| self.state[word].load(Ordering::Acquire))
    }
}

/// Each instruction's state from the device interpreter's `done` words (`done(word)` reads one of plan `desc`'s):
/// done in the current tile of its block, or not yet.
pub(crate) fn snapshot(plan: &Plan, desc: &PlanDesc, seq: u64, done_word: impl Fn(usize) -> u64) -> Current {
    // Each instruction as its slowest lane has it.
    let done =
        |i: usize| (0..desc.lanes).map(|lane| done_word(twin::done_word(desc, lane, i as u32))).min().unwrap_or(0);
    // The lowest generation any instruction is at tells the tile the slowest block works on.
    let base = seq * (desc.n_tiles as u64 + 1);
    let tile = (0..plan.steps.len()).map(|i| done(i).saturating_sub(base)).min().unwrap_or(0) as usize;
    let instructions = (0..plan.steps.len())
        .map(|i| {
            let finished = done(i) > base + tile as u64;
            instr_state(plan, i, if finished { "done" } else { "waiting" }, !finished)
        })
        .collect();
    Current { seq, algorithm: plan.algorithm.clone(), tile, tiles: plan.n_tiles, instructions }
}

#[cfg(test)]
mod tests;
