//! Scratch chunks moved to where collc's memory model wants them: a chunk keeps its position in its block (index
//! modulo C) everywhere it goes, because collc spreads a count C does not divide over the first chunks of a block.
//! MSCCL's runtimes cut every chunk alike, so MSCCL files put any chunk in any scratch slot (allpairs files reduce
//! `s[9]` into `i[1]` with C = 64). Scratch is the schedule's own, so the importer may lay it out anew.
//!
//! Each instruction's position comes from its `in`/`out` operands, and crosses to the peer through the message
//! (the k-th send of a connection pairs with its k-th receive), until nothing changes. A scratch operand at index
//! s in an instruction at position p then moves by a shift R(δ) with δ = (p - s) mod C: every shift class gets a
//! region of its own, R(δ) = j·B + δ for the class's ordinal j and B ≥ S + C, so the regions never overlap and a
//! range of chunks stays contiguous. A file whose scratch already keeps positions (δ = 0 everywhere) is unchanged.

use crate::sched::{BufId, Operand, Schedule};
use std::collections::HashMap;

/// The most scratch chunks the new layout may take (the verifier's own bound on chunk slots is far below it).
const MAX_SCRATCH: u64 = 1 << 30;

/// Moves scratch operands so that every instruction's operands keep one position; grows scratch to fit.
pub fn keep_positions(sched: &mut Schedule) {
    let c = sched.chunks.max(1);
    let Some(scratch) = sched.buffers.get(BufId::FIRST_SCRATCH.0 as usize).map(|b| b.chunks) else { return };
    let positions = propagate(sched, c);
    let is_scratch = |o: Operand| o.buf == BufId::FIRST_SCRATCH;
    let shift = |p: Option<u32>, o: Operand| p.map_or(0, |p| (p + c - o.index % c) % c);
    let mut classes: Vec<u32> = Vec::new();
    for (program, positions) in sched.ranks.iter().zip(&positions) {
        for (instr, &p) in program.instrs.iter().zip(positions) {
            for o in [instr.src, instr.acc, instr.dst].into_iter().filter(|&o| is_scratch(o)) {
                classes.push(shift(p, o));
            }
        }
    }
    classes.sort_unstable();
    classes.dedup();
    if classes.iter().all(|&d| d == 0) {
        return;
    }
    let block = (scratch as u64 + c as u64).div_ceil(c as u64) * c as u64;
    if classes.len() as u64 * block > MAX_SCRATCH {
        // Too large to lay out anew: left as written, the verifier names the operands whose positions differ.
        return;
    }
    let block = block as u32;
    let region = |d: u32| classes.binary_search(&d).map_or(0, |j| j as u32 * block + d);
    for (program, positions) in sched.ranks.iter_mut().zip(&positions) {
        for (instr, &p) in program.instrs.iter_mut().zip(positions) {
            for o in [&mut instr.src, &mut instr.acc, &mut instr.dst] {
                if is_scratch(*o) {
                    *o = Operand::new(BufId::FIRST_SCRATCH, o.index + region(shift(p, *o)));
                }
            }
        }
    }
    sched.buffers[BufId::FIRST_SCRATCH.0 as usize].chunks = classes.len() as u32 * block;
}

/// Per rank, per instruction: the position in its block of its first chunk, where an operand outside scratch or a
/// message from or to such an instruction says it.
fn propagate(sched: &Schedule, c: u32) -> Vec<Vec<Option<u32>>> {
    let mut positions: Vec<Vec<Option<u32>>> = sched
        .ranks
        .iter()
        .map(|program| {
            program
                .instrs
                .iter()
                .map(|i| [i.src, i.acc, i.dst].into_iter().find(|o| o.get().is_some() && o.buf != BufId::FIRST_SCRATCH))
                .map(|o| o.map(|o| o.index % c))
                .collect()
        })
        .collect();
    // Each message: (sending rank, its instruction, receiving rank, its instruction).
    let mut connections: HashMap<(u32, u32, u8), (Vec<usize>, Vec<usize>)> = HashMap::new();
    for (rank, program) in sched.ranks.iter().enumerate() {
        for (i, instr) in program.instrs.iter().enumerate() {
            if let Some(to) = instr.send_peer() {
                connections.entry((rank as u32, to, instr.channel)).or_default().0.push(i);
            }
            if let Some(from) = instr.recv_peer() {
                connections.entry((from, rank as u32, instr.channel)).or_default().1.push(i);
            }
        }
    }
    let messages: Vec<(usize, usize, usize, usize)> = connections
        .iter()
        .flat_map(|(&(from, to, _), (sends, recvs))| {
            sends.iter().zip(recvs).map(move |(&s, &r)| (from as usize, s, to as usize, r))
        })
        .collect();
    loop {
        let mut changed = false;
        for &(a, i, b, j) in &messages {
            match (positions[a][i], positions[b][j]) {
                (Some(p), None) => (positions[b][j], changed) = (Some(p), true),
                (None, Some(p)) => (positions[a][i], changed) = (Some(p), true),
                _ => {}
            }
        }
        if !changed {
            return positions;
        }
    }
}
