//! The device encoding of a launch: one or more ranks' plans laid out as one image of plain little-endian words
//! that the CUDA interpreter (`kernels/cuda/interpret.cu`) and its host twin (`twin.rs`) both read, plus the size
//! of the mutable state each needs. Everything is an offset into the image or an index into the state, never a
//! host pointer, so the image is copied to the device as it stands; the addresses a launch needs (each plan's
//! buffers, each connection's record) live in the state, written by the host before a call.
//!
//! Blocks: a plan's instructions are split by channel, one block per channel (as NCCL runs a channel per thread
//! block). A block owns every connection of its channel, so the messages of a connection are always posted and
//! consumed by one block, in order. Within a block, instructions fire in dataflow order, as in the host executor;
//! a dependency on another block's instruction is that instruction's `done` word in the state reaching the
//! tile's generation.

use super::super::plan::{Piece, Place, Plan, Step, NONE, NO_BUF};
use crate::link::LinkEnd;
use collc_compiler::sched::Op;
use collc_kernels::ReduceOp;
use std::collections::HashMap;

/// The image starts with these bytes ("COLC") and the version; the interpreter refuses anything else.
pub const MAGIC: u32 = 0x434f_4c43;
pub const VERSION: u32 = 3;
// Message slots per connection record: the one `SLOTS` of every link (the compiler's `CHANNEL_SLOTS`); the CUDA
// source is compiled with it (`COLLC_SLOTS`).
pub use crate::link::SLOTS;
/// Threads per block of the device interpreter (its `__launch_bounds__`).
#[cfg(any(feature = "cuda", feature = "cuda-host", test))]
pub const THREADS: u32 = 512;

/// What a failed launch reports in the control words: `Control::code`.
pub mod code {
    pub const OK: u64 = 0;
    pub const TIMEOUT: u64 = 1;
    pub const MISMATCH: u64 = 2;
    pub const ABORTED: u64 = 3;
    pub const BAD_IMAGE: u64 = 4;
}

/// The image's first 40 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Header {
    pub magic: u32,
    pub version: u32,
    pub n_plans: u32,
    pub n_blocks: u32,
    pub n_conns: u32,
    /// Byte offsets of the block and plan tables.
    pub blocks: u32,
    pub plans: u32,
    /// Words of state the launch needs, and where the connection address table starts in it.
    pub state_words: u32,
    pub conn_table: u32,
    /// Words of the bases array: every plan's buffer addresses, which the host writes before each call (on a
    /// GPU in host-mapped memory, so a call costs no copy).
    pub bases_words: u32,
}

/// One thread block: the instructions `order[first..first + count]` of plan `plan`, all on channel `channel`, for
/// the tiles of lane `lane` (tiles `lane`, `lane + lanes`, ...).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct BlockDesc {
    pub plan: u32,
    pub channel: u32,
    pub first: u32,
    pub count: u32,
    /// Blocks of the plan, and this block's index among them (the `avg` epilogue splits the output by them).
    pub plan_blocks: u32,
    pub index_in_plan: u32,
    pub lane: u32,
    pub _pad: u32,
}

/// One rank's plan. Offsets are bytes into the image; `*_at` are word indices into the state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct PlanDesc {
    pub rank: u32,
    pub n_ranks: u32,
    /// `DataType` and `ReduceOp` as NCCL numbers them.
    pub dtype: u32,
    pub op: u32,
    pub elem: u32,
    /// Elements per tile of one chunk, tiles per call, and the padded elements of a chunk.
    pub tile: u32,
    pub n_tiles: u32,
    pub capacity: u32,
    pub n_instrs: u32,
    pub n_links: u32,
    pub n_bufs: u32,
    /// The epilogue once every block is done: 1 divides the output window by the rank count (`avg` of a reduction),
    /// 2 multiplies the `unscaled` ranges by `factor` (a premulsum's output that is the rank's own input, unwritten:
    /// one rank), 0 none.
    pub avg: u32,
    /// Lanes: the tiles are dealt round-robin to this many copies of each channel's block, each with its own
    /// connection records, done words and link counts, so a call runs on `lanes` times the blocks (as NCCL runs more
    /// channels) while every lane is the verified schedule on its own tiles.
    pub lanes: u32,
    pub _pad: u32,
    pub instrs: u32,
    pub pieces: u32,
    pub deps: u32,
    pub order: u32,
    pub links: u32,
    /// Where the plan's buffer addresses (`n_bufs`) start in the bases array. State words, per lane: each
    /// instruction's done generation (`lanes x n_instrs`), each link's count at the start of the call
    /// (`lanes x n_links`); and per block the last call it finished (the `avg` epilogue's barrier).
    pub bases_at: u32,
    pub done_at: u32,
    pub link_start_at: u32,
    pub finished_at: u32,
    /// The output window for `avg`: buffer and element range.
    pub out_buf: u32,
    pub out_lo: u64,
    pub out_hi: u64,
    pub fingerprint: u64,
    /// PreMulSum's factor in `dtype` (`Scalar::element`), little-endian in the low bytes; 0 for other operators.
    pub factor: u64,
    /// PreMulSum's epilogue: a table of `n_unscaled` element ranges (two u64 each) of the output window that no
    /// instruction wrote, which still hold the rank's input (`Plan::unscaled`).
    pub unscaled: u32,
    pub n_unscaled: u32,
}

