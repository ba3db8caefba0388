//! What `collc check` promises about verification itself: every root of a rooted collective is checked, the mode
//! that verified is named, a keyed verification prints its seed and replays with `--seed`, and schedule files run
//! and are costed as they stand.

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

/// `tests/fixtures/roots/*.coll`: programs right for some roots only. Each header says the rank counts and the
/// flags (`right-with=--root=0,--peer=1`) under which it is right; with default flags `collc check` must fail and
/// name a root in the failure, and with those flags verify.
#[test]
fn root_dependent_programs_fail_with_default_flags_and_name_the_root() {
    let dir = repo("tests/fixtures/roots");
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(&dir).expect("fixtures/roots").flatten().map(|e| e.path()).collect();
    files.retain(|p| p.extension().is_some_and(|e| e == "coll"));
    files.sort();
    assert!(files.len() >= 4, "{files:?}");
    for path in &files {
        let source = std::fs::read_to_string(path).expect("readable");
        let header = source.lines().find_map(|l| l.strip_prefix("# test: ")).expect("a `# test:` header");
        let field = |key: &str| header.split_whitespace().find_map(|w| w.strip_prefix(key)).expect(key);
        let ranks = field("ranks=");
        let right: Vec<String> = field("right-with=")
            .split(',')
            .flat_map(|f| f.split('=').map(str::to_string).collect::<Vec<_>>())
            .collect();
        let file = path.to_str().expect("utf-8 path");
        let failed = collc(&["check", file, "--ranks", ranks, "-q"]);
        let stderr = text(&failed.stderr);
        assert_eq!(failed.status.code(), Some(1), "{file} must fail with default flags:\n{}", text(&failed.stdout));
        assert!(stderr.contains(" root=") && stderr.contains("with root "), "{file}: the root is not named:\n{stderr}");
        let mut args = vec!["check", file, "--ranks", ranks, "-q"];
        args.extend(right.iter().map(String::as_str));
        let passed = collc(&args);
        assert_eq!(passed.status.code(), Some(0), "{file} {right:?}:\n{}", text(&passed.stderr));
    }
}

