//! Learning from live calls (`COLLC_LEARN=1`): a communicator explores every candidate of a size class, settles on
//! the one whose slowest rank was fastest, says so at INFO, runs it from then on, and keeps the times in this host's
//! timings. (Its own test binary: it sets the environment the communicators read.)

mod common;

use collc_runtime::select::Measured;
use collc_runtime::{CallShape, Collective, Communicator, DataType, Options, ReduceOp};

#[test]
fn live_calls_explore_each_candidate_then_run_the_fastest() {
    let dir = common::TempDir::new("learn");
    let log = dir.path().join("log");
    // SAFETY: set before any thread of this test binary reads the environment (its only test).
    unsafe {
        std::env::set_var("COLLC_LEARN", "1");
        std::env::set_var("COLLC_ALGO", "ring,one_shot");
        std::env::set_var("XDG_CACHE_HOME", dir.path());
        std::env::set_var("COLLC_DEBUG", "INFO");
        std::env::set_var("COLLC_DEBUG_SUBSYS", "COLL");
        std::env::set_var("COLLC_DEBUG_FILE", &log);
        std::env::remove_var("COLLC_TOPO");
        std::env::remove_var("COLLC_ALGO_PATH");
    }
    let comms = Communicator::threads(3, Options::default()).expect("threads");
    let count = 1024;
    let learned: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                scope.spawn(move || {
                    for call in 0..10 {
                        let mut out = vec![0f32; count];
                        let ours = vec![comm.rank() as f32 + 1.0; count];
                        comm.all_reduce(&ours, &mut out, ReduceOp::Sum).expect("the call");
                        assert!(out.iter().all(|&x| x == 6.0), "call {call}: {}", out[0]);
                    }
                    let shape = CallShape {
                        collective: Collective::AllReduce,
                        count,
                        dtype: DataType::F32,
                        op: ReduceOp::Sum,
                        root: 0,
                        peer: 0,
                    };
                    comm.algorithm_of(&shape).expect("chosen")
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("no panic")).collect()
    });
    assert!(learned.iter().all(|name| *name == learned[0]), "every rank runs what it learned: {learned:?}");
    let text = std::fs::read_to_string(&log).expect("the log");
    let line = text.lines().find(|l| l.contains("learned from live calls")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains(&format!("learned from live calls: {} ", learned[0])), "{line}");
    assert!(line.contains("allreduce/ring ") && line.contains("allreduce/one_shot "), "{line}");
    let measured = Measured::load();
    let series = measured.series("allreduce", 3, "threads").expect("the times are kept");
    assert_eq!(series.points.len(), 2, "{series:?}");
    assert!(series.points.iter().all(|p| p.bytes == 4096 && p.seconds > 0.0), "{series:?}");
}
