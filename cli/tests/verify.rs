//! What `collc check` promises about verification itself: every root of a rooted collective is checked, the mode
//! that verified is named (and a fall-back from exact to keyed in a note), a keyed verification prints its seed and
//! replays with `--seed`, an exact one draws its roots above 64 ranks from a fresh seed it prints, and schedule
//! files run and are costed as they stand.

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
    // With --exact the seed only draws roots: allreduce has none, and the check is exact.
    let seeded = text(&collc(&["check", "allreduce/ring", "--ranks", "4", "--seed", "1", "--exact"]).stdout);
    assert!(seeded.contains("verified exactly"), "{seeded}");
}

/// The roots above 64 ranks in an exact check come from a fresh seed (no fixed sample a program could be fitted to),
/// which is printed without -v and replays with `--exact --seed`.
#[test]
fn an_exact_check_draws_its_roots_from_a_fresh_seed_that_it_prints() {
    let file = repo("tests/fixtures/roots/broadcast_from_rank_zero.coll");
    let file = file.to_str().expect("utf-8 path");
    let roots_of = |args: &[&str]| {
        let out = collc(&[&["check", file, "--ranks", "100", "--exact", "--format", "json"], args].concat());
        assert_eq!(out.status.code(), Some(1), "root 0 verifies, the others fail");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let mut roots: Vec<u64> =
            json["results"].as_array().expect("results").iter().filter_map(|r| r["root"].as_u64()).collect();
        roots.dedup();
        (json["seed"].as_str().expect("the seed is printed").to_string(), roots)
    };
    let (seed, roots) = roots_of(&[]);
    let (other_seed, _) = roots_of(&[]);
    assert_ne!(seed, other_seed, "each invocation draws a fresh seed");
    assert!(roots.len() > 4 && roots.starts_with(&[0, 1]), "{roots:?}");
    assert_eq!(roots_of(&["--seed", &seed]), (seed.clone(), roots), "--seed replays the roots");
    let table = text(&collc(&["check", file, "--ranks", "100", "--exact", "-q"]).stdout);
    let line = table.lines().next().unwrap_or_default();
    assert!(line.starts_with("# exact verification (--exact); seed ") && line.contains("--exact --seed "), "{table}");
}

/// Rank 0 piles every input chunk of every rank into one scratch chunk and adds it to itself thousands of times:
/// right, but past the exact check's budget of contribution terms at 64 ranks.
const OVER_THE_EXACT_BUDGET: &str = "algorithm heavy for reducescatter {
    ranks p where p == 64
    chunks 1
    scratch pile[2]
    scratch got[p]
    step { for r in 0..p { copy in[0] to pile[0] on r } }
    for c in 1..p { step { for r in 0..p { reduce in[c] into pile[0] on r } } }
    step { for r in 1..p { send pile[0] from r to 0 as got[r] } }
    for r in 1..p { reduce got[r] into pile[0] on 0 }
    for i in 0..4200 {
        reduce pile[0] into pile[1] on 0
        reduce pile[1] into pile[0] on 0
    }
    step { for r in 0..p { for q in 0..p { if q != r { send in[r] from q to r as got[q] } } } }
    for s in 1..p { step { for r in 0..p { reduce got[(r + s) % p] into in[r] on r } } }
}
";

/// At 64 ranks the default is exact; when the exact run outgrows its budget the check falls back to keyed, and a
/// note says so (even with -q), not only the verdict's wording.
#[test]
fn a_fall_back_from_exact_to_keyed_is_said_in_a_note() {
    let file = TempFile::with("heavy.coll", OVER_THE_EXACT_BUDGET);
    let out = collc(&["check", file.path(), "--ranks", "64", "-q"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("verified, error bound 2^-105"), "{stdout}");
    let note = stdout.lines().find(|l| l.starts_with("note: ")).unwrap_or_else(|| panic!("no note:\n{stdout}"));
    assert!(note.contains("p=64: exact verification outgrew its budget") && note.contains("keyed"), "{note}");
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
