//! The latency of a call when ranks share cores: the verified schedule run on the cores with messages of no bytes.
//!
//! Where each rank has its own core, the step model's alpha per step describes small calls. Where a node has more
//! ranks than cores, a rank waiting for a message gives its core to another rank, and what a call costs is how
//! often the cores change hands on its critical path, which steps do not count: a rank of a pipelined tree runs
//! several steps before it waits, while in a step where every rank receives from a rank of its own core, each core
//! changes hands twice (there and back). So the call is played out, as the runtime's executor runs it:
//! - each rank fires, in dataflow order, every instruction whose dependencies are done, whose message has arrived
//!   and whose connection has room (the verifier's conditions, with `Limits::channel_slots` messages per
//!   connection);
//! - a message, and the room its receive frees, reach the other side one link alpha after the instruction fires;
//! - a core runs one of its ranks at a time; a rank with nothing it can fire yields at once (the runtime does not
//!   spin when ranks outnumber cores), so the core passes from rank to rank in turn, each pass costing
//!   `shared_core_alpha_us`, and a rank fires at its first turn after it can.
//!
//! Ranks are dealt to cores as `collc run` places them: local rank l on core l mod cores. When a message from another
//! core reaches its receiver depends on how the cores' turns line up, which nothing fixes: in step, every message
//! lands just after its receiver has yielded and waits the longest; evenly out of step (core c starting c / cores of
//! a hand-over late), it waits about half as long. The latency is the mean of the two, for phases at random.
//! Calls run back to back, as nccl-tests and `collc run`
//! time them (a rank starts the next call once it has finished its part of this one), and the latency is the time
//! between the ends of the second and third calls: on shared cores, one call's last turns overlap the next call's
//! first, so an isolated call would overstate what each costs.

use super::topology::Topology;
use crate::fxhash::FxBuildHasher;
use crate::sched::Schedule;
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};

/// Seconds, ordered for the heaps (times are finite and non-negative).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Time(f64);

impl Eq for Time {}

