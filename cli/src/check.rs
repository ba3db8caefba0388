//! `collc check`: verify an algorithm for every requested rank count, in both placements.

use crate::args::{parse_rank_list, BindArgs, LimitArgs};
use crate::library;
use crate::report;
use clap::Args;
use collc_compiler::lower::node_split;
use collc_compiler::{compile_placements, lower, verify, Bindings, Error, Errors, Join, Placement};
use collc_grammar::ast;

#[derive(Args)]
pub struct CheckArgs {
    /// A library name such as `allreduce/ring`, a path to a `.coll` file, or a `.sched` schedule to verify as is.
    pub algorithm: String,
    /// Rank counts: `8`, `2..=64`, `2..64`, `2,4,8`.
    #[arg(long, default_value = "2..=64")]
    pub ranks: String,
    #[command(flatten)]
    pub bind: BindArgs,
    /// Only print failures and the summary.
    #[arg(short, long)]
    pub quiet: bool,
    /// Print the diagnostics of every failing rank count; by default a failure that repeats one already printed
    /// (the same error codes at the same lines) gets one line.
    #[arg(long)]
    pub all_errors: bool,
    #[command(flatten)]
    pub limits: LimitArgs,
}

enum Outcome {
    Verified(usize),
    NotAdmitted(String),
    Failed(Errors),
}

/// The bindings to check at `n_ranks`: an algorithm with a node split that `--set` leaves open is checked for
/// every ranks-per-node count that divides `n_ranks`, each named by its split (`n=2 g=4`) in what is printed.
fn bindings(file: &ast::File, args: &CheckArgs, n_ranks: u32) -> Vec<(String, Bindings)> {
    let given = args.bind.bindings(n_ranks);
    let open = node_split(&file.algorithm)
        .filter(|(nodes, local)| !given.params.iter().any(|(n, _)| n == nodes || n == local));
    let Some((nodes, local)) = open else {
        return vec![(String::new(), given)];
    };
    (1..=n_ranks)
        .filter(|g| n_ranks.is_multiple_of(*g))
        .map(|g| (format!("{nodes}={} {local}={g}", n_ranks / g), given.clone().with_default_split(&file.algorithm, g)))
        .collect()
}

/// What a failure reports, as (code, line of its primary span) pairs: a failure with the same pairs as one whose
/// diagnostics were printed (at another rank count, split or placement) is summed up in one line.
fn failure_signature(errors: &Errors, source: &str) -> Vec<(&'static str, usize)> {
    let mut signature: Vec<_> = errors
        .0
        .iter()
        .map(|e| {
            let line = e.primary_span().map_or(0, |s| collc_compiler::diag::line_at(source, s.start as usize));
            (e.code, line)
        })
        .collect();
    signature.sort_unstable();
    signature.dedup();
    signature
}

