//! `collc cost`: the predicted time, algbw and busbw of one algorithm per message size, on a topology file or the
//! built-in uniform one; `--calibrate` measures this host instead and writes a topology file (`calibrate.rs`).

use crate::args::{parse_size, size_sweep, BindArgs, LimitArgs};
use crate::{calibrate, library, report};
use clap::{Args, ValueEnum};
use collc_compiler::cost::{Costed, Topology};
use collc_compiler::{Collective, Error, Errors};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}

#[derive(Args)]
pub struct CostArgs {
    /// A library name such as `allreduce/ring`, a path to a `.coll` file, or a `.sched` schedule file (verified,
    /// then costed as it stands); not needed with --calibrate.
    #[arg(required_unless_present = "calibrate")]
    pub algorithm: Option<String>,
    /// Number of ranks [default: 8, or a schedule file's].
    #[arg(long)]
    pub ranks: Option<u32>,
    #[command(flatten)]
    pub sizes: SizeArgs,
    /// Topology file (JSON); without it, one node with the built-in constants.
    #[arg(long)]
    pub topo: Option<String>,
    /// Print a table, or one JSON document (every size's prediction).
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Measure alpha, beta and gamma of this host's transports and write a topology file (see --output).
    #[arg(long)]
    pub calibrate: bool,
    #[command(flatten)]
    pub calibration: calibrate::CalibrateArgs,
    #[command(flatten)]
    pub bind: BindArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
}

#[derive(Args, Clone, Debug)]
pub struct SizeArgs {
    /// Message sizes `MIN..MAX` in bytes (K, M, G are powers of 1024), as nccl-tests' -b and -e.
    #[arg(long, default_value = "8..1G")]
    pub sizes: String,
    /// Multiply the size by this factor between rows, as nccl-tests' -f.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2, value_parser = clap::value_parser!(u64).range(2..))]
    pub factor: u64,
}

impl SizeArgs {
    /// The sizes of the sweep, or why the range is unusable.
    pub fn list(&self) -> Result<Vec<u64>, String> {
        let (min, max) = self
            .sizes
            .split_once("..")
            .ok_or_else(|| format!("--sizes `{}` is not a range such as 8..1G", self.sizes))?;
        let (min, max) = (parse_size(min)?, parse_size(max.trim_start_matches('='))?);
        if min == 0 {
            return Err(format!("--sizes `{}` starts at 0 bytes; start at 1 or more", self.sizes));
        }
        if min > max {
            return Err(format!("--sizes `{}` is empty: {min} bytes is more than {max}", self.sizes));
        }
        Ok(size_sweep(min, max, self.factor, None).into_iter().map(|s| s as u64).collect())
    }
}

/// The topology of `--topo`, or the uniform one, checked against the rank count.
pub fn topology(path: Option<&str>, n_ranks: u32) -> Result<Topology, String> {
    if n_ranks == 0 {
        return Err("--ranks 0: the model needs at least one rank".into());
    }
    match path {
        Some(path) => topology_file(&format!("--topo {path}"), path, n_ranks),
        None => Ok(Topology::uniform(n_ranks)),
    }
}

/// The topology file at `path`, checked against the rank count; errors start with `given` (how the user named it).
pub fn topology_file(given: &str, path: &str, n_ranks: u32) -> Result<Topology, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{given}: cannot read it: {e}"))?;
    let topo = Topology::from_json(&text).map_err(|e| format!("{given}: {e}"))?;
    topo.check_ranks(n_ranks).map_err(|e| format!("{given}: {e}"))?;
    Ok(topo)
}

/// Lowers, verifies and profiles `source` for `n_ranks` on `topo` (the compiler's `cost::profile`).
pub fn profile(
    text: &str,
    bind: &BindArgs,
    limits: &collc_compiler::Limits,
    n_ranks: u32,
    topo: &Topology,
) -> Result<Costed, Errors> {
    collc_compiler::cost::profile(text, &bind.bindings(n_ranks), bind.params.pipeline, limits, topo)
}

