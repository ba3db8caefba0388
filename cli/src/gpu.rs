//! `collc gpu info` and `collc gpu bench`: what the CUDA driver and NVRTC say, and the device executor against the
//! GPU's own limits in one run: the copy kernel against `cuMemcpyDtoD`, an 8-byte allreduce against an empty
//! kernel launch, and a large allreduce against the HBM bound (the bytes its schedule reads and writes, counted from
//! its instructions, at the measured copy rate). Needs the `cuda` feature and a driver.

use clap::{Args, Subcommand};

#[derive(Args)]
pub struct GpuArgs {
    #[command(subcommand)]
    command: GpuCommand,
}

#[derive(Subcommand)]
enum GpuCommand {
    /// The driver, the GPUs, NVRTC and the CUDA libraries this process loaded.
    Info,
    /// Compile the kernels with NVRTC (no GPU needed) and write their PTX: for a GPU machine without NVRTC, which
    /// loads it through COLLC_CUDA_PTX.
    Ptx {
        /// The virtual architecture.
        #[arg(long, default_value = "compute_90", value_parser = ["compute_75", "compute_80", "compute_86", "compute_89", "compute_90"])]
        arch: String,
        /// Where to write it (default: standard output).
        #[arg(long)]
        output: Option<std::path::PathBuf>,
    },
    /// Copy-kernel bandwidth against cuMemcpyDtoD, 8-byte allreduce latency against an empty launch, and allreduce
    /// time against the HBM bound, all on GPU 0.
    Bench {
        /// Bytes of the copy and of the large allreduce.
        #[arg(long, default_value = "256M", value_parser = crate::args::parse_size)]
        bytes: usize,
        /// Ranks sharing GPU 0 for the allreduces.
        #[arg(long, default_value_t = 8)]
        ranks: u32,
        /// The allreduce algorithm (a library name).
        #[arg(long, default_value = "allreduce/ring")]
        algorithm: String,
        /// Timed iterations of each measurement.
        #[arg(short = 'n', long, default_value_t = 20)]
        iters: u32,
    },
}

