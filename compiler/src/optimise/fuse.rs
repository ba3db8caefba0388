//! Fuses a receive and the send that forwards what it received into NCCL's chained instructions:
//! Recv+Send -> RecvCopySend, RecvReduceCopy+Send -> RecvReduceCopySend, and, when the local copy is never read
//! again, RecvReduceCopySend -> RecvReduceSend.

use crate::fxhash::FxBuildHasher;
use crate::sched::{BufferDecl, Dependents, Instr, Op, Operand, RankProgram, Schedule, NO_RANK};
use std::cell::RefCell;
use std::collections::HashMap;

/// Fuses receive-then-reduce pairs (`receive_reduce`), then recv-then-forward chains, on every rank.
pub fn fuse(sched: &mut Schedule) {
    for rank in &mut sched.ranks {
        fuse_rank(rank, &sched.buffers);
    }
}

/// `fuse` on one rank. Every step of fusion looks at one rank only, so scheduling can fuse each rank as soon as
/// its dependencies are known, while its instructions are still in cache (`sched::schedule_with`).
pub fn fuse_rank(rank: &mut RankProgram, buffers: &[BufferDecl]) {
    super::receive_reduce::receive_reduce_rank(rank, buffers);
    chain_rank(rank);
}

/// `chain_rank`'s working lists, kept from rank to rank (fusion runs on thousands of ranks in a row).
#[derive(Default)]
struct Scratch {
    merged_into: Vec<u32>,
    forward: Vec<u32>,
    new_index: Vec<u32>,
    deps: Vec<u32>,
    dependents: Dependents,
    last_send: HashMap<(u32, u8), u32, FxBuildHasher>,
}

/// A Send `j` can join the receive `i` whose result it forwards when it depends on nothing else, runs on the same
/// channel, and moving it up to `i` keeps the order of sends on its connection.
fn chain_rank(rank: &mut RankProgram) {
    thread_local! {
        static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    }
    SCRATCH.with(|scratch| chain_rank_with(rank, &mut scratch.borrow_mut()));
}

fn chain_rank_with(rank: &mut RankProgram, scratch: &mut Scratch) {
    let n = rank.len();
    let Scratch { merged_into, forward, last_send, .. } = scratch;
    merged_into.clear();
    merged_into.resize(n, NO_RANK);
    forward.clear();
    forward.resize(n, NO_RANK);
    last_send.clear();
    let mut any = false;
    for (j, &send) in rank.instrs.iter().enumerate() {
        if !send.op.sends() {
            continue;
        }
        let key = (send.send_peer, send.channel);
        let mut position = j as u32;
        if let [i] = rank.deps_of(j) {
            let recv = rank.instrs[*i as usize];
            let joinable = send.op == Op::Send
                && matches!(recv.op, Op::Recv | Op::RecvReduceCopy)
                && forward[*i as usize] == NO_RANK
                && recv.dst == send.src
                && recv.count == send.count
                && recv.channel == send.channel
                && last_send.get(&key).is_none_or(|&prev| prev < *i);
            if joinable {
                forward[*i as usize] = j as u32;
                merged_into[j] = *i;
                position = *i;
                any = true;
            }
        }
        last_send.insert(key, position);
    }
    if any {
        rebuild(rank, scratch);
    }
}

/// Rewrites the rank in place: instruction `i` moves to position `new_index[i] <= i`, and its dependency list is
/// never longer than before, so every write lands on something already read.
fn rebuild(rank: &mut RankProgram, scratch: &mut Scratch) {
    let Scratch { merged_into, forward, new_index, deps, dependents, .. } = scratch;
    let n = rank.len();
    new_index.clear();
    new_index.resize(n, 0);
    let mut next = 0u32;
    for i in 0..n {
        if merged_into[i] == NO_RANK {
            new_index[i] = next;
            next += 1;
        }
    }
    for i in 0..n {
        if merged_into[i] != NO_RANK {
            new_index[i] = new_index[merged_into[i] as usize];
        }
    }
    // Only a RecvReduceCopySend asks whether its write is dead, which needs the dependents.
    let reduce_forwards = (0..n).any(|i| forward[i] != NO_RANK && rank.instrs[i].op == Op::RecvReduceCopy);
    if reduce_forwards {
        rank.dependents_into(dependents);
    }
    rank.expand_deps();
    let mut deps_len = 0usize;
    // Where instruction i's dependencies started before the rewrite (`dep_ends[i - 1]` may be rewritten already).
    let mut old_start = 0usize;
    for i in 0..n {
        let old = old_start..rank.dep_ends[i] as usize;
        old_start = old.end;
        if merged_into[i] != NO_RANK {
            continue;
        }
        let mut instr = rank.instrs[i];
        if forward[i] != NO_RANK {
            let j = forward[i] as usize;
            instr = fused(instr, rank.instrs[j]);
            if instr.op == Op::RecvReduceCopySend && write_is_dead(rank, i, j, dependents) {
                instr = Instr { op: Op::RecvReduceSend, dst: Operand::NONE, ..instr };
            }
        }
        deps.clear();
        deps.extend(rank.deps[old].iter().map(|&d| new_index[d as usize]));
        if deps.len() > 1 {
            deps.sort_unstable();
            deps.dedup();
        }
        // A dependency on a merged send now points at its receive; one on a write that fusion removed is stale.
        deps.retain(|&d| hazard(&rank.instrs[d as usize], &instr));
        let at = new_index[i] as usize;
        rank.instrs[at] = instr;
        rank.deps[deps_len..deps_len + deps.len()].copy_from_slice(deps);
        deps_len += deps.len();
        rank.dep_ends[at] = deps_len as u32;
    }
    rank.instrs.truncate(next as usize);
    rank.dep_ends.truncate(next as usize);
    rank.deps.truncate(deps_len);
}

