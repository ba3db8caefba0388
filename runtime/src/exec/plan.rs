//! A `Plan`: one rank's part of a verified schedule, prepared for one call shape (count, dtype, op) so that running
//! it allocates nothing. Instructions become steps with element offsets for every chunk they touch, connections
//! become link ends (which the transport's `Fabric` opens), scratch buffers are allocated, and the message is cut
//! into tiles.
//!
//! Tiles: every chunk slot has the same padded capacity `ceil(count / C)` elements; tile `t` is the element range
//! `[t*E, (t+1)*E)` of every chunk, and a call runs the whole schedule once per tile. Each run is the verified
//! schedule on smaller data, so matching, ordering and deadlock freedom carry over; consecutive runs overlap on the
//! FIFOs, which pipelines them. A chunk of a user buffer may hold fewer elements than the capacity (the remainder of
//! `count` is spread over the first chunks): only its valid elements are read or written, and a scratch chunk holds as
//! many as a user chunk at its position in a block.

use crate::error::RuntimeError;
use crate::layout::ChunkLayout;
use crate::link::LinkEnd;
use collc_compiler::emit::SchedLines;
use collc_compiler::fxhash::FxBuildHasher;
use collc_compiler::replicas::OutOfOrder;
use collc_compiler::sched::{BufId, Op, Operand, Placement, RankProgram};
use collc_compiler::{Collective, VerifiedSchedule};
use collc_kernels::host::Factor;
use collc_kernels::operator::UserOp;
use collc_kernels::{DataType, ReduceOp};
use std::collections::HashMap;

pub(crate) const NONE: u16 = u16::MAX;
/// Messages from this size up write their results with non-temporal stores: about the size where a ring
/// allreduce of two ranks stops fitting the last-level cache share of a rank.
const STREAMING_BYTES: usize = 8 << 20;
pub(crate) const NO_BUF: u8 = u8::MAX;

/// Where one chunk of an operand lives: buffer, first element, and how many elements of the capacity are valid.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Place {
    pub buf: u8,
    /// Under PreMulSum, a read of this rank's input as it came (`input_as_it_came`): multiplied by the rank's factor.
    pub raw: bool,
    pub offset: usize,
    pub valid: usize,
}

impl Place {
    const NONE: Place = Place { buf: NO_BUF, raw: false, offset: 0, valid: 0 };
}

/// One instruction of this rank.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Step {
    pub op: Op,
    /// The schedule's channel: the device executor runs a block per channel.
    pub channel: u8,
    /// Chunks it moves; its pieces are `pieces[first_piece..first_piece + n]`.
    pub n: u32,
    pub first_piece: u32,
    /// Indices into `Plan::links`, `NONE` if unused.
    pub send: u16,
    pub recv: u16,
    /// Its position among this rank's instructions on `send` / `recv`.
    pub send_pos: u32,
    pub recv_pos: u32,
    /// A `Send` whose source no later step writes (`VerifiedSchedule::sources_that_stay`): over a link that shares
    /// memory, its message may carry the source's addresses in place of its bytes.
    pub by_reference: bool,
    /// It receives what such a `Send` of its peer sends: the device executors, which decide when they encode a plan
    /// whether a message goes by reference, read it where it is on a link both ends' memory is on.
    pub recv_by_reference: bool,
}

/// The src, acc and dst of one chunk of a step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Piece {
    pub src: Place,
    pub acc: Place,
    pub dst: Place,
}

/// How a step is named in errors and traces: index, instruction, `.coll` line, and its operands as scheduled
/// (src, acc, dst; `count` chunks each).
#[derive(Clone, Debug)]
pub(crate) struct StepLabel {
    pub index: usize,
    pub op: Op,
    pub line: usize,
    pub operands: [Operand; 3],
    pub count: u32,
}

