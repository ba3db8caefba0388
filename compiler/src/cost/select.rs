//! Algorithm selection, as NCCL's tuner does it: the predicted-fastest candidate per call size. The candidates are
//! the library's algorithms for the collective, narrowed by a filter in NCCL_ALGO's grammar (`COLLC_ALGO`,
//! `--algo`): `ring,tree` keeps those, `^tree` drops those, `allreduce:tree,ring;broadcast:chain` sets them per
//! collective. Names are case-insensitive; a name the library does not have is an error (the library: the embedded
//! one, and users' own algorithms where a `Library` with files is given). A part `deterministic`
//! (`deterministic=strict`) admits only algorithms whose replicas agree bitwise (and whose results do not depend on
//! the message size) at the binding's rank count, as `replicas::analyse` finds on their verified schedules.

use super::model::Profile;
use super::{analyse_keeping, Topology};
use crate::diag::{Error, Errors};
use crate::library::Library;
use crate::replicas::{self, Determinism};
use crate::{lower, Bindings, Collective, Limits, Options, Placement};

/// Include or exclude a list of algorithm names.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    exclude: bool,
    names: Vec<String>,
}

/// A parsed `--algo` / `COLLC_ALGO` value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AlgoFilter {
    global: Option<Rule>,
    per_collective: Vec<(Collective, Rule)>,
    /// What determinism a candidate must have (`deterministic`, `deterministic=strict`); none by default.
    deterministic: Option<Determinism>,
}

impl AlgoFilter {
    /// Parses `text`, its names checked against the embedded library.
    pub fn parse(text: &str) -> Result<Self, String> {
        AlgoFilter::parse_in(text, Library::embedded())
    }

    /// Parses `text`, its names checked against `library`.
    pub fn parse_in(text: &str, library: &Library) -> Result<Self, String> {
        let mut filter = AlgoFilter::default();
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            if let Some(level) = parse_deterministic(part)? {
                if filter.deterministic.is_some() {
                    return Err("`deterministic` is given twice".into());
                }
                filter.deterministic = Some(level);
                continue;
            }
            let (collective, list) = match part.split_once(':') {
                Some((c, list)) => {
                    let collective: Collective = c.trim().parse().map_err(|_| {
                        format!("`{}` is not a collective (allreduce, broadcast, ...) in `{part}`", c.trim())
                    })?;
                    (Some(collective), list)
                }
                None => (None, part),
            };
            let rule = parse_rule(list, collective, library)?;
            match collective {
                Some(c) if filter.per_collective.iter().any(|(d, _)| *d == c) => {
                    return Err(format!("{c} is given twice"));
                }
                Some(c) => filter.per_collective.push((c, rule)),
                None if filter.global.is_some() => return Err("two lists apply to every collective".into()),
                None => filter.global = Some(rule),
            }
        }
        Ok(filter)
    }

    /// Whether the filter says anything about `collective` (a list for every collective, one for it, or a
    /// determinism every collective must have).
    pub fn mentions(&self, collective: Collective) -> bool {
        self.global.is_some()
            || self.per_collective.iter().any(|(c, _)| *c == collective)
            || self.deterministic.is_some()
    }

    /// The same filter, also requiring `level` (the stricter of it and the filter's own).
    pub fn requiring(mut self, level: Determinism) -> Self {
        self.deterministic = self.deterministic.max(Some(level));
        self
    }

    /// The determinism a candidate must have, if any.
    pub fn deterministic(&self) -> Option<Determinism> {
        self.deterministic
    }

    fn rule(&self, collective: Collective) -> Option<&Rule> {
        self.per_collective.iter().find(|(c, _)| *c == collective).map(|(_, r)| r).or(self.global.as_ref())
    }

    /// The embedded library's algorithms of `collective` the filter leaves, or why there are none.
    pub fn candidates(&self, collective: Collective) -> Result<Vec<String>, String> {
        self.candidates_in(Library::embedded(), collective)
    }

    /// The algorithms of `collective` in `library` the filter leaves (the embedded ones first), or why there are none.
    pub fn candidates_in(&self, library: &Library, collective: Collective) -> Result<Vec<String>, String> {
        let all = library.names(collective);
        let mut kept: Vec<&str> = match self.rule(collective) {
            None => all.clone(),
            Some(rule) => all
                .iter()
                .copied()
                .filter(|name| rule.names.iter().any(|n| n.eq_ignore_ascii_case(name)) != rule.exclude)
                .collect(),
        };
        if kept.is_empty() {
            return Err(format!("the algorithm filter leaves no {collective} algorithm (it has {})", all.join(", ")));
        }
        // The collective's default goes first, so that it wins a tie (`fastest` keeps the first): on one node,
        // `allreduce/hierarchical` is the ring's schedule with its chunks rotated, and NCCL's default is the ring.
        let default = crate::library::default_for(collective).split_once('/').map_or("", |(_, name)| name);
        kept.sort_by_key(|name| *name != default);
        Ok(kept.into_iter().map(str::to_string).collect())
    }
}

