//! Deadlock freedom: a dataflow execution of all ranks where an instruction runs once its dependencies are done,
//! it is next on its connections, its message has arrived, and the receiver has room (at most
//! `Limits::channel_slots` messages in flight per connection). It carries symbolic values, so the postcondition
//! reads its final state. If it stops early, the wait-for cycle is reported.
//!
//! Every one of those conditions is "some other instruction has run", so the execution is a topological sort
//! (Kahn's algorithm) of one graph: the dependencies, plus per connection the edges send k -> send k+1,
//! recv k -> recv k+1, send k -> recv k (the message) and recv k -> send k+slots (the room it frees). Races are
//! ruled out before this runs, so any order the sort picks computes the same values.

use super::matching::{Connections, ConnectionsBuilder, RankConnections};
use super::value::{initial_values, Value};
use super::Context;
use crate::diag::Error;
use crate::sched::{BufId, Dependents, Operand, Placement, RankProgram, Schedule};

/// The final state of a completed execution. Out of place, `in` is never written (`bounds` checked it), so its
/// slots are not stored: a read of one makes the input's value on the spot (at p = 4096 they were half the state).
/// Nor are a buffer's that no instruction touches (in place, the one that does not hold the call's data).
pub(crate) struct Finished<V> {
    /// Per buffer, where its slots start in a rank's values; `UNSTORED` for `in` out of place.
    pub base: Vec<u32>,
    pub slots_per_rank: u32,
    pub values: Vec<V>,
}

const UNSTORED: u32 = u32::MAX;

/// Marks a node's operand as chunk `index` of the unstored `in` (the firing rank's): `VIRTUAL | index`.
const VIRTUAL: u32 = 1 << 31;

impl<V> Finished<V> {
    /// The value index of a stored slot.
    pub fn slot(&self, rank: u32, op: Operand) -> usize {
        (rank * self.slots_per_rank + self.base[op.buf.0 as usize] + op.index) as usize
    }

    /// A node's operand: the stored slot's index, or `VIRTUAL | index` in the unstored `in`.
    fn operand(&self, rank: u32, op: Operand) -> u32 {
        match self.base[op.buf.0 as usize] {
            UNSTORED => VIRTUAL | op.index,
            _ => self.slot(rank, op) as u32,
        }
    }
}

/// What reads of the unstored `in` make: rank r's input chunk c where r's input is significant, else undefined.
struct Inputs<'k, V: Value> {
    key: &'k V::Key,
    significant: Vec<bool>,
    chunks: u32,
}

impl<V: Value> Inputs<'_, V> {
    fn value(&self, rank: u32, index: u32) -> V {
        match self.significant[rank as usize] && index < self.chunks {
            true => V::input(self.key, rank, index),
            false => V::undefined(self.key),
        }
    }
}

const NONE: u32 = u32::MAX;
const FIRED: u32 = u32::MAX;

/// The graph the execution sorts, kept small: each instruction's unmet conditions, and the dependencies turned
/// around. The other edges follow from the connections: the k-th send or receive of a connection is the one that
/// runs k-th there, so counting as they run gives each one's position, and so its neighbours on the connection.
struct Graph {
    /// Conditions not yet met per instruction (global index, see `Connections::rank_start`); `FIRED` once it has
    /// run.
    unmet: Vec<u32>,
    /// The instructions (global indices) that depend on each instruction: for instruction i of a rank whose rows
    /// start at `rows = rank_rows[rank]`, `dependents[dependents_start[rows + i]..dependents_start[rows + i + 1]]`.
    /// A rank without dependencies has no rows (`NONE`): a fused ring has none, and rows for every instruction
    /// took 268 MB at p = 4096. One list for all ranks: per-rank lists cost a second cache miss as the simulation
    /// visits the ranks in turn.
    rank_rows: Vec<u32>,
    dependents_start: Vec<u32>,
    dependents: Vec<u32>,
    /// Per connection: where its ring of message places starts, how many places it has and how wide each is. A
    /// send waits for the receive `slots` places back to free its place, so `min(slots, messages)` places of the
    /// widest message are enough.
    rings: Vec<(u32, u32, u32)>,
    n_messages: u32,
    /// The buffers some instruction reads or writes (bit b of word b / 64).
    touched: [u64; 4],
}

