//! `collc check`: verify an algorithm for every requested rank count, in both placements, for every root of a
//! rooted collective (or a spread of roots at large p, drawn from the invocation's seed), exactly or keyed; for a
//! reducing collective, whether its replicas agree bitwise and its results are chunk-independent
//! (`collc_compiler::replicas`, up to `REPLICAS_MAX_RANKS`). Each line states the verdict of every binding and
//! placement it covers.

use crate::args::{parse_rank_list, LimitArgs, ParamArgs, VerifyArgs};
use crate::library;
use crate::report;
use clap::{Args, ValueEnum};
use collc_compiler::lower::node_split;
use collc_compiler::replicas::{self, Replicas};
use collc_compiler::verify::EXACT_AUTO_RANKS;
use collc_compiler::{
    compile_placements, lower, Bindings, Collective, Error, Errors, Join, Placement, Seed, Verdict, Verification,
};
use collc_grammar::ast;
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

/// Which roots `--root` asks for.
enum Roots {
    /// Every root up to `EXACT_AUTO_RANKS` ranks, a spread above.
    Default,
    All,
    List(Vec<u32>),
}

/// `all` or `N,M,..`.
fn parse_roots(text: Option<&str>) -> Result<Roots, String> {
    match text.map(str::trim) {
        None => Ok(Roots::Default),
        Some("all") => Ok(Roots::All),
        Some(list) => list
            .split(',')
            .map(|n| {
                n.trim().parse::<u32>().map_err(|_| format!("`{n}` in `{list}` is not a rank; write all or N,M,.."))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Roots::List),
    }
}

/// Up to `EXACT_AUTO_RANKS` ranks every root; above, 0, 1, p/2, p-1 and four roots drawn from the invocation's
/// seed (fresh from the OS unless `--seed` replays one, exact runs included, so no fixed sample can be fitted; from
/// a stream of their own, independent of the key).
fn root_spread(p: u32, seed: Seed) -> Vec<u32> {
    if p <= EXACT_AUTO_RANKS {
        return (0..p).collect();
    }
    let mut roots = vec![0, 1, p / 2, p - 1];
    roots.extend(collc_compiler::verify::key::draw_ranks(seed, p, 4));
    roots.sort_unstable();
    roots.dedup();
    roots
}

/// The (root, peer) pairs to check at `p`: for a collective without a root, the listed roots if any; for
/// sendrecv without `--peer`, every destination up to 16 ranks, and the neighbours and the opposite rank above.
fn roots_and_peers(
    collective: Option<Collective>,
    p: u32,
    args: &CheckArgs,
    roots: &Roots,
    seed: Seed,
) -> Vec<(Option<u32>, Option<u32>)> {
    let Some(collective) = collective.filter(|c| c.rooted()) else {
        // Without a root to sweep, a listed `--root` is still bound (and must be a rank of p, as lowering checks).
        return match roots {
            Roots::List(list) => list.iter().map(|&root| (Some(root), args.params.peer)).collect(),
            Roots::Default | Roots::All => vec![(None, args.params.peer)],
        };
    };
    let roots = match roots {
        Roots::Default => root_spread(p, seed),
        Roots::All => (0..p).collect(),
        Roots::List(list) => list.clone(),
    };
    let peers = |root: u32| -> Vec<Option<u32>> {
        if collective != Collective::SendRecv || args.params.peer.is_some() {
            return vec![args.params.peer];
        }
        let mut peers: Vec<u32> = match p <= 16 {
            true => (0..p).collect(),
            false => vec![(root + 1) % p, (root + p - 1) % p, (root + p / 2) % p],
        };
        peers.retain(|&q| q != root);
        peers.sort_unstable();
        peers.dedup();
        if peers.is_empty() {
            return vec![None];
        }
        peers.into_iter().map(Some).collect()
    };
    roots.into_iter().flat_map(|root| peers(root).into_iter().map(move |peer| (Some(root), peer))).collect()
}

/// The bindings to check at `n_ranks`: each root (and peer) asked for, and for an algorithm with a node split
/// that `--set` leaves open every ranks-per-node count that divides `n_ranks`, each named (`root=3 n=2 g=4`).
fn bindings(file: &ast::File, args: &CheckArgs, roots: &Roots, seed: Seed, n_ranks: u32) -> Vec<Binding> {
    let collective = file.algorithm.collective.name.parse::<Collective>().ok();
    // A root is named where several are checked: a rooted collective's, or a list given for one without a root.
    let sweep = collective.is_some_and(|c| c.rooted()) || matches!(roots, Roots::List(list) if list.len() > 1);
    let mut out = Vec::new();
    for (root, peer) in roots_and_peers(collective, n_ranks, args, roots, seed) {
        let given = Bindings { peer, ..args.params.bindings(n_ranks, root) };
        let named_root = root.filter(|_| sweep);
        let named_peer = peer.filter(|_| sweep && collective == Some(Collective::SendRecv));
        let mut name = match (named_root, named_peer) {
            (Some(root), Some(peer)) => format!("root={root} peer={peer}"),
            (Some(root), None) => format!("root={root}"),
            _ => String::new(),
        };
        let binding = |name: String, split: String, bindings: Bindings| Binding {
            name,
            split,
            root: named_root,
            peer: named_peer,
            bindings,
        };
        let open = node_split(&file.algorithm)
            .filter(|(nodes, local)| !given.params.iter().any(|(n, _)| n == nodes || n == local));
        let Some((nodes, local)) = open else {
            out.push(binding(name, String::new(), given));
            continue;
        };
        if !name.is_empty() {
            name.push(' ');
        }
        for g in (1..=n_ranks).filter(|g| n_ranks.is_multiple_of(*g)) {
            let split = format!("{nodes}={} {local}={g}", n_ranks / g);
            out.push(binding(format!("{name}{split}"), split, given.clone().with_default_split(&file.algorithm, g)));
        }
    }
    out
}

/// What a failure reports, as (code, line of its primary span) pairs: a failure with the same pairs as one whose
/// diagnostics were printed (at another rank count, binding or placement) is summed up in one line.
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

/// Whether a keyed verdict at `p` ranks is the fallback of an exact run that outgrew its budget (`Auto` verifies
/// exactly up to `EXACT_AUTO_RANKS`), and the note that says so.
fn fallback_note(limits: &collc_compiler::Limits, p: u32, verdicts: &[Verdict]) -> Option<String> {
    let keyed = verdicts.iter().filter(|v| matches!(v, Verdict::Keyed(_))).count();
    let auto = matches!(limits.verification, Verification::Auto(_));
    (auto && p <= EXACT_AUTO_RANKS && keyed > 0).then(|| {
        format!(
            "p={p}: exact verification outgrew its budget of 2^{} contribution terms, so {keyed} schedule(s) were \
             verified keyed instead (error bound 2^-{}; --seed replays it)",
            collc_compiler::verify::key::EXACT_BUDGET.trailing_zeros(),
            collc_compiler::verify::ERROR_BOUND_BITS
        )
    })
}

fn verdict_json(verdict: Verdict, limits: &collc_compiler::Limits, p: u32) -> serde_json::Value {
    match verdict {
        Verdict::Exact => json!({"mode": "exact"}),
        Verdict::Keyed(seed) => json!({
            "mode": "keyed", "seed": seed.to_string(), "error_bound_log2": -(collc_compiler::verify::ERROR_BOUND_BITS as i64),
            "exact_fallback": fallback_note(limits, p, &[verdict]).is_some(),
        }),
    }
}

fn replicas_json(replicas: Replicas) -> serde_json::Value {
    json!({"agree": replicas.agree(), "chunk_independent": replicas.chunk_independent()})
}

fn errors_json(errors: &Errors, source: &str) -> serde_json::Value {
    let line = |e: &Error| e.primary_span().map(|s| collc_compiler::diag::line_at(source, s.start as usize));
    errors.0.iter().map(|e| json!({"code": e.code, "message": e.message, "line": line(e), "note": e.note})).collect()
}

/// Every binding and placement of one rank count, each with its binding's name. A failure of a binding with a root
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

/// Instruction counts of the verified entries, as `14` or `12-16`, and how many there were.
fn instruction_range(counts: &[usize]) -> String {
    let (lo, hi) = (counts.iter().min().copied().unwrap_or(0), counts.iter().max().copied().unwrap_or(0));
    if lo == hi {
        format!("{lo} instructions")
    } else {
        format!("{lo}-{hi} instructions")
    }
}

/// What `collc check` prints for one rank count after `NAME p=P: `: each split and placement that verified (over all
/// roots, as a range of instruction counts) or was not admitted, then the verdict of every binding and placement it
/// covers (one verdict when all verified, else which verified and which FAILED: a line never calls verified a rank
/// count where a root or placement failed), and for a reducing collective what `replicas::analyse` found over the
/// verified schedules. Failures' diagnostics go to `failures`.
fn outcome_line(p: u32, outcomes: &[Checked], failures: &mut Failures, reduces: bool) -> String {
    // Grouped by split and placement, over the roots.
    let mut groups: Vec<(&str, Placement, Vec<usize>)> = Vec::new();
    let mut not_admitted: Vec<&str> = Vec::new();
    let (mut verified, mut failed) = (Vec::new(), Vec::new());
    let (mut verdicts, mut replicas) = (Vec::new(), None::<Replicas>);
    let mut roots: Vec<u32> = outcomes.iter().filter_map(|c| c.root).collect();
    roots.sort_unstable();
    roots.dedup();
    for Checked { name, split, placement, outcome, .. } in outcomes {
        match outcome {
            Outcome::Verified(n, verdict, found) => {
                match groups.iter_mut().find(|(s, pl, _)| s == split && pl == placement) {
                    Some((_, _, counts)) => counts.push(*n),
                    None => groups.push((split, *placement, vec![*n])),
                }
                verified.push((name.as_str(), *placement));
                verdicts.push(*verdict);
                if let Some(found) = *found {
                    replicas = Some(replicas.map_or(found, |r| r.and(found)));
                }
            }
            Outcome::NotAdmitted(why) => {
                if !not_admitted.contains(&why.as_str()) {
                    not_admitted.push(why);
                }
            }
            Outcome::Failed(errors) => {
                let at =
                    if name.is_empty() { format!("p={p} {placement}") } else { format!("p={p} {name} {placement}") };
                failures.report(at, errors);
                // A binding that failed to lower has this one outcome, and neither placement was built.
                match outcomes.iter().filter(|c| c.name == *name).count() {
                    1 => failed.extend(Placement::BOTH.map(|placement| (name.as_str(), placement))),
                    _ => failed.push((name.as_str(), *placement)),
                }
            }
        }
    }
    failures.flush(p);
    let mut line = Vec::new();
    let mut last_split = None;
    for (split, placement, counts) in &groups {
        let named = if split.is_empty() || last_split == Some(split) { String::new() } else { format!("{split}: ") };
        last_split = Some(split);
        line.push(format!("{named}{placement} {}", instruction_range(counts)));
    }
    line.extend(not_admitted.iter().map(|why| format!("not admitted: {why}")));
    let verdict = match (verified.is_empty(), failed.is_empty()) {
        (true, true) => String::new(),
        (false, true) => format!("; {}", verdicts_summary(&verdicts)),
        (true, false) => {
            line.push(format!("FAILED{}", covering(&failed)));
            String::new()
        }
        (false, false) => {
            format!("; {}{}; FAILED{}", verdicts_summary(&verdicts), covering(&verified), covering(&failed))
        }
    };
    if roots.len() > 1 && !line.is_empty() {
        line[0] = format!("{} roots: {}", roots.len(), line[0]);
    }
    let replicas = replicas.filter(|_| reduces).map_or(String::new(), |r| format!("; {r}"));
    format!("{}{verdict}{replicas}", line.join(", "))
}

/// Where a set of (binding, placement) outcomes lie: ` at root=1, root=2 (both placements), root=3 (in-place)`,
/// or ` (out-of-place)` for the one unnamed binding of a rank count. Up to 16 names per placement, then how many
/// more (`--format json` lists each).
fn covering(entries: &[(&str, Placement)]) -> String {
    let mut by_name: Vec<(&str, [bool; 2])> = Vec::new();
    for &(name, placement) in entries {
        let which = usize::from(placement == Placement::InPlace);
        match by_name.iter_mut().find(|(n, _)| *n == name) {
            Some((_, seen)) => seen[which] = true,
            None => {
                let mut seen = [false; 2];
                seen[which] = true;
                by_name.push((name, seen));
            }
        }
    }
    let unnamed = by_name.iter().all(|(name, _)| name.is_empty());
    let mut described = Vec::new();
    for (seen, wording) in
        [([true, true], "both placements"), ([true, false], "out-of-place"), ([false, true], "in-place")]
    {
        let names: Vec<&str> = by_name.iter().filter(|(_, s)| *s == seen).map(|(n, _)| *n).collect();
        match (names.is_empty(), unnamed) {
            (true, _) => {}
            (false, true) => described.push(format!("({wording})")),
            (false, false) => {
                let more = names.len().saturating_sub(16);
                let more = if more > 0 { format!(" and {more} more") } else { String::new() };
                described.push(format!("{}{more} ({wording})", names[..names.len().min(16)].join(", ")));
            }
        }
    }
    match unnamed {
        true => format!(" {}", described.join(", ")),
        false => format!(" at {}", described.join(", ")),
    }
}

/// `verified exactly`, `verified, error bound 2^-105`, or both with their counts, for a set of verdicts.
fn verdicts_summary(verdicts: &[Verdict]) -> String {
    let exact = verdicts.iter().filter(|v| **v == Verdict::Exact).count();
    let keyed = verdicts.len() - exact;
    let bound = collc_compiler::verify::ERROR_BOUND_BITS;
    match (exact, keyed) {
        (_, 0) => "verified exactly".to_string(),
        (0, _) => format!("verified, error bound 2^-{bound}"),
        (exact, keyed) => format!("{exact} schedules verified exactly, {keyed} keyed with error bound 2^-{bound}"),
    }
}

/// Prints failures to stderr: each distinct one with its diagnostics, a repeat (`failure_signature`) in one line,
/// or, for more than four repeats at one rank count (a sweep of roots), one line for them all.
struct Failures<'a> {
    /// The signatures printed in full, with where each was.
    printed: Vec<(Vec<(&'static str, usize)>, String)>,
    /// Repeats at the current rank count: where, how many errors, and where the one printed was.
    repeats: Vec<(String, usize, String)>,
    all: bool,
    algorithm: &'a str,
    source: &'a library::Source,
}

impl Failures<'_> {
    fn report(&mut self, at: String, errors: &Errors) {
        let signature = failure_signature(errors, &self.source.text);
        match self.printed.iter().find(|(s, _)| *s == signature) {
            Some((_, first)) if !self.all => self.repeats.push((at, errors.0.len(), first.clone())),
            _ => {
                eprintln!("{} {at}: FAILED", self.algorithm);
                report::print_all(errors, &self.source.name, &self.source.text);
                self.printed.push((signature, at));
            }
        }
    }

    /// Prints the repeats of rank count `p`.
    fn flush(&mut self, p: u32) {
        let repeats = std::mem::take(&mut self.repeats);
        if repeats.len() <= 4 {
            for (at, n, first) in &repeats {
                eprintln!(
                    "{} {at}: FAILED with {n} error(s), the same codes at the same lines as at {first} (--all-errors \
                     prints them)",
                    self.algorithm
                );
            }
            return;
        }
        let names: Vec<&str> = repeats.iter().map(|(at, _, _)| at.trim_start_matches(&format!("p={p} "))).collect();
        let more = if names.len() > 4 { format!(" and {} more", names.len() - 4) } else { String::new() };
        eprintln!(
            "{} p={p}: FAILED at {} more bindings ({}{more}), the same codes at the same lines as at {} (--all-errors \
             prints them)",
            self.algorithm,
            repeats.len(),
            names[..names.len().min(4)].join(", "),
            repeats[0].2
        );
    }
}

/// The replicas' verdict over the rank counts analysed: the properties, and the first rank count where each fails.
#[derive(Default)]
struct ReplicasSummary {
    analysed: bool,
    disagree_at: Option<u32>,
    dependent_at: Option<u32>,
}

impl ReplicasSummary {
    fn add(&mut self, p: u32, outcomes: &[Checked]) {
        for checked in outcomes {
            if let Outcome::Verified(_, _, Some(replicas)) = checked.outcome {
                self.analysed = true;
                self.disagree_at = self.disagree_at.or((!replicas.agree()).then_some(p));
                self.dependent_at = self.dependent_at.or((!replicas.chunk_independent()).then_some(p));
            }
        }
    }

    /// `; replicas agree: no (first at p=3), chunk-independent: yes`, or nothing if no schedule was analysed.
    fn text(&self, beyond: bool) -> String {
        if !self.analysed {
            return String::new();
        }
        let word = |fails: Option<u32>| fails.map_or("yes".to_string(), |p| format!("no (first at p={p})"));
        let beyond = if beyond { format!(" (analysed up to {REPLICAS_MAX_RANKS} ranks)") } else { String::new() };
        format!("; replicas agree: {}, chunk-independent: {}{beyond}", word(self.disagree_at), word(self.dependent_at))
    }

    fn json(&self) -> serde_json::Value {
        match self.analysed {
            false => serde_json::Value::Null,
            true => json!({
                "agree": self.disagree_at.is_none(), "chunk_independent": self.dependent_at.is_none(),
                "first_disagreement_ranks": self.disagree_at, "first_chunk_dependence_ranks": self.dependent_at,
                "max_ranks": REPLICAS_MAX_RANKS,
            }),
        }
    }
}

/// The seed line `-v` prints, and a check that draws roots above `EXACT_AUTO_RANKS` prints in any case.
fn seed_line(exact: bool, seed: Seed) -> String {
    match exact {
        false => format!("# seed {seed} (--seed {seed} replays this verification)"),
        true => format!(
            "# exact verification (--exact); seed {seed} draws the roots checked above {EXACT_AUTO_RANKS} ranks \
             (--exact --seed {seed} replays them)"
        ),
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
                "summary": {
                    "verified": verified, "not_admitted": skipped, "failed": failed, "seconds": seconds,
                    "replicas": if reduces { replicas.json() } else { serde_json::Value::Null },
                },
            })
        ),
    }
    let single_not_admitted = ranks.len() == 1 && skipped == 1;
    if failed > 0 || single_not_admitted || verified == 0 {
        1
    } else {
        0
    }
}

