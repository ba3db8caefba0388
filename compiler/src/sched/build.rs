//! Scheduling: `ir::Program` -> `Schedule` for one placement. Maps the algorithm's `in`/`out` onto physical
//! buffers (renaming for out-of-place calls), splits each transfer into per-rank instructions and keeps only the
//! dependencies that read-after-write, write-after-read and write-after-write hazards require.

use super::slots::{SlotHistory, NONE};
use super::{BufId, BufferDecl, Instr, Op, Operand, Placement, RankProgram, Schedule, NO_RANK};
use crate::ir::{Buf, Loc, Program, Transfer, TransferKind};

/// Builds the per-rank schedule of `program` for `placement`.
pub fn schedule(program: &Program, placement: Placement) -> Schedule {
    schedule_with(program, placement, |_, _| {})
}

/// `schedule`, running `pass` on each rank as soon as its dependencies are known (while its instructions are in
/// cache) and then releasing the room the pass freed, so the next rank reuses it instead of faulting in new pages.
pub fn schedule_with(
    program: &Program,
    placement: Placement,
    mut pass: impl FnMut(&mut RankProgram, &[BufferDecl]),
) -> Schedule {
    let mut mapper = Mapper::new(program, placement);
    // Size each rank's list up front: growing thousands of lists at once spends its time copying and faulting pages.
    let mut per_rank = vec![0usize; program.n_ranks as usize];
    for t in &program.transfers {
        per_rank[t.from as usize] += 1;
        per_rank[t.to as usize] += usize::from(t.from != t.to);
    }
    let mut instrs: Vec<Vec<Instr>> = per_rank.iter().map(|&n| Vec::with_capacity(n + 1)).collect();
    // Within a step nothing depends on anything else, so sends go first: a receive and the send that forwards
    // it in the next step then sit next to each other on their connection and can fuse.
    let mut pieces = Vec::new();
    for step in program.transfers.chunk_by(|a, b| a.step == b.step) {
        pieces.clear();
        for t in step {
            mapper.lower_transfer(t, &mut pieces);
        }
        for (t, src, _, _, count) in &pieces {
            emit_send_side(t, *src, *count, &mut instrs);
        }
        for (t, src, acc, dst, count) in &pieces {
            emit_receive_side(t, *src, *acc, *dst, *count, &mut instrs);
        }
    }
    mapper.final_copies(&mut instrs);
    let buffers = mapper.buffer_decls(program);
    let ranks = instrs
        .into_iter()
        .map(|list| {
            let mut rank = with_dependencies(list, &buffers);
            pass(&mut rank, &buffers);
            rank.shrink_to_fit();
            rank
        })
        .collect();
    Schedule {
        algorithm: program.name.clone(),
        collective: program.collective,
        placement,
        n_ranks: program.n_ranks,
        chunks: program.chunks,
        root: program.root,
        peer: program.peer,
        params: program.params.clone(),
        buffers,
        ranks,
        spans: program.spans.clone(),
    }
}

/// Maps logical chunk slots to physical operands. Out of place, a slot not yet written reads `in`, every write goes
/// to `out` (or to the `_work` buffer when the slot lies outside the output window), and later reads follow it.
struct Mapper {
    placement: Placement,
    chunks: u32,
    in_chunks: u32,
    out_chunks: u32,
    /// Size of the shared (in-place) view of `in` and `out`.
    view_chunks: u32,
    shared: BufId,
    n_scratch: u16,
    written: Vec<bool>,
    work_used: bool,
    collective: crate::Collective,
    /// Per-chunk operands of the transfer being lowered, reused to keep allocation off the per-transfer path.
    pieces: Vec<[Operand; 3]>,
}

impl Mapper {
    fn new(program: &Program, placement: Placement) -> Self {
        let (in_chunks, out_chunks) = program.buffer_chunks();
        let view_chunks = in_chunks.max(out_chunks);
        let shared = if in_chunks > out_chunks { BufId::IN } else { BufId::OUT };
        let written = match placement {
            Placement::OutOfPlace => vec![false; program.n_ranks as usize * view_chunks as usize],
            Placement::InPlace => Vec::new(),
        };
        Mapper {
            placement,
            chunks: program.chunks,
            in_chunks,
            out_chunks,
            view_chunks,
            shared,
            n_scratch: program.scratch.len() as u16,
            written,
            work_used: false,
            collective: program.collective,
            pieces: Vec::new(),
        }
    }

    fn work_buf(&self) -> BufId {
        BufId(BufId::FIRST_SCRATCH.0 + self.n_scratch)
    }

    /// Position of a logical `in`/`out` chunk in the shared view of `rank`.
    fn view_index(&self, rank: u32, buf: Buf, index: u32) -> u32 {
        let (in_off, out_off) = self.collective.in_place_offsets(rank, self.chunks);
        if buf == Buf::In {
            in_off + index
        } else {
            out_off + index
        }
    }