/// One instruction (32 bytes). `send` and `recv` index the plan's links (`NONE_LINK`: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct DInstr {
    /// The op code (`op_code`, under `OP_MASK`) and the flags `SENDS_REFERENCES`, `RECEIVES_REFERENCES`.
    pub op: u32,
    pub send: u16,
    pub recv: u16,
    pub n: u32,
    pub first_piece: u32,
    pub first_dep: u32,
    pub n_deps: u32,
    /// Position among this plan's instructions on `send` / `recv` within one tile.
    pub send_pos: u32,
    pub recv_pos: u32,
}

/// Where one chunk of an operand lives: buffer (`NO_BUF_ID`: none), whether it is the rank's input as it came (1:
/// PreMulSum multiplies it by the plan's `factor` as it is read), valid elements, first element.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct DPlace {
    pub buf: u16,
    pub raw: u16,
    pub valid: u32,
    pub offset: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct DPiece {
    pub src: DPlace,
    pub acc: DPlace,
    pub dst: DPlace,
}

/// One end of a connection in a plan: the connection (an index into the state's address table), messages on it per
/// tile, its slot size, and whether this plan sends on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct DLink {
    pub conn: u32,
    pub per_tile: u32,
    pub slot_bytes: u32,
    /// 1 on the sending end.
    pub sending: u16,
    pub channel: u16,
}

pub const NONE_LINK: u16 = u16::MAX;
/// `DInstr::op`: the op code, then single copy's flags. A message by reference holds, for each chunk, the address of
/// its tile at the sender (8 bytes a chunk) in place of its bytes; its receiver reads the tile there (the memory
/// model's rule 8: the sender's source stays until the call ends, and every rank of a GPU runs in one launch, which
/// ends only once every rank's instructions have).
pub const OP_MASK: u32 = 0xffff;
pub const SENDS_REFERENCES: u32 = 1 << 16;
pub const RECEIVES_REFERENCES: u32 = 1 << 17;
pub const NO_BUF_ID: u16 = u16::MAX;

/// A connection's record (`CONN_WORDS` words, 8-byte aligned; one per lane, the state's address table holding lane
/// `k`'s records at `conn_table + k * n_conns`), wherever it lives: the count of messages posted
/// (`tail`, written by the sender after the data and the stamp) and released (`head`, written by the receiver once
/// it has read the slot), its slot size, and each slot's stamp (call sequence and plan fingerprint), which the
/// receiver checks before it reads. Its `SLOTS` data slots follow it, `RECORD_BYTES` from its start, so nothing in a
/// record is an address and two processes that map it at different addresses (CUDA IPC) read it alike; except a
/// record carried to another host with GPUDirect RDMA, whose words are in host-mapped memory for the network proxy
/// and whose slots are device memory the NIC writes: `SLOTS_AT` is then where the slots are (0: they follow).
pub mod conn {
    pub const TAIL: usize = 0;
    pub const HEAD: usize = 1;
    pub const SLOTS_AT: usize = 2;
    pub const SLOT_BYTES: usize = 3;
    /// `STAMPS + 2 * slot` and `STAMPS + 2 * slot + 1`: sequence and fingerprint.
    pub const STAMPS: usize = 4;
}
pub const CONN_WORDS: usize = conn::STAMPS + 2 * SLOTS as usize;
/// Where a record's slots start, from the record: past its words, 256-byte aligned.
pub const RECORD_BYTES: usize = 256;
const _: () = assert!(CONN_WORDS * 8 <= RECORD_BYTES);

/// Bytes of one connection record with its slots.
pub fn record_bytes(slot_bytes: usize) -> usize {
    RECORD_BYTES + SLOTS as usize * slot_bytes
}