impl PartialOrd for Time {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Time {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

const NONE: u32 = u32::MAX;

/// One directed connection: the global indices of its sends and receives, in order, and its link's alpha.
struct Connection {
    sends: Vec<u32>,
    recvs: Vec<u32>,
    alpha: f64,
}

/// One call as a graph over global instruction indices (rank by rank), as the verifier's deadlock check builds it.
struct Graph {
    rank_of: Vec<u32>,
    /// Per instruction: (send connection, receive connection), `NONE` when it has none.
    conns_of: Vec<(u32, u32)>,
    /// Per instruction: its place among its connections' sends and receives, `NONE` when it has none.
    positions: Vec<(u32, u32)>,
    conns: Vec<Connection>,
    dependents_start: Vec<u32>,
    dependents: Vec<u32>,
    deps: Vec<u32>,
    /// Per rank, its instructions that depend on nothing: where its next call starts.
    roots: Vec<Vec<u32>>,
    /// Per rank, how many instructions it has.
    lengths: Vec<u32>,
}

/// The connections met so far, numbered in order, by (sender, receiver, channel).
#[derive(Default)]
struct Connections {
    index: HashMap<(u32, u32, u8), u32, FxBuildHasher>,
    list: Vec<Connection>,
}

impl Connections {
    fn id(&mut self, topo: &Topology, from: u32, to: u32, channel: u8) -> u32 {
        let list = &mut self.list;
        *self.index.entry((from, to, channel)).or_insert_with(|| {
            let alpha = topo.link(topo.class(from, to)).alpha();
            list.push(Connection { sends: Vec::new(), recvs: Vec::new(), alpha });
            (list.len() - 1) as u32
        })
    }
}

fn build(sched: &Schedule, topo: &Topology) -> Graph {
    let total = sched.n_instrs();
    let mut conns = Connections::default();
    let (mut rank_of, mut conns_of, mut positions, mut deps) =
        (Vec::with_capacity(total), Vec::with_capacity(total), Vec::with_capacity(total), Vec::with_capacity(total));
    let (mut dependents_start, mut dependents) = (Vec::with_capacity(total + 1), Vec::new());
    let (mut roots, mut lengths) = (Vec::new(), Vec::new());
    let mut first = 0u32;
    for (rank, program) in (0u32..).zip(&sched.ranks) {
        let rank_dependents = program.dependents();
        let mut rank_roots = Vec::new();
        for (i, instr) in program.instrs.iter().enumerate() {
            let g = first + i as u32;
            let send = instr.send_peer().map_or(NONE, |peer| conns.id(topo, rank, peer, instr.channel));
            let recv = instr.recv_peer().map_or(NONE, |peer| conns.id(topo, peer, rank, instr.channel));
            let mut at = (NONE, NONE);
            if send != NONE {
                let list = &mut conns.list[send as usize].sends;
                at.0 = list.len() as u32;
                list.push(g);
            }
            if recv != NONE {
                let list = &mut conns.list[recv as usize].recvs;
                at.1 = list.len() as u32;
                list.push(g);
            }
            if program.deps_of(i).is_empty() {
                rank_roots.push(g);
            }
            rank_of.push(rank);
            conns_of.push((send, recv));
            positions.push(at);
            deps.push(program.deps_of(i).len() as u32);
            dependents_start.push(dependents.len() as u32);
            dependents.extend(rank_dependents.of(i).iter().map(|&d| first + d));
        }
        roots.push(rank_roots);
        lengths.push(program.len() as u32);
        first += program.len() as u32;
    }
    dependents_start.push(dependents.len() as u32);
    Graph { rank_of, conns_of, positions, conns: conns.list, dependents_start, dependents, deps, roots, lengths }
}

/// How many calls are played back to back: the latency is the time between the ends of the last two.
const CALLS: u32 = 3;

/// The conditions each instruction of each call waits for (call-major): its dependencies, the previous send or
/// receive on its connections (across calls too), its message, the room `slots` receives back, and for an
/// instruction that depends on nothing, its rank having finished the previous call.
fn conditions(graph: &Graph, calls: u32, slots: u32) -> Vec<u32> {
    let mut unmet = Vec::with_capacity(graph.deps.len() * calls as usize);
    for call in 0..calls {
        for (b, &deps) in graph.deps.iter().enumerate() {
            let (send, recv) = graph.conns_of[b];
            let (send_at, recv_at) = graph.positions[b];
            let mut n = deps + u32::from(call > 0 && deps == 0);
            if send != NONE {
                let at = call * graph.conns[send as usize].sends.len() as u32 + send_at;
                n += u32::from(at > 0) + u32::from(at >= slots);
            }
            if recv != NONE {
                let at = call * graph.conns[recv as usize].recvs.len() as u32 + recv_at;
                n += 1 + u32::from(at > 0);
            }
            unmet.push(n);
        }
    }
    unmet
}

/// The instructions a rank may fire, earliest first (then in program order), and when each may.
type Ready = BinaryHeap<Reverse<(Time, u32)>>;

/// One core: its ranks in turn order, which one has it, since when, and its next turn (`INFINITY` while none of its
/// ranks has anything to fire).
struct Core {
    ranks: Vec<u32>,
    /// The places in `ranks` of the ranks that have something to fire (now or later).
    with_ready: BTreeSet<u32>,
    current: usize,
    since: f64,
    next_at: f64,
    next_rank: u32,
}

struct Run<'a> {
    graph: &'a Graph,
    /// Instructions of one call; instruction g of the run is instruction g % total of call g / total.
    total: u32,
    calls: u32,
    slots: u32,
    handover: f64,
    /// Conditions not yet met per instruction of each call.
    unmet: Vec<u32>,
    /// When each instruction's last met condition allows it to fire.
    allowed_at: Vec<f64>,
    /// Per call and rank, its instructions not yet fired; per call, when its last one fired.
    remaining: Vec<u32>,
    finished: Vec<f64>,
    ready: Vec<Ready>,
    cores: Vec<Core>,
    core_of: Vec<u32>,
    /// Each rank's place in its core's turn order.
    turn_of: Vec<u32>,
    /// The core whose turn is being played (its next turn is worked out when the turn ends).
    acting: u32,
}

impl Run<'_> {
    fn earliest(&self, rank: u32) -> Option<f64> {
        self.ready[rank as usize].peek().map(|Reverse((t, _))| t.0)
    }

