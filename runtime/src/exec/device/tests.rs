//! The device encoding of all ranks in one launch (as ranks sharing one GPU run), run by the host twin with every
//! block polled in turn and by the CUDA interpreter itself built for the CPU (`collc_kernels::cuda_host`: blocks as
//! threads), against each collective's definition; the faults the interpreter records; and the CUDA copy and
//! reduce kernels, built for the CPU, against the reference kernels bit for bit.

use super::encode::{self, code, control, Image, CONTROL_WORDS};
use super::launch;
use super::twin::{self, Launch};
use super::ConnMemory;
use crate::check;
use crate::comm::CallShape;
use crate::exec::{prepare, Origin, Plan, PlanInput};
use collc_compiler::library::LIBRARY;
use collc_compiler::{compile, Bindings, Collective, Limits, Options, Placement, VerifiedSchedule};
use collc_kernels::cuda_host::HostKernels;
use collc_kernels::{reference, DataType, ReduceOp};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// What runs a launch: the host twin, or the CUDA interpreter built for the CPU.
#[derive(Clone, Copy)]
enum Runner {
    Twin,
    Cuda,
}

/// Threads per block of the CUDA kernels on the CPU: few, and odd, so ranges split with ragged ends.
const HOST_THREADS: u32 = 3;

/// The CUDA kernels built for the CPU, once per test process, with the test matrices' user's operator (`absmax`,
/// generated for every data type) as `OP_USER`.
fn host_kernels() -> &'static HostKernels {
    static KERNELS: OnceLock<HostKernels> = OnceLock::new();
    KERNELS.get_or_init(|| {
        let ReduceOp::User(absmax) = check::user_ops()[0] else { unreachable!("a user's operator") };
        let typed: Vec<_> = DataType::ALL.iter().map(|&d| &absmax.prepare(d).expect("absmax types").typed).collect();
        let user = collc_kernels::operator::cuda_source(&typed);
        HostKernels::build_with(&encode::layout_defines(), &user).unwrap_or_else(|e| panic!("{e}"))
    })
}

/// One launch of every block of `image` by the CUDA interpreter on the CPU, laid out as the cuda target lays it out
/// (a table of four words per block, the abort word and a report per block, the stop word); `abort` sets the abort
/// word first. Returns the most telling report.
fn cuda_launch(
    image: &Image,
    state: &[AtomicU64],
    bases: &[AtomicU64],
    seq: u64,
    timeout_ns: u64,
    abort: bool,
) -> Vec<u64> {
    let grid = image.header().n_blocks;
    let table: Vec<u64> = (0..grid)
        .flat_map(|b| [image.words.as_ptr() as u64, state.as_ptr() as u64, bases.as_ptr() as u64, b as u64])
        .collect();
    let control: Vec<AtomicU64> = (0..1 + CONTROL_WORDS * grid as usize).map(|_| AtomicU64::new(0)).collect();
    if abort {
        control[0].store(seq, Ordering::Relaxed);
    }
    let stop = AtomicU64::new(0);
    // SAFETY: the table points at the image, its state (whose records live in the caller) and its bases, which
    // point at live buffers of the sizes the plans need; control has a report per block.
    unsafe { host_kernels().interpret(grid, HOST_THREADS, &table, &control, &stop, seq, timeout_ns, false) };
    launch::most_telling(grid as usize, |b, w| control[1 + CONTROL_WORDS * b + w].load(Ordering::Relaxed)).to_vec()
}

fn bindings(source: &str, n_ranks: u32, collective: Collective) -> Bindings {
    let file = collc_grammar::parse(source, &Limits::default().syntax).expect("the library parses");
    let split = (2..=n_ranks).find(|f| n_ranks.is_multiple_of(*f)).map_or(1, |f| n_ranks / f);
    let mut bindings = Bindings::ranks(n_ranks).with_default_split(&file.algorithm, split);
    bindings.root = collective.rooted().then_some(n_ranks - 1);
    bindings.peer = (collective == Collective::SendRecv).then_some(0);
    bindings
}

fn collective_of(source: &str) -> Collective {
    let file = collc_grammar::parse(source, &Limits::default().syntax).expect("the library parses");
    file.algorithm.collective.name.parse().expect("a collective")
}

