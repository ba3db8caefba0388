//! Races: for every chunk slot of every rank, each access is ordered by dependencies after the last write, and each
//! write after every read since that write. Unordered conflicting accesses are reported with both instructions.

use super::Context;
use crate::diag::Error;
use crate::sched::slots::SlotHistory;
use crate::sched::{Operand, RankProgram};

pub(crate) fn check(ctx: &Context, errors: &mut Vec<Error>) {
    let (base, total) = crate::sched::slot_bases(&ctx.sched.buffers);
    let mut history = SlotHistory::new(total as usize);
    let mut seen = Vec::new();
    let mut conflicts = Vec::new();
    for (rank, program) in ctx.sched.ranks.iter().enumerate() {
        history.reset();
        seen.clear();
        seen.resize(program.len(), u32::MAX);
        let slots = |op: Operand, count: u32| {
            let start = (base[op.buf.0 as usize] + op.index) as usize;
            start..start + count as usize
        };
        for (i, instr) in program.instrs.iter().enumerate() {
            let i = i as u32;
            conflicts.clear();
            for read in instr.reads() {
                for slot in slots(read, instr.count) {
                    conflicts.push(history.last_writer(slot));
                }
            }
            if let Some(dst) = instr.dst.get() {
                for slot in slots(dst, instr.count) {
                    conflicts.push(history.last_writer(slot));
                    conflicts.extend(history.readers(slot).filter(|&r| r != i));
                }
            }
            conflicts.sort_unstable();
            conflicts.dedup();
            for &earlier in conflicts.iter().filter(|&&e| e != u32::MAX) {
                if !ordered(program, earlier, i, &mut seen) {
                    let message = format!("race on rank {rank}: {} and {} touch the same chunk, one writes it, and no dependency orders them", ctx.describe(rank as u32, earlier as usize), ctx.describe(rank as u32, i as usize));
                    let first = &program.instrs[earlier as usize];
                    errors.push(
                        ctx.error(
                            "collc::verify::race",
                            message,
                            "add the missing dependency or move one transfer into a later step",
                            instr,
                            "this instruction",
                        )
                        .at(ctx.span(first), "races with this one"),
                    );
                    if errors.len() >= ctx.limits.max_errors {
                        return;
                    }
                }
            }
            for read in instr.reads() {
                for slot in slots(read, instr.count) {
                    history.read(slot, i);
                }
            }
            if let Some(dst) = instr.dst.get() {
                for slot in slots(dst, instr.count) {
                    history.write(slot, i);
                }
            }
        }
    }
}

/// Whether `earlier` happens before `later` through dependencies. Dependencies point backwards (checked by
/// `bounds`), so the search only visits instructions between the two.
fn ordered(program: &RankProgram, earlier: u32, later: u32, seen: &mut [u32]) -> bool {
    if program.deps_of(later as usize).contains(&earlier) {
        return true;
    }
    let mut stack = vec![later];
    while let Some(node) = stack.pop() {
        for &d in program.deps_of(node as usize) {
            if d == earlier {
                return true;
            }
            if d > earlier && seen[d as usize] != later {
                seen[d as usize] = later;
                stack.push(d);
            }
        }
    }
    false
}