    /// When `rank` next gets its core, at or after `at`. A waiting rank yields its core at once (the runtime does
    /// not spin when ranks outnumber cores), so the core passes from rank to rank in turn, `handover` per pass, from
    /// the rank that had it since `since`.
    fn turn(&self, rank: u32, at: f64) -> f64 {
        let core = &self.cores[self.core_of[rank as usize] as usize];
        let m = core.ranks.len();
        if m == 1 || self.handover <= 0.0 {
            return core.since.max(at);
        }
        let mut passes = (self.turn_of[rank as usize] as usize + m - core.current) % m;
        if passes == 0 {
            passes = m;
        }
        let late = (at - core.since) / self.handover - passes as f64;
        if late > 0.0 {
            passes += m * (late / m as f64).ceil() as usize;
        }
        core.since + passes as f64 * self.handover
    }

    /// One condition of `g` met at `at`.
    fn meet(&mut self, g: u32, at: f64) {
        let allowed = &mut self.allowed_at[g as usize];
        *allowed = allowed.max(at);
        let unmet = &mut self.unmet[g as usize];
        *unmet -= 1;
        if *unmet > 0 {
            return;
        }
        let allowed = *allowed;
        let rank = self.graph.rank_of[self.split(g).1 as usize];
        self.ready[rank as usize].push(Reverse((Time(allowed), g)));
        let core = self.core_of[rank as usize];
        self.cores[core as usize].with_ready.insert(self.turn_of[rank as usize]);
        if core != self.acting {
            let turn = self.turn(rank, allowed);
            let core = &mut self.cores[core as usize];
            if turn < core.next_at {
                (core.next_at, core.next_rank) = (turn, rank);
            }
        }
    }

    /// Instruction `g` of the run as (call, instruction of one call), without dividing (there are few calls).
    fn split(&self, g: u32) -> (u32, u32) {
        let (mut call, mut b) = (0, g);
        while b >= self.total {
            b -= self.total;
            call += 1;
        }
        (call, b)
    }

    /// The instruction `ahead` places after place `at` of call `call` among a connection's sends or receives
    /// (`list`, one call's), counting across calls, if the run has it.
    fn nth(&self, list: &[u32], call: u32, at: u32, ahead: u32) -> u32 {
        let n = list.len() as u32;
        // A verified schedule has as many receives as sends on each connection, so neither list is empty here.
        if n == 0 {
            return NONE;
        }
        let (mut call, mut at) = (call, at + ahead);
        while at >= n {
            at -= n;
            call += 1;
        }
        if call < self.calls {
            call * self.total + list[at as usize]
        } else {
            NONE
        }
    }

    fn fire(&mut self, g: u32, at: f64) {
        let (call, b) = self.split(g);
        let b = b as usize;
        let (send, recv) = self.graph.conns_of[b];
        let (send_at, recv_at) = self.graph.positions[b];
        // (instruction, when) pairs this one meets a condition of, besides its dependents: the receive its message
        // reaches, the send its receive makes room for, and the next send and receive of the same connections.
        let mut met = [(NONE, 0.0); 4];
        if send != NONE {
            let c = &self.graph.conns[send as usize];
            met[0] = (self.nth(&c.recvs, call, send_at, 0), at + c.alpha);
            met[1] = (self.nth(&c.sends, call, send_at, 1), at);
        }
        if recv != NONE {
            let c = &self.graph.conns[recv as usize];
            met[2] = (self.nth(&c.sends, call, recv_at, self.slots), at + c.alpha);
            met[3] = (self.nth(&c.recvs, call, recv_at, 1), at);
        }
        for (other, when) in met {
            if other != NONE {
                self.meet(other, when);
            }
        }
        let (from, to) = (self.graph.dependents_start[b], self.graph.dependents_start[b + 1]);
        for k in from..to {
            let d = call * self.total + self.graph.dependents[k as usize];
            self.meet(d, at);
        }
        let rank = self.graph.rank_of[b];
        let left = &mut self.remaining[(call * self.graph.lengths.len() as u32 + rank) as usize];
        *left -= 1;
        if *left == 0 {
            self.finished[call as usize] = self.finished[call as usize].max(at);
            if call + 1 < self.calls {
                for k in 0..self.graph.roots[rank as usize].len() {
                    let root = (call + 1) * self.total + self.graph.roots[rank as usize][k];
                    self.meet(root, at);
                }
            }
        }
    }

