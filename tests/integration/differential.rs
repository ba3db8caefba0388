//! Differential fuzzing of the verifier against the executors (issue 30): the verifier is sound only if every
//! schedule it accepts computes its collective's contract on every executor, for any data.
//!
//! Schedules the compiler would not produce come from (`mutate.rs`, `generate.rs`; tests/README.md has the list):
//!
//! - mutations of the library's schedules (every embedded algorithm at 2..=5 ranks, both placements, fused and
//!   unfused): instructions swapped, moved, duplicated or deleted (with their partner on the other end of the
//!   connection, or not), split; retargeted (peer, operand buffer or index, count, op, channel); operands moved onto
//!   each other (so `src`, `acc` and `dst` overlap partly or fully); in place the same memory named through `in` and
//!   `out`; a value restaged elsewhere; dependencies dropped or added;
//! - small random schedules built to compute a collective (`constructive`: random routes, fused forwards,
//!   reductions in random order, staging in scratch, in place through either name of a chunk; `direct`: all sends
//!   before all receives, more messages than a connection's slots; `sweep`: accumulators overlapping their
//!   results), half of them mutated once more;
//! - pure noise: random ops, operands, peers, channels and dependencies over 2..=5 ranks.
//!
//! Each schedule is verified exactly. Every accepted one runs on random data through the reference interpreter,
//! the host executor over the threads transport (interpreted, and compiled by the JIT) and the device interpreter's host twin, at several counts (one the
//! chunk count does not divide, one cut into several tiles by a small link slot) and dtypes: integers with sum
//! (wrapping addition is associative and commutative, so every reduction order gives one exact answer) compared
//! bit for bit with the contract computed from the inputs alone, and random finite floats (compared with the
//! contract where nothing is reduced, and with the reference interpreter where something is); an eighth of the calls
//! reduce by a user's operator, compared with the reference interpreter. Buffers carry guard
//! bytes; out of place the send buffer must come back untouched.
//!
//! Executors may abort the process on a schedule they run badly (a debug build checks `copy_nonoverlapping`), so
//! the cases run in worker processes of this binary (`COLLC_FUZZ_WORKER`) that report line by line; an abort or a
//! hang is the failure of the case it happened in. An accepted schedule that any executor gets wrong fails the
//! test, which prints, per class of failure, how many schedules fell in it and the smallest one (shrunk while it
//! stays accepted and wrong) as `.sched` text, with what each executor did. `COLLC_FUZZ_CASES` (default 2000, about
//! 25 s in a debug build) and `COLLC_FUZZ_SEED` (hex or decimal) size and replay a run; see tests/README.md.

mod generate;
mod mutate;

