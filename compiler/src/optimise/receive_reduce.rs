//! Fuses a receive into scratch with the local reduction that consumes it: Recv X + Reduce X into Y ->
//! RecvReduceCopy into Y, reducing straight out of the incoming message as NCCL's RecvReduceCopy does, so the
//! message never takes a round trip through memory. Runs before `fuse`, which may then chain the result with the
//! send that forwards it.

use super::fuse::overlaps;
use crate::sched::hazards::with_dependencies;
use crate::sched::{BufferDecl, Dependents, Instr, Op, Operand, RankProgram, NO_RANK};

/// Fuses the receive-then-reduce pairs of one rank. The joined receive moves to its reduction's place, so a changed
/// rank's dependencies are derived again from the hazards of its new instruction list, as scheduling derives them:
/// patching them by hand would lose the orderings the dropped receive stood between.
pub(super) fn receive_reduce_rank(rank: &mut RankProgram, buffers: &[BufferDecl]) {
    // Most ranks of most algorithms have no reduction out of scratch: skip them without building anything.
    if !rank.instrs.iter().any(reduces_scratch) {
        return;
    }
    let into = pairs(rank);
    if into.iter().any(|&b| b != NO_RANK) {
        let instrs = joined(rank, &into);
        *rank = with_dependencies(instrs, buffers);
    }
}

/// `into[a] = b` when receive `a` joins reduction `b`: `b` reduces exactly what `a` received into scratch, nothing
/// else reads it or writes over it in between, and no other receive on `a`'s connection comes between them (so
/// receives keep their order on the connection).
fn pairs(rank: &RankProgram) -> Vec<u32> {
    let n = rank.len();
    let mut into = vec![NO_RANK; n];
    let dependents = rank.dependents();
    for b in 0..n {
        let reduce = rank.instrs[b];
        if !reduces_scratch(&reduce) {
            continue;
        }
        let Some(&a) = rank.deps_of(b).iter().find(|&&d| received_exactly(&rank.instrs[d as usize], &reduce)) else {
            continue;
        };
        let a = a as usize;
        if into[a] == NO_RANK && only_reader(rank, &dependents, a, b) && untouched_between(rank, a, b) {
            into[a] = b as u32;
        }
    }
    into
}

pub(super) fn reduces_scratch(instr: &Instr) -> bool {
    instr.op == Op::Reduce && instr.src.buf.is_scratch()
}

fn received_exactly(recv: &Instr, reduce: &Instr) -> bool {
    recv.op == Op::Recv && recv.dst == reduce.src && recv.count == reduce.count
}

/// Whether `b` is the only instruction that reads what `a` wrote.
fn only_reader(rank: &RankProgram, dependents: &Dependents, a: usize, b: usize) -> bool {
    let written = rank.instrs[a];
    dependents.of(a).iter().all(|&k| {
        let later = rank.instrs[k as usize];
        k as usize == b || !later.reads().any(|r| overlaps(r, later.count, written.dst, written.count))
    })
}

/// Whether nothing between `a` and `b` writes over what `a` received or receives on `a`'s connection.
fn untouched_between(rank: &RankProgram, a: usize, b: usize) -> bool {
    let recv = rank.instrs[a];
    rank.instrs[a + 1..b].iter().all(|i| {
        let same_connection = i.op.receives() && i.recv_peer == recv.recv_peer && i.channel == recv.channel;
        let overwrites = i.dst.get().is_some_and(|d| overlaps(d, i.count, recv.dst, recv.count));
        !same_connection && !overwrites
    })
}

/// The rank's instructions with each joined receive dropped and its reduction turned into a RecvReduceCopy (same
/// accumulator and destination, same operand order, so results are bit-identical).
fn joined(rank: &RankProgram, into: &[u32]) -> Vec<Instr> {
    let mut joined_from = vec![NO_RANK; rank.len()];
    for (a, &b) in into.iter().enumerate() {
        if b != NO_RANK {
            joined_from[b as usize] = a as u32;
        }
    }
    let mut instrs = Vec::with_capacity(rank.len());
    for (i, &instr) in rank.instrs.iter().enumerate() {
        if into[i] != NO_RANK {
            continue;
        }
        instrs.push(match joined_from[i] {
            NO_RANK => instr,
            a => {
                let recv = rank.instrs[a as usize];
                Instr {
                    op: Op::RecvReduceCopy,
                    src: Operand::NONE,
                    recv_peer: recv.recv_peer,
                    channel: recv.channel,
                    ..instr
                }
            }
        });
    }
    instrs
}
