//! What every rank's buffers hold after each column: a symbolic run of a verified schedule (each chunk slot a
//! multiset of (rank, input chunk) contributions, undefined data a term of its own), as the memory model says.

use super::layout::{reduces, At, Layout};
use collc_compiler::sched::{BufId, Instr, Op, Operand, Schedule};
use collc_compiler::VerifiedSchedule;
use std::collections::HashMap;

/// One contribution: input chunk `chunk` of rank `rank`, `times` times; `rank == UNDEFINED` stands for undefined data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Term {
    rank: u32,
    chunk: u32,
    times: u32,
}

const UNDEFINED: u32 = u32::MAX;

/// A slot's value: its terms sorted, one per contribution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value(Vec<Term>);

impl Value {
    fn undefined() -> Self {
        Value(vec![Term { rank: UNDEFINED, chunk: 0, times: 1 }])
    }

    fn input(rank: u32, chunk: u32) -> Self {
        Value(vec![Term { rank, chunk, times: 1 }])
    }

    /// `self ⊕ other`: the multisets' sum.
    fn reduced(&self, other: &Value) -> Value {
        let mut terms = self.0.clone();
        for term in &other.0 {
            match terms.iter_mut().find(|t| (t.rank, t.chunk) == (term.rank, term.chunk)) {
                Some(t) => t.times = t.times.saturating_add(term.times),
                None => terms.push(*term),
            }
        }
        terms.sort();
        Value(terms)
    }

    /// `r0.c1 + r2.c1`; `2·r0.c1` for a contribution counted twice; undefined data is `·`.
    pub fn text(&self) -> String {
        let term = |t: &Term| {
            let name = match t.rank {
                UNDEFINED => "·".to_string(),
                rank => format!("r{rank}.c{}", t.chunk),
            };
            match t.times {
                1 => name,
                n => format!("{n}·{name}"),
            }
        };
        self.0.iter().map(term).collect::<Vec<_>>().join(" + ")
    }
}

/// Every slot of every rank (rank by rank, buffer by buffer, chunk by chunk) before the first column and after each,
/// and the value each message carries.
pub struct Contents {
    /// Where each rank's, then each buffer's, slots start: `slot(rank, buf, chunk)`.
    rank_slots: u32,
    buf_start: Vec<u32>,
    /// `states[0]` holds the inputs; `states[k + 1]` the slots after column k.
    pub states: Vec<Vec<Value>>,
    /// Per arrow of the layout (same order), what its message carries, chunk by chunk.
    pub messages: Vec<Vec<Value>>,
}

impl Contents {
    /// A message's chunks, `|` between them.
    pub fn message_text(&self, arrow: usize) -> String {
        self.messages[arrow].iter().map(Value::text).collect::<Vec<_>>().join(" | ")
    }

    pub fn slot(&self, rank: u32, buf: BufId, chunk: u32) -> usize {
        (rank * self.rank_slots + self.buf_start[buf.0 as usize] + chunk) as usize
    }
}

/// Runs `verified` column by column as `layout` placed it. Within a column no two instructions of a rank touch one
/// slot with one of them writing (they would be ordered by a dependency, so in different columns), so each reads
/// the slots as the column found them and the writes land at the column's end. A message is sent in its column from
/// the slots as the column found them (or, forwarded, from a message of an earlier column); a receive that only
/// stores may take it in that same column, so the sending instructions of a column go first.
pub fn simulate(verified: &VerifiedSchedule, layout: &Layout) -> Contents {
    let sched = verified.schedule();
    let mut buf_start = Vec::with_capacity(sched.buffers.len());
    let mut rank_slots = 0;
    for decl in &sched.buffers {
        buf_start.push(rank_slots);
        rank_slots += decl.chunks;
    }
    let mut contents = Contents { rank_slots, buf_start, states: Vec::new(), messages: Vec::new() };
    let mut state = initial(sched, &contents);
    // Which arrow each sending instruction's message is; what each receiving instruction will get.
    let arrow_of: HashMap<At, usize> = layout.arrows.iter().enumerate().map(|(i, a)| (a.send, i)).collect();
    let inbox_of: HashMap<At, usize> = layout.arrows.iter().enumerate().map(|(i, a)| (a.recv, i)).collect();
    let mut messages: Vec<Option<Vec<Value>>> = vec![None; layout.arrows.len()];
    let mut by_column: Vec<Vec<At>> = vec![Vec::new(); layout.n_steps as usize];
    for (rank, steps) in (0u32..).zip(&layout.steps) {
        for (index, &step) in (0u32..).zip(steps) {
            by_column[step as usize].push((rank, index));
        }
    }
    for column in &mut by_column {
        column.sort_by_key(|&(rank, index)| !sched.ranks[rank as usize].instrs[index as usize].op.sends());
    }
    contents.states.push(state.clone());
    for column in &by_column {
        let mut writes = Vec::new();
        for &(rank, index) in column {
            let instr = &sched.ranks[rank as usize].instrs[index as usize];
            let received = inbox_of.get(&(rank, index)).and_then(|&m| messages[m].clone());
            let result = run(&contents, &state, rank, instr, received);
            if let Some(&m) = arrow_of.get(&(rank, index)) {
                messages[m] = Some(result.clone());
            }
            if let Some(dst) = instr.dst.get() {
                writes.push((contents.slot(rank, dst.buf, dst.index), result));
            }
        }
        for (first, values) in writes {
            state[first..first + values.len()].clone_from_slice(&values);
        }
        contents.states.push(state.clone());
    }
    contents.messages = messages.into_iter().map(Option::unwrap_or_default).collect();
    contents
}

