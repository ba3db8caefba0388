//! How the ranks of a job reach each other: the runtime's transport seam (DESIGN.md 5a).
//!
//! - `Backend`: one way to run a job's ranks (threads, shm, tcp, twin, cuda): its name and help line, whether its
//!   ranks are threads or processes, its slot policy, how ranks join as a group or one rank of a launched job, and
//!   how a launcher marks a dead rank failed. `backends()` is the one list; `Transport` names one of its entries, and
//!   the Communicator and the CLI look a transport's behaviour up in it rather than match on its name.
//! - `Fabric`: opens a plan's links and returns its executor (the one dynamic call per collective call).
//! - `Link` and `Bootstrap` (re-exported from `link.rs`, below `exec/`, so executors use them without importing
//!   this folder): one end of a connection as an executor drives it, and what the ranks do together outside the
//!   schedule.
//!
//! Adding a transport: a folder here with its links, its bootstrap (or another's), its `Fabric` and a `Backend`
//! static, and one line in `backends()` (ARCHITECTURE.md, "Adding a transport").

pub(crate) mod cuda;
pub mod ib;
pub mod ifname;
pub(crate) mod joining;
pub(crate) mod net;
pub(crate) mod shm;
pub mod tcp;
pub(crate) mod twin;

pub use crate::link::SLOTS;
pub(crate) use crate::link::{
    check_blob, clip_source, Bootstrap, CallInfo, Link, LinkEnd, LinkFault, Stamp, Status, BLOB_BYTES, SOURCE_BYTES,
};

use crate::comm::{Communicator, Options};
use crate::error::RuntimeError;
use crate::exec::{Executor, Plan};
use crate::launch::Launch;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

/// Every backend, in the order `--help` lists them. Adding a transport adds its line here.
pub fn backends() -> &'static [&'static dyn Backend] {
    static BACKENDS: [&dyn Backend; 6] = [&shm::THREADS, &shm::SHM, &tcp::TCP, &ib::IB, &twin::TWIN, &cuda::CUDA];
    &BACKENDS
}

/// Whether a backend's ranks are threads of one process, processes, or either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ranks {
    /// Threads of one process (`collc run` starts them itself; a launcher cannot).
    Threads,
    /// One process per rank (`collc run` spawns them, or torchrun, mpirun, Slurm start them).
    Processes,
    /// Threads of one process, or one process per rank under a launcher.
    Either,
}

/// How a backend sizes its links' slots when `COLLC_SLOT_BYTES` does not: a power of two that keeps every
/// connection's `SLOTS` slots full near `budget` bytes in all, within `min..=max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotPolicy {
    pub budget: usize,
    pub min: usize,
    pub max: usize,
}

impl SlotPolicy {
    /// Shared memory: 256 MiB in all, 16 KiB to 128 KiB a slot (bench/README.md).
    pub const SHARED_MEMORY: SlotPolicy = SlotPolicy { budget: 256 << 20, min: 16 << 10, max: 128 << 10 };

    /// The largest slot of a call whose every message goes by reference (single copy): its tiles, not its
    /// messages, are that large (bench/README.md).
    pub const SINGLE_COPY_MAX: usize = 4 << 20;

    /// The largest slot for a schedule on `connections` connections.
    pub fn slot_cap(self, connections: usize) -> usize {
        let cap = (self.budget / (SLOTS as usize * connections).max(1)).clamp(self.min, self.max);
        1 << cap.ilog2()
    }
}

