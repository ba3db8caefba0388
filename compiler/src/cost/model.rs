//! The alpha-beta-gamma cost of a lowered program, step by step: the step model of the textbook formulas
//! (REFERENCE.md section 1). A step costs the busiest port's alpha + bytes x beta (each rank has one outgoing and
//! one incoming port per link class; ports work in parallel) plus the most reduction (gamma) and local copying any
//! one rank does in that step; steps add up. Transfers within a step are concurrent by the language's definition,
//! which is what makes this the model the formulas assume.
//!
//! Two refinements leave the formulas intact where they do not apply. First, a topology with fewer cores per node
//! than ranks (`cores_per_node`) also bounds the time below by the busiest core. There the ports do not work in parallel:
//! every byte moves through a core (written into a FIFO, copied or reduced out of it), the ranks that share a core
//! take turns, and the fused instructions of the final schedule decide how many passes over the data each rank makes.
//! There the alphas of the steps give way to the latency of the schedule played out on the cores (`cores.rs`): how
//! often the cores change hands (`shared_core_alpha_us` each) per call, calls back to back; and as sharing cores
//! only adds time, the prediction is at least the one with a core per rank.
//!
//! Second, a topology may give `cached` rates, for calls small enough that their data stays in the caches (as NCCL
//! keeps bandwidths per protocol): calls of at most `cached.max_bytes` are costed with those rates for intra-node
//! links, reductions and copies; and `llc` rates, for calls above that whose data still stays in the last-level
//! cache, up to `llc.max_bytes`.
//!
//! Third, a link class may carry a measured curve of one-way message times by size (`Link::message_us`, PLogP's
//! gap per size): then a port's time in a step is read off it for the port's bytes, in place of alpha + bytes x
//! beta in either regime (without alphas, the curve less its time for no bytes).

use super::topology::{CacheRegime, Link, LinkClass, Rates, Topology};
use crate::ir::{Program, TransferKind};
use crate::sched::{Op, Schedule};

/// What a program's cost depends on, with the message size factored out: per step, the chunk count of the busiest
/// port of each link class and the compute seconds per chunk byte of the busiest rank.
#[derive(Clone, Debug)]
pub struct Profile {
    steps: Vec<StepLoad>,
    /// The size S of nccl-tests' `size` column is this many chunks.
    whole_chunks: u32,
    /// The link classes: their alphas, and their measured curves (`Link::message_seconds`).
    links: [Link; 2],
    /// Calls of at most this many bytes take the cached rates (`CacheRegime::Cached`), then up to `llc_bytes` the
    /// last-level cache's; 0 where the topology has none.
    cached_bytes: f64,
    llc_bytes: f64,
    /// Per `CacheRegime::ALL`.
    regimes: [Regime; 3],
    /// Ranks that share cores: the seconds a call of no bytes takes on the cores (`cores::latency`), in place of the
    /// steps' alphas.
    shared_core_latency: Option<f64>,
    pub messages: u64,
    /// The connections the costed schedule sends on (`Schedule::n_connections`).
    pub connections: usize,
    /// Where single copy stops at a size (`Topology::single_copy`): that size, and the profile through the FIFOs
    /// that larger calls take.
    beyond: Option<(f64, Box<Profile>)>,
}

/// What a byte costs in one regime (`CacheRegime::ALL`): the topology's rates, its cached rates, its last-level cache
/// rates (each the topology's own where it has none).
#[derive(Clone, Copy, Debug)]
struct Regime {
    rates: Rates,
    /// Seconds per chunk byte the busiest core spends when ranks share cores; 0 when each rank has its own.
    core: f64,
}

#[derive(Clone, Copy, Debug, Default)]
struct StepLoad {
    /// Chunks through the busiest port, per link class.
    port_chunks: [u32; 2],
    /// Whether a message of that class goes in the step (its alpha counts even when it carries no bytes through
    /// the ports: a message by reference, `Topology::single_copy`).
    carries: [bool; 2],
    /// Seconds per chunk byte the busiest rank computes (reductions and local copies), per regime.
    compute: [f64; 3],
}

fn class_index(class: LinkClass) -> usize {
    match class {
        LinkClass::Intra => 0,
        LinkClass::Inter => 1,
    }
}

/// Per-rank tallies of one step, cleared in time proportional to what the step touched.
struct Tally {
    /// [class][out=0 / in=1][rank]
    ports: [[Vec<u32>; 2]; 2],
    reduced: Vec<u32>,
    copied: Vec<u32>,
    touched: Vec<u32>,
}

impl Tally {
    fn new(n_ranks: usize) -> Self {
        let zeros = || vec![0u32; n_ranks];
        Tally {
            ports: [[zeros(), zeros()], [zeros(), zeros()]],
            reduced: zeros(),
            copied: zeros(),
            touched: Vec::new(),
        }
    }