/// How a launch is set up and what runs it.
#[derive(Clone, Copy)]
struct Case {
    slot_cap: usize,
    lanes: u32,
    /// Rank 1's plan stamps its messages with this fingerprint (another call shape's).
    fingerprint_of_rank_1: Option<u64>,
    /// The launch holds the blocks of every rank but the last, which never comes.
    without_last_rank: bool,
    /// The host asks the launch to stop before it starts (CUDA only; the twin has no clock).
    abort: bool,
    timeout_ns: u64,
    runner: Runner,
    /// Sends whose source stays go by reference (single copy, as between ranks of one GPU).
    single_copy: bool,
}

impl Case {
    fn new(slot_cap: usize, lanes: u32, runner: Runner) -> Case {
        Case {
            slot_cap,
            lanes,
            fingerprint_of_rank_1: None,
            without_last_rank: false,
            abort: false,
            timeout_ns: 20_000_000_000,
            runner,
            single_copy: false,
        }
    }
}

/// Every rank's plan of one call in one image, run to the end twice (two calls) by `case.runner`; returns the
/// control words and each rank's output window.
fn run_one_launch(sched: &VerifiedSchedule, shape: CallShape, case: Case) -> (Vec<u64>, Vec<Vec<u8>>) {
    let n_ranks = sched.n_ranks;
    let in_place = sched.placement == Placement::InPlace;
    let mut plans: Vec<Plan> = (0..n_ranks)
        .map(|rank| {
            let input = PlanInput {
                name: "test",
                name_is: ".coll source",
                rank,
                count: shape.count,
                dtype: shape.dtype,
                op: shape.op,
                origin: Origin::Coll(""),
                slot_cap: case.slot_cap,
                single_copy: case.single_copy,
                transport: "twin",
                slots: encode::SLOTS as u32,
            };
            prepare(sched, input).expect("a plan")
        })
        .collect();
    if let (Some(fp), Some(plan)) = (case.fingerprint_of_rank_1, plans.get_mut(1)) {
        plan.fingerprint = fp;
    }
    let inputs = check::inputs(&shape, n_ranks);
    let windows: Vec<_> = (0..n_ranks).map(|rank| check::windows(&shape, n_ranks, rank, in_place)).collect();
    let mut sends: Vec<Vec<u8>> = inputs.clone();
    let mut recvs: Vec<Vec<u8>> = windows
        .iter()
        .zip(&inputs)
        .map(|(w, input)| if in_place { w.in_place_buffer(input) } else { vec![0xEE; w.recv] })
        .collect();
    for (rank, plan) in plans.iter_mut().enumerate() {
        plan.bases[1] = recvs[rank].as_mut_ptr();
        plan.bases[0] = if in_place { recvs[rank].as_mut_ptr() } else { sends[rank].as_mut_ptr() };
    }
    let launched = if case.without_last_rank { plans.len() - 1 } else { plans.len() };
    let refs: Vec<&Plan> = plans[..launched].iter().collect();
    let image = encode::encode(&refs, case.lanes, &|_| case.single_copy).expect("encodes");
    let by_reference = (0..image.header().n_plans)
        .map(|p| {
            let plan = image.plan(p);
            (0..plan.n_instrs).filter(|&i| image.instr(&plan, i).op & encode::SENDS_REFERENCES != 0).count()
        })
        .sum::<usize>();
    BY_REFERENCE.with(|count| count.set(count.get() + by_reference));
    let conns: Vec<ConnMemory> = image.conns.iter().map(|c| ConnMemory::new(c.3)).collect();
    let state: Vec<AtomicU64> = (0..image.state_words()).map(|_| AtomicU64::new(0)).collect();
    for (c, memory) in conns.iter().enumerate() {
        state[image.conn_table_at() + c].store(memory.address(), Ordering::Relaxed);
    }
    let bases: Vec<AtomicU64> = (0..image.bases_words()).map(|_| AtomicU64::new(0)).collect();
    for (p, plan) in plans[..launched].iter().enumerate() {
        let desc = image.plan(p as u32);
        for (b, &base) in plan.bases.iter().enumerate() {
            bases[desc.bases_at as usize + b].store(base as u64, Ordering::Relaxed);
        }
    }
    let mut words = vec![0; CONTROL_WORDS];
    // Two calls in a row: the second starts from the counters and done words the first left.
    for seq in 1..=2 {
        if seq == 2 {
            for (rank, recv) in recvs.iter_mut().enumerate().take(launched) {
                let w = &windows[rank];
                *recv = if in_place { w.in_place_buffer(&inputs[rank]) } else { vec![0xEE; w.recv] };
                let desc = image.plan(rank as u32);
                bases[desc.bases_at as usize + 1].store(recv.as_mut_ptr() as u64, Ordering::Relaxed);
                if in_place {
                    bases[desc.bases_at as usize].store(recv.as_mut_ptr() as u64, Ordering::Relaxed);
                }
            }
        }
        words = match case.runner {
            Runner::Twin => {
                let control: Vec<AtomicU64> = (0..CONTROL_WORDS).map(|_| AtomicU64::new(0)).collect();
                let launch = Launch { image: &image, state: &state, bases: &bases, control: &control, seq };
                // SAFETY: the state points at live buffers of the sizes the plans need and at the records above.
                unsafe { twin::run_all(std::slice::from_ref(&launch), &mut []) };
                control.iter().map(|w| w.load(Ordering::Relaxed)).collect()
            }
            Runner::Cuda => cuda_launch(&image, &state, &bases, seq, case.timeout_ns, case.abort),
        };
        if words[control::CODE] != code::OK {
            break;
        }
    }
    sends.clear();
    let outputs = recvs.iter().zip(&windows).map(|(r, w)| r[w.output.clone()].to_vec()).collect();
    (words, outputs)
}

