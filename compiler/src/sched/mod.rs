//! `sched::Schedule`: per-rank instruction lists with explicit local-read, local-write and peer operands, channels
//! and the dependencies that data hazards require. `build.rs` makes one from an `ir::Program`, `hazards.rs` its
//! dependencies.

pub(crate) mod build;
pub(crate) mod hazards;
mod index;
pub(crate) mod slots;

use crate::collective::Collective;
use collc_grammar::ast::Span;
use serde::Serialize;
use std::fmt;

pub use build::{schedule, schedule_ranks, schedule_with, Layout};
pub use hazards::add_dependencies;
pub use index::{IndexPart, TransferIndex};

/// Whether `in` and `out` are one buffer (NCCL's in-place call) or two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    InPlace,
    OutOfPlace,
}

impl Placement {
    pub const BOTH: [Placement; 2] = [Placement::OutOfPlace, Placement::InPlace];

    pub fn name(self) -> &'static str {
        match self {
            Placement::InPlace => "in-place",
            Placement::OutOfPlace => "out-of-place",
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A physical buffer of every rank: 0 is `in`, 1 is `out`, the rest are scratch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct BufId(pub u8);

impl BufId {
    pub const IN: BufId = BufId(0);
    pub const OUT: BufId = BufId(1);
    /// The first scratch buffer; scratch buffers, then the out-of-place `_work` buffer, follow.
    pub const FIRST_SCRATCH: BufId = BufId(2);
    const NONE: BufId = BufId(u8::MAX);
    /// The most buffers a schedule can have: `in`, `out`, scratch and `_work`, each with an id below `NONE`.
    pub const MAX_BUFFERS: usize = u8::MAX as usize;
    /// The most scratch buffers an algorithm can declare (the rest of `MAX_BUFFERS` is `in`, `out` and `_work`).
    pub const MAX_SCRATCH: usize = BufId::MAX_BUFFERS - 3;

    /// A buffer only the schedule sees (scratch or `_work`): its last value does not reach the caller.
    pub fn is_scratch(self) -> bool {
        self >= BufId::FIRST_SCRATCH && self != BufId::NONE
    }
}

/// `count` chunks from `index` of `buf` on the rank that runs the instruction.
///
/// Packed to 5 bytes (a 3-byte padding otherwise): an `Instr` has three, so this (with a 1-byte `BufId` and a
/// 2-byte span) takes it from 44 to 32 bytes, and the schedules of thousands of ranks are gigabytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[repr(C, packed)]
pub struct Operand {
    pub buf: BufId,
    pub index: u32,
}

impl Operand {
    pub const NONE: Operand = Operand { buf: BufId::NONE, index: 0 };

    pub fn new(buf: BufId, index: u32) -> Self {
        Operand { buf, index }
    }

    pub fn get(self) -> Option<Operand> {
        (self.buf != BufId::NONE).then_some(self)
    }
}

/// NCCL/MSCCL's instruction set, spelled in full.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Op {
    /// send(src)
    Send,
    /// dst = recv()
    Recv,
    /// dst = acc + recv()
    RecvReduceCopy,
    /// send(acc + recv())
    RecvReduceSend,
    /// dst = acc + recv(); send(dst)
    RecvReduceCopySend,
    /// dst = recv(); send(dst)
    RecvCopySend,
    /// dst = src
    Copy,
    /// dst = acc + src
    Reduce,
}

impl Op {
    pub const ALL: [Op; 8] = [
        Op::Send,
        Op::Recv,
        Op::RecvReduceCopy,
        Op::RecvReduceSend,
        Op::RecvReduceCopySend,
        Op::RecvCopySend,
        Op::Copy,
        Op::Reduce,
    ];

    pub fn sends(self) -> bool {
        matches!(self, Op::Send | Op::RecvReduceSend | Op::RecvReduceCopySend | Op::RecvCopySend)
    }

    pub fn receives(self) -> bool {
        matches!(self, Op::Recv | Op::RecvReduceCopy | Op::RecvReduceSend | Op::RecvReduceCopySend | Op::RecvCopySend)
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Send => "Send",
            Op::Recv => "Recv",
            Op::RecvReduceCopy => "RecvReduceCopy",
            Op::RecvReduceSend => "RecvReduceSend",
            Op::RecvReduceCopySend => "RecvReduceCopySend",
            Op::RecvCopySend => "RecvCopySend",
            Op::Copy => "Copy",
            Op::Reduce => "Reduce",
        }
    }