/// One way to run the ranks of a job. A `static` in the backend's folder, listed in `backends()`.
pub trait Backend: Sync {
    /// The name `--transport` takes and headers print.
    fn name(&self) -> &'static str;
    /// One line for `--help`.
    fn about(&self) -> &'static str;
    fn ranks(&self) -> Ranks;
    /// Whether this build has the backend (`Err`: what to rebuild with). A run that asks for one it lacks is a usage
    /// error (exit 2), as every command of a feature the build lacks is.
    fn built(&self) -> Result<(), String> {
        Ok(())
    }
    /// Whether every message crosses a socket (the cost model then prices it as one, even on one host).
    fn sockets(&self) -> bool {
        false
    }
    /// Whether its ranks read each other's chunks in place where a send's source stays (single copy), which the
    /// cost model then prices as a local pass, not a message's bytes.
    fn single_copy(&self) -> bool {
        false
    }
    /// With `single_copy`: the largest call (bytes of its larger buffer) whose messages go by reference; larger ones
    /// copy through the FIFOs.
    fn single_copy_max_bytes(&self) -> usize {
        usize::MAX
    }
    /// Whether it runs on a machine without a GPU or a network card of its own (the runtime matrix checks these).
    fn on_cpu(&self) -> bool {
        true
    }
    fn slot_policy(&self) -> SlotPolicy {
        SlotPolicy::SHARED_MEMORY
    }
    /// Whether `--executor jit` compiles its plans: its links are rings in memory both ends map (`Link::ring`).
    fn compiles_plans(&self) -> bool {
        false
    }
    /// What runs a rank's plan, for the run header: `slots` is the slot count, `gpu` the rank's GPU.
    fn executor(&self, slots: u64, gpu: Option<i32>) -> String {
        let _ = gpu;
        let isa = collc_kernels::host::VectorIsa::detected().name();
        format!("host {isa} (dataflow, tiled, {slots}-slot FIFOs")
    }
    /// `n_ranks` communicators of one group, each for a rank thread of this process.
    fn group(&self, n_ranks: u32, options: Options) -> Result<Vec<Communicator>, RuntimeError>;
    /// The transport a launched job's rank processes use when this one is asked for: itself (`None`), or (threads)
    /// the process backend for where the ranks are; an error where its ranks cannot be processes.
    fn for_processes(&self, all_on_one_host: bool) -> Result<Option<Transport>, String> {
        let _ = all_on_one_host;
        match self.ranks() {
            Ranks::Threads => Err(format!(
                "--transport {0} runs every rank as a thread of this one process; under a launcher, run `collc run \
                 --transport {0} --ranks N` once instead",
                self.name()
            )),
            _ => Ok(None),
        }
    }
    /// What a rank process of this backend needs from its launcher's environment, checked before it joins (a
    /// usage error: the run exits 2).
    fn check_launch(&self, launch: &Launch) -> Result<(), String> {
        let _ = launch;
        Ok(())
    }
    /// This process as rank `launch.rank` of a job a launcher started; returns once every rank has joined.
    fn join(&self, launch: &Launch, options: Options) -> Result<Communicator, RuntimeError>;
    /// Variables a launcher on this host adds to every rank's environment (tcp: a rendezvous and a job token).
    fn spawn_env(&self) -> Result<Vec<(&'static str, String)>, String> {
        Ok(Vec::new())
    }
    /// For a launcher whose rank process `rank` died: marks it failed in job `job`, so the other ranks stop with an
    /// error naming it rather than wait for their timeout.
    fn mark_failed(&self, job: &str, n_ranks: u32, rank: u32) -> Result<(), RuntimeError> {
        let _ = (job, n_ranks, rank);
        Ok(())
    }
    /// Removes what job `job` left on this host (a launcher's clean-up, or a rank interrupted).
    fn remove_job(&self, job: &str) {
        let _ = job;
    }
}

/// A backend, by name: the value of `--transport`, what a communicator reports it runs over.
#[derive(Clone, Copy)]
pub struct Transport(&'static dyn Backend);

impl Transport {
    /// Every transport, as `backends()` lists them.
    pub fn all() -> impl Iterator<Item = Transport> {
        backends().iter().map(|&backend| Transport(backend))
    }

    /// The transports that run on a CPU: those the runtime matrix checks on every machine.
    pub fn host() -> impl Iterator<Item = Transport> {
        Transport::all().filter(|t| t.0.on_cpu())
    }

    /// The transport called `name` (`"shm"`); panics on a name no backend has (for tests: `parse` reports).
    pub fn named(name: &str) -> Transport {
        name.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    pub(crate) fn of(backend: &'static dyn Backend) -> Transport {
        Transport(backend)
    }

    pub fn backend(self) -> &'static dyn Backend {
        self.0
    }

    /// The name `--transport` takes and headers print.
    pub fn name(self) -> &'static str {
        self.0.name()
    }

    /// One line for `--help`.
    pub fn about(self) -> &'static str {
        self.0.about()
    }

    /// The transport a launched job's rank processes use when this one is asked for (`Backend::for_processes`).
    pub fn for_processes(self, all_on_one_host: bool) -> Result<Transport, String> {
        Ok(self.0.for_processes(all_on_one_host)?.unwrap_or(self))
    }

    /// This process as rank `launch.rank` of a job a launcher started, over the transport its rank processes use
    /// (`for_processes`); returns once every rank has joined. A join that fails while ranks of the job on this
    /// host join over another transport names them (`joining::JoinMarker`).
    pub fn join(self, launch: &Launch, options: Options) -> Result<Communicator, RuntimeError> {
        let backend = self.for_processes(launch.all_local()).map_err(RuntimeError::Config)?.0;
        backend.check_launch(launch).map_err(RuntimeError::Config)?;
        let marker = joining::JoinMarker::new(&launch.job, launch.rank, backend.name());
        marker.joined(backend.join(launch, options))
    }

    /// Whether the ranks are separate processes (`collc run` spawns them).
    pub fn processes(self) -> bool {
        self.0.ranks() == Ranks::Processes
    }
}