/// `deterministic` or `deterministic=LEVEL` (`replicas`, `strict`); `None` for any other part.
fn parse_deterministic(part: &str) -> Result<Option<Determinism>, String> {
    let (name, level) = part.split_once('=').unwrap_or((part, ""));
    if !name.trim().eq_ignore_ascii_case("deterministic") {
        return Ok(None);
    }
    level.parse().map(Some).map_err(|e| format!("{e} (in `{part}`)"))
}

fn parse_rule(list: &str, collective: Option<Collective>, library: &Library) -> Result<Rule, String> {
    let list = list.trim();
    let (exclude, list) = match list.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, list),
    };
    let names: Vec<String> = list.split(',').map(|n| n.trim().to_ascii_lowercase()).filter(|n| !n.is_empty()).collect();
    if names.is_empty() {
        return Err(format!("`{list}` names no algorithm"));
    }
    let known: Vec<&str> = match collective {
        Some(c) => library.names(c),
        None => library.entries().iter().map(|e| e.short_name()).collect(),
    };
    if let Some(unknown) = names.iter().find(|n| !known.iter().any(|k| k.eq_ignore_ascii_case(n))) {
        let scope = collective.map_or("the library".to_string(), |c| c.to_string());
        let mut known = known.clone();
        known.sort_unstable();
        known.dedup();
        let message = format!("`{unknown}` is not an algorithm of {scope} (known: {})", known.join(", "));
        return Err(crate::diag::with_suggestion(message, unknown, &known));
    }
    Ok(Rule { exclude, names })
}

/// One algorithm's cost profile, ready to compare, and the schedule it was costed on (out of place, for the
/// field's bindings), which a runtime that chooses it runs without compiling it again.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub name: String,
    pub profile: Profile,
    /// The parameters it was costed with: the field's, and the node split of the topology where it declares one.
    pub params: Vec<(String, i64)>,
    pub schedule: Option<std::sync::Arc<crate::VerifiedSchedule>>,
    /// The file a user's algorithm was read from; `None` for the embedded library's.
    pub file: Option<String>,
}

/// The index of the predicted-fastest candidate for a call of `bytes` (the first one on a tie).
pub fn fastest(candidates: &[Candidate], bytes: f64) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, c) in candidates.iter().enumerate() {
        let t = c.profile.seconds(bytes);
        if best.is_none_or(|(_, b)| t < b) {
            best = Some((i, t));
        }
    }
    best.map(|(i, _)| i)
}

/// Consecutive sizes won by the same candidate: (first size, last size, candidate index).
pub fn winning_ranges(candidates: &[Candidate], sizes: &[u64]) -> Vec<(u64, u64, usize)> {
    let mut ranges: Vec<(u64, u64, usize)> = Vec::new();
    for &size in sizes {
        let Some(winner) = fastest(candidates, size as f64) else { continue };
        match ranges.last_mut() {
            Some(last) if last.2 == winner => last.1 = size,
            _ => ranges.push((size, size, winner)),
        }
    }
    ranges
}

/// The bindings of `file` for a run on `topo`: `bindings`, with the node split of `nodes n local g` taken from the
/// topology where the bindings do not set it.
pub fn bindings_on(file: &collc_grammar::ast::File, bindings: &Bindings, topo: &Topology) -> Bindings {
    bindings.clone().with_default_split(&file.algorithm, topo.per_node(bindings.n_ranks))
}