/// A fault report: what failed and where (the rank, its instruction and tile; for a mismatch the stamp found and
/// the link). The twin keeps one per rank executor; on a GPU every block has its own, in host-mapped memory, so no
/// atomic ever touches host memory, and a device word tells the other blocks to stop.
pub mod control {
    pub const CODE: usize = 0;
    /// The rank whose plan faulted.
    pub const RANK: usize = 1;
    pub const INSTR: usize = 2;
    pub const TILE: usize = 3;
    /// Mismatch: the stamp found (sequence, fingerprint) and the link.
    pub const GOT_SEQ: usize = 4;
    pub const GOT_FP: usize = 5;
    pub const LINK: usize = 6;
    /// The twin's abort request (on a GPU the request is a word of its own before the reports).
    pub const ABORT: usize = 7;
}
pub const CONTROL_WORDS: usize = 8;

/// The op codes the image uses: positions in `Op::ALL`.
pub fn op_code(op: Op) -> u32 {
    Op::ALL.iter().position(|&o| o == op).expect("every op is in Op::ALL") as u32
}

/// An encoded launch: the image and where its connections are.
pub struct Image {
    /// 8-byte words, so every table is aligned for the device's loads.
    pub words: Vec<u64>,
    /// The connection records, in the order of the state's address table: (sender, receiver, channel, slot bytes,
    /// lane).
    pub conns: Vec<(u32, u32, u8, usize, u32)>,
}

impl Image {
    /// Words of state the launch needs.
    pub fn state_words(&self) -> usize {
        self.header().state_words as usize
    }

    /// The state word where the connection address table starts.
    pub fn conn_table_at(&self) -> usize {
        self.header().conn_table as usize
    }

    /// Words of the bases array.
    pub fn bases_words(&self) -> usize {
        self.header().bases_words as usize
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: u64 words viewed as their bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.words.len() * 8) }
    }

    pub fn header(&self) -> Header {
        self.read(0)
    }

    pub fn read<T: Copy>(&self, offset: usize) -> T {
        assert!(
            offset.is_multiple_of(std::mem::align_of::<T>())
                && offset + std::mem::size_of::<T>() <= self.words.len() * 8
        );
        // SAFETY: in bounds and aligned (checked); every T here is plain old data.
        unsafe { self.bytes().as_ptr().add(offset).cast::<T>().read() }
    }

    pub fn plan(&self, p: u32) -> PlanDesc {
        self.read(self.header().plans as usize + p as usize * std::mem::size_of::<PlanDesc>())
    }

    pub fn block(&self, b: u32) -> BlockDesc {
        self.read(self.header().blocks as usize + b as usize * std::mem::size_of::<BlockDesc>())
    }

    pub fn instr(&self, plan: &PlanDesc, i: u32) -> DInstr {
        self.read(plan.instrs as usize + i as usize * std::mem::size_of::<DInstr>())
    }

    pub fn piece(&self, plan: &PlanDesc, k: u32) -> DPiece {
        self.read(plan.pieces as usize + k as usize * std::mem::size_of::<DPiece>())
    }

    pub fn dep(&self, plan: &PlanDesc, k: u32) -> u32 {
        self.read(plan.deps as usize + k as usize * 4)
    }

    pub fn order(&self, plan: &PlanDesc, k: u32) -> u32 {
        self.read(plan.order as usize + k as usize * 4)
    }

    /// Range `r` of the plan's PreMulSum epilogue, in elements.
    pub fn unscaled(&self, plan: &PlanDesc, r: u32) -> std::ops::Range<u64> {
        let [lo, hi]: [u64; 2] = self.read(plan.unscaled as usize + r as usize * 16);
        lo..hi
    }

    pub fn link(&self, plan: &PlanDesc, l: u32) -> DLink {
        self.read(plan.links as usize + l as usize * std::mem::size_of::<DLink>())
    }
}

/// Appends plain-old-data tables to a byte image, each 16-byte aligned.
#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn table<T: Copy>(&mut self, items: &[T]) -> u32 {
        self.align();
        let at = self.0.len();
        // SAFETY: every T written here is a repr(C) struct of integers or an integer.
        let bytes = unsafe { std::slice::from_raw_parts(items.as_ptr().cast::<u8>(), std::mem::size_of_val(items)) };
        self.0.extend_from_slice(bytes);
        at as u32
    }

    fn align(&mut self) {
        while !self.0.len().is_multiple_of(16) {
            self.0.push(0);
        }
    }
}