    pub fn from_name(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.name() == name)
    }
}

pub const NO_RANK: u32 = u32::MAX;

/// One instruction of one rank. Unused operands are `Operand::NONE`, unused peers `NO_RANK`.
///
/// Laid out by hand: the word-sized fields fill the first 16 bytes and the three 5-byte operands the second 16.
/// A pass that copies an instruction moves it as two 16-byte halves, and a field read back from the copy must lie
/// within one half: an operand across the middle made every such read wait for both stores (a store-forwarding
/// stall that took a quarter of fusion's samples, `perf annotate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Instr {
    pub op: Op,
    pub channel: u8,
    /// Index into `Schedule::spans` (at most `MAX_SPANS` of them).
    pub span: u16,
    pub count: u32,
    pub send_peer: u32,
    pub recv_peer: u32,
    /// Local read: what Send, Copy and Reduce read.
    pub src: Operand,
    /// Local read that incoming data or `src` is reduced with.
    pub acc: Operand,
    /// Local write.
    pub dst: Operand,
}

/// The most source spans a schedule can name: an instruction's span index is 2 bytes.
pub const MAX_SPANS: usize = u16::MAX as usize + 1;

impl Instr {
    /// The local chunk ranges this instruction reads.
    pub fn reads(&self) -> impl Iterator<Item = Operand> + '_ {
        // References, each operand read where it lies: operands copied into an array on the stack are written field
        // by field and read back as words, a store-forwarding stall that took 40% of hazard analysis (perf annotate).
        [&self.src, &self.acc].into_iter().filter(|o| o.buf != BufId::NONE).copied()
    }

    /// The position in its block (index modulo `chunks`) of each chunk range the instruction reads or writes.
    /// A chunk keeps its position wherever it goes, as chunk sizes depend on it (verified per instruction and
    /// per message).
    pub fn positions(&self, chunks: u32) -> impl Iterator<Item = u32> + '_ {
        self.reads().chain(self.dst.get()).map(move |o| o.index % chunks.max(1))
    }

    /// Whether every operand sits at the same position in its block. Most instructions use one index for all their
    /// operands, which settles it without dividing.
    pub fn keeps_position(&self, chunks: u32) -> bool {
        let mut indices = self.reads().chain(self.dst.get()).map(|o| o.index);
        let Some(first) = indices.next() else { return true };
        let chunks = chunks.max(1);
        indices.all(|i| i == first || i % chunks == first % chunks)
    }

    /// The index of the instruction's first operand (what `positions` lists first), if it has one.
    pub fn first_index(&self) -> Option<u32> {
        self.reads().chain(self.dst.get()).next().map(|o| o.index)
    }

    /// The position in its block of the instruction's first operand, if it has one.
    pub fn position(&self, chunks: u32) -> Option<u32> {
        self.first_index().map(|i| i % chunks.max(1))
    }

    pub fn send_peer(&self) -> Option<u32> {
        (self.send_peer != NO_RANK).then_some(self.send_peer)
    }

    pub fn recv_peer(&self) -> Option<u32> {
        (self.recv_peer != NO_RANK).then_some(self.recv_peer)
    }
}

// Schedules of thousands of ranks hold tens of millions of these.
const _: () = assert!(std::mem::size_of::<Instr>() == 32);

/// One rank's instructions in program order, and their dependencies (indices of earlier instructions).
#[derive(Clone, Debug, Default)]
pub struct RankProgram {
    pub instrs: Vec<Instr>,
    /// Where instruction i's dependencies end in `deps`; they start where those of i - 1 end (4 bytes per
    /// instruction, where a start and an end took 8: schedules of thousands of ranks hold tens of millions).
    /// May be empty when no instruction has a dependency: `compacted` (what scheduling keeps) drops it then, as in
    /// every rank of a fused ring, where at p = 4096 the two placements' lists would be 268 MB of zeros. Read it
    /// through `deps_of`; `expand_deps` restores an entry per instruction for passes that rewrite it.
    pub dep_ends: Vec<u32>,
    pub deps: Vec<u32>,
}

