//! The optimisation passes do what they promise, beyond verifying (which every library test checks): the
//! pipelining pass staggers slices over steps, and receive-reduce fusion reduces straight out of messages unless the
//! received value is read again.

use collc_compiler::sched::Op;
use collc_compiler::{
    compile, compile_placements, compile_program, library, lower, optimise, pipelined, schedule, verify, Bindings,
    Errors, InTurn, Join, Limits, Options, Placement, Schedule, VerifiedSchedule,
};

fn ops(source: &str, n_ranks: u32) -> Vec<Vec<Op>> {
    let sched = compile(source, &Bindings::ranks(n_ranks), Options::default(), &Limits::default()).expect("verifies");
    sched.ranks.iter().map(|r| r.instrs.iter().map(|i| i.op).collect()).collect()
}

#[test]
fn pipelining_staggers_k_slices_over_the_steps() {
    let source = library::get("broadcast/chain").expect("in the library");
    let file = collc_grammar::parse(source, &Default::default()).expect("parses");
    for (p, k) in [(2u32, 1u32), (5, 4), (8, 8), (3, 16)] {
        let program = lower(&file, &Bindings::ranks(p), &Limits::default()).expect("lowers");
        let options = Options { pipeline: Some(k), ..Options::default() };
        let sliced = pipelined(&program, options, &Limits::default()).expect("fits the limits");
        assert_eq!(sliced.chunks, program.chunks * k);
        assert_eq!(sliced.n_steps, program.n_steps + k - 1, "p={p} k={k}");
        assert_eq!(sliced.transfers.len(), program.transfers.len() * k as usize);
        // In step s, hop h carries slice s - h: every hop is busy once the pipeline is full.
        for t in &sliced.transfers {
            let hop = (t.from + p - program.root) % p;
            let index = t.src.index;
            assert_eq!(index, t.step - hop, "p={p} k={k}: {t:?}");
        }
    }
}

#[test]
fn a_received_chunk_is_reduced_out_of_its_message() {
    // naive: rank 0 receives every buffer into scratch and reduces them one by one.
    let naive = ops(library::get("allreduce/naive").expect("in the library"), 4);
    assert!(naive.iter().flatten().all(|&op| op != Op::Reduce), "{naive:?}");
    assert_eq!(naive[0].iter().filter(|&&op| matches!(op, Op::RecvReduceCopy | Op::RecvReduceCopySend)).count(), 3);
}

#[test]
fn a_received_chunk_read_again_stays_in_scratch() {
    let source = "algorithm twice for allreduce {
        ranks p where p == 2
        scratch t[2]
        step { send in[0] from 1 to 0 as t[0] }
        reduce t[0] into in[0] on 0
        copy t[0] to t[1] on 0
        send in[0] from 0 to 1
    }";
    let ops = ops(source, 2);
    assert_eq!(ops[0][0], Op::Recv, "{ops:?}");
    assert!(ops[0].contains(&Op::Reduce), "{ops:?}");
}

/// `compile_program` falls back to the unfused schedule when the fused one fails to verify; that must stay a
/// fallback for deadlocks, never a cover for a fusion bug. So fusion itself must verify for the library (where no
/// schedule deadlocks at the default 8 slots) and for programs that once tripped it, and fusing each rank inside
/// scheduling (what `compile_program` does) must give the schedule that fusing afterwards gives.
fn fused_verifies(source: &str, n_ranks: u32) -> Result<(), String> {
    let limits = Limits::default();
    let file = collc_grammar::parse(source, &limits.syntax).map_err(|e| e.to_string())?;
    let bindings = crate::corpus::bindings(source, n_ranks);
    let program = lower(&file, &bindings, &limits).map_err(|e| crate::corpus::render_all(&e, "x", source))?;
    let program = pipelined(&program, Options::default(), &limits).map_err(|e| format!("{e:?}"))?;
    for placement in Placement::BOTH {
        let mut sched = schedule(&program, placement);
        optimise::fuse(&mut sched);
        // `compile_program` fuses each rank inside scheduling: the same schedule as fusing afterwards.
        let fused_while_scheduling = collc_compiler::sched::schedule_with(&program, placement, optimise::fuse_new_rank);
        if fused_while_scheduling != sched {
            return Err(format!("{placement}: fusing while scheduling differs from fusing afterwards"));
        }
        verify(sched, source, &limits)
            .map_err(|e| format!("{placement}: {}", crate::corpus::render_all(&e, "x", source)))?;
    }
    Ok(())
}

