//! Shm jobs started by hand for the flight recorder's tests (`fr.rs`, `trace.rs`): ranks with collc's own launcher
//! variables, signals to them, and a job that hangs because one rank is stopped.
// Each test binary uses part of this.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A fresh dump directory for test `name` of this process.
pub fn dump_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("collc-fr-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Rank `rank` of a shm job started by hand (collc's own launcher variables).
pub fn rank(job: &str, rank: usize, ranks: usize, dir: &Path, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_collc"))
        .args(["run", "allreduce/ring", "--transport", "shm"])
        .args(args)
        .env("COLLC_RANK", rank.to_string())
        .env("COLLC_WORLD_SIZE", ranks.to_string())
        .env("COLLC_JOB", job)
        .env("COLLC_TIMEOUT", "3")
        .env("COLLC_DUMP_DIR", dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("collc starts")
}

pub fn signal(child: &Child, signal: i32) {
    // SAFETY: signalling a child this test started and has not reaped.
    unsafe { libc::kill(child.id() as i32, signal) };
}

pub fn wait_within(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        assert!(Instant::now() < deadline, "a rank ran past {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A job of three ranks in endless calls whose rank 2 is stopped (SIGSTOP): ranks 0 and 1 time out and dump, rank
/// 2 is killed without one. Returns the dump directory, named after `name`.
pub fn hang(name: &str) -> PathBuf {
    let dir = dump_dir(name);
    let job = format!("fr-{name}-{}", std::process::id());
    let endless = ["-b", "1M", "-e", "1M", "-n", "1000000", "-w", "1", "-c", "0"];
    let mut ranks: Vec<Child> = (0..3).map(|r| rank(&job, r, 3, &dir, &endless)).collect();
    std::thread::sleep(Duration::from_millis(1500));
    signal(&ranks[2], libc::SIGSTOP);
    for child in &mut ranks[..2] {
        assert!(!wait_within(child, Duration::from_secs(20)).success());
    }
    signal(&ranks[2], libc::SIGKILL);
    let _ = ranks[2].wait();
    collc_runtime::Shm::remove_job(&job);
    dir
}