pub struct Plan {
    pub(crate) rank: u32,
    pub(crate) n_ranks: u32,
    pub(crate) collective: Collective,
    pub(crate) algorithm: String,
    pub(crate) dtype: DataType,
    pub(crate) op: ReduceOp,
    /// PreMulSum's factor in `dtype`: what the places marked `raw` are multiplied by.
    pub(crate) factor: Option<Factor>,
    pub(crate) elem: usize,
    /// Elements per tile of one chunk, and tiles per call.
    pub(crate) tile: usize,
    pub(crate) n_tiles: usize,
    pub(crate) capacity: usize,
    /// Whether results go to user buffers with non-temporal stores (messages larger than the caches).
    pub(crate) streaming: bool,
    pub(crate) steps: Vec<Step>,
    pub(crate) pieces: Vec<Piece>,
    pub(crate) labels: Vec<StepLabel>,
    pub(crate) dependents_start: Vec<u32>,
    pub(crate) dependents: Vec<u32>,
    pub(crate) unmet_at_start: Vec<u32>,
    pub(crate) roots: Vec<u32>,
    /// The connections this rank sends or receives on, in the order steps name them.
    pub(crate) links: Vec<LinkEnd>,
    pub(crate) peers: Vec<u32>,
    /// The storage of the scratch buffers, which `bases[2..]` point into (64-byte aligned).
    _scratch: Vec<Vec<u8>>,
    /// Elements the user's `in` and `out` must hold.
    pub(crate) user_elements: [usize; 2],
    /// The output window, for the `avg` epilogue: buffer and element range.
    pub(crate) output: (u8, std::ops::Range<usize>),
    /// PreMulSum's epilogue: the ranges of the output window that still hold the rank's input (`Translated`).
    pub(crate) unscaled: Vec<std::ops::Range<usize>>,
    /// The call shape and the schedule's hash: every rank of a matching call computes the same value.
    pub(crate) fingerprint: u64,
    /// Where the schedule came from and its hash, as mismatch reports name it:
    /// `ring.sched (.sched file; schedule 0123456789abcdef)`.
    pub(crate) source: String,
    // Per-call state, kept here so running allocates nothing.
    pub(crate) unmet: Vec<u32>,
    pub(crate) fired_on: Vec<u32>,
    pub(crate) waiting: Vec<u32>,
    /// The tile being run, and the algorithm's index in the flight recorder.
    pub(crate) at_tile: usize,
    pub(crate) recorded_as: u32,
    /// Channels of the whole schedule (every rank's), set by the communicator: the device executors' lanes.
    pub(crate) channels: u32,
    /// The largest slot any connection of the schedule needs in this call (the same on every rank).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) widest_slot: usize,
    /// Where each buffer starts: `in` and `out` set by each call, scratch when the plan is prepared.
    pub(crate) bases: Vec<*mut u8>,
    /// Whether a host transport runs it compiled (`exec/jit.rs`), set by the communicator.
    pub(crate) jit: bool,
    /// The schedule's buffer names, for the operands a trace shows.
    pub(crate) buffer_names: Vec<String>,
    /// The communicator's run trace, set by it (`crate::trace`); the executors record the calls it records.
    pub(crate) tracer: Option<std::sync::Arc<crate::trace::Tracer>>,
    /// Its instructions as a trace names them, made at the first recorded call.
    pub(crate) trace_instrs: Option<std::sync::Arc<[crate::trace::InstrInfo]>>,
}

unsafe impl Send for Plan {}

impl Plan {
    /// `src=out[1] dst=out[1] n=2`: a step's operands as the `.sched` text writes them.
    pub(crate) fn operands_text(&self, label: &StepLabel) -> String {
        let mut text = Vec::new();
        for (key, operand) in ["src", "acc", "dst"].into_iter().zip(label.operands) {
            if let Some(operand) = operand.get() {
                let name = self.buffer_names.get(operand.buf.0 as usize).map_or("?", String::as_str);
                text.push(format!("{key}={name}[{}]", { operand.index }));
            }
        }
        if label.count != 1 {
            text.push(format!("n={}", label.count));
        }
        text.join(" ")
    }
}

/// The text a schedule came from, for the lines errors name: its `.coll` source (the schedule's spans point into
/// it), or the `.sched` file it was read from (each instruction's own line there).
#[derive(Clone, Copy)]
pub enum Origin<'a> {
    Coll(&'a str),
    Sched(&'a SchedLines),
}

impl Origin<'_> {
    fn line(self, sched: &VerifiedSchedule, rank: u32, index: usize) -> usize {
        match self {
            Origin::Coll(source) => sched.line_of(source, sched.ranks[rank as usize].instrs[index].span.into()),
            Origin::Sched(lines) => lines.line(rank, index) as usize,
        }
    }
}

