//! The host twin of the CUDA interpreter (`kernels/cuda/interpret.cu`): the same image, the same state words, the
//! same flag protocol, step for step, with a block as a state machine the host polls. It is what CI runs in place
//! of a GPU, against the reference executor, so the encoding and the protocol are tested without one.
//!
//! The protocol, per connection record (`encode::conn`): the sender of message `m` waits until `m - head < SLOTS`,
//! writes slot `m % SLOTS` and its stamp, then publishes `tail = m + 1` (release); the receiver waits until
//! `tail > m` (acquire), checks the stamp, reads the slot, then publishes `head = m + 1` (release). A block fires an
//! instruction of tile `t` once every dependency's `done` word holds the tile's generation and, on each of its
//! links, the instruction is next in order: `count - link_start == (t / lanes) * per_tile + pos` in its lane (each
//! lane has its own records, counts and done words, and the tiles `lane, lane + lanes, ...`), where `count` is the link's
//! own counter (`tail` on a sending end, `head` on a receiving end) and `link_start` its value when the call began.
//! Generations grow with the call's sequence number, so `done` words never need resetting.

use super::encode::{
    self, code, conn, control, BlockDesc, DInstr, DPlace, Image, PlanDesc, NONE_LINK, NO_BUF_ID, RECORD_BYTES, SLOTS,
};
use crate::trace::TraceLog;
use collc_compiler::sched::Op;
use collc_kernels::host::{self, Factor};
use collc_kernels::operator::UserOp;
use collc_kernels::{DataType, ReduceOp};
use std::sync::atomic::{AtomicU64, Ordering};

/// The memory a launch runs in: the image, the state words, the buffers' addresses, the control words, and the
/// call's sequence number.
pub struct Launch<'a> {
    pub image: &'a Image,
    pub state: &'a [AtomicU64],
    pub bases: &'a [AtomicU64],
    pub control: &'a [AtomicU64],
    pub seq: u64,
}

/// What one poll of a block did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poll {
    Progressed,
    Idle,
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Start,
    Tile(u32),
    /// Waiting for every block of the plan to finish call `.0` before the `avg` division.
    Arrived(u64),
    Done,
}

/// One block as the host twin runs it.
pub struct Block {
    pub desc: BlockDesc,
    pub plan: PlanDesc,
    phase: Phase,
}

/// The connection record at `addr`, word `i`.
///
/// # Safety
/// `addr` is the address of a live record of `encode::CONN_WORDS` atomic words.
unsafe fn word<'a>(addr: u64, i: usize) -> &'a AtomicU64 {
    // SAFETY: forwarded from the caller.
    unsafe { &*(addr as *const AtomicU64).add(i) }
}

/// Where a record's slots are: after its words, or at its `SLOTS_AT` word (a record carried with GPUDirect RDMA).
///
/// # Safety
/// As `word`.
unsafe fn slots_of(record: u64) -> u64 {
    // SAFETY: forwarded from the caller.
    match unsafe { word(record, conn::SLOTS_AT) }.load(Ordering::Relaxed) {
        0 => record + RECORD_BYTES as u64,
        at => at,
    }
}

impl Block {
    pub fn new(image: &Image, b: u32) -> Block {
        let desc = image.block(b);
        Block { desc, plan: image.plan(desc.plan), phase: Phase::Start }
    }

    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// The tile the block is at and its first instruction not done there (for the fault record).
    pub fn pending(&self, launch: &Launch) -> (u32, u32) {
        let tile = match self.phase {
            Phase::Tile(t) => t,
            _ => self.desc.lane,
        };
        let gen = generation(&self.plan, launch.seq, tile);
        let first = (0..self.desc.count)
            .map(|k| launch.image.order(&self.plan, self.desc.first + k))
            .find(|&i| launch.state[done_word(&self.plan, self.desc.lane, i)].load(Ordering::Acquire) < gen);
        (tile, first.unwrap_or(self.desc.first))
    }

