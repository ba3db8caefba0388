//! The choice of algorithm inside the runtime (DESIGN.md 5a). A `Selection` holds, for one collective on a
//! communicator's ranks, the candidates an `AlgoFilter` leaves of a library (the embedded one and users' own from
//! `COLLC_ALGO_PATH`, `algo_path`), each costed on a topology, and answers
//! which one is predicted fastest for a call of so many bytes (and the runner-up). Each candidate keeps the
//! verified schedule it was costed on (out of place, for the selection's root and peer), so the one chosen runs
//! without being compiled again.
//!
//! A `Communicator` whose collective has no algorithm set chooses per call through one: set with
//! `Communicator::set_selection` (what `collc run COLLECTIVE` does after printing it), or made on the collective's
//! first call from `COLLC_ALGO` (NCCL_ALGO's grammar), `COLLC_ALGO_PATH` and the topology `topology_for` finds. With `COLLC_DEBUG=INFO`
//! each choice is logged once per collective and size class (a power of two of bytes): the algorithm, its
//! predicted time and the runner-up's.

pub(crate) mod live;
mod measured;

pub(crate) use live::{class_of, enabled as live_enabled, Live};
pub use measured::{Measured, Point, Series};

use crate::error::RuntimeError;
use collc_compiler::cost::{self, AlgoFilter, FieldError, Topology};
use collc_compiler::library::Library;
use collc_compiler::replicas::{self, Determinism};
use collc_compiler::{Bindings, Collective, Limits};
use collc_kernels::{DataType, ReduceOp};
use std::path::PathBuf;

/// One candidate of a selection: its name (`allreduce/ring`), source and parameter bindings (the node split
/// of the topology where it declares one), and its cost profile and costed schedule.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub name: String,
    pub source: String,
    pub params: Vec<(String, i64)>,
    pub costed: cost::Candidate,
}

/// What `Selection::choose` answers for a call size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Chosen {
    pub index: usize,
    /// Seconds of the chosen candidate, and of the runner-up where there is one: measured on this host where the
    /// timings turned the choice (`measured`), else predicted by the cost model.
    pub predicted: f64,
    pub runner_up: Option<(usize, f64)>,
    /// Whether the timings turned the choice away from the model's.
    pub measured: bool,
}

/// The costed candidates of one collective on a communicator's ranks.
#[derive(Debug)]
pub struct Selection {
    pub collective: Collective,
    pub n_ranks: u32,
    /// The root and peer the candidates were costed (and their schedules verified) for.
    pub root: u32,
    pub peer: u32,
    pub candidates: Vec<Candidate>,
    /// Algorithms the filter left but the rank count or node split does not admit, with why.
    pub not_admitted: Vec<(String, String)>,
    /// The topology costed on: where it came from and what it says.
    pub topology: String,
    /// This host's timings of these candidates (`learn`), which the choice goes by where they cover a size.
    pub measured: Option<Series>,
}

impl Selection {
    /// Costs every algorithm of `collective` in `library` that `filter` leaves, for `bindings` on `topo` (described
    /// by `topology`): the field the choice is made in.
    pub fn new(
        collective: Collective,
        library: &Library,
        filter: &AlgoFilter,
        bindings: &Bindings,
        (topo, topology): (&Topology, String),
        limits: &Limits,
    ) -> Result<Selection, FieldError> {
        let field = cost::field(collective, library, filter, bindings, limits, topo)?;
        let candidates = field
            .candidates
            .into_iter()
            .map(|costed| {
                let name = format!("{collective}/{}", costed.name);
                let source = library.get(&name).expect("candidates come from the library").source.to_string();
                Candidate { name, source, params: costed.params.clone(), costed }
            })
            .collect();
        Ok(Selection {
            collective,
            n_ranks: bindings.n_ranks,
            root: bindings.root.unwrap_or(0),
            peer: bindings.peer.unwrap_or(0),
            candidates,
            not_admitted: field.not_admitted,
            topology,
            measured: None,
        })
    }