impl PartialEq for RankProgram {
    fn eq(&self, other: &Self) -> bool {
        // With no dependencies, `dep_ends` is all zeros or empty: the same program either way.
        self.instrs == other.instrs
            && self.deps == other.deps
            && (self.deps.is_empty() || self.dep_ends == other.dep_ends)
    }
}

impl Eq for RankProgram {}

impl RankProgram {
    pub fn deps_of(&self, i: usize) -> &[u32] {
        if self.deps.is_empty() {
            return &[];
        }
        let start = if i == 0 { 0 } else { self.dep_ends[i - 1] };
        &self.deps[start as usize..self.dep_ends[i] as usize]
    }

    pub fn push(&mut self, instr: Instr, deps: &[u32]) {
        self.expand_deps();
        self.deps.extend_from_slice(deps);
        self.dep_ends.push(self.deps.len() as u32);
        self.instrs.push(instr);
    }

    /// Gives `dep_ends` an entry per instruction, for passes that rewrite it in place.
    pub fn expand_deps(&mut self) {
        if self.dep_ends.len() < self.instrs.len() {
            debug_assert!(self.deps.is_empty(), "only a program without dependencies drops its dep_ends");
            self.dep_ends.resize(self.instrs.len(), 0);
        }
    }

    /// An exact-sized copy, without `dep_ends` when no instruction has a dependency.
    pub fn compacted(&self) -> RankProgram {
        let dep_ends = if self.deps.is_empty() { Vec::new() } else { self.dep_ends.clone() };
        RankProgram { instrs: self.instrs.clone(), dep_ends, deps: self.deps.clone() }
    }

    pub fn len(&self) -> usize {
        self.instrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.instrs.is_empty()
    }

    /// The dependencies turned around: for each instruction, the later ones that depend on it, in order.
    pub fn dependents(&self) -> Dependents {
        let mut dependents = Dependents::default();
        self.dependents_into(&mut dependents);
        dependents
    }

    /// `dependents`, into lists kept from an earlier call (passes that visit rank after rank reuse them).
    pub fn dependents_into(&self, out: &mut Dependents) {
        let Dependents { start, list } = out;
        start.clear();
        start.resize(self.len() + 2, 0);
        // Count into start[d + 2], sum, then fill through start[d + 1]: it ends as the row's end, start[d + 2]'s start.
        for &d in &self.deps {
            start[d as usize + 2] += 1;
        }
        for i in 2..start.len() {
            start[i] += start[i - 1];
        }
        list.clear();
        list.resize(self.deps.len(), 0);
        for i in 0..self.len() {
            for &d in self.deps_of(i) {
                let at = &mut start[d as usize + 1];
                list[*at as usize] = i as u32;
                *at += 1;
            }
        }
        start.pop();
    }
}

/// Each instruction's dependents in compressed rows: `list[start[i]..start[i + 1]]` (`RankProgram::dependents`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dependents {
    pub start: Vec<u32>,
    pub list: Vec<u32>,
}

impl Dependents {
    pub fn of(&self, i: usize) -> &[u32] {
        &self.list[self.start[i] as usize..self.start[i + 1] as usize]
    }
}

/// Where each buffer starts when one rank's buffers are laid end to end, and their total size: how the passes that
/// track every chunk slot of a rank (hazards, races, the simulation) index them.
pub fn slot_bases(buffers: &[BufferDecl]) -> (Vec<u32>, u32) {
    let mut bases = Vec::with_capacity(buffers.len());
    let mut total = 0u32;
    for b in buffers {
        bases.push(total);
        total += b.chunks;
    }
    (bases, total)
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BufferDecl {
    pub name: String,
    pub chunks: u32,
}

/// Per-rank schedules of one algorithm for one binding and placement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub algorithm: String,
    pub collective: Collective,
    pub placement: Placement,
    pub n_ranks: u32,
    pub chunks: u32,
    pub root: u32,
    pub peer: u32,
    pub params: Vec<(String, i64)>,
    /// Indexed by `BufId`: `in`, `out`, then scratch.
    pub buffers: Vec<BufferDecl>,
    pub ranks: Vec<RankProgram>,
    pub spans: Vec<Span>,
}

impl Schedule {
    pub fn buffer(&self, id: BufId) -> &BufferDecl {
        &self.buffers[id.0 as usize]
    }