/// What `prepare` needs besides the schedule.
pub(crate) struct PlanInput<'a> {
    /// How errors name the algorithm: its library name or file.
    pub name: &'a str,
    /// What the name is: `library algorithm`, `.coll source`, `.sched file`.
    pub name_is: &'a str,
    pub rank: u32,
    pub count: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub origin: Origin<'a>,
    /// The largest FIFO slot (`Options::slot_cap`): it sets the tile.
    pub slot_cap: usize,
    /// Whether sends whose source stays may go by reference (`Backend::single_copy_max_bytes`).
    pub single_copy: bool,
    /// The transport's name and the message slots per connection of its links (`Fabric::slots`).
    pub transport: &'static str,
    pub slots: u32,
}

pub(crate) fn prepare(sched: &VerifiedSchedule, input: PlanInput) -> Result<Plan, RuntimeError> {
    let PlanInput { name, name_is, rank, count, dtype, op, origin, slot_cap, single_copy, transport, slots } = input;
    if sched.channel_slots() > slots {
        let proved = sched.channel_slots();
        return Err(RuntimeError::Slots { name: name.to_string(), proved, transport, slots });
    }
    let elem = dtype.size_bytes();
    // A collective that reduces nothing ignores its operator, as NCCL does.
    let factor = match op.factor().filter(|_| sched.collective.reduces()) {
        Some(scalar) => Some(Factor::of(dtype, scalar).map_err(|source| RuntimeError::Factor { rank, source })?),
        None => None,
    };
    if let ReduceOp::User(user) = op {
        if sched.collective.reduces() {
            check_operator(sched, name, rank, user, dtype)?;
        }
    }
    let capacity = count.div_ceil(sched.chunks.max(1) as usize);
    count
        .checked_mul(elem)
        .and_then(|b| b.checked_mul(sched.n_ranks as usize))
        .ok_or(RuntimeError::CountOverflow { count, elem })?;
    let layout = ChunkLayout::new(count, sched.chunks);
    let (tile, n_tiles, widest) = tiles(sched, elem, capacity, slot_cap)?;
    let Translated { unscaled, mut steps, pieces, labels, links } =
        translate(sched, rank, origin, &layout, capacity, tile * elem, factor.is_some());
    match single_copy {
        true => received_by_reference(sched, rank, &mut steps, &links),
        false => steps.iter_mut().for_each(|step| step.by_reference = false),
    }
    let (dependents_start, dependents, unmet_at_start) = dependents_of(&sched.ranks[rank as usize]);
    let roots = (0..steps.len() as u32).filter(|&i| unmet_at_start[i as usize] == 0).collect();
    let (bases, scratch) = scratch_buffers(sched, capacity * elem);
    let user_elements = user_elements(sched, &layout);
    let (_, out_chunks) = sched.collective.buffer_chunks(sched.n_ranks, sched.chunks);
    let (out_buf, out_offset) = sched.output_window(rank);
    let output = (out_buf.0, layout.elements(out_offset, out_chunks));
    let mut peers: Vec<u32> = links.iter().map(|f| if f.from == rank { f.to } else { f.from }).collect();
    peers.sort_unstable();
    peers.dedup();
    let (n_steps, n_links) = (steps.len(), links.len());
    Ok(Plan {
        rank,
        n_ranks: sched.n_ranks,
        collective: sched.collective,
        algorithm: name.to_string(),
        dtype,
        op,
        factor,
        elem,
        tile,
        n_tiles,
        capacity,
        streaming: (user_elements[0].max(user_elements[1]) * elem) >= STREAMING_BYTES,
        steps,
        pieces,
        labels,
        dependents_start,
        dependents,
        unmet_at_start,
        roots,
        links,
        peers,
        _scratch: scratch,
        user_elements,
        output,
        unscaled,
        fingerprint: fingerprint(sched, count, dtype, op),
        source: format!("{name} ({name_is}; schedule {:016x})", sched.hash()),
        unmet: vec![0; n_steps],
        fired_on: vec![0; n_links],
        waiting: Vec::with_capacity(n_steps),
        at_tile: 0,
        recorded_as: 0,
        channels: 1,
        widest_slot: (widest * tile * elem).next_power_of_two(),
        bases,
        jit: false,
        buffer_names: sched.buffers.iter().map(|b| b.name.clone()).collect(),
        tracer: None,
        trace_instrs: None,
    })
}

