//! A verified schedule laid out for drawing: ranks as lanes, the rounds its dataflow allows as columns (the idea of
//! `collc_compiler::cost`'s `rounds.rs`), an arrow per message and a mark per local copy or reduction.

use collc_compiler::sched::{Instr, Op, Operand, Schedule};
use collc_compiler::VerifiedSchedule;
use std::collections::BTreeMap;

/// An instruction: its rank and its index in the rank's list.
pub type At = (u32, u32);

/// A message: its sending and its receiving instruction.
type Message = (At, At);

/// One message: the sending instruction's lane and column to the receiver's lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arrow {
    pub from: u32,
    pub to: u32,
    /// The column of the send (the message goes in its sender's round; the receive runs in a later one).
    pub step: u32,
    /// The position in its block (index modulo C) of the first chunk carried: the arrow's colour.
    pub position: u32,
    pub count: u32,
    /// The receiver reduces the message into what it holds (`RecvReduce*`).
    pub reduce: bool,
    pub channel: u8,
    /// The sending and the receiving instruction.
    pub send: At,
    pub recv: At,
}

/// A `Copy` or `Reduce` inside one rank's lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Local {
    pub rank: u32,
    pub index: u32,
    pub step: u32,
    pub position: u32,
    pub count: u32,
    pub reduce: bool,
}

/// What both pictures draw, and the column every instruction runs in (which the buffer simulation replays).
#[derive(Clone, Debug)]
pub struct Layout {
    pub n_ranks: u32,
    pub chunks: u32,
    pub n_steps: u32,
    pub arrows: Vec<Arrow>,
    pub locals: Vec<Local>,
    /// Per rank, per instruction: its column.
    pub steps: Vec<Vec<u32>>,
}

/// Lays `sched` out. Every verified schedule has a dataflow order (its deadlock freedom was proved with bounded
/// channels, and columns impose fewer conditions), so this fails only on a schedule that never verified.
pub fn lay_out(sched: &VerifiedSchedule) -> Result<Layout, String> {
    let sched = sched.schedule();
    let (first, total) = numbering(sched);
    let pairs = messages(sched);
    let steps = columns(sched, &first, total, &pairs)?;
    let step_of = |(rank, index): At| steps[(first[rank as usize] + index) as usize];
    let chunks = sched.chunks.max(1);
    let position = |rank: u32, index: u32| {
        let instr = &sched.ranks[rank as usize].instrs[index as usize];
        instr.position(chunks).unwrap_or(0)
    };
    let mut arrows: Vec<Arrow> = pairs
        .iter()
        .map(|&(send, recv)| {
            let receiver = &sched.ranks[recv.0 as usize].instrs[recv.1 as usize];
            Arrow {
                from: send.0,
                to: recv.0,
                step: step_of(send),
                position: position(send.0, send.1),
                count: receiver.count,
                reduce: reduces(receiver.op),
                channel: receiver.channel,
                send,
                recv,
            }
        })
        .collect();
    arrows.sort_by_key(|a| (a.step, a.from, a.send.1));
    let mut locals = Vec::new();
    for (rank, program) in (0u32..).zip(&sched.ranks) {
        for (index, instr) in (0u32..).zip(&program.instrs) {
            if matches!(instr.op, Op::Copy | Op::Reduce) {
                let (step, position) = (step_of((rank, index)), position(rank, index));
                let reduce = instr.op == Op::Reduce;
                locals.push(Local { rank, index, step, position, count: instr.count, reduce });
            }
        }
    }
    let n_steps = steps.iter().map(|&s| s + 1).max().unwrap_or(0);
    let per_rank = sched.ranks.iter().enumerate().map(|(r, p)| {
        let start = first[r] as usize;
        steps[start..start + p.len()].to_vec()
    });
    let steps = per_rank.collect();
    Ok(Layout { n_ranks: sched.n_ranks, chunks: sched.chunks, n_steps, arrows, locals, steps })
}

/// Whether a receive adds the message to what the receiver holds.
pub fn reduces(op: Op) -> bool {
    matches!(op, Op::RecvReduceCopy | Op::RecvReduceSend | Op::RecvReduceCopySend)
}

/// Where each rank's instructions start in one numbering of them all, and the total.
fn numbering(sched: &Schedule) -> (Vec<u32>, u32) {
    let mut first = Vec::with_capacity(sched.ranks.len());
    let mut total = 0u32;
    for program in &sched.ranks {
        first.push(total);
        total += program.len() as u32;
    }
    (first, total)
}

