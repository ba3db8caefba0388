//! The cuda transport end to end where no GPU is: `collc` (built with the `cuda` feature) on a CUDA driver for the
//! CPU (`collc_runtime::build_host_driver`: the driver entry points collc calls, over host memory, running the
//! CUDA kernels compiled for the CPU), put first on `LD_LIBRARY_PATH`. The fabrics, the launcher, device buffers,
//! CUDA IPC between rank processes, `collc gpu` and `tests/gpu/run.sh` run as on a GPU; the speed is the CPU's.
#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The directory holding the driver, built once per test process.
fn driver_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("host-gpu-{}", std::process::id()));
        collc_runtime::build_host_driver(&dir).unwrap_or_else(|e| panic!("{e}"));
        dir
    })
}

/// `collc` with the driver for the CPU first on the library path.
fn collc(args: &[&str], env: &[(&str, &str)]) -> Output {
    let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    Command::new(env!("CARGO_BIN_EXE_collc"))
        .args(args)
        .env("LD_LIBRARY_PATH", format!("{}:{path}", driver_dir().display()))
        .env("XDG_CACHE_HOME", Path::new(env!("CARGO_TARGET_TMPDIR")).join("host-gpu-cache"))
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
/// algorithm x dtype x op at 2 and 4 rank threads, the same as 2 rank processes through CUDA IPC, and `collc gpu
/// bench`; every row checked against the collective's definition.
#[test]
fn the_device_script_passes_on_the_driver_for_the_cpu() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/gpu/run.sh");
    let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let out = Command::new("bash")
        .arg(&script)
        .arg(env!("CARGO_BIN_EXE_collc"))
        .env("LD_LIBRARY_PATH", format!("{}:{path}", driver_dir().display()))
        .env("XDG_CACHE_HOME", Path::new(env!("CARGO_TARGET_TMPDIR")).join("host-gpu-cache"))
        .envs([("RANKS", "2 4"), ("SIZES", "-b 8 -e 4K -f 8"), ("IPC_SIZES", "-b 8 -e 4K -f 8")])
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
    assert!(text.contains("allreduce 8 B x 8 ranks:") && text.contains("HBM bound"), "{text}");
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
    let out = collc(&args, &[gpus[0], ("COLLC_HOST_GPU_PEER", "0")]);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("GPU 0 cannot access GPU 1's memory") && said.contains("COLLC_CUDA_GPUS=1"), "{said}");
}
