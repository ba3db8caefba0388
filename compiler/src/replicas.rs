//! Whether the ranks' copies of a reduced result are bit for bit identical, and whether a result depends on how the
//! message is cut into chunks: a verified schedule executed with a reduction tree in every chunk slot.
//!
//! Floating-point addition (and multiplication) is commutative bit for bit (NaN payloads aside) but not
//! associative: a chunk reduced as (x0 + x1) + x2 on one rank and as x0 + (x1 + x2) on another holds different
//! bits. So a slot carries a tree: a leaf is an input contribution (rank, chunk) or undefined data, a node the
//! unordered pair one reduction made of two trees (`Reduce`: `acc + src`; the receive-reduce instructions: `acc` +
//! the message). Trees are hash-consed, so equal trees have equal ids; copies and messages move ids. The verifier
//! has proved the schedule correct and free of deadlocks and races, so any dataflow order gives the same trees.
//!
//! For a reducing collective (allreduce, reducescatter, reduce; any other's answer is trivially yes) `analyse`
//! reports (a) whether replicas agree: every rank whose checked output holds one reduced chunk of the contract
//! holds the same tree; (b) whether the result is chunk-independent: each rank's output chunks have one tree shape
//! once leaves are named by rank only, so what an element's result is does not depend on the message size or how
//! it is cut into chunks and tiles.

use crate::collective::Expected;
use crate::fxhash::FxBuildHasher;
use crate::sched::{slot_bases, BufId, Operand, Placement, Schedule};
use crate::{lower, Bindings, Errors, Limits, Options, VerifiedSchedule};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;

/// Two ranks whose outputs hold one reduced chunk of the contract (`chunk`, as `Collective::expected` numbers it)
/// reduced in different trees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Disagreement {
    pub chunk: u32,
    pub ranks: [u32; 2],
}

/// Two output chunks of one rank whose trees differ in shape, leaves named by rank only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkDependence {
    pub rank: u32,
    pub chunks: [u32; 2],
}

/// What `analyse` found: a witness of each property that fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replicas {
    pub disagreement: Option<Disagreement>,
    pub chunk_dependence: Option<ChunkDependence>,
}

impl Replicas {
    /// Every rank's copy of a reduced chunk is bitwise identical to every other rank's.
    pub fn agree(&self) -> bool {
        self.disagreement.is_none()
    }

    /// Each rank reduces all its output chunks in one tree shape: results do not depend on the message size.
    pub fn chunk_independent(&self) -> bool {
        self.chunk_dependence.is_none()
    }

    /// Both properties where both schedules (or sets of them) have them, with the first witnesses.
    pub fn and(self, other: Replicas) -> Replicas {
        Replicas {
            disagreement: self.disagreement.or(other.disagreement),
            chunk_dependence: self.chunk_dependence.or(other.chunk_dependence),
        }
    }
}

impl fmt::Display for Replicas {
    /// `replicas agree: yes, chunk-independent: no`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = |yes: bool| if yes { "yes" } else { "no" };
        write!(f, "replicas agree: {}, chunk-independent: {}", word(self.agree()), word(self.chunk_independent()))
    }
}

/// What a deterministic run requires of an algorithm (`collc run --deterministic`, `deterministic` in an
/// `AlgoFilter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Determinism {
    /// Replicas agree: every rank gets the same bits.
    Replicas,
    /// Replicas agree and results are chunk-independent: the same bits whatever the message size.
    Strict,
}

impl Determinism {
    pub fn admits(self, replicas: &Replicas) -> bool {
        self.refusal(replicas).is_none()
    }

    pub fn name(self) -> &'static str {
        match self {
            Determinism::Replicas => "replicas",
            Determinism::Strict => "strict",
        }
    }

    /// Why a schedule with `replicas` does not meet this level, naming the witness; `None` if it does.
    pub fn refusal(self, replicas: &Replicas) -> Option<String> {
        if let Some(Disagreement { chunk, ranks: [a, b] }) = replicas.disagreement {
            return Some(format!(
                "ranks {a} and {b} reduce chunk {chunk} in different orders: replicas differ bitwise"
            ));
        }
        match (self, replicas.chunk_dependence) {
            (Determinism::Strict, Some(ChunkDependence { rank, chunks: [a, b] })) => Some(format!(
                "rank {rank} reduces chunks {a} and {b} in different orders: results depend on the message size"
            )),
            _ => None,
        }
    }
}

