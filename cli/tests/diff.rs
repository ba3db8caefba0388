//! `collc diff`: two schedules compared per rank, from algorithms, `.sched` files and `REV:PATH` at git revisions;
//! exit 0 when equal, 1 when they differ, 2 on usage errors.

mod common;

use common::{TempDir, TempFile};
use std::path::Path;
use std::process::{Command, Output};

fn collc_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_collc"))
        .args(args)
        .current_dir(dir)
        .env_remove("COLLC_ALGO_PATH")
        .env("NO_COLOR", "1")
        .output()
        .expect("collc runs")
}

fn collc(args: &[&str]) -> Output {
    collc_in(Path::new(env!("CARGO_MANIFEST_DIR")), args)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The library's ring allreduce, as its file holds it.
fn ring() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../algorithms/allreduce/ring.coll");
    std::fs::read_to_string(path).expect("the library's ring")
}

/// The ring with its all-gather sends on channel 1: one transfer statement changed, and still correct.
fn ring_on_two_channels() -> String {
    let source = ring();
    let changed = source.replace(
        "send in[(r + 1 - s) % p] from r to (r + 1) % p\n",
        "send in[(r + 1 - s) % p] from r to (r + 1) % p channel 1\n",
    );
    assert_ne!(changed, source, "the all-gather's send is in the ring's file");
    changed
}

#[test]
fn an_algorithm_equals_itself_in_every_form() {
    let copy = TempFile::with("diff-ring.coll", &ring());
    let output = collc(&["diff", "allreduce/ring", copy.path(), "--ranks", "4"]);
    assert_eq!(output.status.code(), Some(0), "{}{}", stdout(&output), stderr(&output));
    let text = stdout(&output);
    assert!(text.starts_with("--- a: allreduce/ring.coll (out-of-place, 4 ranks)\n+++ b: "), "{text}");
    assert!(text.ends_with("equal: the same 4 ranks and 28 instructions (source spans aside)\n"), "{text}");
}

#[test]
fn a_changed_transfer_is_named_by_rank_and_instruction() {
    let (old, new) =
        (TempFile::with("diff-old.coll", &ring()), TempFile::with("diff-new.coll", &ring_on_two_channels()));
    let output = collc(&["diff", old.path(), new.path(), "--ranks", "4"]);
    assert_eq!(output.status.code(), Some(1), "{}{}", stdout(&output), stderr(&output));
    let text = stdout(&output);
    assert!(!text.contains("header:"), "only instructions differ:\n{text}");
    assert!(text.contains("\nrank 0: +"), "{text}");
    assert!(text.contains(" ch=1 "), "the new side's instructions on channel 1 are shown:\n{text}");
    assert!(text.lines().any(|l| l.starts_with("  ~ a#") || l.starts_with("  + b#")), "{text}");
    assert!(
        text.trim_end().lines().last().is_some_and(|l| l.starts_with("differ: 0 header field(s), 4 of 4 ranks")),
        "{text}"
    );
}

#[test]
fn schedule_files_compare_as_they_stand_and_with_algorithms() {
    let dir = TempDir::new("diff-sched");
    let (ring4, ring3) = (dir.path().join("ring4.sched"), dir.path().join("ring3.sched"));
    for (n, file) in [("4", &ring4), ("3", &ring3)] {
        let built = collc(&["build", "allreduce/ring", "--ranks", n, "--output", file.to_str().expect("utf-8")]);
        assert_eq!(built.status.code(), Some(0), "{}", stderr(&built));
    }
    let (ring4, ring3) = (ring4.to_str().expect("utf-8"), ring3.to_str().expect("utf-8"));
    let equal = collc(&["diff", ring4, "allreduce/ring", "--ranks", "4"]);
    assert_eq!(equal.status.code(), Some(0), "{}{}", stdout(&equal), stderr(&equal));
    let differ = collc(&["diff", ring3, ring4]);
    assert_eq!(differ.status.code(), Some(1), "{}", stderr(&differ));
    let text = stdout(&differ);
    let header = text.find("header:\n").expect("a header section");
    assert!(text.contains("  ranks: 3 -> 4\n") && text.contains("  chunks: 3 -> 4\n"), "{text}");
    assert!(text.find("rank 0: ").is_some_and(|at| at > header), "the header comes first:\n{text}");
    assert!(text.contains("rank 3: only in b (7 instructions)\n"), "{text}");
}