    pub fn n_instrs(&self) -> usize {
        self.ranks.iter().map(RankProgram::len).sum()
    }

    /// The connections (sender, receiver, channel) the schedule sends on, counted rank by rank: what a runtime
    /// opens a FIFO for.
    pub fn n_connections(&self) -> usize {
        let mut peers: Vec<(u32, u8)> = Vec::new();
        let mut total = 0;
        for program in &self.ranks {
            peers.clear();
            peers.extend(program.instrs.iter().filter_map(|i| i.send_peer().map(|q| (q, i.channel))));
            peers.sort_unstable();
            peers.dedup();
            total += peers.len();
        }
        total
    }

    /// Where `in` and `out` start in the buffer they share, in place; `(0, 0)` out of place.
    pub fn window_offsets(&self, rank: u32) -> (u32, u32) {
        match self.placement {
            Placement::InPlace => self.collective.in_place_offsets(rank, self.chunks),
            Placement::OutOfPlace => (0, 0),
        }
    }

    /// The buffer that holds `in` and `out` in place: the larger of the two (`out` when equal).
    pub fn shared_buffer(&self) -> BufId {
        let (in_chunks, out_chunks) = self.collective.buffer_chunks(self.n_ranks, self.chunks);
        if in_chunks > out_chunks {
            BufId::IN
        } else {
            BufId::OUT
        }
    }

    /// The buffer and offset where the contract's input and output live on `rank`.
    pub fn input_window(&self, rank: u32) -> (BufId, u32) {
        match self.placement {
            Placement::OutOfPlace => (BufId::IN, 0),
            Placement::InPlace => (self.shared_buffer(), self.window_offsets(rank).0),
        }
    }

    pub fn output_window(&self, rank: u32) -> (BufId, u32) {
        match self.placement {
            Placement::OutOfPlace => (BufId::OUT, 0),
            Placement::InPlace => (self.shared_buffer(), self.window_offsets(rank).1),
        }
    }

    pub fn line_of(&self, source: &str, span: usize) -> usize {
        crate::diag::line_at(source, self.spans.get(span).map_or(0, |s| s.start as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::{BufId, Instr, Op, Operand, RankProgram, NO_RANK};

    fn reduce(src: u32, acc: u32, dst: u32) -> Instr {
        Instr {
            op: Op::Reduce,
            channel: 0,
            count: 1,
            src: Operand::new(BufId::IN, src),
            acc: Operand::new(BufId::OUT, acc),
            dst: Operand::new(BufId::OUT, dst),
            send_peer: NO_RANK,
            recv_peer: NO_RANK,
            span: 0,
        }
    }

    /// Equal indices settle it without dividing; different indices are compared modulo the chunks per block.
    #[test]
    fn keeps_position_compares_indices_modulo_the_block() {
        assert!(reduce(3, 3, 3).keeps_position(4));
        assert!(reduce(1, 5, 9).keeps_position(4));
        assert!(!reduce(1, 5, 6).keeps_position(4));
        assert!(!reduce(2, 2, 3).keeps_position(4));
        assert_eq!(reduce(6, 2, 2).position(4), Some(2));
    }

    /// A program without dependencies drops its `dep_ends` when compacted and stays equal to itself; one with
    /// dependencies keeps them; pushing a dependency onto a compacted program gives back every entry.
    #[test]
    fn a_compacted_program_keeps_its_dependencies() {
        let mut free = RankProgram::default();
        free.push(reduce(0, 0, 0), &[]);
        free.push(reduce(1, 1, 1), &[]);
        let compact = free.compacted();
        assert!(compact.dep_ends.is_empty());
        assert_eq!(compact, free);
        assert_eq!(compact.deps_of(1), &[] as &[u32]);
        let mut grown = compact.clone();
        grown.push(reduce(0, 0, 2), &[0, 1]);
        assert_eq!(grown.dep_ends, vec![0, 0, 2]);
        assert_eq!((grown.deps_of(0), grown.deps_of(2)), (&[] as &[u32], &[0u32, 1][..]));
        assert_eq!(grown.compacted(), grown);
        assert_eq!(grown.compacted().dep_ends.len(), 3);
        assert_ne!(grown, free);
    }
}
