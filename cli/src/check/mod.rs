//! `collc check`: verify an algorithm for every requested rank count, in both placements, for every root of a
//! rooted collective (or a spread of roots at large p, drawn from the invocation's seed), exactly or keyed; for a
//! reducing collective, whether its replicas agree bitwise and its results are chunk-independent
//! (`collc_compiler::replicas`, up to `REPLICAS_MAX_RANKS`). Each line states the verdict of every binding and
//! placement it covers (`lines.rs`; the bindings swept at each rank count are `roots.rs`'s). The reduction operators
//! the file defines are reported first (`ops.rs`).

mod lines;
mod ops;
mod roots;

use crate::args::{parse_rank_list, LimitArgs, ParamArgs, VerifyArgs};
use crate::library;
use crate::report;
use clap::{Args, ValueEnum};
use collc_compiler::replicas::{self, Replicas};
use collc_compiler::verify::EXACT_AUTO_RANKS;
use collc_compiler::{compile_placements, lower, Bindings, Collective, Error, Errors, Join, Placement, Seed, Verdict};
use collc_grammar::ast;
use lines::{
    errors_json, fallback_note, outcome_line, replicas_json, result_json, seed_line, verdict_json, verdicts_summary,
    Failures, ReplicasSummary,
};
use roots::{bindings, parse_roots, Roots};
use serde_json::json;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}

#[derive(Args)]
pub struct CheckArgs {
    /// A library name such as `allreduce/ring`, a path to a `.coll` file, or a `.sched` schedule to verify as is.
    pub algorithm: String,
    /// Rank counts: `8`, `2..=64`, `2..64`, `2,4,8`.
    #[arg(long, default_value = "2..=64")]
    pub ranks: String,
    /// Roots of a rooted collective (broadcast, reduce, gather, scatter; the source of sendrecv): `all` or
    /// `N,M,..`. Default: every root up to 64 ranks; above, 0, 1, p/2, p-1 and four drawn from the seed.
    #[arg(long, value_name = "all|N,M,..")]
    pub root: Option<String>,
    #[command(flatten)]
    pub params: ParamArgs,
    #[command(flatten)]
    pub verify: VerifyArgs,
    /// Only print failures and the summary.
    #[arg(short, long)]
    pub quiet: bool,
    /// Print the verification's seed too.
    #[arg(short, long)]
    pub verbose: bool,
    /// Print the diagnostics of every failing rank count; by default a failure that repeats one already printed
    /// (the same error codes at the same lines) gets one line.
    #[arg(long)]
    pub all_errors: bool,
    /// Print lines of text, or one JSON document (every binding's outcome, the seed, the summary).
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    #[command(flatten)]
    pub limits: LimitArgs,
}

enum Outcome {
    /// Its instruction count, its verdict, and what `replicas::analyse` found (up to `REPLICAS_MAX_RANKS`).
    Verified(usize, Verdict, Option<Replicas>),
    NotAdmitted(String),
    Failed(Errors),
}

/// The largest rank count whose schedules `collc check` runs `replicas::analyse` on (as long as exact verification).
const REPLICAS_MAX_RANKS: u32 = EXACT_AUTO_RANKS;

/// One binding to check at a rank count: its name in what is printed (`root=3 n=2 g=4`, empty for none), and the
/// root and peer it binds.
struct Binding {
    name: String,
    /// The node split's part of the name (`n=2 g=4`), and the root and peer it names (those swept).
    split: String,
    root: Option<u32>,
    peer: Option<u32>,
    bindings: Bindings,
}

/// One binding's outcome in one placement, with what the binding names.
struct Checked {
    name: String,
    split: String,
    root: Option<u32>,
    peer: Option<u32>,
    placement: Placement,
    outcome: Outcome,
}

/// Lowers once for one binding, then schedules, fuses and verifies each placement.
fn check_binding(
    text: &str,
    file: &ast::File,
    args: &CheckArgs,
    limits: &collc_compiler::Limits,
    bindings: &Bindings,
) -> Vec<(Placement, Outcome)> {
    // Lowering runs on one core and fills one growing list; the other core faults in its pages meanwhile.
    let program = crate::alloc::while_prefaulting(|| lower(file, bindings, limits));
    let program = match program {
        Ok(program) => program,
        Err(errors) if errors.not_admitted() => {
            return vec![(Placement::OutOfPlace, Outcome::NotAdmitted(errors.0[0].message.clone()))]
        }
        Err(errors) => return vec![(Placement::OutOfPlace, Outcome::Failed(errors))],
    };
    // Two threads (the compiler itself starts none): the two halves of the ranks for both placements, then the two
    // placements' verifications.
    let options = Placement::BOTH.map(|placement| args.params.options(placement));
    let relower = || lower(file, bindings, limits);
    let results = compile_placements(program, &relower, text, options, limits, &Threads);
    Placement::BOTH
        .into_iter()
        .zip(results)
        .map(|(placement, result)| {
            let outcome = match result {
                Ok(verified) => {
                    let replicas = (verified.n_ranks <= REPLICAS_MAX_RANKS).then(|| replicas::analyse(&verified));
                    Outcome::Verified(verified.n_instrs(), verified.verdict(), replicas)
                }
                Err(errors) => Outcome::Failed(errors),
            };
            (placement, outcome)
        })
        .collect()
}

