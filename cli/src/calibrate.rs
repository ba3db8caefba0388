//! `collc cost --calibrate`: measures this host and writes a one-node topology file. alpha and beta come from a
//! ping-pong of `sendrecv` between two ranks of the threads transport (half a round trip per message; alpha is the
//! median small-message time, beta the least-squares slope over large messages); gamma and the copy rate from the
//! host kernels on buffers larger than the caches. The same three again for calls small enough to stay in the
//! caches (the topology's `cached` rates). Every ping-pong size also goes into the intra-node link's measured curve
//! (`message_us`), which the cost model reads message times off. A message time is the fastest of several runs
//! (`one_way_points`), a kernel rate the median.

use clap::Args;
use collc_compiler::cost::{Cached, Link, Links, Topology};
use collc_compiler::Collective;
use collc_kernels::{host, DataType, ReduceOp};
use collc_runtime::{Buffers, CallShape, Communicator, Options};
use std::time::{Duration, Instant};

#[derive(Args, Clone, Debug)]
pub struct CalibrateArgs {
    /// Where --calibrate writes the topology file [default: standard output].
    #[arg(long = "output", value_name = "FILE")]
    pub output: Option<String>,
    /// Runs per measurement: the fastest is kept of a message time, the median of a kernel rate.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub runs: u32,
}

/// Message sizes of the ping-pong: up to 512 B for alpha, from 256 KiB for beta.
const SMALL: [usize; 4] = [8, 64, 256, 512];
const LARGE: [usize; 4] = [256 << 10, 1 << 20, 4 << 20, 16 << 20];
/// Buffers of the kernel measurements: well past the last-level cache.
const KERNEL_BYTES: usize = 64 << 20;
/// The cached regime: calls up to this size, measured on buffers of this size (two of them fit in the 512 KiB L2 of
/// each core of the machine collc is developed on), with ping-pong messages of 16 to 128 KiB.
const CACHED_BYTES: usize = 256 << 10;
const CACHED: [usize; 4] = [16 << 10, 32 << 10, 64 << 10, 128 << 10];
/// Sizes between the small and the cached ones, measured for the curve only.
const MID: [usize; 4] = [1 << 10, 2 << 10, 4 << 10, 8 << 10];
/// The pause between two runs of the message sizes. Without pauses a whole calibration of 1.5 s fell into a slow
/// spell twice in five `bench/model_vs_measured.sh` runs; with them spells still outlasted one at times (5-10 s),
/// which the script handles by calibrating several times (bench/README.md).
const SPELL: Duration = Duration::from_secs(1);

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// `(bytes, seconds)` of a one-way message of each of `sizes` bytes between two ranks (half a round trip of a
/// `sendrecv` ping-pong): per size, the fastest of `runs` timed ping-pongs. The runs go round all the sizes in turn,
/// `pause` apart, so that a slow spell of the machine (seconds long on a shared VM, with ping-pongs three times as
/// slow and kernels hardly slower) falls on some runs of every size rather than on every run of a few; a spell
/// only adds time, so the fastest run is the machine's.
fn one_way_points(sizes: &[usize], runs: u32, pause: Duration) -> Result<Vec<(f64, f64)>, String> {
    // Through the FIFOs: the model prices a send by reference as its receiver's pass, and every other message by
    // this curve. (Messages of an input, as here, would otherwise go by reference, and the curve be single copy's.)
    let options = Options { single_copy: false, ..Options::default() };
    let comms = Communicator::threads(2, options).map_err(|e| e.to_string())?;
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let samples = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, mut comm)| {
                scope.spawn(move || -> Result<Vec<f64>, String> {
                    // Each on a CPU of its own to start with (on one, inside `on_one_cpu`), as `collc run` places its
                    // rank processes (`spread_over_cores` says why).
                    collc_runtime::launch::spread_over_cores(rank as u32, 2);
                    let send = vec![1u8; largest];
                    let mut recv = vec![0u8; largest];
                    let mut pingpong = |comm: &mut Communicator, bytes: usize, n: usize| -> Result<(), String> {
                        for _ in 0..n {
                            for root in [0, 1] {
                                let shape = CallShape {
                                    collective: Collective::SendRecv,
                                    count: bytes,
                                    dtype: DataType::U8,
                                    op: ReduceOp::Sum,
                                    root,
                                    peer: 1 - root,
                                };
                                let buffers = Buffers::OutOfPlace { send: &send[..bytes], recv: &mut recv[..bytes] };
                                comm.call(shape, buffers).map_err(|e| e.to_string())?;
                            }
                        }
                        Ok(())
                    };
                    for &bytes in sizes {
                        pingpong(&mut comm, bytes, 5)?;
                    }
                    let mut fastest = vec![f64::INFINITY; sizes.len()];
                    for run in 0..runs {
                        if run > 0 {
                            std::thread::sleep(pause);
                        }
                        for (&bytes, fastest) in sizes.iter().zip(&mut fastest) {
                            let iters = ((64 << 20) / bytes.max(1)).clamp(20, 2000);
                            comm.barrier().map_err(|e| e.to_string())?;
                            let started = Instant::now();
                            pingpong(&mut comm, bytes, iters)?;
                            *fastest = fastest.min(started.elapsed().as_secs_f64() / (2 * iters) as f64);
                        }
                    }
                    Ok(fastest)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a calibration rank")).collect::<Vec<_>>()
    });
    let rank0 = samples.into_iter().next().expect("two ranks")?;
    Ok(sizes.iter().map(|&b| b as f64).zip(rank0).collect())
}

