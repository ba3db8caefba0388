//! The example under `examples/` builds (as cargo's example target and here) and runs correctly.

#[path = "../../examples/allreduce.rs"]
mod example;

#[test]
fn the_allreduce_example_runs_on_four_rank_threads() {
    example::main().expect("the example succeeds");
}

#[test]
fn the_typed_calls_check_their_arguments() {
    use collc_runtime::{Communicator, Options, ReduceOp, RuntimeError};
    let mut comms = Communicator::threads(3, Options::default()).expect("threads");
    let comm = &mut comms[0];
    let err = comm.all_gather_in_place(&mut [0f32; 7]).unwrap_err();
    assert!(err.to_string().contains("does not split into 3 equal blocks"), "{err}");
    let err = comm.broadcast_in_place(&mut [0u8; 4], 3).unwrap_err();
    assert!(err.to_string().contains("root 3 is outside"), "{err}");
    let err = comm.all_reduce(&[1i32; 8], &mut [0i32; 4], ReduceOp::Sum).unwrap_err();
    assert!(matches!(err, RuntimeError::BufferSize { rank: 0, needed: 32, got: 16, .. }), "{err}");
    assert!(Communicator::threads(0, Options::default()).is_err());
}
