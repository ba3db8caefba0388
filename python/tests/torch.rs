//! The torch backend under torchrun on CPU tensors, checked against gloo in the same jobs: every collective and dtype
//! (`collectives.py`; over shm on 4 ranks, over tcp on 2, and on two hosts: network namespaces), DDP training (`ddp.py`), a worker killed or stopped
//! mid-step (`killed.py`, then `collc fr analyze` on the stopped job's dumps) and a user's `.coll` file chosen from
//! Python (`algorithm.py`).
//!
//! They need torch: `.ci/run` installs it into `/opt/collc-torch` (a virtual environment); `COLLC_TORCH_PYTHON` names
//! another interpreter that has it. The extension is the one this build made (`lib_collc.so` beside the test binary in `deps/`),
//! put with `python/collc/` into a package folder of the test's own.

#[path = "../../cli/tests/netns/mod.rs"]
mod netns;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

/// One job at a time: each runs a process per rank and takes every core of a CI machine.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `target/<profile>`, where cargo puts the collc binary.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>").to_path_buf()
}

/// The interpreter with torch: `COLLC_TORCH_PYTHON`, else `.ci/run`'s environment, else `python3`.
fn python() -> &'static str {
    static PYTHON: OnceLock<String> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let python = std::env::var("COLLC_TORCH_PYTHON").ok().unwrap_or_else(|| {
            let ci = Path::new("/opt/collc-torch/bin/python");
            if ci.exists() {
                ci.display().to_string()
            } else {
                "python3".into()
            }
        });
        let probe = Command::new(&python).args(["-c", "import torch.distributed; print(torch.__version__)"]).output();
        match probe {
            Ok(out) if out.status.success() => python,
            _ => panic!(
                "{python} cannot import torch: run `bash .ci/run` (which installs torch into /opt/collc-torch), or set \
                 COLLC_TORCH_PYTHON to an interpreter with torch >= 2.7 (`pip install torch`)"
            ),
        }
    })
}

/// A folder to put on PYTHONPATH: `collc/` with its Python and this build's extension as `_collc.abi3.so`.
fn package() -> TempDir {
    // Built with this test (the rlib's build makes the cdylib too), beside it in deps/.
    let exe = std::env::current_exe().expect("the test binary's path");
    let lib = exe.with_file_name("lib_collc.so");
    assert!(lib.exists(), "{} is missing: cargo builds it with this test (the collc-python cdylib)", lib.display());
    let dir = tempdir("package");
    let collc = dir.join("collc");
    std::fs::create_dir_all(&collc).expect("the package folder");
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("collc");
    for entry in std::fs::read_dir(&sources).expect("python/collc") {
        let path = entry.expect("python/collc's files").path();
        if path.extension().is_some_and(|e| e == "py") {
            std::fs::copy(&path, collc.join(path.file_name().unwrap())).expect("copy the package's Python");
        }
    }
    std::fs::copy(&lib, collc.join("_collc.abi3.so")).expect("copy the extension");
    dir
}

fn script(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(name).display().to_string()
}

/// Runs `args` with the package on PYTHONPATH, `env` added, within `seconds` (coreutils' timeout).
fn run(args: &[&str], env: &[(&str, &str)], seconds: u32) -> Output {
    let package = package();
    let mut command = Command::new("timeout");
    command.args(["-k", "5", &seconds.to_string(), python()]).args(args);
    command.env("PYTHONPATH", &*package).env("OMP_NUM_THREADS", "1").env("PYTHONUNBUFFERED", "1");
    command.env_remove("COLLC_TRANSPORT").env_remove("COLLC_ALGO").env_remove("COLLC_DEBUG");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("run python")
}

/// `torchrun --standalone --nproc-per-node N SCRIPT ARGS`.
fn torchrun(n: u32, name: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let n = n.to_string();
    let script = script(name);
    let mut all = vec!["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", &n, &script];
    all.extend_from_slice(args);
    run(&all, env, 300)
}

/// Asserts the job succeeded and printed `line` (a line starting with it); returns everything it printed.
fn passed(out: &Output, line: &str) -> String {
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let tail: String = text.chars().rev().take(6000).collect::<Vec<_>>().into_iter().rev().collect();
    assert!(out.status.success(), "the job failed ({}):\n{tail}", out.status);
    let found = text.lines().find(|l| l.starts_with(line));
    let found = found.unwrap_or_else(|| panic!("no line `{line}...` in what the job printed:\n{tail}"));
    eprintln!("{found}");
    text
}

#[test]
fn every_collective_matches_gloo_on_four_ranks_over_shm() {
    let _one = serial();
    let out = torchrun(4, "collectives.py", &[], &[]);
    let text = passed(&out, "collectives:");
    assert!(text.contains("on 4 ranks over shm"), "{text}");
}

