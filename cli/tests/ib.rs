//! The ib transport end to end where no RDMA device is: `collc` (built with the `ib` feature) on the software verbs
//! library (`collc_runtime::build_soft_verbs`), put first on `LD_LIBRARY_PATH`, so collc's own verbs code runs as
//! on a NIC: every library algorithm x dtype x op at 2 and 4 ranks on one host, ranks across two network namespaces
//! under torchrun's environment, the faults the library injects, and a machine with no device at all.
#![cfg(feature = "ib")]

mod netns;

use netns::{printed, wait_within, Hosts, Job, Launcher};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

/// The directory holding the library, built once per test process.
fn library_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ib-soft-verbs");
        collc_runtime::build_soft_verbs(&dir).unwrap_or_else(|e| panic!("{e}"));
        dir
    })
}

fn library_path() -> String {
    let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    format!("{}:{path}", library_dir().display())
}

/// `collc ARGS` on the software library.
fn collc(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_collc"))
        .args(args)
        .env("LD_LIBRARY_PATH", library_path())
        .env("COLLC_TIMEOUT", "30")
        .envs(env.iter().copied())
        .output()
        .expect("collc runs")
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// The library's algorithms, as `collc list` names them.
fn library_algorithms() -> Vec<String> {
    let list = collc(&["list"], &[]);
    let algorithms: Vec<String> = text(&list)
        .lines()
        .skip(1)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|name| name.contains('/'))
        .map(String::from)
        .collect();
    assert!(algorithms.len() >= 20, "{}", text(&list));
    algorithms
}

/// Every library algorithm, every dtype and op, in and out of place, at 2 and 4 rank processes over ib: every row
/// checked, 0 wrong.
#[test]
fn every_library_algorithm_dtype_and_op_runs_right_over_ib_at_2_and_4_ranks() {
    let algorithms = library_algorithms();
    let mut runs = 0;
    for ranks in ["2", "4"] {
        for algorithm in &algorithms {
            let args =
                ["run", algorithm.as_str(), "--transport", "ib", "--ranks", ranks, "-b", "8", "-e", "2K", "-f", "16"];
            let out = collc(&[&args[..], &["-n", "1", "-w", "0", "-c", "1", "-d", "all", "-o", "all"]].concat(), &[]);
            let said = text(&out);
            if !out.status.success() && said.contains("does not compile for") {
                continue;
            }
            assert!(out.status.success(), "{algorithm} at {ranks} ranks: {said}");
            assert!(
                said.contains("transport ib") && said.contains("# Out of bounds values : 0 OK"),
                "{algorithm}: {said}"
            );
            runs += 1;
        }
    }
    assert!(runs >= 40, "{runs} runs");
}

/// Without any RDMA device (the system's libibverbs, no device): every rank exits 1 saying so, and where it looked.
#[test]
fn without_an_rdma_device_ib_exits_1_saying_so() {
    let out = Command::new(env!("CARGO_BIN_EXE_collc"))
        .args(["run", "allreduce/ring", "--transport", "ib", "--ranks", "2", "-b", "8", "-e", "8", "-n", "1"])
        .env("COLLC_TIMEOUT", "20")
        .output()
        .expect("collc runs");
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("rank 0: no RDMA device was found") && said.contains("/sys/class/infiniband"), "{said}");
}

