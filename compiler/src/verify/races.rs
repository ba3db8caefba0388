//! Races: for every chunk slot of every rank, each access is ordered by dependencies after the last write, and each
//! write after every read since that write. Unordered conflicting accesses are reported with both instructions.

use super::Context;
use crate::diag::Error;
use crate::sched::slots::SlotHistory;
use crate::sched::{Operand, RankProgram};

/// The check's per-slot state, kept from rank to rank.
pub(crate) struct Races {
    base: Vec<u32>,
    history: SlotHistory,
    /// Per instruction, the search of `ordered` that last visited it (`search`'s number).
    seen: Vec<u32>,
    search: u32,
    conflicts: Vec<u32>,
}

impl Races {
    pub fn new(ctx: &Context) -> Self {
        let (base, total) = crate::sched::slot_bases(&ctx.sched.buffers);
        Races { base, history: SlotHistory::new(total as usize), seen: Vec::new(), search: 0, conflicts: Vec::new() }
    }

    /// Checks one rank (whose operands `bounds` found inside their buffers), until `errors` holds
    /// `Limits::max_errors`.
    pub fn check_rank(&mut self, ctx: &Context, rank: u32, program: &RankProgram, errors: &mut Vec<Error>) {
        let Races { base, history, seen, search, conflicts } = self;
        let rank = rank as usize;
        history.reset();
        seen.clear();
        seen.resize(program.len(), 0);
        *search = 0;
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
                if !ordered(program, earlier, i, seen, search) {
                    let message = format!("race on rank {rank}: {} and {} touch the same chunk, one writes it, and no dependency orders them", ctx.describe(rank as u32, earlier as usize), ctx.describe(rank as u32, i as usize));
                    errors.push(
                        ctx.error(
                            "collc::verify::race",
                            message,
                            "add the missing dependency or move one transfer into a later step",
                            (rank as u32, i as usize),
                            "this instruction",
                        )
                        .at(ctx.span((rank as u32, earlier as usize)), "races with this one"),
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
/// `bounds`), so the search only visits instructions between the two. Each search marks what it visits with a
/// number of its own: a node another search visited (for another `earlier`) was only explored down to that one, so
/// it must be explored again (sharing the marks made valid schedules from MSCCL files fail as races).
fn ordered(program: &RankProgram, earlier: u32, later: u32, seen: &mut [u32], search: &mut u32) -> bool {
    if program.deps_of(later as usize).contains(&earlier) {
        return true;
    }
    *search = match search.checked_add(1) {
        Some(next) => next,
        None => {
            seen.fill(0);
            1
        }
    };
    let mark = *search;
    let mut stack = vec![later];
    while let Some(node) = stack.pop() {
        for &d in program.deps_of(node as usize) {
            if d == earlier {
                return true;
            }
            if d > earlier && seen[d as usize] != mark {
                seen[d as usize] = mark;
                stack.push(d);
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::ordered;
    use crate::sched::{BufId, Instr, Op, Operand, RankProgram, NO_RANK};

    fn copy() -> Instr {
        let at = Operand::new(BufId::OUT, 0);
        Instr {
            op: Op::Copy,
            channel: 0,
            span: 0,
            count: 1,
            send_peer: NO_RANK,
            recv_peer: NO_RANK,
            src: at,
            acc: Operand::NONE,
            dst: at,
        }
    }

    /// A chain 0 <- 1 <- 2 <- 3: instruction 3 comes after both 1 and 0, whichever is asked first. Asking for 1 first
    /// used to leave 2 marked as visited, so the search for 0 stopped there (a race reported in an MSCCL file).
    #[test]
    fn a_search_does_not_reuse_another_searchs_marks() {
        let mut program = RankProgram::default();
        program.push(copy(), &[]);
        for i in 0..3 {
            program.push(copy(), &[i]);
        }
        let (mut seen, mut search) = (vec![0; program.len()], 0);
        assert!(ordered(&program, 1, 3, &mut seen, &mut search));
        assert!(ordered(&program, 0, 3, &mut seen, &mut search));
        let mut unordered = RankProgram::default();
        unordered.push(copy(), &[]);
        unordered.push(copy(), &[]);
        unordered.push(copy(), &[1]);
        assert!(!ordered(&unordered, 0, 2, &mut vec![0; 3], &mut search));
    }
}