/// Whether the message `step` sends (`sending`) or receives goes by reference on the device: its sender's source
/// stays (`Step::by_reference`, `Step::recv_by_reference`, the same on both ends), both ends share memory, no
/// PreMulSum factor travels with it and no epilogue rewrites the output, every tile of each chunk is whole (the receiver reads a whole tile, as
/// `RecvCopySend` forwards one) and the slot holds an address per chunk. Both ends decide alike from their own plans.
fn by_reference(plan: &Plan, step: &Step, sending: bool, shares: &dyn Fn(&LinkEnd) -> bool) -> bool {
    let (marked, l) = match sending {
        true => (step.op == Op::Send && step.by_reference, step.send),
        false => (step.recv_by_reference, step.recv),
    };
    // No epilogue either: `avg` divides a rank's output once its own blocks are done, while a peer may still read
    // it by reference (the host executor divides only once every reference is released).
    if !marked || l == NONE || plan.factor.is_some() || epilogue(plan) != 0 {
        return false;
    }
    let end = &plan.links[l as usize];
    let pieces = &plan.pieces[step.first_piece as usize..(step.first_piece + step.n) as usize];
    let valid = |p: &Piece| p.src.valid.max(p.acc.valid).max(p.dst.valid);
    shares(end) && 8 * step.n as usize <= end.slot_bytes && pieces.iter().all(|p| valid(p) >= plan.capacity)
}

/// `PlanDesc::avg`: the epilogue of the plan's output window.
fn epilogue(plan: &Plan) -> u32 {
    match () {
        _ if plan.op == ReduceOp::Avg && plan.collective.reduces() => 1,
        _ if !plan.unscaled.is_empty() => 2,
        _ => 0,
    }
}

fn place(p: Place) -> DPlace {
    if p.buf == NO_BUF {
        DPlace { buf: NO_BUF_ID, raw: 0, valid: 0, offset: 0 }
    } else {
        DPlace { buf: u16::from(p.buf), raw: u16::from(p.raw), valid: p.valid as u32, offset: p.offset as u64 }
    }
}

