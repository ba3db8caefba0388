//! What `collc check` prints: one line per rank count stating the verdict of every binding and placement it
//! covers, failures' diagnostics (a repeat in one line), the replicas' summary, the seed and fall-back notes, and
//! the JSON of each outcome.

use super::{Checked, Outcome, REPLICAS_MAX_RANKS};
use crate::library;
use crate::report;
use collc_compiler::replicas::Replicas;
use collc_compiler::verify::EXACT_AUTO_RANKS;
use collc_compiler::{Error, Errors, Placement, Seed, Verdict, Verification};
use serde_json::json;

/// What a failure reports, as (code, line of its primary span) pairs: a failure with the same pairs as one whose
/// diagnostics were printed (at another rank count, binding or placement) is summed up in one line.
pub(super) fn failure_signature(errors: &Errors, source: &str) -> Vec<(&'static str, usize)> {
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

/// Whether a keyed verdict at `p` ranks is the fallback of an exact run that outgrew its budget (`Auto` verifies
/// exactly up to `EXACT_AUTO_RANKS`), and the note that says so.
pub(super) fn fallback_note(limits: &collc_compiler::Limits, p: u32, verdicts: &[Verdict]) -> Option<String> {
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

pub(super) fn verdict_json(verdict: Verdict, limits: &collc_compiler::Limits, p: u32) -> serde_json::Value {
    match verdict {
        Verdict::Exact => json!({"mode": "exact"}),
        Verdict::Keyed(seed) => json!({
            "mode": "keyed", "seed": seed.to_string(), "error_bound_log2": -(collc_compiler::verify::ERROR_BOUND_BITS as i64),
            "exact_fallback": fallback_note(limits, p, &[verdict]).is_some(),
        }),
    }
}

pub(super) fn replicas_json(replicas: Replicas) -> serde_json::Value {
    json!({"agree": replicas.agree(), "chunk_independent": replicas.chunk_independent()})
}

pub(super) fn errors_json(errors: &Errors, source: &str) -> serde_json::Value {
    let line = |e: &Error| e.primary_span().map(|s| collc_compiler::diag::line_at(source, s.start as usize));
    errors.0.iter().map(|e| json!({"code": e.code, "message": e.message, "line": line(e), "note": e.note})).collect()
}

/// Every binding and placement of one rank count, each with its binding's name. A failure of a binding with a root
/// Instruction counts of the verified entries, as `14` or `12-16`, and how many there were.
pub(super) fn instruction_range(counts: &[usize]) -> String {
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
pub(super) fn outcome_line(p: u32, outcomes: &[Checked], failures: &mut Failures, reduces: bool) -> String {
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
pub(super) fn covering(entries: &[(&str, Placement)]) -> String {
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
pub(super) fn verdicts_summary(verdicts: &[Verdict]) -> String {
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
pub(super) struct Failures<'a> {
    /// The signatures printed in full, with where each was.
    pub(super) printed: Vec<(Vec<(&'static str, usize)>, String)>,
    /// Repeats at the current rank count: where, how many errors, and where the one printed was.
    pub(super) repeats: Vec<(String, usize, String)>,
    pub(super) all: bool,
    pub(super) algorithm: &'a str,
    pub(super) source: &'a library::Source,
}

impl Failures<'_> {
    pub(super) fn report(&mut self, at: String, errors: &Errors) {
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
    pub(super) fn flush(&mut self, p: u32) {
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
pub(super) struct ReplicasSummary {
    analysed: bool,
    disagree_at: Option<u32>,
    dependent_at: Option<u32>,
}

impl ReplicasSummary {
    pub(super) fn add(&mut self, p: u32, outcomes: &[Checked]) {
        for checked in outcomes {
            if let Outcome::Verified(_, _, Some(replicas)) = checked.outcome {
                self.analysed = true;
                self.disagree_at = self.disagree_at.or((!replicas.agree()).then_some(p));
                self.dependent_at = self.dependent_at.or((!replicas.chunk_independent()).then_some(p));
            }
        }
    }

    /// `; replicas agree: no (first at p=3), chunk-independent: yes`, or nothing if no schedule was analysed.
    pub(super) fn text(&self, beyond: bool) -> String {
        if !self.analysed {
            return String::new();
        }
        let word = |fails: Option<u32>| fails.map_or("yes".to_string(), |p| format!("no (first at p={p})"));
        let beyond = if beyond { format!(" (analysed up to {REPLICAS_MAX_RANKS} ranks)") } else { String::new() };
        format!("; replicas agree: {}, chunk-independent: {}{beyond}", word(self.disagree_at), word(self.dependent_at))
    }

    pub(super) fn json(&self) -> serde_json::Value {
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
pub(super) fn seed_line(exact: bool, seed: Seed) -> String {
    match exact {
        false => format!("# seed {seed} (--seed {seed} replays this verification)"),
        true => format!(
            "# exact verification (--exact); seed {seed} draws the roots checked above {EXACT_AUTO_RANKS} ranks \
             (--exact --seed {seed} replays them)"
        ),
    }
}

/// One binding's outcome in one placement, for `--format json`.
pub(super) fn result_json(
    p: u32,
    checked: &Checked,
    source: &str,
    limits: &collc_compiler::Limits,
) -> serde_json::Value {
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