    /// The selection a call by `ops` on `dtypes` chooses in: `None` where any candidate will do; where one of them is
    /// a user's operator that is not commutative and associative on its type, only the candidates whose costed
    /// schedule reduces in rank order (`replicas::in_rank_order`), the others moved to `not_admitted` with why
    /// (`None` too where no candidate does).
    pub fn admitting(&self, ops: &[ReduceOp], dtypes: &[DataType]) -> Option<Selection> {
        let why = ops.iter().find_map(|&op| {
            let ReduceOp::User(user) = op else { return None };
            dtypes.iter().find_map(|&dtype| user.prepare(dtype).ok()?.reorderable().err().map(|e| e.to_string()))
        })?;
        let (mut candidates, mut not_admitted) = (Vec::new(), self.not_admitted.clone());
        for candidate in &self.candidates {
            let ordered = candidate.costed.schedule.as_ref().is_some_and(|s| replicas::in_rank_order(s).is_ok());
            match ordered {
                true => candidates.push(candidate.clone()),
                false => {
                    // `not_admitted` names an algorithm without its collective, as the field does.
                    let name = candidate.name.split_once('/').map_or(&*candidate.name, |(_, name)| name);
                    not_admitted.push((name.to_string(), format!("{why}, and it reduces out of rank order")))
                }
            }
        }
        if candidates.is_empty() {
            return None; // then the call's plan refuses the operator, naming the order and what to run instead
        }
        Some(Selection {
            candidates,
            not_admitted,
            measured: self.measured.clone(),
            topology: self.topology.clone(),
            ..*self
        })
    }

    /// Takes this host's timings of the collective on as many ranks over `transport` (`Measured`, merged by
    /// `collc run COLLECTIVE --compare`) into the choice: for ranks all on this host, costed without a topology
    /// file. Whether there were any.
    pub fn learn(&mut self, transport: &str) -> bool {
        let measured = Measured::load();
        self.measured = measured.series(self.collective.name(), self.n_ranks, transport).cloned();
        self.measured.is_some()
    }

    /// The fastest candidate for a call of `bytes` (the first on a tie), and the runner-up: by this host's timings
    /// where every candidate was timed around `bytes`, else by the cost model. Where the timings cover the size but
    /// the model's choice was timed within `NOISE` of the fastest, the model's choice stands: timings that close are
    /// one run's noise, and following them would turn the choice from run to run.
    pub fn choose(&self, bytes: usize) -> Chosen {
        let predicted: Vec<(usize, f64)> =
            self.candidates.iter().enumerate().map(|(i, c)| (i, c.costed.profile.seconds(bytes as f64))).collect();
        let by_model = ranked(predicted.clone());
        let timed: Option<Vec<f64>> = self
            .measured
            .as_ref()
            .and_then(|series| self.candidates.iter().map(|c| series.seconds(&c.name, bytes as f64)).collect());
        let Some(timed) = timed else {
            return Chosen {
                index: by_model[0].0,
                predicted: by_model[0].1,
                runner_up: by_model.get(1).copied(),
                measured: false,
            };
        };
        let by_time = ranked(timed.iter().copied().enumerate().collect());
        let model = by_model[0].0;
        if timed[model] <= by_time[0].1 * (1.0 + NOISE) {
            return Chosen {
                index: model,
                predicted: by_model[0].1,
                runner_up: by_model.get(1).copied(),
                measured: false,
            };
        }
        Chosen { index: by_time[0].0, predicted: by_time[0].1, runner_up: by_time.get(1).copied(), measured: true }
    }

    /// The selection a communicator makes for itself on `collective`'s first call: `COLLC_ALGO`'s filter (requiring
    /// at least `determinism`) over the library `COLLC_ALGO_PATH` makes, the topology `topology_for` finds, root 0
    /// and peer 1 (the schedules of other roots are compiled when called).
    pub(crate) fn from_env(
        collective: Collective,
        (n_ranks, per_node): (u32, u32),
        transport: crate::Transport,
        determinism: Option<Determinism>,
    ) -> Result<Selection, RuntimeError> {
        let (sockets, single_copy) = (transport.backend().sockets(), single_copy_of(transport));
        let library = crate::algo_path::library()?;
        let filter = match std::env::var("COLLC_ALGO") {
            Ok(text) => {
                AlgoFilter::parse_in(&text, &library).map_err(|e| RuntimeError::Config(format!("COLLC_ALGO: {e}")))?
            }
            Err(_) => AlgoFilter::default(),
        };
        let filter = match determinism {
            Some(level) => filter.requiring(level),
            None => filter,
        };
        let bindings = Bindings {
            n_ranks,
            root: collective.rooted().then_some(0),
            peer: (collective == Collective::SendRecv).then_some(1 % n_ranks),
            params: Vec::new(),
        };
        let (mut topo, topology) = topology_for(n_ranks, per_node, sockets)?;
        topo.single_copy = single_copy;
        let limits = Limits::default();
        let learns = per_node == n_ranks && std::env::var_os("COLLC_TOPO").is_none_or(|p| p.is_empty());
        let selection = Selection::new(collective, &library, &filter, &bindings, (&topo, topology), &limits);
        let mut selection = selection.map_err(|e| match e {
            FieldError::Filter(message) | FieldError::NoneAdmits(message) => RuntimeError::Config(message),
            FieldError::Invalid { name, file, source, errors } => {
                let first = errors.0.first();
                let line = first
                    .and_then(|e| e.primary_span())
                    .map(|s| collc_compiler::diag::line_at(&source, s.start as usize));
                let message = format!(
                    "{name} ({file}{}) does not verify for {n_ranks} ranks: {}",
                    line.map_or(String::new(), |l| format!(":{l}")),
                    first.map_or(String::new(), |e| e.message.clone())
                );
                // A user's file is the user's to fix (a usage error); the library's own would be collc's bug.
                match library.get(&name).is_some_and(|e| e.file.is_some()) {
                    true => RuntimeError::Config(format!("{}: {message}", crate::algo_path::VAR)),
                    false => RuntimeError::Compile(message),
                }
            }
        })?;
        if learns {
            selection.learn(transport.name());
        }
        Ok(selection)
    }
}

