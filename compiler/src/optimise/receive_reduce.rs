//! Fuses a receive into scratch with the local reduction that consumes it: Recv X + Reduce X into Y ->
//! RecvReduceCopy into Y, reducing straight out of the incoming message as NCCL's RecvReduceCopy does, so the
//! message never takes a round trip through memory. Runs before `fuse`, which may then chain the result with the
//! send that forwards it.

use super::fuse::{dependents, Dependents};
use crate::sched::{BufId, Instr, Op, Operand, RankProgram, Schedule, NO_RANK};

/// Fuses receive-then-reduce pairs on every rank.
pub fn receive_reduce(sched: &mut Schedule) {
    for rank in &mut sched.ranks {
        let pairs = pairs(rank);
        if pairs.iter().any(|&p| p != NO_RANK) {
            rebuild(rank, &pairs);
        }
    }
}

/// `into[a] = b` when receive `a` joins reduction `b`: `b` reduces exactly what `a` received into scratch, nothing
/// else reads it, and no other receive on `a`'s connection comes between them (so receives keep their order).
fn pairs(rank: &RankProgram) -> Vec<u32> {
    let n = rank.len();
    let mut into = vec![NO_RANK; n];
    let dependents = dependents(rank);
    for b in 0..n {
        let reduce = rank.instrs[b];
        if reduce.op != Op::Reduce || reduce.src.buf < BufId(2) {
            continue;
        }
        let Some(&a) = rank.deps_of(b).iter().find(|&&d| received_exactly(&rank.instrs[d as usize], &reduce)) else {
            continue;
        };
        let a = a as usize;
        if into[a] == NO_RANK && only_reader(rank, &dependents, a, b) && connection_free(rank, a, b) {
            into[a] = b as u32;
        }
    }
    into
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

/// Whether no other receive on `a`'s connection lies between `a` and `b`.
fn connection_free(rank: &RankProgram, a: usize, b: usize) -> bool {
    let recv = rank.instrs[a];
    rank.instrs[a + 1..b]
        .iter()
        .all(|i| !(i.op.receives() && i.recv_peer == recv.recv_peer && i.channel == recv.channel))
}

fn overlaps(a: Operand, a_count: u32, b: Operand, b_count: u32) -> bool {
    a.buf == b.buf && a.index < b.index + b_count && b.index < a.index + a_count
}

/// Drops each joined receive and turns its reduction into a RecvReduceCopy. A dependency on a dropped receive
/// moves to its reduction, which comes later than the receive but before anything else that depended on it (only
/// later writers of the scratch chunk did, and they also wait for its reader).
fn rebuild(rank: &mut RankProgram, into: &[u32]) {
    let n = rank.len();
    let mut new_index = vec![0u32; n];
    let mut next = 0u32;
    for i in 0..n {
        if into[i] == NO_RANK {
            new_index[i] = next;
            next += 1;
        }
    }
    for i in 0..n {
        if into[i] != NO_RANK {
            new_index[i] = new_index[into[i] as usize];
        }
    }
    let mut joined_from = vec![NO_RANK; n];
    for (a, &b) in into.iter().enumerate() {
        if b != NO_RANK {
            joined_from[b as usize] = a as u32;
        }
    }
    let old = std::mem::take(rank);
    for i in 0..n {
        if into[i] != NO_RANK {
            continue;
        }
        let mut instr = old.instrs[i];
        let mut deps: Vec<u32> = old.deps_of(i).iter().map(|&d| new_index[d as usize]).collect();
        if joined_from[i] != NO_RANK {
            let recv = old.instrs[joined_from[i] as usize];
            instr = Instr {
                op: Op::RecvReduceCopy,
                src: Operand::NONE,
                recv_peer: recv.recv_peer,
                channel: recv.channel,
                ..instr
            };
            deps.extend(old.deps_of(joined_from[i] as usize).iter().map(|&d| new_index[d as usize]));
        }
        let me = new_index[i];
        deps.retain(|&d| d != me);
        deps.sort_unstable();
        deps.dedup();
        rank.push(instr, &deps);
    }
}
