//! The device executor's side in Rust: the encoding of plans the CUDA interpreter reads (`encode.rs`) and the host
//! twin of that interpreter (`twin.rs`), which runs the same encoding with the same flag protocol on the CPU. The
//! `twin` transport runs every rank's plan through the twin (ranks as threads, connection records on the heap),
//! so the whole device path short of the GPU is checked against the reference by the runtime matrix.

#[cfg(feature = "cuda")]
pub mod cuda;
pub(crate) mod encode;
pub(crate) mod twin;

use super::host::{describe, mismatch, waiting_for};
use super::{Call, Executor, Plan};
use crate::error::RuntimeError;
use crate::recorder::{Current, InstrState};
use crate::transport::{Fabric, Stamp, Transport};
use crate::wait::Backoff;
use encode::{code, conn, control, Image, CONN_WORDS, CONTROL_WORDS, NONE_LINK, SLOTS};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use twin::{Block, Launch, Poll};

/// Lanes of the twin transport: two, so the runtime matrix runs calls of several tiles on two lanes.
const TWIN_LANES: u32 = 2;

/// One connection's record and slots in host memory, shared by the executors of its two ends.
pub(crate) struct ConnMemory {
    words: Box<[AtomicU64]>,
    /// `SLOTS` slots of the connection's slot size, 64-byte aligned (u64 storage, written through `data`).
    _storage: Box<[u64]>,
}

// SAFETY: the slots are written by the sender and read by the receiver only as the record's counters allow
// (release/acquire on `tail` and `head`).
unsafe impl Send for ConnMemory {}
unsafe impl Sync for ConnMemory {}

impl ConnMemory {
    fn new(slot_bytes: usize) -> ConnMemory {
        let mut storage = vec![0u64; (SLOTS as usize * slot_bytes).div_ceil(8) + 8].into_boxed_slice();
        let base = storage.as_mut_ptr().cast::<u8>();
        let data = base.wrapping_add(base.align_offset(64));
        let words: Box<[AtomicU64]> = (0..CONN_WORDS).map(|_| AtomicU64::new(0)).collect();
        words[conn::DATA].store(data as u64, Ordering::Relaxed);
        words[conn::SLOT_BYTES].store(slot_bytes as u64, Ordering::Relaxed);
        ConnMemory { words, _storage: storage }
    }

    fn address(&self) -> u64 {
        self.words.as_ptr() as u64
    }
}

/// A connection's record: sender, receiver, channel, slot bytes, lane.
type ConnKey = (u32, u32, u8, usize, u32);

/// The `twin` transport's fabric: connection records on the heap, one per (sender, receiver, channel, slot size),
/// shared by the rank threads of one group.
#[derive(Default)]
pub(crate) struct TwinFabric {
    conns: Mutex<HashMap<ConnKey, Arc<ConnMemory>>>,
}

impl Fabric for TwinFabric {
    fn transport(&self) -> Transport {
        Transport::Twin
    }

    fn remove_all(&self) {}

    fn prepare(&self, plan: Plan) -> Result<Box<dyn Executor>, RuntimeError> {
        let image = encode::encode(&[&plan], TWIN_LANES).map_err(RuntimeError::Config)?;
        let mut registry = self.conns.lock().map_err(|_| RuntimeError::Poisoned)?;
        let conns: Vec<Arc<ConnMemory>> = image
            .conns
            .iter()
            .map(|&(from, to, channel, slot_bytes, lane)| {
                registry
                    .entry((from, to, channel, slot_bytes, lane))
                    .or_insert_with(|| Arc::new(ConnMemory::new(slot_bytes)))
                    .clone()
            })
            .collect();
        let state: Box<[AtomicU64]> = (0..image.state_words).map(|_| AtomicU64::new(0)).collect();
        for (c, memory) in conns.iter().enumerate() {
            state[image.conn_table_at + c].store(memory.address(), Ordering::Relaxed);
        }
        let control = (0..CONTROL_WORDS).map(|_| AtomicU64::new(0)).collect();
        let bases = vec![0; image.bases_words];
        Ok(Box::new(Twin { plan, image, state, bases, control, _conns: conns }))
    }
}

/// One rank's plan run by the host twin of the device interpreter.
pub(crate) struct Twin {
    plan: Plan,
    image: Image,
    state: Box<[AtomicU64]>,
    /// The plan's buffer addresses, written before each call.
    bases: Vec<u64>,
    control: Box<[AtomicU64]>,
    _conns: Vec<Arc<ConnMemory>>,
}

impl Executor for Twin {
    fn plan_mut(&mut self) -> &mut Plan {
        &mut self.plan
    }