/// A user's operator must type on the call's data type (it is compiled for it here, once per process), and one that
/// is not commutative and associative runs only on a schedule that reduces every output chunk as a chain in rank
/// order (docs/language.md §16).
fn check_operator(
    sched: &VerifiedSchedule,
    name: &str,
    rank: u32,
    user: UserOp,
    dtype: DataType,
) -> Result<(), RuntimeError> {
    let fail = |message: String| Err(RuntimeError::Operator { rank, message });
    let prepared = match user.prepare(dtype) {
        Ok(prepared) => prepared,
        Err(e) => {
            let op = user.name();
            return fail(format!("the operator `{op}` does not type on {dtype}: {e}; pass a data type it types on"));
        }
    };
    let Err(why) = prepared.reorderable() else { return Ok(()) };
    match collc_compiler::replicas::in_rank_order(sched) {
        Ok(()) => Ok(()),
        Err(OutOfOrder { rank: at, chunk }) => fail(format!(
            "{why}; {name} reduces output chunk {chunk} of rank {at} in another order than a chain in rank order \
             ((x0 ⊕ x1) ⊕ x2 ...), the only order such an operator computes the collective in: run an algorithm \
             that reduces in rank order (allreduce/naive)"
        )),
    }
}

/// Elements per tile of one chunk, tiles per call, and the chunks of the widest message. Every rank must cut a call
/// into the same tiles, so the widest message of any rank sets the tile size.
fn tiles(
    sched: &VerifiedSchedule,
    elem: usize,
    capacity: usize,
    slot_cap: usize,
) -> Result<(usize, usize, usize), RuntimeError> {
    let max_n = sched.ranks.iter().flat_map(|p| &p.instrs).map(|i| i.count as usize).max().unwrap_or(1).max(1);
    if slot_cap < max_n * elem {
        return Err(RuntimeError::Config(format!(
            "FIFO slots of {slot_cap} bytes cannot hold one element of each of the {max_n} chunks one message \
             carries; raise COLLC_SLOT_BYTES"
        )));
    }
    let tile = (slot_cap / (max_n * elem)).min(capacity).max(1);
    Ok((tile, capacity.div_ceil(tile), max_n))
}

/// One rank's instructions as the executor runs them.
struct Translated {
    /// Under PreMulSum, the element ranges of the output window no instruction wrote: they still hold the rank's own
    /// input (one rank's reduction), which the end of the call multiplies by the factor.
    unscaled: Vec<std::ops::Range<usize>>,
    steps: Vec<Step>,
    pieces: Vec<Piece>,
    labels: Vec<StepLabel>,
    links: Vec<LinkEnd>,
}