/// Seconds per byte of `kernel` over `bytes`-byte buffers: enough calls per sample for a few milliseconds.
fn kernel_seconds_per_byte(runs: u32, bytes: usize, kernel: impl Fn(&mut [u8], &[u8])) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![2u8; bytes];
    kernel(&mut dst, &src);
    let calls = (KERNEL_BYTES / bytes).max(1);
    median(
        (0..runs)
            .map(|_| {
                let started = Instant::now();
                for _ in 0..calls {
                    kernel(&mut dst, &src);
                }
                started.elapsed().as_secs_f64() / (calls * bytes) as f64
            })
            .collect(),
    )
}

/// Least-squares slope of y over x.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (mx, my) = (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n);
    let num: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let den: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    num / den
}

fn measure(args: &CalibrateArgs) -> Result<Topology, String> {
    let runs = args.runs;
    // Growing from size to size, as the curve written below must.
    let sizes = [&SMALL[..], &MID, &CACHED, &LARGE].concat();
    let points = one_way_points(&sizes, runs, SPELL)?;
    let of = |wanted: &[usize]| -> Vec<(f64, f64)> {
        points.iter().copied().filter(|(bytes, _)| wanted.contains(&(*bytes as usize))).collect()
    };
    let (small, large, cached_points) = (of(&SMALL), of(&LARGE), of(&CACHED));
    let alpha = median(small.iter().map(|p| p.1).collect());
    let shared = collc_runtime::launch::on_one_cpu(|| one_way_points(&SMALL, runs, Duration::ZERO))?;
    let shared_alpha = median(shared.iter().map(|p| p.1).collect());
    let beta = slope(&large).max(1e-13);
    let reduce = |dst: &mut [u8], src: &[u8]| {
        host::reduce_slices(DataType::F32, ReduceOp::Sum, dst, src).expect("equal lengths of whole f32s")
    };
    // The runtime's own copy, not `copy_from_slice`: glibc's memcpy has offsets where it is far slower.
    let copy_kernel = |dst: &mut [u8], src: &[u8]| {
        assert_eq!(dst.len(), src.len());
        // SAFETY: two distinct buffers of the same length.
        unsafe { host::copy(dst.as_mut_ptr(), src.as_ptr(), src.len()) }
    };
    let gamma = kernel_seconds_per_byte(runs, KERNEL_BYTES, reduce);
    let copy = kernel_seconds_per_byte(runs, KERNEL_BYTES, copy_kernel);
    // Data in cache moves at least as fast as data in DRAM: a slower figure is a noisy fit (four points), so it
    // is capped at the DRAM one.
    let cached_beta = slope(&cached_points).clamp(1e-13, beta);
    let cached_gamma = kernel_seconds_per_byte(runs, CACHED_BYTES, reduce).min(gamma);
    let cached_copy = kernel_seconds_per_byte(runs, CACHED_BYTES, copy_kernel).min(copy);
    // Calls above that whose data still fits the last-level cache: kernels on buffers of an eighth of it (a call's
    // input, its peer's and its output per rank, on two ranks, fit), messages as the curve says.
    let llc = last_level_cache_bytes().map(|bytes| bytes / 8).filter(|&bytes| bytes > CACHED_BYTES).map(|bytes| {
        let gamma = kernel_seconds_per_byte(runs, bytes, reduce).min(gamma).max(cached_gamma);
        let copy = kernel_seconds_per_byte(runs, bytes, copy_kernel).min(copy).max(cached_copy);
        (bytes, gamma, copy)
    });
    eprintln!(
        "# calibrated: alpha {:.3} us ({:.3} us on one core), beta {:.3} GB/s, reduce {:.2} GB/s, copy {:.2} GB/s; \
         up to {} KiB: {:.3} GB/s, reduce {:.2} GB/s, copy {:.2} GB/s",
        alpha * 1e6,
        shared_alpha * 1e6,
        1e-9 / beta,
        1e-9 / gamma,
        1e-9 / copy,
        CACHED_BYTES >> 10,
        1e-9 / cached_beta,
        1e-9 / cached_gamma,
        1e-9 / cached_copy
    );
    if let Some((bytes, gamma, copy)) = llc {
        eprintln!("# up to {} KiB: reduce {:.2} GB/s, copy {:.2} GB/s", bytes >> 10, 1e-9 / gamma, 1e-9 / copy);
    }
    if let Some(warning) = slow_messages(1e-9 / beta, 1e-9 / copy) {
        eprintln!("{warning}");
    }
    let round = |v: f64| (v * 1000.0).round() / 1000.0;
    let curve: Vec<[f64; 2]> = points.iter().map(|&(bytes, s)| [bytes, round(s * 1e6)]).collect();
    Ok(Topology {
        name: "calibrated: this host, threads transport".into(),
        nodes: 1,
        ranks_per_node: None,
        links: Links {
            intra: Link { alpha_us: round(alpha * 1e6), bandwidth_gbps: round(1e-9 / beta), message_us: Some(curve) },
            inter: None,
        },
        reduce_gbps: round(1e-9 / gamma),
        copy_gbps: Some(round(1e-9 / copy)),
        switch: None,
        cores_per_node: std::thread::available_parallelism().ok().map(|n| n.get() as u32),
        shared_core_alpha_us: Some(round(shared_alpha * 1e6)),
        cached: Some(Cached {
            max_bytes: CACHED_BYTES as u32,
            bandwidth_gbps: round(1e-9 / cached_beta),
            reduce_gbps: round(1e-9 / cached_gamma),
            copy_gbps: round(1e-9 / cached_copy),
        }),
        llc: llc.map(|(bytes, gamma, copy)| Cached {
            max_bytes: bytes as u32,
            // Messages of this regime's sizes follow the curve; its slope elsewhere is the large messages'.
            bandwidth_gbps: round(1e-9 / beta),
            reduce_gbps: round(1e-9 / gamma),
            copy_gbps: round(1e-9 / copy),
        }),
        single_copy: None,
    })
}