    fn clear(&mut self) {
        for &r in &self.touched {
            let r = r as usize;
            for class in &mut self.ports {
                class[0][r] = 0;
                class[1][r] = 0;
            }
            self.reduced[r] = 0;
            self.copied[r] = 0;
        }
        self.touched.clear();
    }
}

/// The cost profile of `program` on `topo` (which must describe `program.n_ranks` ranks); `sched` is its verified
/// schedule, whose instructions the shared-core refinements count and play out (with `slots` messages per
/// connection).
pub fn profile(program: &Program, sched: &Schedule, topo: &Topology, slots: u32) -> Profile {
    let mut profile = profile_of(program, sched, topo, slots);
    if let Some(cap) = topo.single_copy.filter(|cap| cap.is_finite()) {
        let fifo = Topology { single_copy: None, ..topo.clone() };
        profile.beyond = Some((cap, Box::new(profile_of(program, sched, &fifo, slots))));
    }
    profile
}

fn profile_of(program: &Program, sched: &Schedule, topo: &Topology, slots: u32) -> Profile {
    let (in_chunks, out_chunks) = program.buffer_chunks();
    let passes = shared_core_passes(sched, topo);
    let regimes = CacheRegime::ALL.map(|regime| {
        let rates = topo.rates(regime);
        Regime { rates, core: busiest_core(&passes, &rates) }
    });
    let mut tally = Tally::new(program.n_ranks as usize);
    let mut steps = Vec::with_capacity(program.n_steps as usize);
    let mut messages = 0u64;
    let by_reference = match topo.single_copy {
        Some(_) => sources_that_stay(program),
        None => Vec::new(),
    };
    let mut index = 0;
    for step in program.transfers.chunk_by(|a, b| a.step == b.step) {
        let mut load = StepLoad::default();
        for t in step {
            tally.touched.extend([t.from, t.to]);
            let referenced = by_reference.get(index).copied().unwrap_or(false);
            index += 1;
            match t.kind {
                TransferKind::Send { reduce } => {
                    messages += 1;
                    let c = class_index(topo.class(t.from, t.to));
                    load.carries[c] = true;
                    if referenced {
                        // The receiver reads the sender's chunks in place, no bytes through the ports: a pass of its
                        // own over them, the reduction below, or a copy into a user buffer (one into scratch is
                        // taken to be fused into the reduction that reads it, as the compiler does).
                        if !reduce && !matches!(t.dst.buf, crate::ir::Buf::Scratch(_)) {
                            tally.copied[t.to as usize] += t.count;
                        }
                    } else {
                        let out = &mut tally.ports[c][0][t.from as usize];
                        *out += t.count;
                        load.port_chunks[c] = load.port_chunks[c].max(*out);
                        let inc = &mut tally.ports[c][1][t.to as usize];
                        *inc += t.count;
                        load.port_chunks[c] = load.port_chunks[c].max(*inc);
                    }
                    if reduce {
                        tally.reduced[t.to as usize] += t.count;
                    }
                }
                TransferKind::Copy => tally.copied[t.from as usize] += t.count,
                TransferKind::Reduce => tally.reduced[t.from as usize] += t.count,
            }
        }
        for &r in &tally.touched {
            let (reduced, copied) = (tally.reduced[r as usize] as f64, tally.copied[r as usize] as f64);
            for (compute, regime) in load.compute.iter_mut().zip(&regimes) {
                *compute = compute.max(reduced * regime.rates.gamma + copied * regime.rates.copy);
            }
        }
        tally.clear();
        steps.push(load);
    }
    let links = [topo.link(LinkClass::Intra).clone(), topo.link(LinkClass::Inter).clone()];
    Profile {
        steps,
        whole_chunks: in_chunks.max(out_chunks),
        links,
        cached_bytes: topo.cached.map_or(0.0, |c| c.max_bytes as f64),
        llc_bytes: topo.llc.map_or(0.0, |c| c.max_bytes as f64),
        regimes,
        shared_core_latency: topo.shares_cores(program.n_ranks).then(|| super::cores::latency(sched, topo, slots)),
        messages,
        connections: sched.n_connections(),
        beyond: None,
    }
}

