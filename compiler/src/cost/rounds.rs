//! A verified schedule's transfers in rounds, for costing a schedule that comes without its program (a `.sched`
//! file): each message goes in the round after the one its sender's data arrived in, a local copy or reduction in
//! the round its inputs are ready, so the step model sees the schedule's own critical path.

use crate::ir::{Buf, Loc, Program, Transfer, TransferKind};
use crate::sched::Op;
use crate::verify::{Connections, VerifiedSchedule};

const NONE: u32 = u32::MAX;

/// The program whose steps are `sched`'s rounds: one transfer per message and per local copy or reduction.
pub(crate) fn program_of(sched: &VerifiedSchedule) -> Program {
    let conns = Connections::build(sched);
    let rounds = rounds(sched, &conns);
    let mut transfers = Vec::new();
    let nowhere = Loc { buf: Buf::In, index: 0 };
    for (rank, program) in (0u32..).zip(&sched.ranks) {
        let first = conns.rank_start[rank as usize];
        for (i, instr) in program.instrs.iter().enumerate() {
            let (_, recv) = conns.rank(rank).of(instr);
            let kind = match instr.op {
                Op::Copy => TransferKind::Copy,
                Op::Reduce => TransferKind::Reduce,
                op if op.receives() => TransferKind::Send {
                    reduce: matches!(op, Op::RecvReduceCopy | Op::RecvReduceSend | Op::RecvReduceCopySend),
                },
                _ => continue,
            };
            let (from, step) = match kind {
                TransferKind::Send { .. } => {
                    let c = &conns.list[recv as usize];
                    (c.from, rounds[(first + i as u32) as usize] - 1)
                }
                _ => (rank, rounds[(first + i as u32) as usize]),
            };
            let t = Transfer {
                count: instr.count,
                from,
                to: rank,
                step,
                src: nowhere,
                dst: nowhere,
                kind,
                channel: 0,
                span: 0,
            };
            transfers.push(t);
        }
    }
    transfers.sort_by_key(|t| t.step);
    Program {
        name: sched.algorithm.clone(),
        collective: sched.collective,
        n_ranks: sched.n_ranks,
        chunks: sched.chunks,
        pipeline: 1,
        root: sched.root,
        peer: sched.peer,
        params: sched.params.clone(),
        scratch: Vec::new(),
        max_count: transfers.iter().map(|t| t.count).max().unwrap_or(0),
        n_steps: transfers.last().map_or(0, |t| t.step + 1),
        transfers,
        spans: Vec::new(),
    }
}

/// Per instruction (global index), its round: the latest of its dependencies' rounds, and for a receive one more
/// than its sender's. In dataflow order, which exists: the schedule verified with bounded channels, and these are
/// fewer conditions.
fn rounds(sched: &VerifiedSchedule, conns: &Connections) -> Vec<u32> {
    let total = sched.n_instrs();
    let mut round = vec![0u32; total];
    let mut unmet = vec![0u32; total];
    // The receive each send's message goes to, as a global index.
    let mut receiver = vec![NONE; total];
    let mut dependents: Vec<Vec<u32>> = vec![Vec::new(); total];
    for c in &conns.list {
        for (&s, &r) in conns.sends_of(c).iter().zip(conns.recvs_of(c)) {
            let (s, r) = (conns.rank_start[c.from as usize] + s, conns.rank_start[c.to as usize] + r);
            receiver[s as usize] = r;
            unmet[r as usize] += 1;
        }
    }
    for (rank, program) in sched.ranks.iter().enumerate() {
        let first = conns.rank_start[rank];
        for i in 0..program.len() {
            for &d in program.deps_of(i) {
                dependents[(first + d) as usize].push(first + i as u32);
                unmet[(first + i as u32) as usize] += 1;
            }
        }
    }
    let mut ready: Vec<u32> = (0..total as u32).filter(|&g| unmet[g as usize] == 0).collect();
    while let Some(g) = ready.pop() {
        let mut meet = |next: u32, at: u32, round: &mut Vec<u32>| {
            round[next as usize] = round[next as usize].max(at);
            unmet[next as usize] -= 1;
            if unmet[next as usize] == 0 {
                ready.push(next);
            }
        };
        let at = round[g as usize];
        if receiver[g as usize] != NONE {
            meet(receiver[g as usize], at + 1, &mut round);
        }
        for &d in &dependents[g as usize] {
            meet(d, at, &mut round);
        }
    }
    round
}