/// `rank`'s instructions as steps with the element places of every chunk they touch, and its connections, each
/// step with its position on them. A connection's slots hold its largest message, `tile_bytes` per chunk: both
/// ends size it alike, as the verifier matched each send with a receive of the same chunk count. With `premul`, the
/// places that read the rank's input as it came are marked `raw`.
fn translate(
    sched: &VerifiedSchedule,
    rank: u32,
    origin: Origin,
    layout: &ChunkLayout,
    capacity: usize,
    tile_bytes: usize,
    premul: bool,
) -> Translated {
    // A user buffer's chunk j sits in block j / C at the chunk layout's offset. A scratch chunk is stored padded to
    // the capacity but holds as many elements as a user chunk at its position in a block (the memory model's chunk
    // shape), so every operand of an instruction has the same valid length and none is read past a user buffer.
    let chunks = sched.chunks.max(1);
    let place = |operand: Operand, k: u32| -> Place {
        let Some(operand) = operand.get() else { return Place::NONE };
        let j = operand.index + k;
        if operand.buf.0 < 2 {
            let elements = layout.elements(j, 1);
            Place { buf: operand.buf.0, raw: false, offset: elements.start, valid: elements.len() }
        } else {
            let valid = layout.elements(j % chunks, 1).len();
            Place { buf: operand.buf.0, raw: false, offset: j as usize * capacity, valid }
        }
    };
    let mut input = InputAsItCame::new(sched, rank);
    let program = &sched.ranks[rank as usize];
    let stays = sched.sources_that_stay(rank);
    let mut connections = connections_of(program, rank);
    let mut links: Vec<LinkEnd> = Vec::new();
    let mut link_index = |from: u32, to: u32, channel: u8, links: &mut Vec<LinkEnd>| -> u16 {
        let connection = connections.get_mut(&(from, to, channel)).expect("every connection of the program");
        if let Some(i) = connection.link {
            return i;
        }
        let slot_bytes = (connection.widest as usize * tile_bytes).next_power_of_two();
        links.push(LinkEnd { from, to, channel, slot_bytes });
        connection.link = Some((links.len() - 1) as u16);
        (links.len() - 1) as u16
    };
    let mut steps = Vec::with_capacity(program.len());
    let mut pieces = Vec::new();
    let mut labels = Vec::with_capacity(program.len());
    // Instructions so far on each link. A link is this rank's sending end or its receiving end, never both.
    let mut on_link: Vec<u32> = Vec::new();
    for (index, instr) in program.instrs.iter().enumerate() {
        let send = match instr.send_peer() {
            Some(peer) => link_index(rank, peer, instr.channel, &mut links),
            None => NONE,
        };
        let recv = match instr.recv_peer() {
            Some(peer) => link_index(peer, rank, instr.channel, &mut links),
            None => NONE,
        };
        on_link.resize(links.len(), 0);
        let mut position = |f: u16| {
            if f == NONE {
                return 0;
            }
            on_link[f as usize] += 1;
            on_link[f as usize] - 1
        };
        let (send_pos, recv_pos) = (position(send), position(recv));
        let first_piece = pieces.len() as u32;
        for k in 0..instr.count {
            let mut piece = Piece { src: place(instr.src, k), acc: place(instr.acc, k), dst: place(instr.dst, k) };
            piece.src.raw = premul && input.read(instr.src, k);
            piece.acc.raw = premul && input.read(instr.acc, k);
            pieces.push(piece);
        }
        input.write(instr.dst, instr.count);
        steps.push(Step {
            op: instr.op,
            channel: instr.channel,
            n: instr.count,
            first_piece,
            send,
            recv,
            send_pos,
            recv_pos,
            by_reference: stays[index],
            recv_by_reference: false,
        });
        let (line, operands) = (origin.line(sched, rank, index), [instr.src, instr.acc, instr.dst]);
        labels.push(StepLabel { index, op: instr.op, line, operands, count: instr.count });
    }
    let unscaled = match premul {
        true => input.unwritten_output(sched, rank, layout),
        false => Vec::new(),
    };
    Translated { unscaled, steps, pieces, labels, links }
}

/// Marks each receiving step whose message is a `Send` whose source stays (`sources_that_stay` of the sender): a
/// connection's k-th receive takes its k-th send.
fn received_by_reference(sched: &VerifiedSchedule, rank: u32, steps: &mut [Step], links: &[LinkEnd]) {
    // A peer's program is read once, whatever the channels it sends to this rank on.
    let mut stays_of: HashMap<u32, Vec<bool>, FxBuildHasher> = HashMap::default();
    for (l, end) in links.iter().enumerate().filter(|(_, end)| end.to == rank) {
        let sender = &sched.ranks[end.from as usize];
        let stays = stays_of.entry(end.from).or_insert_with(|| sched.sources_that_stay(end.from));
        let sends: Vec<bool> = (sender.instrs.iter().zip(stays.iter()))
            .filter(|(instr, _)| instr.send_peer() == Some(rank) && instr.channel == end.channel)
            .map(|(_, &stays)| stays)
            .collect();
        for step in steps.iter_mut().filter(|step| step.recv as usize == l) {
            step.recv_by_reference = sends.get(step.recv_pos as usize).copied().unwrap_or(false);
        }
    }
}