impl FromStr for Determinism {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "" | "replicas" | "yes" => Ok(Determinism::Replicas),
            "strict" => Ok(Determinism::Strict),
            other => Err(format!("`{other}` is not a determinism level: write replicas or strict")),
        }
    }
}

/// A tree's id in its table: children always have smaller ids than their parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct TreeId(u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Node {
    Undefined,
    Leaf {
        rank: u32,
        chunk: u32,
    },
    /// The smaller id first: the reduction is commutative.
    Pair(TreeId, TreeId),
}

/// Hash-consed trees: a node is interned once, so two trees are equal exactly when their ids are.
#[derive(Default)]
struct Trees {
    nodes: Vec<Node>,
    ids: HashMap<Node, TreeId, FxBuildHasher>,
}

impl Trees {
    fn intern(&mut self, node: Node) -> TreeId {
        let next = TreeId(self.nodes.len() as u32);
        let id = *self.ids.entry(node).or_insert(next);
        if id == next {
            self.nodes.push(node);
        }
        id
    }

    fn pair(&mut self, a: TreeId, b: TreeId) -> TreeId {
        self.intern(Node::Pair(a.min(b), a.max(b)))
    }

    /// Each tree's shape with leaves named by rank only, as an id into `shapes`.
    fn shapes(&self, shapes: &mut Trees) -> Vec<TreeId> {
        let mut shape = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            let id = match *node {
                Node::Undefined => shapes.intern(Node::Undefined),
                Node::Leaf { rank, .. } => shapes.intern(Node::Leaf { rank, chunk: 0 }),
                Node::Pair(a, b) => shapes.pair(shape[a.0 as usize], shape[b.0 as usize]),
            };
            shape.push(id);
        }
        shape
    }
}

/// Reports whether `sched`'s replicas agree and whether its results are chunk-independent (see the module doc).
pub fn analyse(sched: &VerifiedSchedule) -> Replicas {
    if !sched.collective.reduces() {
        return Replicas::default();
    }
    let mut run = Run::new(sched);
    run.execute();
    run.judge()
}

/// One symbolic execution: every rank's chunk slots (its buffers end to end), and the messages in flight.
struct Run<'a> {
    sched: &'a Schedule,
    trees: Trees,
    bases: Vec<u32>,
    slots: Vec<Vec<TreeId>>,
}

/// Which message each instruction receives and sends, as (connection, k): the k-th send on a connection (sender,
/// receiver, channel) pairs with its k-th receive.
struct Wiring {
    receives: Vec<Vec<Option<(u32, u32)>>>,
    sends: Vec<Vec<Option<(u32, u32)>>>,
    /// Per connection, the receiving instruction (rank, index) of each message.
    receivers: Vec<Vec<(u32, u32)>>,
}

impl Wiring {
    fn new(sched: &Schedule) -> Wiring {
        let mut ids: HashMap<(u32, u32, u8), u32, FxBuildHasher> = HashMap::default();
        let mut sent: Vec<u32> = Vec::new();
        let mut wiring = Wiring { receives: Vec::new(), sends: Vec::new(), receivers: Vec::new() };
        let mut connection = |key: (u32, u32, u8), wiring: &mut Wiring, sent: &mut Vec<u32>| {
            let next = ids.len() as u32;
            let id = *ids.entry(key).or_insert(next);
            if id == next {
                wiring.receivers.push(Vec::new());
                sent.push(0);
            }
            id as usize
        };
        for (rank, program) in sched.ranks.iter().enumerate() {
            let rank = rank as u32;
            let (mut receives, mut sends) = (Vec::new(), Vec::new());
            for (index, instr) in program.instrs.iter().enumerate() {
                let mut receive = None;
                if let Some(peer) = instr.recv_peer() {
                    let c = connection((peer, rank, instr.channel), &mut wiring, &mut sent);
                    wiring.receivers[c].push((rank, index as u32));
                    receive = Some((c as u32, wiring.receivers[c].len() as u32 - 1));
                }
                let mut send = None;
                if let Some(peer) = instr.send_peer() {
                    let c = connection((rank, peer, instr.channel), &mut wiring, &mut sent);
                    sent[c] += 1;
                    send = Some((c as u32, sent[c] - 1));
                }
                receives.push(receive);
                sends.push(send);
            }
            wiring.receives.push(receives);
            wiring.sends.push(sends);
        }
        wiring
    }
}

