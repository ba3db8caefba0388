//! Shared memory, for ranks on one host: NCCL's SHM transport. Every connection is a FIFO of message slots
//! (`fifo.rs`) in a segment (`segment.rs`) every rank can map: on the heap of one process for `threads`, a file in
//! `/dev/shm` for `shm`. The bootstrap is a control block in a segment of its own (`control.rs`).

mod arena;
mod control;
mod fifo;
mod segment;

pub use arena::ArenaBuf;

pub(crate) use control::Control;
pub use fifo::segment_bytes;
pub use segment::Shm;
pub(crate) use segment::SHM_DIR;
pub(crate) use segment::{Heap, Segments};

use crate::comm::{Communicator, Options};
use crate::error::RuntimeError;
use crate::exec::{self, Executor, Plan};
use crate::launch::Launch;
use crate::transport::{Backend, Bootstrap, Fabric, Ranks, Status, Transport};
use arena::PeerArena;
use fifo::{Fifo, Refs};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

pub(crate) static THREADS: Threads = Threads;
pub(crate) static SHM: ShmBackend = ShmBackend;

/// Ranks as threads of one process, their segments on its heap. Under a launcher its ranks are processes: `shm`
/// when they share this host, else `tcp`.
pub(crate) struct Threads;

impl Backend for Threads {
    fn name(&self) -> &'static str {
        "threads"
    }

    fn about(&self) -> &'static str {
        "Ranks are threads of one process"
    }

    fn ranks(&self) -> Ranks {
        Ranks::Threads
    }

    fn single_copy(&self) -> bool {
        fifo::direct()
    }

    fn compiles_plans(&self) -> bool {
        true
    }

    /// As every host transport's, with the protocol: a send whose source stays is read in place by its receiver
    /// (single copy), unless `COLLC_P2P_DIRECT_DISABLE=1`.
    fn executor(&self, slots: u64, _gpu: Option<i32>) -> String {
        let isa = collc_kernels::host::VectorIsa::detected().name();
        match fifo::direct() {
            true => {
                format!("host {isa} (dataflow, tiled, single copy where a send's source stays, else {slots}-slot FIFOs")
            }
            false => format!("host {isa} (dataflow, tiled, {slots}-slot FIFOs; single copy off"),
        }
    }

    fn group(&self, n_ranks: u32, options: Options) -> Result<Vec<Communicator>, RuntimeError> {
        let memory = Arc::new(Memory::new(Arc::new(Heap::default())));
        Communicator::heap_group(memory.clone(), &memory, n_ranks, options)
    }

    fn for_processes(&self, all_on_one_host: bool) -> Result<Option<Transport>, String> {
        Ok(Some(match all_on_one_host {
            true => Transport::of(&SHM),
            false => Transport::of(&crate::transport::tcp::TCP),
        }))
    }

    fn join(&self, launch: &Launch, options: Options) -> Result<Communicator, RuntimeError> {
        let backend =
            Transport::of(&THREADS).for_processes(launch.all_local()).map_err(RuntimeError::Config)?.backend();
        backend.check_launch(launch).map_err(RuntimeError::Config)?;
        backend.join(launch, options)
    }
}

/// Ranks as processes on one host, their segments files in /dev/shm.
pub(crate) struct ShmBackend;

impl Backend for ShmBackend {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn about(&self) -> &'static str {
        "Ranks are processes on this host; buffers in /dev/shm"
    }

    fn ranks(&self) -> Ranks {
        Ranks::Processes
    }

    /// As `collc run` allocates its buffers (`Communicator::alloc`): from the arena, read in place.
    fn single_copy(&self) -> bool {
        fifo::direct()
    }

    fn compiles_plans(&self) -> bool {
        true
    }

    /// Across processes, reading a peer's buffers in place loses to the FIFOs once a call's buffers outgrow the
    /// last-level cache (2 and 4 ranks, 16 MiB and up: bench/README.md), as between threads it does not.
    fn single_copy_max_bytes(&self) -> usize {
        8 << 20
    }

    fn executor(&self, slots: u64, _gpu: Option<i32>) -> String {
        let isa = collc_kernels::host::VectorIsa::detected().name();
        match fifo::direct() {
            true => format!(
                "host {isa} (dataflow, tiled, single copy where a send's source stays in a buffer from the arena, \
                 else {slots}-slot FIFOs"
            ),
            false => format!("host {isa} (dataflow, tiled, {slots}-slot FIFOs; single copy off"),
        }
    }

    fn group(&self, n_ranks: u32, options: Options) -> Result<Vec<Communicator>, RuntimeError> {
        let job = group_job_id();
        Communicator::rank_threads(n_ranks, &|rank| process(&job, rank, n_ranks, options.clone()))
    }

    fn check_launch(&self, launch: &Launch) -> Result<(), String> {
        one_host(launch, self.name())
    }

    fn join(&self, launch: &Launch, options: Options) -> Result<Communicator, RuntimeError> {
        process(&launch.job, launch.rank, launch.world_size, options)
    }

    fn mark_failed(&self, job: &str, n_ranks: u32, rank: u32) -> Result<(), RuntimeError> {
        mark_rank_failed(job, n_ranks, rank)
    }

    fn remove_job(&self, job: &str) {
        Shm::remove_job(job);
    }
}

