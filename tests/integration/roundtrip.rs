//! The `.sched` text form: print -> parse -> print is the identity for every library schedule, the parsed schedule
//! equals the original and verifies again; malformed texts are reported as errors by `parse_sched` or `verify`,
//! never by a panic.

use crate::corpus::{self, render_all};
use collc_compiler::emit::{parse_sched, write_sched};
use collc_compiler::sched::BufId;
use collc_compiler::{compile, diag, verify, Limits, Options, Placement};
use std::panic::{catch_unwind, AssertUnwindSafe};

#[test]
fn library_schedules_round_trip() {
    let limits = Limits::default();
    let mut checked = 0;
    for algo in corpus::library() {
        for n_ranks in [2, 5, 8] {
            for placement in Placement::BOTH {
                let context = format!("{} p={n_ranks} {placement}", algo.name);
                let verified =
                    compile(&algo.text, &corpus::bindings(&algo.text, n_ranks), Options::placed(placement), &limits)
                        .unwrap_or_else(|e| panic!("{context}:\n{}", render_all(&e, &algo.name, &algo.text)));
                for source in [algo.text.as_str(), ""] {
                    let text = write_sched(&verified, source);
                    let parsed = parse_sched(&text).unwrap_or_else(|e| panic!("{context}: {e}\n{text}"));
                    assert_eq!(write_sched(&parsed, source), text, "{context}: print -> parse -> print changed");
                    assert_eq!(&parsed, verified.schedule(), "{context}: the parsed schedule differs");
                    if let Err(errors) = verify(parsed, source, &limits) {
                        panic!("{context}: the parsed schedule no longer verifies:\n{errors:?}");
                    }
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 6, "only {checked} schedules round-tripped");
}

/// A library algorithm at 3 ranks, out of place, as the base text malformed cases edit.
fn base_text(name: &str) -> String {
    let algo = corpus::library().into_iter().find(|a| a.name == name).unwrap_or_else(|| panic!("no {name}"));
    let sched = compile(&algo.text, &corpus::bindings(&algo.text, 3), Options::default(), &Limits::default())
        .expect("verifies");
    write_sched(&sched, "")
}

/// Edits of the base text, each of which must be rejected: (what it breaks, the text).
fn malformed_texts() -> Vec<(&'static str, String)> {
    let base = base_text("allreduce/ring");
    let broadcast = base_text("broadcast/binomial");
    let allgather = base_text("allgather/ring");
    let replace_once = |from: &str, to: &str| {
        assert!(base.contains(from), "the base text has no `{from}`:\n{base}");
        base.replacen(from, to, 1)
    };
    let without_line = |prefix: &str| {
        let lines: Vec<&str> = base.lines().filter(|l| !l.starts_with(prefix)).collect();
        lines.join("\n") + "\n"
    };
    // With `in` and `out`, one buffer more than ids allow: the last would take id 255, `BufId::NONE`.
    let many_buffers: String = (0..BufId::MAX_BUFFERS - 1).map(|i| format!("buffer s{i} 1\n")).collect();
    vec![
        ("empty text", String::new()),
        ("wrong magic", replace_once("collc-schedule 1", "collc-schedule 2")),
        ("unknown instruction", replace_once("#0 Send", "#0 Sned")),
        ("instruction before any rank", without_line("rank 0")),
        ("instructions out of order", replace_once("#1 ", "#7 ")),
        ("unknown buffer", replace_once("src=in[", "src=nope[")),
        ("missing bracket", replace_once("src=in[0]", "src=in[0")),
        ("unknown key", replace_once("send=1", "sned=1")),
        ("non-numeric peer", replace_once("send=1", "send=x")),
        ("non-numeric chunk index", replace_once("src=in[0]", "src=in[-1]")),
        ("unknown collective", replace_once("for allreduce", "for allsum")),
        ("unknown placement", replace_once("placement out-of-place", "placement sideways")),
        ("ranks listed out of order", replace_once("rank 1", "rank 2")),
        ("spans out of order", replace_once("span 1 ", "span 5 ")),
        ("unrecognised line", base.clone() + "bogus line\n"),
        ("forward dependency", replace_once("#0 Send src=in[0] send=1", "#0 Send src=in[0] send=1 deps=3")),
        ("peer out of range", replace_once("send=1", "send=99")),
        ("send to itself", replace_once("#0 Send src=in[0] send=1", "#0 Send src=in[0] send=0")),
        ("chunk index past the end", replace_once("src=in[0]", "src=in[3]")),
        ("zero chunks", replace_once("#0 Send src=in[0] send=1", "#0 Send src=in[0] n=0 send=1")),
        ("operand the op does not use", replace_once("#0 Send src=in[0]", "#0 Send src=in[0] dst=out[0]")),
        ("missing operand", replace_once("#0 Send src=in[0]", "#0 Send")),
        ("unmatched extra send", replace_once("#0 Send src=in[0] send=1", "#0 Send src=in[0] send=2")),
        ("fewer rank blocks than ranks", replace_once("ranks 3 chunks", "ranks 4 chunks")),
        ("more rank blocks than ranks", replace_once("ranks 3 chunks", "ranks 2 chunks")),
        ("no buffers declared", replace_once("buffer in 3\nbuffer out 3\n", "")),
        ("reversed span on a failing instruction", reversed_span(&base)),
        ("root outside the ranks", broadcast.replacen("root 0", "root 9", 1)),
        ("no ranks", replace_once("ranks 3 chunks", "ranks 0 chunks")),
        ("no ranks and no rank blocks", tiny_sched(0, &[])),
        ("a rank block beyond the ranks", tiny_sched(1, &["  #0 Copy src=in[0] dst=out[0] @0"; 2])),
        ("output buffer smaller than the contract", allgather.replacen("ranks 3 chunks", "ranks 4 chunks", 1)),
        (
            "more buffers than a one-byte id names",
            replace_once("buffer out 3\n", &format!("buffer out 3\n{many_buffers}")),
        ),
        ("span number past two bytes", replace_once("send=1 @1", "send=1 @65536")),
    ]
}

/// An allreduce schedule of one chunk for `n_ranks`, with one `rank` block per entry of `blocks`.
fn tiny_sched(n_ranks: u32, blocks: &[&str]) -> String {
    let mut text = format!(
        "collc-schedule 1\nalgorithm tiny for allreduce\nplacement out-of-place\n\
         ranks {n_ranks} chunks 1 root 0 peer 0\nbuffer in 1\nbuffer out 1\nspan 0 0..0\n"
    );
    for (rank, block) in blocks.iter().enumerate() {
        text.push_str(&format!("rank {rank}\n{block}\n"));
    }
    text
}

/// A span whose end is before its start, used by an instruction that also fails the bounds check.
fn reversed_span(base: &str) -> String {
    let span = base.lines().find(|l| l.starts_with("span 1 ")).expect("span 1");
    let (start, end) = span["span 1 ".len()..].split_once("..").expect("START..END");
    base.replacen(span, &format!("span 1 {end}..{start}"), 1).replacen("send=1 @1", "send=7 @1", 1)
}

#[test]
fn malformed_texts_are_errors_not_panics() {
    let mut problems = Vec::new();
    for (what, text) in malformed_texts() {
        let outcome = catch_unwind(AssertUnwindSafe(|| match parse_sched(&text) {
            Err(error) => Err(diag::render(&error, "case.sched", &text, true)),
            Ok(sched) => match verify(sched, "", &Limits::default()) {
                Ok(_) => Ok(()),
                Err(errors) => Err(render_all(&errors, "case.sched", "")),
            },
        }));
        match outcome {
            Err(panic) => problems.push(format!("{what}: panicked: {}", panic_message(&panic))),
            Ok(Ok(())) => problems.push(format!("{what}: accepted")),
            Ok(Err(rendered)) => assert!(rendered.contains("collc::"), "{what}: no code in\n{rendered}"),
        }
    }
    assert!(problems.is_empty(), "malformed .sched texts not rejected cleanly:\n{}", problems.join("\n"));
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a non-string panic".to_string())
}