#[test]
fn fusion_verifies_without_the_fallback() {
    for (name, source) in library::LIBRARY {
        for p in 1..=9 {
            fused_verifies(source, p).unwrap_or_else(|e| panic!("{name} p={p}: {e}"));
        }
    }
    // A scratch chunk reused before and after a receive-reduce pair: its earlier reader must still precede the
    // later writer once the receive is gone.
    let reused = "algorithm staged for allreduce {
        ranks p where p == 2
        scratch t[1]
        copy in[0] to t[0] on 0
        step { send t[0] from 0 to 1 as t[0] }
        step { send in[0] from 1 to 0 as t[0] }
        reduce t[0] into in[0] on 0
        reduce t[0] into in[0] on 1
        copy in[0] to t[0] on 0
    }";
    fused_verifies(reused, 2).expect("scratch reused around a fused pair");
    // Receive-reduces of up to 64 chunks track their coverage in a bit mask in the one-walk fusion; wider ones take
    // the two passes. Rank 1 forwards what it reduced and has it overwritten in full later, so its write is dead
    // (RecvReduceSend) on both sides of the boundary.
    for chunks in [1, 63, 64, 65, 70] {
        let wide = format!(
            "algorithm wide for allreduce {{
                ranks p where p == 3
                chunks {chunks}
                step {{ send in[0..{chunks}] from 0 to 1 reduce }}
                step {{ send in[0..{chunks}] from 1 to 2 reduce }}
                step {{ send in[0..{chunks}] from 2 to 0 }}
                step {{ send in[0..{chunks}] from 0 to 1 }}
            }}"
        );
        fused_verifies(&wide, 3).unwrap_or_else(|e| panic!("{chunks} chunks: {e}"));
        assert_eq!(ops(&wide, 3)[1], [Op::RecvReduceSend, Op::Recv], "{chunks} chunks");
    }
    // Part of the received chunk is overwritten before the reduction reads it: not a pair to fuse.
    let overwritten = "algorithm overwritten for allreduce {
        ranks p where p == 2
        chunks 2
        scratch t[2]
        scratch s[2]
        copy in[0] to s[0] on 1
        step { send in[0] from 0 to 1 reduce }
        step { send in[0..2] from 1 to 0 as t[0..2] }
        step { send s[0] from 1 to 0 as t[0] channel 1 }
        reduce t[0..2] into in[0..2] on 0
        step { send in[1] from 0 to 1 }
    }";
    let ops = ops(overwritten, 2);
    assert!(ops[0].contains(&Op::Reduce), "{ops:?}");
}

/// Every library algorithm still verifies when pipelined, whatever the shapes of its scratch buffers (rounded up
/// to whole blocks of C chunks by the pass).
#[test]
fn every_algorithm_verifies_pipelined() {
    for (name, source) in library::LIBRARY {
        for p in 1..=8 {
            let options = Options { pipeline: Some(3), ..Options::default() };
            compile(source, &crate::corpus::bindings(source, p), options, &Limits::default()).unwrap_or_else(|e| {
                panic!("{name} p={p} pipelined 3:\n{}", crate::corpus::render_all(&e, name, source))
            });
        }
    }
}

#[test]
fn pipelining_past_the_slot_limit_is_an_error_not_a_wrong_schedule() {
    let source = library::get("reducescatter/ring").expect("in the library");
    let limits = Limits { max_slots: 4096, ..Limits::default() };
    let options = Options { pipeline: Some(64), ..Options::default() };
    let errors = compile(source, &Bindings::ranks(8), options, &limits).expect_err("8 x 64 x 8 chunks per rank");
    assert_eq!(errors.0[0].code, "collc::optimise::pipeline", "{errors:?}");
}