impl Graph {
    fn place(&self, conn: u32, pos: u32) -> u32 {
        let (base, places, width) = self.rings[conn as usize];
        // `places` is a power of two: a mask, not a division, for every message.
        base + (pos & (places - 1)) * width
    }
}

pub(crate) fn simulate<V: Value>(
    ctx: &Context,
    key: &V::Key,
    conns: Connections,
    graph: GraphBuilder,
) -> Result<Finished<V>, Error> {
    let sched = ctx.sched;
    let slots = ctx.limits.channel_slots;
    let mut graph = graph.finish(&conns);
    let mut state = initial_state::<V>(ctx, key, &graph.touched)?;
    let inputs = Inputs::<V> {
        key,
        significant: (0..sched.n_ranks).map(|r| sched.collective.input_significant(r, sched.root)).collect(),
        chunks: sched.collective.buffer_chunks(sched.n_ranks, sched.chunks).0,
    };
    let rank_start = &conns.rank_start;
    let mut messages: Vec<V> = vec![V::undefined(key); graph.n_messages as usize];
    // How many sends and receives each connection has run: the position of the next one.
    let mut sent = vec![0u32; conns.list.len()];
    let mut received = vec![0u32; conns.list.len()];
    let mut ready: Vec<(u32, u32)> = Vec::new();
    for rank in (0..sched.n_ranks).rev() {
        let start = rank_start[rank as usize];
        let n = sched.ranks[rank as usize].len() as u32;
        ready.extend((0..n).rev().filter(|&i| graph.unmet[(start + i) as usize] == 0).map(|i| (rank, i)));
    }
    let mut results: Vec<V> = Vec::new();
    let mut completed = 0usize;
    while let Some((rank, i)) = ready.pop() {
        let first = rank_start[rank as usize];
        let g = first + i;
        graph.unmet[g as usize] = FIRED;
        completed += 1;
        let instr = &sched.ranks[rank as usize].instrs[i as usize];
        let (send, recv) = conns.rank(rank).of(instr);
        let send_pos = if send == NONE { NONE } else { post_increment(&mut sent[send as usize]) };
        let recv_pos = if recv == NONE { NONE } else { post_increment(&mut received[recv as usize]) };
        let slot = |op: Operand| op.get().map_or(NONE, |op| state.operand(rank, op));
        let node = Node {
            src: slot(instr.src),
            acc: slot(instr.acc),
            dst: slot(instr.dst),
            msg_in: if recv == NONE { NONE } else { graph.place(recv, recv_pos) },
            msg_out: if send == NONE { NONE } else { graph.place(send, send_pos) },
        };
        if instr.count == 1 {
            // One chunk needs no scratch list: nothing it writes can be read after.
            let value = fire_one(&inputs, rank, &node, &state.values, &messages);
            store(&node, 0, value, &mut state, &mut messages);
        } else {
            // Read everything before writing anything: operands of one instruction may overlap.
            results.clear();
            results.extend((0..instr.count).map(|k| fire_one(&inputs, rank, &node.at(k), &state.values, &messages)));
            for (k, value) in results.drain(..).enumerate() {
                store(&node, k as u32, value, &mut state, &mut messages);
            }
        }
        // What this makes ready: other ranks' first and this rank's last, so they come off the (LIFO) stack first
        // and one rank runs until it blocks, which keeps its data in cache.
        let mut meet = |rank: u32, i: u32| {
            let unmet = &mut graph.unmet[(rank_start[rank as usize] + i) as usize];
            *unmet -= 1;
            if *unmet == 0 {
                ready.push((rank, i));
            }
        };
        if send != NONE {
            let c = &conns.list[send as usize];
            if let Some(&r) = conns.recvs_of(c).get(send_pos as usize) {
                meet(c.to, r);
            }
        }
        if recv != NONE {
            let c = &conns.list[recv as usize];
            if let Some(&s) = conns.sends_of(c).get((recv_pos + slots) as usize) {
                meet(c.from, s);
            }
        }
        if send != NONE {
            if let Some(&s) = conns.sends_of(&conns.list[send as usize]).get(send_pos as usize + 1) {
                meet(rank, s);
            }
        }
        if recv != NONE {
            if let Some(&r) = conns.recvs_of(&conns.list[recv as usize]).get(recv_pos as usize + 1) {
                meet(rank, r);
            }
        }
        let rows = graph.rank_rows[rank as usize];
        let (from, to) = match rows {
            NONE => (0, 0),
            rows => (graph.dependents_start[(rows + i) as usize], graph.dependents_start[(rows + i) as usize + 1]),
        };
        for &dependent in &graph.dependents[from as usize..to as usize] {
            let unmet = &mut graph.unmet[dependent as usize];
            *unmet -= 1;
            if *unmet == 0 {
                ready.push((rank, dependent - first));
            }
        }
    }
    let total = graph.unmet.len();
    if completed < total {
        let done: Vec<bool> = graph.unmet.iter().map(|&u| u == FIRED).collect();
        return Err(Stuck::new(ctx, &conns, done).cycle_error());
    }
    Ok(state)
}

