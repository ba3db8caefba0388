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
use crate::verify::Connections;
use crate::{lower, Bindings, Errors, Limits, Options, VerifiedSchedule};
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Undefined,
    Leaf {
        rank: u32,
    },
    /// The smaller id first where the reduction is commutative; in `Trees::ordered`, the accumulated operand first.
    Pair(TreeId, TreeId),
}

/// Hash-consed trees: a pair is interned once, and each leaf made once, so two trees are equal exactly when their
/// ids are. Leaves carry their rank only: a leaf's chunk is told apart by its id, and dropped for shapes.
struct Trees {
    nodes: Vec<Node>,
    /// Each pair's id, keyed by its two children's (smaller one in the high half).
    pairs: HashMap<u64, TreeId, FxBuildHasher>,
    /// Whether a pair keeps its operands' order (`acc` first), for an operator that may not commute.
    ordered: bool,
}

impl Trees {
    /// Every slot's value before anything is written to it.
    const UNDEFINED: TreeId = TreeId(0);

    fn new(ordered: bool) -> Trees {
        Trees { nodes: vec![Node::Undefined], pairs: HashMap::default(), ordered }
    }

    /// A new leaf: each contribution (or, for shapes, each rank) is made once.
    fn leaf(&mut self, rank: u32) -> TreeId {
        self.nodes.push(Node::Leaf { rank });
        TreeId(self.nodes.len() as u32 - 1)
    }

    fn pair(&mut self, a: TreeId, b: TreeId) -> TreeId {
        let (low, high) = if self.ordered { (a, b) } else { (a.min(b), a.max(b)) };
        let next = TreeId(self.nodes.len() as u32);
        let id = *self.pairs.entry(u64::from(low.0) << 32 | u64::from(high.0)).or_insert(next);
        if id == next {
            self.nodes.push(Node::Pair(low, high));
        }
        id
    }

    /// Each tree's shape with leaves named by rank only, as an id into `shapes`.
    fn shapes(&self, n_ranks: u32) -> Vec<TreeId> {
        let mut shapes = Trees::new(self.ordered);
        let leaves: Vec<TreeId> = (0..n_ranks).map(|rank| shapes.leaf(rank)).collect();
        let mut shape = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            let id = match *node {
                Node::Undefined => Trees::UNDEFINED,
                Node::Leaf { rank } => leaves[rank as usize],
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
    let mut run = Run::new(sched, false);
    run.execute();
    run.judge()
}

/// A rank's output chunk that `sched` does not reduce as a chain in rank order, `((x0 ⊕ x1) ⊕ x2) ⊕ ...`, each
/// reduction's accumulated operand first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfOrder {
    pub rank: u32,
    /// The chunk of the rank's output window.
    pub chunk: u32,
}

/// Whether every rank's reduced output chunks are chains in rank order: the one order an operator that is not
/// commutative and associative computes the contract in (docs/language.md §16). Trivially so for a collective that
/// does not reduce.
pub fn in_rank_order(sched: &VerifiedSchedule) -> Result<(), OutOfOrder> {
    if !sched.collective.reduces() {
        return Ok(());
    }
    let mut run = Run::new(sched, true);
    run.execute();
    run.first_out_of_order().map_or(Ok(()), Err)
}

/// One symbolic execution: every rank's chunk slots (its buffers end to end), and the messages in flight.
struct Run<'a> {
    sched: &'a Schedule,
    trees: Trees,
    /// Per rank and buffer, where the buffer's chunk 0 lies among the rank's slots: `bases[rank * buffers + buf]`.
    bases: Vec<u32>,
    slots: Vec<Vec<TreeId>>,
}