/// A `.sched` file, verified as `collc check` verifies it, then profiled on `topo` (its rank count must be
/// `n_ranks`).
fn profile_schedule(
    source: &library::Source,
    limits: &collc_compiler::Limits,
    n_ranks: u32,
    topo: &Topology,
) -> Result<Costed, Errors> {
    let (verified, _) = library::verify_schedule(source, limits)?;
    if verified.n_ranks != n_ranks {
        let message = format!("{} is a schedule for {} ranks, not --ranks {n_ranks}", source.name, verified.n_ranks);
        return Err(Errors(vec![Error::new(
            "collc::cost::ranks",
            message,
            format!("give --ranks {}", verified.n_ranks),
        )]));
    }
    let profile = collc_compiler::cost::analyse_schedule(&verified, limits, topo)?;
    Ok(Costed { collective: verified.collective, profile, params: Vec::new(), schedule: verified, slices: 1 })
}

/// Algorithm bandwidth and nccl-tests' bus bandwidth, GB/s.
pub fn bandwidths(collective: Collective, n_ranks: u32, bytes: u64, seconds: f64) -> (f64, f64) {
    let algbw = bytes as f64 / seconds.max(1e-15) / 1e9;
    (algbw, algbw * collective.bus_factor(n_ranks))
}

pub fn run(args: CostArgs) -> u8 {
    if args.calibrate {
        return calibrate::run(&args.calibration);
    }
    let name = args.algorithm.as_deref().expect("clap requires it without --calibrate");
    let source = match library::resolve(name) {
        Ok(source) => source,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let file_ranks = library::is_schedule(&source).then(|| library::schedule_ranks(&source)).flatten();
    let n_ranks = args.ranks.or(file_ranks).unwrap_or(8);
    let (sizes, topo) = match (args.sizes.list(), topology(args.topo.as_deref(), n_ranks)) {
        (Ok(s), Ok(t)) => (s, t),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let limits = args.limits.limits();
    let costed = match library::is_schedule(&source) {
        true => profile_schedule(&source, &limits, n_ranks, &topo),
        false => profile(&source.text, &args.bind, &limits, n_ranks, &topo),
    };
    let Costed { collective, profile, slices, .. } = match costed {
        Ok(found) => found,
        Err(errors) => {
            report::print_all(&errors, &source.name, &source.text);
            return 1;
        }
    };
    let rows: Vec<(u64, f64, f64, f64)> = sizes
        .iter()
        .map(|&bytes| {
            let seconds = profile.seconds(bytes as f64);
            let (algbw, busbw) = bandwidths(collective, n_ranks, bytes, seconds);
            (bytes, seconds, algbw, busbw)
        })
        .collect();
    match args.format {
        Format::Json => {
            let doc = serde_json::json!({
                "algorithm": name,
                "collective": collective.name(),
                "ranks": n_ranks,
                "pipeline": slices,
                "steps": profile.n_steps(),
                "messages": profile.messages,
                "topology": topo,
                "rows": rows.iter().map(|(size, s, a, b)| serde_json::json!({
                    "size": size, "time_us": s * 1e6, "algbw": a, "busbw": b,
                })).collect::<Vec<_>>(),
            });
            println!("{}", serde_json::to_string_pretty(&doc).expect("JSON values serialise"));
        }
        Format::Table => {
            let pipelined = match slices {
                1 => String::new(),
                k => format!(", pipelined in {k} slices per chunk (--pipeline to change)"),
            };
            println!(
                "# collc cost {name}: {} ranks{pipelined}, {} steps, {} messages",
                n_ranks,
                profile.n_steps(),
                profile.messages
            );
            println!("# topology: {}: {}", topo.title(), topo.describe());
            println!("#");
            println!("# {:>12} {:>14} {:>12} {:>12}", "size", "time(us)", "algbw(GB/s)", "busbw(GB/s)");
            for (size, seconds, algbw, busbw) in rows {
                println!("  {size:>12} {:>14.2} {algbw:>12.2} {busbw:>12.2}", seconds * 1e6);
            }
        }
    }
    0
}
