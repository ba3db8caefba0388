//! Scheduling: `ir::Program` -> `Schedule` for one placement. Maps the algorithm's `in`/`out` onto physical
//! buffers (renaming for out-of-place calls), splits each transfer into per-rank instructions and keeps only the
//! dependencies that read-after-write, write-after-read and write-after-write hazards require.
//!
//! Ranks are built one at a time, from the transfers that name them, so one rank's unscheduled instructions are all
//! that exist at once (with thousands of ranks, all of them would be gigabytes, written in thousands of places at
//! once). The mapping of a slot depends only on the writes to its own rank, so each rank replays it alone; only
//! where a transfer must be cut (its chunks are contiguous on one side and not on the other) needs both sides, and a
//! first pass over the whole program finds those cuts.

use super::hazards::add_dependencies;
use super::index::{TransferIndex, GATHER_BLOCK};
use super::{BufId, BufferDecl, Instr, Op, Operand, Placement, RankProgram, Schedule, NO_RANK};
use crate::ir::{Buf, Loc, Program, Transfer, TransferKind};

/// Builds the per-rank schedule of `program` for `placement`.
pub fn schedule(program: &Program, placement: Placement) -> Schedule {
    schedule_with(program, placement, add_dependencies)
}

/// `schedule` with `pass` in place of `add_dependencies`: each rank's instructions go to `pass` as soon as they are
/// mapped (while they are in cache), without dependencies, and `pass` must derive them (`optimise::fuse_new_rank`
/// derives them and fuses in one go).
pub fn schedule_with(
    program: &Program,
    placement: Placement,
    pass: impl FnMut(&mut RankProgram, &[BufferDecl]),
) -> Schedule {
    let layout = Layout::new(program, placement);
    let index = TransferIndex::new(program);
    let ranks = schedule_ranks(program, std::slice::from_ref(&layout), &index, 0..program.n_ranks, pass);
    layout.assemble(program, ranks.into_iter().next().expect("one list per layout"))
}

/// How `program` maps onto one placement's buffers: where transfers are cut (the first pass over the whole program),
/// the buffers, and the mapper that replays each rank. Made once per placement; the ranks can then be built in
/// parts (`schedule_ranks`), each part with a mapper of its own, and put together with `assemble`.
pub struct Layout {
    placement: Placement,
    mapper: Mapper,
    cuts: Cuts,
    buffers: Vec<BufferDecl>,
}

impl Layout {
    /// Whether making the layout of `program` for `placement` replays the whole program to find where transfers
    /// must be cut (one pass over every transfer, which nothing else can do meanwhile).
    /// In place, every chunk run maps to one contiguous run. Out of place, only a transfer of two or more chunks can
    /// be cut, and where every rank's output window is its whole view no slot lives in `_work`: then the replay
    /// would find nothing (the ring AllReduce at p = 1024: 56 ms).
    pub fn needs_cut_pass(program: &Program, placement: Placement) -> bool {
        match placement {
            Placement::InPlace => false,
            Placement::OutOfPlace if program.max_count > 1 => true,
            Placement::OutOfPlace => {
                let (in_chunks, out_chunks) = program.buffer_chunks();
                let output_is_the_view = out_chunks >= in_chunks
                    && (0..program.n_ranks)
                        .all(|rank| program.collective.in_place_offsets(rank, program.chunks).1 == 0);
                !output_is_the_view
            }
        }
    }

    pub fn new(program: &Program, placement: Placement) -> Self {
        let mut mapper = Mapper::new(program, placement);
        let cuts = mapper.find_cuts(program);
        let buffers = mapper.buffer_decls(program);
        Layout { placement, mapper, cuts, buffers }
    }

    /// The schedule of `program` whose rank programs are `ranks`, rank 0 first (built from this layout).
    pub fn assemble(&self, program: &Program, ranks: Vec<RankProgram>) -> Schedule {
        Schedule {
            algorithm: program.name.clone(),
            collective: program.collective,
            placement: self.placement,
            n_ranks: program.n_ranks,
            chunks: program.chunks,
            root: program.root,
            peer: program.peer,
            params: program.params.clone(),
            buffers: self.buffers.clone(),
            ranks,
            spans: program.spans.clone(),
        }
    }
}