/// Two hosts (network namespaces) under torchrun's environment: the software devices reach each other over the
/// namespaces' network, every library algorithm, dtype and op at two ranks a host, and one rank a host with a queue
/// pair per link. Then the faults: a write refused as by a wrong rkey, and a peer whose
/// library exits mid-call (a vanished host), each an error on every rank naming a rank, the instruction and the
/// `.coll` line, within the timeout (and the others the library injects).
#[test]
fn ranks_on_two_hosts_run_over_ib_and_faults_are_named_on_every_rank() {
    let hosts = Hosts::new(2);
    let path = library_path();
    let env = [("LD_LIBRARY_PATH", path.as_str()), ("COLLC_TIMEOUT", "20")];
    // Every library algorithm, dtype and op at 4 ranks, two on each host: ranks of a host through the library's
    // shared-memory pipe, the hosts through TCP.
    let mut runs = 0;
    for algorithm in library_algorithms() {
        let args =
            [&algorithm, "--transport", "ib", "-b", "8", "-e", "2K", "-f", "16", "-n", "1", "-w", "0", "-c", "1"];
        let args = [&args[..], &["-d", "all", "-o", "all"]].concat();
        let job = Job::start_on(&hosts, &[0, 0, 1, 1], Launcher::Torchrun, &args, &env, |_, _| ());
        let outputs = wait_within(job, LIMIT, &algorithm);
        if outputs.iter().any(|out| printed(out).contains("does not compile for")) {
            continue;
        }
        for (rank, out) in outputs.iter().enumerate() {
            assert!(out.status.success(), "{algorithm} rank {rank}: {}", printed(out));
        }
        let table = printed(&outputs[0]);
        assert!(table.contains("4 ranks, transport ib") && table.contains("# Out of bounds values : 0 OK"), "{table}");
        runs += 1;
    }
    assert!(runs >= 20, "{runs} runs");
    // A queue pair per link (NCCL's per connection) in place of one per pair of ranks.
    let args =
        ["allreduce/ring", "--transport", "ib", "-b", "8", "-e", "1M", "-f", "32", "-n", "2", "-w", "1", "-c", "1"];
    let env = [&env[..], &[("COLLC_IB_QPS", "link"), ("COLLC_DEBUG", "INFO")]].concat();
    let outputs = wait_within(Job::start(&hosts, 2, Launcher::Torchrun, &args, &env, |_| Vec::new()), LIMIT, "link");
    for (rank, out) in outputs.iter().enumerate() {
        let said = printed(out);
        assert!(out.status.success() && said.contains("a queue pair for channel 0 lane 0"), "rank {rank}: {said}");
    }
    assert!(printed(&outputs[0]).contains("# Out of bounds values : 0 OK"), "{}", printed(&outputs[0]));
    let args = ["allreduce/ring", "--transport", "ib", "-b", "64K", "-e", "64K", "-n", "1000", "-w", "1", "-c", "0"];
    // From its 40th request, inside the timed calls: rank 1's library refuses writes (as a wrong rkey), exits
    // mid-call, answers nothing (rank 0's short IB timeout then exceeds its retries), finds no receive posted for
    // ever (RNR: retried without end, the collective's timeout ends it), or moves its queue pair to the error state.
    let faults = [
        ("access@40", "remote access error"),
        ("vanish@40", "rank 1"),
        ("silent@40", "rank 1"),
        ("rnr@40", "rank 1"),
        ("error@40", "rank "),
    ];
    let env = [("LD_LIBRARY_PATH", path.as_str()), ("COLLC_TIMEOUT", "5")];
    for (fault, says) in faults {
        let rank_one = |rank: usize, command: &mut Command| {
            match rank {
                1 => command.env("COLLC_SOFT_IB_FAULT", fault),
                _ => command.env("COLLC_IB_TIMEOUT", "8").env("COLLC_IB_RETRY_CNT", "1"),
            };
        };
        let job = Job::start_on(&hosts, &[0, 1], Launcher::Torchrun, &args, &env, rank_one);
        let outputs = wait_within(job, LIMIT, fault);
        for (rank, out) in outputs.iter().enumerate() {
            let said = printed(out);
            assert!(!out.status.success(), "{fault}: rank {rank} succeeded: {said}");
            if fault.starts_with("vanish") && rank == 1 {
                continue;
            }
            assert!(said.contains(&format!("rank {rank}:")) && said.contains(says), "{fault}: rank {rank}: {said}");
            assert!(said.contains("instruction #") && said.contains(" line "), "{fault}: rank {rank}: {said}");
        }
    }
}

/// On a RoCE NIC's GID table (link-local GIDs first), the transport picks the first RoCE v2 GID with an IPv4 address
/// unless told; a link-local one (`COLLC_IB_GID_INDEX=1`) reaches no peer: every rank fails at setup saying which
/// GID it used and how to choose another.
#[test]
fn roce_gids_are_chosen_as_nccl_does_and_a_wrong_index_is_named() {
    let args =
        ["run", "allreduce/ring", "--transport", "ib", "--ranks", "2", "-b", "8", "-e", "1K", "-n", "1", "-c", "1"];
    let out = collc(&args, &[("COLLC_SOFT_IB_GID_TABLE", "roce")]);
    assert!(out.status.success() && text(&out).contains("0 OK"), "{}", text(&out));
    let out = collc(&args, &[("COLLC_SOFT_IB_GID_TABLE", "roce"), ("COLLC_IB_GID_INDEX", "1")]);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("RTR failed") && said.contains("its source GID is index 1 of soft_ib0:1"), "{said}");
}

