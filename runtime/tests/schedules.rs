//! Schedules a library user sets (`Communicator::set_schedule`): every rank of a call must run the same one, and
//! it must have been proved deadlock-free with no more message slots per connection than the transport's links have.
//! Ranks that run different schedules under one algorithm name fail at their first call, every one of them, each
//! naming both fingerprints and where both schedules came from; a schedule proved with more slots is refused.

use collc_compiler::emit::{parse_sched_located, write_sched, SchedLines};
use collc_compiler::{compile, library, verify_sched, Bindings, Limits, Options as CompileOptions, VerifiedSchedule};
use collc_runtime::{Communicator, Options, ReduceOp, RuntimeError, Transport};
use std::sync::Arc;
use std::time::{Duration, Instant};

const RING: &str = "allreduce/ring";

/// `allreduce/ring` for 2 ranks as `compile` builds it with `options`, written as a `.sched` file, read back and
/// verified with `channel_slots` slots per connection, as `collc run FILE.sched` does.
fn schedule(options: CompileOptions, channel_slots: u32) -> Arc<(VerifiedSchedule, SchedLines)> {
    let source = library::get(RING).expect("in the library");
    let built = compile(source, &Bindings::ranks(2), options, &Limits::default()).expect("compiles");
    let text = write_sched(&built, source);
    let (sched, lines) = parse_sched_located(&text).expect("reads back");
    let limits = Limits { channel_slots, ..Limits::default() };
    let verified = verify_sched(sched, &text, &lines, &limits).expect("verifies");
    assert_eq!(verified.channel_slots(), channel_slots);
    Arc::new((verified, lines))
}

fn options() -> Options {
    Options { timeout: Duration::from_secs(20), slot_bytes: 0, ..Options::default() }
}

/// Every rank of a 2-rank group over `transport` runs `schedules[rank]` (named `names[rank]`) in one allreduce of
/// `count` elements of 1.0; each rank's outcome and its output.
fn run_pair(
    transport: Transport,
    names: [&str; 2],
    schedules: [&Arc<(VerifiedSchedule, SchedLines)>; 2],
    count: usize,
) -> Vec<Result<Vec<f32>, RuntimeError>> {
    let comms = Communicator::group(transport, 2, options()).expect("a group");
    std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                let rank = comm.rank() as usize;
                let (name, schedule) = (names[rank], schedules[rank].clone());
                scope.spawn(move || {
                    comm.set_schedule(name, schedule);
                    let mut out = vec![0f32; count];
                    comm.all_reduce(&vec![1f32; count], &mut out, ReduceOp::Sum).map(|()| out)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("no panic")).collect()
    })
}

/// The 16 hex digits after each `fingerprint ` in `text`.
fn fingerprints(text: &str) -> Vec<&str> {
    text.match_indices("fingerprint ").map(|(at, word)| &text[at + word.len()..at + word.len() + 16]).collect()
}

#[test]
fn ranks_running_different_schedules_under_one_name_fail_at_the_first_call_naming_both() {
    let fused = schedule(CompileOptions::default(), 8);
    let pairs = [
        // Other instructions on the same connections: the first message shows it.
        ("unfused", schedule(CompileOptions { fuse: false, ..CompileOptions::default() }, 8)),
        // Other chunks, so other slot sizes: no message of one reaches the other's links.
        ("pipelined", schedule(CompileOptions { pipeline: Some(2), ..CompileOptions::default() }, 8)),
        // The same instructions proved with fewer slots: another schedule all the same.
        ("4 slots", schedule(CompileOptions::default(), 4)),
    ];
    for transport in Transport::host() {
        for (what, other) in &pairs {
            assert_eq!(fused.0.algorithm, other.0.algorithm);
            assert_ne!(fused.0.hash(), other.0.hash(), "{what}");
            let started = Instant::now();
            let outcomes = run_pair(transport, ["a/ring.sched", "b/ring.sched"], [&fused, other], 4096);
            let context = format!("{transport} {what}");
            assert!(started.elapsed() < Duration::from_secs(10), "{context}: {:?}, not at once", started.elapsed());
            for (rank, outcome) in outcomes.iter().enumerate() {
                let error = outcome.as_ref().expect_err("a mismatch fails every rank");
                let text = error.to_string();
                assert!(matches!(error, RuntimeError::Mismatch { .. }), "{context} rank {rank}: {text}");
                assert!(text.contains(&format!("rank {rank}: mismatched calls: this rank called call #1")), "{text}");
                for (name, sched) in [("a/ring.sched", &fused), ("b/ring.sched", other)] {
                    let source = format!("{name} (.sched file; schedule {:016x})", sched.0.hash());
                    assert!(text.contains(&source), "{context} rank {rank}: {source} not in {text}");
                }
                let both = fingerprints(&text);
                assert!(both.len() == 2 && both[0] != both[1], "{context} rank {rank}: {text}");
            }
        }
    }
}

#[test]
fn a_schedule_proved_with_more_slots_than_the_links_have_is_refused_and_fewer_are_fine() {
    let slots = collc_runtime::transport::SLOTS as u32;
    assert_eq!(slots, collc_compiler::CHANNEL_SLOTS);
    let more = schedule(CompileOptions::default(), 2 * slots);
    for transport in [Transport::named("threads"), Transport::named("twin")] {
        for outcome in run_pair(transport, ["ring16.sched"; 2], [&more, &more], 64) {
            let error = outcome.expect_err("refused");
            let text = error.to_string();
            assert!(matches!(error, RuntimeError::Slots { .. }), "{transport}: {text}");
            let proved =
                format!("ring16.sched was proved deadlock-free with {} message slots per connection", 2 * slots);
            assert!(text.contains(&proved), "{text}");
            assert!(text.contains(&format!("the {transport} transport's links have {slots}")), "{text}");
            assert!(text.contains(&format!("--channel-slots {slots} or fewer")), "{text}");
        }
    }
    for proved_with in [slots, slots / 2] {
        let fine = schedule(CompileOptions::default(), proved_with);
        for transport in Transport::host() {
            for outcome in run_pair(transport, ["ring.sched"; 2], [&fine, &fine], 1000) {
                let out = outcome.unwrap_or_else(|e| panic!("{transport} {proved_with} slots: {e}"));
                assert!(out.iter().all(|&x| x == 2.0), "{transport} {proved_with} slots: wrong sums");
            }
        }
    }
}
