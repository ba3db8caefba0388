//! The cuda transport end to end where no GPU is: `collc` (built with the `cuda` feature) on a CUDA driver for the
//! CPU (`collc_runtime::build_host_driver`: the driver entry points collc calls, over host memory, running the
//! CUDA kernels compiled for the CPU), put first on `LD_LIBRARY_PATH`. The fabrics, the launcher, device buffers,
//! CUDA IPC between rank processes, `collc gpu` and `tests/gpu/run.sh` run as on a GPU; the speed is the CPU's.
#![cfg(feature = "cuda")]

mod netns;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The directory holding the driver, built once per test process.
fn driver_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("host-gpu");
        collc_runtime::build_host_driver(&dir).unwrap_or_else(|e| panic!("{e}"));
        // NVRTC's seconds once, here, rather than in every rank process at once under another test's timeout:
        // `gpu info` opens GPU 0, which compiles the kernels into the cache the tests share.
        let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
        let warm = Command::new(env!("CARGO_BIN_EXE_collc"))
            .args(["gpu", "info"])
            .env("LD_LIBRARY_PATH", format!("{}:{path}", dir.display()))
            .env("XDG_CACHE_HOME", cache_dir())
            .output()
            .expect("collc runs");
        assert!(warm.status.success(), "{}", text(&warm));
        dir
    })
}

/// The PTX cache the tests share (the driver for the CPU checks that the PTX is the kernels').
fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("host-gpu-cache")
}

/// `collc` with the driver for the CPU first on the library path.
fn collc(args: &[&str], env: &[(&str, &str)]) -> Output {
    let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    Command::new(env!("CARGO_BIN_EXE_collc"))
        .args(args)
        .env("LD_LIBRARY_PATH", format!("{}:{path}", driver_dir().display()))
        .env("XDG_CACHE_HOME", cache_dir())
        .env("COLLC_TIMEOUT", "30")
        .envs(env.iter().copied())
        .output()
        .expect("collc runs")
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// `collc gpu info` finds the driver, names the device and the libraries it loaded from the driver's directory.
#[test]
fn gpu_info_reports_the_driver_and_the_libraries_loaded() {
    let out = collc(&["gpu", "info"], &[]);
    let text = text(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("collc host GPU 0"), "{text}");
    assert!(text.contains(&driver_dir().display().to_string()), "the libcuda.so loaded: {text}");
}

/// The device script itself (`tests/gpu/run.sh`, what a GPU machine runs), small: the matrix of every library
/// algorithm x dtype x op at 2 and 4 rank threads, the same as 2 rank processes through CUDA IPC, two algorithms
/// from rank processes on two "hosts" (2 x 1 and 2 x 2, through the network proxy), and `collc gpu bench`; every row
/// checked against the collective's definition.
#[test]
fn the_device_script_passes_on_the_driver_for_the_cpu() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/gpu/run.sh");
    let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let out = Command::new("bash")
        .arg(&script)
        .arg(env!("CARGO_BIN_EXE_collc"))
        .env("LD_LIBRARY_PATH", format!("{}:{path}", driver_dir().display()))
        .env("XDG_CACHE_HOME", cache_dir())
        .envs([("RANKS", "2 4"), ("SIZES", "-b 8 -e 4K -f 8"), ("IPC_SIZES", "-b 8 -e 4K -f 8")])
        .envs([("HOSTS_SIZES", "-b 8 -e 4K -f 8"), ("HOSTS_ALGOS", "allreduce/ring alltoall/pairwise")])
        .env("BENCH_BYTES", "1M")
        .output()
        .expect("bash runs");
    let text = text(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("== done in") && text.ends_with("PASS\n"), "{text}");
    let runs = |label: &str| -> u32 {
        let line = text.lines().find(|l| l.starts_with(label)).unwrap_or_else(|| panic!("no `{label}`: {text}"));
        line[label.len()..].split_whitespace().next().and_then(|n| n.parse().ok()).expect("a count")
    };
    assert!(runs("matrix: ") >= 40, "{text}");
    assert!(text.contains(" 0 wrong\n"), "{text}");
    assert!(runs("ipc matrix: ") >= 20 && text.contains("ipc matrix: ") && text.contains(" 0 failed"), "{text}");
    assert!(runs("hosts matrix: ") == 4 && text.contains("hosts matrix: 4 runs, 0 failed"), "{text}");
    assert!(text.contains("allreduce 8 B x 8 ranks:") && text.contains("HBM bound"), "{text}");
    // The rank processes' jobs (`gpuipc<pid>_<n>`) left no shared memory behind.
    assert_eq!(leftovers("gpuipc"), Vec::<String>::new());
}