/// The CUDA driver for the CPU, built once per test process, and the PTX cache its ranks share: the library path
/// with it and the software verbs library first, and the cache directory.
#[cfg(feature = "cuda")]
fn host_gpus() -> (String, String) {
    static DONE: OnceLock<(String, String)> = OnceLock::new();
    DONE.get_or_init(|| {
        let driver = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ib-host-gpu");
        collc_runtime::build_host_driver(&driver).unwrap_or_else(|e| panic!("{e}"));
        let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ib-host-gpu-cache").display().to_string();
        let path = format!("{}:{}", driver.display(), library_path());
        // The kernels compiled once into the cache, not by every rank at once under the timeout.
        let warm = collc(&["gpu", "info"], &[("LD_LIBRARY_PATH", path.as_str()), ("XDG_CACHE_HOME", cache.as_str())]);
        assert!(warm.status.success(), "{}", text(&warm));
        (path, cache)
    })
    .clone()
}

/// The hardware script (`tests/ib/run.sh`, what a machine with a NIC runs), small, on the software library: its
/// matrix passes and its sweep prints busbw against the line rate; with the CUDA driver for the CPU, its device
/// ranks run over ib with GPUDirect RDMA and staged.
#[test]
fn the_hardware_script_passes_on_the_software_library() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/ib/run.sh");
    let mut command = Command::new("bash");
    command
        .arg(&script)
        .arg(env!("CARGO_BIN_EXE_collc"))
        .env("LD_LIBRARY_PATH", library_path())
        .envs([("RANKS", "2"), ("ALGOS", "allreduce/ring alltoall/pairwise"), ("SIZES", "-b 8 -e 1K -f 32")])
        .envs([("SWEEP", "-b 64K -e 256K -f 4 -n 2 -w 1"), ("LINE_GBPS", "50")]);
    #[cfg(feature = "cuda")]
    let (path, cache) = host_gpus();
    #[cfg(feature = "cuda")]
    command
        .envs([("LD_LIBRARY_PATH", path.as_str()), ("XDG_CACHE_HOME", cache.as_str()), ("COLLC_HOST_GPUS", "2")])
        .envs([("GPU_ALGOS", "allreduce/ring"), ("GPU_SIZES", "-b 8 -e 64K -f 64"), ("GPU_BYTES", "1M")]);
    let out = command.output().expect("bash runs");
    let said = text(&out);
    assert!(out.status.success() && said.ends_with("PASS\n"), "{said}");
    assert!(said.contains("matrix: 2 runs, ") && said.contains(" 0 wrong"), "{said}");
    assert!(said.contains("262144 B  busbw") && said.contains("of the line rate 50.0 GB/s"), "{said}");
    #[cfg(feature = "cuda")]
    for says in [
        "== 3. device ranks over ib, 2 hosts x 2, COLLC_IB_GDR=auto",
        "GPU Direct RDMA enabled",
        "GPU Direct RDMA disabled (COLLC_IB_GDR=0)",
        "1048576 B  busbw",
    ] {
        assert!(said.contains(says), "{says}: {said}");
    }
}

/// How long one run may take (a debug build on two cores).
const LIMIT: Duration = Duration::from_secs(120);