/// One binding's outcome in one placement, for `--format json`.
fn result_json(p: u32, checked: &Checked, source: &str, limits: &collc_compiler::Limits) -> serde_json::Value {
    let Checked { name, root, peer, placement, outcome, .. } = checked;
    let mut entry = json!({
        "ranks": p, "binding": name, "root": root, "peer": peer, "placement": placement.to_string(),
    });
    let details = match outcome {
        Outcome::Verified(n, verdict, replicas) => json!({
            "outcome": "verified", "instructions": n, "verdict": verdict_json(*verdict, limits, p),
            "replicas": replicas.map(replicas_json),
        }),
        Outcome::NotAdmitted(why) => json!({"outcome": "not admitted", "why": why}),
        Outcome::Failed(errors) => json!({"outcome": "failed", "errors": errors_json(errors, source)}),
    };
    if let (Some(entry), serde_json::Value::Object(details)) = (entry.as_object_mut(), details) {
        entry.extend(details);
    }
    entry
}

#[cfg(test)]
mod tests {
    use super::covering;
    use collc_compiler::Placement::{InPlace, OutOfPlace};

    /// Named bindings are grouped by the placements they cover; the one unnamed binding is its placements alone.
    #[test]
    fn covering_names_each_binding_with_its_placements() {
        let entries = [("root=1", OutOfPlace), ("root=1", InPlace), ("root=2", InPlace), ("root=3", OutOfPlace)];
        assert_eq!(covering(&entries), " at root=1 (both placements), root=3 (out-of-place), root=2 (in-place)");
        assert_eq!(covering(&[("", InPlace)]), " (in-place)");
        assert_eq!(covering(&[("", OutOfPlace), ("", InPlace)]), " (both placements)");
        let many: Vec<String> = (0..20).map(|r| format!("root={r}")).collect();
        let entries: Vec<_> = many.iter().map(|name| (name.as_str(), InPlace)).collect();
        assert!(covering(&entries).ends_with("root=15 and 4 more (in-place)"), "{}", covering(&entries));
    }
}