pub fn run(args: GpuArgs) -> u8 {
    #[cfg(feature = "cuda")]
    {
        let outcome = match args.command {
            GpuCommand::Info => cuda::info(),
            GpuCommand::Ptx { arch, output } => cuda::ptx(&arch, output.as_deref()),
            GpuCommand::Bench { bytes, ranks, algorithm, iters } => cuda::bench(bytes, ranks, &algorithm, iters),
        };
        match outcome {
            Ok(code) => code,
            Err(message) => {
                eprintln!("error: {message}");
                1
            }
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = args.command;
        let cuda = collc_runtime::Transport::named("cuda").backend().built();
        eprintln!("error: {}", cuda.expect_err("a build without the cuda feature lacks the cuda backend"));
        2
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use collc_compiler::{Collective, Placement};
    use collc_kernels::{DataType, ReduceOp};
    use collc_runtime::cuda::{self, DeviceBuffer};
    use collc_runtime::{check, Buffers, CallShape, Communicator, Options};
    use std::time::Instant;

    pub fn ptx(arch: &str, output: Option<&std::path::Path>) -> Result<u8, String> {
        let arch: &'static str = ["compute_75", "compute_80", "compute_86", "compute_89", "compute_90"]
            .into_iter()
            .find(|a| *a == arch)
            .ok_or(format!("--arch {arch}: not one NVRTC 13 compiles for"))?;
        let ptx = cuda::kernels_ptx(arch)?;
        match output {
            Some(path) => std::fs::write(path, ptx).map_err(|e| format!("{}: {e}", path.display()))?,
            None => print!("{ptx}"),
        }
        Ok(0)
    }

    pub fn info() -> Result<u8, String> {
        let driver = cuda::driver()?;
        println!("driver: CUDA {} ({} GPUs)", cuda::version_text(driver.version), driver.devices);
        for ordinal in 0..driver.devices {
            let gpu = cuda::gpu(ordinal)?;
            println!("gpu {ordinal}: {} ({} SMs)", gpu.name, gpu.sms);
        }
        match collc_kernels::cuda::nvrtc_version() {
            Ok((major, minor)) => println!("nvrtc: {major}.{minor}"),
            Err(e) => println!("nvrtc: {e}"),
        }
        for path in cuda::loaded_libraries() {
            println!("loaded: {path}");
        }
        Ok(0)
    }

    pub fn bench(bytes: usize, ranks: u32, algorithm: &str, iters: u32) -> Result<u8, String> {
        let gpu = cuda::gpu(0)?;
        let driver = cuda::driver()?;
        println!(
            "# collc gpu bench: GPU 0 {} ({} SMs), CUDA {}",
            gpu.name,
            gpu.sms,
            cuda::version_text(driver.version)
        );
        for path in cuda::loaded_libraries() {
            println!("# loaded: {path}");
        }
        let (kernel, memcpy) = cuda::copy_rates(&gpu, bytes, iters)?;
        println!(
            "copy {bytes} B: kernel {kernel:.1} GB/s, cuMemcpyDtoD {memcpy:.1} GB/s, ratio {:.3} (goal >= 0.90)",
            kernel / memcpy
        );
        let empty = cuda::empty_launch_us(&gpu, iters.max(100))?;
        let source = collc_compiler::library::get(algorithm).ok_or(format!("`{algorithm}` is not in the library"))?;
        let small = allreduce(ranks, algorithm, source, 2, iters.max(100))?;
        println!(
            "allreduce 8 B x {ranks} ranks: {:.2} us, empty launch {empty:.2} us, ratio {:.2} (goal <= 2), {} wrong",
            small.seconds * 1e6,
            small.seconds * 1e6 / empty,
            small.wrong
        );
        let count = bytes / 4;
        let large = allreduce(ranks, algorithm, source, count, iters)?;
        // The bound: every byte the ranks' instructions read and write, at the copy rate (a copy of B bytes moves
        // 2B: read and write).
        let bound = large.traffic as f64 / (2.0 * memcpy * 1e9);
        let busbw = bytes as f64 / large.seconds / 1e9 * 2.0 * (ranks as f64 - 1.0) / ranks as f64;
        println!(
            "allreduce {bytes} B x {ranks} ranks ({algorithm}): {:.1} us, busbw {busbw:.1} GB/s; HBM bound {:.1} us \
             ({} B read and written at {memcpy:.1} GB/s copy rate), ratio {:.3} (goal <= 1.25), {} wrong",
            large.seconds * 1e6,
            bound * 1e6,
            large.traffic,
            large.seconds / bound,
            large.wrong
        );
        Ok(if small.wrong + large.wrong > 0 { 1 } else { 0 })
    }

    struct Measured {
        seconds: f64,
        traffic: u64,
        wrong: u64,
    }

    /// `iters` timed out-of-place allreduces of `count` floats by `ranks` threads sharing GPU 0, then one checked.
    fn allreduce(ranks: u32, name: &str, source: &str, count: usize, iters: u32) -> Result<Measured, String> {
        let comms = Communicator::cuda_on(ranks, Some(1), Options::from_env().map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        let shape = CallShape {
            collective: Collective::AllReduce,
            count,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            root: 0,
            peer: 0,
        };
        let results: Vec<Result<(f64, u64, u64), String>> = std::thread::scope(|scope| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|mut comm| {
                    scope.spawn(move || -> Result<(f64, u64, u64), String> {
                        let e = |e: collc_runtime::RuntimeError| e.to_string();
                        comm.set_algorithm(Collective::AllReduce, name, source, Vec::new());
                        let n = comm.n_ranks();
                        let w = check::windows(&shape, n, comm.rank(), false);
                        let (send, recv) = (
                            DeviceBuffer::new(&comm, w.send).map_err(e)?,
                            DeviceBuffer::new(&comm, w.recv).map_err(e)?,
                        );
                        let buffers = || Buffers::DeviceOutOfPlace { send: send.ptr(), recv: recv.ptr() };
                        for _ in 0..5 {
                            comm.call(shape, buffers()).map_err(e)?;
                        }
                        comm.barrier().map_err(e)?;
                        let started = Instant::now();
                        for _ in 0..iters {
                            comm.call(shape, buffers()).map_err(e)?;
                        }
                        let seconds = started.elapsed().as_secs_f64() / iters as f64;
                        comm.barrier().map_err(e)?;
                        send.write(0, &check::input(&shape, n, comm.rank())).map_err(e)?;
                        comm.call(shape, buffers()).map_err(e)?;
                        let mut got = vec![0u8; w.recv];
                        recv.read(0, &mut got).map_err(e)?;
                        let want = check::expected(&shape, n, comm.rank()).expect("allreduce defines every output");
                        let wrong = check::count_wrong(shape.dtype, &want, &got[w.output.clone()]) as u64;
                        let traffic = comm.traffic_bytes(shape, Placement::OutOfPlace).map_err(e)?;
                        Ok((seconds, traffic, wrong))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a rank thread panicked".into()))).collect()
        });
        let mut measured = Measured { seconds: 0.0, traffic: 0, wrong: 0 };
        for result in results {
            let (seconds, traffic, wrong) = result?;
            measured.seconds = measured.seconds.max(seconds);
            measured.traffic += traffic;
            measured.wrong += wrong;
        }
        Ok(measured)
    }
}
