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
//!   `shared_core_alpha_us` less the intra-node link's alpha (fitted to measured latencies, see `latency`), and a
//!   rank fires at its first turn after it can.
//!
//! Ranks are dealt to cores as `collc run` places them: local rank l on core l mod cores. When a message from another
//! core reaches its receiver depends on how the cores' turns line up, which nothing fixes: in step, every message
//! lands just after its receiver has yielded and waits the longest; evenly out of step (core c starting c / cores of
//! a hand-over late), it waits about half as long. The latency is the mean of the two, for phases at random.
//! Calls run back to back, as nccl-tests and `collc run` time them (a rank starts the next call once it has finished
//! its part of this one), and the latency is the time between the ends of the second and third calls: on shared
//! cores, one call's last turns overlap the next call's first, so an isolated call would overstate what each costs.
//!
//! The connections are the verifier's table (`verify::Connections`).

use super::topology::{LinkClass, Topology};
use crate::sched::Schedule;
use crate::verify::{Connection, Connections};
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

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

/// One call as a graph over global instruction indices (rank by rank): the verifier's connection table, and per
/// instruction what playing it out needs.
struct Graph {
    conns: Connections,
    /// Per instruction: the connections it sends and receives on, `NONE` when it has none.
    of_instr: Vec<(u32, u32)>,
    /// Per connection: its link's alpha.
    alpha: Vec<f64>,
    rank_of: Vec<u32>,
    /// Per instruction: its place among its connections' sends and receives, `NONE` when it has none.
    positions: Vec<(u32, u32)>,
    /// Per instruction: how many dependencies it has, and (global indices) the instructions that depend on it.
    deps: Vec<u32>,
    dependents_start: Vec<u32>,
    dependents: Vec<u32>,
    /// Per rank, its instructions that depend on nothing: where its next call starts.
    roots: Vec<Vec<u32>>,
}

fn build(sched: &Schedule, topo: &Topology) -> Graph {
    let conns = Connections::build(sched);
    let total = sched.n_instrs();
    let of_instr: Vec<(u32, u32)> = (0u32..)
        .zip(&sched.ranks)
        .flat_map(|(rank, program)| program.instrs.iter().map(move |instr| (rank, instr)))
        .map(|(rank, instr)| conns.rank(rank).of(instr))
        .collect();
    let alpha = conns.list.iter().map(|c| topo.link(topo.class(c.from, c.to)).alpha()).collect();
    let mut positions = vec![(NONE, NONE); total];
    for c in &conns.list {
        for (k, &s) in (0u32..).zip(conns.sends_of(c)) {
            positions[(conns.rank_start[c.from as usize] + s) as usize].0 = k;
        }
        for (k, &r) in (0u32..).zip(conns.recvs_of(c)) {
            positions[(conns.rank_start[c.to as usize] + r) as usize].1 = k;
        }
    }
    let (mut rank_of, mut deps) = (Vec::with_capacity(total), Vec::with_capacity(total));
    let (mut dependents_start, mut dependents) = (Vec::with_capacity(total + 1), Vec::new());
    let mut roots = Vec::with_capacity(sched.ranks.len());
    for (rank, program) in (0u32..).zip(&sched.ranks) {
        let first = conns.rank_start[rank as usize];
        let rank_dependents = program.dependents();
        let mut rank_roots = Vec::new();
        for i in 0..program.len() {
            let n_deps = program.deps_of(i).len() as u32;
            if n_deps == 0 {
                rank_roots.push(first + i as u32);
            }
            rank_of.push(rank);
            deps.push(n_deps);
            dependents_start.push(dependents.len() as u32);
            dependents.extend(rank_dependents.of(i).iter().map(|&d| first + d));
        }
        roots.push(rank_roots);
    }
    dependents_start.push(dependents.len() as u32);
    Graph { conns, of_instr, alpha, rank_of, positions, deps, dependents_start, dependents, roots }
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
            let (send, recv) = graph.of_instr[b];
            let (send_at, recv_at) = graph.positions[b];
            let mut n = deps + u32::from(call > 0 && deps == 0);
            if send != NONE {
                let at = call * graph.conns.sends_of(&graph.conns.list[send as usize]).len() as u32 + send_at;
                n += u32::from(at > 0) + u32::from(at >= slots);
            }
            if recv != NONE {
                let at = call * graph.conns.recvs_of(&graph.conns.list[recv as usize]).len() as u32 + recv_at;
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
        let rank = self.make_ready(g, allowed);
        let core = self.core_of[rank as usize];
        if core != self.acting {
            let turn = self.turn(rank, allowed);
            let core = &mut self.cores[core as usize];
            if turn < core.next_at {
                (core.next_at, core.next_rank) = (turn, rank);
            }
        }
    }

    /// Puts `g` among what its rank may fire from `allowed` on; returns the rank.
    fn make_ready(&mut self, g: u32, allowed: f64) -> u32 {
        let rank = self.graph.rank_of[self.split(g).1 as usize];
        self.ready[rank as usize].push(Reverse((Time(allowed), g)));
        self.cores[self.core_of[rank as usize] as usize].with_ready.insert(self.turn_of[rank as usize]);
        rank
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
    /// (`list`, one call's, indices on the rank whose instructions start at `first`), counting across calls, if the
    /// run has it.
    fn nth(&self, list: &[u32], first: u32, call: u32, at: u32, ahead: u32) -> u32 {
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
            call * self.total + first + list[at as usize]
        } else {
            NONE
        }
    }

    fn fire(&mut self, g: u32, at: f64) {
        let (call, b) = self.split(g);
        let b = b as usize;
        let graph = self.graph;
        let (send, recv) = graph.of_instr[b];
        let (send_at, recv_at) = graph.positions[b];
        // (instruction, when) pairs this one meets a condition of, besides its dependents: the receive its message
        // reaches, the send its receive makes room for, and the next send and receive of the same connections.
        let mut met = [(NONE, 0.0); 4];
        let starts = |c: &Connection| (graph.conns.rank_start[c.from as usize], graph.conns.rank_start[c.to as usize]);
        if send != NONE {
            let c = &graph.conns.list[send as usize];
            let ((from, to), alpha) = (starts(c), graph.alpha[send as usize]);
            met[0] = (self.nth(graph.conns.recvs_of(c), to, call, send_at, 0), at + alpha);
            met[1] = (self.nth(graph.conns.sends_of(c), from, call, send_at, 1), at);
        }
        if recv != NONE {
            let c = &graph.conns.list[recv as usize];
            let ((from, to), alpha) = (starts(c), graph.alpha[recv as usize]);
            met[2] = (self.nth(graph.conns.sends_of(c), from, call, recv_at, self.slots), at + alpha);
            met[3] = (self.nth(graph.conns.recvs_of(c), to, call, recv_at, 1), at);
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
        let left = &mut self.remaining[(call * self.graph.roots.len() as u32 + rank) as usize];
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
            let turn = self.turn(rank, e);
            if e <= c.since + passes as f64 * self.handover {
                return (turn, rank);
            }
            if turn < next.0 {
                next = (turn, rank);
            }
        }
        next
    }
}