/// Out of place, a message whose chunks the sender holds in two buffers (one chunk copied into `out`, the next still
/// in `in`) is cut into one instruction per contiguous run, and the receiver, whose chunks are contiguous, cuts it
/// the same way: scheduling builds each rank alone, from cuts found over the whole program first.
#[test]
fn a_message_from_two_buffers_is_cut_alike_on_both_sides() {
    let source = "algorithm cut for allgather {
        ranks p where p == 3
        chunks 2
        step {
            for r in 0..p {
                copy in[0] to out[2 * r] on r
            }
        }
        for s in 0..p - 1 {
            step {
                for r in 0..p {
                    let b = (r - s) % p
                    send out[2 * b..2 * b + 2] from r to (r + 1) % p
                }
            }
        }
    }";
    let unfused = |placement: Placement| {
        let options = Options { placement, fuse: false, pipeline: None };
        compile(source, &Bindings::ranks(3), options, &Limits::default()).expect("verifies")
    };
    let out_of_place = unfused(Placement::OutOfPlace);
    for (rank, program) in out_of_place.ranks.iter().enumerate() {
        let widths = |op: Op| program.instrs.iter().filter(|i| i.op == op).map(|i| i.count).collect::<Vec<_>>();
        // The first message (the rank's own block) goes as two: out[2r] copied, in[1] not; the second as one.
        assert_eq!(widths(Op::Send), vec![1, 1, 2], "rank {rank}: {:?}", program.instrs);
        assert_eq!(widths(Op::Recv), vec![1, 1, 2], "rank {rank}: {:?}", program.instrs);
        let first = program.instrs.iter().filter(|i| i.op == Op::Send).take(2).collect::<Vec<_>>();
        assert_ne!(first[0].src.buf, first[1].src.buf, "rank {rank}: {first:?}");
    }
    // In place `in` is a window of `out`: the copy is onto itself, so no instruction, and nothing is cut.
    let in_place = unfused(Placement::InPlace);
    for program in &in_place.ranks {
        assert!(program.instrs.iter().all(|i| i.op != Op::Copy && i.count == 2), "{:?}", program.instrs);
    }
}

/// Lowering runs a loop whose body is one transfer in a batch (every expression over the whole range at once); any
/// other body goes one iteration at a time. The two give the same transfers, and the same diagnostics when an
/// iteration's rank is out of range or its arithmetic fails (the batch then falls back). `if 1 { }` around the
/// transfer forces the one-at-a-time path.
#[test]
fn a_loop_of_one_transfer_lowers_alike_in_a_batch_and_one_iteration_at_a_time() {
    let lowered = |transfer: &str, wrap: bool| {
        // The same source offsets either way, so that spans compare equal.
        let body = if wrap { format!("if 1 {{ {transfer} }}") } else { format!("       {transfer}  ") };
        let source = format!(
            "algorithm batch for allreduce {{
                ranks p
                chunks p
                for s in 0..p - 1 {{
                    step {{
                        for r in 0..p by 1 {{
                            {body}
                        }}
                    }}
                }}
                for r in 1..2 * p by 3 {{
                    send in[r % p] from r % p to (r + 1) % p
                }}
            }}"
        );
        let file = collc_grammar::parse(&source, &Default::default()).expect("parses");
        match lower(&file, &Bindings::ranks(12), &Limits::default()) {
            Ok(program) => format!("{:?}", program.transfers),
            Err(errors) => format!("{:?}", errors.0),
        }
    };
    let cases = [
        // Correct: the ring's reduce-scatter, with mathematical modulo of negative values, ranges and `as`.
        "send in[(r - s) % p] from r to (r + 1) % p reduce",
        "send in[(r + s) % p..(r + s) % p + 1] from (r + 5 * p - 1) % p to r as out[(r + s) % p]",
        // Broken in some iterations only: a rank out of range, a division by zero, an overflow.
        "send in[(r - s) % p] from r to r + 1",
        "send in[r / (r - 7)] from r to (r + 1) % p",
        "send in[(r * 9223372036854775807) % p] from r to (r + 1) % p",
    ];
    for transfer in cases {
        let (batched, one_at_a_time) = (lowered(transfer, false), lowered(transfer, true));
        assert_eq!(batched, one_at_a_time, "{transfer}");
        assert!(batched.len() > 100, "{transfer}: {batched}");
    }
}

/// The same schedule, or errors with the same codes.
fn same_outcome(a: &Result<Schedule, Errors>, b: &Result<Schedule, Errors>) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => a == b,
        (Err(a), Err(b)) => a.0.iter().map(|e| e.code).eq(b.0.iter().map(|e| e.code)),
        _ => false,
    }
}