impl PartialEq for Transport {
    fn eq(&self, other: &Transport) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Transport {}

impl Hash for Transport {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name().hash(state);
    }
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Transport {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Transport::all().find(|t| t.name().eq_ignore_ascii_case(s)).ok_or_else(|| {
            let names: Vec<&str> = Transport::all().map(Transport::name).collect();
            let message = format!("unknown transport `{s}`; expected one of: {}", names.join(", "));
            collc_compiler::diag::with_suggestion(message, s, &names)
        })
    }
}

/// An all-gather of one blob per rank over a communicator's bootstrap, for `Fabric::prepare_collective`.
pub(crate) type Gather<'a> = dyn FnMut(&[u8]) -> Result<Vec<Vec<u8>>, RuntimeError> + 'a;

/// Every rank's `head` and its entries of `N` bytes, over as many all-gathers as the rank with the most entries
/// needs (a blob holds `BLOB_BYTES`): the first carries the counts and the heads.
#[cfg_attr(not(any(feature = "cuda", feature = "ib")), allow(dead_code))]
pub(crate) fn gather_entries<const N: usize>(
    gather: &mut Gather,
    head: &[u8],
    entries: &[[u8; N]],
) -> Result<Vec<(Vec<u8>, Vec<[u8; N]>)>, RuntimeError> {
    let mut first = (entries.len() as u32).to_le_bytes().to_vec();
    first.extend_from_slice(head);
    let firsts = gather(&first)?;
    let count = |b: &[u8]| b.get(..4).map_or(0, |c| u32::from_le_bytes(c.try_into().expect("4 bytes")) as usize);
    let most = firsts.iter().map(|b| count(b)).max().unwrap_or(0);
    let mut all: Vec<(Vec<u8>, Vec<[u8; N]>)> =
        firsts.iter().map(|b| (b.get(4..).unwrap_or_default().to_vec(), Vec::new())).collect();
    let per_round = BLOB_BYTES / N;
    for round in 0..most.div_ceil(per_round) {
        let blob: Vec<u8> = entries.iter().skip(round * per_round).take(per_round).flatten().copied().collect();
        for (rank, blob) in gather(&blob)?.into_iter().enumerate() {
            all[rank].1.extend(blob.chunks_exact(N).map(|e| <[u8; N]>::try_from(e).expect("N bytes")));
        }
    }
    Ok(all)
}

/// Opens the links of a plan and returns the executor that runs it over them.
pub(crate) trait Fabric: Send + Sync {
    fn transport(&self) -> Transport;
    /// Ends a communicator of the job no longer needs (the last one out calls it).
    fn remove_all(&self);
    fn prepare(&self, plan: Plan) -> Result<Box<dyn Executor>, RuntimeError>;
    /// `prepare`, for fabrics whose ranks must exchange something about the plan first (CUDA IPC handles): every
    /// rank prepares the same call shapes in the same order, so `gather` (an all-gather over the bootstrap, a
    /// `BLOB_BYTES` blob a rank) meets every other rank's same step.
    fn prepare_collective(&self, plan: Plan, _gather: &mut Gather) -> Result<Box<dyn Executor>, RuntimeError> {
        self.prepare(plan)
    }
    /// The GPU a rank's buffers must be on, for the transports that compute on device memory.
    fn gpu_ordinal(&self, _rank: u32) -> Option<i32> {
        None
    }
    /// Host memory its peers read in place (`Communicator::alloc`), where it has such memory and room.
    fn alloc(&self, _bytes: usize) -> Option<shm::ArenaBuf> {
        None
    }
    /// Message slots per connection of the links (or device records) this fabric opens: the most a schedule it
    /// runs may have been proved deadlock-free with.
    fn slots(&self) -> u32 {
        SLOTS as u32
    }
}

#[cfg(test)]
mod tests {
    use super::{backends, SlotPolicy, Transport};

    #[test]
    fn names_round_trip_and_a_misspelt_one_gets_a_suggestion() {
        for transport in Transport::all() {
            assert_eq!(transport.name().parse::<Transport>(), Ok(transport));
        }
        let names: Vec<&str> = backends().iter().map(|b| b.name()).collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "two backends share a name: {names:?}");
        let error = "shn".parse::<Transport>().expect_err("not a transport");
        assert!(error.contains("did you mean: shm"), "{error}");
        assert!(Transport::host().all(|t| t.name() != "cuda"));
    }

    #[test]
    fn a_slot_cap_is_a_power_of_two_within_the_policy() {
        let policy = SlotPolicy::SHARED_MEMORY;
        assert_eq!(policy.slot_cap(1), policy.max);
        assert_eq!(policy.slot_cap(1 << 20), policy.min);
        let cap = policy.slot_cap(300);
        assert!(cap.is_power_of_two() && (policy.min..=policy.max).contains(&cap), "{cap}");
    }
}