#[test]
fn every_collective_matches_gloo_on_two_ranks_over_tcp() {
    let _one = serial();
    let out = torchrun(2, "collectives.py", &[], &[("COLLC_TRANSPORT", "tcp")]);
    let text = passed(&out, "collectives:");
    assert!(text.contains("on 2 ranks over tcp"), "{text}");
}

/// Two hosts (a network namespace and a host name each, as torchrun's ranks on two machines see them): the backend
/// finds them on different hosts and joins over tcp, rank 0's rendezvous at its address on the hosts' network.
#[test]
fn every_collective_matches_gloo_across_two_hosts() {
    let _one = serial();
    let hosts = netns::Hosts::new(2);
    let package = package();
    let script = script("collectives.py");
    let ranks: Vec<_> = (0..2)
        .map(|i| {
            let mut command = hosts.command(i, "timeout");
            command.args(["-k", "5", "300", "unshare", "--uts", "sh", "-c"]);
            command.arg(format!("hostname host{i} && exec {} {script}", python()));
            command.env("PYTHONPATH", &*package).env("OMP_NUM_THREADS", "1").env("PYTHONUNBUFFERED", "1");
            command.env_remove("COLLC_TRANSPORT").env_remove("COLLC_ALGO").env_remove("COLLC_DEBUG");
            let (rank, master) = (i.to_string(), netns::Hosts::addr(0));
            command.envs([
                ("RANK", rank.as_str()),
                ("LOCAL_RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("LOCAL_WORLD_SIZE", "1"),
            ]);
            // gloo (the reference) finds its address by the host name, which resolves to no interface here.
            command.envs([("MASTER_ADDR", master.as_str()), ("MASTER_PORT", "29500"), ("GLOO_SOCKET_IFNAME", "eth0")]);
            command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start a rank in its namespace")
        })
        .collect();
    let outputs: Vec<Output> = ranks.into_iter().map(|r| r.wait_with_output().expect("a rank's output")).collect();
    for out in &outputs[1..] {
        assert!(out.status.success(), "rank 1: {}", netns::printed(out));
    }
    let text = passed(&outputs[0], "collectives:");
    assert!(text.contains("on 2 ranks over tcp"), "{text}");
}

#[test]
fn ddp_trains_as_on_gloo() {
    let _one = serial();
    let out = torchrun(4, "ddp.py", &["200"], &[]);
    passed(&out, "ddp: 200 steps on 4 ranks");
}

/// `killed.py HOW DUMPS`: its output, with the dumps' folder.
fn killed(how: &str) -> (TempDir, Output) {
    let dumps = tempdir(how);
    let out = run(&[&script("killed.py"), how, dumps.to_str().unwrap()], &[], 120);
    (dumps, out)
}

#[test]
fn a_killed_worker_makes_the_others_raise_at_once_naming_it() {
    let _one = serial();
    let (_dumps, out) = killed("kill");
    let text = passed(&out, "kill: ranks [0, 1, 3] raised within 2.0 s, naming rank 2");
    assert!(text.contains("rank 2 died (process"), "{text}");
}

#[test]
fn a_stopped_worker_is_named_at_the_timeout_and_fr_analyze_finds_it() {
    let _one = serial();
    let (dumps, out) = killed("stop");
    let text = passed(&out, "stop: ranks [0, 1, 3] raised");
    // Each names the instruction and its `.coll` line.
    assert!(text.contains("instruction #") && text.contains(" line "), "{text}");
    let collc = profile_dir().join("collc");
    assert!(collc.exists(), "{} is missing: `cargo test --workspace` builds it", collc.display());
    let analysis = Command::new(&collc).args(["fr", "analyze"]).arg(&*dumps).output().expect("collc fr analyze");
    let analysis = String::from_utf8_lossy(&analysis.stdout);
    eprintln!("{analysis}");
    assert!(analysis.contains("3 of 4 ranks dumped"), "{analysis}");
    assert!(analysis.contains("=> ranks 0, 1, 3 wait on rank 2"), "{analysis}");
}

#[test]
fn set_algorithm_runs_a_users_file_verified_first() {
    let _one = serial();
    let folder = tempdir("algorithm");
    let out = torchrun(2, "algorithm.py", &[folder.to_str().unwrap()], &[("COLLC_DEBUG", "INFO")]);
    let text = passed(&out, "algorithm: a broken file refused at set_algorithm");
    let ring = folder.join("my_ring.coll").display().to_string();
    let logged = text.lines().filter(|l| l.contains("COLLC INFO allreduce: opCount")).collect::<Vec<_>>();
    assert!(!logged.is_empty(), "no call was logged at INFO:\n{text}");
    assert!(logged.iter().all(|l| l.ends_with(&format!("algorithm {ring}"))), "{logged:#?}");
}

/// A temporary folder, removed when the test ends.
struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir(what: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("collc-torch-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    TempDir(dir)
}