    fn windows(&self, rank: u32) -> (std::ops::Range<u32>, std::ops::Range<u32>) {
        let (in_off, out_off) = self.collective.in_place_offsets(rank, self.chunks);
        (in_off..in_off + self.in_chunks, out_off..out_off + self.out_chunks)
    }

    fn home(&mut self, rank: u32, view: u32) -> Operand {
        let (_, out) = self.windows(rank);
        if out.contains(&view) {
            Operand::new(BufId::OUT, view - out.start)
        } else {
            self.work_used = true;
            Operand::new(self.work_buf(), view)
        }
    }

    fn read(&mut self, rank: u32, loc: Loc, k: u32) -> Operand {
        let Buf::Scratch(s) = loc.buf else {
            let view = self.view_index(rank, loc.buf, loc.index + k);
            if self.placement == Placement::InPlace {
                return Operand::new(self.shared, view);
            }
            let (input, _) = self.windows(rank);
            if !self.written[(rank * self.view_chunks + view) as usize] && input.contains(&view) {
                return Operand::new(BufId::IN, view - input.start);
            }
            return self.home(rank, view);
        };
        Operand::new(BufId(BufId::FIRST_SCRATCH.0 + s), loc.index + k)
    }

    fn write(&mut self, rank: u32, loc: Loc, k: u32) -> Operand {
        let Buf::Scratch(s) = loc.buf else {
            let view = self.view_index(rank, loc.buf, loc.index + k);
            if self.placement == Placement::InPlace {
                return Operand::new(self.shared, view);
            }
            self.written[(rank * self.view_chunks + view) as usize] = true;
            return self.home(rank, view);
        };
        Operand::new(BufId(BufId::FIRST_SCRATCH.0 + s), loc.index + k)
    }

    /// Emits the instructions of one transfer, split where its chunks do not map to contiguous physical ranges.
    fn lower_transfer<'t>(&mut self, t: &'t Transfer, out: &mut Vec<Piece<'t>>) {
        let reduce = matches!(t.kind, TransferKind::Send { reduce: true } | TransferKind::Reduce);
        let mut pieces = std::mem::take(&mut self.pieces);
        pieces.clear();
        for k in 0..t.count {
            let src = self.read(t.from, t.src, k);
            let acc = if reduce { self.read(t.to, t.dst, k) } else { Operand::NONE };
            pieces.push([src, acc, Operand::NONE]);
        }
        for (k, piece) in pieces.iter_mut().enumerate() {
            piece[2] = self.write(t.to, t.dst, k as u32);
        }
        let mut start = 0;
        while start < pieces.len() {
            let mut end = start + 1;
            while end < pieces.len() && contiguous(&pieces[end - 1], &pieces[end]) {
                end += 1;
            }
            let [src, acc, dst] = pieces[start];
            out.push((t, src, acc, dst, (end - start) as u32));
            start = end;
        }
        self.pieces = pieces;
    }

    /// Out of place, an output chunk the algorithm never wrote still holds its input: copy it once at the end.
    fn final_copies(&mut self, instrs: &mut [Vec<Instr>]) {
        if self.placement == Placement::InPlace {
            return;
        }
        for rank in 0..instrs.len() as u32 {
            let (input, output) = self.windows(rank);
            let mut run: Option<(u32, u32)> = None;
            for view in output.clone().chain(std::iter::once(u32::MAX)) {
                let copy = view != u32::MAX
                    && input.contains(&view)
                    && !self.written[(rank * self.view_chunks + view) as usize];
                match (copy, run) {
                    (true, Some((start, len))) if start + len == view => run = Some((start, len + 1)),
                    (true, _) => {
                        flush_copy(run, &input, &output, &mut instrs[rank as usize]);
                        run = Some((view, 1));
                    }
                    (false, _) => {
                        flush_copy(run, &input, &output, &mut instrs[rank as usize]);
                        run = None;
                    }
                }
            }
        }
    }

    fn buffer_decls(&self, program: &Program) -> Vec<BufferDecl> {
        let mut decls = vec![
            BufferDecl { name: "in".into(), chunks: self.in_chunks },
            BufferDecl { name: "out".into(), chunks: self.out_chunks },
        ];
        decls.extend(program.scratch.iter().map(|s| BufferDecl { name: s.name.clone(), chunks: s.chunks }));
        if self.work_used {
            decls.push(BufferDecl { name: "_work".into(), chunks: self.view_chunks });
        }
        decls
    }
}

fn flush_copy(
    run: Option<(u32, u32)>,
    input: &std::ops::Range<u32>,
    output: &std::ops::Range<u32>,
    list: &mut Vec<Instr>,
) {
    let Some((view, count)) = run else { return };
    list.push(Instr {
        op: Op::Copy,
        channel: 0,
        count,
        src: Operand::new(BufId::IN, view - input.start),
        acc: Operand::NONE,
        dst: Operand::new(BufId::OUT, view - output.start),
        send_peer: NO_RANK,
        recv_peer: NO_RANK,
        span: 0,
    });
}