impl<'a> Run<'a> {
    fn new(sched: &'a Schedule, ordered: bool) -> Run<'a> {
        let (bases, total) = slot_bases(&sched.buffers);
        // In place, `in` and `out` are windows of one buffer (`Schedule::shared_buffer`): an operand naming the
        // other one is put onto it at that window's offset (the verifier's alias pass has already done so).
        let shared = sched.shared_buffer();
        let bases = (0..sched.n_ranks)
            .flat_map(|rank| {
                let (in_offset, out_offset) = sched.window_offsets(rank);
                let on_shared = |offset: u32| bases[shared.0 as usize] + offset;
                bases.iter().enumerate().map(move |(b, &base)| match BufId(b as u8) {
                    buf if sched.placement != Placement::InPlace || buf == shared => base,
                    BufId::IN => on_shared(in_offset),
                    BufId::OUT => on_shared(out_offset),
                    _ => base,
                })
            })
            .collect();
        let trees = Trees::new(ordered);
        let (in_chunks, _) = sched.collective.buffer_chunks(sched.n_ranks, sched.chunks);
        let mut run = Run { sched, trees, bases, slots: Vec::new() };
        for rank in 0..sched.n_ranks {
            let mut slots = vec![Trees::UNDEFINED; total as usize];
            if sched.collective.input_significant(rank, sched.root) {
                let (buf, offset) = sched.input_window(rank);
                for chunk in 0..in_chunks {
                    let slot = run.slot(rank, Operand::new(buf, offset + chunk));
                    slots[slot] = run.trees.leaf(rank);
                }
            }
            run.slots.push(slots);
        }
        run
    }

    /// Where `operand` starts among `rank`'s slots.
    fn slot(&self, rank: u32, operand: Operand) -> usize {
        let (buf, index) = (operand.buf, operand.index);
        (self.bases[rank as usize * self.sched.buffers.len() + buf.0 as usize] + index) as usize
    }

    /// Every instruction once, in a dataflow order: once its dependencies are done and its message has come. A
    /// message waits in `arena`, where its receive has room for it (the k-th send on a connection pairs with the
    /// k-th receive, `Connections`).
    fn execute(&mut self) {
        let sched = self.sched;
        let conns = Connections::build(sched);
        let first = &conns.rank_start;
        let total = sched.n_instrs();
        let mut receiver: Vec<Option<u32>> = vec![None; total];
        let mut unmet = vec![0u32; total];
        for c in &conns.list {
            for (&s, &r) in conns.sends_of(c).iter().zip(conns.recvs_of(c)) {
                let r = first[c.to as usize] + r;
                receiver[(first[c.from as usize] + s) as usize] = Some(r);
                unmet[r as usize] += 1;
            }
        }
        let (mut room, mut arena_len) = (vec![0u32; total], 0u32);
        let mut ready: Vec<(u32, u32)> = Vec::new();
        for (rank, program) in (0u32..).zip(&sched.ranks) {
            for (i, instr) in program.instrs.iter().enumerate() {
                let g = (first[rank as usize] + i as u32) as usize;
                unmet[g] += program.deps_of(i).len() as u32;
                if instr.op.receives() {
                    room[g] = arena_len;
                    arena_len += instr.count;
                }
                if unmet[g] == 0 {
                    ready.push((rank, i as u32));
                }
            }
        }
        let mut arena = vec![TreeId(0); arena_len as usize];
        let dependents: Vec<_> = sched.ranks.iter().map(|p| p.dependents()).collect();
        let mut value: Vec<TreeId> = Vec::new();
        let mut done = 0;
        while let Some((rank, index)) = ready.pop() {
            let (r, i) = (rank as usize, index as usize);
            let g = (first[r] + index) as usize;
            let instr = sched.ranks[r].instrs[i];
            let message = instr.op.receives().then(|| &arena[room[g] as usize..][..instr.count as usize]);
            self.apply(rank, i, message, &mut value);
            done += 1;
            let mut release = |g: u32, at: (u32, u32), ready: &mut Vec<(u32, u32)>| {
                unmet[g as usize] -= 1;
                if unmet[g as usize] == 0 {
                    ready.push(at);
                }
            };
            if let Some(to) = receiver[g] {
                arena[room[to as usize] as usize..][..value.len()].copy_from_slice(&value);
                let peer = instr.send_peer;
                release(to, (peer, to - first[peer as usize]), &mut ready);
            }
            for &d in dependents[r].of(i) {
                release(first[r] + d, (rank, d), &mut ready);
            }
        }
        debug_assert_eq!(done, total, "a verified schedule runs to the end");
    }

    /// Runs instruction `index` of `rank` on its slots; `value` is left holding what it sends, if anything.
    fn apply(&mut self, rank: u32, index: usize, incoming: Option<&[TreeId]>, value: &mut Vec<TreeId>) {
        let instr = self.sched.ranks[rank as usize].instrs[index];
        let n = instr.count as usize;
        value.clear();
        match incoming {
            Some(message) => value.extend_from_slice(message),
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

    /// The first reduced output chunk whose (ordered) tree is not the chain of ranks 0, 1, ..., p-1.
    fn first_out_of_order(&self) -> Option<OutOfOrder> {
        let sched = self.sched;
        let (_, out_chunks) = sched.collective.buffer_chunks(sched.n_ranks, sched.chunks);
        let is_chain = |mut tree: TreeId| {
            for rank in (1..sched.n_ranks).rev() {
                match self.trees.nodes[tree.0 as usize] {
                    Node::Pair(rest, last) if self.trees.nodes[last.0 as usize] == Node::Leaf { rank } => tree = rest,
                    _ => return false,
                }
            }
            self.trees.nodes[tree.0 as usize] == Node::Leaf { rank: 0 }
        };
        for rank in 0..sched.n_ranks {
            let (buf, offset) = sched.output_window(rank);
            for chunk in 0..out_chunks {
                let Expected::SumOverRanks { .. } =
                    sched.collective.expected(rank, chunk, sched.chunks, sched.root, sched.peer)
                else {
                    continue;
                };
                if !is_chain(self.slots[rank as usize][self.slot(rank, Operand::new(buf, offset + chunk))]) {
                    return Some(OutOfOrder { rank, chunk });
                }
            }
        }
        None
    }

    /// The two properties, from every rank's checked output chunks.
    fn judge(&self) -> Replicas {
        let sched = self.sched;
        let shape = self.trees.shapes(sched.n_ranks);
        let (in_chunks, out_chunks) = sched.collective.buffer_chunks(sched.n_ranks, sched.chunks);
        // Per chunk of the contract, the first rank whose output holds it, and its tree.
        let mut holders: Vec<Option<(u32, TreeId)>> = vec![None; in_chunks as usize];
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
                match holders[chunk as usize] {
                    None => holders[chunk as usize] = Some((rank, tree)),
                    Some((holder, held)) if held != tree && replicas.disagreement.is_none() => {
                        replicas.disagreement = Some(Disagreement { chunk, ranks: [holder, rank] });
                    }
                    Some(_) => {}
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
    use super::{
        analyse, in_rank_order, of_algorithm, ChunkDependence, Determinism, Disagreement, OutOfOrder, Replicas,
        LIBRARY_RANKS,
    };
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

    /// Naive allreduce adds the inputs into rank 0's in rank order and sends the result on: a chain in rank order on
    /// every rank. Ring, one-shot and recursive doubling are not; nor is a chain that puts the accumulated value
    /// second (`reduce`'s receiver adds its own input as `acc`).
    #[test]
    fn only_chains_in_rank_order_pass_the_order_check() {
        for placement in Placement::BOTH {
            for p in [1, 2, 3, 5] {
                let naive = build(library::get("allreduce/naive").unwrap(), p, placement);
                assert_eq!(in_rank_order(&naive), Ok(()), "p={p} {placement}");
            }
            for name in ["allreduce/ring", "allreduce/one_shot", "allreduce/recursive_doubling"] {
                let sched = build(library::get(name).unwrap(), 4, placement);
                assert!(in_rank_order(&sched).is_err(), "{name} {placement}");
            }
            let reversed = "algorithm reversed for reduce {
                ranks p where p >= 2
                root dst where dst == 0
                for s in 0..p-1 { step { send in[0] from s to s + 1 reduce } }
                step { send in[0] from p - 1 to 0 }
            }";
            let reversed = compile(reversed, &Bindings::ranks(3), Options::placed(placement), &Limits::default());
            let reversed = reversed.expect("verifies");
            assert_eq!(in_rank_order(&reversed), Err(OutOfOrder { rank: 0, chunk: 0 }), "{placement}");
        }
        assert_eq!(in_rank_order(&build(library::get("allgather/ring").unwrap(), 3, Placement::InPlace)), Ok(()));
    }
}
