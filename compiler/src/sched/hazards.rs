//! Dependencies from data hazards: per rank, each instruction waits for the last writer of every chunk it reads or
//! writes and for the readers since of every chunk it writes (read-after-write, write-after-read, write-after-write),
//! and for nothing else.

use super::slots::{SlotHistory, NONE};
use super::{BufferDecl, Instr, Operand, RankProgram};

/// Per-slot hazard state of one rank, reused across ranks.
pub(crate) struct Hazards {
    base: Vec<u32>,
    pub history: SlotHistory,
}

impl Hazards {
    fn new(buffers: &[BufferDecl]) -> Self {
        let (base, total) = super::slot_bases(buffers);
        Hazards { base, history: SlotHistory::new(total as usize) }
    }

    /// The slots (indices into `history`) of `count` chunks from `op`.
    pub fn slots(&self, op: Operand, count: u32) -> std::ops::Range<usize> {
        let start = (self.base[op.buf.0 as usize] + op.index) as usize;
        start..start + count as usize
    }

    /// Into `deps`, sorted and once each, the instructions that `instr`, numbered `at`, must wait for: the last writer
    /// of every chunk it reads or writes, and the readers since of every chunk it writes.
    pub fn conflicts(&self, instr: &Instr, at: u32, deps: &mut Vec<u32>) {
        deps.clear();
        for read in instr.reads() {
            for slot in self.slots(read, instr.count) {
                deps.push(self.history.last_writer(slot));
            }
        }
        if let Some(dst) = instr.dst.get() {
            for slot in self.slots(dst, instr.count) {
                deps.push(self.history.last_writer(slot));
                deps.extend(self.history.readers(slot).filter(|&r| r != at));
            }
        }
        deps.retain(|&d| d != NONE);
        deps.sort_unstable();
        deps.dedup();
    }

    /// Notes that `instr`, numbered `at`, read and wrote its chunks.
    pub fn record(&mut self, instr: &Instr, at: u32) {
        for read in instr.reads() {
            for slot in self.slots(read, instr.count) {
                self.history.read(slot, at);
            }
        }
        if let Some(dst) = instr.dst.get() {
            for slot in self.slots(dst, instr.count) {
                self.history.write(slot, at);
            }
        }
    }
}

/// Computes each instruction's dependencies from the hazards on the slots it reads and writes.
pub(crate) fn with_dependencies(instrs: Vec<Instr>, buffers: &[BufferDecl]) -> RankProgram {
    let mut rank = RankProgram { instrs, ..RankProgram::default() };
    add_dependencies(&mut rank, buffers);
    rank
}

/// Replaces `rank`'s dependencies (keeping the room its lists have) with those its instructions' hazards require.
pub fn add_dependencies(rank: &mut RankProgram, buffers: &[BufferDecl]) {
    with_hazards(buffers, |hazards| dependencies_with(rank, hazards));
}

/// Runs `f` on this thread's hazard state for `buffers` (kept from rank to rank, cleared after `f`). States for a
/// few buffer lists are kept, as `schedule_ranks` alternates between placements rank by rank.
pub(crate) fn with_hazards<R>(buffers: &[BufferDecl], f: impl FnOnce(&mut Hazards) -> R) -> R {
    const KEPT: usize = 4;
    thread_local! {
        static STATES: std::cell::RefCell<Vec<(Vec<BufferDecl>, Hazards)>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    STATES.with(|cell| {
        let mut states = cell.borrow_mut();
        let at = match states.iter().position(|(decls, _)| decls == buffers) {
            Some(at) => at,
            None => {
                if states.len() == KEPT {
                    states.remove(0);
                }
                states.push((buffers.to_vec(), Hazards::new(buffers)));
                states.len() - 1
            }
        };
        let hazards = &mut states[at].1;
        let result = f(hazards);
        hazards.history.reset();
        result
    })
}

fn dependencies_with(rank: &mut RankProgram, h: &mut Hazards) {
    let RankProgram { instrs, dep_ends, deps: all_deps } = rank;
    dep_ends.clear();
    all_deps.clear();
    let mut deps = Vec::new();
    for (i, instr) in (0u32..).zip(instrs.iter()) {
        h.conflicts(instr, i, &mut deps);
        h.record(instr, i);
        all_deps.extend_from_slice(&deps);
        dep_ends.push(all_deps.len() as u32);
    }
}
