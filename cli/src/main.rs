//! `collc`: the command-line front end. One module per subcommand; exit status as `EXIT_STATUS` says.

#[cfg(target_os = "linux")]
mod alloc;
#[cfg(not(target_os = "linux"))]
mod alloc {
    /// Elsewhere the system allocator stands, and nothing is faulted in ahead.
    pub fn while_prefaulting<T>(work: impl FnOnce() -> T) -> T {
        work()
    }
}
mod args;
mod build;
mod calibrate;
mod check;
mod cost;
mod diff;
mod fr;
mod gpu;
mod import;
mod library;
mod list;
mod report;
mod run;
mod tune;
mod viz;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: alloc::MappedBlocks = alloc::MappedBlocks;

/// The exit-status contract of every subcommand, printed under each `--help`.
const EXIT_STATUS: &str =
    "Exit status: 0 success; 1 a compile, verification, runtime or data error (a result with #wrong > 0); \
2 a usage error (an unknown name or flag, a bad value, a run that does not fit in memory); 128+N when stopped by \
signal N (130 on SIGINT, 143 on SIGTERM), after printing what was measured.";

/// collc: compile, verify and run collective-communication algorithms.
#[derive(Parser)]
#[command(name = "collc", version, about, after_help = EXIT_STATUS)]
struct Cli {
    /// A folder of your own `.coll` algorithms (searched recursively; repeat for more), listed, costed, compared,
    /// tuned and selected beside the library's, each named by its header (`algorithm my_ring for allreduce` is
    /// `allreduce/my_ring`). Goes before the folders of $COLLC_ALGO_PATH (`:`-separated).
    #[arg(long, global = true, value_name = "DIR")]
    library: Vec<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The algorithm library (embedded, and yours: --library, COLLC_ALGO_PATH): collective, name, cost formula, doc line.
    #[command(after_help = EXIT_STATUS)]
    List(list::ListArgs),
    /// Compile one algorithm for one rank count, verify it, and print a stage's output.
    #[command(after_help = EXIT_STATUS)]
    Build(build::BuildArgs),
    /// Verify an algorithm for a list or range of rank counts, in both placements.
    #[command(after_help = EXIT_STATUS)]
    Check(check::CheckArgs),
    /// Read an MSCCL XML file (msccl-tools, RCCL), verify it and say what it computes; --emit sched converts it.
    /// (`check`, `run` and `cost` take an .xml file too.)
    #[command(after_help = EXIT_STATUS)]
    Import(import::ImportArgs),
    /// Run an algorithm on real data and print nccl-tests' table (ranks as threads or processes: --transport).
    #[command(after_help = EXIT_STATUS)]
    Run(run::RunArgs),
    /// Predict an algorithm's time, algbw and busbw per message size (alpha-beta-gamma model, topology file).
    #[command(after_help = EXIT_STATUS)]
    Cost(cost::CostArgs),
    /// Pick the predicted-fastest algorithm per message size, per collective, on a topology.
    #[command(after_help = EXIT_STATUS)]
    Tune(tune::TuneArgs),
    /// Compare two schedules (`.sched` files, algorithms at --ranks, or REV:PATH at a git revision): the header, then
    /// per rank the instructions added, removed and changed. Exits 0 when they are equal, 1 when they differ.
    #[command(after_help = EXIT_STATUS)]
    Diff(diff::DiffArgs),
    /// Flight recorder: `collc fr analyze DIR` reads every rank's dump (COLLC_DUMP_DIR) and says who hangs where.
    #[command(after_help = EXIT_STATUS)]
    Fr(fr::FrArgs),
    /// GPUs: `collc gpu info` (driver, devices, libraries loaded), `collc gpu bench` (the device executor against
    /// the GPU's copy rate and launch latency). Needs the cuda feature.
    #[command(after_help = EXIT_STATUS)]
    Gpu(gpu::GpuArgs),
    /// Draw a verified schedule (ranks as lanes, steps as columns, an arrow per message) as an SVG picture, or an
    /// HTML page that steps through it showing every rank's buffers.
    #[command(after_help = EXIT_STATUS)]
    Viz(viz::VizArgs),
}

/// Deeply nested but legal input recurses in the front end; give it room rather than trusting the main thread's.
const STACK_BYTES: usize = 256 << 20;

/// Dies quietly on a closed pipe (`collc build ... | head`) like other command-line tools, instead of panicking
/// in `print!`: Rust ignores SIGPIPE by default.
#[cfg(unix)]
fn restore_sigpipe() {
    const SIGPIPE: i32 = 13;
    const SIG_DFL: usize = 0;
    extern "C" {
        fn signal(signum: i32, handler: usize) -> usize;
    }
    // SAFETY: setting a signal's disposition to the default at start-up, before any thread exists.
    unsafe {
        signal(SIGPIPE, SIG_DFL);
    }
}

#[cfg(not(unix))]
fn restore_sigpipe() {}

fn main() -> ExitCode {
    restore_sigpipe();
    let cli = Cli::parse();
    // Before any thread starts: it may set COLLC_ALGO_PATH. `fr` and `gpu` run no algorithm of a library.
    if !matches!(cli.command, Command::Fr(_) | Command::Gpu(_)) {
        if let Err(code) = library::load(&cli.library) {
            return ExitCode::from(code);
        }
    }
    let worker = std::thread::Builder::new().stack_size(STACK_BYTES).spawn(move || match cli.command {
        Command::List(a) => list::run(a),
        Command::Build(a) => build::run(a),
        Command::Check(a) => check::run(a),
        Command::Import(a) => import::run(a),
        Command::Run(a) => run::run(a),
        Command::Cost(a) => cost::run(a),
        Command::Tune(a) => tune::run(a),
        Command::Diff(a) => diff::run(a),
        Command::Fr(a) => fr::run(a),
        Command::Gpu(a) => gpu::run(a),
        Command::Viz(a) => viz::run(a),
    });
    match worker.map(|handle| handle.join()) {
        Ok(Ok(code)) => ExitCode::from(code),
        _ => {
            eprintln!("error: collc stopped unexpectedly; please report this with the command you ran");
            ExitCode::from(101)
        }
    }
}
