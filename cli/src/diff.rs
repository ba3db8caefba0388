//! `collc diff A B`: two verified schedules compared, the header's differences first, then per rank the instructions
//! added, removed and changed. A side is a `.sched` file (verified as it stands), an algorithm (a library name or a
//! `.coll` file, compiled at `--ranks` as `collc build` compiles it) or `REV:PATH`, a file at a git revision.

mod align;

use crate::args::{check_rank_count, CompileArgs};
use crate::library::{self, Source};
use crate::report;
use align::{align, Edit, MAX_EDITS};
use clap::Args;
use collc_compiler::emit::write_sched;
use collc_compiler::{Schedule, VerifiedSchedule};
use std::fmt::Write;

#[derive(Args)]
pub struct DiffArgs {
    /// The old schedule: a `.sched` file, a library name or `.coll` file (compiled at --ranks), or REV:PATH, a
    /// file as `git show REV:PATH` prints it (`HEAD~1:algos/my_ring.coll`; PATH from the repository's top).
    pub old: String,
    /// The new schedule, in any of the same forms.
    pub new: String,
    #[command(flatten)]
    pub compile: CompileArgs,
}

/// 0 when the two schedules are equal, 1 when they differ (or one does not compile or verify), 2 on usage errors.
pub fn run(args: DiffArgs) -> u8 {
    let sides = match read_side(&args.old).and_then(|old| Ok([old, read_side(&args.new)?])) {
        Ok(sides) => sides,
        Err(message) => {
            eprintln!("error: {message}");
            return 2;
        }
    };
    if let Err(message) = check_ranks(&args, &sides) {
        eprintln!("error: {message}");
        return 2;
    }
    let [old, new] = sides.each_ref().map(|side| schedule_of(side, &args.compile));
    let (Some(old), Some(new)) = (old, new) else { return 1 };
    let comparison = compare(&old, &new);
    print!("{}", comparison.render([&sides[0].name, &sides[1].name], [&old, &new]));
    u8::from(!comparison.equal())
}

/// A library name or a file, as `collc build` takes them; else `REV:PATH`, read with `git show`.
fn read_side(arg: &str) -> Result<Source, String> {
    let at_revision = arg.split_once(':').filter(|(rev, path)| {
        !rev.is_empty() && !rev.starts_with('-') && !path.is_empty() && !std::path::Path::new(arg).exists()
    });
    match at_revision {
        Some((rev, path)) if library::library().get(arg).is_none() => git_show(arg, rev, path),
        _ => library::resolve(arg),
    }
}

/// `git show REV:PATH`'s text, named by the argument.
fn git_show(arg: &str, rev: &str, path: &str) -> Result<Source, String> {
    let output = std::process::Command::new("git")
        .args(["show", &format!("{rev}:{path}")])
        .output()
        .map_err(|e| format!("`{arg}`: cannot run `git show` ({e}); REV:PATH reads a file at a git revision"))?;
    if !output.status.success() {
        let why = String::from_utf8_lossy(&output.stderr).trim().replace('\n', "; ");
        return Err(format!("`{arg}` is neither a library algorithm, nor a file, nor a REV:PATH git can show: {why}"));
    }
    let text = String::from_utf8(output.stdout).map_err(|_| format!("`{arg}`: git shows a file that is not text"))?;
    Ok(Source { name: arg.to_string(), text })
}

/// `--ranks` is needed for an algorithm, and must be a rank count `--max-ranks` allows.
fn check_ranks(args: &DiffArgs, sides: &[Source; 2]) -> Result<(), String> {
    match (args.compile.ranks, sides.iter().find(|side| !library::is_schedule(side))) {
        (Some(n_ranks), _) => check_rank_count(n_ranks, args.compile.limits.max_ranks),
        (None, Some(algorithm)) => Err(format!(
            "`{}` is an algorithm: give --ranks N to compile it at (a .sched file carries its own)",
            algorithm.name
        )),
        (None, None) => Ok(()),
    }
}