/// The last-level cache's size (Linux: the highest cache level of CPU 0 that holds data), if the system says.
fn last_level_cache_bytes() -> Option<usize> {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let read = |index: &std::path::Path, name: &str| std::fs::read_to_string(index.join(name)).ok();
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|entry| entry.path())
        .filter(|index| read(index, "type").is_some_and(|t| t.trim() != "Instruction"))
        .filter_map(|index| {
            let level: u32 = read(&index, "level")?.trim().parse().ok()?;
            let size = read(&index, "size")?;
            let size = size.trim();
            let bytes: usize = match size.strip_suffix('K') {
                Some(k) => k.parse::<usize>().ok()? << 10,
                None => match size.strip_suffix('M') {
                    Some(m) => m.parse::<usize>().ok()? << 20,
                    None => size.parse().ok()?,
                },
            };
            Some((level, bytes))
        })
        .max()
        .map(|(_, bytes)| bytes)
}

/// A warning when large messages between the two calibrating ranks moved at under `SLOW_SHARE` of the host's copy
/// rate (both in GB/s). A one-way message is two copies, into the FIFO and out of it, on two CPUs that work at once,
/// so it usually runs at about half the copy rate or more. Of 42 calibrations on the development VM, 31 measured
/// 0.47-0.67 of it; the 10 that fell into a phase where the VM's two CPUs exchanged data three times slower measured
/// 0.17-0.22, and one that fell partly into it 0.31.
fn slow_messages(message_gbps: f64, copy_gbps: f64) -> Option<String> {
    let share = message_gbps / copy_gbps;
    (share < SLOW_SHARE).then(|| {
        format!(
            "warning: large messages moved at {message_gbps:.2} GB/s, {:.0}% of this host's copy rate ({copy_gbps:.2} \
             GB/s); they usually reach about 50%. The CPUs were probably busy or slowed (on a shared VM, a passing \
             phase of the host): calibrate again and compare before predicting with this file.",
            share * 100.0
        )
    })
}