/// Device ranks (the CUDA driver for the CPU, two GPUs a host) on two hosts (network namespaces) over ib, under
/// torchrun's environment: the GPUs of a host over CUDA IPC, the hosts over verbs. First with GPUDirect RDMA (each
/// record's slots device memory the library registers from its dma-buf and reaches through its own mapping of it),
/// then with a driver that exports no dma-buf (staged through host memory, with one WARN saying why), each with
/// every row checked; then `COLLC_IB_GDR=1` where it cannot be: an error on every rank saying why. Then a peer
/// whose library refuses its writes (as a wrong rkey), and one whose library exits mid-call: every rank fails
/// naming a rank, the instruction and the line.
#[cfg(feature = "cuda")]
#[test]
fn device_ranks_on_two_hosts_run_over_ib_with_gpudirect_and_staged() {
    let (path, cache) = host_gpus();
    let hosts = Hosts::new(2);
    let placement = [0, 0, 1, 1];
    let common = [
        ("LD_LIBRARY_PATH", path.as_str()),
        ("XDG_CACHE_HOME", cache.as_str()),
        ("COLLC_HOST_GPUS", "2"),
        ("COLLC_DEBUG", "INFO"),
        ("COLLC_TIMEOUT", "60"),
    ];
    let run = |algorithm: &str, env: &[(&str, &str)]| {
        let args =
            [algorithm, "--transport", "cuda", "-b", "8", "-e", "256K", "-f", "32", "-n", "1", "-w", "1", "-c", "1"];
        let env = [&common[..], env].concat();
        let job = Job::start_on(&hosts, &placement, Launcher::Torchrun, &args, &env, |_, _| ());
        wait_within(job, Duration::from_secs(180), algorithm)
    };
    for (env, says) in [
        (&[][..], "NET/IB: GPU Direct RDMA enabled (dma-buf)"),
        (&[("COLLC_HOST_GPU_DMABUF", "0")][..], "or its driver does not support dma-buf); staging through host memory"),
    ] {
        for algorithm in ["allreduce/ring", "allreduce/recursive_doubling", "allgather/ring", "alltoall/pairwise"] {
            let outputs = run(algorithm, env);
            for (rank, out) in outputs.iter().enumerate() {
                let said = printed(out);
                assert!(out.status.success(), "{algorithm} {env:?} rank {rank}: {said}");
                assert!(said.contains(says), "{algorithm} {env:?} rank {rank}: {said}");
            }
            let (zero, one) = (printed(&outputs[0]), printed(&outputs[1]));
            assert!(
                zero.contains("4 ranks, transport cuda") && zero.contains("# Out of bounds values : 0 OK"),
                "{zero}"
            );
            if algorithm == "allreduce/ring" {
                assert!(one.contains("rank 1: connected to rank 2 via NET/IB/soft_ib0:1"), "{one}");
                assert!(!zero.contains("connected to rank 1 via NET"), "ranks of one host use IPC: {zero}");
            }
        }
    }
    let outputs = run("allreduce/ring", &[("COLLC_HOST_GPU_DMABUF", "0"), ("COLLC_IB_GDR", "1")]);
    for (rank, out) in outputs.iter().enumerate() {
        let said = printed(out);
        assert!(!out.status.success(), "rank {rank}: {said}");
        assert!(said.contains("COLLC_IB_GDR=1, but GPUDirect RDMA cannot be used"), "rank {rank}: {said}");
    }
    let args = ["allreduce/ring", "--transport", "cuda", "-b", "64K", "-e", "64K", "-n", "1000", "-w", "1", "-c", "0"];
    let env = [&common[..], &[("COLLC_TIMEOUT", "10")]].concat();
    // Both from a request well inside the timed calls (not between the warm-up and them, where a rank waits in a
    // barrier, not at an instruction).
    for (fault, victim) in [("access@40", 2), ("vanish@40", 3)] {
        let faulty = |rank: usize, command: &mut Command| {
            if rank == victim {
                command.env("COLLC_SOFT_IB_FAULT", fault);
            }
        };
        let job = Job::start_on(&hosts, &placement, Launcher::Torchrun, &args, &env, faulty);
        let outputs = wait_within(job, Duration::from_secs(120), fault);
        for (rank, out) in outputs.iter().enumerate() {
            let said = printed(out);
            assert!(!out.status.success(), "{fault}: rank {rank} succeeded: {said}");
            if fault.starts_with("vanish") && rank == victim {
                continue;
            }
            assert!(said.contains(&format!("rank {rank}:")) && said.contains("rank "), "{fault}: rank {rank}: {said}");
            assert!(said.contains("instruction #") && said.contains(" line "), "{fault}: rank {rank}: {said}");
        }
        if fault.starts_with("access") {
            assert!(printed(&outputs[1]).contains("remote access error"), "{}", printed(&outputs[1]));
        }
    }
}
