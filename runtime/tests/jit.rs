//! The JIT executor touches nothing outside the buffers its plan names: every call's buffers lie between two pages
//! that may be neither read nor written, flush against one of them (any access past either end faults and takes the
//! test down), and the results must equal the collective's definition. Every library algorithm, in one tile (the
//! compiled code moves the data itself) and in several (it calls the interpreter's code per instruction), both
//! placements, with a built-in operator, PreMulSum and a user's operator, over the threads transport where the ranks
//! read each other's buffers in place.

use collc_compiler::library::LIBRARY;
use collc_compiler::{Bindings, Collective, Limits, Placement};
use collc_runtime::{check, Buffers, CallShape, Communicator, DataType, HostExecutor, Options, ReduceOp};
use std::time::Duration;

const PAGE: usize = 4096;

/// `len` bytes between two inaccessible pages, flush against the one after (`tail`) or the one before.
struct Fenced {
    map: *mut u8,
    total: usize,
    at: usize,
    len: usize,
}

// SAFETY: the mapping is owned by the value and reached only through it.
unsafe impl Send for Fenced {}

impl Fenced {
    fn new(payload: &[u8], tail: bool) -> Fenced {
        let len = payload.len();
        let inner = len.div_ceil(PAGE).max(1) * PAGE;
        let total = inner + 2 * PAGE;
        // SAFETY: a fresh private mapping; only its inner pages are made accessible.
        let map = unsafe {
            let map = libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(map, libc::MAP_FAILED, "mmap");
            let rw = libc::mprotect(map.cast::<u8>().add(PAGE).cast(), inner, libc::PROT_READ | libc::PROT_WRITE);
            assert_eq!(rw, 0, "mprotect");
            map.cast::<u8>()
        };
        let at = if tail { PAGE + inner - len } else { PAGE };
        let mut fenced = Fenced { map, total, at, len };
        fenced.bytes().copy_from_slice(payload);
        fenced
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: inside the accessible pages, owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.map.add(self.at), self.len) }
    }
}