/// The entries of /dev/shm whose names contain `job`.
fn leftovers(job: &str) -> Vec<String> {
    let entries = std::fs::read_dir("/dev/shm").map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default();
    entries.iter().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.contains(job)).collect()
}

/// Two GPUs with peer access run ranks across both (system-scope fences, records on the receiver's GPU); without
/// peer access the run fails at once, saying so and what to do.
#[test]
fn ranks_on_two_gpus_need_peer_access() {
    let gpus = [("COLLC_HOST_GPUS", "2")];
    let args = ["run", "allreduce/ring", "--ranks", "4", "--transport", "cuda", "-d", "all", "-o", "all"];
    let out = collc(&[&args[..], &["-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-w", "1", "-c", "1"]].concat(), &gpus);
    let said = text(&out);
    assert!(out.status.success() && said.contains("# Out of bounds values : 0 OK"), "{said}");
    // PreMulSum through the device interpreter: each rank's input multiplied where the schedule first reads it.
    let premul =
        [&args[..6], &["-d", "all", "-o", "premulsum:3", "-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-c", "1"]];
    let out = collc(&premul.concat(), &gpus);
    let said = text(&out);
    assert!(
        out.status.success() && said.contains("mulsum") && said.contains("# Out of bounds values : 0 OK"),
        "{said}"
    );
    // A user's operator is compiled into the kernels by NVRTC and loaded as a module of its own; this driver, whose
    // kernels are built in, refuses that module, and the run fails on every rank naming the operator.
    let ops = std::env::temp_dir().join(format!("collc-gpu-host-ops-{}.coll", std::process::id()));
    std::fs::write(&ops, "op absmax(a, b) = max(abs(a), abs(b))\n").expect("a temporary file");
    let user = [&args[..6], &["--ops", ops.to_str().expect("utf-8"), "-o", "absmax", "-b", "8", "-e", "8", "-n", "1"]];
    let out = collc(&user.concat(), &gpus);
    let _ = std::fs::remove_file(&ops);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("the kernels compiled with the operator `absmax`") && said.contains("NOT_SUPPORTED"),
        "{said}"
    );
    let out = collc(&args, &[gpus[0], ("COLLC_HOST_GPU_PEER", "0")]);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("GPU 0 cannot access GPU 1's memory") && said.contains("COLLC_CUDA_GPUS=1"), "{said}");
}

/// Device memory the job does not fit in is an error at setup naming the allocation and the GPU, not a crash.
#[test]
fn out_of_device_memory_at_setup_is_an_error() {
    let args = ["run", "allreduce/ring", "--ranks", "2", "--transport", "cuda", "-b", "4M", "-e", "4M", "-c", "1"];
    let out = collc(&args, &[("COLLC_HOST_GPU_MEMORY", "1048576")]);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("cuMemAlloc of") && said.contains("on GPU 0: out of memory"), "{said}");
}

/// The Communicator API on device buffers, in a child process of this test binary that loads the driver for the
/// CPU (the loader reads LD_LIBRARY_PATH when a process starts): a correct allreduce of every rank's
/// `DeviceBuffer`s; then a host address passed as a device pointer, a device buffer smaller than the call needs and
/// host buffers, each an error on the rank that made it and a peer failure naming it on the other, never a hang.
#[test]
fn device_buffers_through_the_api() {
    if std::env::var_os("COLLC_HOST_GPU_CHILD").is_some() {
        return api_child();
    }
    let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let out = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["device_buffers_through_the_api", "--exact", "--nocapture", "--test-threads=1"])
        .env("LD_LIBRARY_PATH", format!("{}:{path}", driver_dir().display()))
        .env("XDG_CACHE_HOME", cache_dir())
        .env("COLLC_HOST_GPU_CHILD", "1")
        .output()
        .expect("the test binary runs");
    let said = text(&out);
    assert!(out.status.success() && said.contains("api child: 4 cases checked"), "{said}");
}

