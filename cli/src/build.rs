//! `collc build`: compile one algorithm for one binding and print (or write) the output of a stage.

use crate::args::{BindArgs, LimitArgs};
use crate::library;
use crate::report;
use clap::{Args, ValueEnum};
use collc_compiler::emit::{to_json, write_sched};
use collc_compiler::msccl;
use collc_compiler::{compile_program, lower, pipelined, Error, Errors, Options, Placement};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Emit {
    Ast,
    Ir,
    Sched,
    Json,
    /// MSCCL XML for `--target` (msccl-legacy: the NCCL fork's interpreter; msccl-executor: msccl-executor-nccl and
    /// RCCL), the target's limits checked; the file is read back and verified before it is written.
    MscclXml,
    /// MSCCL++'s execution-plan JSON (as `src/core/executor/execution_plan.cc` reads it at microsoft/mscclpp
    /// 00668b4; docs/language.md §13).
    MscclppJson,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum XmlTarget {
    MscclLegacy,
    MscclExecutor,
}

#[derive(Args)]
pub struct BuildArgs {
    /// A library name such as `allreduce/ring`, or a path to a `.coll` file.
    pub algorithm: String,
    /// Number of ranks.
    #[arg(long)]
    pub ranks: u32,
    #[command(flatten)]
    pub bind: BindArgs,
    /// Which stage's output to print.
    #[arg(long, value_enum, default_value = "sched")]
    pub emit: Emit,
    /// Build the in-place variant (NCCL's sendbuff == recvbuff layout).
    #[arg(long)]
    pub in_place: bool,
    /// The runtime `--emit msccl-xml` writes for.
    #[arg(long, value_enum, default_value = "msccl-executor")]
    pub target: XmlTarget,
    /// Skip the Recv+Reduce+Send fusion pass.
    #[arg(long)]
    pub no_fuse: bool,
    /// Write the output to this file [default: standard output]. (No `-o`: in `collc run` it is nccl-tests' `--op`.)
    #[arg(long, value_name = "FILE")]
    pub output: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub limits: LimitArgs,
}

pub fn run(args: BuildArgs) -> u8 {
    let source = match library::resolve(&args.algorithm) {
        Ok(s) => s,
        Err(message) => {
            eprintln!("error: {message}");
            return 2;
        }
    };
    if let Err(message) = crate::args::check_rank_count(args.ranks, args.limits.max_ranks) {
        eprintln!("error: {message}");
        return 2;
    }
    match produce(&args, &source.text) {
        Ok(text) => write_output(args.output.as_deref(), &text),
        Err(errors) => {
            report::print_all(&errors, &source.name, &source.text);
            1
        }
    }
}

/// Writes `text` to `path`, or standard output; the exit status.
pub fn write_output(path: Option<&std::path::Path>, text: &str) -> u8 {
    match path {
        Some(path) => match std::fs::write(path, text) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: cannot write {}: {e}", path.display());
                1
            }
        },
        None => {
            print!("{text}");
            0
        }
    }
}

fn produce(args: &BuildArgs, text: &str) -> Result<String, Errors> {
    let limits = args.limits.limits();
    let file = collc_grammar::parse(text, &limits.syntax).map_err(Error::from)?;
    if let Emit::Ast = args.emit {
        return Ok(serde_json::to_string_pretty(&file).expect("the AST serialises") + "\n");
    }
    // As in `collc check`: the other core faults in the pages of the list lowering grows.
    let program = crate::alloc::while_prefaulting(|| lower(&file, &args.bind.bindings(args.ranks), &limits))?;
    let placement = if args.in_place { Placement::InPlace } else { Placement::OutOfPlace };
    let options = Options { fuse: !args.no_fuse, ..args.bind.options(placement) };
    if let Emit::Ir = args.emit {
        return Ok(pipelined(&program, options, &limits)?.to_string());
    }
    let verified = compile_program(&program, text, options, &limits)?;
    Ok(match args.emit {
        Emit::MscclXml => {
            let target = match args.target {
                XmlTarget::MscclLegacy => msccl::Target::Legacy,
                XmlTarget::MscclExecutor => msccl::Target::Executor,
            };
            msccl::export(&verified, target, &limits)?
        }
        Emit::MscclppJson => msccl::mscclpp::export(&verified, &limits)?,
        Emit::Json => serde_json::to_string_pretty(&to_json(&verified, text)).expect("JSON values serialise") + "\n",
        _ => write_sched(&verified, text),
    })
}