/// How close (a fraction) a timed candidate must be to the fastest for the model's choice of it to stand.
pub const NOISE: f64 = 0.05;

/// Candidates by time, fastest first (the first listed on a tie).
fn ranked(mut times: Vec<(usize, f64)>) -> Vec<(usize, f64)> {
    times.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    times
}

/// A call's size as nccl-tests counts it and the cost model prices it: `count` elements of `elem` bytes for
/// allreduce, broadcast, reduce and sendrecv, and `count` per block for the others (every rank's block).
pub fn call_bytes(collective: Collective, count: usize, elem: usize, n_ranks: u32) -> usize {
    let blocks = match collective {
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce | Collective::SendRecv => 1,
        _ => n_ranks as usize,
    };
    count.saturating_mul(elem).saturating_mul(blocks)
}

/// The topology a selection is costed on without one given: the file `COLLC_TOPO` names; with every rank on this
/// host and no sockets between them, this host's calibration where one is cached (`collc cost --calibrate`, or the
/// first `collc run COLLECTIVE`; a communicator never measures by itself, so every rank selects alike); else the
/// built-in constants for the ranks' node split (sockets: the built-in socket costs).
pub fn topology_for(n_ranks: u32, per_node: u32, sockets: bool) -> Result<(Topology, String), RuntimeError> {
    if let Some(path) = std::env::var("COLLC_TOPO").ok().filter(|p| !p.is_empty()) {
        let text =
            std::fs::read_to_string(&path).map_err(|e| RuntimeError::Config(format!("COLLC_TOPO={path}: {e}")))?;
        let topo = Topology::from_json(&text).map_err(|e| RuntimeError::Config(format!("COLLC_TOPO={path}: {e}")))?;
        topo.check_ranks(n_ranks).map_err(|e| RuntimeError::Config(format!("COLLC_TOPO={path}: {e}")))?;
        let line = format!("COLLC_TOPO={path}: {}", topo.describe());
        return Ok((topo, line));
    }
    if per_node == n_ranks && !sockets {
        if let Some(topo) = cached_host_topology() {
            let line =
                format!("this host's calibration, cached in {}", host_cache_path().unwrap_or_default().display());
            return Ok((topo, line));
        }
    }
    let topo = match sockets {
        true => Topology::sockets(n_ranks),
        false => Topology::uniform_nodes(n_ranks, per_node),
    };
    let line = format!("the built-in topology ({})", topo.describe());
    Ok((topo, line))
}

/// Where this host's calibration is cached: `$XDG_CACHE_HOME/collc` (else `~/.cache/collc`), one file per host name
/// and CPU model, so a home directory shared between machines keeps one per kind of machine.
pub fn host_cache_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache")))?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host: String =
        host.trim().chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo.lines().find(|l| l.starts_with("model name")).unwrap_or("unknown CPU");
    let mut hash = collc_compiler::fxhash::FxHasher::default();
    std::hash::Hash::hash(model, &mut hash);
    let cpu = std::hash::Hasher::finish(&hash);
    // `-2`: calibrations with the last-level cache's rates and message curves measured through the FIFOs (earlier
    // ones went by reference); an older file is measured again.
    Some(base.join("collc").join(format!("host-{host}-{cpu:016x}-2.json")))
}

