//! The collectives' contracts as DESIGN.md's table states them, NCCL's in-place layout, and the operand shape of
//! each instruction, written out again here so that the oracle shares nothing with `collc_compiler::collective`.

use collc_compiler::sched::{BufId, Op};
use collc_compiler::{Collective, Placement, Schedule};

/// Chunks of `in` and `out` per rank for `p` ranks and blocks of `c` chunks.
pub fn buffer_chunks(collective: Collective, p: u32, c: u32) -> (u32, u32) {
    match collective {
        Collective::ReduceScatter | Collective::Scatter => (p * c, c),
        Collective::AllGather | Collective::Gather => (c, p * c),
        Collective::AllToAll => (p * c, p * c),
        _ => (c, c),
    }
}

/// Where the contract's input and output start on `rank`: (buffer, offset) each. In place they share the larger
/// buffer (`out` when equal); allgather's input sits at block `rank` of it, reducescatter's output likewise.
pub fn windows(sched: &Schedule, rank: u32) -> ((BufId, u32), (BufId, u32)) {
    if sched.placement == Placement::OutOfPlace {
        return ((BufId::IN, 0), (BufId::OUT, 0));
    }
    let (in_chunks, out_chunks) = buffer_chunks(sched.collective, sched.n_ranks, sched.chunks);
    let shared = if in_chunks > out_chunks { BufId::IN } else { BufId::OUT };
    let block = rank * sched.chunks;
    match sched.collective {
        Collective::AllGather | Collective::Gather => ((shared, block), (shared, 0)),
        Collective::ReduceScatter | Collective::Scatter => ((shared, 0), (shared, block)),
        _ => ((shared, 0), (shared, 0)),
    }
}

/// Whether `rank` has an input at all (broadcast, scatter and sendrecv read only the root's).
pub fn has_input(sched: &Schedule, rank: u32) -> bool {
    !matches!(sched.collective, Collective::Broadcast | Collective::Scatter | Collective::SendRecv)
        || rank == sched.root
}

/// The inputs `x[q][c]` whose sum output chunk `chunk` of `rank` must hold; `None` where the contract is silent.
pub fn contract(sched: &Schedule, rank: u32, chunk: u32) -> Option<Vec<(u32, u32)>> {
    let (p, c, root) = (sched.n_ranks, sched.chunks, sched.root);
    let all = |input_chunk: u32| Some((0..p).map(|q| (q, input_chunk)).collect());
    match sched.collective {
        Collective::AllReduce => all(chunk),
        Collective::ReduceScatter => all(rank * c + chunk),
        Collective::Reduce if rank == root => all(chunk),
        Collective::AllGather => Some(vec![(chunk / c, chunk % c)]),
        Collective::Gather if rank == root => Some(vec![(chunk / c, chunk % c)]),
        Collective::Broadcast => Some(vec![(root, chunk)]),
        Collective::Scatter => Some(vec![(root, rank * c + chunk)]),
        Collective::AllToAll => Some(vec![(chunk / c, rank * c + chunk % c)]),
        Collective::SendRecv if rank == sched.peer => Some(vec![(root, chunk)]),
        _ => None,
    }
}

/// (reads `src`, reads `acc`, writes `dst`, sends, receives) for each op, from the instruction set's definition.
pub fn shape(op: Op) -> [bool; 5] {
    match op {
        Op::Send => [true, false, false, true, false],
        Op::Recv => [false, false, true, false, true],
        Op::RecvReduceCopy => [false, true, true, false, true],
        Op::RecvReduceSend => [false, true, false, true, true],
        Op::RecvReduceCopySend => [false, true, true, true, true],
        Op::RecvCopySend => [false, false, true, true, true],
        Op::Copy => [true, false, true, false, false],
        Op::Reduce => [true, true, true, false, false],
    }
}