/// Runs the second piece of a `Join` on a thread of its own.
struct Threads;

impl Join for Threads {
    fn join<A: Send, B: Send>(&self, a: impl FnOnce() -> A + Send, b: impl FnOnce() -> B + Send) -> (A, B) {
        std::thread::scope(|scope| {
            let second = scope.spawn(b);
            let first = a();
            (first, second.join().expect("compilation does not panic"))
        })
    }
}

/// A `.sched` file (as `collc build --emit sched` writes it, or by hand) is verified as it stands: its header fixes
/// the rank count, placement and root, so `--ranks` and `--root` do not apply.
fn check_schedule(args: &CheckArgs, source: &library::Source, limits: &collc_compiler::Limits, seed: Seed) -> u8 {
    match crate::library::verify_schedule(source, limits) {
        Ok((verified, _)) => {
            let (n, placement) = (verified.n_ranks, verified.placement);
            let verdict = verified.verdict();
            let replicas = (n <= REPLICAS_MAX_RANKS).then(|| replicas::analyse(&verified));
            match args.format {
                Format::Table => {
                    let shown = replicas.filter(|_| verified.collective.reduces()).map(|r| format!("; {r}"));
                    println!(
                        "{}: {verdict} ({n} ranks, {placement}, {} instructions){}",
                        source.name,
                        verified.n_instrs(),
                        shown.unwrap_or_default()
                    );
                    if let Some(note) = fallback_note(limits, n, &[verdict]) {
                        println!("note: {note}");
                    }
                }
                Format::Json => println!(
                    "{}",
                    json!({
                        "algorithm": source.name, "seed": seed.to_string(), "results": [{
                            "ranks": n, "root": verified.root, "placement": placement.to_string(),
                            "outcome": "verified", "instructions": verified.n_instrs(),
                            "verdict": verdict_json(verdict, limits, n), "replicas": replicas.map(replicas_json),
                        }],
                    })
                ),
            }
            0
        }
        Err(errors) => {
            report::print_all(&errors, &source.name, &source.text);
            match args.format {
                Format::Table => println!("{}: failed with {} error(s)", source.name, errors.0.len()),
                Format::Json => println!(
                    "{}",
                    json!({"algorithm": source.name, "seed": seed.to_string(), "results": [{
                        "outcome": "failed", "errors": errors_json(&errors, &source.text),
                    }]})
                ),
            }
            1
        }
    }
}

/// says which root in each of its diagnostics.
fn check_rank_count(
    file: &ast::File,
    args: &CheckArgs,
    (roots, seed): (&Roots, Seed),
    limits: &collc_compiler::Limits,
    text: &str,
    p: u32,
) -> Vec<Checked> {
    let mut outcomes = Vec::new();
    for binding in bindings(file, args, roots, seed, p) {
        for (placement, mut outcome) in check_binding(text, file, args, limits, &binding.bindings) {
            if let (Outcome::Failed(errors), Some(root)) = (&mut outcome, binding.bindings.root) {
                let peer = binding.bindings.peer.map_or(String::new(), |q| format!(", peer {q}"));
                for error in &mut errors.0 {
                    let bound = format!("with root {root}{peer} ({p} ranks, {placement})");
                    error.note = Some(error.note.take().map_or(bound.clone(), |note| format!("{bound}\n{note}")));
                }
            }
            let Binding { name, split, root, peer, .. } = &binding;
            let (name, split, root, peer) = (name.clone(), split.clone(), *root, *peer);
            outcomes.push(Checked { name, split, root, peer, placement, outcome });
        }
    }
    outcomes
}

