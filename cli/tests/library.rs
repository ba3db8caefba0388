//! Users' own algorithms (`--library DIR`, `COLLC_ALGO_PATH`) beside the library's: listed, tuned, compared and
//! selected; a file that does not parse, verify or fit is named with its diagnostic; ranks of one job that disagree
//! on their algorithms or their transport are named on every rank.

mod common;

use common::TempDir;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn collc(args: &[&str], env: &[(&str, &str)], cache: &TempDir) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_collc"));
    command.args(args).env_remove("COLLC_ALGO_PATH").env_remove("COLLC_ALGO");
    // A calibration cache of the test's own: `--compare` merges its timings there.
    command.env("XDG_CACHE_HOME", cache.path());
    command.envs(env.iter().copied()).output().expect("collc runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A fresh folder holding `files` (relative path, text), removed when dropped.
fn folder(name: &str, files: &[(&str, String)]) -> TempDir {
    let dir = TempDir::new(&format!("library-{name}"));
    for (path, body) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("a temporary folder");
        std::fs::write(path, body).expect("written");
    }
    dir
}

/// The library's ring allreduce under another name: a user's algorithm that verifies.
fn renamed(library_name: &str, new: &str) -> String {
    let (collective, name) = library_name.split_once('/').expect("collective/name");
    let source = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../algorithms/{library_name}.coll")),
    );
    source
        .expect("in algorithms/")
        .replace(&format!("algorithm {name} for {collective}"), &format!("algorithm {new} for {collective}"))
}

#[test]
fn a_users_folder_is_listed_tuned_compared_and_selected_beside_the_library() {
    let cache = TempDir::new("library-cache-listed");
    let dir = folder(
        "mine",
        &[
            ("my_ring.coll", renamed("allreduce/ring", "my_ring")),
            ("deep/b.coll", renamed("broadcast/chain", "my_chain")),
        ],
    );
    let dir_arg = dir.path().to_str().expect("utf-8");
    let out = collc(&["list", "--library", dir_arg], &[], &cache);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(stdout.contains("allreduce/my_ring") && stdout.contains("broadcast/my_chain"), "{stdout}");
    assert!(stdout.contains(&format!("[{}]", dir.path().join("my_ring.coll").display())), "{stdout}");
    // The variable does what the flag does.
    let out = collc(
        &["tune", "allreduce", "--ranks", "4", "--algo", "ring,my_ring", "--all"],
        &[("COLLC_ALGO_PATH", dir_arg)],
        &cache,
    );
    let stdout = text(&out.stdout);
    assert!(stdout.contains("candidates ring, my_ring"), "{stdout}{}", text(&out.stderr));
    // Timed beside the library's candidates, with -c 1, nothing wrong.
    let out = collc(
        &[
            "run",
            "allreduce",
            "--library",
            dir_arg,
            "--compare",
            "--ranks",
            "3",
            "-b",
            "4K",
            "-e",
            "8K",
            "-n",
            "2",
            "-w",
            "1",
        ],
        &[],
        &cache,
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let mine: Vec<&str> = stdout.lines().filter(|l| l.ends_with("allreduce/my_ring")).collect();
    assert_eq!(mine.len(), 2, "a row per size:\n{stdout}");
    assert!(mine.iter().all(|l| l.split_whitespace().nth(8) == Some("0")), "{mine:?}");
    // Selected alone through --algo, and run by its name.
    let out = collc(
        &["run", "allreduce", "--library", dir_arg, "--algo", "my_ring", "--ranks", "2", "-e", "1K", "-n", "1"],
        &[],
        &cache,
    );
    assert!(text(&out.stdout).contains("allreduce/my_ring"), "{}{}", text(&out.stdout), text(&out.stderr));
    let out =
        collc(&["run", "broadcast/my_chain", "--library", dir_arg, "--ranks", "3", "-e", "1K", "-n", "1"], &[], &cache);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn a_users_file_that_does_not_parse_verify_or_fit_is_named_never_skipped() {
    let cache = TempDir::new("library-cache-named");
    let taken = folder("taken", &[("ring.coll", renamed("allreduce/ring", "ring"))]);
    let out = collc(&["list", "--library", taken.path().to_str().expect("utf-8")], &[], &cache);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("`allreduce/ring` is taken: the embedded library has it") && stderr.contains("ring.coll:3:11]"),
        "{stderr}"
    );
    let broken = folder(
        "broken",
        &[("x.coll", "algorithm x for allreduce {\n ranks p\n chunks p\n step { send in[0] from 0 to 1 }\n}\n".into())],
    );
    let out =
        collc(&["tune", "allreduce", "--ranks", "4", "--library", broken.path().to_str().expect("utf-8")], &[], &cache);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("x.coll:4") && stderr.contains("allreduce/x does not verify for 4 ranks"), "{stderr}");
    let out = collc(&["list", "--library", "/no/such/folder"], &[], &cache);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("`/no/such/folder` cannot be read"), "{}", text(&out.stderr));
}

