//! Deadlock freedom: a dataflow execution of all ranks where an instruction runs once its dependencies are done,
//! it is next on its connections, its message has arrived, and the receiver has room (at most
//! `Limits::channel_slots` messages in flight per connection). It carries symbolic values, so the postcondition
//! reads its final state. If it stops early, the wait-for cycle is reported.

use super::matching::Connections;
use super::postcondition::initial_value;
use super::value::Value;
use super::Context;
use crate::diag::Error;
use crate::sched::{Op, Operand};
use std::collections::VecDeque;

/// The final state of a completed execution.
pub(crate) struct Finished<V> {
    pub base: Vec<u32>,
    pub slots_per_rank: u32,
    pub values: Vec<V>,
    /// The instruction (rank-local index) that last wrote each slot, `u32::MAX` if none.
    pub last_writer: Vec<u32>,
}

impl<V> Finished<V> {
    pub fn slot(&self, rank: u32, op: Operand) -> usize {
        (rank * self.slots_per_rank + self.base[op.buf.0 as usize] + op.index) as usize
    }
}

/// What the simulation needs of one instruction, in one place (the run is bound by cache misses): absolute value
/// indices of its operands, its connections and its position on each, its unmet dependency count.
#[derive(Clone, Copy)]
struct Node {
    op: Op,
    done: bool,
    count: u32,
    src: u32,
    acc: u32,
    dst: u32,
    send: u32,
    recv: u32,
    send_pos: u32,
    recv_pos: u32,
    unmet: u32,
}

const NONE: u32 = u32::MAX;

struct Sim<'a, V> {
    ctx: &'a Context<'a>,
    conns: Connections,
    rank_start: Vec<u32>,
    nodes: Vec<Node>,
    dependents_start: Vec<u32>,
    dependents: Vec<u32>,
    sent: Vec<u32>,
    received: Vec<u32>,
    queues: Vec<VecDeque<V>>,
    state: Finished<V>,
    scratch: Vec<V>,
}

/// Ranks with instructions to look at, each with its own stack, so one rank's instructions are handled together
/// (they share cache lines) instead of hopping between ranks on every message.
struct Work {
    stacks: Vec<Vec<u32>>,
    active: VecDeque<u32>,
    queued: Vec<bool>,
}

impl Work {
    fn push(&mut self, rank: u32, i: u32) {
        self.stacks[rank as usize].push(i);
        if !self.queued[rank as usize] {
            self.queued[rank as usize] = true;
            self.active.push_back(rank);
        }
    }
}

pub(crate) fn simulate<V: Value>(ctx: &Context, conns: Connections) -> Result<Finished<V>, Error> {
    let mut sim = Sim::new(ctx, conns);
    let p = ctx.sched.ranks.len();
    let mut work = Work { stacks: vec![Vec::new(); p], active: VecDeque::with_capacity(p), queued: vec![false; p] };
    // Seed only what can run at once: no dependencies, no message to wait for, first on its send connection.
    // Everything else is pushed by the event that clears its last condition (a dependency finishing, the previous
    // instruction on a connection firing, a message arriving, room freeing up), so nothing is looked at in vain.
    for (rank, program) in ctx.sched.ranks.iter().enumerate() {
        let start = sim.rank_start[rank] as usize;
        for i in (0..program.len()).rev() {
            let node = &sim.nodes[start + i];
            if node.unmet == 0 && node.recv == NONE && (node.send == NONE || node.send_pos == 0) {
                work.push(rank as u32, i as u32);
            }
        }
    }
    let total = *sim.rank_start.last().expect("rank_start has p + 1 entries") as usize;
    let mut completed = 0usize;
    while let Some(rank) = work.active.pop_front() {
        work.queued[rank as usize] = false;
        let mut stack = std::mem::take(&mut work.stacks[rank as usize]);
        while let Some(i) = stack.pop() {
            if !sim.ready(rank, i) {
                continue;
            }
            sim.fire(rank, i, &mut work, &mut stack);
            completed += 1;
        }
        let pushed_meanwhile = std::mem::replace(&mut work.stacks[rank as usize], stack);
        work.stacks[rank as usize].extend(pushed_meanwhile);
    }
    if completed < total {
        return Err(sim.cycle_error());
    }
    Ok(sim.state)
}

