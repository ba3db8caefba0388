//! Robustness properties: random bytes, soups of `.coll` tokens (bare and inside an algorithm frame) and random
//! well-formed-looking programs go through parse, lower, schedule, fuse, verify and diagnostic rendering for 1 to 8
//! ranks in both placements without panicking, each case within 2 seconds under small limits. Each case runs on
//! its own thread so that a hang is reported as a failure instead of stalling the suite.

use crate::random_program::random_program;
use collc_compiler::{diag, lower, optimise, schedule, verify, Bindings, Errors, Limits, Placement};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CASE_BUDGET: Duration = Duration::from_secs(2);

fn config() -> ProptestConfig {
    let defaults = ProptestConfig::default();
    let seeded = std::env::var_os("PROPTEST_RNG_SEED").is_some();
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        max_shrink_iters: 64,
        max_shrink_time: 20_000,
        rng_seed: if seeded { defaults.rng_seed } else { RngSeed::Fixed(0xc011_c7e5) },
        ..defaults
    }
}

/// Small enough that the worst accepted program stays well inside the time budget in a debug build.
fn limits() -> Limits {
    Limits { max_eval_steps: 250_000, max_transfers: 20_000, max_slots: 1 << 20, ..Limits::default() }
}

fn render(errors: &Errors, source: &str) -> usize {
    errors.0.iter().map(|e| diag::render(e, "case.coll", source, true).len()).sum()
}

/// Every stage for every rank count and placement; what matters is that it returns.
fn run_pipeline(source: &str) {
    let limits = limits();
    let file = match collc_grammar::parse(source, &limits.syntax) {
        Ok(file) => file,
        Err(e) => {
            render(&Errors::from(collc_compiler::Error::from(e)), source);
            return;
        }
    };
    for n_ranks in 1..=8 {
        let program = match lower(&file, &Bindings::ranks(n_ranks), &limits) {
            Ok(program) => program,
            Err(errors) => {
                render(&errors, source);
                continue;
            }
        };
        for placement in Placement::BOTH {
            let mut sched = schedule(&program, placement);
            optimise::fuse(&mut sched);
            // What `compile_program` runs: dependencies and fusion in one walk per rank, the same schedule.
            let one_walk = collc_compiler::sched::schedule_with(&program, placement, optimise::fuse_new_rank);
            assert!(one_walk == sched, "{placement} at {n_ranks} ranks: one-walk fusion differs from the two passes");
            if let Err(errors) = verify(sched, source, &limits) {
                render(&errors, source);
            }
        }
    }
}

/// Runs the pipeline on a thread: `Err` if it panics or outlives the budget (the thread is then abandoned).
fn check(source: String) -> Result<(), TestCaseError> {
    let (done, outcome) = mpsc::channel();
    let start = Instant::now();
    std::thread::spawn(move || {
        let result = std::panic::catch_unwind(|| run_pipeline(&source));
        let _ = done.send(result.map_err(|p| {
            p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        }));
    });
    match outcome.recv_timeout(CASE_BUDGET) {
        Ok(Ok(())) => {
            prop_assert!(start.elapsed() < CASE_BUDGET, "took {:?}", start.elapsed());
            Ok(())
        }
        Ok(Err(message)) => Err(TestCaseError::fail(format!("panicked: {}", message.unwrap_or_default()))),
        Err(_) => Err(TestCaseError::fail(format!("still running after {CASE_BUDGET:?}"))),
    }
}

