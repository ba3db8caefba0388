//! The `collc` binary as a user runs it: exit codes 0 / 1 / 2, and what each subcommand prints.

mod common;

use common::TempFile;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn collc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_collc")).args(args).env("NO_COLOR", "1").output().expect("collc runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

#[test]
fn check_of_a_library_algorithm_succeeds() {
    let out = collc(&["check", "allreduce/ring", "--ranks", "2..=8", "-q"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("7 rank counts verified in both placements"), "{}", text(&out.stdout));
}

/// A broadcast that always sends from rank 0: right for root 0 only.
const BAD_PEER: &str = "algorithm from_zero for broadcast {
    ranks p where p >= 2
    root r
    for q in 1..p {
        send in[0] from 0 to q
    }
}
";

/// Each line states the verdict of every root and placement it covers: a rank count where some root failed is
/// never called verified on its line, even with stderr (where the diagnostics go) thrown away.
#[test]
fn a_check_line_states_the_verdict_of_every_root_and_placement() {
    let file = TempFile::with("bad_peer.coll", BAD_PEER);
    let out = collc(&["check", file.path(), "--ranks", "3"]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    let line = stdout.lines().find(|l| l.contains(" p=3: ")).unwrap_or_else(|| panic!("no line for p=3:\n{stdout}"));
    assert!(line.contains("3 roots: "), "{line}");
    assert!(
        line.contains("; verified exactly at root=0 (both placements); FAILED at root=1, root=2 (both placements)"),
        "{line}"
    );
    assert!(!line.ends_with("verified exactly"), "{line}");
    assert!(stdout.contains("1 failed") && stdout.contains("(the 2 schedules that verified)"), "{stdout}");
    // Every root failing: the line says FAILED and nothing verified.
    let none = text(&collc(&["check", file.path(), "--ranks", "3", "--root", "1,2"]).stdout);
    let line = none.lines().find(|l| l.contains(" p=3: ")).unwrap_or_default();
    assert_eq!(line.split(" p=3: ").nth(1), Some("2 roots: FAILED at root=1, root=2 (both placements)"), "{none}");
}

/// A reducing collective's lines and summary say whether replicas agree bitwise and results are chunk-independent;
/// others' do not.
#[test]
fn check_reports_whether_replicas_agree_and_results_are_chunk_independent() {
    let out = collc(&["check", "allreduce/one_shot", "--ranks", "2,3"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let line = |p: &str| stdout.lines().find(|l| l.contains(&format!(" p={p}: "))).unwrap_or_default();
    assert!(line("2").ends_with("; replicas agree: yes, chunk-independent: yes"), "{stdout}");
    assert!(line("3").ends_with("; replicas agree: no, chunk-independent: yes"), "{stdout}");
    assert!(stdout.contains("replicas agree: no (first at p=3), chunk-independent: yes"), "{stdout}");
    let ring = text(&collc(&["check", "allreduce/ring", "--ranks", "4", "--format", "json"]).stdout);
    let json: serde_json::Value = serde_json::from_str(&ring).expect("JSON");
    assert_eq!(json["results"][0]["replicas"], serde_json::json!({"agree": true, "chunk_independent": false}));
    assert_eq!(json["summary"]["replicas"]["first_chunk_dependence_ranks"], 4);
    let copies = text(&collc(&["check", "allgather/ring", "--ranks", "4"]).stdout);
    assert!(!copies.contains("replicas"), "{copies}");
}

/// `collc list` marks each algorithm's determinism at p = 2..=8; `--deterministic` (and `deterministic` in an
/// algorithm filter) admits only those whose replicas agree, `=strict` only those also chunk-independent.
#[test]
fn determinism_is_listed_and_required_by_run_and_the_algorithm_filter() {
    let list = text(&collc(&["list"]).stdout);
    let level = |name: &str| {
        let row = list.lines().find(|l| l.split_whitespace().nth(1) == Some(name)).unwrap_or_default();
        row.split_whitespace().nth(2).unwrap_or_default().to_string()
    };
    assert_eq!(level("allreduce/one_shot"), "none", "{list}");
    assert_eq!(level("allreduce/ring"), "replicas", "{list}");
    assert_eq!(level("allreduce/recursive_doubling"), "strict", "{list}");
    assert_eq!(level("allgather/ring"), "strict", "{list}");
    assert!(list.contains("# DETERMINISM at p = 2..=8"), "{list}");
    let json: serde_json::Value = serde_json::from_slice(&collc(&["list", "--format", "json"]).stdout).expect("JSON");
    let ring = json.as_array().and_then(|a| a.iter().find(|e| e["name"] == "allreduce/ring")).expect("listed");
    assert_eq!(
        (&ring["replicas_agree"], &ring["chunk_independent"]),
        (&serde_json::json!(true), &serde_json::json!(false))
    );
    let refused = collc(&["run", "allreduce/one_shot", "--ranks", "4", "-e", "64", "--deterministic"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("not deterministic (replicas) at 4 ranks: ranks 0 and 1"),
        "{}",
        text(&refused.stderr)
    );
    let ran = collc(&["run", "allreduce/ring", "--ranks", "4", "-e", "64", "-n", "1", "-w", "0", "--deterministic"]);
    assert_eq!(ran.status.code(), Some(0), "{}", text(&ran.stderr));
    let strict = collc(&["run", "allreduce/ring", "--ranks", "4", "-e", "64", "--deterministic=strict"]);
    assert_eq!(strict.status.code(), Some(1), "{}", text(&strict.stderr));
    let tune = collc(&[
        "tune",
        "allreduce",
        "--ranks",
        "4",
        "--sizes",
        "8..64",
        "--algo",
        "ring,one_shot,naive;deterministic",
    ]);
    let stdout = text(&tune.stdout);
    assert_eq!(tune.status.code(), Some(0), "{stdout}{}", text(&tune.stderr));
    assert!(
        stdout.contains("candidates ring, naive") && stdout.contains("not admitted: one_shot (not deterministic"),
        "{stdout}"
    );
}

#[test]
fn list_shows_every_library_algorithm_with_its_cost() {
    let out = collc(&["list"]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = text(&out.stdout);
    for name in ["allreduce/ring", "allreduce/naive", "broadcast/binomial", "alltoall/pairwise", "sendrecv/direct"] {
        assert!(stdout.contains(name), "{name} missing from:\n{stdout}");
    }
    assert!(stdout.contains("2(p-1)a + 2(p-1)/p n b + (p-1)/p n g"), "{stdout}");
    // A formula with its cases for other p is cut in the table, at a word, and whole in the JSON.
    let halving = stdout.lines().find(|l| l.contains("reducescatter/recursive_halving")).expect("listed");
    assert!(halving.contains("log2(p) a + (p-1)/p n b + (p-1)/p n g (p a power of two; ..."), "{halving}");
    assert!(stdout.lines().all(|l| !l.contains("to deliver)")), "{stdout}");
    let json: serde_json::Value = serde_json::from_slice(&collc(&["list", "--format", "json"]).stdout).expect("JSON");
    let entry = json.as_array().expect("a list").iter().find(|e| e["name"] == "reducescatter/recursive_halving");
    let cost = entry.and_then(|e| e["cost"].as_str()).expect("its cost");
    assert!(cost.ends_with("plus a + n b + n g to fold and a + n/p b to deliver)"), "{cost}");
}

#[test]
fn build_emits_json_with_one_entry_per_rank() {
    let out = collc(&["build", "broadcast/binomial", "--ranks", "5", "--root", "2", "--emit", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(json["ranks"].as_array().map(Vec::len), Some(5));
    assert_eq!(json["root"], 2);
}

#[test]
fn a_broken_program_exits_1_with_a_located_diagnostic() {
    let file =
        TempFile::with("broken.coll", "algorithm a for allreduce {\n    ranks p\n    send in[0] from 0 to p\n}\n");
    let out = collc(&["build", file.path(), "--ranks", "4"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("collc::lower::bounds") && stderr.contains(":3:"), "{stderr}");
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(collc(&["build", "allreduce/ring", "--ranks", "4", "--bogus"]).status.code(), Some(2));
    assert_eq!(collc(&["check", "allreduce/nonesuch"]).status.code(), Some(2));
    assert_eq!(collc(&["check", "allreduce/ring", "--ranks", "8..2"]).status.code(), Some(2));
    assert_eq!(collc(&["check", "allreduce/ring", "--channel-slots", "0"]).status.code(), Some(2));
    // A rank count outside 1..=--max-ranks is a usage error for every command, as run's is.
    for command in ["check", "build"] {
        let out = collc(&[command, "allreduce/ring", "--ranks", "0"]);
        assert_eq!(out.status.code(), Some(2), "{command}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains("choose at least one rank"), "{}", text(&out.stderr));
    }
    let many = collc(&["check", "allreduce/ring", "--ranks", "100000"]);
    assert_eq!(many.status.code(), Some(2));
    assert!(text(&many.stderr).contains("raise --max-ranks"), "{}", text(&many.stderr));
    let misspelt = collc(&["check", "allreduce/rign"]);
    assert!(text(&misspelt.stderr).contains("did you mean: allreduce/ring"), "{}", text(&misspelt.stderr));
}

#[test]
fn a_schedule_round_trips_through_a_file_and_verifies() {
    let file = TempFile::named("ring.sched");
    let path = file.path();
    let built = collc(&["build", "allreduce/ring", "--ranks", "5", "--output", path]);
    assert_eq!(built.status.code(), Some(0), "{}", text(&built.stderr));
    let checked = collc(&["check", path]);
    assert_eq!(checked.status.code(), Some(0), "{}", text(&checked.stderr));
    assert!(text(&checked.stdout).contains("verified exactly (5 ranks, out-of-place"), "{}", text(&checked.stdout));
}

#[test]
fn a_deadlocking_schedule_is_rejected_with_its_cycle() {
    let out = collc(&["check", repo("tests/fixtures/sched/deadlock.sched").to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("collc::verify::deadlock") && stderr.contains("wait-for cycle"), "{stderr}");
}

/// A hierarchical allreduce whose node reduction skips the last local rank: right only with one rank per node.
const SKIPS_A_LOCAL_RANK: &str = "algorithm leaders for allreduce {
    ranks p
    nodes n local g
    for i in 0..n {
        for l in 1..g-1 {
            send in[0] from i*g + l to i*g reduce
        }
    }
    for i in 1..n {
        send in[0] from i*g to 0 reduce
    }
    for i in 1..n {
        send in[0] from 0 to i*g
    }
    for i in 0..n {
        for l in 1..g {
            send in[0] from i*g to i*g + l
        }
    }
}
";

#[test]
fn check_names_the_failing_node_split_and_prints_a_repeated_failure_once() {
    let file = TempFile::with("leaders.coll", SKIPS_A_LOCAL_RANK);
    let out = collc(&["check", file.path(), "--ranks", "2..=4", "-q"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    // One rank per node (g=1) verifies; every other split fails, named by its split.
    assert!(!stderr.contains("g=1 "), "{stderr}");
    assert!(stderr.contains("p=2 n=1 g=2 out-of-place: FAILED\n"), "{stderr}");
    assert!(stderr.contains("p=4 n=2 g=2 in-place: FAILED"), "{stderr}");
    assert!(stderr.contains("the same codes at the same lines as at p=2 n=1 g=2 out-of-place"), "{stderr}");
    assert!(text(&out.stdout).contains("0 rank counts verified in both placements, 0 not admitted, 3 failed"));
    let every = text(&collc(&["check", file.path(), "--ranks", "2..=4", "-q", "--all-errors"]).stderr);
    let diagnostics = |s: &str| s.matches("collc::verify::postcondition").count();
    assert!(diagnostics(&every) > diagnostics(&stderr), "{every}");
    assert!(!every.contains("the same codes"), "{every}");
}

/// One contract for every subcommand (`collc --help` says it): 0 success, 1 compile or verification errors, 2 usage
/// errors; signals (128+N) are `run`'s tests'.
#[test]
fn every_subcommand_keeps_one_exit_status_contract() {
    let cases: &[(&[&str], i32, &str)] = &[
        (&["list", "--format", "json"], 0, ""),
        (&["build", "allreduce/ring", "--ranks", "3"], 0, ""),
        (&["cost", "allreduce/ring", "--ranks", "3", "--sizes", "8..64"], 0, ""),
        (&["tune", "allreduce", "--ranks", "3", "--sizes", "8..64"], 0, ""),
        (&["build", "allreduce/naive", "--ranks", "3", "--set", "nosuch=1"], 1, "nosuch"),
        (&["cost", "allreduce/ring", "--ranks", "0"], 2, "--ranks 0"),
        (&["tune", "allreduce", "--ranks", "0"], 2, "--ranks 0"),
        (&["run", "allreduce/ring", "--ranks", "0"], 2, "--ranks 0"),
        (&["tune", "allreduc"], 2, "did you mean: allreduce"),
        (&["run", "allreduce", "--algo", "rng,tree"], 2, "did you mean: ring"),
        (&["tune", "allreduce", "--algo", "allreduce:ring,tre"], 2, "did you mean: tree"),
        // `-o` is nccl-tests' `--op` in `collc run`, so no other subcommand gives it another meaning.
        (&["build", "allreduce/ring", "--ranks", "3", "-o", "ring.sched"], 2, "unexpected argument '-o'"),
        (&["cost", "--calibrate", "-o", "here.json"], 2, "unexpected argument '-o'"),
    ];
    for &(args, code, says) in cases {
        let out = collc(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    for command in ["list", "build", "check", "run", "cost", "tune"] {
        let help = text(&collc(&[command, "--help"]).stdout);
        assert!(help.contains("Exit status: 0 success; 1 a compile") && help.contains("143 on SIGTERM"), "{help}");
    }
}

/// `-o premulsum:S` on threads and on shm processes with the data check: an exact factor over every data type at one
/// and four ranks (bit for bit), and an inexact one (0.1, whose products round, so the sum depends on the order the
/// algorithm adds them in: compared within the rounding of the additions).
#[test]
fn premulsum_runs_with_the_data_check() {
    for (transport, ranks, dtype, op) in [
        ("threads", "4", "all", "premulsum:3"),
        ("threads", "1", "all", "premulsum:3"),
        ("shm", "3", "all", "premulsum:2"),
        ("threads", "4", "float", "premulsum:0.1"),
        ("shm", "2", "bfloat16", "mulsum:0.1"),
    ] {
        let args = ["run", "allreduce", "--ranks", ranks, "--transport", transport, "-d", dtype, "-o", op];
        let out = collc(&[&args[..], &["-b", "8", "-e", "256K", "-f", "16", "-n", "2", "-w", "1", "-c", "1"]].concat());
        let said = text(&out.stdout);
        assert!(out.status.success() && said.contains("# Out of bounds values : 0 OK"), "{args:?}: {said}");
        assert!(said.contains("redop mulsum: premulsum:") && said.contains(" mulsum "), "{args:?}: {said}");
        // Over shm the ranks read each other's buffers, which come from their arenas, in place.
        let protocol = "single copy where a send's source stays in a buffer from the arena";
        assert_eq!(said.contains(protocol), transport == "shm", "{args:?}: {said}");
    }
}

/// A user's operator from an `--ops` file or the algorithm's own file: `absmax` runs on every algorithm with the data
/// check over every data type (threads and shm processes, which each compile it); `horner` (`a * 2 + b`) makes
/// `collc run allreduce` choose among the algorithms that reduce in rank order and name the others, and a named
/// algorithm that reorders fails on every rank with the reason. An operator that does not type on a data type of the
/// run, an unknown one and a file that does not compile are refused before any rank starts.
#[test]
fn users_operators_run_with_the_data_check() {
    let ops = TempFile::with(
        "ops.coll",
        "op absmax(a, b) = max(abs(a), abs(b))\nop horner(a, b) = a * 2 + b\nop mean(a, b) = (a + b) * 0.5\n",
    );
    let sweep = ["-b", "8", "-e", "64K", "-f", "32", "-n", "2", "-w", "1", "-c", "1"];
    for (algorithm, transport, ranks, dtype, op) in [
        ("allreduce/ring", "threads", "3", "all", "absmax"),
        ("reducescatter/ring", "shm", "2", "all", "absmax"),
        ("allreduce", "threads", "4", "bfloat16", "horner"),
        ("allreduce/naive", "shm", "3", "int8", "horner"),
    ] {
        let args =
            ["run", algorithm, "--ops", ops.path(), "--ranks", ranks, "--transport", transport, "-d", dtype, "-o", op];
        let out = collc(&[&args[..], &sweep].concat());
        let said = text(&out.stdout);
        assert!(
            out.status.success() && said.contains("# Out of bounds values : 0 OK"),
            "{args:?}: {said}{}",
            text(&out.stderr)
        );
        assert!(said.contains(&format!(" {op} ")), "{args:?}: {said}");
        if op == "absmax" {
            let header = "redop absmax: a user's operator, absmax = max(abs(a), abs(b)), compiled with cranelift: \
                          int8 vectors of 16, uint8 vectors of 16";
            assert!(said.contains(header) && said.contains("half vectors of 4"), "{said}");
        }
        if algorithm == "allreduce" {
            assert!(said.contains("allreduce/naive (predicted fastest)"), "{said}");
            assert!(said.contains("not a candidate: allreduce/ring (`horner` is not commutative"), "{said}");
        }
    }
    let ring =
        collc(&[&["run", "allreduce/ring", "--ops", ops.path(), "--ranks", "3", "-o", "horner"][..], &sweep].concat());
    let said = text(&ring.stderr);
    assert_eq!(ring.status.code(), Some(1), "{said}");
    for rank in 0..3 {
        assert!(said.contains(&format!("rank {rank}: `horner` is not commutative on float")), "{said}");
    }
    assert!(said.contains("allreduce/ring reduces output chunk") && said.contains("(allreduce/naive)"), "{said}");
    let own = TempFile::with(
        "own.coll",
        "op clip(a, b) = min(a + b, 100)\nalgorithm own for allreduce {\n    ranks p\n    for r in 1..p { send in[0] from r to 0 reduce }\n    for r in 1..p { send in[0] from 0 to r }\n}\n",
    );
    let out = collc(&[&["run", own.path(), "--ranks", "3", "-o", "clip", "-d", "int32"][..], &sweep].concat());
    assert!(out.status.success() && text(&out.stdout).contains(" clip "), "{}", text(&out.stderr));
    let bad = TempFile::with("bad.coll", "op shift(a, b) = a << b\n");
    for (args, code, says) in [
        (vec!["-o", "mean", "-d", "all"], 2, "-o mean: it does not type on int8: a fraction where elem (int8) is expected; give -d one of the types it takes (half, float, double, bfloat16)"),
        (vec!["-o", "nosuch"], 2, "unknown reduce op `nosuch`"),
        (vec!["--ops", bad.path(), "-o", "shift"], 1, "`<<` is not part of an operator"),
        (vec!["--ops", "/nonexistent/ops.coll"], 2, "--ops /nonexistent/ops.coll: cannot read it"),
    ] {
        let out = collc(&[&["run", "allreduce/ring", "--ops", ops.path()][..], &args].concat());
        let said = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {said}");
        assert!(said.contains(says), "{args:?}: {said}");
    }
}

/// `collc check` reports the reduction operators a file defines before its algorithm: the types each takes, whether
/// it may be reordered (with a counterexample when not), and an operator that does not lower as a diagnostic at its
/// span, failing the check.
#[test]
fn check_reports_the_operators_a_file_defines() {
    let algorithm = "algorithm a for allreduce {\n    ranks p\n    for r in 1..p { send in[0] from r to 0 reduce }\n    for r in 1..p { send in[0] from 0 to r }\n}\n";
    let good = TempFile::with(
        "ops.coll",
        &format!("op absmax(a, b) = max(abs(a), abs(b))\nop mean(a, b) = (a + b) * 0.5\n{algorithm}"),
    );
    let out = collc(&["check", good.path(), "--ranks", "2"]);
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("op absmax: types on int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16; commutative and associative"), "{said}");
    assert!(said.contains("op mean: types on half, float, double, bfloat16 (not int8"), "{said}");
    assert!(
        said.contains("`mean` is not associative on half: mean(mean(0, 0), 1) = 0.5 but mean(0, mean(0, 1)) = 0.25"),
        "{said}"
    );
    let bad = TempFile::with("bad.coll", &format!("op shift(a, b) = a << b\n{algorithm}"));
    let out = collc(&["check", bad.path(), "--ranks", "2"]);
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stderr);
    assert!(said.contains("collc::op::expr") && said.contains("`<<` is not part of an operator"), "{said}");
}

#[test]
fn usage_errors_say_what_and_where() {
    let dtype = collc(&["run", "allreduce/ring", "-d", "flaot"]);
    assert_eq!(dtype.status.code(), Some(2));
    assert!(text(&dtype.stderr).contains("did you mean: float"), "{}", text(&dtype.stderr));
    let op = collc(&["run", "allreduce/ring", "-o", "smu"]);
    assert!(text(&op.stderr).contains("did you mean: sum"), "{}", text(&op.stderr));
    // PreMulSum: its factor is required, and must fit every data type of the run before any rank starts.
    for (args, says) in [
        (&["-o", "premulsum"][..], "premulsum needs its factor after a colon, e.g. premulsum:0.5"),
        (&["-o", "premulsum:x"], "`x` is not a number"),
        (&["-o", "premulsum:0.5", "-d", "all"], "0.5 is not a whole number: int8 multiplies by integers; give a whole"),
        (&["-o", "premulsum:300", "-d", "uint8"], "premulsum's factor 300 is outside uint8's range"),
        (&["-o", "premulsum:1e6", "-d", "half"], "beyond the largest finite half; give a smaller factor"),
    ] {
        let out = collc(&[&["run", "allreduce/ring", "-n", "2"][..], args].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(text(&out.stderr).contains(says), "{args:?}: {}", text(&out.stderr));
    }
    let other = collc(&["run", "allreduce", "--ranks", "2", "--algo", "broadcast:chain"]);
    assert_eq!(other.status.code(), Some(2));
    assert!(text(&other.stderr).contains("names no allreduce algorithm"), "{}", text(&other.stderr));
    let empty = TempFile::with("empty.coll", "");
    let out = collc(&["check", empty.path()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains(&format!("collc::syntax in {}", empty.path())), "{}", text(&out.stderr));
    let gated = TempFile::with(
        "gated.coll",
        "algorithm a for allreduce {\n    ranks p\n    param k = 1\n    where k == 1\n    for r in 1..p { send in[0] from r to 0 reduce }\n    for r in 1..p { send in[0] from 0 to r }\n}\n",
    );
    let blamed = text(&collc(&["check", gated.path(), "--ranks", "2", "--set", "k=2"]).stdout);
    assert!(blamed.contains("--ranks 2 with --set k=2 does not satisfy"), "{blamed}");
}