    /// `core`'s turn at `at` for `rank`: the rank fires all it may by then, then yields, and the core's next turn
    /// goes to whichever of its ranks can fire first.
    fn play_turn(&mut self, core: u32, rank: u32, at: f64) {
        self.acting = core;
        {
            let core = &mut self.cores[core as usize];
            core.current = self.turn_of[rank as usize] as usize;
            core.since = at;
        }
        let mut fired = 0;
        while let Some(Reverse((allowed, g))) = self.ready[rank as usize].peek().copied() {
            if allowed.0 > at {
                break;
            }
            self.ready[rank as usize].pop();
            self.fire(g, at);
            fired += 1;
        }
        // A turn goes only to a rank that can fire by then (`next_turn`, `meet`), so every turn fires.
        debug_assert!(fired > 0, "rank {rank}'s turn at {at:e} s fired nothing");
        if self.ready[rank as usize].is_empty() {
            self.cores[core as usize].with_ready.remove(&self.turn_of[rank as usize]);
        }
        self.acting = NONE;
        let next = self.next_turn(core);
        let core = &mut self.cores[core as usize];
        (core.next_at, core.next_rank) = next;
    }

    /// The core's next turn and whose it is. In turn order from the rank after the current one, the first rank that
    /// can fire by the time its turn comes in this round is it: every later rank's turn comes after, and every
    /// earlier rank's comes in a later round. Only when no rank can fire this round do all need comparing.
    fn next_turn(&self, core: u32) -> (f64, u32) {
        let c = &self.cores[core as usize];
        let m = c.ranks.len() as u32;
        let current = c.current as u32;
        let in_turn_order = c.with_ready.range(current + 1..).chain(c.with_ready.range(..=current));
        let mut next = (f64::INFINITY, NONE);
        for &place in in_turn_order {
            let rank = c.ranks[place as usize];
            let Some(e) = self.earliest(rank) else { continue };
            let passes = match (place + m - current) % m {
                0 => m,
                p => p,
            };
            if e <= c.since + passes as f64 * self.handover {
                return (self.turn(rank, e), rank);
            }
            let turn = self.turn(rank, e);
            if turn < next.0 {
                next = (turn, rank);
            }
        }
        next
    }
}

/// Seconds from the start of a call of no bytes until its last instruction fires, with ranks dealt to cores as
/// `collc run` binds them (`shared_core_alpha_us` for each change of hands) and `slots` messages per connection.
pub(super) fn latency(sched: &Schedule, topo: &Topology, slots: u32) -> f64 {
    let graph = build(sched, topo);
    (play(&graph, sched.n_ranks, topo, slots, false) + play(&graph, sched.n_ranks, topo, slots, true)) / 2.0
}