/// Two ranks of a torchrun-style job, each with its own transport and environment; their exit codes and errors.
fn two_ranks(tag: &str, setups: [(&str, &[(&str, &str)]); 2]) -> Vec<(Option<i32>, String)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a port").port();
    let ranks: Vec<_> = setups
        .iter()
        .enumerate()
        .map(|(rank, (transport, env))| {
            Command::new(env!("CARGO_BIN_EXE_collc"))
                .args(["run", "allreduce/ring", "--transport", transport, "-e", "1K", "-n", "1", "--timeout", "3"])
                .env_remove("COLLC_ALGO_PATH")
                .envs([("RANK", rank.to_string()), ("WORLD_SIZE", "2".into()), ("LOCAL_WORLD_SIZE", "2".into())])
                .envs([("MASTER_ADDR", "127.0.0.1".to_string()), ("MASTER_PORT", port.to_string())])
                .env("TORCHELASTIC_RUN_ID", format!("{tag}-{port}"))
                .env("COLLC_JOB_TOKEN", "library-test-token-0123456789abc")
                .envs(env.iter().copied())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("collc starts")
        })
        .collect();
    ranks.into_iter().map(|c| c.wait_with_output().expect("ends")).map(|o| (o.status.code(), text(&o.stderr))).collect()
}

#[test]
fn ranks_that_disagree_on_their_algorithms_or_transport_are_named_on_every_rank() {
    let dir = folder("disagree", &[("my_ring.coll", renamed("allreduce/ring", "my_ring"))]);
    let path = dir.path().to_str().expect("utf-8");
    let started = Instant::now();
    for transport in ["shm", "tcp"] {
        for (rank, (code, stderr)) in
            two_ranks("paths", [(transport, &[]), (transport, &[("COLLC_ALGO_PATH", path)])]).iter().enumerate()
        {
            assert_eq!(*code, Some(1), "{transport} rank {rank}: {stderr}");
            assert!(
                stderr.contains("rank 0 over")
                    && stderr.contains("with no users' algorithms; rank 1 over")
                    && stderr.contains("with allreduce/my_ring ("),
                "{transport} rank {rank}: {stderr}"
            );
        }
    }
    assert!(started.elapsed() < Duration::from_secs(20), "named at setup, not at a timeout: {:?}", started.elapsed());
    let ranks = two_ranks("transports", [("shm", &[]), ("tcp", &[])]);
    for (rank, (code, stderr)) in ranks.iter().enumerate() {
        assert_eq!(*code, Some(1), "rank {rank}: {stderr}");
        let (other, theirs, ours) = if rank == 0 { (1, "tcp", "shm") } else { (0, "shm", "tcp") };
        let said = format!("join over different transports: rank {other} over {theirs}, this rank over {ours}");
        assert!(stderr.contains(&said), "rank {rank}: {stderr}");
    }
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(!left.iter().any(|f| f.starts_with("collc-joining-transports-")), "{left:?}");
}