/// Every library algorithm, in and out of place, every dtype and (for reductions) op, at 3 and 4 ranks, with slots
/// small enough that a call takes many tiles: one launch, twice, equals the collective's definition.
#[test]
fn one_launch_of_every_rank_computes_each_library_collective() {
    let runs = every_library_collective_in_one_launch(Runner::Twin);
    assert!(runs > 500, "{runs} runs");
}

/// The same by the CUDA interpreter's own source, built for the CPU.
#[test]
fn the_cuda_interpreter_on_the_cpu_computes_each_library_collective() {
    let runs = every_library_collective_in_one_launch(Runner::Cuda);
    assert!(runs > 500, "{runs} runs");
}

thread_local! {
    /// Sends by reference in the launches `run_one_launch` encoded on this test's thread.
    static BY_REFERENCE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Runs the matrix by `runner`; returns how many launches it checked. Half the launches carry sends whose source
/// stays by reference (single copy).
fn every_library_collective_in_one_launch(runner: Runner) -> usize {
    let mut runs = 0;
    BY_REFERENCE.with(|count| count.set(0));
    for (name, source) in LIBRARY {
        let collective = collective_of(source);
        for n_ranks in [3, 4] {
            let bindings = bindings(source, n_ranks, collective);
            for placement in [Placement::OutOfPlace, Placement::InPlace] {
                let Ok(sched) = compile(source, &bindings, Options::placed(placement), &Limits::default()) else {
                    continue;
                };
                // And a user's operator: compiled with cranelift in the twin, generated into the CUDA source.
                let reducing: Vec<ReduceOp> = check::OPS.iter().copied().chain([check::user_ops()[0]]).collect();
                let ops: &[ReduceOp] = if collective.reduces() { &reducing } else { &[ReduceOp::Sum] };
                for &dtype in DataType::ALL {
                    for &op in ops {
                        let (root, peer) = (sched.root, sched.peer);
                        let shape = CallShape { collective, count: 1000, dtype, op, root, peer };
                        // One lane, then three: the tiles dealt over three copies of every block.
                        let lanes = 1 + 2 * (runs % 2) as u32;
                        let single_copy = runs % 4 >= 2;
                        let case = Case { single_copy, ..Case::new(64, lanes, runner) };
                        let (control, outputs) = run_one_launch(&sched, shape, case);
                        assert_eq!(
                            control[control::CODE],
                            code::OK,
                            "{name} {n_ranks} {placement:?} {dtype} {op}: {control:?}"
                        );
                        for (rank, got) in outputs.iter().enumerate() {
                            let Some(want) = check::expected(&shape, n_ranks, rank as u32) else { continue };
                            assert_eq!(
                                check::count_wrong(dtype, &want, got),
                                0,
                                "{name} ranks {n_ranks} {placement:?} {dtype} {op} rank {rank}"
                            );
                        }
                        runs += 1;
                    }
                }
            }
        }
    }
    let by_reference = BY_REFERENCE.with(|count| count.get());
    assert!(by_reference > 1000, "only {by_reference} messages went by reference");
    runs
}

/// A message stamped with another fingerprint (another call shape on the sender) is a mismatch the receiver
/// records, with the stamp it found, before it reads the slot.
#[test]
fn a_message_of_another_call_is_recorded_as_a_mismatch() {
    for runner in [Runner::Twin, Runner::Cuda] {
        a_message_of_another_call_is_a_mismatch(runner);
    }
}

fn a_message_of_another_call_is_a_mismatch(runner: Runner) {
    let source = collc_compiler::library::get("allreduce/ring").expect("in the library");
    let sched = compile(source, &Bindings::ranks(3), Options::default(), &Limits::default()).expect("verifies");
    let shape = CallShape {
        collective: Collective::AllReduce,
        count: 100,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        root: 0,
        peer: 0,
    };
    let case = Case { fingerprint_of_rank_1: Some(0xdead_beef), ..Case::new(4096, 1, runner) };
    let (control, _) = run_one_launch(&sched, shape, case);
    assert_eq!(control[control::CODE], code::MISMATCH, "{control:?}");
    // Rank 1 finds its neighbour's stamp foreign, or rank 2 finds rank 1's.
    assert_eq!(control[control::GOT_FP] == 0xdead_beef, control[control::RANK] != 1, "{control:?}");
    assert_eq!(control[control::GOT_SEQ], 1);
}

/// A rank whose blocks never come: the others time out (the twin at once, as a round with no progress; the CUDA
/// interpreter once a block has been idle for the timeout), naming a launched rank and a tile.
#[test]
fn a_rank_that_never_comes_is_a_timeout() {
    let source = collc_compiler::library::get("allreduce/ring").expect("in the library");
    let sched = compile(source, &Bindings::ranks(3), Options::default(), &Limits::default()).expect("verifies");
    let shape = ring_shape();
    for runner in [Runner::Twin, Runner::Cuda] {
        let case = Case { without_last_rank: true, timeout_ns: 50_000_000, ..Case::new(64, 2, runner) };
        let started = std::time::Instant::now();
        let (control, _) = run_one_launch(&sched, shape, case);
        assert_eq!(control[control::CODE], code::TIMEOUT, "{control:?}");
        assert!(control[control::RANK] < 2, "{control:?}");
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }
}

/// The host's abort word stops every block of the CUDA interpreter, which records the abort.
#[test]
fn the_cuda_interpreter_stops_on_the_abort_word() {
    let source = collc_compiler::library::get("allreduce/ring").expect("in the library");
    let sched = compile(source, &Bindings::ranks(3), Options::default(), &Limits::default()).expect("verifies");
    let case = Case { without_last_rank: true, abort: true, ..Case::new(64, 1, Runner::Cuda) };
    let (control, _) = run_one_launch(&sched, ring_shape(), case);
    assert_eq!(control[control::CODE], code::ABORTED, "{control:?}");
}

fn ring_shape() -> CallShape {
    CallShape {
        collective: Collective::AllReduce,
        count: 1000,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        root: 0,
        peer: 0,
    }
}

/// Inputs for the elementwise kernels: every bit pattern class (random words, so NaNs, infinities, subnormals and
/// signed zeros of the float types appear), from a fixed seed.
fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// `collc_reduce` and `collc_divide` on the CPU equal the reference kernels bit for bit, every dtype and op, at
/// lengths and offsets that take the vector path, the element path and ragged ends. (On a GPU an f32/f64 sum or
/// product with a NaN operand is the canonical NaN instead; the CPU keeps the operand's, as the reference does.)
#[test]
fn the_cuda_reduce_kernels_on_the_cpu_equal_the_reference() {
    let kernels = host_kernels();
    for &dtype in DataType::ALL {
        let elem = dtype.size_bytes();
        for &op in ReduceOp::ALL {
            for (n, offset) in [(1usize, 0usize), (37, 0), (1000, 0), (1000, 1), (129, 3)] {
                let seed = (dtype.nccl_code() as u64) << 16 | (op.nccl_code() as u64) << 8 | n as u64;
                let a = random_bytes((n + offset) * elem, seed);
                let b = random_bytes((n + offset) * elem, seed + 1);
                let (a, b) = (&a[offset * elem..], &b[offset * elem..]);
                let mut want = a.to_vec();
                reference::reduce(dtype, op, &mut want, b).expect("whole elements");
                let mut got = vec![0u8; n * elem + offset * elem];
                let got = &mut got[offset * elem..];
                let (code, op_code) = (dtype.nccl_code() as u32, op.nccl_code() as u32);
                kernels.reduce(2, HOST_THREADS, code, op_code, elem, got, a, b);
                assert_eq!(got, &want[..], "{dtype} {op} n {n} offset {offset}");
                if op == ReduceOp::Avg {
                    reference::finish_avg(dtype, &mut want, 5).expect("whole elements");
                    kernels.divide(2, HOST_THREADS, code, elem, got, 5);
                    assert_eq!(got, &want[..], "{dtype} avg division n {n} offset {offset}");
                }
            }
        }
    }
}

/// `collc_copy` on the CPU copies exactly the bytes asked, whatever the two pointers' alignments.
#[test]
fn the_cuda_copy_kernel_on_the_cpu_copies_every_alignment() {
    let kernels = host_kernels();
    let src = random_bytes(4096 + 32, 7);
    for (from, to, bytes) in [(0, 0, 4096), (3, 3, 1000), (0, 4, 999), (1, 2, 77), (16, 0, 15), (5, 5, 0)] {
        let mut dst = vec![0xEEu8; 4096 + 32];
        kernels.copy(3, HOST_THREADS, &mut dst[to..to + bytes], &src[from..from + bytes]);
        assert_eq!(&dst[to..to + bytes], &src[from..from + bytes], "from {from} to {to} bytes {bytes}");
        assert!(dst[..to].iter().chain(&dst[to + bytes..]).all(|&b| b == 0xEE), "only the range is written");
    }
}

/// The CUDA source's `OP_USER`, generated from `every` for each data type it types on and built for the CPU, runs
/// `collc_reduce` over the pairs of edge values as the reference evaluates them.
#[test]
fn generated_cuda_matches_the_reference_bit_for_bit() {
    let every = collc_compiler::operator::parse_operators(check::EVERY_OPERATOR, &Default::default())
        .expect("compiles")
        .remove(0);
    let op = collc_kernels::operator::UserOp::register(every).expect("room in the registry");
    let typed: Vec<_> = DataType::ALL.iter().filter_map(|&d| op.prepare(d).ok()).map(|p| &p.typed).collect();
    assert_eq!(typed.len(), DataType::ALL.len(), "`every` types on every data type");
    let defines = encode::layout_defines();
    let kernels = HostKernels::build_with(&defines, &collc_kernels::operator::cuda_source(&typed))
        .unwrap_or_else(|e| panic!("{e}"));
    for &dtype in DataType::ALL {
        let size = dtype.size_bytes();
        let (a, b) = check::edge_pairs(dtype);
        let mut device = vec![0u8; a.len()];
        let code = u32::from(ReduceOp::USER_CODE);
        kernels.reduce(1, 3, dtype as u32, code, size, &mut device, &a, &b);
        let prepared = op.prepare(dtype).expect("types");
        let mut want = [0u8; 8];
        for k in 0..a.len() / size {
            let at = k * size..(k + 1) * size;
            prepared.typed.eval(&a[at.clone()], &b[at.clone()], &mut want[..size]);
            let both_nan = check::is_nan(dtype, &want[..size]) && check::is_nan(dtype, &device[at.clone()]);
            assert!(
                device[at.clone()] == want[..size] || both_nan,
                "`every` on {dtype}: a={:02x?} b={:02x?}: CUDA {:02x?}, reference {:02x?}",
                &a[at.clone()],
                &b[at.clone()],
                &device[at.clone()],
                &want[..size]
            );
        }
    }
}