/// The latency with the cores changing hands in step (`spread` false) or evenly out of step (core c of a node
/// starting c / cores of a hand-over late).
fn play(graph: &Graph, n_ranks: u32, topo: &Topology, slots: u32, spread: bool) -> f64 {
    let total = graph.deps.len() as u32;
    // Instruction numbers of the whole run must fit in a u32 (they do, by far, within the compiler's limits).
    let calls = if total as u64 * CALLS as u64 <= u32::MAX as u64 { CALLS } else { 1 };
    let slots = slots.max(1);
    let (cores, core_of, turn_of) = deal(topo, n_ranks, spread);
    let n = (total * calls) as usize;
    let mut run = Run {
        total,
        calls,
        slots,
        handover: topo.shared_core_alpha_us.unwrap_or(0.0) * 1e-6,
        unmet: conditions(graph, calls, slots),
        allowed_at: vec![0.0; n],
        remaining: (0..calls).flat_map(|_| graph.lengths.iter().copied()).collect(),
        finished: vec![0.0; calls as usize],
        ready: (0..n_ranks).map(|_| Ready::new()).collect(),
        cores,
        core_of,
        turn_of,
        acting: NONE,
        graph,
    };
    for g in 0..total {
        if run.unmet[g as usize] == 0 {
            let rank = run.graph.rank_of[g as usize];
            run.ready[rank as usize].push(Reverse((Time(0.0), g)));
            run.cores[run.core_of[rank as usize] as usize].with_ready.insert(run.turn_of[rank as usize]);
        }
    }
    // The core whose turn comes first plays it: whatever another core does later takes effect no sooner than it
    // happens, so nothing can still change what this turn finds.
    // Each core starts with its first rank if that one can fire at once, else passes the core on as any turn does.
    for core in 0..run.cores.len() {
        let (first, since) = (run.cores[core].ranks[0], run.cores[core].since);
        let next = match run.earliest(first) {
            Some(e) if e <= since => (since, first),
            _ => run.next_turn(core as u32),
        };
        (run.cores[core].next_at, run.cores[core].next_rank) = next;
    }
    // Every turn fires an instruction, so there are at most as many turns as instructions; the bound keeps a turn
    // that broke that rule from looping for ever.
    let mut turns_left = n as u64 + 1;
    while let Some((core, at)) = run
        .cores
        .iter()
        .enumerate()
        .filter(|(_, c)| c.next_at.is_finite())
        .map(|(i, c)| (i as u32, c.next_at))
        .min_by(|a, b| a.1.total_cmp(&b.1))
    {
        if turns_left == 0 {
            break;
        }
        turns_left -= 1;
        let rank = run.cores[core as usize].next_rank;
        run.play_turn(core, rank, at);
    }
    match run.finished.as_slice() {
        [.., before, last] => last - before,
        [only] => *only,
        [] => 0.0,
    }
}

/// The cores of the node's ranks and who is on which (each core starting with its first rank): the cores, each
/// rank's core and its place in that core's turn order.
fn deal(topo: &Topology, n_ranks: u32, spread: bool) -> (Vec<Core>, Vec<u32>, Vec<u32>) {
    let per_node = topo.per_node(n_ranks);
    let cores_per_node = topo.cores_per_node.unwrap_or(per_node).clamp(1, per_node);
    let core_of: Vec<u32> =
        (0..n_ranks).map(|r| topo.node_of(r) * cores_per_node + r % per_node % cores_per_node).collect();
    let n_cores = core_of.iter().max().map_or(0, |&c| c as usize + 1);
    let mut cores: Vec<Core> = (0..n_cores)
        .map(|_| Core {
            ranks: Vec::new(),
            with_ready: BTreeSet::new(),
            current: 0,
            since: 0.0,
            next_at: f64::INFINITY,
            next_rank: NONE,
        })
        .collect();
    let mut turn_of = vec![0u32; n_ranks as usize];
    for (rank, &core) in core_of.iter().enumerate() {
        let core = &mut cores[core as usize];
        turn_of[rank] = core.ranks.len() as u32;
        core.ranks.push(rank as u32);
    }
    let handover = if spread { topo.shared_core_alpha_us.unwrap_or(0.0) * 1e-6 } else { 0.0 };
    for (c, core) in cores.iter_mut().enumerate() {
        core.since = (c as u32 % cores_per_node) as f64 * handover / cores_per_node as f64;
    }
    (cores, core_of, turn_of)
}