#[test]
fn a_file_at_two_git_revisions() {
    let repo = TempDir::new("diff-git");
    let git = |args: &[&str]| {
        let output = Command::new("git")
            .args(["-c", "user.name=collc", "-c", "user.email=collc@example.com", "-c", "commit.gpgsign=false"])
            .args(args)
            .current_dir(repo.path())
            .output()
            .expect("git runs");
        assert!(output.status.success(), "git {args:?}: {}", stderr(&output));
    };
    git(&["init", "-q"]);
    std::fs::create_dir_all(repo.path().join("algos")).expect("a folder");
    let file = repo.path().join("algos/my_ring.coll");
    std::fs::write(&file, ring()).expect("written");
    git(&["add", "algos/my_ring.coll"]);
    git(&["commit", "-q", "-m", "the ring"]);
    std::fs::write(&file, ring_on_two_channels()).expect("written");
    git(&["commit", "-q", "-a", "-m", "all-gather on channel 1"]);

    let changed = collc_in(repo.path(), &["diff", "HEAD~1:algos/my_ring.coll", "algos/my_ring.coll", "--ranks", "4"]);
    assert_eq!(changed.status.code(), Some(1), "{}{}", stdout(&changed), stderr(&changed));
    let text = stdout(&changed);
    assert!(text.starts_with("--- a: HEAD~1:algos/my_ring.coll (out-of-place, 4 ranks)\n"), "{text}");
    assert!(text.contains("\nrank 2: ") && text.contains(" ch=1 "), "{text}");
    let same = collc_in(repo.path(), &["diff", "HEAD:algos/my_ring.coll", "algos/my_ring.coll", "--ranks", "8"]);
    assert_eq!(same.status.code(), Some(0), "{}{}", stdout(&same), stderr(&same));
    let missing = collc_in(repo.path(), &["diff", "HEAD~1:algos/nope.coll", "algos/my_ring.coll", "--ranks", "4"]);
    assert_eq!(missing.status.code(), Some(2), "{}", stderr(&missing));
    assert!(
        stderr(&missing).contains(
            "`HEAD~1:algos/nope.coll` is neither a library algorithm, nor a file, nor a REV:PATH git can show"
        ),
        "{}",
        stderr(&missing)
    );
}

#[test]
fn usage_errors_exit_2_and_say_what_to_do() {
    let misspelt = collc(&["diff", "allreduce/rign", "allreduce/ring", "--ranks", "4"]);
    assert_eq!(misspelt.status.code(), Some(2));
    assert!(stderr(&misspelt).contains("did you mean: allreduce/ring"), "{}", stderr(&misspelt));
    let no_ranks = collc(&["diff", "allreduce/ring", "allreduce/tree"]);
    assert_eq!(no_ranks.status.code(), Some(2));
    assert!(
        stderr(&no_ranks).contains("`allreduce/ring.coll` is an algorithm: give --ranks N"),
        "{}",
        stderr(&no_ranks)
    );
    let zero = collc(&["diff", "allreduce/ring", "allreduce/tree", "--ranks", "0"]);
    assert_eq!(zero.status.code(), Some(2));
    assert!(stderr(&zero).contains("--ranks 0"), "{}", stderr(&zero));
    let one_side = collc(&["diff", "allreduce/ring"]);
    assert_eq!(one_side.status.code(), Some(2), "{}", stderr(&one_side));
}

#[test]
fn a_side_that_does_not_verify_prints_its_diagnostics_and_exits_1() {
    let wrong = TempFile::with("diff-wrong.coll", &ring().replace("to (r + 1) % p reduce", "to (r + 2) % p reduce"));
    let output = collc(&["diff", "allreduce/ring", wrong.path(), "--ranks", "4"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stdout(&output).is_empty(), "no comparison without both schedules: {}", stdout(&output));
    assert!(stderr(&output).contains("collc::verify::"), "{}", stderr(&output));
}
