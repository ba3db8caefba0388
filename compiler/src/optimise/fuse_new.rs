//! Dependencies and fusion of a rank as scheduling makes it, in one walk: the result of `sched::add_dependencies`
//! then `fuse_rank`, without the second walk over the rank, the renumbering and the turned-around dependencies
//! that fusing a finished rank needs.
//!
//! The walk derives dependencies from hazards, as `add_dependencies` does, but numbers instructions as they will
//! stand after fusion: a Send that joins the receive it forwards never gets a number of its own, and its read is
//! recorded as the receive's. Whether a receive-reduce's write is dead once it forwards (RecvReduceSend) depends on
//! what later instructions do, so the walk notes, for each receive-reduce, whether an instruction that depends on
//! it reads what it wrote and which of its chunks such instructions overwrite; the verdicts come at the end.

use super::fuse::{fuse_rank, fused, hazard, overlaps};
use super::receive_reduce::reduces_scratch;
use crate::fxhash::FxBuildHasher;
use crate::sched::hazards::{add_dependencies, with_hazards, Hazards};
use crate::sched::slots::NONE;
use crate::sched::{BufferDecl, Instr, Op, Operand, RankProgram, NO_RANK};
use std::cell::RefCell;
use std::collections::HashMap;

/// Chunks a receive-reduce may have for the walk to track its coverage in a bit mask; a rank with a larger one
/// takes the two-pass way.
const MASK_CHUNKS: u32 = 64;

/// Derives the dependencies of a rank fresh from scheduling (instructions only) and fuses it: the same rank as
/// `sched::add_dependencies` followed by `fuse_rank` (`tests/integration/passes.rs` compares them over the library).
/// A rank with a reduction out of scratch (the receive-reduce pass renumbers it first) or a receive-reduce of more
/// than 64 chunks takes those two passes.
pub fn fuse_new_rank(rank: &mut RankProgram, buffers: &[BufferDecl]) {
    let two_pass =
        rank.instrs.iter().any(|i| reduces_scratch(i) || (i.op == Op::RecvReduceCopy && i.count > MASK_CHUNKS));
    if two_pass {
        add_dependencies(rank, buffers);
        fuse_rank(rank, buffers);
        return;
    }
    thread_local! {
        static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    }
    SCRATCH.with(|scratch| with_hazards(buffers, |hazards| walk(rank, hazards, &mut scratch.borrow_mut())));
}

/// The walk's working lists, kept from rank to rank.
#[derive(Default)]
struct Scratch {
    /// Per instruction (fused numbering): `RECEIVE_REDUCE`, `READ`, `DROPPED`.
    flags: Vec<u8>,
    /// Per receive-reduce: which of its chunks instructions that depend on it overwrite.
    covered: Vec<u64>,
    deps: Vec<u32>,
    last_send: LastSend,
}

/// The position of the last send per (peer, channel). Most sends go where the one before went, so that one is
/// kept out of the map (a lookup and an insert per send were 1.3% of `collc check` at p = 1024).
struct LastSend {
    key: (u32, u8),
    position: u32,
    others: HashMap<(u32, u8), u32, FxBuildHasher>,
}

/// The key of no send: `LastSend` holds no position for it.
const NO_RANK_KEY: (u32, u8) = (NO_RANK, 0);

impl Default for LastSend {
    fn default() -> Self {
        LastSend { key: NO_RANK_KEY, position: NONE, others: HashMap::default() }
    }
}

impl LastSend {
    fn get(&self, key: (u32, u8)) -> Option<u32> {
        if key == self.key && self.position != NONE {
            return Some(self.position);
        }
        self.others.get(&key).copied()
    }

    fn set(&mut self, key: (u32, u8), position: u32) {
        if key != self.key {
            if self.position != NONE {
                self.others.insert(self.key, self.position);
            }
            self.key = key;
        }
        self.position = position;
    }

    fn clear(&mut self) {
        (self.key, self.position) = (NO_RANK_KEY, NONE);
        self.others.clear();
    }
}

/// Was a RecvReduceCopy before fusion: if it forwards, its write may be dead.
const RECEIVE_REDUCE: u8 = 1;
/// An instruction that depends on it reads what it wrote: the write is live.
const READ: u8 = 2;
/// Its write was dropped (now a RecvReduceSend).
const DROPPED: u8 = 4;