/// Where firing one instruction reads and writes: absolute value indices of its operands, and where its incoming
/// message is read and its outgoing one written (`NONE` for what it lacks).
#[derive(Clone, Copy)]
struct Node {
    src: u32,
    acc: u32,
    dst: u32,
    msg_in: u32,
    msg_out: u32,
}

/// The value one chunk of `node` on `rank` produces: its message or local source, reduced into its accumulator if
/// it has one.
fn fire_one<V: Value>(inputs: &Inputs<V>, rank: u32, node: &Node, values: &[V], messages: &[V]) -> V {
    let read = |at: u32| match at & VIRTUAL {
        0 => values[at as usize].clone(),
        _ => inputs.value(rank, at & !VIRTUAL),
    };
    let v = match node.msg_in {
        NONE => read(node.src),
        at => messages[at as usize].clone(),
    };
    match node.acc {
        NONE => v,
        acc => {
            let mut sum = read(acc);
            sum.reduce(inputs.key, &v);
            sum
        }
    }
}

/// Writes chunk `k` of what a node produced to its destination and into its outgoing message.
fn store<V: Value>(node: &Node, k: u32, value: V, state: &mut Finished<V>, messages: &mut [V]) {
    if node.dst != NONE {
        state.values[(node.dst + k) as usize] = value.clone();
    }
    if node.msg_out != NONE {
        messages[(node.msg_out + k) as usize] = value;
    }
}

impl Node {
    /// The one-chunk node for chunk `k` of this one.
    fn at(&self, k: u32) -> Node {
        let shift = |x: u32| if x == NONE { NONE } else { x + k };
        Node { src: shift(self.src), acc: shift(self.acc), msg_in: shift(self.msg_in), ..*self }
    }
}

/// The graph built rank by rank, in rank order, beside the connection table (`ConnectionsBuilder`): each
/// instruction's conditions are counted while its rank's instructions and connections are still in cache.
pub(crate) struct GraphBuilder {
    slots: u32,
    /// Per connection: how many sends and receives the ranks added so far have on it.
    seen: Vec<(u32, u32)>,
    /// Per connection: the widest message received on it.
    widest: Vec<u32>,
    unmet: Vec<u32>,
    rank_rows: Vec<u32>,
    dependents_start: Vec<u32>,
    dependents: Vec<u32>,
    rank_dependents: Dependents,
    touched: [u64; 4],
}

impl GraphBuilder {
    pub fn new(sched: &Schedule, slots: u32) -> Self {
        // Sized once: lists that grow by doubling are copied on each growth and, at p = 4096, take fresh memory
        // where the lowered program's freed pages could have served.
        let (mut rows, mut deps) = (0, 0);
        for program in sched.ranks.iter().filter(|program| !program.deps.is_empty()) {
            rows += program.len() + 1;
            deps += program.deps.len();
        }
        GraphBuilder {
            slots,
            seen: Vec::new(),
            widest: Vec::new(),
            unmet: Vec::with_capacity(sched.n_instrs()),
            rank_rows: Vec::with_capacity(sched.ranks.len()),
            dependents_start: Vec::with_capacity(rows),
            dependents: Vec::with_capacity(deps),
            rank_dependents: Dependents::default(),
            touched: [0; 4],
        }
    }