/// Lowers once for one binding, then schedules, fuses and verifies each placement.
fn check_binding(text: &str, file: &ast::File, args: &CheckArgs, bindings: &Bindings) -> Vec<(Placement, Outcome)> {
    let limits = args.limits.limits();
    // Lowering runs on one core and fills one growing list; the other core faults in its pages meanwhile.
    let program = crate::alloc::while_prefaulting(|| lower(file, bindings, &limits));
    let program = match program {
        Ok(program) => program,
        Err(errors) if is_not_admitted(&errors) => {
            return vec![(Placement::OutOfPlace, Outcome::NotAdmitted(errors.0[0].message.clone()))]
        }
        Err(errors) => return vec![(Placement::OutOfPlace, Outcome::Failed(errors))],
    };
    // Two threads (the compiler itself starts none): the two halves of the ranks for both placements, then the two
    // placements' verifications.
    let options = Placement::BOTH.map(|placement| args.bind.options(placement));
    let relower = || lower(file, bindings, &limits);
    let results = compile_placements(program, &relower, text, options, &limits, &Threads);
    Placement::BOTH
        .into_iter()
        .zip(results)
        .map(|(placement, result)| {
            let outcome = match result {
                Ok(verified) => Outcome::Verified(verified.n_instrs()),
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
/// the rank count and placement, so `--ranks` does not apply.
fn check_schedule(args: &CheckArgs, source: &library::Source) -> u8 {
    let limits = args.limits.limits();
    let outcome = collc_compiler::emit::parse_sched(&source.text)
        .map_err(|e| Errors(vec![e]))
        .and_then(|sched| verify(sched, "", &limits));
    match outcome {
        Ok(verified) => {
            let (n, placement) = (verified.n_ranks, verified.placement);
            println!("{}: verified ({n} ranks, {placement}, {} instructions)", source.name, verified.n_instrs());
            0
        }
        Err(errors) => {
            report::print_all(&errors, &source.name, "");
            println!("{}: failed with {} error(s)", source.name, errors.0.len());
            1
        }
    }
}

/// A rank count the algorithm's `where`, node split or root does not admit is skipped in a sweep, not a failure.
pub fn is_not_admitted(errors: &Errors) -> bool {
    matches!(
        errors.0.as_slice(),
        [Error { code: "collc::lower::where" | "collc::lower::nodes" | "collc::lower::root", .. }]
    )
}

/// Both placements of every binding of one rank count, each with its split's name (empty without an open split).
fn check_rank_count(file: &ast::File, args: &CheckArgs, text: &str, p: u32) -> Vec<(String, Placement, Outcome)> {
    bindings(file, args, p)
        .into_iter()
        .flat_map(|(split, b)| {
            check_binding(text, file, args, &b).into_iter().map(move |(placement, o)| (split.clone(), placement, o))
        })
        .collect()
}

/// What `collc check` prints for one rank count: each split and placement that verified or was not admitted (a split
/// named once, before its first entry); a failure goes to `failures` instead.
fn outcome_line(p: u32, outcomes: &[(String, Placement, Outcome)], failures: &mut Failures) -> Vec<String> {
    let mut line = Vec::new();
    let mut last_split = None;
    for (split, placement, outcome) in outcomes {
        let entry = match outcome {
            Outcome::Verified(n) => format!("{placement} {n} instructions"),
            Outcome::NotAdmitted(why) => format!("not admitted: {why}"),
            Outcome::Failed(errors) => {
                let at =
                    if split.is_empty() { format!("p={p} {placement}") } else { format!("p={p} {split} {placement}") };
                failures.report(at, errors);
                continue;
            }
        };
        let named = if split.is_empty() || last_split == Some(split) { String::new() } else { format!("{split}: ") };
        last_split = Some(split);
        line.push(format!("{named}{entry}"));
    }
    line
}

/// Prints failures to stderr: each distinct one with its diagnostics, a repeat (`failure_signature`) in one line.
struct Failures<'a> {
    /// The signatures printed in full, with where each was.
    printed: Vec<(Vec<(&'static str, usize)>, String)>,
    all: bool,
    algorithm: &'a str,
    source: &'a library::Source,
}

impl Failures<'_> {
    fn report(&mut self, at: String, errors: &Errors) {
        let signature = failure_signature(errors, &self.source.text);
        match self.printed.iter().find(|(s, _)| *s == signature) {
            Some((_, first)) if !self.all => eprintln!(
                "{} {at}: FAILED with {} error(s), the same codes at the same lines as at {first} (--all-errors \
                 prints them)",
                self.algorithm,
                errors.0.len()
            ),
            _ => {
                eprintln!("{} {at}: FAILED", self.algorithm);
                report::print_all(errors, &self.source.name, &self.source.text);
                self.printed.push((signature, at));
            }
        }
    }
}

pub fn run(args: CheckArgs) -> u8 {
    let source = match library::resolve(&args.algorithm) {
        Ok(s) => s,
        Err(message) => {
            eprintln!("error: {message}");
            return 2;
        }
    };
    if source.name.ends_with(".sched") {
        return check_schedule(&args, &source);
    }
    let ranks = match parse_rank_list(&args.ranks) {
        Ok(r) => r,
        Err(message) => {
            eprintln!("error: --ranks: {message}");
            return 2;
        }
    };
    let file = match collc_grammar::parse(&source.text, &args.limits.limits().syntax) {
        Ok(file) => file,
        Err(e) => {
            report::print_all(&Errors(vec![Error::from(e)]), &source.name, &source.text);
            return 1;
        }
    };
    // Counted per rank count: verified means both placements verified.
    let (mut verified, mut skipped, mut failed) = (0, 0, 0);
    let mut failures =
        Failures { printed: Vec::new(), all: args.all_errors, algorithm: &args.algorithm, source: &source };
    let started = std::time::Instant::now();
    for &p in &ranks {
        let outcomes = check_rank_count(&file, &args, &source.text, p);
        let line = outcome_line(p, &outcomes, &mut failures);
        match () {
            _ if outcomes.iter().any(|(_, _, o)| matches!(o, Outcome::Failed(_))) => failed += 1,
            _ if outcomes.iter().any(|(_, _, o)| matches!(o, Outcome::NotAdmitted(_))) => skipped += 1,
            _ => verified += 1,
        }
        if (!args.quiet || ranks.len() == 1) && !line.is_empty() {
            println!("{} p={p}: {}", args.algorithm, line.join(", "));
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{}: {verified} rank counts verified in both placements, {skipped} not admitted, {failed} failed ({} rank counts, {seconds:.2} s)",
        args.algorithm,
        ranks.len()
    );
    let single_not_admitted = ranks.len() == 1 && skipped == 1;
    if failed > 0 || single_not_admitted || verified == 0 {
        1
    } else {
        0
    }
}