/// Which chunks of the buffer that holds a rank's input when a call starts (`in`, or in place the one buffer) still
/// hold it as it came, walking the rank's instructions in program order. The verifier ordered every write of a chunk
/// after the reads before it and before the reads after it, so program order is the order they run in.
///
/// PreMulSum's rule (docs/language.md §13): a read of such a chunk is multiplied by the rank's factor; everything
/// else a rank reads was made from reads that were, so each input enters the sum multiplied once.
struct InputAsItCame {
    buf: BufId,
    written: Vec<bool>,
}

impl InputAsItCame {
    fn new(sched: &VerifiedSchedule, rank: u32) -> Self {
        let (buf, _) = sched.input_window(rank);
        InputAsItCame { buf, written: vec![false; sched.buffers[buf.0 as usize].chunks as usize] }
    }

    /// Whether chunk `k` of `operand` is the input as it came.
    fn read(&self, operand: Operand, k: u32) -> bool {
        operand.get().is_some_and(|o| o.buf == self.buf && !self.written[(o.index + k) as usize])
    }

    fn write(&mut self, operand: Operand, count: u32) {
        if let Some(o) = operand.get().filter(|o| o.buf == self.buf) {
            self.written[o.index as usize..(o.index + count) as usize].fill(true);
        }
    }

    /// The element ranges of the output window still holding the input once every instruction ran, where the
    /// collective defines this rank's output (in place only, and only where the rank's reduction is its own input:
    /// one rank).
    fn unwritten_output(
        &self,
        sched: &VerifiedSchedule,
        rank: u32,
        layout: &ChunkLayout,
    ) -> Vec<std::ops::Range<usize>> {
        let (out_buf, out_offset) = sched.output_window(rank);
        let (_, out_chunks) = sched.collective.buffer_chunks(sched.n_ranks, sched.chunks);
        let defined = |c: u32| {
            let expected = sched.collective.expected(rank, c, sched.chunks, sched.root, sched.peer);
            !matches!(expected, collc_compiler::collective::Expected::Unchecked)
        };
        let mut ranges: Vec<std::ops::Range<usize>> = Vec::new();
        let unwritten = |&c: &u32| defined(c) && out_buf == self.buf && !self.written[(out_offset + c) as usize];
        for c in (0..out_chunks).filter(unwritten) {
            let elements = layout.elements(out_offset + c, 1);
            match ranges.last_mut() {
                Some(last) if last.end == elements.start => last.end = elements.end,
                _ => ranges.push(elements),
            }
        }
        ranges
    }
}

/// One of a rank's connections while its links are laid out.
#[derive(Default)]
struct Connection {
    /// The most chunks one message carries on it.
    widest: u32,
    /// Its index in `Plan::links`, once it has one.
    link: Option<u16>,
}

/// `rank`'s connections, keyed by (sender, receiver, channel).
fn connections_of(program: &RankProgram, rank: u32) -> HashMap<(u32, u32, u8), Connection, FxBuildHasher> {
    let mut connections: HashMap<_, Connection, _> = HashMap::default();
    for instr in &program.instrs {
        let ends = [instr.send_peer().map(|to| (rank, to)), instr.recv_peer().map(|from| (from, rank))];
        for (from, to) in ends.into_iter().flatten() {
            let connection = connections.entry((from, to, instr.channel)).or_default();
            connection.widest = connection.widest.max(instr.count);
        }
    }
    connections
}