/// An algorithm costed for one binding, with the schedule it was costed on.
pub struct Costed {
    pub collective: Collective,
    pub profile: Profile,
    /// The bindings' parameters as costed (`bindings_on`).
    pub params: Vec<(String, i64)>,
    pub schedule: crate::VerifiedSchedule,
    /// Slices per chunk of the pipelining pass: `options.pipeline`, else the algorithm's `pipeline` (1: none).
    pub slices: u32,
}

/// Lowers, verifies and profiles `source` out of place for `bindings` on `topo`.
pub fn profile(
    source: &str,
    bindings: &Bindings,
    pipeline: Option<u32>,
    limits: &Limits,
    topo: &Topology,
) -> Result<Costed, Errors> {
    let file = collc_grammar::parse(source, &limits.syntax).map_err(Error::from)?;
    let bound = bindings_on(&file, bindings, topo);
    let program = lower(&file, &bound, limits)?;
    let options = Options { pipeline, ..Options::placed(Placement::OutOfPlace) };
    let (profile, schedule) = analyse_keeping(&program, source, options, limits, topo)?;
    let (collective, slices, params) = (program.collective, options.slices(&program), bound.params);
    Ok(Costed { collective, profile, params, schedule, slices })
}

/// The costed candidates of one collective, and the ones its `where` or node split does not admit (with why).
pub struct Field {
    pub candidates: Vec<Candidate>,
    pub not_admitted: Vec<(String, String)>,
}

/// Why there is no field to select from.
pub enum FieldError {
    /// The filter leaves no candidate of the collective (a usage error).
    Filter(String),
    /// A candidate does not verify: its library name, the file its diagnostics point into (`Entry::shown_as`),
    /// its source and the diagnostics.
    Invalid { name: String, file: String, source: std::sync::Arc<str>, errors: Errors },
    /// No candidate admits the binding on this topology.
    NoneAdmits(String),
}

/// Profiles every algorithm of `collective` in `library` that `filter` leaves, for `bindings` on `topo`: what
/// `collc tune`, `collc run COLLECTIVE` and a communicator select from. A user's algorithm that does not verify is
/// an error, as a library one is (never left out quietly).
pub fn field(
    collective: Collective,
    library: &Library,
    filter: &AlgoFilter,
    bindings: &Bindings,
    limits: &Limits,
    topo: &Topology,
) -> Result<Field, FieldError> {
    let mut field = Field { candidates: Vec::new(), not_admitted: Vec::new() };
    for name in filter.candidates_in(library, collective).map_err(FieldError::Filter)? {
        let full = format!("{collective}/{name}");
        let entry = library.get(&full).expect("candidates come from the library");
        let source = &*entry.source;
        let refusal = match filter.deterministic.filter(|_| collective.reduces()) {
            Some(level) => refusal(source, bindings, level, limits, topo),
            None => Ok(None),
        };
        match refusal.and_then(|refusal| profile(source, bindings, None, limits, topo).map(|c| (refusal, c))) {
            Ok((Some(why), _)) => field.not_admitted.push((name.to_string(), why)),
            Ok((None, costed)) => field.candidates.push(Candidate {
                name: name.to_string(),
                profile: costed.profile,
                params: costed.params,
                schedule: Some(std::sync::Arc::new(costed.schedule)),
                file: entry.file.clone(),
            }),
            Err(errors) if errors.not_admitted() => {
                field.not_admitted.push((name.to_string(), errors.0[0].message.clone()));
            }
            Err(errors) => {
                let (file, source) = (entry.shown_as(), entry.source.clone());
                return Err(FieldError::Invalid { name: full, file, source, errors });
            }
        }
    }
    if field.candidates.is_empty() {
        let n_ranks = bindings.n_ranks;
        let deterministic = match filter.deterministic.filter(|_| collective.reduces()) {
            Some(level) => format!(" with determinism {}", level.name()),
            None => String::new(),
        };
        return Err(FieldError::NoneAdmits(format!(
            "no {collective} algorithm admits {n_ranks} ranks{deterministic} on this topology"
        )));
    }
    Ok(field)
}