/// Refuses a launched job whose ranks are not all on this host, for the transports that need them there.
pub(crate) fn one_host(launch: &Launch, transport: &str) -> Result<(), String> {
    match launch.all_local() {
        true => Ok(()),
        false => Err(format!(
            "{} says {} of the {} ranks are on this host; the {transport} transport needs all of them on one host",
            launch.launcher,
            launch.local_world_size.unwrap_or(0),
            launch.world_size
        )),
    }
}

/// A job id no other group of this process or host uses, for a group of rank threads over a process transport.
pub(crate) fn group_job_id() -> String {
    static GROUPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let id = GROUPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("group-{}-{id}", std::process::id())
}

/// Rank `rank` of job `job` on this host, in its own process: segments and the control block in /dev/shm.
pub(crate) fn process(job: &str, rank: u32, n_ranks: u32, options: Options) -> Result<Communicator, RuntimeError> {
    crate::comm::check_world(rank, n_ranks)?;
    crate::recorder::catch_dump_requests();
    if job.is_empty() || !job.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(RuntimeError::Config(format!("job id `{job}` must be non-empty [A-Za-z0-9_-]")));
    }
    let memory = Arc::new(Memory::new(Arc::new(Shm::new(job))));
    let bootstrap = Arc::new(memory.bootstrap(n_ranks)?);
    let _ = memory.control.set(bootstrap.clone());
    Communicator::process(memory, bootstrap, (rank, n_ranks), job, options)
}

/// Links as FIFOs in the segments of one job.
pub(crate) struct Memory {
    segments: Arc<dyn Segments>,
    /// Rank processes: the job's control block, where each rank's arena is published, and the peers' arenas mapped
    /// so far.
    control: OnceLock<Arc<Control>>,
    peer_arenas: Mutex<HashMap<u32, Arc<PeerArena>>>,
}

impl Memory {
    pub fn new(segments: Arc<dyn Segments>) -> Memory {
        Memory { segments, control: OnceLock::new(), peer_arenas: Mutex::new(HashMap::new()) }
    }

    /// How the end of `end` on rank `rank` names chunks carried by reference: addresses between rank threads; across
    /// processes, offsets into the sender's arena, which the receiving end maps here (if it cannot, one WARN, and
    /// that link copies).
    fn refs(&self, end: &crate::link::LinkEnd, rank: u32) -> Refs {
        if !fifo::direct() {
            return Refs::None;
        }
        if self.segments.one_address_space() {
            return Refs::Addresses;
        }
        let Some(control) = self.control.get() else { return Refs::None };
        if end.from == rank {
            return arena::arena().map_or(Refs::None, Refs::Offsets);
        }
        let Ok(mut mapped) = self.peer_arenas.lock() else { return Refs::None };
        if let Some(peer) = mapped.get(&end.from) {
            return Refs::Peer(peer.clone());
        }
        let Some((pid, fd)) = control.arena_of(end.from) else { return Refs::None };
        match PeerArena::map(pid, fd) {
            Ok(peer) => Refs::Peer(mapped.entry(end.from).or_insert(Arc::new(peer)).clone()),
            Err(why) => {
                let what =
                    format_args!("rank {rank}: copies what rank {} sends, as it cannot map its arena: {why}", end.from);
                crate::log::warn(crate::log::Subsys::Init, what);
                Refs::None
            }
        }
    }

    /// The job's control block, for a rank of `n_ranks`.
    pub fn bootstrap(&self, n_ranks: u32) -> Result<Control, RuntimeError> {
        Control::open(self.segments.as_ref(), n_ranks)
    }
}

impl Fabric for Memory {
    fn transport(&self) -> Transport {
        self.segments.transport()
    }

    fn remove_all(&self) {
        self.segments.remove_all();
    }

    fn prepare(&self, plan: Plan) -> Result<Box<dyn Executor>, RuntimeError> {
        let links = plan
            .links
            .iter()
            .map(|end| Fifo::open(self.segments.as_ref(), end, self.refs(end, plan.rank)))
            .collect::<Result<_, _>>()?;
        Ok(exec::executor(plan, links))
    }

    /// Rank processes: a buffer of this process's arena, which peers read in place.
    fn alloc(&self, bytes: usize) -> Option<ArenaBuf> {
        if self.segments.one_address_space() || self.control.get().is_none() || !fifo::direct() {
            return None;
        }
        arena::arena()?.alloc(bytes)
    }
}

/// For a launcher whose rank process `failed_rank` died: marks it failed in job `job`'s control block, so every
/// other rank stops with an error naming it instead of waiting for its timeout.
pub fn mark_rank_failed(job: &str, n_ranks: u32, failed_rank: u32) -> Result<(), RuntimeError> {
    let control = Control::open(&Shm::new(job), n_ranks)?;
    let _ = control.leave(failed_rank, Status::Failed);
    Ok(())
}