const SLOW_SHARE: f64 = 0.4;

pub fn run(args: &CalibrateArgs) -> u8 {
    let topo = match measure(args) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: calibration failed: {e}");
            return 1;
        }
    };
    let text = topo.to_json() + "\n";
    match &args.output {
        None => print!("{text}"),
        Some(path) => {
            if let Err(e) = std::fs::write(path, text) {
                eprintln!("error: -o {path}: {e}");
                return 2;
            }
            eprintln!("# wrote {path}");
        }
    }
    0
}

/// Runs per measurement of the calibration `collc run` makes on first use: about 2 s, against 5.6 s for five.
const QUICK_RUNS: u32 = 2;

/// This host's measured topology for `collc run COLLECTIVE` without a topology file, and the header line that says
/// where it came from: the cached calibration, or a quick one made now (and cached) when there is none or
/// `recalibrate` asks. `may_measure` is false in a rank a launcher started: it reads the cache only, so that ranks
/// never measure at once (and every rank selects alike); `None` then without a cache.
pub fn host_topology(recalibrate: bool, may_measure: bool) -> Option<(Topology, String)> {
    let path = collc_runtime::select::host_cache_path()?;
    if !recalibrate || !may_measure {
        if let Some(topo) = std::fs::read_to_string(&path).ok().and_then(|t| Topology::from_json(&t).ok()) {
            let line = format!("this host's calibration, cached in {} (--recalibrate measures again)", path.display());
            return Some((topo, line));
        }
    }
    if !may_measure {
        return None;
    }
    let started = Instant::now();
    let topo = measure(&CalibrateArgs { output: None, runs: QUICK_RUNS }).ok()?;
    let saved = path.parent().map(std::fs::create_dir_all).is_some_and(|made| made.is_ok())
        && std::fs::write(&path, topo.to_json() + "\n").is_ok();
    let kept = match saved {
        true => format!("cached in {}", path.display()),
        false => format!("not cached: {} is not writable", path.display()),
    };
    let line = format!("this host, calibrated now ({:.1} s; {kept})", started.elapsed().as_secs_f64());
    Some((topo, line))
}

#[cfg(test)]
mod tests {
    use super::slow_messages;

    #[test]
    fn a_calibration_in_the_slow_phase_is_flagged_and_a_usual_one_is_not() {
        // Figures of two calibrations on the development VM (bench/README.md): usual, then the slow phase.
        assert_eq!(slow_messages(6.527, 10.459), None);
        let warning = slow_messages(2.091, 11.66).expect("flagged");
        assert!(warning.starts_with("warning: large messages moved at 2.09 GB/s, 18% of"), "{warning}");
    }
}