/// A side's verified schedule, or `None` after printing why it has none.
fn schedule_of(side: &Source, compile: &CompileArgs) -> Option<VerifiedSchedule> {
    // `check_ranks` asked for --ranks where a side is an algorithm; without it lowering would say that 0 ranks is no
    // rank count.
    let outcome = compile.verified(side, compile.ranks.unwrap_or(0));
    outcome.map_err(|errors| report::print_all(&errors, &side.name, &side.text)).ok()
}

/// One instruction as the diff sees it: what it does (its `.sched` text without index, dependencies and span), its
/// dependencies, and its text without the index, as shown.
#[derive(Clone)]
struct Line {
    what: String,
    deps: Vec<usize>,
    shown: String,
}

/// Every rank's instructions, read from the canonical `.sched` text (no source: spans are numbers only).
fn listing(sched: &Schedule) -> Vec<Vec<Line>> {
    let mut ranks: Vec<Vec<Line>> = Vec::with_capacity(sched.n_ranks as usize);
    for text in write_sched(sched, "").lines() {
        if text.starts_with("rank ") {
            ranks.push(Vec::new());
        }
        let (Some(instr), Some(rank)) = (text.strip_prefix("  #"), ranks.last_mut()) else { continue };
        let shown = instr.split_once(' ').map_or("", |(_, rest)| rest);
        let (mut what, mut deps) = (Vec::new(), Vec::new());
        for token in shown.split(' ') {
            match token.strip_prefix("deps=") {
                Some(list) => deps.extend(list.split(',').filter_map(|d| d.parse::<usize>().ok())),
                None if !token.starts_with('@') => what.push(token),
                None => {}
            }
        }
        rank.push(Line { what: what.join(" "), deps, shown: shown.to_string() });
    }
    ranks
}

/// Rank `rank`'s instructions in `listing`; none for a rank it does not have.
fn rank_of(listing: &[Vec<Line>], rank: usize) -> &[Line] {
    listing.get(rank).map_or(&[], Vec::as_slice)
}

/// One rank's alignment: the edits (a `Same` pair whose dependencies differ, through the alignment, is `Changed`).
struct RankDiff {
    rank: usize,
    edits: Vec<Edit>,
    minimal: bool,
}

impl RankDiff {
    fn counts(&self) -> [usize; 3] {
        let mut counts = [0; 3];
        for edit in &self.edits {
            match edit {
                Edit::Added(_) => counts[0] += 1,
                Edit::Removed(_) => counts[1] += 1,
                Edit::Changed(..) => counts[2] += 1,
                Edit::Same(..) => {}
            }
        }
        counts
    }
}

/// Aligns two ranks' instructions by what each does, then compares the dependencies of those at one place.
fn diff_rank(rank: usize, a: &[Line], b: &[Line]) -> RankDiff {
    let what = [a, b].map(|lines| lines.iter().map(|l| l.what.as_str()).collect::<Vec<_>>());
    let aligned = align(&what[0], &what[1], MAX_EDITS);
    let mut to_b = vec![None; a.len()];
    for edit in &aligned.edits {
        if let Edit::Same(i, j) | Edit::Changed(i, j) = *edit {
            to_b[i] = Some(j);
        }
    }
    let same_deps = |i: usize, j: usize| {
        a[i].deps.len() == b[j].deps.len()
            && a[i].deps.iter().zip(&b[j].deps).all(|(&d, &e)| to_b.get(d).copied().flatten() == Some(e))
    };
    let edits = aligned
        .edits
        .into_iter()
        .map(|edit| match edit {
            Edit::Same(i, j) if !same_deps(i, j) => Edit::Changed(i, j),
            other => other,
        })
        .collect();
    RankDiff { rank, edits, minimal: aligned.minimal }
}

/// The header fields two schedules differ in, and each rank that differs, with both listings.
struct Comparison {
    header: Vec<String>,
    ranks: Vec<RankDiff>,
    listings: [Vec<Vec<Line>>; 2],
}