fn api_child() {
    use collc_runtime::cuda::DeviceBuffer;
    use collc_runtime::{Buffers, CallShape, Collective, Communicator, DataType, DevicePtr, Options, ReduceOp};
    let count = 1000usize;
    let shape = CallShape {
        collective: Collective::AllReduce,
        count,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        root: 0,
        peer: 0,
    };
    let options = Options { timeout: std::time::Duration::from_secs(20), ..Options::default() };
    // Each case: what rank 0 passes (rank 1 passes good buffers), and what rank 0's error must say.
    let cases: [(&str, &str); 4] = [
        ("good", ""),
        ("host address", "is not device memory"),
        ("small", "recv"),
        ("host buffers", "got host buffers"),
    ];
    for (case, want) in cases {
        let comms = Communicator::cuda(2, options.clone()).unwrap_or_else(|e| panic!("{e}"));
        let results: Vec<Result<Vec<f32>, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|mut comm| {
                    s.spawn(move || {
                        let rank = comm.rank();
                        let bytes = count * 4;
                        let input: Vec<u8> =
                            (0..count).flat_map(|i| ((i as u32 * 2 + rank) as f32).to_le_bytes()).collect();
                        let send = DeviceBuffer::new(&comm, bytes).map_err(|e| e.to_string())?;
                        send.write(0, &input).map_err(|e| e.to_string())?;
                        let recv = DeviceBuffer::new(&comm, bytes).map_err(|e| e.to_string())?;
                        let mut host = vec![0u8; bytes];
                        let outcome = match (rank, case) {
                            (0, "host address") => comm.call(
                                shape,
                                Buffers::DeviceOutOfPlace {
                                    send: send.ptr(),
                                    recv: DevicePtr { addr: host.as_mut_ptr() as u64, bytes },
                                },
                            ),
                            (0, "small") => comm.call(
                                shape,
                                Buffers::DeviceOutOfPlace { send: send.ptr(), recv: recv.slice(0, bytes - 4) },
                            ),
                            (0, "host buffers") => {
                                comm.call(shape, Buffers::OutOfPlace { send: &input, recv: &mut host })
                            }
                            _ => comm.call(shape, Buffers::DeviceOutOfPlace { send: send.ptr(), recv: recv.ptr() }),
                        };
                        outcome.map_err(|e| e.to_string())?;
                        recv.read(0, &mut host).map_err(|e| e.to_string())?;
                        Ok(host.chunks(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a rank thread")).collect()
        });
        if case == "good" {
            for result in &results {
                let got = result.as_ref().unwrap_or_else(|e| panic!("{e}"));
                assert!(got.iter().enumerate().all(|(i, &v)| v == (i * 4 + 1) as f32), "{got:?}");
            }
        } else {
            let mine = results[0].as_ref().err().unwrap_or_else(|| panic!("{case}: rank 0 succeeded"));
            assert!(mine.contains("rank 0") && mine.contains(want), "{case}: {mine}");
            let theirs = results[1].as_ref().err().unwrap_or_else(|| panic!("{case}: rank 1 succeeded"));
            assert!(theirs.contains("rank 0"), "{case}: rank 1 says {theirs}");
            println!("{case}: rank 0: {mine}\n{case}: rank 1: {theirs}");
        }
    }
    println!("api child: {} cases checked", cases.len());
}

/// Two rank processes sharing device memory through CUDA IPC: one killed mid-run (once rank 0 has printed a row,
/// so both are past setup), the other stops with an error naming it (from the host's health checks while its
/// kernel waits), well within the timeout, and writes its flight recorder's dump with the device interpreter's
/// state of every instruction.
#[test]
fn a_rank_process_that_dies_is_named_by_the_other() {
    use std::io::BufRead;
    let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let job = format!("hostgpukill{}", std::process::id());
    let dumps = std::env::temp_dir().join(format!("collc-gpu-host-dumps-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dumps);
    let spawn = |rank: &str| {
        Command::new(env!("CARGO_BIN_EXE_collc"))
            .args(["run", "allreduce/ring", "--transport", "cuda", "-b", "8", "-e", "64K", "-f", "2", "-n", "20000"])
            .args(["-w", "1", "-c", "0"])
            .env("LD_LIBRARY_PATH", format!("{}:{path}", driver_dir().display()))
            .env("XDG_CACHE_HOME", cache_dir())
            .envs([("COLLC_RANK", rank), ("COLLC_WORLD_SIZE", "2"), ("COLLC_JOB", &job), ("COLLC_TIMEOUT", "120")])
            .env("COLLC_DUMP_DIR", &dumps)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("collc starts")
    };
    let (mut survivor, mut victim) = (spawn("0"), spawn("1"));
    let stdout = survivor.stdout.take().expect("piped");
    let (lines, rows) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut seen = String::new();
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            seen.push_str(&line);
            seen.push('\n');
            let _ = lines.send(line);
        }
        seen
    });
    let first_row = std::time::Instant::now();
    loop {
        match rows.recv_timeout(std::time::Duration::from_secs(120)) {
            Ok(line) if line.trim_start().starts_with(|c: char| c.is_ascii_digit()) => break,
            Ok(_) => continue,
            Err(e) => panic!("no row from rank 0 in {:?}: {e}", first_row.elapsed()),
        }
    }
    // Into the next size's timed calls (past the all-gather of its IPC handles), so the kill lands in a launch.
    std::thread::sleep(std::time::Duration::from_millis(300));
    victim.kill().expect("rank 1 is killed");
    let _ = victim.wait();
    let started = std::time::Instant::now();
    let out = survivor.wait_with_output().expect("rank 0 ends");
    let said = reader.join().expect("the reader") + &text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("error: rank 0:") && said.contains("rank 1 died"), "{said}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30), "{:?}: {said}", started.elapsed());
    assert_eq!(leftovers(&job), Vec::<String>::new(), "the survivor removes the job's shared memory");
    let dump = std::fs::read_to_string(dumps.join("collc-fr-rank0.json")).unwrap_or_else(|e| panic!("{e}: {said}"));
    let _ = std::fs::remove_dir_all(&dumps);
    let dump: serde_json::Value = serde_json::from_str(&dump).expect("a dump is JSON");
    assert_eq!(dump["reason"], "peer failed", "{dump}");
    let instructions = dump["current"]["instructions"].as_array().expect("the call's instructions");
    assert!(!instructions.is_empty(), "{dump}");
    assert!(instructions.iter().all(|i| ["done", "waiting"].contains(&i["state"].as_str().unwrap_or(""))), "{dump}");
}

/// Device ranks on two hosts (network namespaces) of two GPUs each, under a torchrun environment: `collc run
/// --transport cuda` on every rank, the GPUs of one host over CUDA IPC, the hosts through each process's network
/// proxy. With `--host-pinned BYTES` on rank `r`, that rank's driver has no more host-mapped memory than that.
mod across_hosts {
    use super::netns::{assert_survivors_fail, printed, signal, wait_within, Hosts, Job, Launcher, ONE_OF_EACH_OTHER};
    use super::{cache_dir, driver_dir};
    use std::process::{Command, Output};
    use std::time::Duration;

    /// Ranks 0, 1 on host 0 and 2, 3 on host 1.
    const PLACEMENT: [usize; 4] = [0, 0, 1, 1];

    fn start(hosts: &Hosts, args: &[&str], env: &[(&str, &str)], per_rank: impl Fn(usize, &mut Command)) -> Job {
        let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
        let library = format!("{}:{path}", driver_dir().display());
        let cache = cache_dir().display().to_string();
        let mut all = vec![("LD_LIBRARY_PATH", library.as_str()), ("XDG_CACHE_HOME", &cache), ("COLLC_HOST_GPUS", "2")];
        all.extend_from_slice(env);
        Job::start_on(hosts, &PLACEMENT, Launcher::Torchrun, args, &all, per_rank)
    }

    fn run_checked(hosts: &Hosts, algorithm: &str) -> Vec<Output> {
        let args = [algorithm, "--transport", "cuda", "-b", "8", "-e", "256K", "-f", "32", "-n", "1", "-w", "1"];
        let env = [("COLLC_TIMEOUT", "60"), ("COLLC_DEBUG", "INFO")];
        let outputs = wait_within(start(hosts, &[&args[..], &["-c", "1"]].concat(), &env, |_, _| ()), LIMIT, algorithm);
        for (rank, out) in outputs.iter().enumerate() {
            assert!(out.status.success(), "{algorithm} rank {rank}: {}\n{}", out.status, printed(out));
        }
        let table = printed(&outputs[0]);
        assert!(table.contains("4 ranks, transport cuda"), "{algorithm}: {table}");
        assert!(table.contains("# Out of bounds values : 0 OK"), "{algorithm}: {table}");
        outputs
    }

    /// How long one run may take on the driver for the CPU, four rank processes on two cores.
    const LIMIT: Duration = Duration::from_secs(180);

    /// Every library allreduce and one algorithm of each other collective, every row checked: 0 wrong. The ranks
    /// of a host reach each other through IPC and the other host's through the proxy (its sockets named at INFO).
    #[test]
    fn every_library_allreduce_and_one_of_each_collective_run_on_two_hosts_of_two_gpus() {
        let hosts = Hosts::new(2);
        let ring = run_checked(&hosts, "allreduce/ring");
        // The ring's hops 1 -> 2 and 3 -> 0 cross the hosts; 0 -> 1 and 2 -> 3 stay on them.
        let (zero, one) = (printed(&ring[0]), printed(&ring[1]));
        assert!(one.contains("rank 1: connected to rank 2 via NET/Socket"), "{one}");
        assert!(zero.contains("rank 0: connected to rank 3 via NET/Socket"), "{zero}");
        assert!(!zero.contains("connected to rank 1 via NET"), "ranks of one host use IPC: {zero}");
        for name in ["tree", "one_shot", "two_shot", "rabenseifner", "recursive_doubling", "naive", "hierarchical"] {
            run_checked(&hosts, &format!("allreduce/{name}"));
        }
        for algorithm in ONE_OF_EACH_OTHER {
            run_checked(&hosts, algorithm);
        }
    }

    /// A run that lasts until something stops it.
    const ENDLESS: [&str; 13] =
        ["allreduce/ring", "--transport", "cuda", "-b", "64K", "-e", "64K", "-n", "1000000", "-w", "1", "-c", "0"];

    /// A rank killed on the other host is named by every survivor, on both hosts, within the timeout, and `collc
    /// fr analyze` reads the survivors' dumps: it finds the dead rank missing. A host cut off (its link down): the
    /// other host's ranks name a rank of it once they time out. A rank short of host-mapped memory for its
    /// connections to the other host: an error on every rank naming it.
    #[test]
    fn a_device_rank_killed_or_cut_off_on_the_other_host_is_named_by_every_survivor() {
        let hosts = Hosts::new(2);
        let dumps = std::env::temp_dir().join(format!("collc-gpu-hosts-dumps-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dumps);
        let dir = dumps.display().to_string();
        let env = [("COLLC_TIMEOUT", "10"), ("COLLC_DUMP_DIR", dir.as_str())];
        let job = start(&hosts, &ENDLESS, &env, |_, _| ());
        std::thread::sleep(Duration::from_secs(8));
        signal(&job.ranks[3], libc::SIGKILL);
        let outputs = wait_within(job, Duration::from_secs(15), "SIGKILL of rank 3");
        assert_survivors_fail(&outputs, &[0, 1, 2], "rank 3", "SIGKILL of rank 3");
        let analyze = Command::new(env!("CARGO_BIN_EXE_collc")).args(["fr", "analyze", &dir]).output().expect("runs");
        let _ = std::fs::remove_dir_all(&dumps);
        let report = printed(&analyze);
        assert!(analyze.status.success(), "{report}");
        assert!(report.contains("3 of 4 ranks dumped") && report.contains("rank 3: MISSING"), "{report}");
        assert!(report.contains("for a message from rank 3"), "the survivors' device state: {report}");

        let job = start(&hosts, &ENDLESS, &[("COLLC_TIMEOUT", "5")], |_, _| ());
        std::thread::sleep(Duration::from_secs(8));
        hosts.link_down(1);
        let outputs = wait_within(job, Duration::from_secs(30), "host 1 cut off");
        for rank in [0, 1] {
            let text = printed(&outputs[rank]);
            assert!(text.contains("rank 2 did not go on") || text.contains("rank 3 did not go on"), "{text}");
        }
        assert_survivors_fail(&outputs, &[0, 1], "did not go on", "host 1 cut off");

        let hosts = Hosts::new(2);
        let args = ["allreduce/ring", "--transport", "cuda", "-b", "4M", "-e", "4M", "-n", "1", "-w", "0", "-c", "1"];
        let short = |rank: usize, command: &mut Command| {
            if rank == 2 {
                command.env("COLLC_HOST_GPU_PINNED", "1048576");
            }
        };
        let outputs = wait_within(start(&hosts, &args, &[("COLLC_TIMEOUT", "30")], short), LIMIT, "rank 2 short");
        let two = printed(&outputs[2]);
        assert!(two.contains("rank 2: cannot map host memory for its connection to rank 1 on another host"), "{two}");
        for rank in [0, 1, 3] {
            let text = printed(&outputs[rank]);
            assert!(!outputs[rank].status.success(), "{text}");
            assert!(text.contains("rank 2 could not map its peers' connection records"), "rank {rank}: {text}");
        }
    }
}
