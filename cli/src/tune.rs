//! `collc tune`: which algorithm the cost model picks for each message size, per collective, on a topology (the
//! size ranges where each algorithm wins), as NCCL's tuner would. `collc run COLLECTIVE` uses the same choice.

use crate::args::{BindArgs, LimitArgs};
use crate::cost::{self, Format, SizeArgs};
use crate::library::library;
use crate::report;
use clap::Args;
use collc_compiler::cost::{fastest, winning_ranges, AlgoFilter, Field, FieldError, Topology};
use collc_compiler::{Collective, Limits};

#[derive(Args)]
pub struct TuneArgs {
    /// One collective (allreduce, broadcast, ...); all of them when absent.
    pub collective: Option<String>,
    /// Number of ranks.
    #[arg(long, default_value_t = 8)]
    pub ranks: u32,
    /// Topology file (JSON); without it, one node with the built-in constants.
    #[arg(long)]
    pub topo: Option<String>,
    #[command(flatten)]
    pub sizes: SizeArgs,
    /// Candidates, in NCCL_ALGO's grammar: `ring,tree`, `^naive`, `allreduce:ring,tree;broadcast:chain`
    /// (default: $COLLC_ALGO, else every library algorithm).
    #[arg(long)]
    pub algo: Option<String>,
    /// Also print every candidate's predicted time at every size.
    #[arg(long)]
    pub all: bool,
    /// Print a table, or one JSON document (per collective: the candidates, those not admitted and why, the winner per size range).
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    #[command(flatten)]
    pub bind: BindArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// The algorithm filter of `--algo`, else of `COLLC_ALGO`, else none.
pub fn algo_filter(arg: Option<&str>) -> Result<AlgoFilter, String> {
    match arg {
        Some(text) => AlgoFilter::parse_in(text, library()).map_err(|e| format!("--algo `{text}`: {e}")),
        None => match std::env::var("COLLC_ALGO") {
            Ok(text) if !text.trim().is_empty() => {
                AlgoFilter::parse_in(&text, library()).map_err(|e| format!("COLLC_ALGO=`{text}`: {e}"))
            }
            _ => Ok(AlgoFilter::default()),
        },
    }
}

/// The compiler's field of candidates (`cost::field`) for `n_ranks` on `topo`. Errors carry an exit code: 2 when
/// the filter leaves no candidate (a usage error), 1 when a candidate fails to verify (its diagnostics printed) or
/// none admits the rank count.
pub fn field(
    collective: Collective,
    filter: &AlgoFilter,
    n_ranks: u32,
    topo: &Topology,
    bind: &BindArgs,
    limits: &Limits,
) -> Result<Field, (u8, String)> {
    collc_compiler::cost::field(collective, library(), filter, &bind.bindings(n_ranks), limits, topo)
        .map_err(|error| field_error(error, n_ranks))
}

/// A field that could not be made, as an exit code and a message (a candidate's diagnostics printed first).
pub fn field_error(error: FieldError, n_ranks: u32) -> (u8, String) {
    match error {
        FieldError::Filter(message) => (2, message),
        FieldError::Invalid { name, file, source, errors } => {
            report::print_all(&errors, &file, &source);
            (1, format!("{name} does not verify for {n_ranks} ranks"))
        }
        FieldError::NoneAdmits(message) => (1, message),
    }
}

fn collectives(arg: Option<&str>) -> Result<Vec<Collective>, String> {
    match arg {
        Some(name) => Ok(vec![name.parse().map_err(|e: String| format!("{name}: {e}"))?]),
        None => Ok(Collective::ALL.iter().copied().filter(|&c| c != Collective::SendRecv).collect()),
    }
}

pub fn run(args: TuneArgs) -> u8 {
    let setup = (|| {
        let sizes = args.sizes.list()?;
        let topo = cost::topology(args.topo.as_deref(), args.ranks)?;
        Ok::<_, String>((sizes, topo, algo_filter(args.algo.as_deref())?, collectives(args.collective.as_deref())?))
    })();
    let (sizes, topo, filter, collectives) = match setup {
        Ok(found) => found,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let limits = args.limits.limits();
    let mut report_json = Vec::new();
    if args.format == Format::Table {
        println!("# collc tune: {} ranks; topology: {}: {}", args.ranks, topo.title(), topo.describe());
    }
    let every_collective = collectives.len() > 1;
    for collective in collectives {
        let field = match field(collective, &filter, args.ranks, &topo, &args.bind, &limits) {
            Ok(f) => f,
            // A filter meant for other collectives leaves this one out of a tune of them all.
            Err((2, e)) if every_collective => {
                if args.format == Format::Table {
                    println!("#\n# {collective}: skipped: {e}");
                }
                continue;
            }
            Err((code, e)) => {
                eprintln!("error: {e}");
                return code;
            }
        };
        let ranges = winning_ranges(&field.candidates, &sizes);
        match args.format {
            Format::Table => print_table(collective, &field, &ranges, &sizes, args.all),
            Format::Json => report_json.push(serde_json::json!({
                "collective": collective.name(),
                "candidates": field.candidates.iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
                "not_admitted": field.not_admitted.iter().map(|(n, why)| serde_json::json!({"algorithm": n, "why": why})).collect::<Vec<_>>(),
                "ranges": ranges.iter().map(|&(from, to, i)| serde_json::json!({
                    "from": from, "to": to, "algorithm": field.candidates[i].name,
                    "time_us_from": field.candidates[i].profile.seconds(from as f64) * 1e6,
                    "time_us_to": field.candidates[i].profile.seconds(to as f64) * 1e6,
                })).collect::<Vec<_>>(),
            })),
        }
    }
    if args.format == Format::Json {
        let doc = serde_json::json!({ "ranks": args.ranks, "topology": topo, "collectives": report_json });
        println!("{}", serde_json::to_string_pretty(&doc).expect("JSON values serialise"));
    }
    0
}

fn print_table(collective: Collective, field: &Field, ranges: &[(u64, u64, usize)], sizes: &[u64], all: bool) {
    let names: Vec<&str> = field.candidates.iter().map(|c| c.name.as_str()).collect();
    println!("#\n# {collective}: candidates {}", names.join(", "));
    for (name, why) in &field.not_admitted {
        println!("#   not admitted: {name} ({why})");
    }
    println!("# {:>12} {:>12}   {:<22} {:>12} {:>12}", "from", "to", "algorithm", "time(us)", "to(us)");
    for &(from, to, i) in ranges {
        let c = &field.candidates[i];
        println!(
            "  {from:>12} {to:>12}   {:<22} {:>12.2} {:>12.2}",
            c.name,
            c.profile.seconds(from as f64) * 1e6,
            c.profile.seconds(to as f64) * 1e6
        );
    }
    if all {
        print!("# {:>12}", "size");
        for name in &names {
            print!(" {name:>14.14}");
        }
        println!();
        for &size in sizes {
            let best = fastest(&field.candidates, size as f64);
            print!("  {size:>12}");
            for (i, c) in field.candidates.iter().enumerate() {
                let mark = if Some(i) == best { "*" } else { " " };
                print!(" {:>13.2}{mark}", c.profile.seconds(size as f64) * 1e6);
            }
            println!();
        }
    }
}
