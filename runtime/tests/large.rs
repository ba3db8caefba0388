//! Messages larger than the caches take the non-temporal store path; their results must be as exact as small ones.

use collc_runtime::{check, Buffers, CallShape, Collective, Communicator, DataType, Options, ReduceOp};

fn run_everywhere(shape: CallShape, n_ranks: u32, in_place: bool) {
    let comms = Communicator::threads(n_ranks, Options::default()).expect("threads");
    let inputs = check::inputs(&shape, n_ranks);
    std::thread::scope(|scope| {
        for mut comm in comms {
            let inputs = &inputs;
            scope.spawn(move || {
                let rank = comm.rank();
                let want = check::expected_from(&shape, n_ranks, rank, inputs).expect("defined everywhere");
                let w = check::windows(&shape, n_ranks, rank, in_place);
                let got = if in_place {
                    let mut buf = w.in_place_buffer(&inputs[rank as usize]);
                    comm.call(shape, Buffers::InPlace(&mut buf)).expect("runs");
                    buf[w.output].to_vec()
                } else {
                    let mut recv = vec![0u8; w.recv];
                    comm.call(shape, Buffers::OutOfPlace { send: &inputs[rank as usize], recv: &mut recv })
                        .expect("runs");
                    recv
                };
                assert_eq!(
                    check::count_wrong(shape.dtype, &want, &got),
                    0,
                    "rank {rank} {shape:?} in place {in_place}"
                );
            });
        }
    });
}

#[test]
fn large_allreduce_and_allgather_are_exact_in_both_placements() {
    for (collective, count) in [(Collective::AllReduce, 3_000_001), (Collective::AllGather, 1_100_003)] {
        let shape = CallShape { collective, count, dtype: DataType::F32, op: ReduceOp::Sum, root: 0, peer: 1 };
        for in_place in [false, true] {
            run_everywhere(shape, 3, in_place);
        }
    }
}
