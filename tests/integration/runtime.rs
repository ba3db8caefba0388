//! gloo's matrix for the runtime: every library algorithm x transport (threads, shm, tcp; threads and shm also with
//! the JIT executor) x ranks {1,2,3,4,5,8} x counts
//! {0,1,7,1000,65537} x every dtype x every op (and a user's operator) x both placements (x roots 0 and p-1 where there is a root). Each
//! rank's result must equal the reference interpreter's on the same inputs and the collective's definition
//! (`check::expected`), and the guard bytes around every buffer must stay untouched. Buffers come from
//! `Communicator::alloc`, so over shm the ranks read them in place (single copy), as `collc run`'s.

use crate::corpus;
use collc_compiler::library::LIBRARY;
use collc_compiler::{compile, Bindings, Collective, Limits, Options, Placement, VerifiedSchedule};
use collc_kernels::{DataType, ReduceOp};
use collc_runtime::{check, Buffers, CallShape, Communicator, HostExecutor, Options as RunOptions, Transport};
use std::time::Duration;

const RANKS: [u32; 6] = [1, 2, 3, 4, 5, 8];
const COUNTS: [usize; 5] = [0, 1, 7, 1000, 65537];
const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xA5;

fn communicators(transport: Transport, n_ranks: u32) -> Vec<Communicator> {
    communicators_with(transport, n_ranks, HostExecutor::Interpret)
}

fn communicators_with(transport: Transport, n_ranks: u32, executor: HostExecutor) -> Vec<Communicator> {
    let options = RunOptions { timeout: Duration::from_secs(30), slot_bytes: 4096, executor, ..RunOptions::default() };
    Communicator::group(transport, n_ranks, options).expect("a communicator group")
}

/// A buffer from the communicator with guard bytes on both sides.
struct Guarded(collc_runtime::HostBuffer);

impl Guarded {
    fn new(comm: &Communicator, payload: &[u8]) -> Self {
        let mut bytes = comm.alloc(payload.len() + 2 * GUARD);
        bytes.fill(GUARD_BYTE);
        bytes[GUARD..GUARD + payload.len()].copy_from_slice(payload);
        Guarded(bytes)
    }

    fn payload(&mut self) -> &mut [u8] {
        let n = self.0.len() - 2 * GUARD;
        &mut self.0[GUARD..GUARD + n]
    }

    fn guards_intact(&self) -> bool {
        let n = self.0.len();
        self.0[..GUARD].iter().chain(&self.0[n - GUARD..]).all(|&b| b == GUARD_BYTE)
    }
}

/// The outputs of every rank under the reference interpreter, for one call shape and placement.
fn reference_outputs(sched: &VerifiedSchedule, shape: &CallShape, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let n_ranks = inputs.len() as u32;
    let in_place = sched.placement == Placement::InPlace;
    let windows: Vec<_> = (0..n_ranks).map(|rank| check::windows(shape, n_ranks, rank, in_place)).collect();
    let shared = sched.shared_buffer().0 as usize;
    let mut buffers: Vec<Vec<Vec<u8>>> = windows
        .iter()
        .zip(inputs)
        .map(|(w, input)| match in_place {
            false => vec![input.clone(), vec![0xEE; w.recv]],
            true => {
                let mut bufs = vec![Vec::new(), Vec::new()];
                bufs[shared] = w.in_place_buffer(input);
                bufs
            }
        })
        .collect();
    collc_runtime::run(sched, &mut buffers, shape.count, shape.dtype, shape.op).expect("the reference runs");
    let output = if in_place { shared } else { 1 };
    buffers.iter().zip(&windows).map(|(bufs, w)| bufs[output][w.output.clone()].to_vec()).collect()
}