fn next_of(a: Operand, b: Operand) -> bool {
    a.buf == b.buf && (a.get().is_none() || a.index + 1 == b.index)
}

fn contiguous(a: &[Operand; 3], b: &[Operand; 3]) -> bool {
    (0..3).all(|i| next_of(a[i], b[i]))
}

/// A transfer's contiguous part: the transfer, its physical source, accumulator, destination and chunk count.
type Piece<'t> = (&'t Transfer, Operand, Operand, Operand, u32);

fn base_instr(t: &Transfer, count: u32) -> Instr {
    Instr {
        op: Op::Copy,
        channel: t.channel,
        count,
        src: Operand::NONE,
        acc: Operand::NONE,
        dst: Operand::NONE,
        send_peer: NO_RANK,
        recv_peer: NO_RANK,
        span: t.span,
    }
}

fn emit_send_side(t: &Transfer, src: Operand, count: u32, instrs: &mut [Vec<Instr>]) {
    if let TransferKind::Send { .. } = t.kind {
        instrs[t.from as usize].push(Instr { op: Op::Send, src, send_peer: t.to, ..base_instr(t, count) });
    }
}

fn emit_receive_side(t: &Transfer, src: Operand, acc: Operand, dst: Operand, count: u32, instrs: &mut [Vec<Instr>]) {
    let base = base_instr(t, count);
    match t.kind {
        TransferKind::Send { reduce } => {
            let op = if reduce { Op::RecvReduceCopy } else { Op::Recv };
            instrs[t.to as usize].push(Instr { op, acc, dst, recv_peer: t.from, ..base });
        }
        TransferKind::Copy if src == dst => {}
        TransferKind::Copy => instrs[t.from as usize].push(Instr { op: Op::Copy, src, dst, ..base }),
        TransferKind::Reduce => instrs[t.from as usize].push(Instr { op: Op::Reduce, src, acc, dst, ..base }),
    }
}

/// Per-slot hazard state of one rank, reused across ranks.
struct Hazards {
    base: Vec<u32>,
    history: SlotHistory,
}

impl Hazards {
    fn new(buffers: &[BufferDecl]) -> Self {
        let (base, total) = super::slot_bases(buffers);
        Hazards { base, history: SlotHistory::new(total as usize) }
    }

    fn slots(&self, op: Operand, count: u32) -> std::ops::Range<usize> {
        let start = (self.base[op.buf.0 as usize] + op.index) as usize;
        start..start + count as usize
    }
}

/// Computes each instruction's dependencies from the hazards on the slots it reads and writes.
pub(crate) fn with_dependencies(instrs: Vec<Instr>, buffers: &[BufferDecl]) -> RankProgram {
    thread_local! {
        static STATE: std::cell::RefCell<Option<(Vec<BufferDecl>, Hazards)>> = const { std::cell::RefCell::new(None) };
    }
    STATE.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.as_ref().is_none_or(|(decls, _)| decls != buffers) {
            *cell = Some((buffers.to_vec(), Hazards::new(buffers)));
        }
        let hazards = &mut cell.as_mut().expect("just set").1;
        let program = dependencies_with(instrs, hazards);
        hazards.history.reset();
        program
    })
}

fn dependencies_with(instrs: Vec<Instr>, h: &mut Hazards) -> RankProgram {
    let mut dep_ranges = Vec::with_capacity(instrs.len());
    let mut all_deps = Vec::with_capacity(instrs.len() * 2);
    let mut deps = Vec::new();
    for (i, instr) in instrs.iter().enumerate() {
        let i = i as u32;
        deps.clear();
        for read in instr.reads() {
            for slot in h.slots(read, instr.count) {
                deps.push(h.history.last_writer(slot));
            }
        }
        if let Some(dst) = instr.dst.get() {
            for slot in h.slots(dst, instr.count) {
                deps.push(h.history.last_writer(slot));
                deps.extend(h.history.readers(slot).filter(|&r| r != i));
            }
        }
        deps.retain(|&d| d != NONE);
        deps.sort_unstable();
        deps.dedup();
        for read in instr.reads() {
            for slot in h.slots(read, instr.count) {
                h.history.read(slot, i);
            }
        }
        if let Some(dst) = instr.dst.get() {
            for slot in h.slots(dst, instr.count) {
                h.history.write(slot, i);
            }
        }
        let start = all_deps.len() as u32;
        all_deps.extend_from_slice(&deps);
        dep_ranges.push((start, all_deps.len() as u32));
    }
    RankProgram { instrs, dep_ranges, deps: all_deps }
}