impl Plan {
    /// Bytes this rank's instructions read and write in one call (messages in their slots included): what a
    /// memory-bound executor moves, from which the GPU benchmark draws its bound.
    pub fn traffic_bytes(&self) -> u64 {
        let elements = |p: Place| if p.buf == NO_BUF { 0 } else { p.valid.min(self.capacity) as u64 };
        let mut total = 0u64;
        for step in &self.steps {
            let pieces = &self.pieces[step.first_piece as usize..(step.first_piece + step.n) as usize];
            for piece in pieces {
                let (src, acc, dst) = (elements(piece.src), elements(piece.acc), elements(piece.dst));
                // (reads, writes) in elements; a message counts once where it is written and once where it is read.
                let (reads, writes) = match step.op {
                    Op::Send => (src, src),
                    Op::Recv => (dst, dst),
                    Op::RecvReduceCopy => (2 * dst, dst),
                    Op::RecvReduceSend => (2 * acc, acc),
                    Op::RecvReduceCopySend => (2 * dst, 2 * dst),
                    Op::RecvCopySend => (dst, 2 * dst),
                    Op::Copy => (dst, dst),
                    Op::Reduce => (2 * dst, dst),
                };
                total += (reads + writes) * self.elem as u64;
            }
        }
        total
    }

    /// Bytes of each scratch buffer (buffers 2.. of the schedule), for executors that keep scratch elsewhere.
    #[cfg(feature = "cuda")]
    pub(crate) fn scratch_bytes(&self) -> Vec<usize> {
        self._scratch.iter().map(|storage| storage.len() - 64).collect()
    }
}

/// Where each buffer starts (`in` and `out` left null, set per call) and the storage of the scratch buffers, each
/// 64-byte aligned, `chunk_bytes` per chunk (a Vec's heap storage does not move when the plan does).
fn scratch_buffers(sched: &VerifiedSchedule, chunk_bytes: usize) -> (Vec<*mut u8>, Vec<Vec<u8>>) {
    let mut bases = vec![std::ptr::null_mut(); sched.buffers.len()];
    let mut scratch = Vec::with_capacity(sched.buffers.len().saturating_sub(2));
    for (b, decl) in sched.buffers.iter().enumerate().skip(2) {
        let mut storage = vec![0u8; decl.chunks as usize * chunk_bytes + 64];
        let offset = storage.as_ptr().align_offset(64);
        bases[b] = storage[offset..].as_mut_ptr();
        scratch.push(storage);
    }
    (bases, scratch)
}

/// Elements the user's `in` and `out` must hold (in place, only the buffer both share).
fn user_elements(sched: &VerifiedSchedule, layout: &ChunkLayout) -> [usize; 2] {
    let (in_chunks, out_chunks) = sched.collective.buffer_chunks(sched.n_ranks, sched.chunks);
    let block_elements = |chunks_in_buffer: u32| layout.elements(0, chunks_in_buffer).end;
    match sched.placement {
        Placement::OutOfPlace => [block_elements(in_chunks), block_elements(out_chunks)],
        Placement::InPlace => {
            let shared = block_elements(in_chunks.max(out_chunks));
            if sched.shared_buffer() == BufId::IN {
                [shared, 0]
            } else {
                [0, shared]
            }
        }
    }
}

/// Local dependents of each instruction (CSR) and how many dependencies each waits for.
fn dependents_of(program: &RankProgram) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let unmet = (0..program.len()).map(|i| program.deps_of(i).len() as u32).collect();
    let dependents = program.dependents();
    (dependents.start, dependents.list, unmet)
}