/// Runs one call on every rank (one thread each) and returns each rank's output window and whether its guards held.
fn run_call(
    comms: &mut [Communicator],
    shape: CallShape,
    placement: Placement,
    inputs: &[Vec<u8>],
) -> Vec<(Vec<u8>, bool)> {
    let n_ranks = comms.len() as u32;
    let in_place = placement == Placement::InPlace;
    std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .iter_mut()
            .map(|comm| {
                scope.spawn(move || {
                    let input = &inputs[comm.rank() as usize];
                    let w = check::windows(&shape, n_ranks, comm.rank(), in_place);
                    if in_place {
                        let mut buf = Guarded::new(comm, &w.in_place_buffer(input));
                        comm.call(shape, Buffers::InPlace(buf.payload()))
                            .unwrap_or_else(|e| panic!("{shape:?} in place: {e}"));
                        return (buf.payload()[w.output].to_vec(), buf.guards_intact());
                    }
                    let send = Guarded::new(comm, input);
                    let mut recv = Guarded::new(comm, &vec![0xEE; w.recv]);
                    let send_payload = &send.0[GUARD..GUARD + input.len()];
                    comm.call(shape, Buffers::OutOfPlace { send: send_payload, recv: recv.payload() })
                        .unwrap_or_else(|e| panic!("{shape:?} out of place: {e}"));
                    let ok = send.guards_intact() && recv.guards_intact() && send_payload == input.as_slice();
                    (recv.payload().to_vec(), ok)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a rank thread")).collect()
    })
}

/// The calls the JIT runs in the matrix (each plan it runs is compiled, 0.3 to 2 ms): every element size with sum,
/// and every operator on float. Its code differs by element size and by operator kind (built-in, PreMulSum's
/// factors, a user's), not by type within a size.
fn jit_covers(dtype: DataType, op: ReduceOp) -> bool {
    dtype == DataType::F32 || (op == ReduceOp::Sum && [DataType::I8, DataType::F16, DataType::F64].contains(&dtype))
}

fn collective_of(source: &str) -> Collective {
    let file = collc_grammar::parse(source, &Limits::default().syntax).expect("library parses");
    file.algorithm.collective.name.parse().expect("a collective")
}

fn matrix(transports: &[Transport]) {
    let mut calls = 0usize;
    for (name, source) in LIBRARY {
        let collective = collective_of(source);
        for n_ranks in RANKS {
            let roots: Vec<u32> = if collective.rooted() { vec![0, n_ranks - 1] } else { vec![0] };
            for root in roots {
                let peer = (root + 1) % n_ranks;
                let bindings = Bindings {
                    n_ranks,
                    root: collective.rooted().then_some(root),
                    peer: (collective == Collective::SendRecv).then_some(peer),
                    params: corpus::bindings(source, n_ranks).params,
                };
                let build = |placement| compile(source, &bindings, Options::placed(placement), &Limits::default());
                let (Ok(out_of_place), Ok(in_place)) = (build(Placement::OutOfPlace), build(Placement::InPlace)) else {
                    // Only a rank count the algorithm's `where` excludes may fail, e.g. a sendrecv on one rank.
                    assert!(n_ranks == 1, "{name} does not compile for {n_ranks} ranks");
                    continue;
                };
                // Every transport interpreted, and those whose plans compile (`--executor jit`) compiled too.
                let mut groups: Vec<(String, HostExecutor, Vec<Communicator>)> = transports
                    .iter()
                    .flat_map(|&t| {
                        let jit = t.backend().compiles_plans().then_some(HostExecutor::Jit);
                        [Some(HostExecutor::Interpret), jit].into_iter().flatten().map(move |e| (t, e))
                    })
                    .map(|(t, e)| (format!("{t} {}", e.name()), e, communicators_with(t, n_ranks, e)))
                    .collect();
                for (_, _, comms) in &mut groups {
                    for comm in comms {
                        comm.set_algorithm(collective, name, source, bindings.params.clone());
                    }
                }
                // The built-in operators, and a user's that every algorithm may reorder (compiled with cranelift).
                let reducing: Vec<ReduceOp> = check::OPS.iter().copied().chain([check::user_ops()[0]]).collect();
                let ops: &[ReduceOp] = if collective.reduces() { &reducing } else { &[ReduceOp::Sum] };
                for &count in &COUNTS {
                    for &dtype in DataType::ALL {
                        // The user's operator (its reference evaluation is slow) up to counts of a few tiles.
                        for &op in ops.iter().filter(|op| count < 65537 || !matches!(op, ReduceOp::User(_))) {
                            let shape = CallShape { collective, count, dtype, op, root, peer };
                            let inputs = check::inputs(&shape, n_ranks);
                            let defined: Vec<_> =
                                (0..n_ranks).map(|r| check::expected_from(&shape, n_ranks, r, &inputs)).collect();
                            for sched in [&out_of_place, &in_place] {
                                let want = reference_outputs(sched, &shape, &inputs);
                                for (transport, executor, comms) in &mut groups {
                                    if *executor == HostExecutor::Jit && !jit_covers(dtype, op) {
                                        continue;
                                    }
                                    let got = run_call(comms, shape, sched.placement, &inputs);
                                    for (rank, ((output, guards_ok), reference)) in got.iter().zip(&want).enumerate() {
                                        let context = format!(
                                        "{transport} {name} p={n_ranks} root={root} count={count} {dtype} {op} {} rank {rank}",
                                        sched.placement
                                    );
                                        assert!(guards_ok, "{context}: a guard byte or the send buffer changed");
                                        // Where the collective leaves an output undefined, its bytes may differ.
                                        if let Some(defined) = &defined[rank] {
                                            let wrong = check::count_wrong(dtype, reference, output);
                                            assert_eq!(
                                                wrong, 0,
                                                "{context}: {wrong} elements differ from the reference"
                                            );
                                            let wrong = check::count_wrong(dtype, defined, output);
                                            assert_eq!(
                                                wrong, 0,
                                                "{context}: {wrong} elements differ from the definition"
                                            );
                                        }
                                    }
                                    calls += 1;
                                }
                            }
                        }
                    }
                }
                drop(groups);
            }
        }
    }
    assert!(calls > 1000, "the matrix ran only {calls} calls");
}

#[test]
fn every_algorithm_matches_the_reference_on_every_transport() {
    matrix(&Transport::host().collect::<Vec<_>>());
}

/// A user's operator that is neither commutative nor associative (`horner`, `a * 2 + b`) runs only where the schedule
/// reduces every output chunk as a chain in rank order, and there computes the contract bit for bit; every other
/// reducing algorithm refuses the call on every rank, naming the operator, why, and what to run instead; a
/// communicator with no algorithm set chooses among those that reduce in rank order.
#[test]
fn an_operator_that_does_not_reorder_runs_only_in_rank_order() {
    let horner = check::user_ops()[1];
    let mut ran = 0;
    for (name, source) in LIBRARY {
        let collective = collective_of(source);
        if !collective.reduces() {
            continue;
        }
        for n_ranks in [1, 2, 3, 5] {
            let bindings = Bindings {
                n_ranks,
                root: collective.rooted().then_some(0),
                peer: None,
                params: corpus::bindings(source, n_ranks).params,
            };
            for transport in [Transport::named("threads"), Transport::named("shm")] {
                let mut comms = communicators(transport, n_ranks);
                for comm in &mut comms {
                    comm.set_algorithm(collective, name, source, bindings.params.clone());
                }
                for placement in Placement::BOTH {
                    let Ok(sched) = compile(source, &bindings, Options::placed(placement), &Limits::default()) else {
                        continue;
                    };
                    for dtype in [DataType::I32, DataType::Bf16] {
                        let shape = CallShape { collective, count: 1000, dtype, op: horner, root: 0, peer: 1 };
                        let inputs = check::inputs(&shape, n_ranks);
                        let context = format!("{transport:?} {name} p={n_ranks} {dtype} {placement}");
                        let results = try_call(&mut comms, shape, placement, &inputs);
                        match collc_compiler::replicas::in_rank_order(&sched) {
                            Ok(()) => {
                                let want = reference_outputs(&sched, &shape, &inputs);
                                for (rank, got) in results.iter().enumerate() {
                                    let got = got.as_ref().unwrap_or_else(|e| panic!("{context}: {e}"));
                                    assert_eq!(check::count_wrong(dtype, &want[rank], got), 0, "{context} rank {rank}");
                                    let defined = check::expected_from(&shape, n_ranks, rank as u32, &inputs);
                                    if let Some(defined) = defined {
                                        assert_eq!(
                                            check::count_wrong(dtype, &defined, got),
                                            0,
                                            "{context} rank {rank}"
                                        );
                                    }
                                }
                                ran += 1;
                            }
                            Err(_) => {
                                for (rank, result) in results.iter().enumerate() {
                                    let error = result.as_ref().expect_err(&context);
                                    assert!(
                                        error.contains("`horner` is not commutative")
                                            && error.contains(&format!("{name} reduces output chunk"))
                                            && error.contains("run an algorithm that reduces in rank order"),
                                        "{context} rank {rank}: {error}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(ran >= 8, "naive allreduce and one-rank calls run: {ran}");
    // A communicator that chooses for itself chooses among the algorithms that reduce in rank order.
    let mut comms = communicators(Transport::named("threads"), 3);
    let shape = CallShape {
        collective: Collective::AllReduce,
        count: 1000,
        dtype: DataType::I32,
        op: horner,
        root: 0,
        peer: 1,
    };
    let inputs = check::inputs(&shape, 3);
    for (rank, got) in try_call(&mut comms, shape, Placement::OutOfPlace, &inputs).iter().enumerate() {
        let got = got.as_ref().unwrap_or_else(|e| panic!("the selection's choice: {e}"));
        let want = check::expected_from(&shape, 3, rank as u32, &inputs).expect("defined");
        assert_eq!(check::count_wrong(DataType::I32, &want, got), 0, "rank {rank}");
    }
}

/// One call on every rank (one thread each): each rank's output window, or its error.
fn try_call(
    comms: &mut [Communicator],
    shape: CallShape,
    placement: Placement,
    inputs: &[Vec<u8>],
) -> Vec<Result<Vec<u8>, String>> {
    let n_ranks = comms.len() as u32;
    std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .iter_mut()
            .map(|comm| {
                scope.spawn(move || {
                    let w = check::windows(&shape, n_ranks, comm.rank(), placement == Placement::InPlace);
                    let input = &inputs[comm.rank() as usize];
                    let result = match placement {
                        Placement::InPlace => {
                            let mut buf = w.in_place_buffer(input);
                            comm.call(shape, Buffers::InPlace(&mut buf)).map(|_| buf[w.output].to_vec())
                        }
                        Placement::OutOfPlace => {
                            let mut recv = vec![0xEE; w.recv];
                            comm.call(shape, Buffers::OutOfPlace { send: input, recv: &mut recv }).map(|_| recv)
                        }
                    };
                    result.map_err(|e| e.to_string())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a rank thread")).collect()
    })
}

/// PreMulSum's factor is each rank's own, as NCCL's is: ranks passing 1, 2, 3, ... get the sum of `factor_r x input_r`.
/// One shot's sends carry where the input is (single copy: addresses on threads, arena offsets on shm, the buffers
/// being the communicator's), so the receiver multiplies by the sender's factor, which the message carries; the same
/// from a buffer of the caller's goes through the FIFOs on shm. In place and out of place, an integer and a float
/// type; and a call of 12 MiB, which over shm goes through the FIFOs (`Backend::single_copy_max_bytes`). A factor the
/// call's type cannot hold fails the call on every rank, saying which and why.
#[test]
fn premulsum_multiplies_each_rank_input_by_its_own_factor() {
    use collc_kernels::{reference, Scalar};
    let cases = [("allreduce/one_shot", 2, 70_000), ("allreduce/one_shot", 4, 70_000), ("allreduce/ring", 3, 70_000)];
    for (name, n_ranks, count) in cases.into_iter().chain([("allreduce/one_shot", 2, 3 << 20)]) {
        let source = collc_compiler::library::get(name).expect("in the library");
        for transport in [Transport::named("threads"), Transport::named("shm")] {
            let mut comms = communicators(transport, n_ranks);
            for comm in &mut comms {
                comm.set_algorithm(Collective::AllReduce, name, source, Vec::new());
            }
            for dtype in [DataType::I32, DataType::F32] {
                let base =
                    CallShape { collective: Collective::AllReduce, count, dtype, op: ReduceOp::Sum, root: 0, peer: 1 };
                let inputs = check::inputs(&base, n_ranks);
                let factor = |rank: u32| Scalar::Int(i128::from(rank) + 1);
                let mut want = vec![0u8; count * dtype.size_bytes()];
                for (rank, input) in inputs.iter().enumerate() {
                    let mut scaled = input.clone();
                    let element = factor(rank as u32).element(dtype).expect("a small factor");
                    reference::premultiply(dtype, &element, &mut scaled).expect("whole elements");
                    reference::reduce(dtype, ReduceOp::Sum, &mut want, &scaled).expect("same lengths");
                }
                for placement in [Placement::OutOfPlace, Placement::InPlace] {
                    let outputs: Vec<[Vec<u8>; 2]> = std::thread::scope(|scope| {
                        let handles: Vec<_> = comms
                            .iter_mut()
                            .map(|comm| {
                                let input = inputs[comm.rank() as usize].clone();
                                scope.spawn(move || {
                                    let shape = CallShape { op: ReduceOp::PreMulSum(factor(comm.rank())), ..base };
                                    let (mut send, mut out) = (comm.alloc(input.len()), comm.alloc(input.len()));
                                    send.copy_from_slice(&input);
                                    let mut run = |send: &[u8], out: &mut [u8]| {
                                        out.copy_from_slice(&input);
                                        let buffers = match placement {
                                            Placement::InPlace => Buffers::InPlace(out),
                                            Placement::OutOfPlace => Buffers::OutOfPlace { send, recv: out },
                                        };
                                        comm.call(shape, buffers).expect("the call runs");
                                        out.to_vec()
                                    };
                                    let ours = run(&send, &mut out);
                                    let theirs = run(&input, &mut input.clone());
                                    [ours, theirs]
                                })
                            })
                            .collect();
                        handles.into_iter().map(|h| h.join().expect("a rank thread")).collect()
                    });
                    for (rank, [ours, theirs]) in outputs.iter().enumerate() {
                        for (got, buffers) in [(ours, "the communicator's"), (theirs, "the caller's")] {
                            let wrong = check::count_wrong(dtype, &want, got);
                            let case =
                                format!("{transport:?} {name} p={n_ranks} {dtype} {placement} {buffers} rank {rank}");
                            assert_eq!(wrong, 0, "{case}");
                        }
                    }
                }
            }
            // 0.5 in an integer type: refused before anything moves, on every rank.
            let shape = CallShape {
                collective: Collective::AllReduce,
                count: 8,
                dtype: DataType::I32,
                op: ReduceOp::PreMulSum(Scalar::from(0.5)),
                root: 0,
                peer: 1,
            };
            let errors: Vec<String> = std::thread::scope(|scope| {
                let handles: Vec<_> = comms
                    .iter_mut()
                    .map(|comm| {
                        scope.spawn(move || {
                            let (send, mut recv) = (vec![0u8; 32], vec![0u8; 32]);
                            let result = comm.call(shape, Buffers::OutOfPlace { send: &send, recv: &mut recv });
                            result.expect_err("a fraction in int32").to_string()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().expect("a rank thread")).collect()
            });
            for (rank, error) in errors.iter().enumerate() {
                let want = format!(
                    "rank {rank}: premulsum's factor 0.5 is not a whole number: int32 multiplies by integers; pass a \
                     factor the call's data type holds"
                );
                assert_eq!(error, &want);
            }
        }
    }
}
