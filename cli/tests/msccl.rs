//! MSCCL XML from the command line: `collc import` says what a file is and whether it verifies; `check`, `run` and
//! `cost` take an `.xml` file; `build --emit msccl-xml|mscclpp-json` writes files that read back, and refuses a
//! schedule past a target's limits at the `.coll` line.

mod common;

use common::TempFile;
use std::process::{Command, Output};

fn collc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_collc"))
        .args(args)
        .env_remove("COLLC_ALGO_PATH")
        .env("NO_COLOR", "1")
        .output()
        .expect("collc runs")
}

fn corpus(path: &str) -> String {
    format!("{}/../tests/fixtures/msccl/{path}", env!("CARGO_MANIFEST_DIR"))
}

fn out(output: &Output) -> (String, String) {
    (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn import_describes_and_verifies_a_real_file() {
    let output = collc(&["import", &corpus("rccl/alltoall-8n-9kb-190kb.xml")]);
    let (stdout, stderr) = out(&output);
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("alltoall_llm for alltoall on 8 ranks, out-of-place"), "{stdout}");
    assert!(stdout.contains("msccl-executor dialect, proto LL, for 9217..=194560 bytes"), "{stdout}");
    assert!(stdout.contains("verified out-of-place: verified exactly (240 instructions)"), "{stdout}");
}

#[test]
fn a_broken_file_is_refused_at_its_step() {
    let text = std::fs::read_to_string(corpus("mscclang/allreduce_ring_4gpu.xml")).unwrap();
    // Rank 2's first reduction adds chunk 0 where it should add chunk 1.
    let broken = text.replacen(
        r#"<step s="1" type="rrs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1""#,
        r#"<step s="1" type="rrs" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0""#,
        1,
    );
    assert_ne!(broken, text);
    let file = TempFile::with("broken_ring.xml", &broken);
    let output = collc(&["import", file.path()]);
    let (stdout, stderr) = out(&output);
    assert_eq!(output.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("does not verify in-place"), "{stdout}");
    assert!(stderr.contains("collc::verify"), "{stderr}");
    assert!(stderr.contains("broken_ring.xml:"), "the diagnostic points into the file: {stderr}");
    assert!(stderr.contains("thread block 0") && stderr.contains("step "), "{stderr}");
    // Rank 2's first reduction made a plain forward: the counterexample says what the chunk holds.
    let at = text.find(r#"<gpu id="2""#).unwrap();
    let dropped = format!("{}{}", &text[..at], text[at..].replacen(r#"type="rrs""#, r#"type="rcs""#, 1));
    let dropped_file = TempFile::with("dropped_ring.xml", &dropped);
    let (_, stderr) = out(&collc(&["import", dropped_file.path()]));
    assert!(stderr.contains("collc::verify::postcondition"), "{stderr}");
    assert!(stderr.contains("got:      x[0][1] + x[1][1] + x[3][1]; missing x[2][1]"), "{stderr}");
    assert!(stderr.contains("thread block 0 (send 1, recv 3, channel 0), step 3"), "{stderr}");
    // `check` says the same, with exit status 1.
    assert_eq!(collc(&["check", file.path()]).status.code(), Some(1));
    // A file that is not there is a usage error.
    assert_eq!(collc(&["import", "no/such/file.xml"]).status.code(), Some(2));
}

#[test]
fn an_xml_file_converts_runs_and_is_costed() {
    let xml = corpus("mscclang/allreduce_ring_8gpu_2inst.xml");
    let sched = TempFile::named("ring_2inst.sched");
    let output = collc(&["import", &xml, "--emit", "sched", "--output", sched.path()]);
    assert_eq!(output.status.code(), Some(0), "{:?}", out(&output));
    let output = collc(&["check", sched.path()]);
    assert_eq!(output.status.code(), Some(0), "{:?}", out(&output));
    let output = collc(&["run", &xml, "-b", "1K", "-e", "8K", "-f", "8", "-n", "2", "-w", "1"]);
    let (stdout, stderr) = out(&output);
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    let rows: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    assert!(rows.iter().all(|row| row.split_whitespace().nth(12) == Some("0")), "no wrong values: {stdout}");
    let output = collc(&["cost", &xml, "--sizes", "1K..1M"]);
    assert_eq!(output.status.code(), Some(0), "{:?}", out(&output));
    assert!(out(&output).0.contains("8 ranks"), "{:?}", out(&output));
}

#[test]
fn exports_read_back_and_limits_name_the_coll_line() {
    let xml = TempFile::named("ring8_legacy.xml");
    let args = ["build", "allreduce/ring", "--ranks", "8", "--emit", "msccl-xml", "--target", "msccl-legacy"];
    let output = collc(&[&args[..], &["--output", xml.path()]].concat());
    assert_eq!(output.status.code(), Some(0), "{:?}", out(&output));
    let written = std::fs::read_to_string(xml.path()).unwrap();
    assert!(written.starts_with("<algo name=\"ring\"") && !written.contains("outofplace"), "{written}");
    let output = collc(&["check", xml.path()]);
    assert_eq!(output.status.code(), Some(0), "{:?}", out(&output));

    let output =
        collc(&["build", "allreduce/ring", "--ranks", "64", "--emit", "msccl-xml", "--target", "msccl-executor"]);
    let (stdout, stderr) = out(&output);
    assert_eq!(output.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.is_empty(), "nothing is written past a limit");
    assert!(stderr.contains("MSCCL_MAX_NUM_STEPS") && stderr.contains("allreduce/ring.coll:11"), "{stderr}");

    let output = collc(&["build", "allgather/ring", "--ranks", "4", "--emit", "mscclpp-json"]);
    let (stdout, stderr) = out(&output);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stdout.contains("\"collective\": \"allgather\"") && stdout.contains("\"name\": \"put\""), "{stdout}");
}