/// Why `source` does not meet `level` for `bindings` on `topo` (in either placement), or `None` if it does.
fn refusal(
    source: &str,
    bindings: &Bindings,
    level: Determinism,
    limits: &Limits,
    topo: &Topology,
) -> Result<Option<String>, Errors> {
    let file = collc_grammar::parse(source, &limits.syntax).map_err(Error::from)?;
    let program = lower(&file, &bindings_on(&file, bindings, topo), limits)?;
    for placement in Placement::BOTH {
        let verified = crate::compile_program(&program, source, Options::placed(placement), limits)?;
        if let Some(why) = level.refusal(&replicas::analyse(&verified)) {
            return Ok(Some(format!("not deterministic ({}): {why} at {} ranks", level.name(), bindings.n_ranks)));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::{field, AlgoFilter};
    use crate::cost::Topology;
    use crate::library::Library;
    use crate::replicas::Determinism;
    use crate::{Bindings, Collective, Limits};

    /// `deterministic` is a part of its own, given once, and says something about every collective.
    #[test]
    fn deterministic_parses_as_a_part_of_its_own() {
        let filter = AlgoFilter::parse("^naive; Deterministic=strict").expect("valid");
        assert_eq!(filter.deterministic(), Some(Determinism::Strict));
        assert!(filter.mentions(Collective::Broadcast));
        assert_eq!(AlgoFilter::parse("deterministic").expect("valid").deterministic(), Some(Determinism::Replicas));
        let stricter = AlgoFilter::default().requiring(Determinism::Replicas).requiring(Determinism::Strict);
        assert_eq!(stricter.requiring(Determinism::Replicas).deterministic(), Some(Determinism::Strict));
        for bad in ["deterministic;deterministic", "deterministic=often", "ring,deterministic"] {
            assert!(AlgoFilter::parse(bad).is_err(), "`{bad}` must be rejected");
        }
    }

    /// The schedule a candidate was costed on is the one `compile` makes for its source and bindings, hash for hash:
    /// a runtime that runs the costed one and a rank that compiles its own agree on every call's fingerprint.
    #[test]
    fn a_costed_schedule_is_the_compiled_one() {
        let (limits, topo) = (Limits::default(), Topology::uniform_nodes(8, 4));
        for collective in [Collective::AllReduce, Collective::AllGather, Collective::Broadcast] {
            let bindings = Bindings { root: collective.rooted().then_some(3), ..Bindings::ranks(8) };
            let field = field(collective, Library::embedded(), &AlgoFilter::default(), &bindings, &limits, &topo);
            let field = field.unwrap_or_else(|_| panic!("{collective}: a field"));
            for candidate in &field.candidates {
                let source = crate::library::get(&format!("{collective}/{}", candidate.name)).expect("listed");
                let bound = Bindings { params: candidate.params.clone(), ..bindings.clone() };
                let compiled = crate::compile(source, &bound, crate::Options::default(), &limits).expect("verifies");
                let costed = candidate.schedule.as_ref().expect("kept");
                assert_eq!(costed.hash(), compiled.hash(), "{collective}/{}", candidate.name);
            }
        }
    }

    /// At 4 ranks one-shot's ranks add the others' copies in different orders: not admitted when deterministic,
    /// with why; the ring's replicas agree, but its chunks are reduced in different orders: out when strict.
    #[test]
    fn a_deterministic_field_leaves_out_the_algorithms_whose_replicas_differ() {
        let (limits, topo) = (Limits::default(), Topology::uniform(4));
        let only = |text: &str| {
            let filter = AlgoFilter::parse(text).expect("valid");
            let field = field(Collective::AllReduce, Library::embedded(), &filter, &Bindings::ranks(4), &limits, &topo);
            let field = field.unwrap_or_else(|_| panic!("`{text}` leaves a field"));
            (field.candidates.iter().map(|c| c.name.clone()).collect::<Vec<_>>(), field.not_admitted)
        };
        let (kept, refused) = only("ring,one_shot;deterministic");
        assert_eq!(kept, ["ring"]);
        assert!(refused[0].0 == "one_shot" && refused[0].1.contains("replicas differ bitwise"), "{refused:?}");
        let (kept, refused) = only("ring,recursive_doubling;deterministic=strict");
        assert_eq!(kept, ["recursive_doubling"]);
        assert!(refused[0].1.contains("depend on the message size"), "{refused:?}");
    }
}