fn compare(old: &Schedule, new: &Schedule) -> Comparison {
    let fields = |s: &Schedule| {
        let params: Vec<String> = s.params.iter().map(|(name, value)| format!("{name}={value}")).collect();
        let buffers: Vec<String> = s.buffers.iter().map(|b| format!("{} {}", b.name, b.chunks)).collect();
        [
            ("algorithm", s.algorithm.clone()),
            ("collective", s.collective.to_string()),
            ("placement", s.placement.to_string()),
            ("ranks", s.n_ranks.to_string()),
            ("chunks", s.chunks.to_string()),
            ("root", s.root.to_string()),
            ("peer", s.peer.to_string()),
            ("params", params.join(" ")),
            ("buffers", buffers.join(", ")),
        ]
    };
    let header = (fields(old).into_iter().zip(fields(new)))
        .filter(|((_, a), (_, b))| a != b)
        .map(|((name, a), (_, b))| format!("{name}: {a} -> {b}"))
        .collect();
    let listings = [listing(old), listing(new)];
    let n_ranks = listings[0].len().max(listings[1].len());
    let ranks = (0..n_ranks)
        .map(|rank| diff_rank(rank, rank_of(&listings[0], rank), rank_of(&listings[1], rank)))
        .filter(|diff| diff.counts() != [0; 3])
        .collect();
    Comparison { header, ranks, listings }
}

impl Comparison {
    fn equal(&self) -> bool {
        self.header.is_empty() && self.ranks.is_empty()
    }

    /// `--- a`/`+++ b` lines, the header's differences, each differing rank's summary and lines, and the verdict.
    fn render(&self, names: [&str; 2], scheds: [&VerifiedSchedule; 2]) -> String {
        let mut out = String::new();
        for ((mark, side), (name, sched)) in [("---", 'a'), ("+++", 'b')].into_iter().zip(names.into_iter().zip(scheds))
        {
            let (placement, n_ranks) = (sched.placement, sched.n_ranks);
            let _ = writeln!(out, "{mark} {side}: {name} ({placement}, {n_ranks} ranks)");
        }
        if !self.header.is_empty() {
            let _ = writeln!(out, "header:");
            for line in &self.header {
                let _ = writeln!(out, "  {line}");
            }
        }
        self.ranks.iter().for_each(|rank| self.render_rank(&mut out, rank));
        let _ = writeln!(out, "{}", self.verdict());
        out
    }

    fn render_rank(&self, out: &mut String, diff: &RankDiff) {
        let [a, b] = self.listings.each_ref().map(|listing| rank_of(listing, diff.rank));
        let [in_a, in_b] = self.listings.each_ref().map(|listing| diff.rank < listing.len());
        if !(in_a && in_b) {
            let (side, count) = if in_a { ('a', a.len()) } else { ('b', b.len()) };
            let _ = writeln!(out, "rank {}: only in {side} ({count} instructions)", diff.rank);
            return;
        }
        let [added, removed, changed] = diff.counts();
        let _ = write!(out, "rank {}: +{added} -{removed} ~{changed}", diff.rank);
        let _ = match diff.minimal {
            true => writeln!(out),
            false => writeln!(out, " (aligned by position: more than {MAX_EDITS} edits apart)"),
        };
        for edit in &diff.edits {
            let _ = match *edit {
                Edit::Same(..) => Ok(()),
                Edit::Removed(i) => writeln!(out, "  - a#{i} {}", a[i].shown),
                Edit::Added(j) => writeln!(out, "  + b#{j} {}", b[j].shown),
                Edit::Changed(i, j) => writeln!(out, "  ~ a#{i} {}\n    b#{j} {}", a[i].shown, b[j].shown),
            };
        }
    }