    /// Counts the conditions of each instruction of the next rank, whose connections are `conns`, and turns its
    /// dependencies around.
    pub fn add_rank(&mut self, program: &RankProgram, conns: RankConnections) {
        let has_dependents = !program.deps.is_empty();
        if has_dependents {
            program.dependents_into(&mut self.rank_dependents);
            self.rank_rows.push(self.dependents_start.len() as u32);
        } else {
            self.rank_rows.push(NONE);
        }
        let first = self.unmet.len() as u32;
        for (i, instr) in program.instrs.iter().enumerate() {
            for op in [instr.src, instr.acc, instr.dst].iter().filter_map(|op| op.get()) {
                self.touched[op.buf.0 as usize / 64] |= 1 << (op.buf.0 % 64);
            }
            let (send, recv) = conns.of(instr);
            let mut conditions = program.deps_of(i).len() as u32;
            if send != NONE {
                self.track(send);
                let send_pos = post_increment(&mut self.seen[send as usize].0);
                conditions += u32::from(send_pos > 0) + u32::from(send_pos >= self.slots);
            }
            if recv != NONE {
                self.track(recv);
                let recv_pos = post_increment(&mut self.seen[recv as usize].1);
                conditions += 1 + u32::from(recv_pos > 0);
                self.widest[recv as usize] = self.widest[recv as usize].max(instr.count);
            }
            self.unmet.push(conditions);
            if has_dependents {
                self.dependents_start.push(self.dependents.len() as u32);
                self.dependents.extend(self.rank_dependents.of(i).iter().map(|&d| first + d));
            }
        }
        if has_dependents {
            self.dependents_start.push(self.dependents.len() as u32);
        }
    }

    /// Makes room for connection `conn` (the table finds connections as ranks are added).
    fn track(&mut self, conn: u32) {
        if conn as usize >= self.seen.len() {
            self.seen.resize(conn as usize + 1, (0, 0));
            self.widest.resize(conn as usize + 1, 0);
        }
    }

    /// Sizes each connection's message ring.
    fn finish(self, conns: &Connections) -> Graph {
        let GraphBuilder { slots, mut widest, unmet, rank_rows, dependents_start, dependents, touched, .. } = self;
        widest.resize(conns.list.len(), 0);
        let mut rings = Vec::with_capacity(conns.list.len());
        let mut n_messages = 0u32;
        for (c, &width) in conns.list.iter().zip(&widest) {
            // Rounded up to a power of two: more places than needed are harmless, and `place` can mask.
            let places = slots.max(1).min(conns.recvs_of(c).len() as u32).next_power_of_two();
            rings.push((n_messages, places, width));
            n_messages += places * width;
        }
        Graph { unmet, rank_rows, dependents_start, dependents, rings, n_messages, touched }
    }
}

/// The connection table and the graph of a whole schedule, for a run outside the verifier's per-rank loop.
pub(crate) fn tables(sched: &Schedule, slots: u32) -> (Connections, GraphBuilder) {
    let mut connections = ConnectionsBuilder::new(sched);
    let mut graph = GraphBuilder::new(sched, slots);
    for (rank, program) in sched.ranks.iter().enumerate() {
        graph.add_rank(program, connections.add_rank(rank as u32, program));
    }
    (connections.finish(), graph)
}

fn post_increment(counter: &mut u32) -> u32 {
    *counter += 1;
    *counter - 1
}

/// A run that stopped early: which instructions ran, and how far each connection got.
struct Stuck<'a> {
    ctx: &'a Context<'a>,
    conns: &'a Connections,
    done: Vec<bool>,
    sent: Vec<u32>,
    received: Vec<u32>,
}

impl<'a> Stuck<'a> {
    fn new(ctx: &'a Context<'a>, conns: &'a Connections, done: Vec<bool>) -> Self {
        let rank_start = &conns.rank_start;
        // Sends and receives of a connection run in order, so each count is the length of a prefix.
        let prefix = |rank: u32, list: &[u32]| {
            list.iter().take_while(|&&i| done[(rank_start[rank as usize] + i) as usize]).count() as u32
        };
        let sent = conns.list.iter().map(|c| prefix(c.from, conns.sends_of(c))).collect();
        let received = conns.list.iter().map(|c| prefix(c.to, conns.recvs_of(c))).collect();
        Stuck { ctx, conns, done, sent, received }
    }