    /// One round: every instruction of the current tile not yet done is tried once; each that runs is a span of
    /// `trace` (its rank's log) when the call is recorded.
    ///
    /// # Safety
    /// The state's addresses (buffers, connection records and their slots) are live and large enough for the plan.
    pub unsafe fn poll(&mut self, launch: &Launch, mut trace: Option<&mut TraceLog>) -> Poll {
        let (image, state) = (launch.image, launch.state);
        let plan = self.plan;
        match self.phase {
            Phase::Done => Poll::Done,
            Phase::Start => {
                for l in 0..plan.n_links {
                    let link = image.link(&plan, l);
                    if link.channel as u32 != self.desc.channel {
                        continue;
                    }
                    let record = conn_address(launch, self.desc.lane, link.conn);
                    // SAFETY: the record's address was set up by the host (caller's contract).
                    let own = unsafe { word(record, if link.sending == 1 { conn::TAIL } else { conn::HEAD }) };
                    let start = link_start_word(&plan, self.desc.lane, l);
                    state[start].store(own.load(Ordering::Relaxed), Ordering::Relaxed);
                }
                let lane = self.desc.lane;
                self.phase = if lane >= plan.n_tiles { self.finish(launch) } else { Phase::Tile(lane) };
                Poll::Progressed
            }
            Phase::Tile(t) => {
                let gen = generation(&plan, launch.seq, t);
                let (mut fired, mut pending) = (false, false);
                for k in 0..self.desc.count {
                    let i = image.order(&plan, self.desc.first + k);
                    let done = &state[done_word(&plan, self.desc.lane, i)];
                    if done.load(Ordering::Relaxed) >= gen {
                        continue;
                    }
                    // SAFETY: forwarded from the caller.
                    match unsafe { try_fire(launch, &plan, self.desc.lane, i, t, trace.as_deref_mut()) } {
                        Fire::Fired => {
                            done.store(gen, Ordering::Release);
                            fired = true;
                            if let Some(log) = trace.as_deref_mut() {
                                log.close(i as usize, t as usize);
                            }
                        }
                        Fire::NotYet => pending = true,
                        Fire::Fault => return Poll::Idle,
                    }
                }
                if !pending {
                    let next = t + plan.lanes;
                    self.phase = if next < plan.n_tiles { Phase::Tile(next) } else { self.finish(launch) };
                    return Poll::Progressed;
                }
                if fired {
                    Poll::Progressed
                } else {
                    Poll::Idle
                }
            }
            Phase::Arrived(seq) => {
                let blocks = plan.finished_at..plan.finished_at + self.desc.plan_blocks;
                if blocks.into_iter().any(|w| state[w as usize].load(Ordering::Acquire) < seq) {
                    return Poll::Idle;
                }
                // SAFETY: forwarded from the caller.
                unsafe { epilogue_share(launch, &plan, &self.desc) };
                self.phase = Phase::Done;
                Poll::Progressed
            }
        }
    }

    /// After the last tile: done, or (for `avg`) arrived at the plan's barrier: its own word set to the call.
    fn finish(&self, launch: &Launch) -> Phase {
        if self.plan.avg == 0 {
            return Phase::Done;
        }
        let word = (self.plan.finished_at + self.desc.index_in_plan) as usize;
        launch.state[word].store(launch.seq, Ordering::Release);
        Phase::Arrived(launch.seq)
    }
}

/// The state word of instruction `i`'s done generation in `lane`.
pub(crate) fn done_word(plan: &PlanDesc, lane: u32, i: u32) -> usize {
    (plan.done_at + lane * plan.n_instrs + i) as usize
}

/// The state word of link `l`'s count at the start of the call in `lane`.
fn link_start_word(plan: &PlanDesc, lane: u32, l: u32) -> usize {
    (plan.link_start_at + lane * plan.n_links + l) as usize
}

/// The address of lane `lane`'s record of connection `conn`.
fn conn_address(launch: &Launch, lane: u32, conn: u32) -> u64 {
    let header = launch.image.header();
    launch.state[(header.conn_table + lane * header.n_conns + conn) as usize].load(Ordering::Relaxed)
}

/// The generation tile `t` of call `seq` marks its instructions' `done` words with.
fn generation(plan: &PlanDesc, seq: u64, t: u32) -> u64 {
    seq * (plan.n_tiles as u64 + 1) + t as u64 + 1
}

enum Fire {
    Fired,
    NotYet,
    Fault,
}

/// Records the first fault of the launch; later ones are dropped.
fn fault(launch: &Launch, what: u64, rank: u32, i: u32, t: u32, extra: Option<(u64, u64, u32)>) {
    let c = launch.control;
    if c[control::CODE].compare_exchange(code::OK, u64::MAX, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return;
    }
    c[control::RANK].store(rank as u64, Ordering::Relaxed);
    c[control::INSTR].store(i as u64, Ordering::Relaxed);
    c[control::TILE].store(t as u64, Ordering::Relaxed);
    if let Some((seq, fp, link)) = extra {
        c[control::GOT_SEQ].store(seq, Ordering::Relaxed);
        c[control::GOT_FP].store(fp, Ordering::Relaxed);
        c[control::LINK].store(link as u64, Ordering::Relaxed);
    }
    c[control::CODE].store(what, Ordering::Release);
}