/// Every message as (sending, receiving) instruction: on each connection (sender, receiver, channel) the k-th send
/// pairs with the k-th receive (the memory model's rule 5). Ordered by connection, then by k.
fn messages(sched: &Schedule) -> Vec<Message> {
    type Ends = (Vec<u32>, Vec<u32>);
    let mut connections: BTreeMap<(u32, u32, u8), Ends> = BTreeMap::new();
    for (rank, program) in (0u32..).zip(&sched.ranks) {
        for (index, instr) in (0u32..).zip(&program.instrs) {
            if let Some(peer) = instr.send_peer().filter(|_| instr.op.sends()) {
                connections.entry((rank, peer, instr.channel)).or_default().0.push(index);
            }
            if let Some(peer) = instr.recv_peer().filter(|_| instr.op.receives()) {
                connections.entry((peer, rank, instr.channel)).or_default().1.push(index);
            }
        }
    }
    let mut pairs = Vec::new();
    for ((from, to, _), (sends, recvs)) in &connections {
        pairs.extend(sends.iter().zip(recvs).map(|(&s, &r)| ((*from, s), (*to, r))));
    }
    pairs
}

/// The column of every instruction (numbered by `numbering`), as `rounds.rs` places them, but for a receive that
/// sends nothing on: the column after its dependencies' and, if it sends, after the one its message went in; a send
/// in the column after the previous send on its connection (one message per connection per column, as a program's
/// steps send them). A receive that only stores (`Recv`, `RecvReduceCopy`) completes in its message's column, at
/// its end, as the tutorials draw a step: rank r sends, rank r + 1 adds.
fn columns(sched: &Schedule, first: &[u32], total: u32, pairs: &[Message]) -> Result<Vec<u32>, String> {
    let global = |(rank, index): At| first[rank as usize] + index;
    let instr = |(rank, index): At| &sched.ranks[rank as usize].instrs[index as usize];
    // (the later instruction, how many columns after this one at least)
    let mut after: Vec<Vec<(u32, u32)>> = vec![Vec::new(); total as usize];
    let mut unmet = vec![0u32; total as usize];
    let mut edge = |from: u32, to: u32, gap: u32| {
        after[from as usize].push((to, gap));
        unmet[to as usize] += 1;
    };
    for (i, &(send, recv)) in pairs.iter().enumerate() {
        edge(global(send), global(recv), instr(recv).op.sends() as u32);
        // `messages` lists a connection's messages in order, side by side.
        if let Some(&(next, _)) = pairs.get(i + 1).filter(|(next, _)| same_connection(sched, send, *next)) {
            edge(global(send), global(next), 1);
        }
    }
    for (rank, program) in (0u32..).zip(&sched.ranks) {
        for i in 0..program.len() {
            for &d in program.deps_of(i) {
                edge(global((rank, d)), global((rank, i as u32)), 1);
            }
        }
    }
    let mut step = vec![0u32; total as usize];
    let mut ready: Vec<u32> = (0..total).filter(|&g| unmet[g as usize] == 0).collect();
    let mut placed = 0;
    while let Some(g) = ready.pop() {
        placed += 1;
        for &(next, gap) in &after[g as usize] {
            step[next as usize] = step[next as usize].max(step[g as usize] + gap);
            unmet[next as usize] -= 1;
            if unmet[next as usize] == 0 {
                ready.push(next);
            }
        }
    }
    match placed == total {
        true => Ok(step),
        false => Err(format!("{} of {total} instructions wait on each other: no order to draw", total - placed)),
    }
}

/// Whether two sends go out on one connection (same sender, receiver and channel).
fn same_connection(sched: &Schedule, a: At, b: At) -> bool {
    let instr = |(rank, index): At| &sched.ranks[rank as usize].instrs[index as usize];
    let (x, y) = (instr(a), instr(b));
    a.0 == b.0 && x.send_peer == y.send_peer && x.channel == y.channel
}

/// `in[3]`, `out[0..2]` (a range of `count` chunks): an operand as the `.sched` text names its buffer.
pub fn operand_name(sched: &Schedule, operand: Operand, count: u32) -> String {
    let name = &sched.buffer(operand.buf).name;
    let index = operand.index;
    match count {
        1 => format!("{name}[{index}]"),
        _ => format!("{name}[{index}..{}]", index + count),
    }
}