    fn is_done(&self, rank: u32, i: u32) -> bool {
        self.done[(self.conns.rank_start[rank as usize] + i) as usize]
    }

    /// What a stuck instruction waits for, and why.
    fn waits_for(&self, rank: u32, i: u32) -> ((u32, u32), &'static str) {
        let program = &self.ctx.sched.ranks[rank as usize];
        if let Some(&d) = program.deps_of(i as usize).iter().find(|&&d| !self.is_done(rank, d)) {
            return ((rank, d), "depends on");
        }
        let conns = self.conns;
        let (send, recv) = conns.rank(rank).of(&program.instrs[i as usize]);
        if recv != NONE {
            let c = &conns.list[recv as usize];
            let (sends, recvs) = (conns.sends_of(c), conns.recvs_of(c));
            let got = self.received[recv as usize];
            if recvs[got as usize] != i {
                return ((rank, recvs[got as usize]), "receives after");
            }
            if self.sent[recv as usize] <= got {
                return ((c.from, sends[self.sent[recv as usize] as usize]), "waits for the message of");
            }
        }
        let c = &conns.list[send as usize];
        let (sends, recvs) = (conns.sends_of(c), conns.recvs_of(c));
        let sent = self.sent[send as usize];
        if sends[sent as usize] != i {
            return ((rank, sends[sent as usize]), "sends after");
        }
        ((c.to, recvs[self.received[send as usize] as usize]), "waits for room freed by")
    }

    fn cycle_error(&self) -> Error {
        let stuck = self.done.iter().position(|&d| !d).expect("called only when something is stuck");
        let rank_start = &self.conns.rank_start;
        let rank = rank_start.partition_point(|&s| s as usize <= stuck) as u32 - 1;
        let mut node = (rank, stuck as u32 - rank_start[rank as usize]);
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
        let mut error = self.ctx.error(
            "collc::verify::deadlock",
            format!(
                "deadlock with {} message slot(s) per connection: {} waits in a cycle",
                self.ctx.limits.channel_slots,
                self.ctx.describe(r0, i0 as usize)
            ),
            "break the cycle: reorder the transfers so some rank sends before it waits, or split the step",
            (r0, i0 as usize),
            "waits in a cycle",
        );
        for ((r, i), _) in cycle.iter().skip(1) {
            let span = self.ctx.span((*r, *i as usize));
            if error.labels.len() < 4 && error.labels.iter().all(|(s, _)| *s != span) {
                error = error.at(span, format!("rank {r} #{i} is in the cycle too"));
            }
        }
        error.with_note(note)
    }
}

/// The values a run starts with, for the buffers it stores: those an instruction touches and the output's, but not
/// `in` out of place. (In place, the buffer that does not hold the call's data is declared and usually untouched.)
fn initial_state<V: Value>(ctx: &Context, key: &V::Key, touched: &[u64; 4]) -> Result<Finished<V>, Error> {
    let sched = ctx.sched;
    let (out_buf, _) = sched.output_window(0);
    let is_touched = |b: usize| touched[b / 64] & (1 << (b % 64)) != 0;
    let stored = |b: usize| match sched.placement {
        Placement::OutOfPlace => b != BufId::IN.0 as usize && (is_touched(b) || b == out_buf.0 as usize),
        Placement::InPlace => is_touched(b) || b == out_buf.0 as usize,
    };
    let (mut base, mut total) = (Vec::with_capacity(sched.buffers.len()), 0u64);
    for (b, decl) in sched.buffers.iter().enumerate() {
        // Below 2^31 once `n` is: `bounds` caps all slots of all ranks.
        base.push(if stored(b) { total as u32 } else { UNSTORED });
        total += if stored(b) { u64::from(decl.chunks) } else { 0 };
    }
    let n = sched.n_ranks as usize * total as usize;
    if n >= VIRTUAL as usize {
        return Err(Error::new(
            "collc::verify::too_large",
            format!("{n} chunk slots to simulate, more than the verifier's {}", VIRTUAL - 1),
            "verify fewer ranks or chunks",
        ));
    }
    let mut values = Vec::with_capacity(n);
    for rank in 0..sched.n_ranks {
        initial_values(sched, key, rank, stored, &mut values);
    }
    Ok(Finished { base, slots_per_rank: total as u32, values })
}