/// Whether a fault was recorded or an abort asked for: every block stops.
pub fn stopped(launch: &Launch) -> bool {
    launch.control[control::CODE].load(Ordering::Acquire) != code::OK
        || launch.control[control::ABORT].load(Ordering::Acquire) != 0
}

/// Records a timeout (or, when the host asked, an abort) at the block's first pending instruction.
pub fn give_up(launch: &Launch, block: &Block, what: u64) {
    let (t, i) = block.pending(launch);
    fault(launch, what, block.plan.rank, i, t, None);
}

/// # Safety
/// As `Block::poll`.
unsafe fn try_fire(launch: &Launch, plan: &PlanDesc, lane: u32, i: u32, t: u32, trace: Option<&mut TraceLog>) -> Fire {
    let (image, state) = (launch.image, launch.state);
    let instr = image.instr(plan, i);
    for k in 0..instr.n_deps {
        let d = image.dep(plan, instr.first_dep + k);
        if state[done_word(plan, lane, d)].load(Ordering::Acquire) < generation(plan, launch.seq, t) {
            return Fire::NotYet;
        }
    }
    let end = |l: u16| {
        let link = image.link(plan, l as u32);
        let record = conn_address(launch, lane, link.conn);
        let start = state[link_start_word(plan, lane, l as u32)].load(Ordering::Relaxed);
        (link, record, start)
    };
    let mut incoming: *const u8 = std::ptr::null();
    let mut recv_at = None;
    if instr.recv != NONE_LINK {
        let (link, record, start) = end(instr.recv);
        // SAFETY: live records (caller's contract).
        let (head, tail) = unsafe { (word(record, conn::HEAD), word(record, conn::TAIL)) };
        let m = head.load(Ordering::Relaxed);
        let turn = (t / plan.lanes) as u64 * link.per_tile as u64;
        if m - start != turn + instr.recv_pos as u64 || tail.load(Ordering::Acquire) <= m {
            return Fire::NotYet;
        }
        let slot = (m % SLOTS) as usize;
        // SAFETY: as above.
        let (seq, fp) = unsafe {
            (
                word(record, conn::STAMPS + 2 * slot).load(Ordering::Relaxed),
                word(record, conn::STAMPS + 2 * slot + 1).load(Ordering::Relaxed),
            )
        };
        if (seq, fp) != (launch.seq, plan.fingerprint) {
            fault(launch, code::MISMATCH, plan.rank, i, t, Some((seq, fp, instr.recv as u32)));
            return Fire::Fault;
        }
        // SAFETY: as above.
        incoming = (unsafe { slots_of(record) } + slot as u64 * link.slot_bytes as u64) as *const u8;
        recv_at = Some((head, m));
    }
    let mut outgoing: *mut u8 = std::ptr::null_mut();
    let mut send_at = None;
    if instr.send != NONE_LINK {
        let (link, record, start) = end(instr.send);
        // SAFETY: as above.
        let (head, tail) = unsafe { (word(record, conn::HEAD), word(record, conn::TAIL)) };
        let m = tail.load(Ordering::Relaxed);
        if m - start != (t / plan.lanes) as u64 * link.per_tile as u64 + instr.send_pos as u64
            || m - head.load(Ordering::Acquire) >= SLOTS
        {
            return Fire::NotYet;
        }
        let slot = (m % SLOTS) as usize;
        // SAFETY: as above.
        outgoing = (unsafe { slots_of(record) } + slot as u64 * link.slot_bytes as u64) as *mut u8;
        send_at = Some((record, tail, m, slot));
    }
    if let Some(log) = trace {
        log.open();
    }
    // SAFETY: the places are inside the buffers the state points at (caller's contract).
    unsafe { execute(launch, plan, &instr, t, incoming, outgoing) };
    if let Some((record, tail, m, slot)) = send_at {
        // SAFETY: as above.
        unsafe {
            word(record, conn::STAMPS + 2 * slot).store(launch.seq, Ordering::Relaxed);
            word(record, conn::STAMPS + 2 * slot + 1).store(plan.fingerprint, Ordering::Relaxed);
        }
        tail.store(m + 1, Ordering::Release);
    }
    if let Some((head, m)) = recv_at {
        head.store(m + 1, Ordering::Release);
    }
    Fire::Fired
}

