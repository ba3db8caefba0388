//! `collc run` as a user runs it: every library algorithm on the host transports with -c 1, nccl-tests' table, JSON,
//! usage errors, and a rank killed mid-run.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn collc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_collc")).args(args).output().expect("collc runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The #wrong columns of every row of an nccl-tests table.
fn wrong_columns(table: &str) -> Vec<String> {
    table
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .flat_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            [cols[8].to_string(), cols[12].to_string()]
        })
        .collect()
}

#[test]
fn every_library_algorithm_runs_correctly_on_the_host_transports() {
    let list = text(&collc(&["list"]).stdout);
    let names: Vec<&str> =
        list.lines().filter_map(|l| l.split_whitespace().nth(1)).filter(|n| n.contains('/')).collect();
    assert!(names.len() >= 10, "{list}");
    for name in names {
        for transport in ["threads", "shm", "twin"] {
            let out = collc(&[
                "run",
                name,
                "--ranks",
                "3",
                "--transport",
                transport,
                "-b",
                "4",
                "-e",
                "64K",
                "-f",
                "16",
                "-n",
                "2",
                "-w",
                "1",
                "-c",
                "1",
                "-d",
                "int32",
            ]);
            let stdout = text(&out.stdout);
            assert_eq!(out.status.code(), Some(0), "{name} {transport}:\n{stdout}\n{}", text(&out.stderr));
            assert!(stdout.contains(&format!("algorithm {name}")) && stdout.contains(transport), "{stdout}");
            let wrong = wrong_columns(&stdout);
            assert!(!wrong.is_empty() && wrong.iter().all(|w| w == "0"), "{name} {transport}:\n{stdout}");
            assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
        }
    }
}