/// Seconds per call of no bytes, calls back to back, with ranks dealt to cores as `collc run` binds them
/// (`shared_core_alpha_us` less the intra-node alpha for each change of hands) and `slots` messages per connection.
pub(super) fn latency(sched: &Schedule, topo: &Topology, slots: u32) -> f64 {
    let graph = build(sched, topo);
    // A pass costs the calibrated send-to-receive time on one core less one link alpha. Measured, not derived: at
    // 4 ranks on 2 cores and 8 B (where only latency counts), the play-out with the full time put 7 of the 8
    // allreduce algorithms further from their measured times (errors summing to 14.1 us against 8.7 us, run AC in
    // bench/README.md), and the selection matched less often over eleven runs (232 against 238 of 264 sizes).
    let one_core = topo.shared_core_alpha_us.unwrap_or(0.0) * 1e-6;
    let handover = (one_core - topo.link(LinkClass::Intra).alpha()).max(0.0);
    let in_step = play(&graph, sched.n_ranks, topo, slots, handover, 0.0);
    let out_of_step = play(&graph, sched.n_ranks, topo, slots, handover, handover);
    (in_step + out_of_step) / 2.0
}

/// The latency with core c of a node starting c / cores of `lag` late (0: the cores change hands in step).
fn play(graph: &Graph, n_ranks: u32, topo: &Topology, slots: u32, handover: f64, lag: f64) -> f64 {
    let total = graph.deps.len() as u32;
    // Instruction numbers of the whole run must fit in a u32 (they do, by far, within the compiler's limits).
    let calls = if total as u64 * CALLS as u64 <= u32::MAX as u64 { CALLS } else { 1 };
    let slots = slots.max(1);
    let (cores, core_of, turn_of) = deal(topo, n_ranks, lag);
    let n = (total * calls) as usize;
    let lengths = graph.conns.rank_start.windows(2).map(|w| w[1] - w[0]);
    let mut run = Run {
        total,
        calls,
        slots,
        handover,
        unmet: conditions(graph, calls, slots),
        allowed_at: vec![0.0; n],
        remaining: (0..calls).flat_map(|_| lengths.clone()).collect(),
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
            run.make_ready(g, 0.0);
        }
    }
    // Each core starts with its first rank if that one can fire at once, else passes the core on as any turn does.
    for core in 0..run.cores.len() {
        let (first, since) = (run.cores[core].ranks[0], run.cores[core].since);
        let next = match run.earliest(first) {
            Some(e) if e <= since => (since, first),
            _ => run.next_turn(core as u32),
        };
        (run.cores[core].next_at, run.cores[core].next_rank) = next;
    }
    // The core whose turn comes first plays it: whatever another core does later takes effect no sooner than it
    // happens, so nothing can still change what this turn finds. Every turn fires an instruction, so there are at
    // most as many turns as instructions; the bound keeps a turn that broke that rule from looping for ever.
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

/// The cores of the ranks (`Topology::core_of`), core c of a node starting c / cores of `lag` late, each with its
/// first rank: the cores, each rank's core and its place in that core's turn order.
fn deal(topo: &Topology, n_ranks: u32, lag: f64) -> (Vec<Core>, Vec<u32>, Vec<u32>) {
    let core_of: Vec<u32> = (0..n_ranks).map(|r| topo.core_of(r, n_ranks)).collect();
    let n_cores = core_of.iter().max().map_or(0, |&c| c as usize + 1);
    let cores_per_node = topo.cores_used(n_ranks);
    let mut cores: Vec<Core> = (0..n_cores as u32)
        .map(|c| Core {
            ranks: Vec::new(),
            with_ready: BTreeSet::new(),
            current: 0,
            since: (c % cores_per_node) as f64 * lag / cores_per_node as f64,
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
    (cores, core_of, turn_of)
}