/// Encodes the plans of one launch (ranks that run together), each call's tiles dealt over `lanes` lanes (at most
/// one per tile; every rank of a call gets the same count, as every rank cuts a call into the same tiles).
/// Connections between two of the plans are one record per lane; a connection to a rank outside the launch gets
/// records too, whose addresses the caller supplies (a peer thread's, or another process's through IPC).
///
/// `shares(end)`: whether both ends of a connection reach the same memory at the same addresses (ranks of one GPU
/// in one process; the twin's ranks): there a `Send` whose source stays goes by reference (`by_reference`).
pub fn encode(plans: &[&Plan], lanes: u32, shares: &dyn Fn(&LinkEnd) -> bool) -> Result<Image, String> {
    let lanes_of = |plan: &Plan| lanes.clamp(1, plan.n_tiles.max(1) as u32);
    let lanes = plans.first().map_or(1, |plan| lanes_of(plan));
    if plans.iter().any(|plan| lanes_of(plan) != lanes) {
        return Err("the plans of one launch cut their calls into different tiles".into());
    }
    let mut w = Writer::default();
    w.table(&[Header::default()]);
    let mut conn_index: HashMap<(u32, u32, u8), u32> = HashMap::new();
    let mut conns: Vec<(u32, u32, u8, usize)> = Vec::new();
    let mut descs = Vec::with_capacity(plans.len());
    let mut blocks = Vec::new();
    let (mut state, mut bases_words) = (0usize, 0usize);
    for (p, &plan) in plans.iter().enumerate() {
        let n = plan.steps.len();
        // Each instruction's dependencies, from the plan's dependents.
        let mut deps_of: Vec<Vec<u32>> = vec![Vec::new(); n];
        for j in 0..n {
            let (start, end) = (plan.dependents_start[j] as usize, plan.dependents_start[j + 1] as usize);
            for &d in &plan.dependents[start..end] {
                deps_of[d as usize].push(j as u32);
            }
        }
        let mut links = Vec::with_capacity(plan.links.len());
        let mut per_tile = vec![0u32; plan.links.len()];
        for step in &plan.steps {
            for l in [step.send, step.recv] {
                if l != NONE {
                    per_tile[l as usize] += 1;
                }
            }
        }
        for (l, end) in plan.links.iter().enumerate() {
            let key = (end.from, end.to, end.channel);
            let next = conns.len() as u32;
            let conn = *conn_index.entry(key).or_insert(next);
            if conn == next {
                conns.push((end.from, end.to, end.channel, end.slot_bytes));
            } else if conns[conn as usize].3 != end.slot_bytes {
                return Err(format!(
                    "the two ends of the connection {} -> {} channel {} size its slots differently ({} and {} bytes)",
                    end.from, end.to, end.channel, conns[conn as usize].3, end.slot_bytes
                ));
            }
            let slot_bytes = u32::try_from(end.slot_bytes).map_err(|_| "a slot over 4 GiB".to_string())?;
            let sending = (end.from == plan.rank) as u16;
            links.push(DLink { conn, per_tile: per_tile[l], slot_bytes, sending, channel: end.channel as u16 });
        }
        let mut deps = Vec::new();
        let mut instrs = Vec::with_capacity(plan.steps.len());
        for (i, step) in plan.steps.iter().enumerate() {
            let first_dep = deps.len() as u32;
            deps.extend_from_slice(&deps_of[i]);
            let link = |l: u16| if l == NONE { NONE_LINK } else { l };
            let refs = |sending: bool, flag: u32| if by_reference(plan, step, sending, shares) { flag } else { 0 };
            instrs.push(DInstr {
                op: op_code(step.op) | refs(true, SENDS_REFERENCES) | refs(false, RECEIVES_REFERENCES),
                send: link(step.send),
                recv: link(step.recv),
                n: step.n,
                first_piece: step.first_piece,
                first_dep,
                n_deps: deps.len() as u32 - first_dep,
                send_pos: step.send_pos,
                recv_pos: step.recv_pos,
            });
        }
        let pieces: Vec<DPiece> = plan
            .pieces
            .iter()
            .map(|piece| DPiece { src: place(piece.src), acc: place(piece.acc), dst: place(piece.dst) })
            .collect();
        // Blocks by channel, each listing its instructions in program order (a topological order).
        let mut channels: Vec<u8> = plan.steps.iter().map(|step| step.channel).collect();
        channels.sort_unstable();
        channels.dedup();
        let epilogue = epilogue(plan);
        if channels.is_empty() && epilogue != 0 {
            // No instruction, yet the window needs its epilogue (one rank in place): one block of none runs it.
            channels.push(0);
        }
        let mut order = Vec::with_capacity(plan.steps.len());
        let plan_blocks = channels.len() as u32 * lanes;
        for (c, &channel) in channels.iter().enumerate() {
            let first = order.len() as u32;
            order.extend((0..n as u32).filter(|&i| plan.steps[i as usize].channel == channel));
            let count = order.len() as u32 - first;
            for lane in 0..lanes {
                blocks.push(BlockDesc {
                    plan: p as u32,
                    channel: channel as u32,
                    first,
                    count,
                    plan_blocks,
                    index_in_plan: c as u32 * lanes + lane,
                    lane,
                    _pad: 0,
                });
            }
        }
        let small = |what: &str, n: usize| u32::try_from(n).map_err(|_| format!("{what} {n} does not fit the image"));
        let mut desc = PlanDesc {
            rank: plan.rank,
            n_ranks: plan.n_ranks,
            dtype: plan.dtype as u32,
            op: u32::from(plan.op.nccl_code()),
            elem: plan.elem as u32,
            tile: small("tile", plan.tile)?,
            n_tiles: small("tiles", plan.n_tiles)?,
            capacity: small("chunk capacity", plan.capacity)?,
            n_instrs: plan.steps.len() as u32,
            n_links: plan.links.len() as u32,
            n_bufs: plan.bases.len() as u32,
            avg: epilogue,
            lanes,
            out_buf: plan.output.0 as u32,
            out_lo: plan.output.1.start as u64,
            out_hi: plan.output.1.end as u64,
            fingerprint: plan.fingerprint,
            // PreMulSum's factor; for a user's operator, its handle in this process (`UserOp::index`).
            factor: match plan.op {
                ReduceOp::User(user) => u64::from(user.index()),
                _ => plan.factor.as_ref().map_or(0, |f| u64::from_le_bytes(f.element())),
            },
            ..PlanDesc::default()
        };
        desc.instrs = w.table(&instrs);
        desc.pieces = w.table(&pieces);
        desc.deps = w.table(&deps);
        desc.order = w.table(&order);
        desc.links = w.table(&links);
        let unscaled: Vec<[u64; 2]> = plan.unscaled.iter().map(|r| [r.start as u64, r.end as u64]).collect();
        (desc.unscaled, desc.n_unscaled) = (w.table(&unscaled), unscaled.len() as u32);
        desc.bases_at = bases_words as u32;
        bases_words += plan.bases.len();
        desc.done_at = state as u32;
        state += lanes as usize * plan.steps.len();
        desc.link_start_at = state as u32;
        state += lanes as usize * plan.links.len();
        desc.finished_at = state as u32;
        state += plan_blocks as usize;
        descs.push(desc);
    }
    let conn_table_at = state;
    let n_conns = conns.len();
    let conns: Vec<(u32, u32, u8, usize, u32)> =
        (0..lanes).flat_map(|lane| conns.iter().map(move |&(f, t, c, b)| (f, t, c, b, lane))).collect();
    state += conns.len();
    let header = Header {
        magic: MAGIC,
        version: VERSION,
        n_plans: plans.len() as u32,
        n_blocks: blocks.len() as u32,
        n_conns: n_conns as u32,
        blocks: w.table(&blocks),
        plans: w.table(&descs),
        state_words: state as u32,
        conn_table: conn_table_at as u32,
        bases_words: bases_words as u32,
    };
    w.align();
    w.0[..std::mem::size_of::<Header>()].copy_from_slice(unsafe {
        // SAFETY: Header is repr(C) of u32s.
        std::slice::from_raw_parts((&header as *const Header).cast::<u8>(), std::mem::size_of::<Header>())
    });
    let words = w.0.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
    Ok(Image { words, conns })
}