/// Identifies a call: its shape and the schedule it runs (`VerifiedSchedule::hash`, which covers every rank's
/// instructions and the slots the schedule was proved with). Every rank of a matching call computes the same value;
/// ranks that run different schedules under one name do not.
fn fingerprint(sched: &VerifiedSchedule, count: usize, dtype: DataType, op: ReduceOp) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut mix = |bytes: &[u8]| {
        for &b in bytes {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    };
    mix(sched.algorithm.as_bytes());
    mix(sched.collective.name().as_bytes());
    mix(&(count as u64).to_le_bytes());
    // Not a premulsum's factor: each rank multiplies its own input by its own. A user's operator by its digest.
    mix(&[dtype as u8, op.nccl_code(), sched.placement as u8]);
    if let ReduceOp::User(user) = op {
        mix(&user.digest().to_le_bytes());
    }
    mix(&sched.root.to_le_bytes());
    mix(&sched.peer.to_le_bytes());
    mix(&sched.chunks.to_le_bytes());
    mix(&sched.hash().to_le_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use collc_compiler::{compile, library, Bindings, Limits, Options};

    fn one_shot(n_ranks: u32) -> VerifiedSchedule {
        let source = library::get("allreduce/one_shot").expect("in the library");
        compile(source, &Bindings::ranks(n_ranks), Options::default(), &Limits::default()).expect("verifies")
    }

    fn input(count: usize, rank: u32) -> PlanInput<'static> {
        PlanInput {
            name: "allreduce/one_shot",
            name_is: "library algorithm",
            rank,
            count,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            origin: Origin::Coll(""),
            slot_cap: 128 << 10,
            single_copy: true,
            transport: "threads",
            slots: crate::link::SLOTS as u32,
        }
    }

    /// The fingerprint covers the schedule, not only the call's shape: the same instructions proved with other slot
    /// counts are other schedules. A schedule proved with more slots than the links have is refused.
    #[test]
    fn the_fingerprint_carries_the_schedule_and_more_slots_than_the_links_have_are_refused() {
        let source = library::get("allreduce/one_shot").expect("in the library");
        let with = |channel_slots| {
            let limits = Limits { channel_slots, ..Limits::default() };
            compile(source, &Bindings::ranks(2), Options::default(), &limits).expect("verifies")
        };
        let slots = crate::link::SLOTS as u32;
        let fingerprint = |sched: &VerifiedSchedule| prepare(sched, input(64, 0)).expect("prepares").fingerprint;
        assert_ne!(fingerprint(&with(slots)), fingerprint(&with(slots / 2)));
        assert_eq!(fingerprint(&with(slots)), fingerprint(&one_shot(2)));
        let refused = prepare(&with(slots + 1), input(64, 0)).err().expect("refused");
        assert!(matches!(refused, RuntimeError::Slots { proved, slots: s, .. } if proved == slots + 1 && s == slots));
    }

    /// Every operand of one chunk of a step holds the same number of elements, scratch chunks too: a scratch chunk
    /// holds what a user chunk at its position does, not the padded capacity, so a reduction whose destination is
    /// scratch reads no element past the user buffer it takes its accumulator from (reduce-scatter by recursive
    /// halving, 3 ranks, 2 slices per chunk and counts that do not divide: rank 0's `RecvReduceCopy acc=in[5]
    /// dst=_work[5]` read one element past `in`).
    #[test]
    fn the_operands_of_a_chunk_hold_the_same_elements() {
        let source = library::get("reducescatter/recursive_halving").expect("in the library");
        let options = Options { pipeline: Some(2), ..Options::default() };
        let sched = compile(source, &Bindings::ranks(3), options, &Limits::default()).expect("verifies");
        for count in [1, 5, 7, 13, 64] {
            for rank in 0..3 {
                let plan = prepare(&sched, input(count, rank)).expect("prepares");
                for piece in &plan.pieces {
                    let held: Vec<usize> =
                        [piece.src, piece.acc, piece.dst].iter().filter(|p| p.buf != NO_BUF).map(|p| p.valid).collect();
                    assert!(held.windows(2).all(|w| w[0] == w[1]), "count {count}, rank {rank}: {piece:?}");
                }
            }
        }
    }

    /// A connection's slots hold the largest message it carries in the call, not the cap: an 8-byte call's slots
    /// hold 8 bytes, a large call's a whole tile; both ends of a connection size it alike.
    #[test]
    fn link_slots_are_sized_by_the_messages_of_the_call() {
        let sched = one_shot(4);
        for (count, slot_bytes) in [(2, 8), (1 << 20, 128 << 10)] {
            let plans: Vec<Plan> = (0..4).map(|rank| prepare(&sched, input(count, rank)).expect("prepares")).collect();
            for plan in &plans {
                for link in &plan.links {
                    assert_eq!(link.slot_bytes, slot_bytes, "count {count}: rank {} {link:?}", plan.rank);
                    let other = &plans[if link.from == plan.rank { link.to } else { link.from } as usize];
                    let end = other.links.iter().find(|f| (f.from, f.to) == (link.from, link.to)).expect("both ends");
                    assert_eq!(end, link);
                }
            }
        }
    }
}