    fn run(&mut self, call: &Call) -> Result<(), RuntimeError> {
        for (word, &base) in self.bases.iter_mut().zip(&self.plan.bases) {
            *word = base as u64;
        }
        for word in self.control.iter() {
            word.store(0, Ordering::Relaxed);
        }
        let launch = Launch {
            image: &self.image,
            state: &self.state,
            bases: &self.bases,
            control: &self.control,
            seq: call.seq,
        };
        let mut blocks: Vec<Block> = (0..self.image.header().n_blocks).map(|b| Block::new(&self.image, b)).collect();
        let mut wait = Backoff::new(call.timeout, call.spins);
        loop {
            let (mut moved, mut all_done) = (false, true);
            for block in &mut blocks {
                // SAFETY: the state holds this plan's buffers (checked by the call against the plan) and the
                // records of its connections, kept alive by `_conns`.
                match unsafe { block.poll(&launch) } {
                    Poll::Progressed => moved = true,
                    Poll::Idle => {}
                    Poll::Done => continue,
                }
                all_done &= block.is_done();
            }
            if self.control[control::CODE].load(Ordering::Acquire) != code::OK {
                return Err(self.fault(call));
            }
            if all_done {
                return Ok(());
            }
            if moved {
                wait.reset();
                continue;
            }
            let stuck = blocks.iter().find(|b| !b.is_done()).expect("a block not done");
            let (tile, i) = stuck.pending(&launch);
            let (plan, image, state) = (&self.plan, &self.image, &self.state);
            let checked = wait.idle(|| {
                answer_dump_request(plan, image, state, call);
                call.bootstrap.health(&plan.peers)
            });
            if let Err(fault) = checked {
                let error = fault.into_error(
                    plan.rank,
                    describe(plan, i as usize),
                    format!("tile {tile}"),
                    waiting_for(plan, i as usize),
                );
                call.recorder.dump(dump_reason(&error), Some(snapshot(plan, image, state, call.seq)));
                return Err(error);
            }
        }
    }
}

impl Twin {
    /// The error of the fault the interpreter recorded in the control words.
    fn fault(&self, call: &Call) -> RuntimeError {
        let c = |w: usize| self.control[w].load(Ordering::Acquire);
        let (i, tile) = (c(control::INSTR) as usize, c(control::TILE));
        let error = match c(control::CODE) {
            code::MISMATCH => {
                let link = c(control::LINK) as usize;
                let got = Stamp { seq: c(control::GOT_SEQ), fingerprint: c(control::GOT_FP) };
                let ours = Stamp { seq: call.seq, fingerprint: self.plan.fingerprint };
                mismatch(&self.plan, self.plan.links[link].from, got, None, ours, call)
            }
            other => {
                let why = match other {
                    code::TIMEOUT => "timed out",
                    code::ABORTED => "was aborted",
                    code::BAD_IMAGE => "refused the image (another version)",
                    _ => "failed",
                };
                RuntimeError::Config(format!(
                    "rank {}: the device interpreter {why} at {} in tile {tile} (fault code {other})",
                    self.plan.rank,
                    describe(&self.plan, i)
                ))
            }
        };
        call.recorder.dump(dump_reason(&error), Some(snapshot(&self.plan, &self.image, &self.state, call.seq)));
        error
    }
}

fn dump_reason(error: &RuntimeError) -> &'static str {
    match error {
        RuntimeError::Timeout { .. } => "timeout",
        RuntimeError::PeerFailed { .. } => "peer failed",
        RuntimeError::Mismatch { .. } => "mismatch",
        _ => "error",
    }
}

fn answer_dump_request(plan: &Plan, image: &Image, state: &[AtomicU64], call: &Call) {
    let requests = crate::recorder::requests();
    if requests != call.answered.get() {
        call.answered.set(requests);
        call.recorder.dump("SIGUSR1", Some(snapshot(plan, image, state, call.seq)));
    }
}

/// Each instruction's state from the `done` words: done in the current tile of its block, or not yet.
fn snapshot(plan: &Plan, image: &Image, state: &[AtomicU64], seq: u64) -> Current {
    let desc = image.plan(0);
    // Each instruction as its slowest lane has it.
    let done = |i: usize| {
        (0..desc.lanes)
            .map(|lane| state[twin::done_word(&desc, lane, i as u32)].load(Ordering::Acquire))
            .min()
            .unwrap_or(0)
    };
    // The lowest generation any instruction is at tells the tile the slowest block works on.
    let base = seq * (desc.n_tiles as u64 + 1);
    let tile = (0..plan.steps.len()).map(|i| done(i).saturating_sub(base)).min().unwrap_or(0) as usize;
    let instructions = (0..plan.steps.len())
        .map(|i| {
            let (step, label) = (&plan.steps[i], &plan.labels[i]);
            let finished = done(i) > base + tile as u64;
            let peer = |link: u16, sending: bool| {
                (link != NONE_LINK).then(|| {
                    let end = &plan.links[link as usize];
                    if sending {
                        end.to
                    } else {
                        end.from
                    }
                })
            };
            InstrState {
                index: label.index,
                op: label.op.name().to_string(),
                line: label.line,
                state: if finished { "done" } else { "waiting" }.to_string(),
                waiting_for: (!finished).then(|| waiting_for(plan, i)),
                recv_from: peer(step.recv, false),
                send_to: peer(step.send, true),
            }
        })
        .collect();
    Current { seq, algorithm: plan.algorithm.clone(), tile, tiles: plan.n_tiles, instructions }
}

#[cfg(test)]
mod tests;