const VOCABULARY: &[&str] = &[
    "algorithm",
    "for",
    "ranks",
    "nodes",
    "local",
    "root",
    "peer",
    "param",
    "where",
    "chunks",
    "scratch",
    "let",
    "fn",
    "in",
    "out",
    "step",
    "if",
    "else",
    "send",
    "from",
    "to",
    "as",
    "reduce",
    "copy",
    "into",
    "on",
    "channel",
    "by",
    "true",
    "false",
    "allreduce",
    "broadcast",
    "allgather",
    "alltoall",
    "p",
    "r",
    "s",
    "x",
    "f",
    "tmp",
    "min",
    "max",
    "log2",
    "clog2",
    "pow2",
    "abs",
    "0",
    "1",
    "2",
    "3",
    "7",
    "64",
    "1_000",
    "0x10",
    "0xffffffffffffffff",
    "9223372036854775807",
    "9223372036854775808",
    "99999999999999999999999",
    "+",
    "-",
    "*",
    "/",
    "%",
    "**",
    "&",
    "|",
    "^",
    "<<",
    ">>",
    "==",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    "&&",
    "||",
    "!",
    "~",
    "=",
    "..",
    ",",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "#",
    "##",
    "\n",
    "é",
    "\u{0}",
];

fn token_soup() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(VOCABULARY), 0..80).prop_map(|tokens| tokens.join(" "))
}

fn framed_soup() -> impl Strategy<Value = String> {
    let collective = prop::sample::select(&["allreduce", "broadcast", "allgather", "reducescatter", "alltoall"][..]);
    (collective, token_soup()).prop_map(|(c, soup)| format!("algorithm a for {c} {{\n ranks p\n root q\n {soup}\n}}"))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        check(String::from_utf8_lossy(&bytes).into_owned())?;
    }

    #[test]
    fn token_soups_never_panic(source in token_soup()) {
        check(source)?;
    }

    #[test]
    fn framed_token_soups_never_panic(source in framed_soup()) {
        check(source)?;
    }

    #[test]
    fn random_programs_never_panic(words in prop::collection::vec(any::<u32>(), 1..60)) {
        check(random_program(words))?;
    }
}

/// Inputs that once hung or panicked somewhere in the pipeline, or sit right at a limit.
const HARD_INPUTS: &[&str] = &[
    "é",
    "\u{feff}algorithm a for allreduce { ranks p } # naïve — ünïcödé\n",
    "algorithm a for allreduce { ranks p # é if\n send in[0] from 0 to 1 % p reduce }",
    "algorithm a for allreduce { ranks p for i in 0..9223372036854775807 { } }",
    "algorithm a for allreduce { ranks p for i in 9223372036854775807..-9223372036854775807 by -1 { step { } } }",
    "algorithm a for allreduce { ranks p for i in 0..1000000 { for j in 0..1000000 { } } }",
    "algorithm a for allreduce { ranks p fn f(x) = f(x + 1) send in[f(0)] from 0 to 1 }",
    "algorithm a for allreduce { ranks p fn f(x) = if x == 0 { 0 } else { f(x - 1) + f(x - 1) } let y = f(60) }",
    "algorithm a for allreduce { ranks p chunks 9223372036854775807 }",
    "algorithm a for allreduce { ranks p scratch t[4294967295] }",
    "algorithm a for allreduce { ranks p let x = -9223372036854775807 - 1 let y = x / -1 }",
    "algorithm a for allreduce { ranks p let x = 1 << 63 let y = 2 ** 64 let z = pow2(63) }",
    "algorithm a for allreduce { ranks p send in[0..9223372036854775807] from 0 to 1 }",
    "algorithm a for allreduce { ranks p send in[0] from 0 to 1 channel 255 }",
    "algorithm a for allgather { ranks p chunks 500 for r in 0..p { send out[0..500] from r to (r + 1) % p } }",
];

#[test]
fn hard_inputs_finish_without_panicking() {
    let mut problems = Vec::new();
    for input in HARD_INPUTS {
        if let Err(e) = check(input.to_string()) {
            problems.push(format!("{input:?}: {e}"));
        }
    }
    let nested =
        format!("algorithm a for allreduce {{ ranks p let x = {}1{} }}", "(".repeat(10_000), ")".repeat(10_000));
    let chained = format!("algorithm a for allreduce {{ ranks p let x = 1{} }}", " + 1".repeat(10_000));
    for input in [nested, chained] {
        if let Err(e) = check(input.clone()) {
            problems.push(format!("{}...: {e}", &input[..60]));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