use crate::contract::buffer_chunks;
use collc_compiler::emit::{write_sched, SchedLines};
use collc_compiler::library::LIBRARY;
use collc_compiler::sched::{BufId, Instr, Operand, RankProgram};
use collc_compiler::{
    compile, verify, Bindings, Collective, Limits, Options, Placement, Schedule, Verification, VerifiedSchedule,
};
use collc_kernels::{DataType, ReduceOp, Scalar};
use collc_runtime::reference::RankBuffers;
use collc_runtime::{Buffers, CallShape, Communicator, HostExecutor, Options as RunOptions};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// SplitMix64, seeded: every case of a run is replayed from `COLLC_FUZZ_SEED` and its index.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x6a09_e667_f3bc_c909)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + self.below((hi - lo + 1) as usize) as u32
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u32) -> bool {
        self.below(100) < percent as usize
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    pub fn fill(&mut self, bytes: &mut [u8]) {
        for chunk in bytes.chunks_mut(8) {
            let word = self.next().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}

/// One rank's program as editable (instruction, dependencies) pairs.
pub type Entries = Vec<(Instr, Vec<u32>)>;

pub fn entries(program: &RankProgram) -> Entries {
    (0..program.len()).map(|i| (program.instrs[i], program.deps_of(i).to_vec())).collect()
}

/// A rank program from entries: dependencies sorted, deduplicated, and only on earlier instructions.
pub fn program(entries: &Entries) -> RankProgram {
    let mut out = RankProgram::default();
    for (i, (instr, deps)) in entries.iter().enumerate() {
        let mut deps: Vec<u32> = deps.iter().copied().filter(|&d| (d as usize) < i).collect();
        deps.sort_unstable();
        deps.dedup();
        out.push(*instr, &deps);
    }
    out
}

/// The buffer `in` and `out` share in place (the larger, `out` when equal), and the other name.
pub fn shared_and_other(sched: &Schedule) -> (BufId, BufId) {
    let (in_chunks, out_chunks) = buffer_chunks(sched.collective, sched.n_ranks, sched.chunks);
    if in_chunks > out_chunks {
        (BufId::IN, BufId::OUT)
    } else {
        (BufId::OUT, BufId::IN)
    }
}

/// Where `in` and `out` start in the shared buffer in place (docs/language.md §7), written out again here.
pub fn in_place_offsets(collective: Collective, rank: u32, chunks: u32) -> (u32, u32) {
    match collective {
        Collective::AllGather | Collective::Gather => (rank * chunks, 0),
        Collective::ReduceScatter | Collective::Scatter => (0, rank * chunks),
        _ => (0, 0),
    }
}

/// The memory an operand names: in place, `in` and `out` are windows of the shared buffer.
pub fn physical(sched: &Schedule, rank: u32, o: Operand) -> (BufId, u32) {
    if sched.placement == Placement::InPlace {
        let (shared, other) = shared_and_other(sched);
        if o.buf == other {
            let (in_offset, out_offset) = in_place_offsets(sched.collective, rank, sched.chunks);
            let shift = if other == BufId::IN { in_offset } else { out_offset };
            return (shared, o.index + shift);
        }
    }
    (o.buf, o.index)
}

/// The collectives with a root, and sendrecv's peer.
fn rooted(collective: Collective) -> bool {
    matches!(
        collective,
        Collective::Broadcast | Collective::Reduce | Collective::Gather | Collective::Scatter | Collective::SendRecv
    )
}

// ---------------------------------------------------------------------------------------------------------------
// Contract, windows and data
// ---------------------------------------------------------------------------------------------------------------

fn is_float(dtype: DataType) -> bool {
    matches!(dtype, DataType::F16 | DataType::Bf16 | DataType::F32 | DataType::F64)
}

/// Element-wise wrapping sum of integer elements of `size` bytes, little endian.
fn add_into(size: usize, sum: &mut [u8], x: &[u8]) {
    for (s, x) in sum.chunks_exact_mut(size).zip(x.chunks_exact(size)) {
        let mut a = [0u8; 8];
        let mut b = [0u8; 8];
        a[..size].copy_from_slice(s);
        b[..size].copy_from_slice(x);
        let r = u64::from_le_bytes(a).wrapping_add(u64::from_le_bytes(b)).to_le_bytes();
        s.copy_from_slice(&r[..size]);
    }
}

/// `x` with each integer element multiplied by `factor`, wrapping (a premulsum's input, by the fuzzer's own arithmetic:
/// the low bytes of a product depend only on the low bytes of its operands).
fn times(size: usize, x: &[u8], factor: u64) -> Vec<u8> {
    let mut out = x.to_vec();
    for element in out.chunks_exact_mut(size) {
        let mut a = [0u8; 8];
        a[..size].copy_from_slice(element);
        element.copy_from_slice(&u64::from_le_bytes(a).wrapping_mul(factor).to_le_bytes()[..size]);
    }
    out
}

/// Random bits per element; for floats, an all-ones exponent (infinity or NaN) loses its top bit, so every value
/// is finite.
fn random_data(rng: &mut Rng, dtype: DataType, elements: usize) -> Vec<u8> {
    let size = dtype.size_bytes();
    let mut bytes = vec![0u8; elements * size];
    rng.fill(&mut bytes);
    let (exp_lo, exp_bits) = match dtype {
        DataType::F16 => (10, 5),
        DataType::Bf16 => (7, 8),
        DataType::F32 => (23, 8),
        DataType::F64 => (52, 11),
        _ => return bytes,
    };
    for e in bytes.chunks_exact_mut(size) {
        let mut w = [0u8; 8];
        w[..size].copy_from_slice(e);
        let mut v = u64::from_le_bytes(w);
        let mask = ((1u64 << exp_bits) - 1) << exp_lo;
        if v & mask == mask {
            v &= !(1u64 << (exp_lo + exp_bits - 1));
        }
        e.copy_from_slice(&v.to_le_bytes()[..size]);
    }
    bytes
}

/// Byte layout of one rank's call buffers: sizes of send and receive buffers, and where the input and the output
/// lie (in the send and receive buffer out of place; both in the one buffer in place).
struct Layout {
    send: usize,
    recv: usize,
    input: std::ops::Range<usize>,
    output: std::ops::Range<usize>,
}

fn layout(collective: Collective, p: u32, rank: u32, block: usize, in_place: bool) -> Layout {
    let (in_blocks, out_blocks) = buffer_chunks(collective, p, 1);
    let (in_blocks, out_blocks) = (in_blocks as usize, out_blocks as usize);
    let (i, o) = if in_place { in_place_offsets(collective, rank, 1) } else { (0, 0) };
    let (i, o) = (i as usize * block, o as usize * block);
    let (send, recv) = match in_place {
        true => (in_blocks.max(out_blocks) * block, in_blocks.max(out_blocks) * block),
        false => (in_blocks * block, out_blocks * block),
    };
    Layout { send, recv, input: i..i + in_blocks * block, output: o..o + out_blocks * block }
}

/// What `rank`'s output window must hold, from the inputs alone; `None` where the contract is silent, or where it
/// reduces floats (whose sum depends on the order: those are compared with the reference interpreter instead).
fn contract_output(shape: &CallShape, p: u32, rank: u32, inputs: &[Vec<u8>]) -> Option<Vec<u8>> {
    let (size, block) = (shape.dtype.size_bytes(), shape.count * shape.dtype.size_bytes());
    let x = |q: u32, b: u32| &inputs[q as usize][b as usize * block..(b as usize + 1) * block];
    let sum = |b: u32| {
        // A user's operator is compared with the reference interpreter's evaluation of it.
        if is_float(shape.dtype) || matches!(shape.op, ReduceOp::User(_)) {
            return None;
        }
        let mut s = vec![0u8; block];
        match shape.op {
            ReduceOp::PreMulSum(Scalar::Int(factor)) => {
                (0..p).for_each(|q| add_into(size, &mut s, &times(size, x(q, b), factor as u64)))
            }
            _ => (0..p).for_each(|q| add_into(size, &mut s, x(q, b))),
        }
        Some(s)
    };
    let concat = |f: &dyn Fn(u32) -> Vec<u8>| Some((0..p).flat_map(f).collect::<Vec<u8>>());
    let (root, peer) = (shape.root, shape.peer);
    match shape.collective {
        Collective::AllReduce => sum(0),
        Collective::ReduceScatter => sum(rank),
        Collective::Reduce if rank == root => sum(0),
        Collective::AllGather => concat(&|q| x(q, 0).to_vec()),
        Collective::Gather if rank == root => concat(&|q| x(q, 0).to_vec()),
        Collective::Broadcast => Some(x(root, 0).to_vec()),
        Collective::Scatter => Some(x(root, rank).to_vec()),
        Collective::AllToAll => concat(&|q| x(q, rank).to_vec()),
        Collective::SendRecv if rank == peer => Some(x(root, 0).to_vec()),
        _ => None,
    }
}

/// Whether `rank`'s output is checked at all.
fn checked(collective: Collective, rank: u32, root: u32, peer: u32) -> bool {
    match collective {
        Collective::Reduce | Collective::Gather => rank == root,
        Collective::SendRecv => rank == peer,
        _ => true,
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Executors
// ---------------------------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Executor {
    Reference,
    Threads,
    /// The threads transport with each rank's plan compiled (`HostExecutor::Jit`).
    Jit,
    Twin,
}

const EXECUTORS: [Executor; 4] = [Executor::Reference, Executor::Threads, Executor::Jit, Executor::Twin];

/// One call's data: every rank's input (its whole send buffer) and the bytes every other byte of its buffers starts
/// as (`recv` out of place, the shared buffer outside the input in place, scratch for the reference).
struct Data {
    shape: CallShape,
    inputs: Vec<Vec<u8>>,
    garbage: Vec<Vec<u8>>,
    scratch_seed: u64,
}

const GUARD_BYTE: u8 = 0xA5;

/// Guard bytes on each side of every runtime buffer: 64, or `COLLC_FUZZ_GUARD` (0 lets a memory checker such as
/// valgrind see a read past the caller's buffer, which guard bytes would absorb).
fn guard() -> usize {
    static GUARD: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *GUARD.get_or_init(|| env_number("COLLC_FUZZ_GUARD").map_or(64, |g| g as usize))
}

/// What one executor made of one call: each rank's output window, or why there is none.
type Outputs = Result<Vec<Vec<u8>>, String>;

fn run_reference(sched: &VerifiedSchedule, data: &Data) -> Outputs {
    let p = sched.n_ranks;
    let in_place = sched.placement == Placement::InPlace;
    let block = data.shape.count * data.shape.dtype.size_bytes();
    let (shared, _) = shared_and_other(sched);
    let mut rng = Rng::new(data.scratch_seed);
    let mut buffers: Vec<RankBuffers> = (0..p)
        .map(|rank| {
            let l = layout(sched.collective, p, rank, block, in_place);
            let mut bufs: RankBuffers = vec![Vec::new(); sched.buffers.len()];
            if in_place {
                let mut one = data.garbage[rank as usize][..l.send].to_vec();
                one[l.input.clone()].copy_from_slice(&data.inputs[rank as usize]);
                bufs[shared.0 as usize] = one;
            } else {
                bufs[0] = data.inputs[rank as usize].clone();
                bufs[1] = data.garbage[rank as usize][..l.recv].to_vec();
            }
            // Scratch starts as garbage too (the reference would zero it): reading it unwritten must show.
            for (b, decl) in sched.buffers.iter().enumerate().skip(2) {
                let bytes =
                    collc_runtime::ChunkLayout::new(data.shape.count, sched.chunks).elements(0, decl.chunks).end
                        * data.shape.dtype.size_bytes();
                let mut s = vec![0u8; bytes];
                rng.fill(&mut s);
                bufs[b] = s;
            }
            bufs
        })
        .collect();
    let shape = data.shape;
    collc_runtime::run(sched, &mut buffers, shape.count, shape.dtype, shape.op).map_err(|e| format!("error: {e}"))?;
    let mut out = Vec::new();
    for rank in 0..p {
        let l = layout(sched.collective, p, rank, block, in_place);
        let bufs = &buffers[rank as usize];
        if in_place {
            out.push(bufs[shared.0 as usize][l.output].to_vec());
        } else {
            if bufs[0] != data.inputs[rank as usize] {
                return Err(format!("rank {rank} wrote its send buffer"));
            }
            out.push(bufs[1][l.output].to_vec());
        }
    }
    Ok(out)
}

/// Runs one call on every rank of `comms` (a thread each) and returns each rank's output window.
fn run_group(comms: &mut [Communicator], placement: Placement, data: &Data) -> Outputs {
    let p = comms.len() as u32;
    let in_place = placement == Placement::InPlace;
    let shape = data.shape;
    let block = shape.count * shape.dtype.size_bytes();
    let g = guard();
    let results: Vec<Result<Vec<u8>, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .iter_mut()
            .map(|comm| {
                scope.spawn(move || {
                    let rank = comm.rank();
                    let l = layout(shape.collective, p, rank, block, in_place);
                    let input = &data.inputs[rank as usize];
                    let guarded = |payload: &[u8]| {
                        let mut bytes = vec![GUARD_BYTE; payload.len() + 2 * g];
                        bytes[g..g + payload.len()].copy_from_slice(payload);
                        bytes
                    };
                    let intact = |bytes: &[u8]| {
                        let n = bytes.len();
                        bytes[..g].iter().chain(&bytes[n - g..]).all(|&b| b == GUARD_BYTE)
                    };
                    if in_place {
                        let mut one = data.garbage[rank as usize][..l.send].to_vec();
                        one[l.input.clone()].copy_from_slice(input);
                        let mut buf = guarded(&one);
                        let n = buf.len() - 2 * g;
                        comm.call(shape, Buffers::InPlace(&mut buf[g..g + n]))
                            .map_err(|e| format!("rank {rank}: error: {e}"))?;
                        if !intact(&buf) {
                            return Err(format!("rank {rank}: a guard byte changed"));
                        }
                        return Ok(buf[g + l.output.start..g + l.output.end].to_vec());
                    }
                    let send = guarded(input);
                    let mut recv = guarded(&data.garbage[rank as usize][..l.recv]);
                    let n = recv.len() - 2 * g;
                    comm.call(
                        shape,
                        Buffers::OutOfPlace { send: &send[g..g + input.len()], recv: &mut recv[g..g + n] },
                    )
                    .map_err(|e| format!("rank {rank}: error: {e}"))?;
                    if !intact(&send) || !intact(&recv) {
                        return Err(format!("rank {rank}: a guard byte changed"));
                    }
                    if &send[g..g + input.len()] != input.as_slice() {
                        return Err(format!("rank {rank}: the send buffer changed"));
                    }
                    Ok(recv[g + l.output.start..g + l.output.end].to_vec())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a rank thread panicked".to_string()))).collect()
    });
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(o) => out.push(o),
            Err(e) => errors.push(e),
        }
    }
    match errors.is_empty() {
        true => Ok(out),
        false => Err(errors.join("; ")),
    }
}

/// Link slot bytes for the runtime executors: small, so that calls of a few hundred elements run in several tiles.
const SLOT_BYTES: usize = 256;

fn group(executor: Executor, p: u32) -> Result<Vec<Communicator>, String> {
    let options = RunOptions { timeout: Duration::from_secs(5), slot_bytes: SLOT_BYTES, ..RunOptions::default() };
    match executor {
        Executor::Threads => Communicator::threads(p, options),
        Executor::Jit => Communicator::threads(p, RunOptions { executor: HostExecutor::Jit, ..options }),
        Executor::Twin => Communicator::twin(p, options),
        Executor::Reference => unreachable!("the reference needs no communicators"),
    }
    .map_err(|e| format!("no communicators: {e}"))
}

/// Every executor on one accepted schedule, for each call: which were wrong, and how.
struct Runner {
    /// A fresh name per schedule: the communicators of a group share compiled schedules by name.
    serial: u64,
    /// Executors not to run (one that aborted the process on this schedule before).
    skip: Vec<Executor>,
}

/// Says which executor and call run next (`@exec`), so that a parent process can name the one that aborted.
fn announce(executor: Executor, call: usize) {
    println!("@exec {executor:?} {call}");
}

impl Runner {
    /// Runs `calls` through every executor; returns (executor, call index, what was wrong) for each wrong result.
    fn run(&mut self, sched: &VerifiedSchedule, calls: &[Data]) -> Vec<(Executor, usize, String)> {
        self.serial += 1;
        let name = format!("fuzz-{}", self.serial);
        let fixed = Arc::new((sched.clone(), SchedLines::default()));
        let mut wrong = Vec::new();
        let mut reference: Vec<Outputs> = Vec::new();
        for executor in EXECUTORS.into_iter().filter(|e| !self.skip.contains(e)) {
            let mut comms: Option<Vec<Communicator>> = None;
            for (index, data) in calls.iter().enumerate() {
                announce(executor, index);
                let outputs = match executor {
                    Executor::Reference => catch_unwind(AssertUnwindSafe(|| run_reference(sched, data)))
                        .unwrap_or_else(|_| Err("panicked".into())),
                    _ => {
                        if comms.is_none() {
                            comms = match group(executor, sched.n_ranks) {
                                Ok(mut c) => {
                                    c.iter_mut().for_each(|comm| comm.set_schedule(&name, fixed.clone()));
                                    Some(c)
                                }
                                Err(e) => {
                                    wrong.push((executor, index, e));
                                    continue;
                                }
                            };
                        }
                        let c = comms.as_mut().expect("made above");
                        let outcome = catch_unwind(AssertUnwindSafe(|| run_group(c, sched.placement, data)))
                            .unwrap_or_else(|_| Err("panicked".into()));
                        if outcome.is_err() {
                            // An aborted group is done with: the next call gets a fresh one.
                            comms = None;
                        }
                        outcome
                    }
                };
                // Where the contract is silent on a checked output (floats reduced), the reference is the judge.
                let why = judge(sched, data, &outputs).or_else(|| match executor {
                    Executor::Reference => None,
                    _ => reference.get(index).and_then(|r| judge_against(sched, data, &outputs, r)),
                });
                if let Some(why) = why {
                    wrong.push((executor, index, why));
                }
                if executor == Executor::Reference {
                    reference.push(outputs);
                }
            }
        }
        wrong
    }
}

/// Why `outputs` is wrong for the call `data` by the contract, if it is.
fn judge(sched: &Schedule, data: &Data, outputs: &Outputs) -> Option<String> {
    let outputs = match outputs {
        Ok(o) => o,
        Err(e) => return Some(e.clone()),
    };
    let shape = &data.shape;
    for rank in 0..sched.n_ranks {
        let Some(want) = contract_output(shape, sched.n_ranks, rank, &data.inputs) else { continue };
        let got = &outputs[rank as usize];
        if got != &want {
            let size = shape.dtype.size_bytes();
            let bad: Vec<usize> = (0..want.len() / size.max(1))
                .filter(|&e| got[e * size..(e + 1) * size] != want[e * size..(e + 1) * size])
                .collect();
            return Some(format!(
                "rank {rank}: {} of {} elements differ from the contract (first at element {})",
                bad.len(),
                want.len() / size.max(1),
                bad.first().copied().unwrap_or(0)
            ));
        }
    }
    None
}

/// For calls whose contract is silent (float reductions): where `outputs` differs from the reference's.
fn judge_against(sched: &Schedule, data: &Data, outputs: &Outputs, reference: &Outputs) -> Option<String> {
    let (Ok(outputs), Ok(reference)) = (outputs, reference) else { return None };
    for rank in 0..sched.n_ranks {
        if !checked(sched.collective, rank, sched.root, sched.peer)
            || contract_output(&data.shape, sched.n_ranks, rank, &data.inputs).is_some()
        {
            continue;
        }
        if outputs[rank as usize] != reference[rank as usize] {
            return Some(format!("rank {rank}: the output differs from the reference interpreter's"));
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------------------------

/// A schedule to try, and how it was made.
pub struct Case {
    pub origin: String,
    pub sched: Schedule,
}

/// A library schedule to mutate.
struct Base {
    name: String,
    sched: Schedule,
}

fn collective_of(source: &str) -> Collective {
    let file = collc_grammar::parse(source, &Limits::default().syntax).expect("library parses");
    file.algorithm.collective.name.parse().expect("a collective")
}

/// Every library algorithm at 2..=5 ranks, both placements, fused (as compiled) and unfused, one root drawn each.
fn bases(rng: &mut Rng) -> Vec<Base> {
    let limits = Limits { verification: Verification::Exact, ..Limits::default() };
    let mut out = Vec::new();
    for (name, source) in LIBRARY {
        let collective = collective_of(source);
        for p in 2..=5u32 {
            let root = rng.below(p as usize) as u32;
            let peer = (root + 1 + rng.below(p as usize - 1) as u32) % p;
            let bindings = Bindings {
                n_ranks: p,
                root: rooted(collective).then_some(root),
                peer: (collective == Collective::SendRecv).then_some(peer),
                params: crate::corpus::bindings(source, p).params,
            };
            for placement in Placement::BOTH {
                for fuse in [true, false] {
                    let options = Options { placement, fuse, pipeline: None };
                    let Ok(verified) = compile(source, &bindings, options, &limits) else { continue };
                    let text = if fuse { "" } else { " unfused" };
                    out.push(Base { name: format!("{name} p={p} {placement}{text}"), sched: verified.into_schedule() });
                }
            }
        }
    }
    out
}

fn make_case(index: u64, seed: u64, bases: &[Base]) -> Case {
    let mut rng = Rng::new(seed.wrapping_mul(0x1000_0000_01b3) ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let roll = rng.below(100);
    if roll < 60 {
        let base = &bases[rng.below(bases.len())];
        let n = match rng.below(100) {
            0..=59 => 1,
            60..=84 => 2,
            _ => 3,
        };
        let (sched, what) = mutate::mutate(&base.sched, &mut rng, n);
        return Case { origin: format!("{}: {}", base.name, what.join("; ")), sched };
    }
    if roll < 63 {
        let base = &bases[rng.below(bases.len())];
        return Case { origin: format!("{}: unmutated", base.name), sched: base.sched.clone() };
    }
    if roll < 92 {
        let (name, sched) = match roll {
            63..=80 => ("random", generate::constructive(&mut rng)),
            81..=82 => ("sweep", generate::sweep(&mut rng)),
            _ => ("direct", generate::direct(&mut rng)),
        };
        if rng.chance(50) {
            let (sched, what) = mutate::mutate(&sched, &mut rng, 1);
            return Case { origin: format!("{name}: {}", what.join("; ")), sched };
        }
        return Case { origin: name.into(), sched };
    }
    Case { origin: "noise".into(), sched: generate::noise(&mut rng) }
}

/// The calls an accepted schedule runs: integer sums at a count the chunk count does not divide and at one cut into
/// tiles, a float call, and one more integer call of another width (or of no elements). A quarter of them are
/// premulsums by a small factor: each rank's input multiplied where the schedule first reads it; an eighth reduce by
/// a user's operator (`absmax`, compiled with cranelift in the executors, evaluated in the reference).
fn calls_for(sched: &Schedule, rng: &mut Rng) -> Vec<Data> {
    let c = sched.chunks.max(1) as usize;
    let small = c * rng.range(0, 3) as usize + 1 + rng.below(c.max(2) - 1);
    let large = 300 + rng.below(700);
    let float = rng.pick(&[DataType::F32, DataType::F64, DataType::F16, DataType::Bf16]);
    let int = rng.pick(&[DataType::I8, DataType::U8, DataType::I32, DataType::I64, DataType::U64]);
    let zero_or_large = if rng.chance(10) { 0 } else { large };
    let mut out = Vec::new();
    for (count, dtype) in
        [(small, DataType::U32), (large, DataType::U32), (1 + rng.below(200), float), (zero_or_large, int)]
    {
        let shape = CallShape {
            collective: sched.collective,
            count,
            dtype,
            op: match rng.below(8) {
                0 | 1 => ReduceOp::PreMulSum(Scalar::Int(2 + rng.below(6) as i128)),
                2 => collc_runtime::check::user_ops()[0],
                _ => ReduceOp::Sum,
            },
            root: sched.root,
            peer: sched.peer,
        };
        let (in_blocks, out_blocks) = buffer_chunks(sched.collective, sched.n_ranks, 1);
        let elems = count * in_blocks.max(out_blocks) as usize;
        let inputs = (0..sched.n_ranks).map(|_| random_data(rng, dtype, count * in_blocks as usize)).collect();
        let garbage = (0..sched.n_ranks).map(|_| random_data(rng, dtype, elems)).collect();
        out.push(Data { shape, inputs, garbage, scratch_seed: rng.next() });
    }
    out
}

// ---------------------------------------------------------------------------------------------------------------
// Failures: classes, shrinking, the report
// ---------------------------------------------------------------------------------------------------------------

/// What a wrong schedule does that the compiler's schedules never do, as far as it can be named from the schedule
/// alone: every feature that applies, joined (`plain` when none does).
fn feature(sched: &Schedule) -> String {
    let mut found: Vec<&str> = Vec::new();
    let mut note = |f: &'static str| {
        if !found.contains(&f) {
            found.push(f);
        }
    };
    let (_, other) = shared_and_other(sched);
    for (rank, program) in sched.ranks.iter().enumerate() {
        for instr in &program.instrs {
            if instr.count == 0 {
                note("count 0");
            }
            let ops = [instr.src, instr.acc, instr.dst];
            if sched.placement == Placement::InPlace && ops.iter().any(|o| o.get().is_some_and(|o| o.buf == other)) {
                note("in place names both in and out");
            }
            let Some(dst) = instr.dst.get() else { continue };
            let d = physical(sched, rank as u32, dst);
            let n = instr.count;
            let overlap = |o: Operand| {
                let s = physical(sched, rank as u32, o);
                match s.0 == d.0 && s.1 < d.1 + n && d.1 < s.1 + n {
                    false => None,
                    true => Some(s.1 == d.1),
                }
            };
            match instr.src.get().and_then(overlap) {
                Some(true) => note("src = dst"),
                Some(false) => note("src partly overlaps dst"),
                None => {}
            }
            if instr.acc.get().and_then(overlap) == Some(false) {
                note("acc partly overlaps dst");
            }
            if let (Some(a), Some(s)) = (instr.acc.get(), instr.src.get()) {
                if physical(sched, rank as u32, a) == physical(sched, rank as u32, s) {
                    note("acc = src");
                }
            }
        }
    }
    match found.is_empty() {
        true => "plain".into(),
        false => found.join(", "),
    }
}

fn limits() -> Limits {
    Limits { verification: Verification::Exact, ..Limits::default() }
}

fn env_number(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    let text = text.trim();
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// The seed of the calls case `index` runs.
fn call_seed(seed: u64, index: u64) -> u64 {
    seed ^ index.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x5bd1_e995
}

/// What happened to one schedule on the executors, as a worker reports it.
#[derive(Clone, Debug, Default)]
struct Verdict {
    accepted: bool,
    /// (executor, call, why); an executor that took the worker down reports `aborted: ...`.
    wrong: Vec<(String, usize, String)>,
    verifier_panicked: bool,
}

// ---------------------------------------------------------------------------------------------------------------
// Workers: an executor that runs an accepted schedule unsoundly may abort the process (a debug build's check of
// `copy_nonoverlapping`), so the schedules run in a child process of this test binary, which reports line by line.
// ---------------------------------------------------------------------------------------------------------------

const WORKER: &str = "COLLC_FUZZ_WORKER";
const TEST_NAME: &str = "differential::verified_schedules_compute_their_contract_on_every_executor";

/// Verifies `sched` and, if it is accepted, runs it, printing `@accepted`, `@exec` and `@wrong` lines.
fn work_one(sched: &Schedule, seed: u64, runner: &mut Runner) {
    let verdict = catch_unwind(AssertUnwindSafe(|| verify(sched.clone(), "", &limits())));
    let verified = match verdict {
        Err(_) => {
            println!("@verifier-panic");
            return;
        }
        Ok(Err(_)) => {
            println!("@rejected");
            return;
        }
        Ok(Ok(v)) => v,
    };
    println!("@accepted");
    let calls = calls_for(sched, &mut Rng::new(seed));
    for (executor, call, why) in runner.run(&verified, &calls) {
        let shape = &calls[call].shape;
        println!("@wrong {executor:?} {call} count={} {}: {}", shape.count, shape.dtype, why.replace('\n', " "));
    }
}

/// The worker's side: `range` runs cases `COLLC_FUZZ_FROM..COLLC_FUZZ_TO`; `one` runs the `.sched` file
/// `COLLC_FUZZ_SCHED` with the calls of `COLLC_FUZZ_CALL_SEED`.
fn worker(mode: &str) {
    // libtest has printed `test NAME ... ` without a newline: the report starts on a line of its own.
    println!();
    let mut runner = Runner { serial: 0, skip: Vec::new() };
    if mode == "one" {
        let skip = std::env::var("COLLC_FUZZ_SKIP").unwrap_or_default();
        runner.skip = EXECUTORS.into_iter().filter(|e| skip.split(',').any(|s| s == format!("{e:?}"))).collect();
        let path = std::env::var("COLLC_FUZZ_SCHED").expect("COLLC_FUZZ_SCHED names a .sched file");
        let text = std::fs::read_to_string(&path).expect("a readable .sched file");
        let sched = collc_compiler::emit::parse_sched(&text).expect("a .sched text");
        work_one(&sched, env_number("COLLC_FUZZ_CALL_SEED").unwrap_or(0), &mut runner);
        println!("@end");
        return;
    }
    let seed = env_number("COLLC_FUZZ_SEED").expect("the parent passes the seed");
    let (from, to) = (env_number("COLLC_FUZZ_FROM").unwrap_or(0), env_number("COLLC_FUZZ_TO").unwrap_or(0));
    let bases = bases(&mut Rng::new(seed));
    for index in from..to {
        let case = make_case(index, seed, &bases);
        println!("@case {index} {}", case.kind());
        work_one(&case.sched, call_seed(seed, index), &mut runner);
        println!("@done {index}");
    }
    println!("@end");
}

impl Case {
    fn kind(&self) -> &'static str {
        if self.origin.starts_with("random") {
            "random"
        } else if self.origin.starts_with("direct") {
            "direct"
        } else if self.origin.starts_with("sweep") {
            "sweep"
        } else if self.origin.starts_with("noise") {
            "noise"
        } else if self.origin.ends_with("unmutated") {
            "library"
        } else {
            "mutation"
        }
    }
}

/// A child process of this test binary in worker `mode`; its report lines, whether it ended by itself, and the
/// tail of its stderr. A child silent for `quiet` is killed.
fn spawn_worker(mode: &str, env: &[(&str, String)], quiet: Duration) -> (Vec<String>, bool, String) {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Command, Stdio};
    // This very binary even when a rebuild has replaced the file meanwhile (other builds share the target dir).
    let exe = match std::path::Path::new("/proc/self/exe").exists() {
        true => std::path::PathBuf::from("/proc/self/exe"),
        false => std::env::current_exe().expect("the test binary"),
    };
    let mut command = Command::new(exe);
    command
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(WORKER, mode)
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command.spawn().expect("a worker process");
    let stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with('@') && tx.send(line).is_err() {
                break;
            }
        }
    });
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut lines = Vec::new();
    let mut ended = false;
    loop {
        match rx.recv_timeout(quiet) {
            Ok(line) => {
                ended |= line == "@end";
                lines.push(line);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                lines.push("@hung".into());
                break;
            }
        }
    }
    let status = child.wait().expect("the worker's status");
    let _ = reader.join();
    let text = errors.join().unwrap_or_default();
    let tail: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = tail[tail.len().saturating_sub(4)..].join(" | ");
    (lines, ended && status.success(), tail)
}

/// Reads one schedule's report lines into a verdict; `crash` is what to say of an executor that never finished.
fn verdict_of(lines: &[String], crash: Option<&str>) -> Verdict {
    let mut v = Verdict::default();
    let mut last_exec: Option<(String, usize)> = None;
    for line in lines {
        let mut words = line.splitn(4, ' ');
        match words.next() {
            Some("@accepted") => v.accepted = true,
            Some("@verifier-panic") => v.verifier_panicked = true,
            Some("@exec") => {
                let executor = words.next().unwrap_or("?").to_string();
                let call = words.next().and_then(|c| c.parse().ok()).unwrap_or(0);
                last_exec = Some((executor, call));
            }
            Some("@wrong") => {
                let executor = words.next().unwrap_or("?").to_string();
                let call = words.next().and_then(|c| c.parse().ok()).unwrap_or(0);
                v.wrong.push((executor, call, words.next().unwrap_or("").to_string()));
            }
            _ => {}
        }
    }
    if let (Some(why), Some((executor, call))) = (crash, last_exec) {
        v.wrong.push((executor, call, format!("aborted the process: {why}")));
    }
    v
}

/// Runs one schedule in a worker, without the executors in `skip`: its verdict.
fn run_isolated(sched: &Schedule, seed: u64, skip: &[String], serial: &mut u64) -> Verdict {
    *serial += 1;
    let path = std::env::temp_dir().join(format!("collc-fuzz-{}-{serial}.sched", std::process::id()));
    std::fs::write(&path, write_sched(sched, "")).expect("a temporary .sched file");
    let env = [
        ("COLLC_FUZZ_SCHED", path.display().to_string()),
        ("COLLC_FUZZ_CALL_SEED", seed.to_string()),
        ("COLLC_FUZZ_SKIP", skip.join(",")),
    ];
    let (lines, ended, tail) = spawn_worker("one", &env, Duration::from_secs(60));
    let _ = std::fs::remove_file(&path);
    let why = if lines.last().is_some_and(|l| l == "@hung") { "hung" } else { tail.as_str() };
    verdict_of(&lines, (!ended).then_some(why))
}

/// Completes the verdict of a schedule that aborted its worker: the executors after the one that aborted run in
/// workers of their own, each aborting one skipped the next time.
fn complete(sched: &Schedule, seed: u64, mut verdict: Verdict, serial: &mut u64) -> Verdict {
    for _ in 0..EXECUTORS.len() {
        let aborted: Vec<String> =
            verdict.wrong.iter().filter(|w| w.2.starts_with("aborted")).map(|w| w.0.clone()).collect();
        let Some(last) = aborted.last() else { break };
        let order: Vec<String> = EXECUTORS.iter().map(|e| format!("{e:?}")).collect();
        let at = order.iter().position(|e| e == last).unwrap_or(order.len());
        // Those before the one that aborted have run; it is skipped; those after it have not run yet.
        let skip: Vec<String> = order[..=at.min(order.len() - 1)].to_vec();
        if at + 1 >= order.len() {
            break;
        }
        let more = run_isolated(sched, seed, &skip, serial);
        let aborted_again = more.wrong.iter().any(|w| w.2.starts_with("aborted"));
        verdict.wrong.extend(more.wrong);
        if !aborted_again {
            break;
        }
    }
    verdict
}

/// The executors a verdict finds wrong.
fn executors_of(v: &Verdict) -> Vec<String> {
    let mut e: Vec<String> = v.wrong.iter().map(|w| w.0.clone()).collect();
    e.sort();
    e.dedup();
    e
}

/// The class of a wrong schedule: what it does, which executors are wrong, and how.
fn class_of(sched: &Schedule, v: &Verdict) -> String {
    let how = |executor: &str| {
        let of: Vec<&(String, usize, String)> = v.wrong.iter().filter(|w| w.0 == executor).collect();
        if of.iter().any(|w| w.2.starts_with("aborted")) {
            "aborts"
        } else if of.iter().all(|w| w.2.contains("differ")) {
            "wrong values"
        } else if of.iter().any(|w| w.2.contains("guard") || w.2.contains("send buffer")) {
            "writes outside its output"
        } else {
            "errors"
        }
    };
    let executors: Vec<String> = executors_of(v).iter().map(|e| format!("{e} {}", how(e))).collect();
    format!("{} | {}", feature(sched), executors.join(", "))
}

/// Shrinks a wrong schedule: drops instructions (with the ends of their connections, or alone), dependencies, and
/// brings counts down, keeping each step while the result stays accepted and wrong on the same executors.
fn shrink(sched: &Schedule, want: &[String], seed: u64, budget: Duration, serial: &mut u64) -> Schedule {
    let start = Instant::now();
    let mut best = sched.clone();
    let mut progress = true;
    while progress && start.elapsed() < budget {
        progress = false;
        for candidate in mutate::shrink_steps(&best) {
            if start.elapsed() >= budget {
                break;
            }
            // Rejected candidates are weeded out here, without a process.
            if accepted(&candidate).is_none() {
                continue;
            }
            let v = run_isolated(&candidate, seed, &[], serial);
            if v.accepted && want.iter().all(|e| executors_of(&v).contains(e)) {
                best = candidate;
                progress = true;
                break;
            }
        }
    }
    best
}

fn accepted(sched: &Schedule) -> Option<VerifiedSchedule> {
    catch_unwind(AssertUnwindSafe(|| verify(sched.clone(), "", &limits()).ok())).ok().flatten()
}

/// One failure found: the case, its class and what the executors said.
struct Failure {
    index: u64,
    origin: String,
    sched: Schedule,
    class: String,
    verdict: Verdict,
}

#[test]
fn verified_schedules_compute_their_contract_on_every_executor() {
    if let Ok(mode) = std::env::var(WORKER) {
        return worker(&mode);
    }
    let cases = env_number("COLLC_FUZZ_CASES").unwrap_or(2000);
    let seed = env_number("COLLC_FUZZ_SEED").unwrap_or(0xC011_C0DE);
    let started = Instant::now();
    let bases = bases(&mut Rng::new(seed));
    let mut tally: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
    let mut by_mutation: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut accepted_features: BTreeMap<String, u64> = BTreeMap::new();
    let (mut accepted_n, mut ran_calls) = (0u64, 0u64);
    let mut failures: Vec<Failure> = Vec::new();
    let mut panics: Vec<u64> = Vec::new();
    let mut serial = 0;
    let mut from = 0;
    while from < cases {
        let env = [
            ("COLLC_FUZZ_SEED", seed.to_string()),
            ("COLLC_FUZZ_FROM", from.to_string()),
            ("COLLC_FUZZ_TO", cases.to_string()),
        ];
        let (lines, ended, tail) = spawn_worker("range", &env, Duration::from_secs(120));
        // Split the report by case.
        let mut current: Option<(u64, Vec<String>)> = None;
        let mut finished_upto = from;
        let mut handle = |index: u64, body: &[String], crash: Option<&str>| {
            let case = make_case(index, seed, &bases);
            let mut v = verdict_of(body, crash);
            if crash.is_some() {
                v = complete(&case.sched, call_seed(seed, index), v, &mut serial);
            }
            let entry = tally.entry(case.kind()).or_default();
            entry.0 += 1;
            if v.verifier_panicked {
                panics.push(index);
            }
            // Per mutation kind (each kind in the case's description once), tried and accepted.
            let mut kinds: Vec<&str> = case
                .origin
                .split(": ")
                .skip(1)
                .flat_map(|part| part.split("; "))
                .filter(|w| mutate::KINDS.contains(w))
                .collect();
            kinds.sort_unstable();
            kinds.dedup();
            for kind in kinds {
                let k = by_mutation.entry(kind.to_string()).or_default();
                k.0 += 1;
                k.1 += u64::from(v.accepted);
            }
            if v.accepted {
                entry.1 += 1;
                accepted_n += 1;
                ran_calls += body.iter().filter(|l| l.starts_with("@exec")).count() as u64;
                *accepted_features.entry(feature(&case.sched)).or_default() += 1;
            }
            if !v.wrong.is_empty() {
                let class = class_of(&case.sched, &v);
                failures.push(Failure { index, origin: case.origin, sched: case.sched, class, verdict: v });
            }
        };
        for line in &lines {
            if let Some(rest) = line.strip_prefix("@case ") {
                let index: u64 = rest.split(' ').next().and_then(|i| i.parse().ok()).expect("a case index");
                current = Some((index, Vec::new()));
            } else if let Some(rest) = line.strip_prefix("@done ") {
                let (index, body) = current.take().expect("@done after @case");
                assert_eq!(rest.parse::<u64>().ok(), Some(index), "the worker's report is out of order");
                handle(index, &body, None);
                finished_upto = index + 1;
            } else if let Some((_, body)) = current.as_mut() {
                body.push(line.clone());
            }
        }
        if ended {
            break;
        }
        // The worker died (or hung) inside a case: that case is a failure, and the next worker starts after it.
        match current {
            Some((index, body)) => {
                let why = if lines.last().is_some_and(|l| l == "@hung") { "hung" } else { tail.as_str() };
                handle(index, &body, Some(why));
                from = index + 1;
            }
            None => {
                assert!(finished_upto > from, "the worker died before its first case: {tail}");
                from = finished_upto;
            }
        }
    }
    // The report: per class, how many, and the smallest one shrunk.
    let mut classes: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, f) in failures.iter().enumerate() {
        classes.entry(f.class.clone()).or_default().push(i);
    }
    let mut report = String::new();
    let _ = writeln!(
        report,
        "differential fuzz (seed {seed:#x}, {cases} cases, {:.1} s): tried {cases}, accepted {accepted_n} (each run \
         on every executor: {ran_calls} calls), wrong {}, verifier panics {}",
        started.elapsed().as_secs_f64(),
        failures.len(),
        panics.len()
    );
    for (kind, (t, a)) in &tally {
        let _ = writeln!(report, "  {kind:<9} tried {t:>7} accepted {a:>7}");
    }
    let kinds: Vec<String> = by_mutation.iter().map(|(k, (t, a))| format!("{k} {a}/{t}")).collect();
    let _ = writeln!(report, "  mutations (accepted/tried, by kind): {}", kinds.join(", "));
    let features: Vec<String> = accepted_features.iter().map(|(f, n)| format!("[{f}] {n}")).collect();
    let _ = writeln!(report, "  accepted schedules by feature: {}", features.join(", "));
    for (class, members) in &classes {
        let _ = writeln!(report, "  wrong: {class}: {} schedules", members.len());
    }
    let shrink_budget = Duration::from_secs(env_number("COLLC_FUZZ_SHRINK_SECS").unwrap_or(20));
    for (class, members) in &classes {
        let smallest = *members
            .iter()
            .min_by_key(|&&i| (failures[i].sched.n_instrs(), failures[i].sched.n_ranks))
            .expect("a class has members");
        let f = &failures[smallest];
        // Shrinking keeps the first executor that was wrong wrong (one that aborts hides those after it).
        let want: Vec<String> = f.verdict.wrong.iter().take(1).map(|w| w.0.clone()).collect();
        let shrunk = shrink(&f.sched, &want, call_seed(seed, f.index), shrink_budget, &mut serial);
        let _ =
            writeln!(report, "\n=== {class}: {} schedules; smallest is case {} ({})", members.len(), f.index, f.origin);
        for (executor, call, why) in f.verdict.wrong.iter().take(6) {
            let _ = writeln!(report, "  {executor} call {call}: {why}");
        }
        let _ = writeln!(report, "shrunk to {} instructions:\n{}", shrunk.n_instrs(), write_sched(&shrunk, ""));
    }
    for &index in panics.iter().take(3) {
        let case = make_case(index, seed, &bases);
        let _ = writeln!(
            report,
            "\n=== the verifier panicked on case {index} ({})\n{}",
            case.origin,
            write_sched(&case.sched, "")
        );
    }
    eprintln!("{report}");
    assert!(accepted_n > 0, "no schedule was accepted");
    assert!(
        failures.is_empty() && panics.is_empty(),
        "{} accepted schedules computed a wrong result and the verifier panicked on {} (report above)",
        failures.len(),
        panics.len()
    );
}