/// The address of `place`'s element `lo` and how many of the tile's elements are valid there.
fn local(launch: &Launch, plan: &PlanDesc, place: DPlace, lo: u64, hi: u64) -> (*mut u8, usize) {
    if place.buf == NO_BUF_ID {
        return (std::ptr::null_mut(), 0);
    }
    let base = launch.bases[(plan.bases_at + u32::from(place.buf)) as usize].load(Ordering::Relaxed);
    let n = hi.min(place.valid as u64).saturating_sub(lo) as usize;
    ((base + (place.offset + lo) * plan.elem as u64) as *mut u8, n)
}

fn dtype_of(plan: &PlanDesc) -> DataType {
    DataType::ALL.iter().copied().find(|d| *d as u32 == plan.dtype).expect("a dtype the encoder wrote")
}

/// The plan's operator (a PreMulSum stands for its combining, `Sum`) and its factor, if any.
fn op_of(plan: &PlanDesc) -> (ReduceOp, Option<Factor>) {
    let premulsum = ReduceOp::PreMulSum(collc_kernels::Scalar::Int(1));
    if plan.op == u32::from(premulsum.nccl_code()) {
        return (ReduceOp::Sum, Some(Factor::new(dtype_of(plan), plan.factor.to_le_bytes())));
    }
    if plan.op == u32::from(ReduceOp::USER_CODE) {
        let user = UserOp::from_index(plan.factor).expect("an operator the encoder found registered");
        return (ReduceOp::User(user), None);
    }
    (ReduceOp::from_nccl_code(plan.op as u8).expect("an op the encoder wrote"), None)
}

/// The data movement of one instruction on tile `t`: the host executor's, element for element.
///
/// # Safety
/// As `Block::poll`; `incoming` / `outgoing` are this message's slots when the instruction receives / sends.
unsafe fn execute(launch: &Launch, plan: &PlanDesc, instr: &DInstr, t: u32, incoming: *const u8, outgoing: *mut u8) {
    let (dtype, (op, factor), elem) = (dtype_of(plan), op_of(plan), plan.elem as usize);
    // PreMulSum: a place holding the rank's input as it came is multiplied by the factor as it is read.
    let factor_for = |place: DPlace| factor.as_ref().filter(|_| place.raw != 0);
    let lo = t as u64 * plan.tile as u64;
    let hi = (lo + plan.tile as u64).min(plan.capacity as u64);
    let stride = plan.tile as usize * elem;
    let (sends_refs, receives_refs) =
        (instr.op & encode::SENDS_REFERENCES != 0, instr.op & encode::RECEIVES_REFERENCES != 0);
    for k in 0..instr.n {
        let piece = launch.image.piece(plan, instr.first_piece + k);
        let slot_in = match receives_refs {
            // SAFETY: a message by reference holds an address a chunk (`encode::SENDS_REFERENCES`).
            true => unsafe { (incoming as *const u64).add(k as usize).read() as *const u8 },
            false => incoming.wrapping_add(k as usize * stride),
        };
        let slot_out = outgoing.wrapping_add(k as usize * stride);
        let (src, n_src) = local(launch, plan, piece.src, lo, hi);
        if sends_refs {
            // SAFETY: the slot holds an address a chunk (checked when the plan was encoded).
            unsafe { (outgoing as *mut u64).add(k as usize).write(src as u64) };
            continue;
        }
        let (acc, _) = local(launch, plan, piece.acc, lo, hi);
        let (dst, n_dst) = local(launch, plan, piece.dst, lo, hi);
        // SAFETY: every pointer is inside its buffer or slot for the elements used (caller's contract).
        unsafe {
            let (src_factor, acc_factor) = (factor_for(piece.src), factor_for(piece.acc));
            let reduce = |dst: *mut u8, b: *const u8, n: usize| match acc_factor {
                Some(f) => host::premul_sum(dtype, dst, (acc, Some(f)), (b, None), n),
                None => host::reduce(dtype, op, dst, acc, b, n),
            };
            match Op::ALL[(instr.op & encode::OP_MASK) as usize] {
                Op::Send => match src_factor {
                    Some(f) => f.apply(slot_out, src, n_src),
                    None => host::copy(slot_out, src, n_src * elem),
                },
                Op::Recv => host::copy(dst, slot_in, n_dst * elem),
                Op::RecvReduceCopy => reduce(dst, slot_in, n_dst),
                Op::RecvReduceSend => {
                    let (_, n_acc) = local(launch, plan, piece.acc, lo, hi);
                    reduce(slot_out, slot_in, n_acc)
                }
                Op::RecvReduceCopySend => {
                    reduce(slot_out, slot_in, n_dst);
                    host::copy(dst, slot_out, n_dst * elem);
                }
                Op::RecvCopySend => {
                    host::copy(dst, slot_in, n_dst * elem);
                    // The whole tile goes on: a later rank may hold more of this chunk than this rank does.
                    host::copy(slot_out, slot_in, (hi - lo) as usize * elem);
                }
                Op::Copy => match src_factor {
                    Some(f) => f.apply(dst, src, n_dst.min(n_src)),
                    None => host::copy(dst, src, n_dst.min(n_src) * elem),
                },
                Op::Reduce => match (acc_factor, src_factor) {
                    (None, None) => host::reduce(dtype, op, dst, acc, src, n_dst),
                    (a, b) => host::premul_sum(dtype, dst, (acc, a), (src, b), n_dst),
                },
            }
        }
    }
}

