//! A library user's communicator takes users' algorithms from `COLLC_ALGO_PATH` into its per-call choice, verifies
//! them before their first call, and names a file that does not verify. (Its own test binary: it sets the
//! environment the communicators read.)

mod common;

use collc_runtime::{CallShape, Collective, Communicator, DataType, Options, ReduceOp, RuntimeError};
use common::TempDir;

fn folder(name: &str, file: &str, text: &str) -> TempDir {
    let dir = TempDir::new(&format!("algo-path-{name}"));
    std::fs::write(dir.path().join(file), text).expect("written");
    dir
}

/// Every rank's allreduce of `count` floats (rank r gives r + 1); each rank's error, or whether its sum was right.
fn all_reduce(comms: Vec<Communicator>, count: usize) -> Vec<Result<bool, RuntimeError>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                scope.spawn(move || {
                    let n = comm.n_ranks() as f32;
                    let mut out = vec![0f32; count];
                    let ours = vec![comm.rank() as f32 + 1.0; count];
                    comm.all_reduce(&ours, &mut out, ReduceOp::Sum)
                        .map(|()| out.iter().all(|&x| x == n * (n + 1.0) / 2.0))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("no panic")).collect()
    })
}

#[test]
fn a_users_algorithm_joins_the_choice_and_one_that_does_not_verify_is_named() {
    let ring = collc_compiler::library::get("allreduce/ring").expect("embedded");
    let good = folder("good", "mine.coll", &ring.replace("algorithm ring for", "algorithm my_ring for"));
    // SAFETY: set before any thread of this test binary reads the environment (its only test).
    unsafe {
        std::env::set_var("COLLC_ALGO_PATH", good.path());
        std::env::set_var("COLLC_ALGO", "allreduce:my_ring");
        std::env::remove_var("COLLC_TOPO");
    }
    let mut comms = Communicator::threads(3, Options::default()).expect("threads");
    let shape = CallShape {
        collective: Collective::AllReduce,
        count: 256,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        root: 0,
        peer: 0,
    };
    assert_eq!(comms[0].algorithm_of(&shape).expect("chosen"), "allreduce/my_ring");
    for result in all_reduce(comms, 256) {
        assert!(result.expect("the call"), "a wrong sum");
    }
    let bad = folder(
        "bad",
        "x.coll",
        "algorithm x for allreduce {\n ranks p\n chunks p\n step { send in[0] from 0 to 1 }\n}\n",
    );
    // SAFETY: no other thread runs now: the rank threads above have ended.
    unsafe {
        std::env::set_var("COLLC_ALGO_PATH", bad.path());
        std::env::set_var("COLLC_ALGO", "allreduce:x");
    }
    let comms = Communicator::threads(3, Options::default()).expect("threads");
    for result in all_reduce(comms, 64) {
        let message = result.expect_err("x does not verify").to_string();
        assert!(
            message.contains("allreduce/x")
                && message.contains("x.coll:")
                && message.contains("does not verify for 3 ranks"),
            "{message}"
        );
    }
}
