//! `collc import FILE.xml`: read an MSCCL XML file (either dialect), verify it as collc verifies its own
//! schedules, say what it is and whether it computes its collective, and optionally write it as `.sched` or JSON.

use crate::args::LimitArgs;
use crate::library;
use crate::report;
use clap::{Args, ValueEnum};
use collc_compiler::emit::{to_json, write_sched};
use collc_compiler::msccl;
use collc_compiler::Placement;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ImportEmit {
    /// The verified schedule as `.sched` text, which `collc check`, `run` and `cost` take as it stands.
    Sched,
    Json,
}

#[derive(Args)]
pub struct ImportArgs {
    /// An MSCCL XML file (msccl-tools / MSCCLang output, or RCCL's and msccl-executor-nccl's algorithm files).
    pub file: String,
    /// Write the verified schedule in this form (to --output, else standard output) instead of the summary.
    #[arg(long, value_enum)]
    pub emit: Option<ImportEmit>,
    /// The file --emit writes.
    #[arg(long, value_name = "FILE", requires = "emit")]
    pub output: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub limits: LimitArgs,
}

pub fn run(args: ImportArgs) -> u8 {
    let text = match std::fs::read(&args.file) {
        Ok(bytes) if bytes.len() > msccl::MAX_BYTES => {
            eprintln!(
                "error: {}: {} bytes; MSCCL XML files are read up to {} MiB",
                args.file,
                bytes.len(),
                msccl::MAX_BYTES >> 20
            );
            return 2;
        }
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => {
                eprintln!("error: {}: not UTF-8 text ({e})", args.file);
                return 2;
            }
        },
        Err(e) => {
            eprintln!("error: cannot read `{}`: {e}", args.file);
            return 2;
        }
    };
    let source = library::Source { name: args.file.clone(), text };
    let limits = args.limits.limits();
    let imported = match msccl::import(&source.text, &limits) {
        Ok(imported) => imported,
        Err(errors) => {
            report::print_all(&errors, &source.name, &source.text);
            println!("{}: does not import ({} error(s) above)", source.name, errors.0.len());
            return 1;
        }
    };
    let summary = describe(&imported);
    let mut verified_all = Vec::new();
    for placement in imported.placements.clone() {
        let imported = match placement == imported.schedule.placement {
            true => imported.clone(),
            false => match msccl::import_as(&source.text, &limits, Some(placement)) {
                Ok(other) => other,
                Err(errors) => return refused(&source, &summary, placement, &errors),
            },
        };
        match msccl::verify(imported, &source.text, &limits) {
            Ok((verified, _)) => verified_all.push(verified),
            Err(errors) => return refused(&source, &summary, placement, &errors),
        }
    }
    let first = &verified_all[0];
    match args.emit {
        None => {
            println!("{}: {summary}", source.name);
            for verified in &verified_all {
                println!(
                    "verified {}: {} ({} instructions)",
                    verified.placement,
                    verified.verdict(),
                    verified.n_instrs()
                );
            }
            0
        }
        Some(emit) => {
            let text = match emit {
                ImportEmit::Sched => write_sched(first, ""),
                ImportEmit::Json => {
                    serde_json::to_string_pretty(&to_json(first, "")).expect("JSON values serialise") + "\n"
                }
            };
            crate::build::write_output(args.output.as_deref(), &text)
        }
    }
}

fn refused(source: &library::Source, summary: &str, placement: Placement, errors: &collc_compiler::Errors) -> u8 {
    report::print_all(errors, &source.name, &source.text);
    println!("{}: {summary}", source.name);
    println!("does not verify {placement}: {} error(s) above", errors.0.len());
    1
}

/// One line on what the file is: name, collective, ranks, placement, dialect, protocol, size range, thread blocks.
fn describe(imported: &msccl::Imported) -> String {
    let sched = &imported.schedule;
    let tbs: usize = imported
        .origins
        .iter()
        .map(|rank| {
            let mut ids: Vec<u32> = rank.iter().map(|o| o.tb).collect();
            ids.sort_unstable();
            ids.dedup();
            ids.len()
        })
        .max()
        .unwrap_or(0);
    let channels = imported.origins.iter().flatten().map(|o| o.channel + 1).max().unwrap_or(0);
    let bytes = imported.bytes.map(|(lo, hi)| format!(", for {lo}..={hi} bytes")).unwrap_or_default();
    format!(
        "{} for {} on {} ranks, {}, {} chunks per rank's block, {} dialect, proto {}{bytes}; up to {tbs} thread blocks \
         per rank on {channels} channel(s)",
        sched.algorithm,
        sched.collective,
        sched.n_ranks,
        sched.placement,
        sched.chunks,
        imported.dialect.name(),
        imported.proto
    )
}
