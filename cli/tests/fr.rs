//! The flight recorder end to end: a job that hangs dumps every waiting rank's state on its timeout, SIGUSR1
//! dumps a running job without stopping it, and `collc fr analyze` names the rank the others wait on.

mod hang;

use hang::{dump_dir, rank, signal, wait_within};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn analyze(dir: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_collc")).args(["fr", "analyze"]).arg(dir).output().expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_hang_is_dumped_on_the_timeout_and_analyze_names_the_stopped_rank() {
    let dir = hang::hang("hang");
    let report = analyze(&dir);
    assert!(report.contains("2 of 3 ranks dumped"), "{report}");
    assert!(report.contains("rank 2: MISSING"), "{report}");
    assert!(report.contains("waits at instruction #") && report.contains("(allreduce/ring line "), "{report}");
    assert!(report.contains("wait on rank 2 (missing)"), "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigusr1_dumps_a_running_job_that_then_finishes() {
    let dir = dump_dir("usr1");
    let job = format!("fr-usr1-{}", std::process::id());
    let args = ["-b", "64K", "-e", "64K", "-n", "200000", "-w", "1", "-c", "0"];
    let mut ranks: Vec<Child> = (0..2).map(|r| rank(&job, r, 2, &dir, &args)).collect();
    // Once the ranks have caught SIGUSR1 (their communicators are up), each signal makes both dump.
    std::thread::sleep(Duration::from_millis(1000));
    let deadline = Instant::now() + Duration::from_secs(20);
    while (0..2).any(|r| !dir.join(format!("collc-fr-rank{r}.json")).exists()) {
        assert!(Instant::now() < deadline, "no dumps after SIGUSR1");
        for child in &ranks {
            signal(child, libc::SIGUSR1);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    for child in &mut ranks {
        assert!(wait_within(child, Duration::from_secs(60)).success(), "a rank failed after SIGUSR1");
    }
    let report = analyze(&dir);
    assert!(report.contains("2 of 2 ranks dumped"), "{report}");
    assert!(report.contains("[SIGUSR1]"), "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn analyze_refuses_damaged_dumps_and_a_stale_job_mixed_in() {
    let dir = dump_dir("hostile");
    std::fs::create_dir_all(&dir).expect("a directory");
    let dump = |rank: u32, n_ranks: u64, job: &str| {
        format!(
            r#"{{"rank":{rank},"n_ranks":{n_ranks},"job":"{job}","host":"h","pid":1,"reason":"timeout","calls":[],"current":null}}"#
        )
    };
    let analyze_err = |dir: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_collc")).args(["fr", "analyze"]).arg(dir).output().expect("runs");
        assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stdout));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    std::fs::write(dir.join("collc-fr-rank0.json"), dump(0, 4294967295, "a")).expect("written");
    let error = analyze_err(&dir);
    assert!(error.contains("rank 0 of 4294967295 ranks is not a job collc runs"), "{error}");
    std::fs::write(dir.join("collc-fr-rank0.json"), dump(0, 2, "new")).expect("written");
    std::fs::write(dir.join("collc-fr-rank1.json"), dump(1, 2, "old")).expect("written");
    let error = analyze_err(&dir);
    assert!(
        error.contains("holds the dumps of 2 jobs") && error.contains("job `old` of 2 ranks: ranks [1]"),
        "{error}"
    );
    std::fs::write(dir.join("collc-fr-rank1.json"), dump(1, 2, "new")).expect("written");
    assert!(analyze(&dir).contains("2 of 2 ranks dumped"));
    let _ = std::fs::remove_dir_all(&dir);
}