impl Drop for Fenced {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`.
        unsafe { libc::munmap(self.map.cast(), self.total) };
    }
}

/// The algorithm's collective, and its parameters on `n_ranks` ranks of one node.
fn collective_of(source: &str, n_ranks: u32) -> (Collective, Vec<(String, i64)>) {
    let file = collc_grammar::parse(source, &Limits::default().syntax).expect("library parses");
    let params = Bindings::ranks(n_ranks).with_default_split(&file.algorithm, n_ranks).params;
    (file.algorithm.collective.name.parse().expect("a collective"), params)
}

/// Runs `shape` on every rank of `comms` with fenced buffers and checks each output against the definition.
fn call_fenced(comms: &mut [Communicator], shape: CallShape, placement: Placement, tail: bool, context: &str) {
    let n_ranks = comms.len() as u32;
    let in_place = placement == Placement::InPlace;
    let inputs = check::inputs(&shape, n_ranks);
    let outputs: Vec<Vec<u8>> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .iter_mut()
            .map(|comm| {
                let input = &inputs[comm.rank() as usize];
                scope.spawn(move || {
                    let w = check::windows(&shape, n_ranks, comm.rank(), in_place);
                    if in_place {
                        let mut buf = Fenced::new(&w.in_place_buffer(input), tail);
                        comm.call(shape, Buffers::InPlace(buf.bytes())).unwrap_or_else(|e| panic!("{context}: {e}"));
                        return buf.bytes()[w.output].to_vec();
                    }
                    let mut send = Fenced::new(input, tail);
                    let mut recv = Fenced::new(&vec![0xEE; w.recv], tail);
                    comm.call(shape, Buffers::OutOfPlace { send: send.bytes(), recv: recv.bytes() })
                        .unwrap_or_else(|e| panic!("{context}: {e}"));
                    assert_eq!(send.bytes(), input.as_slice(), "{context}: the send buffer changed");
                    recv.bytes()[w.output].to_vec()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a rank thread")).collect()
    });
    for (rank, got) in outputs.iter().enumerate() {
        if let Some(want) = check::expected_from(&shape, n_ranks, rank as u32, &inputs) {
            let wrong = check::count_wrong_for(&shape, n_ranks, &want, got);
            assert_eq!(wrong, 0, "{context} rank {rank}: {wrong} elements differ from the definition");
        }
    }
}

#[test]
fn the_jit_touches_nothing_outside_the_plans_buffers() {
    let premul = check::OPS[5];
    assert!(matches!(premul, ReduceOp::PreMulSum(_)));
    let mut calls = 0;
    for (name, source) in LIBRARY {
        for n_ranks in [3, 4] {
            let (collective, params) = collective_of(source, n_ranks);
            // 4096-byte slots: 1000 elements go in one tile, 70000 in several.
            for slot_bytes in [4096, 0] {
                let options = Options {
                    timeout: Duration::from_secs(30),
                    slot_bytes,
                    executor: HostExecutor::Jit,
                    ..Options::default()
                };
                let mut comms = Communicator::threads(n_ranks, options).expect("threads");
                for comm in &mut comms {
                    comm.set_algorithm(collective, name, source, params.clone());
                }
                let ops: Vec<ReduceOp> = match collective.reduces() {
                    true => vec![ReduceOp::Sum, premul, check::user_ops()[0]],
                    false => vec![ReduceOp::Sum],
                };
                for count in [1, 1000, 70000] {
                    for &op in &ops {
                        let shape =
                            CallShape { collective, count, dtype: DataType::F32, op, root: n_ranks - 1, peer: 0 };
                        for placement in Placement::BOTH {
                            for tail in [true, false] {
                                let context =
                                    format!("{name} p={n_ranks} slots={slot_bytes} count={count} {op} {placement}");
                                call_fenced(&mut comms, shape, placement, tail, &context);
                                calls += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(calls > 500, "{calls} calls");
}

/// What the JIT computes inline (reductions and copies of up to 256 bytes as 128-bit vector operations) and what it
/// hands to the host kernels equals the interpreter bit for bit, on every pair of each type's edge values (zeros of
/// both signs, extremes, subnormals, infinities, quiet, signalling and negative NaNs, random bits), for every
/// built-in operator: rank 0 holds the first of each pair, rank 1 the second.
#[test]
fn compiled_reductions_equal_the_interpreters_bit_for_bit_on_edge_values() {
    let options = |executor| Options { executor, ..Options::default() };
    let mut groups: Vec<Vec<Communicator>> = [HostExecutor::Interpret, HostExecutor::Jit]
        .into_iter()
        .map(|executor| Communicator::threads(2, options(executor)).expect("threads"))
        .collect();
    let ops = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg];
    let mut compared = 0;
    for name in ["allreduce/one_shot", "allreduce/ring"] {
        let source = collc_compiler::library::get(name).expect("in the library");
        for comms in &mut groups {
            for comm in comms.iter_mut() {
                comm.set_algorithm(Collective::AllReduce, name, source, Vec::new());
            }
        }
        for &dtype in DataType::ALL {
            let (a, b) = check::edge_pairs(dtype);
            let size = dtype.size_bytes();
            // Windows of the pairs: 16 elements go inline, 300 to the kernels (a ring chunk of 150).
            for count in [16, 300] {
                for window in 0..(a.len() / size).div_ceil(count) {
                    let take = |v: &[u8]| -> Vec<u8> {
                        v.iter().copied().cycle().skip(window * count * size).take(count * size).collect()
                    };
                    let inputs = [take(&a), take(&b)];
                    for op in ops {
                        let shape = CallShape { collective: Collective::AllReduce, count, dtype, op, root: 0, peer: 0 };
                        let results: Vec<Vec<Vec<u8>>> = groups
                            .iter_mut()
                            .map(|comms| {
                                std::thread::scope(|scope| {
                                    let handles: Vec<_> = comms
                                        .iter_mut()
                                        .zip(&inputs)
                                        .map(|(comm, input)| {
                                            scope.spawn(move || {
                                                let mut out = vec![0u8; input.len()];
                                                let buffers = Buffers::OutOfPlace { send: input, recv: &mut out };
                                                comm.call(shape, buffers).expect("the call");
                                                out
                                            })
                                        })
                                        .collect();
                                    handles.into_iter().map(|h| h.join().expect("a rank")).collect()
                                })
                            })
                            .collect();
                        assert_eq!(results[0], results[1], "{name} {dtype} {op} count {count} window {window}");
                        compared += 1;
                    }
                }
            }
        }
    }
    assert!(compared > 500, "{compared} calls compared");
}