impl<'a, V: Value> Sim<'a, V> {
    fn new(ctx: &'a Context<'a>, conns: Connections) -> Self {
        let sched = ctx.sched;
        let mut rank_start = vec![0u32];
        for program in &sched.ranks {
            rank_start.push(rank_start.last().copied().unwrap_or(0) + program.len() as u32);
        }
        let total = *rank_start.last().expect("non-empty") as usize;
        let state = initial_state(ctx);
        let nodes = build_nodes(ctx, &conns, &state);
        let mut counts = vec![0u32; total + 1];
        for (rank, program) in sched.ranks.iter().enumerate() {
            for i in 0..program.len() {
                for &d in program.deps_of(i) {
                    counts[rank_start[rank] as usize + d as usize + 1] += 1;
                }
            }
        }
        for k in 1..counts.len() {
            counts[k] += counts[k - 1];
        }
        let mut fill = counts.clone();
        let mut dependents = vec![0u32; counts[total] as usize];
        for (rank, program) in sched.ranks.iter().enumerate() {
            for i in 0..program.len() {
                for &d in program.deps_of(i) {
                    let at = &mut fill[rank_start[rank] as usize + d as usize];
                    dependents[*at as usize] = i as u32;
                    *at += 1;
                }
            }
        }
        let n_conns = conns.list.len();
        Sim {
            ctx,
            conns,
            rank_start,
            nodes,
            dependents_start: counts,
            dependents,
            sent: vec![0; n_conns],
            received: vec![0; n_conns],
            queues: (0..n_conns).map(|_| VecDeque::new()).collect(),
            state,
            scratch: Vec::new(),
        }
    }

    fn ready(&self, rank: u32, i: u32) -> bool {
        let node = &self.nodes[(self.rank_start[rank as usize] + i) as usize];
        if node.unmet != 0 || node.done {
            return false;
        }
        if node.send != NONE {
            let c = node.send as usize;
            let sent = self.sent[c];
            if sent != node.send_pos || sent - self.received[c] >= self.ctx.limits.channel_slots {
                return false;
            }
        }
        if node.recv != NONE {
            let c = node.recv as usize;
            if self.received[c] != node.recv_pos || self.sent[c] <= node.recv_pos {
                return false;
            }
        }
        true
    }

    /// Runs instruction `i` of `rank`; what it may have made ready goes on `own` (this rank) or `work` (others).
    fn fire(&mut self, rank: u32, i: u32, work: &mut Work, own: &mut Vec<u32>) {
        let g = (self.rank_start[rank as usize] + i) as usize;
        let node = self.nodes[g];
        let mut results = std::mem::take(&mut self.scratch);
        results.clear();
        for k in 0..node.count {
            let mut v = match node.op {
                Op::Send | Op::Copy | Op::Reduce => self.state.values[(node.src + k) as usize].clone(),
                _ => self.queues[node.recv as usize].pop_front().expect("ready() checked that the message arrived"),
            };
            if node.acc != NONE {
                let mut sum = self.state.values[(node.acc + k) as usize].clone();
                sum.reduce(&v);
                v = sum;
            }
            results.push(v);
        }
        if node.dst != NONE {
            let at = node.dst as usize;
            for (k, v) in results.iter().enumerate() {
                self.state.values[at + k] = v.clone();
                self.state.last_writer[at + k] = i;
            }
        }
        if node.send != NONE {
            let c = node.send as usize;
            self.queues[c].extend(results.drain(..));
            self.sent[c] += 1;
            let conn = &self.conns.list[c];
            if let Some(&next) = conn.sends.get(self.sent[c] as usize) {
                own.push(next);
            }
            if let Some(&head) = conn.recvs.get(self.received[c] as usize) {
                work.push(conn.to, head);
            }
        }
        if node.recv != NONE {
            let c = node.recv as usize;
            self.received[c] += 1;
            let conn = &self.conns.list[c];
            if let Some(&next) = conn.recvs.get(self.received[c] as usize) {
                own.push(next);
            }
            if let Some(&blocked) = conn.sends.get(self.sent[c] as usize) {
                work.push(conn.from, blocked);
            }
        }
        self.scratch = results;
        self.nodes[g].done = true;
        let start = self.rank_start[rank as usize] as usize;
        for d in self.dependents_start[g]..self.dependents_start[g + 1] {
            let dependent = self.dependents[d as usize];
            let node = &mut self.nodes[start + dependent as usize];
            node.unmet -= 1;
            if node.unmet == 0 {
                own.push(dependent);
            }
        }
    }