/// An instruction in words, for a tooltip: `RecvReduceSend acc=in[3]`.
pub fn describe(sched: &Schedule, instr: &Instr) -> String {
    let mut text = instr.op.name().to_string();
    for (key, operand) in [("src", instr.src), ("acc", instr.acc), ("dst", instr.dst)] {
        if let Some(operand) = operand.get() {
            text += &format!(" {key}={}", operand_name(sched, operand, instr.count));
        }
    }
    text
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn compiled(name: &str, n_ranks: u32) -> VerifiedSchedule {
        compiled_placed(name, n_ranks, collc_compiler::Placement::OutOfPlace)
    }

    pub(crate) fn compiled_placed(name: &str, n_ranks: u32, placement: collc_compiler::Placement) -> VerifiedSchedule {
        let entry = collc_compiler::library::Library::embedded().get(name).expect("a library algorithm");
        let bindings = collc_compiler::Bindings { n_ranks, root: None, peer: None, params: Vec::new() };
        let options = collc_compiler::Options::placed(placement);
        collc_compiler::compile(&entry.source, &bindings, options, &collc_compiler::Limits::default())
            .expect("the library compiles")
    }

    #[test]
    fn ring_allreduce_takes_2p_minus_2_columns_of_one_message_per_rank() {
        let layout = lay_out(&compiled("allreduce/ring", 4)).expect("a layout");
        assert_eq!(layout.n_steps, 6, "2(p-1) columns");
        assert_eq!(layout.arrows.len(), 6 * 4, "one message per rank per column");
        for step in 0..6 {
            let mut senders: Vec<u32> = layout.arrows.iter().filter(|a| a.step == step).map(|a| a.from).collect();
            senders.sort();
            assert_eq!(senders, [0, 1, 2, 3], "every rank sends once in column {step}");
        }
        assert!(layout.arrows.iter().all(|a| a.to == (a.from + 1) % 4), "around the ring");
        let reducing = layout.arrows.iter().filter(|a| a.reduce).count();
        assert_eq!(reducing, 3 * 4, "the reduce-scatter half reduces, the all-gather half copies");
        assert!(layout.arrows.iter().filter(|a| a.reduce).all(|a| a.step < 3));
        // Rank 0 sends chunk 0 first, then what it got from rank 3: chunk 3, then 2.
        let rank0: Vec<u32> = layout.arrows.iter().filter(|a| a.from == 0).map(|a| a.position).collect();
        assert_eq!(&rank0[..3], [0, 3, 2]);
        assert!(layout.locals.is_empty());
    }

    #[test]
    fn a_receive_completes_in_its_message_column_and_forwards_in_a_later_one() {
        let verified = compiled("allreduce/tree", 4);
        let sched = verified.schedule();
        let layout = lay_out(&verified).expect("a layout");
        let mut stored_in_place = 0;
        for arrow in &layout.arrows {
            let received = layout.steps[arrow.recv.0 as usize][arrow.recv.1 as usize];
            match sched.ranks[arrow.recv.0 as usize].instrs[arrow.recv.1 as usize].op.sends() {
                true => assert!(received > arrow.step, "{arrow:?} forwarded in column {received}"),
                false => {
                    assert!(received >= arrow.step, "{arrow:?} stored in column {received}");
                    stored_in_place += (received == arrow.step) as usize;
                }
            }
        }
        assert!(stored_in_place > 0, "a receive that only stores completes in its message's column");
        let busy: std::collections::BTreeSet<u32> = layout.arrows.iter().map(|a| a.step).collect();
        assert_eq!(busy.len() as u32, layout.n_steps, "no column without a message");
        let sends: usize = verified.schedule().ranks.iter().flat_map(|p| &p.instrs).filter(|i| i.op.sends()).count();
        assert_eq!(layout.arrows.len(), sends, "an arrow per message");
    }

    #[test]
    fn operands_are_named_as_the_sched_text_names_them() {
        let verified = compiled("allreduce/ring", 3);
        let sched = verified.schedule();
        let instr = &sched.ranks[0].instrs[1];
        assert_eq!(describe(sched, instr), "RecvReduceSend acc=in[2]");
        assert_eq!(operand_name(sched, Operand::new(collc_compiler::sched::BufId::OUT, 1), 2), "out[1..3]");
    }
}