    /// `equal: ...`, or `differ: ...` with the counts.
    fn verdict(&self) -> String {
        let instructions = |listing: &[Vec<Line>]| listing.iter().map(Vec::len).sum::<usize>();
        let n_ranks = self.listings[0].len().max(self.listings[1].len());
        if self.equal() {
            let count = instructions(&self.listings[0]);
            return format!("equal: the same {n_ranks} ranks and {count} instructions (source spans aside)");
        }
        let [mut added, mut removed, mut changed] = [0; 3];
        for [a, r, c] in self.ranks.iter().map(RankDiff::counts) {
            (added, removed, changed) = (added + a, removed + r, changed + c);
        }
        let fields = self.header.len();
        format!(
            "differ: {fields} header field(s), {} of {n_ranks} ranks (+{added} -{removed} ~{changed} instructions)",
            self.ranks.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use collc_compiler::BuildOptions;

    fn ring(hop: &str) -> String {
        format!(
            "algorithm ring for allreduce {{\n  ranks p\n  chunks p\n\
             for s in 0..p-1 {{ step {{ for r in 0..p {{ send in[(r - s) % p] from r to (r + 1) % p reduce }} }} }}\n\
             for s in 0..p-1 {{ step {{ for r in 0..p {{ send in[{hop}] from r to (r + 1) % p }} }} }}\n}}\n"
        )
    }

    fn built(source: &str, n_ranks: u32) -> VerifiedSchedule {
        collc_compiler::build(source, n_ranks, &BuildOptions::default()).expect("verifies")
    }

    #[test]
    fn a_schedule_equals_itself() {
        let sched = built(&ring("(r + 1 - s) % p"), 4);
        let comparison = compare(&sched, &sched);
        assert!(comparison.equal());
        assert!(comparison
            .render(["x", "x"], [&sched, &sched])
            .ends_with("equal: the same 4 ranks and 28 instructions (source spans aside)\n"));
    }

    #[test]
    fn rank_counts_differ_in_the_header_and_in_ranks_of_one_side() {
        let source = ring("(r + 1 - s) % p");
        let (three, four) = (built(&source, 3), built(&source, 4));
        let comparison = compare(&three, &four);
        assert!(comparison.header.iter().any(|line| line == "ranks: 3 -> 4"), "{:?}", comparison.header);
        let text = comparison.render(["three", "four"], [&three, &four]);
        assert!(text.contains("rank 3: only in b (7 instructions)\n"), "{text}");
    }

    #[test]
    fn a_rank_with_no_instructions_on_one_side_lists_the_others() {
        let source = collc_compiler::library::get("sendrecv/direct").expect("in the library");
        let at = |root| {
            let options = BuildOptions { root: Some(root), ..BuildOptions::default() };
            collc_compiler::build(source, 3, &options).expect("verifies")
        };
        let (from_0, from_1) = (at(0), at(1));
        let text = compare(&from_0, &from_1).render(["root 0", "root 1"], [&from_0, &from_1]);
        assert!(text.contains("  root: 0 -> 1\n  peer: 1 -> 2\n"), "{text}");
        // Rank 0 only sends from root 0, and does nothing from root 1 (out of place, the others copy in to out).
        assert!(text.contains("rank 0: +0 -1 ~0\n  - a#0 Send src=in[0] send=1 @1\nrank 1: "), "{text}");
        assert!(!text.contains("only in"), "{text}");
    }

    #[test]
    fn a_dependency_that_differs_makes_an_instruction_changed() {
        let line = |what: &str, deps: &[usize]| Line { what: what.into(), deps: deps.to_vec(), shown: what.into() };
        let a = [line("Recv dst=out[0] recv=1", &[]), line("Send src=out[0] send=2", &[0])];
        let b = [line("Recv dst=out[0] recv=1", &[]), line("Send src=out[0] send=2", &[])];
        assert_eq!(diff_rank(0, &a, &b).edits, vec![Edit::Same(0, 0), Edit::Changed(1, 1)]);
        let moved = [line("Copy src=in[0] dst=out[1]", &[]), a[0].clone(), line("Send src=out[0] send=2", &[1])];
        assert_eq!(diff_rank(0, &a, &moved).edits, vec![Edit::Added(0), Edit::Same(0, 1), Edit::Same(1, 2)]);
    }
}