fn walk(rank: &mut RankProgram, h: &mut Hazards, s: &mut Scratch) {
    let RankProgram { instrs, dep_ends, deps: all_deps } = rank;
    dep_ends.clear();
    all_deps.clear();
    let n = instrs.len();
    s.flags.clear();
    s.flags.resize(n, 0);
    s.covered.clear();
    s.covered.resize(n, 0);
    s.last_send.clear();
    let mut next = 0usize;
    let mut forwarded_reduce = false;
    for k in 0..n {
        let instr = instrs[k];
        if instr.op.sends() {
            let key = (instr.send_peer, instr.channel);
            // A Send depends only on the last writer of what it reads: it joins that receive when it is its one
            // dependency, forwards exactly what it received on the same channel, and moving it up to the receive
            // keeps the order of sends on its connection.
            if let Some(o) = (instr.op == Op::Send).then(|| sole_writer(h, instr.src, instr.count)).flatten() {
                let recv = instrs[o as usize];
                let joinable = matches!(recv.op, Op::Recv | Op::RecvReduceCopy)
                    && recv.dst == instr.src
                    && recv.count == instr.count
                    && recv.channel == instr.channel
                    && s.last_send.get(key).is_none_or(|prev| prev < o);
                if joinable {
                    instrs[o as usize] = fused(recv, instr);
                    // Its read happens at the receive now.
                    h.record(&instr, o);
                    s.last_send.set(key, o);
                    forwarded_reduce |= recv.op == Op::RecvReduceCopy;
                    continue;
                }
            }
            s.last_send.set(key, next as u32);
        }
        let at = next as u32;
        h.conflicts(&instr, at, &mut s.deps);
        for &d in &s.deps {
            if s.flags[d as usize] & (RECEIVE_REDUCE | READ) == RECEIVE_REDUCE {
                note_dependent(&instrs[d as usize], &instr, &mut s.flags[d as usize], &mut s.covered[d as usize]);
            }
        }
        h.record(&instr, at);
        instrs[next] = instr;
        if instr.op == Op::RecvReduceCopy {
            s.flags[next] = RECEIVE_REDUCE;
        }
        all_deps.extend_from_slice(&s.deps);
        dep_ends.push(all_deps.len() as u32);
        next += 1;
    }
    instrs.truncate(next);
    if forwarded_reduce && drop_dead_writes(instrs, s) {
        prune_stale_dependencies(rank, &s.flags);
    }
}

/// The one instruction that last wrote every chunk of `count` from `src`, if there is one.
fn sole_writer(h: &Hazards, src: Operand, count: u32) -> Option<u32> {
    let mut slots = h.slots(src, count);
    let first = h.history.last_writer(slots.next()?);
    (first != NONE && slots.all(|slot| h.history.last_writer(slot) == first)).then_some(first)
}

/// What `later`, which depends on the receive-reduce `written`, tells of its write: read (live) or overwritten in
/// part. As `fuse::write_is_dead` judges it from the dependents.
fn note_dependent(written: &Instr, later: &Instr, flags: &mut u8, covered: &mut u64) {
    let dst = written.dst;
    if later.reads().any(|r| overlaps(r, later.count, dst, written.count)) {
        *flags |= READ;
    } else if let Some(w) = later.dst.get().filter(|w| overlaps(*w, later.count, dst, written.count)) {
        let from = w.index.saturating_sub(dst.index);
        let to = (w.index + later.count - dst.index).min(written.count);
        for c in from..to {
            *covered |= 1 << c;
        }
    }
}

/// Turns each forwarding receive-reduce whose write nothing reads before it is overwritten in full (or, for
/// scratch, ever) into a RecvReduceSend. Whether any was.
fn drop_dead_writes(instrs: &mut [Instr], s: &mut Scratch) -> bool {
    let mut any = false;
    for (o, instr) in instrs.iter_mut().enumerate() {
        if instr.op != Op::RecvReduceCopySend || s.flags[o] & READ != 0 {
            continue;
        }
        let full = if instr.count == MASK_CHUNKS { u64::MAX } else { (1u64 << instr.count) - 1 };
        if instr.dst.buf.is_scratch() || s.covered[o] == full {
            *instr = Instr { op: Op::RecvReduceSend, dst: Operand::NONE, ..*instr };
            s.flags[o] |= DROPPED;
            any = true;
        }
    }
    any
}

/// A dependency on, or of, an instruction whose write was dropped may no longer stand for a hazard: keep only those
/// that do (every other dependency joins two instructions that each still touch what they touched unfused).
fn prune_stale_dependencies(rank: &mut RankProgram, flags: &[u8]) {
    let RankProgram { instrs, dep_ends, deps } = rank;
    let (mut kept, mut start) = (0usize, 0usize);
    for (at, end) in dep_ends.iter_mut().enumerate() {
        let old = start..*end as usize;
        start = *end as usize;
        let check_all = flags[at] & DROPPED != 0;
        for x in old {
            let d = deps[x];
            if (!check_all && flags[d as usize] & DROPPED == 0) || hazard(&instrs[d as usize], &instrs[at]) {
                deps[kept] = d;
                kept += 1;
            }
        }
        *end = kept as u32;
    }
    deps.truncate(kept);
}