/// This host's cached calibration, if there is one that reads.
pub fn cached_host_topology() -> Option<Topology> {
    let text = std::fs::read_to_string(host_cache_path()?).ok()?;
    Topology::from_json(&text).ok()
}

/// Up to how many bytes `transport`'s ranks read each other's chunks in place, for the cost model
/// (`Topology::single_copy`).
pub fn single_copy_of(transport: crate::Transport) -> Option<f64> {
    let backend = transport.backend();
    backend.single_copy().then(|| match backend.single_copy_max_bytes() {
        usize::MAX => f64::INFINITY,
        cap => cap as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::Selection;
    use collc_compiler::cost::{AlgoFilter, Topology};
    use collc_compiler::library::Library;
    use collc_compiler::{Bindings, Collective, Limits};

    /// The allreduce candidates `filter` leaves at 4 ranks, costed on the built-in uniform topology.
    fn selection(filter: &str) -> Selection {
        let (topo, filter) = (Topology::uniform(4), AlgoFilter::parse(filter).expect("valid"));
        let bindings = Bindings::ranks(4);
        let made = Selection::new(
            Collective::AllReduce,
            Library::embedded(),
            &filter,
            &bindings,
            (&topo, "built-in".into()),
            &Limits::default(),
        );
        made.unwrap_or_else(|_| panic!("a field of {filter:?}"))
    }

    /// The choice is the profiles' minimum, the runner-up the next; small calls go to a latency algorithm and
    /// large ones to a bandwidth one on the built-in topology.
    #[test]
    fn the_choice_is_the_predicted_fastest_and_names_the_runner_up() {
        let selection = selection("ring,one_shot,recursive_doubling");
        for bytes in [8, 1 << 20, 256 << 20] {
            let chosen = selection.choose(bytes);
            let times: Vec<f64> = selection.candidates.iter().map(|c| c.costed.profile.seconds(bytes as f64)).collect();
            let best = times.iter().copied().fold(f64::INFINITY, f64::min);
            assert_eq!(chosen.predicted, best, "{bytes} B: {times:?}");
            let (runner, second) = chosen.runner_up.expect("three candidates");
            assert!(runner != chosen.index && second >= best, "{bytes} B");
        }
        let small = &selection.candidates[selection.choose(8).index].name;
        let large = &selection.candidates[selection.choose(256 << 20).index].name;
        assert_ne!(small, large, "one algorithm for 8 B and 256 MiB on 4 ranks");
        assert_eq!(large, "allreduce/ring");
        assert!(selection.candidates.iter().all(|c| c.costed.schedule.is_some()));
    }

    /// Timings that cover a size choose there: a candidate timed clearly faster than the model's choice is taken
    /// (`measured`), one within `NOISE` of it leaves the model's choice standing; sizes not timed go by the model.
    #[test]
    fn timings_turn_the_choice_only_beyond_the_noise() {
        use super::{Point, Series, NOISE};
        let mut selection = selection("ring,one_shot");
        let bytes = 1 << 20;
        let model = selection.choose(bytes);
        assert!(!model.measured);
        let (chosen, other) = (&selection.candidates[model.index].name, &selection.candidates[1 - model.index].name);
        let point = |algorithm: &str, seconds: f64| Point {
            algorithm: algorithm.into(),
            bytes: bytes as u64,
            seconds,
            runs: Vec::new(),
        };
        let series = |theirs: f64| Series {
            collective: "allreduce".into(),
            ranks: 4,
            transport: "threads".into(),
            points: vec![point(chosen, 1e-4), point(other, theirs)],
        };
        selection.measured = Some(series(1e-4 * (1.0 - NOISE / 2.0)));
        let close = selection.choose(bytes);
        assert_eq!((close.index, close.measured), (model.index, false));
        selection.measured = Some(series(0.5e-4));
        let faster = selection.choose(bytes);
        assert_eq!((faster.index, faster.measured, faster.predicted), (1 - model.index, true, 0.5e-4));
        // 4 MiB was not timed: the profiles' minimum, as without timings.
        let elsewhere = selection.choose(bytes * 4);
        let predicted: Vec<f64> =
            selection.candidates.iter().map(|c| c.costed.profile.seconds((bytes * 4) as f64)).collect();
        let best = predicted.iter().copied().fold(f64::INFINITY, f64::min);
        assert_eq!((elsewhere.predicted, elsewhere.measured), (best, false));
    }
}