#[test]
fn roots_are_chosen_with_root_all_or_a_list_and_spread_at_large_rank_counts() {
    let file = repo("tests/fixtures/roots/broadcast_from_rank_zero.coll");
    let file = file.to_str().expect("utf-8 path");
    let listed = collc(&["check", file, "--ranks", "6", "--root", "0,3", "--format", "json"]);
    assert_eq!(listed.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("JSON");
    let outcome = |root: u64| {
        let results = json["results"].as_array().expect("results");
        let of_root: Vec<_> = results.iter().filter(|r| r["root"] == root).collect();
        assert_eq!(of_root.len(), 2, "both placements of root {root}");
        of_root.iter().map(|r| r["outcome"].as_str().expect("an outcome").to_string()).collect::<Vec<_>>()
    };
    assert_eq!(outcome(0), ["verified", "verified"]);
    assert_eq!(outcome(3), ["failed", "failed"]);
    let all = text(&collc(&["check", "broadcast/binomial", "--ranks", "5", "--root", "all"]).stdout);
    assert!(all.contains("p=5: 5 roots: "), "{all}");
    // Above 64 ranks: 0, 1, p/2, p-1 and four drawn from the seed, so root 1 is among them.
    let spread = collc(&["check", file, "--ranks", "100", "-q"]);
    assert_eq!(spread.status.code(), Some(1));
    assert!(text(&spread.stderr).contains("p=100 root=1 "), "{}", text(&spread.stderr));
    assert_eq!(collc(&["check", file, "--root", "x"]).status.code(), Some(2));
    // A collective without a root still binds a listed --root (which must be a rank), each one named.
    let unrooted = collc(&["check", "allreduce/ring", "--ranks", "4", "--root", "0,3", "--format", "json"]);
    let json: serde_json::Value = serde_json::from_slice(&unrooted.stdout).expect("JSON");
    let bindings: Vec<&str> =
        json["results"].as_array().expect("results").iter().filter_map(|r| r["binding"].as_str()).collect();
    assert_eq!(bindings, ["root=0", "root=0", "root=3", "root=3"]);
}

#[test]
fn the_mode_that_verified_is_named_and_a_keyed_seed_replays() {
    let small = text(&collc(&["check", "allreduce/ring", "--ranks", "8"]).stdout);
    assert!(small.contains("verified exactly"), "{small}");
    let large = collc(&["check", "allreduce/ring", "--ranks", "65", "-v"]);
    let stdout = text(&large.stdout);
    assert!(stdout.contains("verified, error bound 2^-105"), "{stdout}");
    let seed = stdout.lines().find_map(|l| l.strip_prefix("# seed ")).and_then(|l| l.split_whitespace().next());
    let seed = seed.expect("-v prints the seed");
    assert_eq!(seed.len(), 32, "{seed}");
    let replayed = collc(&["check", "allreduce/ring", "--ranks", "65", "--seed", seed, "--format", "json"]);
    let json: serde_json::Value = serde_json::from_slice(&replayed.stdout).expect("JSON");
    assert_eq!(json["seed"], seed);
    assert_eq!(json["results"][0]["verdict"]["seed"], seed);
    assert_eq!(json["results"][0]["verdict"]["error_bound_log2"], -105);
    let exact = text(&collc(&["check", "allreduce/ring", "--ranks", "65", "--exact"]).stdout);
    assert!(exact.contains("verified exactly") && !exact.contains("error bound"), "{exact}");
    assert_eq!(collc(&["check", "allreduce/ring", "--seed", "nothex"]).status.code(), Some(2));
    assert_eq!(collc(&["check", "allreduce/ring", "--seed", "1", "--exact"]).status.code(), Some(2));
}

#[test]
fn a_schedule_file_runs_and_is_costed_as_it_stands() {
    let file = TempFile::named("bcast.sched");
    let built =
        collc(&["build", "broadcast/binomial", "--ranks", "3", "--root", "2", "--in-place", "--output", file.path()]);
    assert_eq!(built.status.code(), Some(0), "{}", text(&built.stderr));
    let run = collc(&["run", file.path(), "-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-w", "1", "-c", "1"]);
    let stdout = text(&run.stdout);
    assert_eq!(run.status.code(), Some(0), "{stdout}{}", text(&run.stderr));
    assert!(stdout.contains("3 ranks") && stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
    // In place only: the out-of-place columns are N/A, the root is the file's.
    let row = stdout.lines().find(|l| l.trim_start().starts_with("4096")).expect("a 4 KiB row");
    assert!(row.contains("N/A") && row.split_whitespace().nth(4) == Some("2"), "{row}");
    assert_eq!(collc(&["run", file.path(), "-r", "1"]).status.code(), Some(2), "another root is a usage error");
    assert_eq!(collc(&["run", file.path(), "--ranks", "4"]).status.code(), Some(2));
    let cost = collc(&["cost", file.path(), "--sizes", "8..1K"]);
    assert_eq!(cost.status.code(), Some(0), "{}", text(&cost.stderr));
    assert!(text(&cost.stdout).contains("3 ranks"), "{}", text(&cost.stdout));
}

#[test]
fn a_schedule_file_that_deadlocks_is_located_by_line_and_column_in_check_and_run() {
    let fixture = repo("tests/fixtures/sched/deadlock.sched");
    // A schedule is known by its first line too, whatever the file is called.
    let renamed = TempFile::with("deadlock.txt", &std::fs::read_to_string(&fixture).expect("readable"));
    for (file, name) in [(fixture.to_str().expect("utf-8 path"), "deadlock.sched"), (renamed.path(), "deadlock.txt")] {
        for args in [vec!["check", file], vec!["run", file, "-e", "8"], vec!["cost", file]] {
            let out = collc(&args);
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
            assert!(stderr.contains("rank 0 #0 Recv (line 11:3) waits in a cycle"), "{args:?}: {stderr}");
            assert!(stderr.contains(&format!("{name}:11:3")), "{args:?}: {stderr}");
        }
    }
}