/// Per transfer of `program`: a send of user chunks its rank has not written yet, which, costed out of place,
/// reads the input as it came (`in`, which nothing writes) and which the runtime therefore carries by reference
/// where the ranks share memory (the memory model's rule 8). A send of a chunk written before it is counted as a
/// message of bytes, as the compiler usually fuses it into the receive that wrote the chunk (a `RecvCopySend` writes
/// the FIFO): the model errs towards copies.
fn sources_that_stay(program: &Program) -> Vec<bool> {
    use crate::ir::Buf;
    let mut written: std::collections::HashSet<(u32, Buf, u32)> = std::collections::HashSet::new();
    let mut stays = Vec::with_capacity(program.transfers.len());
    for step in program.transfers.chunk_by(|a, b| a.step == b.step) {
        for t in step {
            let (buf, start) = (t.src.buf, t.src.index);
            stays.push(
                matches!(t.kind, TransferKind::Send { .. })
                    && !matches!(buf, Buf::Scratch(_))
                    && (start..start + t.count).all(|c| !written.contains(&(t.from, buf, c))),
            );
        }
        for t in step {
            let rank = match t.kind {
                TransferKind::Send { .. } => t.to,
                TransferKind::Copy | TransferKind::Reduce => t.from,
            };
            let (buf, start) = (t.dst.buf, t.dst.index);
            written.extend((start..start + t.count).map(|c| (rank, buf, c)));
        }
    }
    stays
}

/// The passes over its chunks one instruction makes on a shared-memory transport, as (copies, reductions): a byte
/// sent is copied into the FIFO and a byte received is copied or reduced out of it (one pass each); a fused
/// instruction that also writes a second place (its copy and its forward) pays that extra write stream as half a
/// copy, a copy being two streams.
fn core_passes(op: Op) -> (f64, f64) {
    match op {
        Op::Send | Op::Recv | Op::Copy => (1.0, 0.0),
        Op::RecvCopySend => (1.5, 0.0),
        Op::RecvReduceCopy | Op::RecvReduceSend | Op::Reduce => (0.0, 1.0),
        Op::RecvReduceCopySend => (0.5, 1.0),
    }
}

/// Per core, the chunk copies and reductions of the ranks it runs (`Topology::core_of`) when a node has more ranks
/// than cores; empty otherwise. Counted once, weighed per regime.
fn shared_core_passes(sched: &Schedule, topo: &Topology) -> Vec<(f64, f64)> {
    let n = sched.n_ranks;
    if !topo.shares_cores(n) {
        return Vec::new();
    }
    let mut passes = vec![(0.0f64, 0.0f64); (topo.nodes.max(1) * topo.cores_used(n)) as usize];
    for (rank, program) in (0u32..).zip(&sched.ranks) {
        let core = &mut passes[topo.core_of(rank, n) as usize];
        // A send carried by reference copies nothing (its receiver's pass is counted with the receive).
        let stays = match topo.single_copy {
            Some(_) => crate::verify::single_copy::sources_that_stay(program),
            None => vec![false; program.instrs.len()],
        };
        for (instr, stays) in program.instrs.iter().zip(stays) {
            let (copies, reductions) = if stays { (0.0, 0.0) } else { core_passes(instr.op) };
            core.0 += instr.count as f64 * copies;
            core.1 += instr.count as f64 * reductions;
        }
    }
    passes
}

/// The busiest core's seconds per chunk byte at `rates`; 0 when each rank has its own core.
fn busiest_core(passes: &[(f64, f64)], rates: &Rates) -> f64 {
    passes.iter().map(|(copies, reductions)| copies * rates.copy + reductions * rates.gamma).fold(0.0, f64::max)
}

impl Profile {
    /// Predicted seconds for a call of `bytes` (nccl-tests' `size`: the whole buffer for gathers and scatters).
    pub fn seconds(&self, bytes: f64) -> f64 {
        if let Some((_, fifo)) = self.beyond.as_ref().filter(|(cap, _)| bytes > *cap) {
            return fifo.seconds(bytes);
        }
        let chunk_bytes = bytes / self.whole_chunks as f64;
        let k = match () {
            _ if bytes <= self.cached_bytes => 1,
            _ if bytes <= self.llc_bytes => 2,
            _ => 0,
        };
        let regime = &self.regimes[k];
        // The steps with their alphas (ports that work in parallel, a core per rank) or without (`alphas` false).
        let steps = |alphas: bool| {
            self.steps
                .iter()
                .map(|s| {
                    let comm = (0..2)
                        .filter(|&c| s.carries[c])
                        .map(|c| {
                            let link = &self.links[c];
                            let seconds = |bytes: f64| {
                                link.message_seconds(bytes).unwrap_or(link.alpha() + bytes * regime.rates.beta[c])
                            };
                            let bytes = s.port_chunks[c] as f64 * chunk_bytes;
                            if alphas {
                                seconds(bytes)
                            } else {
                                seconds(bytes) - seconds(0.0)
                            }
                        })
                        .fold(0.0, f64::max);
                    comm + s.compute[k] * chunk_bytes
                })
                .sum::<f64>()
        };
        let own_cores = steps(true);
        // Sharing cores only adds time: at least what the call takes with a core per rank.
        let shared = self.shared_core_latency.map_or(0.0, |latency| steps(false) + latency);
        own_cores.max(shared).max(regime.core * chunk_bytes)
    }

    pub fn n_steps(&self) -> usize {
        self.steps.len()
    }
}