/// The programs of ranks `ranks` in each of `layouts` (one list per layout), `pass` run on each as in
/// `schedule_with`, the ranks' transfers found through `index`. A rank's transfers are gathered once for all the
/// layouts: the gather is a cache miss per transfer or two, the rest of a rank's work stays in cache.
pub fn schedule_ranks(
    program: &Program,
    layouts: &[Layout],
    by_rank: &TransferIndex,
    ranks: std::ops::Range<u32>,
    mut pass: impl FnMut(&mut RankProgram, &[BufferDecl]),
) -> Vec<Vec<RankProgram>> {
    let mut mappers: Vec<Mapper> = layouts.iter().map(|layout| layout.mapper.fresh()).collect();
    // One rank's working lists, reused from rank to rank; each rank keeps an exact-sized copy of the result.
    let mut work = RankProgram::default();
    let mut receives = Vec::new();
    let mut gathered: Vec<Vec<(u32, Transfer)>> = (0..GATHER_BLOCK).map(|_| Vec::new()).collect();
    let mut built: Vec<Vec<RankProgram>> = layouts.iter().map(|_| Vec::with_capacity(ranks.len())).collect();
    for rank in ranks.clone() {
        let offset = rank - ranks.start;
        if offset.is_multiple_of(GATHER_BLOCK) {
            by_rank.gather(program, rank..(rank + GATHER_BLOCK).min(ranks.end), &mut gathered);
        }
        let mine = &gathered[(offset % GATHER_BLOCK) as usize];
        for ((layout, mapper), out) in layouts.iter().zip(&mut mappers).zip(&mut built) {
            work.instrs.clear();
            // Within a step nothing depends on anything else, so sends go first: a receive and the send that
            // forwards it in the next step then sit next to each other on their connection and can fuse. Sends go
            // straight to the rank's list, receives after the step's last send.
            for step in mine.chunk_by(|a, b| a.1.step == b.1.step) {
                for (t, transfer) in step {
                    mapper.rank_side(rank, transfer, layout.cuts.of(*t), &mut work.instrs, &mut receives);
                }
                work.instrs.append(&mut receives);
            }
            mapper.final_copies(rank, &mut work.instrs);
            pass(&mut work, &layout.buffers);
            out.push(work.compacted());
        }
    }
    built
}

/// Where transfers are cut into several instructions: `(transfer, first chunk of a later piece)`, in order.
struct Cuts(Vec<(u32, u32)>);