pub fn run(args: CheckArgs) -> u8 {
    let source = match library::resolve(&args.algorithm) {
        Ok(s) => s,
        Err(message) => {
            eprintln!("error: {message}");
            return 2;
        }
    };
    let seed = args.verify.seed();
    let limits = collc_compiler::Limits { verification: args.verify.verification(seed), ..args.limits.limits() };
    let table = args.format == Format::Table;
    if args.verbose && table {
        println!("{}", seed_line(args.verify.exact, seed));
    }
    if library::is_schedule(&source) {
        return check_schedule(&args, &source, &limits, seed);
    }
    let ranks = parse_rank_list(&args.ranks).map_err(|message| format!("--ranks: {message}")).and_then(|ranks| {
        ranks.iter().try_for_each(|&p| crate::args::check_rank_count(p, limits.max_ranks)).map(|()| ranks)
    });
    let (ranks, roots) = match (ranks, parse_roots(args.root.as_deref())) {
        (Ok(ranks), Ok(roots)) => (ranks, roots),
        (Err(message), _) => {
            eprintln!("error: {message}");
            return 2;
        }
        (_, Err(message)) => {
            eprintln!("error: --root: {message}");
            return 2;
        }
    };
    let file = match collc_grammar::parse(&source.text, &limits.syntax) {
        Ok(file) => file,
        Err(e) => {
            report::print_all(&Errors(vec![Error::from(e)]), &source.name, &source.text);
            return 1;
        }
    };
    // A `--set` the algorithm cannot take is a usage error, said once, not a failure at every rank count and root.
    if let Some((message, help)) = collc_compiler::lower::unbindable(&file.algorithm, &args.params.set) {
        eprintln!("error: {message} ({help})");
        return 2;
    }
    let op_reports: Vec<ops::OpReport> = file.ops.iter().map(ops::check).collect();
    let op_errors = ops::errors(&op_reports);
    report::print_all(&op_errors, &source.name, &source.text);
    if table {
        op_reports.iter().for_each(|r| println!("{}", r.line));
    }
    let collective = file.algorithm.collective.name.parse::<Collective>().ok();
    let reduces = collective.is_some_and(Collective::reduces);
    // Roots drawn from the seed are only replayable if the seed is shown.
    let draws = collective.is_some_and(Collective::rooted)
        && matches!(roots, Roots::Default)
        && ranks.iter().any(|&p| p > EXACT_AUTO_RANKS);
    if draws && !args.verbose && table {
        println!("{}", seed_line(args.verify.exact, seed));
    }
    // Counted per rank count: verified means every binding verified in both placements.
    let (mut verified, mut skipped, mut failed) = (0, 0, 0);
    let mut failures = Failures {
        printed: Vec::new(),
        repeats: Vec::new(),
        all: args.all_errors,
        algorithm: &args.algorithm,
        source: &source,
    };
    let (mut verdicts, mut results) = (Vec::new(), Vec::new());
    let mut replicas = ReplicasSummary::default();
    let started = std::time::Instant::now();
    for &p in &ranks {
        let outcomes = check_rank_count(&file, &args, (&roots, seed), &limits, &source.text, p);
        let line = outcome_line(p, &outcomes, &mut failures, reduces);
        let rank_verdicts: Vec<Verdict> = outcomes
            .iter()
            .filter_map(|c| match &c.outcome {
                Outcome::Verified(_, verdict, _) => Some(*verdict),
                _ => None,
            })
            .collect();
        match () {
            _ if outcomes.iter().any(|c| matches!(c.outcome, Outcome::Failed(_))) => failed += 1,
            _ if outcomes.iter().any(|c| matches!(c.outcome, Outcome::NotAdmitted(_))) => skipped += 1,
            _ => verified += 1,
        }
        replicas.add(p, &outcomes);
        let note = fallback_note(&limits, p, &rank_verdicts);
        if !table {
            results.extend(outcomes.iter().map(|checked| result_json(p, checked, &source.text, &limits)));
        } else if (!args.quiet || ranks.len() == 1) && !line.is_empty() {
            println!("{} p={p}: {line}", args.algorithm);
        }
        // Said even with -q: the wording of the verdict alone would hide that the default exact run gave way.
        if let (true, Some(note)) = (table, note) {
            println!("note: {} {note}", args.algorithm);
        }
        verdicts.extend(rank_verdicts);
    }
    let seconds = started.elapsed().as_secs_f64();
    let beyond = reduces && ranks.iter().any(|&p| p > REPLICAS_MAX_RANKS);
    match args.format {
        Format::Table => {
            // With failures, the verdict is said to be that of the schedules that verified only.
            let verdict = match (verdicts.len(), failed) {
                (0, _) => String::new(),
                (_, 0) => format!("; {}", verdicts_summary(&verdicts)),
                (n, _) => format!("; {} (the {n} schedules that verified)", verdicts_summary(&verdicts)),
            };
            let replicas = if reduces { replicas.text(beyond) } else { String::new() };
            println!(
                "{}: {verified} rank counts verified in both placements, {skipped} not admitted, {failed} failed ({} rank counts, {seconds:.2} s){verdict}{replicas}",
                args.algorithm,
                ranks.len()
            );
        }
        Format::Json => println!(
            "{}",
            json!({
                "algorithm": args.algorithm, "seed": seed.to_string(), "exact": args.verify.exact, "results": results,
                "operators": op_reports.iter().map(|r| r.json.clone()).collect::<Vec<_>>(),
                "summary": {
                    "verified": verified, "not_admitted": skipped, "failed": failed, "seconds": seconds,
                    "replicas": if reduces { replicas.json() } else { serde_json::Value::Null },
                },
            })
        ),
    }
    let single_not_admitted = ranks.len() == 1 && skipped == 1;
    if failed > 0 || single_not_admitted || verified == 0 || !op_errors.0.is_empty() {
        1
    } else {
        0
    }
}