#[test]
fn the_header_gives_the_size_range_asked_for() {
    // nccl-tests prints -b and -e, even when the factor stops short of -e (8, 128, ..., 512K here).
    let out =
        collc(&["run", "allreduce/ring", "--ranks", "2", "-b", "8", "-e", "1M", "-f", "16", "-n", "1", "-w", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(table.contains("# minBytes 8 maxBytes 1048576 "), "{table}");
    assert!(wrong_columns(&table).len() == 2 * 5, "{table}");
}

#[test]
fn json_output_has_one_row_per_size_with_bandwidths() {
    let out = collc(&["run", "allreduce/ring", "--ranks", "2", "-b", "1K", "-e", "4K", "-n", "2", "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let rows = doc["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0]["size"], 1024);
    assert_eq!(rows[0]["out_of_place"]["wrong"], 0);
    assert!(rows[2]["in_place"]["busbw"].as_f64().expect("busbw") > 0.0);
    assert_eq!(doc["transport"], "threads");
}

#[test]
fn bad_arguments_are_usage_errors() {
    for (args, needle) in [
        (vec!["--ranks", "0"], "at least one rank"),
        (vec!["-d", "float7"], "unknown data type"),
        (vec!["-o", "mean"], "unknown reduce op"),
        (vec!["-b", "1M", "-e", "1K"], "size range is empty"),
        (vec!["-b", "99999999999999999999"], "-b"),
        (vec!["-r", "5", "--ranks", "2"], "root must be below"),
        (vec!["--ranks", "2", "--timeout", "0"], "positive number"),
    ] {
        let mut all = vec!["run", "broadcast/binomial"];
        all.extend(args);
        let out = collc(&all);
        assert_eq!(out.status.code(), Some(2), "{all:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains(needle), "{all:?}: {}", text(&out.stderr));
    }
}

/// The fields of `/proc/PID/stat` after the command name (which may hold spaces): state, parent pid, ...
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
    Some(after.split_whitespace().map(str::to_string).collect())
}

/// Process ids whose parent is `parent`, from /proc.
fn children(parent: u32) -> Vec<u32> {
    let pids = std::fs::read_dir("/proc").expect("/proc").flatten();
    let pids = pids.filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok());
    pids.filter(|&pid| stat_fields(pid).is_some_and(|f| f.get(1).and_then(|p| p.parse().ok()) == Some(parent)))
        .collect()
}

#[test]
fn a_rank_killed_mid_run_fails_the_run_on_every_rank_naming_it() {
    let run = Command::new(env!("CARGO_BIN_EXE_collc"))
        .args(["run", "allreduce/ring", "--ranks", "3", "--transport", "shm", "-b", "8M", "-e", "8M"])
        .args(["-n", "100000", "-w", "0", "-c", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("collc runs");
    let started = Instant::now();
    let ranks = loop {
        let ranks = children(run.id());
        if ranks.len() == 3 || started.elapsed() > Duration::from_secs(10) {
            break ranks;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(ranks.len(), 3, "the rank processes did not start");
    // Long enough to be inside the timed loop of the only row.
    std::thread::sleep(Duration::from_millis(1500));
    let mut sorted = ranks.clone();
    sorted.sort_unstable();
    // SAFETY: sending SIGKILL to a child process of the run we started.
    unsafe { libc::kill(sorted[1] as i32, libc::SIGKILL) };
    let killed_at = Instant::now();
    let out = run.wait_with_output().expect("the run ends");
    let stderr = text(&out.stderr);
    assert!(killed_at.elapsed() < Duration::from_secs(15), "took {:?}", killed_at.elapsed());
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("was killed"), "{stderr}");
    let victim = stderr.lines().find(|l| l.contains("was killed")).expect("named");
    let rank = victim.split_whitespace().nth(2).expect("rank number");
    let others: Vec<&str> = stderr.lines().filter(|l| l.contains(&format!("rank {rank} "))).collect();
    assert!(others.len() >= 2, "the surviving ranks should name rank {rank}:\n{stderr}");
    assert!(stderr.contains("allreduce/ring line"), "{stderr}");
    let stdout = text(&out.stdout);
    assert!(stdout.contains("# Out of bounds values : 0 FAILED (the run stopped with an error"), "{stdout}");
}

/// Whether process `pid` still runs (a zombie left for a reaper that never comes counts as gone).
fn alive(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|fields| fields.first().is_some_and(|state| state != "Z"))
}

/// The `/dev/shm` files of the jobs launcher `pid` started (`collc-<pid>-...`).
fn shm_files_of(pid: u32) -> Vec<String> {
    let prefix = format!("collc-{pid}-");
    let entries = std::fs::read_dir("/dev/shm").map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default();
    entries.iter().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with(&prefix)).collect()
}

#[test]
fn a_launcher_killed_mid_run_leaves_no_rank_running_and_no_shm_files() {
    let mut run = Command::new(env!("CARGO_BIN_EXE_collc"))
        .args(["run", "allreduce/ring", "--ranks", "3", "--transport", "shm", "-b", "8M", "-e", "8M"])
        .args(["-n", "100000", "-w", "0", "-c", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("collc runs");
    let started = Instant::now();
    let ranks = loop {
        let ranks = children(run.id());
        if (ranks.len() == 3 && !shm_files_of(run.id()).is_empty()) || started.elapsed() > Duration::from_secs(10) {
            break ranks;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(ranks.len(), 3, "the rank processes did not start");
    // Inside the timed loop of the only row.
    std::thread::sleep(Duration::from_millis(1000));
    run.kill().expect("SIGKILL to the launcher");
    run.wait().expect("the launcher is reaped");
    let killed_at = Instant::now();
    while killed_at.elapsed() < Duration::from_secs(5)
        && (ranks.iter().any(|&r| alive(r)) || !shm_files_of(run.id()).is_empty())
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let survivors: Vec<u32> = ranks.iter().copied().filter(|&r| alive(r)).collect();
    for &r in &survivors {
        // SAFETY: killing what this test started, so a failure leaves nothing behind.
        unsafe { libc::kill(r as i32, libc::SIGKILL) };
    }
    assert!(survivors.is_empty(), "ranks {survivors:?} outlived their launcher by 5 s");
    assert_eq!(shm_files_of(run.id()), Vec::<String>::new(), "the job's /dev/shm files are left");
}

/// Starts a long sweep with its output piped, returns it once `rows` data rows have arrived (so they were printed
/// as measured, not at the end), with the lines read so far and the reader of the rest.
fn sweep_until_rows(
    transport: &str,
    format: &str,
    rows: usize,
) -> (std::process::Child, Vec<String>, impl Iterator<Item = String>) {
    use std::io::BufRead;
    let mut run = Command::new(env!("CARGO_BIN_EXE_collc"))
        .args(["run", "allreduce/ring", "--ranks", "2", "--transport", transport, "-b", "8", "-e", "256M"])
        .args(["-n", "20", "-w", "1", "--format", format])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("collc runs");
    let mut lines = std::io::BufReader::new(run.stdout.take().expect("piped")).lines().map_while(Result::ok);
    let mut seen = Vec::new();
    let data = |l: &String| !l.starts_with('#') && !l.starts_with('{') && !l.starts_with(']');
    while seen.iter().filter(|l| data(l)).count() < rows {
        match lines.next() {
            Some(line) => seen.push(line),
            None => break,
        }
    }
    (run, seen, lines)
}

#[test]
fn rows_stream_as_measured_and_an_interrupt_prints_what_was_measured() {
    for (transport, signal, code) in [("threads", libc::SIGINT, 130), ("shm", libc::SIGTERM, 143)] {
        let (mut run, seen, rest) = sweep_until_rows(transport, "table", 3);
        assert!(seen.first().is_some_and(|l| l.starts_with("# collc run")), "{transport}: {seen:?}");
        // SAFETY: signalling the run this test started.
        unsafe { libc::kill(run.id() as i32, signal) };
        let rest: Vec<String> = rest.collect();
        let status = run.wait().expect("the run ends");
        assert_eq!(status.code(), Some(code), "{transport}: {rest:?}");
        assert!(rest.iter().any(|l| l.starts_with("# interrupted by signal")), "{transport}: {rest:?}");
        assert!(rest.iter().any(|l| l.starts_with("# Out of bounds values : 0 OK")), "{transport}: {rest:?}");
    }
    // The progress bar is for a terminal's stderr: piped, stderr holds nothing of it.
    let piped = collc(&["run", "allreduce/ring", "--ranks", "2", "-e", "1K", "-n", "2", "-w", "1"]);
    assert!(piped.stderr.is_empty(), "{}", text(&piped.stderr));
    // A size whose buffers take long to set up is announced before its first call, piped or not.
    let large =
        collc(&["run", "allreduce/ring", "--ranks", "2", "-b", "64M", "-e", "64M", "-n", "1", "-w", "1", "-c", "0"]);
    assert!(text(&large.stderr).starts_with("# warm-up at 67108864 B: call 1 of 1\n"), "{}", text(&large.stderr));
    // JSON: a document closed properly, with the rows measured and the signal.
    let (mut run, seen, rest) = sweep_until_rows("threads", "json", 2);
    // SAFETY: as above.
    unsafe { libc::kill(run.id() as i32, libc::SIGINT) };
    let text: String = seen.into_iter().chain(rest).collect::<Vec<_>>().join("\n");
    assert_eq!(run.wait().expect("the run ends").code(), Some(130));
    let json: serde_json::Value = serde_json::from_str(&text).expect("a whole JSON document");
    assert!(json["rows"].as_array().is_some_and(|rows| rows.len() >= 2), "{text}");
    assert_eq!(json["interrupted"], libc::SIGINT);
}

#[test]
fn a_run_that_cannot_fit_in_memory_is_refused_before_any_rank_starts() {
    let out = collc(&["run", "allreduce/ring", "--ranks", "4", "-b", "64G", "-e", "64G"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("this run needs about") && stderr.contains("a smaller -e"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing ran: {}", text(&out.stdout));
}

/// Without a GPU (CI has none) the cuda transport and `collc gpu` fail at once with what is missing: the driver,
/// or (in a build without the feature) the feature; never a panic or a hang.
/// Two ranks of a torchrun job given two different schedules of one algorithm (two versions of `ring.sched`, as two
/// hosts may hold) both fail at their first call, over shm and over tcp, each naming both fingerprints and both
/// files, within a fraction of the timeout.
#[test]
fn ranks_given_different_schedule_files_both_fail_naming_both() {
    let dir = std::env::temp_dir().join(format!("collc-run-schedules-{}", std::process::id()));
    let files = [dir.join("a/ring.sched"), dir.join("b/ring.sched")];
    for (file, extra) in files.iter().zip([&[][..], &["--no-fuse"]]) {
        std::fs::create_dir_all(file.parent().expect("a folder")).expect("a temporary folder");
        let mut args = vec!["build", "allreduce/ring", "--ranks", "2", "--output", file.to_str().expect("utf-8")];
        args.extend_from_slice(extra);
        assert_eq!(collc(&args).status.code(), Some(0), "collc {args:?}");
    }
    for transport in ["shm", "tcp"] {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let started = Instant::now();
        let ranks: Vec<_> = files
            .iter()
            .enumerate()
            .map(|(rank, file)| {
                Command::new(env!("CARGO_BIN_EXE_collc"))
                    .args(["run", file.to_str().expect("utf-8"), "--transport", transport])
                    .args(["-b", "4K", "-e", "4K", "-n", "1", "-w", "0"])
                    .env("RANK", rank.to_string())
                    .env("WORLD_SIZE", "2")
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", port.to_string())
                    .env("TORCHELASTIC_RUN_ID", format!("schedules-{port}"))
                    .env("COLLC_JOB_TOKEN", "run-test-token-0123456789abcdef")
                    .env("COLLC_SOCKET_IFNAME", "lo")
                    .env("COLLC_TIMEOUT", "60")
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("collc starts")
            })
            .collect();
        for (rank, child) in ranks.into_iter().enumerate() {
            let out = child.wait_with_output().expect("collc ends");
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{transport} rank {rank}: {stderr}");
            assert!(stderr.contains(&format!("rank {rank}: mismatched calls: this rank called call #1")), "{stderr}");
            for file in &files {
                assert!(stderr.contains(&format!("{} (.sched file; schedule ", file.display())), "{stderr}");
            }
            assert_eq!(stderr.matches(", fingerprint ").count(), 2, "{transport} rank {rank}: {stderr}");
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{transport}: {:?}", started.elapsed());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_cuda_transport_without_a_gpu_says_what_is_missing() {
    let expected = if cfg!(feature = "cuda") { "no CUDA driver found" } else { "built without the cuda feature" };
    let has_driver = std::path::Path::new("/dev/nvidiactl").exists();
    for args in
        [&["run", "allreduce/ring", "--ranks", "2", "--transport", "cuda"][..], &["gpu", "info"], &["gpu", "bench"]]
    {
        let out = collc(args);
        if has_driver && cfg!(feature = "cuda") {
            assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out.stderr));
            continue;
        }
        assert_ne!(out.status.code(), Some(0), "{args:?}");
        assert!(out.status.code().is_some(), "{args:?}: killed by a signal");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    // Under a launcher the one-process transports are refused before anything starts.
    let out = Command::new(env!("CARGO_BIN_EXE_collc"))
        .args(["run", "allreduce/ring", "--transport", "twin"])
        .env("RANK", "0")
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", "1")
        .output()
        .expect("collc runs");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("runs every rank as a thread of this one process"), "{}", text(&out.stderr));
    // Rank processes of the cuda transport need a driver as threads do.
    let out = Command::new(env!("CARGO_BIN_EXE_collc"))
        .args(["run", "allreduce/ring", "--transport", "cuda"])
        .env("COLLC_RANK", "0")
        .env("COLLC_WORLD_SIZE", "1")
        .env("COLLC_JOB", format!("cudatest{}", std::process::id()))
        .output()
        .expect("collc runs");
    if !(has_driver && cfg!(feature = "cuda")) {
        // Without the feature this build lacks the transport (a usage error); with it, the machine lacks a driver.
        let code = if cfg!(feature = "cuda") { 1 } else { 2 };
        assert_eq!(out.status.code(), Some(code), "{}", text(&out.stderr));
        assert!(text(&out.stderr).contains(expected), "{}", text(&out.stderr));
        // Refused before the job's shared memory was made.
        let job = format!("collc-cudatest{}-", std::process::id());
        let left = std::fs::read_dir("/dev/shm").into_iter().flatten().flatten();
        assert!(!left.into_iter().any(|e| e.file_name().to_string_lossy().starts_with(&job)), "{job}* left behind");
    }
}

/// `collc gpu ptx` compiles the kernels with NVRTC, which needs no GPU (CI installs it): what a GPU machine without
/// NVRTC loads through COLLC_CUDA_PTX.
#[cfg(feature = "cuda")]
#[test]
fn gpu_ptx_compiles_the_kernels_without_a_gpu() {
    let out = collc(&["gpu", "ptx", "--arch", "compute_90"]);
    let ptx = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(ptx.contains(".target sm_90") && ptx.contains(".entry collc_interpret("), "{}", &ptx[..ptx.len().min(300)]);
}

#[test]
fn misspelt_algorithms_and_parameters_are_usage_errors_said_once() {
    let help = text(&collc(&["run", "--help"]).stdout);
    for transport in ["threads:", "shm:", "tcp:", "twin:", "cuda:"] {
        assert!(help.contains(transport), "{transport} missing from run --help:\n{help}");
    }
    assert!(!help.contains("shared-memory processes"), "{help}");
    let out = collc(&["run", "alreduce", "--ranks", "2"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("did you mean: allreduce"), "{}", text(&out.stderr));
    let out = collc(&["run", "allreduce/hierarchical", "--ranks", "4", "--set", "q=3", "-e", "1K"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("no parameter `q`"), "{}", text(&out.stderr));
    let out = collc(&["check", "allreduce/hierarchical", "--ranks", "2..=8", "--set", "q=3"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr).matches("no parameter `q`").count(), 1, "{}", text(&out.stderr));
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
}

#[test]
fn the_header_shows_the_parameters_a_run_bound() {
    let out = collc(&["run", "allreduce/hierarchical", "--ranks", "4", "-e", "1K", "-n", "2", "-w", "1"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout, text(&out.stderr));
    let line = stdout.lines().find(|l| l.starts_with("#   parameters: ")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains("=4") && line.contains("from the job's node split, 4 ranks per node"), "{line}");
    let out =
        collc(&["run", "allreduce/hierarchical", "--ranks", "4", "--set", "g=2", "-e", "1K", "-n", "2", "-w", "1"]);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("#   parameters: g=2\n"), "{stdout}{}", text(&out.stderr));
}

/// Rank `rank` of a 3-rank job of which rank 2 never starts, over `transport`, dumping into `dumps`.
fn rank_of_three(transport: &str, rank: &str, job: &str, port: u16, dumps: &std::path::Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_collc"))
        .args(["run", "allreduce/ring", "--transport", transport, "-e", "1K", "--timeout", "2"])
        .envs([("RANK", rank), ("WORLD_SIZE", "3"), ("LOCAL_WORLD_SIZE", "3"), ("MASTER_ADDR", "127.0.0.1")])
        .env("MASTER_PORT", port.to_string())
        .env("TORCHELASTIC_RUN_ID", job)
        .env("COLLC_JOB_TOKEN", "0123456789abcdef0123456789abcdef")
        .env("COLLC_DUMP_DIR", dumps)
        // collc's own job id (what the shm segments are named by), over torchrun's.
        .envs([("COLLC_RANK", rank), ("COLLC_WORLD_SIZE", "3"), ("COLLC_JOB", job)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("collc runs")
}

#[test]
fn a_rank_that_never_joins_is_named_and_the_others_dump() {
    for transport in ["shm", "tcp"] {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a port").port();
        let job = format!("neverjoins{transport}{}", std::process::id());
        let dumps = std::env::temp_dir().join(&job);
        let _ = std::fs::remove_dir_all(&dumps);
        let ranks =
            [rank_of_three(transport, "0", &job, port, &dumps), rank_of_three(transport, "1", &job, port, &dumps)];
        for (rank, child) in ranks.into_iter().enumerate() {
            let out = child.wait_with_output().expect("the rank ends");
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{transport} rank {rank}: {stderr}");
            // Timed out naming it, or told by the rank that timed out first (tcp's rendezvous passes it on).
            let named = stderr.contains("rank 2 (it never joined the job") || stderr.contains("rank 2 never joined");
            assert!(named, "{transport} rank {rank}: {stderr}");
            let dump = dumps.join(format!("collc-fr-rank{rank}.json"));
            assert!(dump.exists(), "{transport}: no dump of rank {rank} in {}", dumps.display());
        }
        let _ = std::fs::remove_dir_all(&dumps);
        // The job failed: the last rank out removes its shared memory, the rank that never came notwithstanding.
        let prefix = format!("collc-{job}-");
        let left: Vec<String> = std::fs::read_dir("/dev/shm")
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        assert!(!left.iter().any(|f| f.starts_with(&prefix)), "{transport}: {prefix}* left in /dev/shm");
    }
}

#[test]
fn a_rendezvous_port_that_is_no_port_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_collc"))
        .args(["run", "allreduce/ring", "--transport", "tcp", "-e", "1K"])
        .envs([("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "70000")])
        .env("COLLC_JOB_TOKEN", "0123456789abcdef0123456789abcdef")
        .output()
        .expect("collc runs");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("MASTER_PORT=`70000`"), "{}", text(&out.stderr));
}

#[test]
fn sigusr1_to_the_launcher_dumps_every_rank_and_the_job_goes_on() {
    use std::io::BufRead;
    let dumps = std::env::temp_dir().join(format!("collc-usr1-launcher-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dumps);
    let mut run = Command::new(env!("CARGO_BIN_EXE_collc"))
        .args(["run", "allreduce/ring", "--ranks", "2", "--transport", "shm", "-b", "8", "-e", "4M", "-n", "200"])
        .env("COLLC_DUMP_DIR", &dumps)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("collc runs");
    let mut lines = std::io::BufReader::new(run.stdout.take().expect("piped")).lines().map_while(Result::ok);
    let first_row = lines.by_ref().find(|l| !l.starts_with('#'));
    assert!(first_row.is_some(), "no row");
    // SAFETY: signalling the launcher this test started.
    unsafe { libc::kill(run.id() as i32, libc::SIGUSR1) };
    let rest: Vec<String> = lines.collect();
    let status = run.wait().expect("the run ends");
    assert_eq!(status.code(), Some(0), "{rest:?}");
    assert!(rest.iter().any(|l| l.starts_with("# Out of bounds values : 0 OK")), "{rest:?}");
    for rank in 0..2 {
        let dump = std::fs::read_to_string(dumps.join(format!("collc-fr-rank{rank}.json")))
            .unwrap_or_else(|e| panic!("rank {rank}'s dump: {e}"));
        assert!(dump.contains("\"reason\": \"SIGUSR1\""), "{dump}");
    }
    let _ = std::fs::remove_dir_all(&dumps);
}

#[test]
fn ctrl_c_on_a_process_job_is_reported_as_sigint() {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let mut run = Command::new(env!("CARGO_BIN_EXE_collc"))
        .args(["run", "allreduce/ring", "--ranks", "2", "--transport", "shm", "-b", "8", "-e", "256M", "-n", "20"])
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("collc runs");
    let mut lines = std::io::BufReader::new(run.stdout.take().expect("piped")).lines().map_while(Result::ok);
    assert!(lines.by_ref().filter(|l| !l.starts_with('#')).nth(1).is_some(), "no rows");
    // SAFETY: a terminal's Ctrl-C: SIGINT to the whole process group this test started.
    unsafe { libc::kill(-(run.id() as i32), libc::SIGINT) };
    let rest: Vec<String> = lines.collect();
    assert_eq!(run.wait().expect("the run ends").code(), Some(130), "{rest:?}");
    assert!(rest.iter().any(|l| l.starts_with("# interrupted by signal 2 ")), "{rest:?}");
}

/// The `COLLC_RANK` a spawned rank process was started with.
fn rank_of(pid: u32) -> Option<u32> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let var = environ.split(|&b| b == 0).find_map(|v| v.strip_prefix(b"COLLC_RANK=".as_slice()))?;
    std::str::from_utf8(var).ok()?.parse().ok()
}

#[test]
fn a_stopped_rank_is_the_one_every_survivor_names() {
    for (transport, victim) in [("shm", 1u32), ("shm", 2), ("tcp", 1), ("tcp", 3)] {
        let run = Command::new(env!("CARGO_BIN_EXE_collc"))
            .args(["run", "allreduce/ring", "--ranks", "4", "--transport", transport, "-b", "1M", "-e", "1M"])
            .args(["-n", "1000000", "-w", "0", "-c", "0", "--timeout", "3"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("collc runs");
        let started = Instant::now();
        let pid = loop {
            let ranks = children(run.id());
            if let Some(&pid) = ranks.iter().find(|&&pid| rank_of(pid) == Some(victim)) {
                if ranks.len() == 4 {
                    break pid;
                }
            }
            assert!(started.elapsed() < Duration::from_secs(10), "the rank processes did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        // Inside the timed loop, then stopped as a debugger or the OOM killer's freezer would.
        std::thread::sleep(Duration::from_millis(1500));
        // SAFETY: stopping a child process of the run we started; the launcher kills it once the others fail.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        let out = run.wait_with_output().expect("the run ends");
        let stderr = text(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{stderr}");
        let naming = stderr.lines().filter(|l| l.contains(&format!("rank {victim} did not go on within the timeout")));
        // Every survivor but the one that timed out first (it names whom it waited for) hears of the stopped rank.
        assert!(naming.count() >= 2, "{transport}: rank {victim} was stopped:\n{stderr}");
    }
}

#[test]
fn a_second_process_claiming_a_rank_is_told_it_has_already_joined() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a port").port();
    let rank = |rank: &str| {
        Command::new(env!("CARGO_BIN_EXE_collc"))
            .args(["run", "allreduce/ring", "--transport", "tcp", "-b", "8", "-e", "8", "-n", "100000000"])
            .args(["-w", "0", "-c", "0", "--timeout", "5"])
            .envs([("RANK", rank), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1")])
            .env("MASTER_PORT", port.to_string())
            .env("COLLC_JOB_TOKEN", "0123456789abcdef0123456789abcdef")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("collc runs")
    };
    let first = [rank("0"), rank("1")];
    std::thread::sleep(Duration::from_millis(500));
    let second = rank("1").wait_with_output().expect("the duplicate ends");
    let stderr = text(&second.stderr);
    assert_ne!(second.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("rank 1 has already joined this job"), "{stderr}");
    assert!(!stderr.contains("its process is gone"), "{stderr}");
    // The job itself goes on: the duplicate was turned away at the door.
    for mut child in first {
        assert!(child.try_wait().expect("try_wait").is_none(), "a rank of the job ended");
        let _ = child.kill();
        let _ = child.wait();
    }
}