/// `compile_placements` (ranks built in two halves, each rank's transfers gathered once for both placements, as
/// `collc check` runs it on two threads) gives what `compile_program` gives for each placement on its own: the same
/// schedules, or the same errors. Here on a join that runs the halves on two threads, and on one that runs them in
/// turn.
#[test]
fn compiling_both_placements_at_once_gives_each_placements_schedule() {
    struct Threads;
    impl Join for Threads {
        fn join<A: Send, B: Send>(&self, a: impl FnOnce() -> A + Send, b: impl FnOnce() -> B + Send) -> (A, B) {
            std::thread::scope(|scope| {
                let second = scope.spawn(b);
                (a(), second.join().expect("no panic"))
            })
        }
    }
    let limits = Limits::default();
    for (name, source) in library::LIBRARY {
        let file = collc_grammar::parse(source, &limits.syntax).expect("parses");
        for p in 1..=9 {
            let Ok(program) = lower(&file, &crate::corpus::bindings(source, p), &limits) else { continue };
            let options = Placement::BOTH.map(Options::placed);
            let alone = options.map(|o| compile_program(&program, source, o, &limits).map(|v| v.into_schedule()));
            let relower = || Ok(program.clone());
            let together = compile_placements(program.clone(), &relower, source, options, &limits, &Threads);
            let in_turn = compile_placements(program.clone(), &relower, source, options, &limits, &InTurn);
            for (i, (together, in_turn)) in together.into_iter().zip(in_turn).enumerate() {
                let same = |r: Result<VerifiedSchedule, Errors>| same_outcome(&r.map(|v| v.into_schedule()), &alone[i]);
                assert!(same(together) && same(in_turn), "{name} p={p} {}", options[i].placement);
            }
        }
    }
}

/// With one message slot per connection some fused schedules deadlock where the unfused ones do not:
/// `compile_placements` has dropped the program by then and makes it again (`relower`) for the unfused schedule,
/// which must be what `compile_program` returns. The sweep must meet such a case, or it tests nothing.
#[test]
fn compiling_both_placements_lowers_again_only_for_the_unfused_fallback() {
    let limits = Limits { channel_slots: 1, ..Limits::default() };
    let mut fallbacks = 0;
    for (name, source) in library::LIBRARY {
        let file = collc_grammar::parse(source, &limits.syntax).expect("parses");
        for p in 2..=6 {
            let bindings = crate::corpus::bindings(source, p);
            let Ok(program) = lower(&file, &bindings, &limits) else { continue };
            let options = Placement::BOTH.map(Options::placed);
            let alone = options.map(|o| compile_program(&program, source, o, &limits).map(|v| v.into_schedule()));
            // The two placements share their pipelining.
            let sliced = pipelined(&program, options[0], &limits).expect("pipelines");
            let fused_fails = options.map(|o| {
                let fused = collc_compiler::sched::schedule_with(&sliced, o.placement, optimise::fuse_new_rank);
                verify(fused, source, &limits).is_err()
            });
            let cut_pass = options.map(|o| collc_compiler::sched::Layout::needs_cut_pass(&sliced, o.placement));
            drop(sliced);
            let lowered = std::sync::atomic::AtomicUsize::new(0);
            let relower = || {
                lowered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                lower(&file, &bindings, &limits)
            };
            let together = compile_placements(program, &relower, source, options, &limits, &InTurn);
            for (i, together) in together.into_iter().enumerate() {
                let together = together.map(|v| v.into_schedule());
                assert!(same_outcome(&together, &alone[i]), "{name} p={p} {}", options[i].placement);
            }
            // A program whose layout needs the pass that finds cuts is compiled per placement and kept.
            let kept = cut_pass.iter().any(|&c| c);
            let failed = fused_fails.iter().filter(|&&f| f).count();
            let expected = if kept { 0 } else { failed };
            assert_eq!(lowered.into_inner(), expected, "{name} p={p}: lowered again once per failed fused schedule");
            fallbacks += expected;
        }
    }
    assert!(fallbacks > 0, "no fused schedule of the library deadlocks with one slot: the fallback went untested");
}
