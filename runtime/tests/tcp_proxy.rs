//! The tcp transport through its network proxy thread (`COLLC_NET_PROXY=1`; on a host with fewer than two cores per
//! rank the default is the inline mode, which the other tests run): every library algorithm at 2, 3 and 5 ranks, in
//! both placements, at counts that take one message, several tiles, and slots full, each rank's result against the
//! collective's definition. (Its own test binary: it sets the variable the transport reads.)

use collc_compiler::library::LIBRARY;
use collc_compiler::{Collective, Placement};
use collc_runtime::{check, Buffers, CallShape, Communicator, DataType, Options, ReduceOp, Transport};
use std::time::Duration;

#[test]
fn every_library_algorithm_runs_right_through_the_proxy_thread() {
    // SAFETY: set before any thread of this test binary reads the environment (its only test).
    unsafe { std::env::set_var("COLLC_NET_PROXY", "1") };
    let options = Options { timeout: Duration::from_secs(30), slot_bytes: 4096, ..Options::default() };
    let mut runs = 0;
    for n_ranks in [2u32, 3, 5] {
        let comms = Communicator::group(Transport::named("tcp"), n_ranks, options.clone()).expect("a tcp group");
        let wrong: Vec<String> = std::thread::scope(|scope| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|mut comm| {
                    scope.spawn(move || {
                        let mut wrong = Vec::new();
                        let mut runs = 0;
                        for (name, source) in LIBRARY {
                            let collective: Collective = name.split('/').next().unwrap_or("").parse().expect("named");
                            if collective == Collective::SendRecv && n_ranks < 2 {
                                continue;
                            }
                            // The node-split algorithms as one rank per node.
                            let params = match source.contains("nodes n local g") {
                                true => vec![("g".to_string(), 1)],
                                false => Vec::new(),
                            };
                            comm.set_algorithm(collective, name, source, params);
                            for count in [1usize, 1000, 40_000] {
                                for placement in Placement::BOTH {
                                    let op = ReduceOp::Sum;
                                    let (root, peer) = (n_ranks - 1, 0);
                                    let shape = CallShape { collective, count, dtype: DataType::I32, op, root, peer };
                                    let rank = comm.rank();
                                    let in_place = placement == Placement::InPlace;
                                    let w = check::windows(&shape, n_ranks, rank, in_place);
                                    let input = check::input(&shape, n_ranks, rank);
                                    let mut recv = vec![0u8; w.recv];
                                    let mut buffer = w.in_place_buffer(&input);
                                    let buffers = match in_place {
                                        true => Buffers::InPlace(&mut buffer),
                                        false => Buffers::OutOfPlace { send: &input, recv: &mut recv },
                                    };
                                    if let Err(e) = comm.call(shape, buffers) {
                                        wrong.push(format!("{name} {count} {placement:?}: {e}"));
                                        continue;
                                    }
                                    runs += 1;
                                    let got = if in_place { &buffer[w.output.clone()] } else { &recv[..] };
                                    if let Some(want) = check::expected(&shape, n_ranks, rank) {
                                        let bad = check::count_wrong(shape.dtype, &want, got);
                                        if bad > 0 {
                                            wrong.push(format!("{name} at {n_ranks} ranks, rank {rank}, {count} {placement:?}: {bad} wrong"));
                                        }
                                    }
                                }
                            }
                        }
                        (wrong, runs)
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| {
                    let (wrong, n) = h.join().expect("a rank thread");
                    runs += n;
                    wrong
                })
                .collect()
        });
        assert!(wrong.is_empty(), "{wrong:#?}");
    }
    assert!(runs > 1000, "{runs} calls");
}

/// A rank that aborts while the others wait in a call through their proxies is named by each of them, within the
/// timeout.
#[test]
fn a_rank_that_aborts_is_named_through_the_proxy() {
    // SAFETY: the same value as the other test of this binary sets.
    unsafe { std::env::set_var("COLLC_NET_PROXY", "1") };
    let options = Options { timeout: Duration::from_secs(20), slot_bytes: 0, ..Options::default() };
    let comms = Communicator::group(Transport::named("tcp"), 3, options).expect("a tcp group");
    let started = std::time::Instant::now();
    let errors: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                scope.spawn(move || {
                    if comm.rank() == 1 {
                        std::thread::sleep(Duration::from_millis(300));
                        comm.abort_handle().abort();
                        return String::new();
                    }
                    let mut out = vec![0f32; 1 << 16];
                    match comm.all_reduce(&vec![1f32; 1 << 16], &mut out, ReduceOp::Sum) {
                        Ok(()) => "the call succeeded".into(),
                        Err(e) => e.to_string(),
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a rank thread")).collect()
    });
    for rank in [0, 2] {
        assert!(errors[rank].contains("rank 1"), "rank {rank}: {}", errors[rank]);
    }
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
}
