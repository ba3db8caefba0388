//! Faults become errors on every rank, naming the rank, the instruction and the `.coll` line, within a bounded
//! time: mismatched calls, a rank that never makes its call, a rank that fails, a rank that never joins, an abort
//! from another thread.

use collc_runtime::{Communicator, HostExecutor, Options, ReduceOp, RuntimeError, Transport};
use std::time::{Duration, Instant};

fn quick() -> Options {
    Options { timeout: Duration::from_millis(700), slot_bytes: 0, ..Options::default() }
}

/// Runs `work` on every rank of a threads communicator and returns each rank's outcome.
fn on_ranks<F>(n_ranks: u32, options: Options, work: F) -> Vec<Result<(), RuntimeError>>
where
    F: Fn(&mut Communicator) -> Result<(), RuntimeError> + Sync,
{
    let comms = Communicator::threads(n_ranks, options).expect("threads");
    std::thread::scope(|scope| {
        let work = &work;
        let handles: Vec<_> = comms.into_iter().map(|mut c| scope.spawn(move || work(&mut c))).collect();
        handles.into_iter().map(|h| h.join().expect("no panic")).collect()
    })
}

/// Interpreted and compiled (the JIT checks each message's stamp inline).
#[test]
fn mismatched_counts_are_reported_instead_of_misread() {
    for executor in HostExecutor::ALL {
        let outcomes = on_ranks(2, Options { executor, ..quick() }, |comm| {
            let n = if comm.rank() == 0 { 100 } else { 99 };
            comm.all_reduce(&vec![1f32; n], &mut vec![0f32; n], ReduceOp::Sum)
        });
        let texts: Vec<String> = outcomes.iter().map(|o| o.as_ref().unwrap_err().to_string()).collect();
        assert!(texts.iter().any(|t| t.contains("mismatched calls")), "{executor:?}: {texts:?}");
        let mismatch = texts.iter().find(|t| t.contains("mismatched calls")).expect("found");
        assert!(mismatch.contains("count 100") || mismatch.contains("count 99"), "{executor:?}: {mismatch}");
    }
}

#[test]
fn a_rank_that_never_calls_is_the_one_its_timed_out_peers_name() {
    for executor in HostExecutor::ALL {
        never_calls(Options { executor, ..quick() });
    }
}

fn never_calls(options: Options) {
    let started = Instant::now();
    let outcomes = on_ranks(3, options, |comm| {
        if comm.rank() == 2 {
            std::thread::sleep(Duration::from_millis(1500));
            return Ok(());
        }
        comm.all_reduce(&[1i64; 64], &mut [0i64; 64], ReduceOp::Sum)
    });
    assert!(started.elapsed() < Duration::from_secs(10));
    let first = outcomes[0].as_ref().unwrap_err().to_string();
    let second = outcomes[1].as_ref().unwrap_err().to_string();
    // Each names the rank that never called (it does not check in), what it waited for, and where.
    for text in [&first, &second] {
        assert!(text.contains("rank 2 did not go on within the timeout"), "{text}");
        assert!(text.contains("waited") && text.contains("no longer checks in"), "{text}");
        assert!(text.contains("(allreduce/") && text.contains(" line "), "{text}");
    }
    assert!(first.starts_with("rank 0: instruction #"), "{first}");
}

#[test]
fn a_failed_rank_stops_every_other_rank_with_its_name() {
    for executor in HostExecutor::ALL {
        let outcomes = on_ranks(4, Options { timeout: Duration::from_secs(20), executor, ..quick() }, |comm| {
            if comm.rank() == 3 {
                comm.fail();
                return Ok(());
            }
            comm.all_reduce(&[1u32; 1000], &mut [0u32; 1000], ReduceOp::Sum)
        });
        for (rank, outcome) in outcomes.iter().enumerate().take(3) {
            let text = outcome.as_ref().unwrap_err().to_string();
            assert!(text.contains("rank 3 failed"), "{executor:?} rank {rank}: {text}");
        }
    }
}