/// This block's share of the plan's epilogue on its output window: the `avg` division, or a premulsum's factor on
/// the ranges no instruction wrote.
///
/// # Safety
/// As `Block::poll`.
unsafe fn epilogue_share(launch: &Launch, plan: &PlanDesc, block: &BlockDesc) {
    let ranges: Vec<std::ops::Range<u64>> = match plan.avg {
        2 => (0..plan.n_unscaled).map(|r| launch.image.unscaled(plan, r)).collect(),
        _ => std::iter::once(plan.out_lo..plan.out_hi).collect(),
    };
    let base = launch.bases[(plan.bases_at + plan.out_buf) as usize].load(Ordering::Relaxed);
    let elem = plan.elem as u64;
    for range in ranges {
        let share = (range.end - range.start).div_ceil(block.plan_blocks as u64);
        let start = (range.start + share * block.index_in_plan as u64).min(range.end);
        let end = (start + share).min(range.end);
        // SAFETY: the range lies inside the output buffer (caller's contract).
        let bytes = unsafe {
            std::slice::from_raw_parts_mut((base + start * elem) as *mut u8, ((end - start) * elem) as usize)
        };
        if plan.avg == 2 {
            let factor = Factor::new(dtype_of(plan), plan.factor.to_le_bytes());
            // SAFETY: as above; in place on itself, which `apply` allows.
            unsafe { factor.apply(bytes.as_mut_ptr(), bytes.as_ptr(), bytes.len() / plan.elem as usize) };
            continue;
        }
        collc_kernels::reference::finish_avg(dtype_of(plan), bytes, plan.n_ranks as usize)
            .expect("whole elements and ranks");
    }
}

/// Runs every block of `launches` (images of one launch, each with its own state, bases and fault report) on this
/// thread, round-robin, to the end or the first fault. A round in which no block moves is a deadlock of the encoding
/// or the protocol (verified schedules have none, and nothing else touches this memory meanwhile): it is recorded as
/// a timeout at the first stuck block.
///
/// Each block's instructions are spans of `traces[e]`, its launch's rank's trace log, where there is one.
///
/// # Safety
/// As `Block::poll`, for every plan of every image.
pub unsafe fn run_all(launches: &[Launch], traces: &mut [Option<&mut TraceLog>]) {
    let mut blocks: Vec<(usize, Block)> = launches
        .iter()
        .enumerate()
        .flat_map(|(e, launch)| (0..launch.image.header().n_blocks).map(move |b| (e, Block::new(launch.image, b))))
        .collect();
    loop {
        let mut moved = false;
        let mut all_done = true;
        for (e, block) in &mut blocks {
            let trace = traces.get_mut(*e).and_then(|log| log.as_deref_mut());
            // SAFETY: forwarded from the caller.
            match unsafe { block.poll(&launches[*e], trace) } {
                Poll::Progressed => moved = true,
                Poll::Idle => {}
                Poll::Done => continue,
            }
            all_done &= block.is_done();
        }
        if all_done || launches.iter().any(stopped) {
            return;
        }
        if !moved {
            let (e, stuck) = blocks.iter().find(|(_, b)| !b.is_done()).expect("a block not done");
            give_up(&launches[*e], stuck, code::TIMEOUT);
            return;
        }
    }
}