/// Whether `later` must wait for `earlier`: one writes a chunk the other reads or writes.
pub(super) fn hazard(earlier: &Instr, later: &Instr) -> bool {
    let meets = |a: Operand, b: Operand| overlaps(a, earlier.count, b, later.count);
    let earlier_write = earlier.dst.get();
    let later_write = later.dst.get();
    earlier_write.is_some_and(|w| later.reads().any(|r| meets(w, r)) || later_write.is_some_and(|lw| meets(w, lw)))
        || later_write.is_some_and(|lw| earlier.reads().any(|r| meets(r, lw)))
}

pub(super) fn fused(recv: Instr, send: Instr) -> Instr {
    let op = if recv.op == Op::Recv { Op::RecvCopySend } else { Op::RecvReduceCopySend };
    Instr { op, send_peer: send.send_peer, ..recv }
}

pub(super) fn overlaps(a: Operand, a_count: u32, b: Operand, b_count: u32) -> bool {
    a.buf == b.buf && a.index < b.index + b_count && b.index < a.index + a_count
}

/// The value `i` writes is dead when nothing but the forwarding send `j` reads it before it is overwritten in full
/// (or, for scratch, never read again). User-visible buffers keep their last value, so they need the overwrite.
fn write_is_dead(rank: &RankProgram, i: usize, j: usize, dependents: &Dependents) -> bool {
    let written = rank.instrs[i];
    let dst = written.dst;
    let mut covered = Coverage::new(written.count);
    for &k in dependents.of(i) {
        if k as usize == j {
            continue;
        }
        let later = rank.instrs[k as usize];
        if later.reads().any(|r| overlaps(r, later.count, dst, written.count)) {
            return false;
        }
        if let Some(w) = later.dst.get().filter(|w| overlaps(*w, later.count, dst, written.count)) {
            // The chunks of `dst` that `w` covers, as offsets from `dst.index`.
            let from = w.index.saturating_sub(dst.index);
            let to = (w.index + later.count - dst.index).min(written.count);
            covered.add(from..to);
        }
    }
    dst.buf.is_scratch() || covered.is_full()
}

/// Which of `n` chunks later writes cover: a bit mask up to 64 chunks (no allocation on the common path), else a
/// list.
enum Coverage {
    Mask { n: u32, bits: u64 },
    List(Vec<bool>),
}

impl Coverage {
    fn new(n: u32) -> Self {
        if n <= 64 {
            Coverage::Mask { n, bits: 0 }
        } else {
            Coverage::List(vec![false; n as usize])
        }
    }

    fn add(&mut self, range: std::ops::Range<u32>) {
        match self {
            Coverage::Mask { bits, .. } => {
                for c in range {
                    *bits |= 1 << c;
                }
            }
            Coverage::List(list) => list[range.start as usize..range.end as usize].fill(true),
        }
    }

    fn is_full(&self) -> bool {
        match self {
            Coverage::Mask { n, bits } => bits.count_ones() == *n,
            Coverage::List(list) => list.iter().all(|&c| c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Coverage;

    /// The mask (up to 64 chunks) and the list (more) agree on whether overlapping pieces cover every chunk.
    #[test]
    fn coverage_is_full_only_when_every_chunk_is_covered() {
        for n in [1, 3, 64, 65, 130] {
            let mut covered = Coverage::new(n);
            covered.add(0..n / 2);
            assert!(!covered.is_full(), "{n} chunks, first half covered");
            covered.add(n / 3..n - 1);
            assert!(!covered.is_full(), "{n} chunks, last one missing");
            covered.add(n - 1..n);
            assert!(covered.is_full(), "{n} chunks, all covered");
        }
    }
}