impl<'a> Run<'a> {
    fn new(sched: &'a Schedule) -> Run<'a> {
        let (bases, total) = slot_bases(&sched.buffers);
        let mut trees = Trees::default();
        let undefined = trees.intern(Node::Undefined);
        let (in_chunks, _) = sched.collective.buffer_chunks(sched.n_ranks, sched.chunks);
        let mut run = Run { sched, trees, bases, slots: Vec::new() };
        for rank in 0..sched.n_ranks {
            let mut slots = vec![undefined; total as usize];
            if sched.collective.input_significant(rank, sched.root) {
                let (buf, offset) = sched.input_window(rank);
                for chunk in 0..in_chunks {
                    let slot = run.slot(rank, Operand::new(buf, offset + chunk));
                    slots[slot] = run.trees.intern(Node::Leaf { rank, chunk });
                }
            }
            run.slots.push(slots);
        }
        run
    }

    /// Where `operand` starts among `rank`'s slots. In place, `in` and `out` are windows of one buffer
    /// (`Schedule::shared_buffer`): an operand naming the other one is put onto it at that window's offset.
    fn slot(&self, rank: u32, operand: Operand) -> usize {
        let (buf, index) = (operand.buf, operand.index);
        let shared = self.sched.shared_buffer();
        if self.sched.placement == Placement::InPlace && (buf == BufId::IN || buf == BufId::OUT) && buf != shared {
            let (in_offset, out_offset) = self.sched.window_offsets(rank);
            let offset = if buf == BufId::IN { in_offset } else { out_offset };
            return (self.bases[shared.0 as usize] + offset + index) as usize;
        }
        (self.bases[buf.0 as usize] + index) as usize
    }

    /// Every instruction once, in a dataflow order: once its dependencies are done and its message has come.
    fn execute(&mut self) {
        let wiring = Wiring::new(self.sched);
        let mut messages: Vec<Vec<Option<Vec<TreeId>>>> =
            wiring.receivers.iter().map(|r| vec![None; r.len()]).collect();
        let dependents: Vec<_> = self.sched.ranks.iter().map(|p| p.dependents()).collect();
        let mut unmet: Vec<Vec<u32>> = Vec::new();
        let mut ready: Vec<(u32, u32)> = Vec::new();
        for (rank, program) in self.sched.ranks.iter().enumerate() {
            let counts: Vec<u32> = (0..program.len())
                .map(|i| program.deps_of(i).len() as u32 + u32::from(wiring.receives[rank][i].is_some()))
                .collect();
            ready.extend(counts.iter().enumerate().filter(|(_, &n)| n == 0).map(|(i, _)| (rank as u32, i as u32)));
            unmet.push(counts);
        }
        let mut value: Vec<TreeId> = Vec::new();
        let mut done = 0;
        while let Some((rank, index)) = ready.pop() {
            let (r, i) = (rank as usize, index as usize);
            let incoming = wiring.receives[r][i].and_then(|(c, k)| messages[c as usize][k as usize].take());
            self.apply(rank, i, incoming, &mut value);
            done += 1;
            let mut release = |(r, i): (u32, u32), ready: &mut Vec<(u32, u32)>| {
                let left = &mut unmet[r as usize][i as usize];
                *left -= 1;
                if *left == 0 {
                    ready.push((r, i));
                }
            };
            if let Some((c, k)) = wiring.sends[r][i] {
                messages[c as usize][k as usize] = Some(value.clone());
                if let Some(&receiver) = wiring.receivers[c as usize].get(k as usize) {
                    release(receiver, &mut ready);
                }
            }
            for &d in dependents[r].of(i) {
                release((rank, d), &mut ready);
            }
        }
        debug_assert_eq!(done, self.sched.n_instrs(), "a verified schedule runs to the end");
    }

    /// Runs instruction `index` of `rank` on its slots; `value` is left holding what it sends, if anything.
    fn apply(&mut self, rank: u32, index: usize, incoming: Option<Vec<TreeId>>, value: &mut Vec<TreeId>) {
        let instr = self.sched.ranks[rank as usize].instrs[index];
        let n = instr.count as usize;
        value.clear();
        match incoming {
            Some(message) => value.extend(message),
            None => {
                let src = self.slot(rank, instr.src);
                value.extend_from_slice(&self.slots[rank as usize][src..src + n]);
            }
        }
        if let Some(acc) = instr.acc.get() {
            let acc = self.slot(rank, acc);
            for (k, v) in value.iter_mut().enumerate() {
                *v = self.trees.pair(self.slots[rank as usize][acc + k], *v);
            }
        }
        if let Some(dst) = instr.dst.get() {
            let dst = self.slot(rank, dst);
            self.slots[rank as usize][dst..dst + n].copy_from_slice(value);
        }
    }

    /// The two properties, from every rank's checked output chunks.
    fn judge(&self) -> Replicas {
        let sched = self.sched;
        let mut shapes = Trees::default();
        let shape = self.trees.shapes(&mut shapes);
        let (_, out_chunks) = sched.collective.buffer_chunks(sched.n_ranks, sched.chunks);
        let mut holders: HashMap<u32, (u32, TreeId), FxBuildHasher> = HashMap::default();
        let mut replicas = Replicas::default();
        for rank in 0..sched.n_ranks {
            let (buf, offset) = sched.output_window(rank);
            let mut first: Option<(u32, TreeId)> = None;
            for c in 0..out_chunks {
                let Expected::SumOverRanks { chunk } =
                    sched.collective.expected(rank, c, sched.chunks, sched.root, sched.peer)
                else {
                    continue;
                };
                let tree = self.slots[rank as usize][self.slot(rank, Operand::new(buf, offset + c))];
                match holders.entry(chunk) {
                    Entry::Vacant(e) => {
                        e.insert((rank, tree));
                    }
                    Entry::Occupied(e) if e.get().1 != tree && replicas.disagreement.is_none() => {
                        replicas.disagreement = Some(Disagreement { chunk, ranks: [e.get().0, rank] });
                    }
                    Entry::Occupied(_) => {}
                }
                let this = shape[tree.0 as usize];
                match first {
                    None => first = Some((c, this)),
                    Some((c0, s0)) if s0 != this && replicas.chunk_dependence.is_none() => {
                        replicas.chunk_dependence = Some(ChunkDependence { rank, chunks: [c0, c] });
                    }
                    Some(_) => {}
                }
            }
        }
        replicas
    }
}

/// The rank counts `collc list` checks each library algorithm at (and `of_algorithm` by default).
pub const LIBRARY_RANKS: RangeInclusive<u32> = 2..=8;

/// `analyse` over every binding of an algorithm at each of `ranks`: every root of a rooted collective, every node
/// split an algorithm's open `nodes/local` allows, both placements. A rank count or binding the algorithm does not
/// admit is left out; `None` if none is admitted. A property holds only where it holds for every schedule.
pub fn of_algorithm(source: &str, ranks: RangeInclusive<u32>, limits: &Limits) -> Result<Option<Replicas>, Errors> {
    let file = collc_grammar::parse(source, &limits.syntax).map_err(crate::Error::from)?;
    let collective = file.algorithm.collective.name.parse::<crate::Collective>().ok();
    let mut found: Option<Replicas> = None;
    for p in ranks {
        let roots: Vec<Option<u32>> = match collective.is_some_and(|c| c.rooted()) {
            true => (0..p).map(Some).collect(),
            false => vec![None],
        };
        let splits: Vec<u32> = match crate::lower::node_split(&file.algorithm) {
            Some(_) => (1..=p).filter(|g| p.is_multiple_of(*g)).collect(),
            None => vec![p],
        };
        for root in roots {
            for &per_node in &splits {
                let bindings = Bindings { root, ..Bindings::ranks(p) }.with_default_split(&file.algorithm, per_node);
                let program = match lower(&file, &bindings, limits) {
                    Ok(program) => program,
                    Err(errors) if errors.not_admitted() => continue,
                    Err(errors) => return Err(errors),
                };
                for placement in Placement::BOTH {
                    let verified = crate::compile_program(&program, source, Options::placed(placement), limits)?;
                    let replicas = analyse(&verified);
                    found = Some(found.map_or(replicas, |f| f.and(replicas)));
                }
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::{analyse, of_algorithm, ChunkDependence, Determinism, Disagreement, Replicas, LIBRARY_RANKS};
    use crate::{compile, library, Bindings, Limits, Options, Placement, VerifiedSchedule};

    fn build(source: &str, p: u32, placement: Placement) -> VerifiedSchedule {
        let limits = Limits::default();
        compile(source, &Bindings::ranks(p), Options::placed(placement), &limits).expect("verifies")
    }

    fn library_at(name: &str, p: u32, placement: Placement) -> Replicas {
        analyse(&build(library::get(name).expect("in the library"), p, placement))
    }

    /// Ring allreduce: the all-gather copies each reduced chunk, so replicas agree; but chunk c's ring starts at
    /// rank c + 1, so chunks differ in shape.
    #[test]
    fn ring_allreduce_replicas_agree_but_depend_on_the_chunk() {
        for placement in Placement::BOTH {
            for p in [2, 3, 5, 8] {
                let replicas = library_at("allreduce/ring", p, placement);
                assert!(replicas.agree(), "p={p} {placement}: {replicas:?}");
                assert_eq!(replicas.chunk_independent(), p == 2, "p={p} {placement}: {replicas:?}");
            }
        }
        let replicas = library_at("allreduce/ring", 3, Placement::OutOfPlace);
        assert_eq!(replicas.chunk_dependence, Some(ChunkDependence { rank: 0, chunks: [0, 1] }));
        assert_eq!(replicas.to_string(), "replicas agree: yes, chunk-independent: no");
    }

    /// Each rank sums the others' copies into its own in its own order, so ranks' trees differ from three ranks on.
    #[test]
    fn ranks_that_reduce_in_different_orders_disagree() {
        let skewed = "algorithm skewed for allreduce {
            ranks p where p >= 1
            scratch tmp[p]
            step { for r in 0..p { for q in 0..p { if q != r { send in[0] from r to q as tmp[r] } } } }
            for s in 1..p { step { for r in 0..p { reduce tmp[(r + s) % p] into in[0] on r } } }
        }";
        for placement in Placement::BOTH {
            let replicas = analyse(&build(skewed, 3, placement));
            assert_eq!(replicas.disagreement, Some(Disagreement { chunk: 0, ranks: [0, 1] }), "{placement}");
            assert!(replicas.chunk_independent());
            assert!(analyse(&build(skewed, 2, placement)).agree(), "two ranks add the same pair");
        }
        assert!(!library_at("allreduce/one_shot", 4, Placement::InPlace).agree());
    }

    /// Swapping whole buffers and adding makes the same pair on both partners, round after round.
    #[test]
    fn recursive_doubling_agrees_and_other_collectives_trivially_do() {
        for p in [2, 4, 6, 8] {
            let replicas = library_at("allreduce/recursive_doubling", p, Placement::OutOfPlace);
            assert!(replicas.agree() && replicas.chunk_independent(), "p={p}: {replicas:?}");
        }
        assert_eq!(library_at("allgather/ring", 4, Placement::InPlace), Replicas::default());
        assert!(library_at("reducescatter/ring", 4, Placement::InPlace).agree(), "one rank holds each block");
    }

    #[test]
    fn determinism_levels_admit_what_they_promise() {
        let both = Replicas::default();
        let dependent = Replicas { chunk_dependence: Some(ChunkDependence { rank: 0, chunks: [0, 1] }), ..both };
        let disagreeing = Replicas { disagreement: Some(Disagreement { chunk: 0, ranks: [0, 1] }), ..both };
        assert!(Determinism::Strict.admits(&both) && Determinism::Replicas.admits(&dependent));
        assert!(!Determinism::Strict.admits(&dependent) && !Determinism::Replicas.admits(&disagreeing));
        assert_eq!("strict".parse::<Determinism>(), Ok(Determinism::Strict));
        assert!("sometimes".parse::<Determinism>().is_err());
        let ring = of_algorithm(library::get("allreduce/ring").expect("ring"), LIBRARY_RANKS, &Limits::default());
        assert!(ring.expect("verifies").is_some_and(|r| r.agree() && !r.chunk_independent()));
    }
}
