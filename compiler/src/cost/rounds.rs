//! A verified schedule's transfers in rounds, for costing a schedule that comes without its program (a `.sched`
//! file): each message goes in the round after the one its sender's data arrived in, a local copy or reduction in
//! the round its inputs are ready, so the step model sees the schedule's own critical path.

use crate::ir::{Buf, Loc, Program, Transfer, TransferKind};
use crate::sched::Op;
use crate::verify::{Connections, VerifiedSchedule};

const NONE: u32 = u32::MAX;

/// The program whose steps are `sched`'s rounds: one transfer per message (in its send's step) and per local copy
/// or reduction.
pub(crate) fn program_of(sched: &VerifiedSchedule) -> Program {
    let conns = Connections::build(sched);
    let Steps { local, message } = steps(sched, &conns);
    let mut transfers = Vec::new();
    let nowhere = Loc { buf: Buf::In, index: 0 };
    for (rank, program) in (0u32..).zip(&sched.ranks) {
        let first = conns.rank_start[rank as usize];
        for (i, instr) in program.instrs.iter().enumerate() {
            let g = (first + i as u32) as usize;
            let (kind, from, step) = match instr.op {
                Op::Copy => (TransferKind::Copy, rank, local[g]),
                Op::Reduce => (TransferKind::Reduce, rank, local[g]),
                op if op.receives() => {
                    let reduce = matches!(op, Op::RecvReduceCopy | Op::RecvReduceSend | Op::RecvReduceCopySend);
                    let (_, recv) = conns.rank(rank).of(instr);
                    (TransferKind::Send { reduce }, conns.list[recv as usize].from, message[g])
                }
                _ => continue,
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

/// Per instruction (global index): the step its local work or its send runs in, and for a receive the step of the
/// message it receives (its sender's).
struct Steps {
    local: Vec<u32>,
    message: Vec<u32>,
}

/// As a `.coll` program's steps would place them: an instruction runs in the step after its dependencies' (two
/// instructions of one step never depend on each other) and, if it receives, after the step its message went in;
/// a send in the step after the previous send on its connection; a message goes in its send's step. In dataflow order, which exists: the schedule verified with bounded channels,
/// and these are fewer conditions.
fn steps(sched: &VerifiedSchedule, conns: &Connections) -> Steps {
    let total = sched.n_instrs();
    // The earliest step each instruction may run in, from what it has met so far.
    let mut earliest = vec![0u32; total];
    let mut local = vec![0u32; total];
    let mut message = vec![0u32; total];
    let mut unmet = vec![0u32; total];
    // The receive each send's message goes to, as a global index.
    let mut receiver = vec![NONE; total];
    let mut dependents: Vec<Vec<u32>> = vec![Vec::new(); total];
    for c in &conns.list {
        let first = conns.rank_start[c.from as usize];
        for (&s, &r) in conns.sends_of(c).iter().zip(conns.recvs_of(c)) {
            let (s, r) = (first + s, conns.rank_start[c.to as usize] + r);
            receiver[s as usize] = r;
            unmet[r as usize] += 1;
        }
        // One message per connection per step, as a program's steps send them (a pipelined program's slices go in
        // consecutive steps).
        for pair in conns.sends_of(c).windows(2) {
            dependents[(first + pair[0]) as usize].push(first + pair[1]);
            unmet[(first + pair[1]) as usize] += 1;
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
        let step = earliest[g as usize];
        local[g as usize] = step;
        let mut meet = |next: u32, at: u32| {
            earliest[next as usize] = earliest[next as usize].max(at);
            unmet[next as usize] -= 1;
            if unmet[next as usize] == 0 {
                ready.push(next);
            }
        };
        if receiver[g as usize] != NONE {
            message[receiver[g as usize] as usize] = step;
            meet(receiver[g as usize], step + 1);
        }
        for &d in &dependents[g as usize] {
            meet(d, step + 1);
        }
    }
    Steps { local, message }
}