/// The inputs: `x[r][c]` in each rank's input window where its input is significant, undefined elsewhere.
fn initial(sched: &Schedule, contents: &Contents) -> Vec<Value> {
    let mut state = vec![Value::undefined(); (sched.n_ranks * contents.rank_slots) as usize];
    let (in_chunks, _) = sched.collective.buffer_chunks(sched.n_ranks, sched.chunks);
    for rank in 0..sched.n_ranks {
        if !sched.collective.input_significant(rank, sched.root) {
            continue;
        }
        let (buf, offset) = sched.input_window(rank);
        for chunk in 0..in_chunks {
            state[contents.slot(rank, buf, offset + chunk)] = Value::input(rank, chunk);
        }
    }
    state
}

/// What one instruction stores, or sends when it stores nothing (`RecvReduceSend`, `Send`), chunk by chunk.
fn run(contents: &Contents, state: &[Value], rank: u32, instr: &Instr, received: Option<Vec<Value>>) -> Vec<Value> {
    let read = |operand: Operand| -> Vec<Value> {
        let first = contents.slot(rank, operand.buf, operand.index);
        state[first..first + instr.count as usize].to_vec()
    };
    let sum = |a: Vec<Value>, b: Vec<Value>| a.iter().zip(&b).map(|(x, y)| x.reduced(y)).collect::<Vec<_>>();
    let message = || received.clone().unwrap_or_else(|| vec![Value::undefined(); instr.count as usize]);
    match instr.op {
        Op::Send | Op::Copy => read(instr.src),
        Op::Reduce => sum(read(instr.acc), read(instr.src)),
        op if reduces(op) => sum(read(instr.acc), message()),
        _ => message(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::viz::layout::lay_out;
    use crate::viz::layout::tests::compiled_placed;
    use collc_compiler::Placement;

    fn every_rank(n_ranks: u32, chunk: u32) -> String {
        (0..n_ranks).map(|r| format!("r{r}.c{chunk}")).collect::<Vec<_>>().join(" + ")
    }

    #[test]
    fn ring_allreduce_ends_with_every_contribution_in_every_output_slot() {
        for n_ranks in [3, 4] {
            let verified = crate::viz::layout::tests::compiled("allreduce/ring", n_ranks);
            let layout = lay_out(&verified).expect("a layout");
            let contents = simulate(&verified, &layout);
            assert_eq!(contents.states.len(), layout.n_steps as usize + 1);
            let last = contents.states.last().expect("a final state");
            for rank in 0..n_ranks {
                for chunk in 0..n_ranks {
                    let value = &last[contents.slot(rank, BufId::OUT, chunk)];
                    assert_eq!(value.text(), every_rank(n_ranks, chunk), "rank {rank} out[{chunk}]");
                    let input = &last[contents.slot(rank, BufId::IN, chunk)];
                    assert_eq!(input.text(), format!("r{rank}.c{chunk}"), "in is never written");
                }
            }
            let first = &contents.states[0];
            assert_eq!(first[contents.slot(1, BufId::OUT, 0)].text(), "·", "out starts undefined");
        }
    }

    /// The simulation agrees with the verifier's postcondition on other shapes: trees, halving and doubling, and in
    /// place (where `in` and `out` are one buffer).
    #[test]
    fn every_allreduce_of_the_library_ends_with_the_sum_in_its_output_window() {
        let names = ["allreduce/tree", "allreduce/rabenseifner", "allreduce/recursive_doubling", "allreduce/two_shot"];
        for (name, placement) in names.iter().flat_map(|n| [(n, Placement::OutOfPlace), (n, Placement::InPlace)]) {
            let verified = compiled_placed(name, 4, placement);
            let layout = lay_out(&verified).expect("a layout");
            let contents = simulate(&verified, &layout);
            let last = contents.states.last().expect("a final state");
            for rank in 0..4 {
                let (buf, offset) = verified.output_window(rank);
                for chunk in 0..verified.chunks {
                    let value = &last[contents.slot(rank, buf, offset + chunk)];
                    assert_eq!(value.text(), every_rank(4, chunk), "{name} {placement:?}: rank {rank} chunk {chunk}");
                }
            }
        }
    }

    /// Every algorithm of the library, at a few rank counts and both placements, ends holding its collective's
    /// contract in every output chunk the contract names: the simulation agrees with the verifier's postcondition.
    #[test]
    fn every_library_schedule_ends_with_its_contract() {
        use collc_compiler::collective::Expected;
        let library = collc_compiler::library::Library::embedded();
        let mut checked = 0;
        for entry in library.entries() {
            for (n_ranks, placement) in [2, 3, 4, 5].into_iter().flat_map(|n| Placement::BOTH.map(|p| (n, p))) {
                let bindings = collc_compiler::Bindings { n_ranks, root: None, peer: None, params: Vec::new() };
                let options = collc_compiler::Options::placed(placement);
                let limits = collc_compiler::Limits::default();
                let Ok(verified) = collc_compiler::compile(&entry.source, &bindings, options, &limits) else {
                    continue; // a rank count the algorithm does not take
                };
                let layout = lay_out(&verified).expect("a layout");
                let contents = simulate(&verified, &layout);
                let last = contents.states.last().expect("a final state");
                let (_, out_chunks) = verified.collective.buffer_chunks(n_ranks, verified.chunks);
                for rank in 0..n_ranks {
                    let (buf, offset) = verified.output_window(rank);
                    for c in 0..out_chunks {
                        let want = match verified.collective.expected(
                            rank,
                            c,
                            verified.chunks,
                            verified.root,
                            verified.peer,
                        ) {
                            Expected::Unchecked => continue,
                            Expected::One { rank, chunk } => format!("r{rank}.c{chunk}"),
                            Expected::SumOverRanks { chunk } => every_rank(n_ranks, chunk),
                        };
                        let got = last[contents.slot(rank, buf, offset + c)].text();
                        assert_eq!(got, want, "{} p={n_ranks} {placement:?}: rank {rank} out[{c}]", entry.name);
                    }
                }
                checked += 1;
            }
        }
        assert!(checked > 100, "only {checked} schedules checked");
    }

    #[test]
    fn ring_messages_carry_growing_partial_sums() {
        let verified = crate::viz::layout::tests::compiled("allreduce/ring", 4);
        let layout = lay_out(&verified).expect("a layout");
        let contents = simulate(&verified, &layout);
        let of_rank0: Vec<String> = (0..layout.arrows.len())
            .filter(|&i| layout.arrows[i].from == 0)
            .map(|i| contents.message_text(i))
            .collect();
        assert_eq!(of_rank0[0], "r0.c0");
        assert_eq!(of_rank0[1], "r0.c3 + r3.c3");
        assert_eq!(of_rank0[2], "r0.c2 + r2.c2 + r3.c2");
        assert_eq!(of_rank0[3], every_rank(4, 1), "the first of the all-gather half carries a whole sum");
    }

    #[test]
    fn counted_and_undefined_terms_are_written_apart() {
        let twice = Value::input(0, 1).reduced(&Value::input(0, 1)).reduced(&Value::input(2, 1));
        assert_eq!(twice.text(), "2·r0.c1 + r2.c1");
        assert_eq!(Value::input(3, 0).reduced(&Value::undefined()).text(), "r3.c0 + ·");
    }
}