impl Cuts {
    fn of(&self, transfer: u32) -> &[(u32, u32)] {
        // Most programs cut nothing (1.1% of `collc check allreduce/ring --ranks 1024` went to searching nothing).
        if self.0.is_empty() {
            return &[];
        }
        let start = self.0.partition_point(|&(t, _)| t < transfer);
        let end = start + self.0[start..].partition_point(|&(t, _)| t == transfer);
        &self.0[start..end]
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
    n_scratch: u8,
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
            // At most `BufId::MAX_SCRATCH`, which lowering enforces.
            n_scratch: program.scratch.len() as u8,
            written,
            work_used: false,
            collective: program.collective,
            pieces: Vec::new(),
        }
    }

    /// A mapper for another part of the ranks, nothing written yet: a fresh `written` (zeroed as first touched)
    /// rather than a copy of one that holds only zeros (16 MB per placement at p = 4096).
    fn fresh(&self) -> Mapper {
        Mapper { written: vec![false; self.written.len()], pieces: Vec::new(), ..*self }
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

    /// The first pass, out of place only (in place, every chunk run maps to one contiguous run): maps every
    /// transfer in program order, as `rank_side` will, and notes where a transfer's physical ranges stop being
    /// contiguous on either side, and whether `_work` is needed. Then it forgets what was written, so that
    /// `rank_side` can replay each rank from the start.
    fn find_cuts(&mut self, program: &Program) -> Cuts {
        let mut cuts = Vec::new();
        if !Layout::needs_cut_pass(program, self.placement) {
            return Cuts(cuts);
        }
        let mut pieces = std::mem::take(&mut self.pieces);
        for (i, t) in program.transfers.iter().enumerate() {
            let reduce = matches!(t.kind, TransferKind::Send { reduce: true } | TransferKind::Reduce);
            pieces.clear();
            for k in 0..t.count {
                let src = self.read(t.from, t.src, k);
                let acc = if reduce { self.read(t.to, t.dst, k) } else { Operand::NONE };
                pieces.push([src, acc, Operand::NONE]);
            }
            for (k, piece) in pieces.iter_mut().enumerate() {
                piece[2] = self.write(t.to, t.dst, k as u32);
            }
            for k in 1..pieces.len() {
                if !contiguous(&pieces[k - 1], &pieces[k]) {
                    cuts.push((i as u32, k as u32));
                }
            }
        }
        self.pieces = pieces;
        self.written.fill(false);
        Cuts(cuts)
    }

    /// `rank`'s instructions for transfer `t`, one per piece between `cuts`: its send to `sends`, and its receive,
    /// copy or reduce to `receives`. Every read is mapped before any write, as an instruction reads before it writes.
    fn rank_side(
        &mut self,
        rank: u32,
        t: &Transfer,
        cuts: &[(u32, u32)],
        sends: &mut Vec<Instr>,
        receives: &mut Vec<Instr>,
    ) {
        // A transfer of no chunks makes no instruction (lowering rejects empty ranges; this keeps `schedule` total).
        if t.count == 0 {
            return;
        }
        let receives_from = receives.len();
        let starts = std::iter::once(0).chain(cuts.iter().map(|&(_, k)| k));
        let ends = cuts.iter().map(|&(_, k)| k).chain(std::iter::once(t.count));
        for (k0, k1) in starts.clone().zip(ends.clone()) {
            let base = base_instr(t, k1 - k0);
            match t.kind {
                TransferKind::Send { reduce } => {
                    if t.from == rank {
                        let src = self.read(rank, t.src, k0);
                        sends.push(Instr { op: Op::Send, src, send_peer: t.to, ..base });
                    }
                    if t.to == rank {
                        let (op, acc) = match reduce {
                            true => (Op::RecvReduceCopy, self.read(rank, t.dst, k0)),
                            false => (Op::Recv, Operand::NONE),
                        };
                        receives.push(Instr { op, acc, recv_peer: t.from, ..base });
                    }
                }
                TransferKind::Copy => receives.push(Instr { op: Op::Copy, src: self.read(rank, t.src, k0), ..base }),
                TransferKind::Reduce => {
                    let (src, acc) = (self.read(rank, t.src, k0), self.read(rank, t.dst, k0));
                    receives.push(Instr { op: Op::Reduce, src, acc, ..base });
                }
            }
        }
        if t.to != rank {
            return;
        }
        for (piece, (k0, k1)) in starts.zip(ends).enumerate() {
            receives[receives_from + piece].dst = self.write(rank, t.dst, k0);
            for k in k0 + 1..k1 {
                self.write(rank, t.dst, k);
            }
        }
        if t.kind == TransferKind::Copy {
            // A copy onto itself (in place, `in` and `out` are one buffer) is no instruction.
            let mut kept = receives_from;
            for i in receives_from..receives.len() {
                if receives[i].src != receives[i].dst {
                    receives[kept] = receives[i];
                    kept += 1;
                }
            }
            receives.truncate(kept);
        }
    }

    /// Out of place, an output chunk the algorithm never wrote still holds its input: copy it once at the end.
    fn final_copies(&mut self, rank: u32, list: &mut Vec<Instr>) {
        if self.placement == Placement::InPlace {
            return;
        }
        let (input, output) = self.windows(rank);
        let mut run: Option<(u32, u32)> = None;
        for view in output.clone().chain(std::iter::once(u32::MAX)) {
            let copy =
                view != u32::MAX && input.contains(&view) && !self.written[(rank * self.view_chunks + view) as usize];
            match (copy, run) {
                (true, Some((start, len))) if start + len == view => run = Some((start, len + 1)),
                (true, _) => {
                    flush_copy(run, &input, &output, list);
                    run = Some((view, 1));
                }
                (false, _) => {
                    flush_copy(run, &input, &output, list);
                    run = None;
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
