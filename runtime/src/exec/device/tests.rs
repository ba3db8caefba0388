//! The device encoding of all ranks in one launch (as ranks sharing one GPU run), run by the host twin with every
//! block polled in turn, against each collective's definition; and the faults the interpreter records.

use super::encode::{self, code, control, CONTROL_WORDS};
use super::twin::{self, Launch};
use super::ConnMemory;
use crate::check;
use crate::comm::CallShape;
use crate::exec::{prepare, Origin, Plan, PlanInput};
use collc_compiler::library::LIBRARY;
use collc_compiler::{compile, Bindings, Collective, Limits, Options, Placement, VerifiedSchedule};
use collc_kernels::{DataType, ReduceOp};
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Every rank's plan of one call in one image, run to the end by the twin; returns the control words and each
/// rank's output window.
fn run_one_launch(
    sched: &VerifiedSchedule,
    shape: CallShape,
    slot_cap: usize,
    lanes: u32,
    fingerprint_of_rank_1: Option<u64>,
) -> (Vec<u64>, Vec<Vec<u8>>) {
    let n_ranks = sched.n_ranks;
    let in_place = sched.placement == Placement::InPlace;
    let mut plans: Vec<Plan> = (0..n_ranks)
        .map(|rank| {
            let input = PlanInput {
                name: "test",
                rank,
                count: shape.count,
                dtype: shape.dtype,
                op: shape.op,
                origin: Origin::Coll(""),
                slot_cap,
            };
            prepare(sched, input).expect("a plan")
        })
        .collect();
    if let (Some(fp), Some(plan)) = (fingerprint_of_rank_1, plans.get_mut(1)) {
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
    let refs: Vec<&Plan> = plans.iter().collect();
    let image = encode::encode(&refs, lanes).expect("encodes");
    let conns: Vec<ConnMemory> = image.conns.iter().map(|c| ConnMemory::new(c.3)).collect();
    let state: Vec<AtomicU64> = (0..image.state_words()).map(|_| AtomicU64::new(0)).collect();
    for (c, memory) in conns.iter().enumerate() {
        state[image.conn_table_at() + c].store(memory.address(), Ordering::Relaxed);
    }
    let bases: Vec<AtomicU64> = (0..image.bases_words()).map(|_| AtomicU64::new(0)).collect();
    for (p, plan) in plans.iter().enumerate() {
        let desc = image.plan(p as u32);
        for (b, &base) in plan.bases.iter().enumerate() {
            bases[desc.bases_at as usize + b].store(base as u64, Ordering::Relaxed);
        }
    }
    let control: Vec<AtomicU64> = (0..CONTROL_WORDS).map(|_| AtomicU64::new(0)).collect();
    // Two calls in a row: the second starts from the counters and done words the first left.
    for seq in 1..=2 {
        if seq == 2 {
            for (rank, recv) in recvs.iter_mut().enumerate() {
                let w = &windows[rank];
                *recv = if in_place { w.in_place_buffer(&inputs[rank]) } else { vec![0xEE; w.recv] };
                let desc = image.plan(rank as u32);
                bases[desc.bases_at as usize + 1].store(recv.as_mut_ptr() as u64, Ordering::Relaxed);
                if in_place {
                    bases[desc.bases_at as usize].store(recv.as_mut_ptr() as u64, Ordering::Relaxed);
                }
            }
        }
        let launch = Launch { image: &image, state: &state, bases: &bases, control: &control, seq };
        // SAFETY: the state points at live buffers of the sizes the plans need and at the records above.
        unsafe { twin::run_all(std::slice::from_ref(&launch)) };
        if control[control::CODE].load(Ordering::Relaxed) != code::OK {
            break;
        }
    }
    sends.clear();
    let outputs = recvs.iter().zip(&windows).map(|(r, w)| r[w.output.clone()].to_vec()).collect();
    (control.iter().map(|w| w.load(Ordering::Relaxed)).collect(), outputs)
}

/// Every library algorithm, in and out of place, every dtype and (for reductions) op, at 3 and 4 ranks, with slots
/// small enough that a call takes many tiles: one launch, twice, equals the collective's definition.
#[test]
fn one_launch_of_every_rank_computes_each_library_collective() {
    let mut runs = 0;
    for (name, source) in LIBRARY {
        let collective = collective_of(source);
        for n_ranks in [3, 4] {
            let bindings = bindings(source, n_ranks, collective);
            for placement in [Placement::OutOfPlace, Placement::InPlace] {
                let Ok(sched) = compile(source, &bindings, Options::placed(placement), &Limits::default()) else {
                    continue;
                };
                let ops: &[ReduceOp] = if collective.reduces() { ReduceOp::ALL } else { &[ReduceOp::Sum] };
                for &dtype in DataType::ALL {
                    for &op in ops {
                        let (root, peer) = (sched.root, sched.peer);
                        let shape = CallShape { collective, count: 1000, dtype, op, root, peer };
                        // One lane, then three: the tiles dealt over three copies of every block.
                        let lanes = 1 + 2 * (runs % 2) as u32;
                        let (control, outputs) = run_one_launch(&sched, shape, 64, lanes, None);
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
    assert!(runs > 500, "{runs} runs");
}

/// A message stamped with another fingerprint (another call shape on the sender) is a mismatch the receiver
/// records, with the stamp it found, before it reads the slot.
#[test]
fn a_message_of_another_call_is_recorded_as_a_mismatch() {
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
    let (control, _) = run_one_launch(&sched, shape, 4096, 1, Some(0xdead_beef));
    assert_eq!(control[control::CODE], code::MISMATCH, "{control:?}");
    // Rank 1 finds its neighbour's stamp foreign, or rank 2 finds rank 1's.
    assert_eq!(control[control::GOT_FP] == 0xdead_beef, control[control::RANK] != 1, "{control:?}");
    assert_eq!(control[control::GOT_SEQ], 1);
}