// The CUDA interpreter declares the same structs; `kernels/cuda/interpret.cu` asserts these sizes (the Rust side
// passes them in as macros when it compiles the kernels).
const _: () = assert!(std::mem::size_of::<Header>() == 40);
const _: () = assert!(std::mem::size_of::<BlockDesc>() == 32);
const _: () = assert!(std::mem::size_of::<PlanDesc>() == 136);
const _: () = assert!(std::mem::size_of::<DInstr>() == 32);
const _: () = assert!(std::mem::size_of::<DPiece>() == 48);
const _: () = assert!(std::mem::size_of::<DLink>() == 16);

/// The layout constants the CUDA source is compiled with, so a struct that drifts from this file fails to compile.
#[cfg(any(feature = "cuda", feature = "cuda-host", test))]
pub fn layout_defines() -> Vec<(String, String)> {
    let mut defines: Vec<(String, String)> = [
        ("COLLC_MAGIC", MAGIC as u64),
        ("COLLC_VERSION", VERSION as u64),
        ("COLLC_SLOTS", SLOTS),
        ("COLLC_THREADS", THREADS as u64),
        ("COLLC_HEADER_BYTES", std::mem::size_of::<Header>() as u64),
        ("COLLC_BLOCK_BYTES", std::mem::size_of::<BlockDesc>() as u64),
        ("COLLC_PLAN_BYTES", std::mem::size_of::<PlanDesc>() as u64),
        ("COLLC_INSTR_BYTES", std::mem::size_of::<DInstr>() as u64),
        ("COLLC_PIECE_BYTES", std::mem::size_of::<DPiece>() as u64),
        ("COLLC_LINK_BYTES", std::mem::size_of::<DLink>() as u64),
        ("COLLC_CONN_WORDS", CONN_WORDS as u64),
        ("COLLC_RECORD_BYTES", RECORD_BYTES as u64),
        ("COLLC_CONTROL_WORDS", CONTROL_WORDS as u64),
        ("COLLC_OP_MASK", OP_MASK as u64),
        ("COLLC_SENDS_REFERENCES", SENDS_REFERENCES as u64),
        ("COLLC_RECEIVES_REFERENCES", RECEIVES_REFERENCES as u64),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for (i, op) in Op::ALL.iter().enumerate() {
        defines.push((format!("COLLC_OP_{}", op_name_upper(*op)), i.to_string()));
    }
    defines
}

#[cfg(any(feature = "cuda", feature = "cuda-host", test))]
fn op_name_upper(op: Op) -> &'static str {
    match op {
        Op::Send => "SEND",
        Op::Recv => "RECV",
        Op::RecvReduceCopy => "RECV_REDUCE_COPY",
        Op::RecvReduceSend => "RECV_REDUCE_SEND",
        Op::RecvReduceCopySend => "RECV_REDUCE_COPY_SEND",
        Op::RecvCopySend => "RECV_COPY_SEND",
        Op::Copy => "COPY",
        Op::Reduce => "REDUCE",
    }
}
