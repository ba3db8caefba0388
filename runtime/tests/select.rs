//! A communicator built by a library user chooses its algorithm per call as `collc run COLLECTIVE` does, and says
//! which it chose, and why, once per collective and size class at `COLLC_DEBUG=INFO`. (Its own test binary: the log
//! settings are read once per process.)

use collc_runtime::{Collective, Communicator, Options, ReduceOp};

#[test]
fn a_communicator_without_an_algorithm_chooses_per_size_and_logs_why() {
    let log = std::env::temp_dir().join(format!("collc-select-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    // A topology of its own (the built-in constants: 0.5 us, 16 GB/s, 16 GB/s of reduction), so that the choice
    // does not depend on how this host calibrates: a latency-bound algorithm at 32 B, a bandwidth-bound one at 4 MiB.
    let topo = std::env::temp_dir().join(format!("collc-select-{}.json", std::process::id()));
    let uniform = r#"{"nodes": 1, "links": {"intra": {"alpha_us": 0.5, "bandwidth_gbps": 16}}, "reduce_gbps": 16}"#;
    std::fs::write(&topo, uniform).expect("a topology file");
    // SAFETY: set before any thread of this test binary reads the environment (its only test).
    unsafe {
        std::env::set_var("COLLC_DEBUG", "INFO");
        std::env::set_var("COLLC_DEBUG_SUBSYS", "COLL");
        std::env::set_var("COLLC_DEBUG_FILE", &log);
        std::env::remove_var("COLLC_ALGO");
        std::env::set_var("COLLC_TOPO", &topo);
    }
    let comms = Communicator::threads(4, Options::default()).expect("threads");
    assert_eq!(comms[0].algorithm(Collective::AllReduce), "selected per size");
    std::thread::scope(|scope| {
        for mut comm in comms {
            scope.spawn(move || {
                let rank = comm.rank() as f32;
                for (count, repeat) in [(8usize, 3), (1 << 20, 2)] {
                    for _ in 0..repeat {
                        let mut out = vec![0f32; count];
                        comm.all_reduce(&vec![rank + 1.0; count], &mut out, ReduceOp::Sum).expect("the call");
                        assert!(out.iter().all(|&x| x == 10.0), "{count} floats: {}", out[0]);
                    }
                }
            });
        }
    });
    let text = std::fs::read_to_string(&log).expect("the log file");
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(&topo);
    let choices: Vec<&str> = text.lines().filter(|l| l.contains("COLLC INFO allreduce of ")).collect();
    assert_eq!(choices.len(), 2, "one line per size class:\n{text}");
    assert!(choices[0].contains("allreduce of 32 B (sizes 32..=63 B)"), "{}", choices[0]);
    assert!(choices[1].contains("allreduce of 4194304 B"), "{}", choices[1]);
    for line in &choices {
        assert!(
            line.contains(" predicted ") && line.contains("runner-up allreduce/") && line.contains("cost model on"),
            "{line}"
        );
    }
    let chosen = |line: &str| line.split("): ").nth(1).and_then(|r| r.split(' ').next()).map(str::to_string);
    assert_ne!(chosen(choices[0]), chosen(choices[1]), "one algorithm for 32 B and 4 MiB on 4 ranks:\n{text}");
}