#[test]
fn a_rank_that_never_joins_an_shm_job_is_named() {
    let job = format!("never-joins-{}", std::process::id());
    let started = Instant::now();
    let error = Communicator::shm(&job, 0, 2, quick()).err().expect("rank 1 never comes");
    collc_runtime::Shm::remove_job(&job);
    let text = error.to_string();
    assert!(text.contains("rank 1") && text.contains("barrier"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_world_of_zero_ranks_or_a_bad_job_id_is_refused() {
    assert!(Communicator::threads(0, quick()).is_err());
    assert!(Communicator::shm("has/slash", 0, 1, quick()).is_err());
    assert!(Communicator::shm("ok", 3, 2, quick()).is_err());
}

#[test]
fn a_count_that_overflows_is_an_error_not_a_crash() {
    use collc_runtime::{Buffers, CallShape, Collective, DataType};
    let mut comms = Communicator::threads(2, quick()).expect("threads");
    let shape = CallShape {
        collective: Collective::AllGather,
        count: usize::MAX / 4,
        dtype: DataType::F64,
        op: ReduceOp::Sum,
        root: 0,
        peer: 1,
    };
    let error = comms[0].call(shape, Buffers::InPlace(&mut [0u8; 64])).unwrap_err();
    assert!(matches!(error, RuntimeError::CountOverflow { .. }), "{error}");
}

/// A launcher killed with SIGKILL leaves its job's /dev/shm files; the next `collc run` removes them once the
/// launcher is gone and the files have been idle for a minute, and leaves every other file alone.
#[test]
fn stale_shm_files_of_dead_launchers_are_removed() {
    let dead = {
        let mut child = std::process::Command::new("true").spawn().expect("`true` runs");
        child.wait().expect("it exits");
        child.id()
    };
    let live = std::process::id();
    let minutes_ago = std::time::SystemTime::now() - Duration::from_secs(120);
    let file = |name: String, old: bool| {
        let path = std::path::Path::new("/dev/shm").join(name);
        let f = std::fs::File::create(&path).expect("/dev/shm is writable");
        if old {
            f.set_modified(minutes_ago).expect("set mtime");
        }
        path
    };
    let stale =
        [file(format!("collc-{dead}-5eed-control"), true), file(format!("collc-{dead}-5eed-fifo-0-1-0-8"), true)];
    let kept = [
        file(format!("collc-{live}-5eed-control"), true), // its launcher is alive
        file(format!("collc-{dead}-f00d-control"), false), // touched just now
        file(format!("collc-torchrun-{dead}-control"), true), // not a name a launcher gives
    ];
    let removed = collc_runtime::Shm::remove_stale_jobs();
    assert!(removed >= stale.len(), "removed {removed}");
    for path in &stale {
        assert!(!path.exists(), "{} should be gone", path.display());
    }
    for path in &kept {
        assert!(path.exists(), "{} should stay", path.display());
        std::fs::remove_file(path).expect("clean up");
    }
}

#[test]
fn abort_from_another_thread_ends_the_call_within_a_second_on_every_transport() {
    for transport in Transport::host() {
        let options = Options { timeout: Duration::from_secs(30), slot_bytes: 0, ..Options::default() };
        let mut comms = Communicator::group(transport, 2, options).expect("a group");
        let waiting = comms.remove(0);
        let handle = waiting.abort_handle();
        // Rank 1 never calls: rank 0 would wait for it until the timeout, but is aborted after 300 ms.
        let (outcome, waited) = std::thread::scope(|scope| {
            let call = scope.spawn(move || {
                let mut comm = waiting;
                let started = Instant::now();
                let outcome = comm.all_reduce(&[1f32; 1000], &mut [0f32; 1000], ReduceOp::Sum);
                (outcome, started.elapsed())
            });
            std::thread::sleep(Duration::from_millis(300));
            let aborted = Instant::now();
            handle.abort();
            let (outcome, waited) = call.join().expect("no panic");
            assert!(aborted.elapsed() < Duration::from_secs(1), "{transport}: abort took {:?}", aborted.elapsed());
            (outcome, waited)
        });
        let text = outcome.expect_err("an aborted call fails").to_string();
        assert!(waited < Duration::from_secs(2), "{transport}: {waited:?}");
        assert!(text.contains("rank 0") && text.contains("instruction #"), "{transport}: {text}");
    }
}

/// Device buffers on a host transport (or host buffers on cuda) are refused before anything runs, naming what to
/// use instead; on the twin transport mismatched calls fail at once on every rank, each naming both calls.
#[test]
fn device_buffers_on_a_host_transport_are_refused_and_the_twin_reports_mismatches() {
    use collc_runtime::{Buffers, CallShape, Collective, DataType, DevicePtr};
    let mut comms = Communicator::threads(1, quick()).expect("threads");
    let shape = CallShape {
        collective: Collective::AllReduce,
        count: 4,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        root: 0,
        peer: 0,
    };
    let fake = DevicePtr { addr: 0x1000, bytes: 16 };
    let error = comms[0].call(shape, Buffers::DeviceOutOfPlace { send: fake, recv: fake }).expect_err("refused");
    assert!(error.to_string().contains("device buffers need the cuda transport"), "{error}");

    let comms = Communicator::twin(2, quick()).expect("twin");
    let outcomes: Vec<Result<(), RuntimeError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                scope.spawn(move || {
                    let n = if comm.rank() == 0 { 100 } else { 99 };
                    comm.all_reduce(&vec![1f32; n], &mut vec![0f32; n], ReduceOp::Sum)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("no panic")).collect()
    });
    for (rank, outcome) in outcomes.iter().enumerate() {
        let text = outcome.as_ref().expect_err("a mismatch fails every rank").to_string();
        assert!(text.contains(&format!("rank {rank}")), "{text}");
    }
    let texts: Vec<String> = outcomes.iter().map(|o| o.as_ref().unwrap_err().to_string()).collect();
    // Both ranks say at once what each called.
    for text in &texts {
        assert!(text.contains("mismatched calls") && text.contains("count 100") && text.contains("count 99"), "{text}");
    }
}