    /// What a stuck instruction waits for, and why.
    fn waits_for(&self, rank: u32, i: u32) -> ((u32, u32), &'static str) {
        let program = &self.ctx.sched.ranks[rank as usize];
        let start = self.rank_start[rank as usize] as usize;
        if let Some(&d) = program.deps_of(i as usize).iter().find(|&&d| !self.nodes[start + d as usize].done) {
            return ((rank, d), "depends on");
        }
        let (send, recv) = self.conns.of_instr[rank as usize][i as usize];
        if recv != u32::MAX {
            let c = &self.conns.list[recv as usize];
            let got = self.received[recv as usize];
            if c.recvs[got as usize] != i {
                return ((rank, c.recvs[got as usize]), "receives after");
            }
            if self.sent[recv as usize] <= got {
                return ((c.from, c.sends[self.sent[recv as usize] as usize]), "waits for the message of");
            }
        }
        let c = &self.conns.list[send as usize];
        let sent = self.sent[send as usize];
        if c.sends[sent as usize] != i {
            return ((rank, c.sends[sent as usize]), "sends after");
        }
        ((c.to, c.recvs[self.received[send as usize] as usize]), "waits for room freed by")
    }

    fn cycle_error(&self) -> Error {
        let stuck = self.nodes.iter().position(|n| !n.done).expect("called only when something is stuck");
        let rank = self.rank_start.partition_point(|&s| s as usize <= stuck) as u32 - 1;
        let mut node = (rank, stuck as u32 - self.rank_start[rank as usize]);
        let mut path: Vec<((u32, u32), &'static str)> = Vec::new();
        while !path.iter().any(|(n, _)| *n == node) {
            let (next, why) = self.waits_for(node.0, node.1);
            path.push((node, why));
            node = next;
        }
        let cycle_start = path.iter().position(|(n, _)| *n == node).expect("loop exits on a repeat");
        let cycle = &path[cycle_start..];
        let lines: Vec<String> =
            cycle.iter().map(|((r, i), why)| format!("  {} {why}", self.ctx.describe(*r, *i as usize))).collect();
        let note =
            format!("wait-for cycle ({} instructions, then back to the first):\n{}", cycle.len(), lines.join("\n"));
        let ((r0, i0), _) = cycle[0];
        let first = &self.ctx.sched.ranks[r0 as usize].instrs[i0 as usize];
        let mut error = self.ctx.error(
            "collc::verify::deadlock",
            format!(
                "deadlock with {} message slot(s) per connection: {} waits in a cycle",
                self.ctx.limits.channel_slots,
                self.ctx.describe(r0, i0 as usize)
            ),
            "break the cycle: reorder the transfers so some rank sends before it waits, or split the step",
            first,
            "waits in a cycle",
        );
        for ((r, i), _) in cycle.iter().skip(1) {
            let span = self.ctx.span(&self.ctx.sched.ranks[*r as usize].instrs[*i as usize]);
            if error.labels.len() < 4 && error.labels.iter().all(|(s, _)| *s != span) {
                error = error.at(span, format!("rank {r} #{i} is in the cycle too"));
            }
        }
        error.with_note(note)
    }
}

fn build_nodes<V>(ctx: &Context, conns: &Connections, state: &Finished<V>) -> Vec<Node> {
    let mut sends_seen = vec![0u32; conns.list.len()];
    let mut recvs_seen = vec![0u32; conns.list.len()];
    let mut nodes = Vec::with_capacity(ctx.sched.n_instrs());
    for (rank, program) in ctx.sched.ranks.iter().enumerate() {
        let slot = |op: Operand| op.get().map_or(NONE, |op| state.slot(rank as u32, op) as u32);
        for (i, instr) in program.instrs.iter().enumerate() {
            let (send, recv) = conns.of_instr[rank][i];
            let position = |seen: &mut Vec<u32>, c: u32| {
                if c == NONE {
                    return NONE;
                }
                seen[c as usize] += 1;
                seen[c as usize] - 1
            };
            nodes.push(Node {
                op: instr.op,
                done: false,
                count: instr.count,
                src: slot(instr.src),
                acc: slot(instr.acc),
                dst: slot(instr.dst),
                send,
                recv,
                send_pos: position(&mut sends_seen, send),
                recv_pos: position(&mut recvs_seen, recv),
                unmet: program.deps_of(i).len() as u32,
            });
        }
    }
    nodes
}

fn initial_state<V: Value>(ctx: &Context) -> Finished<V> {
    let (base, total) = crate::sched::slot_bases(&ctx.sched.buffers);
    let n = ctx.sched.n_ranks as usize * total as usize;
    let mut values = Vec::with_capacity(n);
    for rank in 0..ctx.sched.n_ranks {
        for (b, decl) in ctx.sched.buffers.iter().enumerate() {
            for index in 0..decl.chunks {
                values.push(initial_value::<V>(ctx.sched, rank, crate::sched::BufId(b as u16), index));
            }
        }
    }
    Finished { base, slots_per_rank: total, values, last_writer: vec![u32::MAX; n] }
}
