//! `Communicator`: one rank's handle on a group of ranks, with NCCL-shaped calls for every collective. A call
//! picks the schedule for its collective and placement (compiled and verified once), the plan for its shape
//! (prepared once), and runs it; only the first call of a shape allocates.

use crate::error::RuntimeError;
use crate::exec::{self, Call, Executor, Origin, PlanInput};
use crate::recorder::{self, Recorder};
use crate::select::{Point, Selection};
use crate::transport::shm::Memory;
use crate::transport::tcp::TcpJob;
use crate::transport::{Backend, Bootstrap, CallInfo, Fabric, Status};
use collc_compiler::emit::SchedLines;
use collc_compiler::fxhash::FxBuildHasher;
use collc_compiler::sched::Placement;
use collc_compiler::{compile, library, Bindings, Collective, Limits, Options as CompileOptions, VerifiedSchedule};
use collc_kernels::{DataType, ReduceOp};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How a communicator runs; `from_env` reads the `COLLC_*` variables.
#[derive(Clone, Debug)]
pub struct Options {
    /// How long any wait may last before it becomes an error naming what it waited for.
    pub timeout: Duration,
    /// The largest FIFO slot in bytes (`transport::SLOTS` slots per connection); 0 picks one from the schedule's
    /// connection count.
    /// A connection's slots are sized by the largest message it carries in a call, up to this.
    pub slot_bytes: usize,
    /// What runs each rank's plan on a host transport.
    pub executor: HostExecutor,
    /// Whether a send whose source stays may go by reference where the transport's ranks share memory (single
    /// copy); false: every message carries its bytes through the FIFOs (the host calibration measures those).
    pub single_copy: bool,
    /// The least determinism a collective chosen per call must have (over `COLLC_ALGO`'s own): torch's backend asks
    /// `Replicas`, as NCCL guarantees it (DDP keeps the ranks' parameters equal only while every rank's result is
    /// bitwise the same). `None`: any algorithm.
    pub determinism: Option<collc_compiler::replicas::Determinism>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            timeout: Duration::from_secs(60),
            slot_bytes: 0,
            executor: HostExecutor::Interpret,
            single_copy: true,
            determinism: None,
        }
    }
}

/// What runs a rank's plan on a host transport (`COLLC_EXECUTOR`, `collc run --executor`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HostExecutor {
    /// The interpreter (`exec/host.rs`): the plan's instructions in dataflow order, tile by tile.
    #[default]
    Interpret,
    /// The plan compiled with cranelift into one native function per call shape (`exec/jit.rs`), where the links
    /// are rings in shared memory (threads, shm); elsewhere interpreted, with one WARN.
    Jit,
}

impl HostExecutor {
    pub const ALL: [HostExecutor; 2] = [HostExecutor::Interpret, HostExecutor::Jit];

    pub fn name(self) -> &'static str {
        match self {
            HostExecutor::Interpret => "interp",
            HostExecutor::Jit => "jit",
        }
    }
}

impl std::str::FromStr for HostExecutor {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HostExecutor::ALL
            .into_iter()
            .find(|e| e.name() == s.trim())
            .ok_or_else(|| format!("`{s}` is not an executor; give interp or jit"))
    }
}

impl Options {
    /// `COLLC_TIMEOUT` (seconds) and `COLLC_SLOT_BYTES`, over the defaults.
    pub fn from_env() -> Result<Options, RuntimeError> {
        let mut options = Options::default();
        if let Ok(text) = std::env::var("COLLC_TIMEOUT") {
            let seconds: f64 = text
                .parse()
                .ok()
                .filter(|s: &f64| *s > 0.0 && s.is_finite())
                .ok_or_else(|| RuntimeError::Config(format!("COLLC_TIMEOUT=`{text}` is not a positive number")))?;
            options.timeout = Duration::from_secs_f64(seconds);
        }
        if let Ok(text) = std::env::var("COLLC_EXECUTOR") {
            options.executor = text.parse().map_err(|e| RuntimeError::Config(format!("COLLC_EXECUTOR: {e}")))?;
        }
        if let Ok(text) = std::env::var("COLLC_SLOT_BYTES") {
            options.slot_bytes = text
                .parse()
                .ok()
                .filter(|b: &usize| (64..=1 << 30).contains(b))
                .ok_or_else(|| RuntimeError::Config(format!("COLLC_SLOT_BYTES=`{text}` is not in 64..=2^30")))?;
        }
        Ok(options)
    }

    /// The largest link slot over `transport` for a schedule on `connections` connections: `slot_bytes`, or what
    /// the transport's slot policy gives (`Backend::slot_policy`); for a call that goes by reference whole
    /// (`by_reference`, over a transport whose ranks share memory), up to `SlotPolicy::SINGLE_COPY_MAX`, as its
    /// messages carry addresses and larger tiles mean fewer hand-overs (bench/README.md).
    pub fn slot_cap(&self, transport: crate::Transport, connections: usize, by_reference: bool) -> usize {
        let backend = transport.backend();
        match self.slot_bytes {
            0 if by_reference && backend.single_copy() => {
                let policy = backend.slot_policy();
                crate::SlotPolicy { max: policy.max.max(crate::SlotPolicy::SINGLE_COPY_MAX), ..policy }
                    .slot_cap(connections)
            }
            0 => backend.slot_policy().slot_cap(connections),
            bytes => bytes,
        }
    }
}

/// The buffers of one call: NCCL's out-of-place (`send` != `recv`) or in-place form, in host memory or (the `cuda`
/// transport) in device memory.
pub enum Buffers<'a> {
    OutOfPlace { send: &'a [u8], recv: &'a mut [u8] },
    InPlace(&'a mut [u8]),
    DeviceOutOfPlace { send: DevicePtr, recv: DevicePtr },
    DeviceInPlace(DevicePtr),
}

/// A range of device memory: its address and length (e.g. `cuda::DeviceBuffer::ptr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePtr {
    pub addr: u64,
    pub bytes: usize,
}

/// One collective call: what to compute, on how many elements per block, with which root and peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CallShape {
    pub collective: Collective,
    pub count: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub root: u32,
    pub peer: u32,
}

#[derive(Clone, Debug)]
struct Algorithm {
    name: String,
    source: String,
    params: Vec<(String, i64)>,
    /// A schedule read from a `.sched` file and verified (`set_schedule`), with its instructions' lines there: it
    /// runs as it is, for its placement, root and peer only.
    fixed: Option<Arc<(VerifiedSchedule, SchedLines)>>,
    /// Chosen by a selection: the schedule it was costed on, run as it is by the calls it fits (its placement, root
    /// and peer).
    costed: Option<Arc<VerifiedSchedule>>,
}

impl Algorithm {
    /// A selection's candidate, to run with the schedule it was costed on.
    fn chosen(candidate: &crate::select::Candidate) -> Algorithm {
        Algorithm {
            name: candidate.name.clone(),
            source: candidate.source.clone(),
            params: candidate.params.clone(),
            fixed: None,
            costed: candidate.costed.schedule.clone(),
        }
    }

    /// What its name is, for mismatch reports: a library algorithm (the library's source under its name), a
    /// `.coll` source, or a `.sched` file.
    fn name_is(&self) -> &'static str {
        match &self.fixed {
            Some(_) => ".sched file",
            None if library::get(&self.name) == Some(self.source.as_str()) => "library algorithm",
            None => ".coll source",
        }
    }
}

type ScheduleKey = (Collective, Placement, u32, u32);

/// What a compiled schedule depends on: the algorithm (name, a hash of its source, its bindings) and the call's
/// collective, placement, root and peer.
#[derive(Clone, PartialEq, Eq, Hash)]
struct CompileKey {
    name: String,
    source: u64,
    params: Vec<(String, i64)>,
    call: ScheduleKey,
}

/// Schedules compiled and selections costed for the communicators of one process: rank threads share them, so a
/// schedule is compiled, verified and held once per process, not once per rank (at p = 128 the ring's per-rank
/// copies were most of a run's memory, and grew as p^3), and a collective's candidates are costed once.
#[derive(Default)]
struct Caches {
    schedules: Mutex<HashMap<CompileKey, Arc<Shared>>>,
    selections: Mutex<HashMap<Collective, Arc<Selection>>>,
}
type Compiled = Arc<Caches>;

/// A compiled schedule as the rank threads share it, with the connections it sends on (they set its FIFOs' slot
/// cap), counted once: counting them per rank went over every rank's program p times.
struct Shared {
    sched: VerifiedSchedule,
    connections: usize,
    /// Every message of every rank is a `Send` whose source stays (`VerifiedSchedule::sources_that_stay`): where
    /// the ranks share memory, the whole call can go by reference, and its tiles are sized for that.
    by_reference: bool,
    /// Channels the schedule uses (1 + the highest), the same for every rank: the device executor sizes its lanes by it.
    channels: u32,
}
/// A call shape, its placement, and the candidate a live-learning call explores (`select::live`), if it does.
type PlanKey = (CallShape, Placement, Option<usize>);

/// Aborts a communicator from any thread, as `ncclCommAbort` does: the call it is in returns an error within a
/// health check (milliseconds), and so does every peer's, naming this rank.
#[derive(Clone)]
pub struct AbortHandle {
    bootstrap: Arc<dyn Bootstrap>,
    rank: u32,
}

impl AbortHandle {
    pub fn abort(&self) {
        self.bootstrap.abort(self.rank);
    }
}

pub struct Communicator {
    rank: u32,
    n_ranks: u32,
    options: Options,
    /// How this rank reaches its peers: opens each plan's links.
    fabric: Arc<dyn Fabric>,
    bootstrap: Arc<dyn Bootstrap>,
    /// Algorithm per collective: (name, source, parameter bindings).
    algorithms: HashMap<Collective, Algorithm>,
    /// By algorithm name and call.
    schedules: HashMap<(String, ScheduleKey), Arc<Shared>>,
    /// Selections set for this communicator (`set_selection`), over the shared ones it makes for itself.
    selections: HashMap<Collective, Arc<Selection>>,
    /// A selection narrowed for a user's operator that only a schedule in rank order computes (`Selection::admitting`),
    /// by the selection it narrows (its address), operator and data type.
    narrowed: HashMap<(usize, ReduceOp, DataType), Option<Arc<Selection>>>,
    /// The size classes (collective, log2 of the bytes) whose choice this rank has logged.
    logged: std::collections::HashSet<(Collective, u32)>,
    compiled: Compiled,
    plans: Vec<Box<dyn Executor>>,
    /// The plan the call in progress (or the last one) runs.
    running: Option<usize>,
    plan_index: HashMap<PlanKey, usize, FxBuildHasher>,
    /// The last call's plan: back-to-back calls of one shape skip the hash lookup.
    last_plan: Option<(PlanKey, usize)>,
    seq: u64,
    barriers: u64,
    /// Idle rounds a wait spins before it yields the core.
    spins: u32,
    recorder: recorder::Shared,
    /// Dump requests (SIGUSR1) this rank has answered.
    answered: std::cell::Cell<u64>,
    /// The fingerprint of the plan whose source this rank published last (`Bootstrap::publish_source`).
    published_source: u64,
    /// What this rank learns from live calls, when `COLLC_LEARN=1`.
    live: Option<crate::select::Live>,
    /// The run trace (`enable_tracing`), and whether the calls from now on are recorded in it.
    tracer: Option<Arc<crate::trace::Tracer>>,
    tracing_calls: bool,
}

impl Communicator {
    /// `n_ranks` communicators of one group, for rank threads of this process (the `threads` transport).
    pub fn threads(n_ranks: u32, options: Options) -> Result<Vec<Communicator>, RuntimeError> {
        crate::transport::shm::THREADS.group(n_ranks, options)
    }

    /// `n_ranks` communicators for rank threads of this process whose plans run on the host twin of the CUDA
    /// interpreter (the `twin` transport): the device encoding and flag protocol, checked on a CPU.
    pub fn twin(n_ranks: u32, options: Options) -> Result<Vec<Communicator>, RuntimeError> {
        crate::transport::twin::TWIN.group(n_ranks, options)
    }

    /// `n_ranks` communicators for rank threads of this process on GPUs (the `cuda` transport): rank r on GPU
    /// r mod G, G the GPUs the driver sees or `COLLC_CUDA_GPUS`; ranks sharing a GPU run one launch per call.
    pub fn cuda(n_ranks: u32, options: Options) -> Result<Vec<Communicator>, RuntimeError> {
        crate::transport::cuda::CUDA.group(n_ranks, options)
    }

    /// As `cuda`, on the first `gpus` GPUs (all of them when `None`).
    pub fn cuda_on(n_ranks: u32, gpus: Option<u32>, options: Options) -> Result<Vec<Communicator>, RuntimeError> {
        crate::transport::cuda::group_on(n_ranks, gpus, options)
    }

    /// Bytes this rank's plan of a call shape reads and writes per call (its messages included): what a
    /// memory-bound executor moves (`Plan::traffic_bytes`).
    pub fn traffic_bytes(&mut self, shape: CallShape, placement: Placement) -> Result<u64, RuntimeError> {
        let index = self.plan(shape, placement, None)?;
        Ok(self.plans[index].plan_mut().traffic_bytes())
    }

    /// Rank `rank` of job `job` on this host, in its own process, on GPU `rank mod G` (the `cuda` transport for rank
    /// processes): device memory shared with the other processes through CUDA IPC, the bootstrap in /dev/shm.
    pub fn cuda_process(job: &str, rank: u32, n_ranks: u32, options: Options) -> Result<Communicator, RuntimeError> {
        crate::transport::cuda::process(job, rank, n_ranks, options)
    }

    /// The GPU this rank's buffers must be on (the `cuda` transport), or `None`.
    pub fn gpu_ordinal(&self) -> Option<i32> {
        self.fabric.gpu_ordinal(self.rank)
    }

    /// A zeroed host buffer of `bytes` for this communicator's calls (NCCL's `ncclMemAlloc`): over shm, rank processes
    /// read each other's such buffers in place (single copy); a buffer from elsewhere travels through the FIFOs.
    /// Other transports, or no room left in the arena: from the heap (`HostBuffer::shared` says which).
    pub fn alloc(&self, bytes: usize) -> crate::HostBuffer {
        match self.fabric.alloc(bytes) {
            Some(buf) => crate::HostBuffer::arena(buf),
            None => crate::HostBuffer::heap(bytes),
        }
    }

    /// Rank `rank` of job `job` on this host, in its own process (the `shm` transport). Every rank of the job
    /// calls this with the same `job` and `n_ranks`; it returns once all have joined.
    pub fn shm(job: &str, rank: u32, n_ranks: u32, options: Options) -> Result<Communicator, RuntimeError> {
        crate::transport::shm::process(job, rank, n_ranks, options)
    }

    /// `n_ranks` communicators of one group over `transport`, each for a rank thread of this process: for a process
    /// transport, each made by a thread of its own as rank processes make theirs (shm segments under a fresh job
    /// id, or a tcp job on the loopback with its rendezvous on a free port and a fresh token). For tests and for
    /// checking a transport inside one process.
    pub fn group(
        transport: crate::Transport,
        n_ranks: u32,
        options: Options,
    ) -> Result<Vec<Communicator>, RuntimeError> {
        transport.backend().group(n_ranks, options)
    }

    /// Rank `job.rank` of a job whose ranks reach each other over TCP (the `tcp` transport), on this host or any
    /// other. Every rank calls this with the same rendezvous, job, world size and token; rank 0 hosts the
    /// rendezvous. It returns once all have joined.
    pub fn tcp(job: &TcpJob, options: Options) -> Result<Communicator, RuntimeError> {
        crate::transport::tcp::process(job, options)
    }

    /// This process's rank of the job a launcher started it in (torchrun, mpirun, Slurm or `collc run`), over
    /// `shm`; `Ok(None)` when no launcher's variables are set.
    pub fn from_env(options: Options) -> Result<Option<Communicator>, RuntimeError> {
        Communicator::from_env_over(crate::transport::Transport::of(&crate::transport::shm::SHM), options)
    }

    /// As `from_env`, over `transport` (`shm`, `tcp` with the rendezvous and token `TcpJob::from_env` reads, or
    /// `cuda`; `threads` means `shm` when every rank is on this host, else `tcp`).
    pub fn from_env_over(transport: crate::Transport, options: Options) -> Result<Option<Communicator>, RuntimeError> {
        let Some(launch) = crate::launch::from_env().map_err(RuntimeError::Config)? else { return Ok(None) };
        transport.join(&launch, options).map(Some)
    }

    /// `n_ranks` communicators of rank threads over `fabric`, their bootstrap a control block in `memory` (the heap).
    pub(crate) fn heap_group(
        fabric: Arc<dyn Fabric>,
        memory: &Memory,
        n_ranks: u32,
        options: Options,
    ) -> Result<Vec<Communicator>, RuntimeError> {
        check_world(0, n_ranks)?;
        let compiled = Compiled::default();
        let job = crate::transport::shm::group_job_id();
        (0..n_ranks)
            .map(|rank| {
                let bootstrap = Arc::new(memory.bootstrap(n_ranks)?);
                let world = (rank, n_ranks);
                Communicator::join(fabric.clone(), bootstrap, compiled.clone(), world, &job, options.clone())
            })
            .collect()
    }

    /// Rank `rank` of job `job` whose ranks are processes, over `fabric` and `bootstrap`; returns once every rank
    /// has joined.
    pub(crate) fn process(
        fabric: Arc<dyn Fabric>,
        bootstrap: Arc<dyn Bootstrap>,
        (rank, n_ranks): (u32, u32),
        job: &str,
        options: Options,
    ) -> Result<Communicator, RuntimeError> {
        check_world(rank, n_ranks)?;
        let mut comm = Communicator::join(fabric, bootstrap, Compiled::default(), (rank, n_ranks), job, options)?;
        // A rank that never joins or fails at setup is dumped too: the others' dumps say whom they waited for (the
        // bootstrap's barrier has told them of that rank).
        comm.barrier().inspect_err(|error| drop(comm.recorder.dump(exec::dump_reason(error), None)))?;
        comm.agree()?;
        Ok(comm)
    }

    /// Checks, once every rank has joined, that the ranks agree on what the job runs: the transport, and the users'
    /// algorithms their `COLLC_ALGO_PATH` gives (read here, so a file that does not parse is named at setup). A
    /// disagreement, or a rank whose path does not read, is the same error on every rank, naming the ranks.
    fn agree(&mut self) -> Result<(), RuntimeError> {
        let algorithms = match crate::algo_path::library() {
            Ok(library) => format!("{:016x}\n{}", library.user_digest(), crate::algo_path::summary(&library)),
            Err(error) => format!("!\n{VAR} does not read: {}", error.describe(), VAR = crate::algo_path::VAR),
        };
        let learning = if self.live.is_some() { " learning from live calls (COLLC_LEARN=1)" } else { "" };
        let mine = format!("{}{learning}\n{algorithms}", self.transport().name());
        let mut blob = mine.as_bytes()[..mine.len().min(crate::link::BLOB_BYTES)].to_vec();
        while std::str::from_utf8(&blob).is_err() {
            blob.pop();
        }
        self.barriers += 1;
        let all = self.bootstrap.all_gather(self.rank, &blob, self.barriers, self.options.timeout)?;
        let all: Vec<String> = all.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect();
        disagreement(&all).map_or(Ok(()), |message| Err(RuntimeError::Config(message)))
    }

    /// `n_ranks` communicators, each made by `make` on a thread of its own, as rank processes make theirs.
    pub(crate) fn rank_threads(
        n_ranks: u32,
        make: &(dyn Fn(u32) -> Result<Communicator, RuntimeError> + Sync),
    ) -> Result<Vec<Communicator>, RuntimeError> {
        check_world(0, n_ranks)?;
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..n_ranks).map(|rank| scope.spawn(move || make(rank))).collect();
            handles.into_iter().map(|h| h.join().map_err(|_| RuntimeError::Poisoned)?).collect()
        })
    }

    fn join(
        fabric: Arc<dyn Fabric>,
        bootstrap: Arc<dyn Bootstrap>,
        compiled: Compiled,
        (rank, n_ranks): (u32, u32),
        job: &str,
        options: Options,
    ) -> Result<Self, RuntimeError> {
        bootstrap.join(rank)?;
        Ok(Communicator {
            rank,
            n_ranks,
            options,
            fabric,
            bootstrap,
            algorithms: HashMap::new(),
            schedules: HashMap::new(),
            selections: HashMap::new(),
            narrowed: HashMap::new(),
            logged: Default::default(),
            compiled,
            plans: Vec::new(),
            running: None,
            plan_index: HashMap::default(),
            last_plan: None,
            seq: 0,
            barriers: 0,
            spins: spins_for(n_ranks),
            recorder: Recorder::new(rank, n_ranks, job),
            answered: std::cell::Cell::new(crate::recorder::requests()),
            published_source: 0,
            live: crate::select::live_enabled().map_err(RuntimeError::Config)?.then(Default::default),
            tracer: None,
            tracing_calls: false,
        })
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Keeps a run trace (`crate::trace`): when each instruction of the calls `trace_calls` selects moved its data.
    /// Before the first call, so every plan carries it; its buffer (`trace::MAX_SPANS` spans) is allocated here.
    pub fn enable_tracing(&mut self) -> Result<(), RuntimeError> {
        if !self.plans.is_empty() {
            return Err(RuntimeError::Config("tracing is enabled before the first call".into()));
        }
        self.tracer.get_or_insert_with(|| crate::trace::Tracer::new(self.rank, self.n_ranks));
        Ok(())
    }

    /// Whether the calls from now on are recorded in the run trace (once `enable_tracing` made one).
    pub fn trace_calls(&mut self, on: bool) {
        self.tracing_calls = on;
    }

    /// What the run trace holds so far (emptied), for `trace::chrome::write`; `None` without `enable_tracing`.
    pub fn take_trace(&self) -> Option<crate::trace::RankTrace> {
        self.tracer.as_ref().map(|tracer| tracer.take())
    }

    pub fn n_ranks(&self) -> u32 {
        self.n_ranks
    }

    pub fn transport(&self) -> crate::Transport {
        self.fabric.transport()
    }

    /// What runs this rank's plans (`Options::executor`).
    pub fn executor(&self) -> HostExecutor {
        self.options.executor
    }

    /// Runs `collective` with the algorithm in `source` (a `.coll` text, shown as `name`) from now on, with
    /// `params` bound (`--set`). Every rank must choose the same algorithm.
    pub fn set_algorithm(&mut self, collective: Collective, name: &str, source: &str, params: Vec<(String, i64)>) {
        let algorithm =
            Algorithm { name: name.to_string(), source: source.to_string(), params, fixed: None, costed: None };
        self.install(collective, algorithm);
    }

    /// Chooses `collective`'s algorithm per call through `selection` from now on (what a communicator does by itself
    /// when no algorithm is set, with a selection of its own): the predicted-fastest candidate for each call's
    /// size. Every rank must set the same selection (the same filter, topology, root and peer).
    pub fn set_selection(&mut self, selection: Arc<Selection>) {
        let collective = selection.collective;
        self.algorithms.remove(&collective);
        self.selections.insert(collective, selection);
        self.forget(collective);
    }

    /// Runs `collective` with a verified schedule (read from the `.sched` file `name`, whose instructions stand at
    /// `lines`) from now on: calls in its placement with its root and peer run it; others fail naming the file.
    /// Every rank must set the same schedule.
    pub fn set_schedule(&mut self, name: &str, schedule: Arc<(VerifiedSchedule, SchedLines)>) {
        let collective = schedule.0.collective;
        let algorithm = Algorithm {
            name: name.to_string(),
            source: String::new(),
            params: Vec::new(),
            fixed: Some(schedule),
            costed: None,
        };
        self.install(collective, algorithm);
    }

    fn install(&mut self, collective: Collective, algorithm: Algorithm) {
        self.algorithms.insert(collective, algorithm);
        self.selections.remove(&collective);
        self.forget(collective);
    }

    /// Drops what was made for `collective`'s calls before its algorithm changed.
    fn forget(&mut self, collective: Collective) {
        self.schedules.retain(|key, _| key.1 .0 != collective);
        // Plans are cheap to prepare again; dropping them all keeps the index simple.
        self.plans.clear();
        self.plan_index.clear();
        self.last_plan = None;
    }

    /// The algorithm a call of `shape` runs (the one set for its collective, or the one its selection chooses for
    /// the call's size).
    pub fn algorithm_of(&mut self, shape: &CallShape) -> Result<String, RuntimeError> {
        self.algorithm_for(shape, None).map(|algorithm| algorithm.name)
    }

    /// The algorithm `collective` runs with: the one set, else `selected per size`.
    pub fn algorithm(&self, collective: Collective) -> String {
        match self.algorithms.get(&collective) {
            Some(algorithm) => algorithm.name.clone(),
            None => "selected per size".into(),
        }
    }

    /// Waits until every rank has called `barrier` as often as this one.
    pub fn barrier(&mut self) -> Result<(), RuntimeError> {
        self.barriers += 1;
        let at = match self.seq {
            0 => "communicator setup".to_string(),
            seq => format!("after call #{seq}"),
        };
        self.bootstrap.barrier(self.rank, self.barriers, self.options.timeout, &at)
    }

    /// Collects one (time, count) pair from every rank at rank 0, which gets `Some` of them in rank order; the
    /// others get `None`. A collective itself: every rank must call it.
    pub fn gather_report(&mut self, seconds: f64, count: u64) -> Result<Option<Vec<(f64, u64)>>, RuntimeError> {
        let mut blob = [0u8; 16];
        blob[..8].copy_from_slice(&seconds.to_le_bytes());
        blob[8..].copy_from_slice(&count.to_le_bytes());
        self.barriers += 1;
        let all = self.bootstrap.all_gather(self.rank, &blob, self.barriers, self.options.timeout)?;
        if self.rank != 0 {
            return Ok(None);
        }
        let decode = |(r, blob): (usize, Vec<u8>)| match <[u8; 16]>::try_from(blob.as_slice()) {
            Ok(b) => {
                Ok((f64::from_le_bytes(b[..8].try_into().unwrap()), u64::from_le_bytes(b[8..].try_into().unwrap())))
            }
            Err(_) => Err(RuntimeError::Config(format!("rank {r} reported {} bytes, not 16", blob.len()))),
        };
        all.into_iter().enumerate().map(decode).collect::<Result<_, _>>().map(Some)
    }

    /// A handle another thread can stop this rank's calls with (`AbortHandle::abort`).
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle { bootstrap: self.bootstrap.clone(), rank: self.rank }
    }

    /// Marks this rank failed so every peer stops with an error naming it (for a launcher or a caller that gives up).
    pub fn fail(&self) {
        // The last rank out removes what the job left (its shared memory), failed or not.
        if self.bootstrap.leave(self.rank, Status::Failed) {
            self.fabric.remove_all();
        }
    }

    /// Gives up after `error`: when it names another rank's failure, that rank is the failure every peer hears of
    /// (this rank then leaves as it goes); otherwise this rank is marked failed (`fail`).
    pub fn fail_with(&self, error: &RuntimeError) {
        match error {
            RuntimeError::PeerFailed { peer, how, .. } if *peer != self.rank => {
                self.bootstrap.report_failure(*peer, how)
            }
            _ => self.fail(),
        }
    }

    /// Runs one collective call. `count` is NCCL's: elements per rank for allreduce/broadcast/reduce, per block
    /// (the send count of allgather/gather, the receive count of reducescatter/scatter, per peer for alltoall).
    pub fn call(&mut self, shape: CallShape, buffers: Buffers) -> Result<(), RuntimeError> {
        let placement = match buffers {
            Buffers::OutOfPlace { .. } | Buffers::DeviceOutOfPlace { .. } => Placement::OutOfPlace,
            Buffers::InPlace(_) | Buffers::DeviceInPlace(_) => Placement::InPlace,
        };
        let explore = self.exploring(&shape)?;
        self.seq += 1;
        // Only a call that explores is timed here (its time is what it learns): others read no clock.
        let started = explore.map(|_| std::time::Instant::now());
        self.running = None;
        let result = self.call_result(shape, placement, buffers, explore, started);
        // A failed call that left messages of its buffers to be read in place (rank threads) says it failed now,
        // then returns only once no peer reads them: its caller may free its buffers then.
        if let (Err(error), Some(index)) = (&result, self.running) {
            if self.plans[index].refs_outstanding() {
                self.fail_with(error);
                self.plans[index].settle(self.bootstrap.as_ref(), self.options.timeout);
            }
        }
        result
    }

    /// `call`'s outcome, a failure announced as its kind says.
    fn call_result(
        &mut self,
        shape: CallShape,
        placement: Placement,
        buffers: Buffers,
        explore: Option<usize>,
        started: Option<std::time::Instant>,
    ) -> Result<(), RuntimeError> {
        match self.run_call(shape, placement, buffers, explore) {
            Ok(()) => match explore.zip(started) {
                Some((index, started)) => self.learn(shape, index, started.elapsed().as_secs_f64()),
                None => Ok(()),
            },
            Err(error @ RuntimeError::PeerFailed { .. }) => Err(error),
            Err(RuntimeError::Timeout { rank, what, at, seconds, waiting_for, waits_on }) => {
                // A timeout is news of the rank the job stopped at, not of this one: every rank names that one.
                if let Some(peer) = self.bootstrap.stalled(waits_on).filter(|&peer| peer != rank) {
                    let how = format!(
                        "did not go on within the timeout: rank {rank} waited {seconds:.1} s for {waiting_for}, and \
                         rank {peer} no longer checks in (stopped, hung, or busy outside collc?)"
                    );
                    self.bootstrap.report_failure(peer, &how);
                    return Err(RuntimeError::PeerFailed { rank, what, at, peer, how });
                }
                // Another rank may have named the one the job stopped at meanwhile (which may be gone since).
                if let Err((peer, how)) = self.bootstrap.health(&[]) {
                    if peer != rank {
                        return Err(RuntimeError::PeerFailed { rank, what, at, peer, how });
                    }
                }
                match waits_on.filter(|&peer| peer != rank) {
                    Some(peer) => self.bootstrap.report_failure(
                        peer,
                        &format!("did not go on within the timeout (rank {rank} waited {seconds:.1} s for it)"),
                    ),
                    None => self.bootstrap.abort(rank),
                }
                Err(RuntimeError::Timeout { rank, what, at, seconds, waiting_for, waits_on })
            }
            Err(error) => {
                self.bootstrap.abort(self.rank);
                Err(error)
            }
        }
    }

    fn run_call(
        &mut self,
        shape: CallShape,
        placement: Placement,
        buffers: Buffers,
        explore: Option<usize>,
    ) -> Result<(), RuntimeError> {
        let device = matches!(buffers, Buffers::DeviceOutOfPlace { .. } | Buffers::DeviceInPlace(_));
        let transport = self.fabric.transport();
        if device != self.fabric.gpu_ordinal(self.rank).is_some() {
            return Err(RuntimeError::Config(match device {
                true => format!(
                    "rank {}: device buffers need the cuda transport; this communicator is {transport}",
                    self.rank
                ),
                false => format!(
                    "rank {}: the cuda transport computes on device memory (Buffers::DeviceOutOfPlace / DeviceInPlace, \
                     e.g. from collc_runtime::cuda::DeviceBuffer); got host buffers",
                    self.rank
                ),
            }));
        }
        let index = self.plan(shape, placement, explore).inspect_err(|error| {
            // Preparing a shape waits on the peers too (device IPC handles are all-gathered): a peer that fails
            // then is dumped as in a call, with no instruction yet.
            if matches!(error, RuntimeError::PeerFailed { .. } | RuntimeError::Timeout { .. }) {
                self.recorder.dump(exec::dump_reason(error), None);
            }
        })?;
        self.running = Some(index);
        let executor = &mut self.plans[index];
        let plan = executor.plan_mut();
        let elem = plan.elem;
        let check = |name: &str, got: usize, elements: usize| {
            let needed = elements * elem;
            if got < needed {
                Err(RuntimeError::BufferSize { rank: plan.rank, buffer: name.into(), got, needed })
            } else {
                Ok(())
            }
        };
        match buffers {
            Buffers::OutOfPlace { send, recv } => {
                check("send", send.len(), plan.user_elements[0])?;
                check("recv", recv.len(), plan.user_elements[1])?;
                // Out of place the verifier proved `in` is never written, so the cast loses nothing.
                plan.bases[0] = send.as_ptr() as *mut u8;
                plan.bases[1] = recv.as_mut_ptr();
            }
            Buffers::InPlace(buf) => {
                let elements = plan.user_elements[0].max(plan.user_elements[1]);
                check("buffer", buf.len(), elements)?;
                plan.bases[0] = buf.as_mut_ptr();
                plan.bases[1] = buf.as_mut_ptr();
            }
            // Device addresses are numbers to the host: only the device interpreter dereferences them.
            Buffers::DeviceOutOfPlace { send, recv } => {
                check("send", send.bytes, plan.user_elements[0])?;
                check("recv", recv.bytes, plan.user_elements[1])?;
                plan.bases[0] = send.addr as *mut u8;
                plan.bases[1] = recv.addr as *mut u8;
            }
            Buffers::DeviceInPlace(buf) => {
                let elements = plan.user_elements[0].max(plan.user_elements[1]);
                check("buffer", buf.bytes, elements)?;
                plan.bases[0] = buf.addr as *mut u8;
                plan.bases[1] = buf.addr as *mut u8;
            }
        }
        let kind = ((shape.collective as u32) << 24)
            | ((shape.dtype as u32) << 16)
            | (u32::from(shape.op.nccl_code()) << 8)
            | placement as u32;
        let plan = executor.plan_mut();
        let fingerprint = plan.fingerprint;
        if fingerprint != self.published_source {
            // Before the call: a peer that finds this rank in it with another fingerprint names its source.
            self.bootstrap.publish_source(self.rank, fingerprint, &plan.source);
            self.published_source = fingerprint;
        }
        let info = CallInfo { seq: self.seq, count: shape.count as u64, kind, root: shape.root, fingerprint };
        self.bootstrap.publish_call(self.rank, info);
        self.recorder.start(&info, executor.plan_mut().recorded_as);
        if let Some(tracer) = &self.tracer {
            let described = crate::link::describe_kind(kind, info.count, info.root);
            tracer.begin_call(self.tracing_calls, self.seq, described, executor.plan_mut());
        }
        let (bootstrap, seq, timeout, spins) = (self.bootstrap.as_ref(), self.seq, self.options.timeout, self.spins);
        let (recorder, answered) = (self.recorder.as_ref(), &self.answered);
        let call = Call { bootstrap, seq, info, timeout, spins, recorder, answered };
        let outcome = exec::run_recorded(executor.as_mut(), &call);
        self.recorder.finish(outcome.as_ref().err());
        // A dump asked for (SIGUSR1) while the call ran, and not answered from inside it (it never waited long).
        exec::answer_dump_request(&call, || executor.snapshot(seq));
        outcome
    }

    /// The index of the prepared plan of a call shape (with the candidate `explore` when live learning explores
    /// one), compiling and verifying its schedule on first use.
    fn plan(&mut self, shape: CallShape, placement: Placement, explore: Option<usize>) -> Result<usize, RuntimeError> {
        // A root or peer the collective ignores does not make another plan (as `schedule_for` keys schedules).
        let root = if shape.collective.rooted() { shape.root } else { 0 };
        let peer = if shape.collective == Collective::SendRecv { shape.peer } else { 0 };
        let key = (CallShape { root, peer, ..shape }, placement, explore);
        if let Some((last, index)) = self.last_plan {
            if last == key {
                return Ok(index);
            }
        }
        if !self.plan_index.contains_key(&key) {
            let algorithm = self.algorithm_for(&shape, explore)?;
            let shared = self.schedule_for(&algorithm, shape, placement)?;
            let backend = self.fabric.transport().backend();
            let (in_blocks, out_blocks) = shape.collective.buffer_chunks(self.n_ranks, 1);
            let call_bytes = shape.count.saturating_mul(shape.dtype.size_bytes() * in_blocks.max(out_blocks) as usize);
            let single_copy = self.options.single_copy && call_bytes <= backend.single_copy_max_bytes();
            let plan = exec::prepare(
                &shared.sched,
                PlanInput {
                    name: &algorithm.name,
                    name_is: algorithm.name_is(),
                    rank: self.rank,
                    count: shape.count,
                    dtype: shape.dtype,
                    op: shape.op,
                    origin: match &algorithm.fixed {
                        Some(fixed) => Origin::Sched(&fixed.1),
                        None => Origin::Coll(&algorithm.source),
                    },
                    slot_cap: self.options.slot_cap(
                        self.fabric.transport(),
                        shared.connections,
                        shared.by_reference && single_copy,
                    ),
                    single_copy,
                    transport: self.fabric.transport().name(),
                    slots: self.fabric.slots(),
                },
            )?;
            let mut plan = plan;
            plan.recorded_as = self.recorder.intern(&plan.algorithm);
            plan.channels = shared.channels;
            plan.jit = self.options.executor == HostExecutor::Jit;
            plan.tracer = self.tracer.clone();
            let (bootstrap, rank, timeout) = (self.bootstrap.clone(), self.rank, self.options.timeout);
            let barriers = &mut self.barriers;
            let mut gather = |blob: &[u8]| {
                *barriers += 1;
                bootstrap.all_gather(rank, blob, *barriers, timeout)
            };
            self.plans.push(self.fabric.prepare_collective(plan, &mut gather)?);
            self.plan_index.insert(key, self.plans.len() - 1);
        }
        let index = self.plan_index[&key];
        self.last_plan = Some((key, index));
        Ok(index)
    }

    /// The verified schedule of a call shape in a placement with `algorithm`, compiled once per algorithm,
    /// collective, placement, root and peer.
    fn schedule_for(
        &mut self,
        algorithm: &Algorithm,
        shape: CallShape,
        placement: Placement,
    ) -> Result<Arc<Shared>, RuntimeError> {
        let root = if shape.collective.rooted() { shape.root } else { 0 };
        let peer = if shape.collective == Collective::SendRecv { shape.peer } else { 0 };
        let key = (algorithm.name.clone(), (shape.collective, placement, root, peer));
        if !self.schedules.contains_key(&key) {
            let mut source = collc_compiler::fxhash::FxHasher::default();
            std::hash::Hash::hash(&algorithm.source, &mut source);
            let shared_key = CompileKey {
                name: algorithm.name.clone(),
                source: std::hash::Hasher::finish(&source),
                params: algorithm.params.clone(),
                call: key.1,
            };
            // Held while compiling: the other rank threads want the same schedule, and wait for it.
            let mut compiled = self.compiled.schedules.lock().map_err(|_| RuntimeError::Poisoned)?;
            let schedule = match compiled.get(&shared_key) {
                Some(schedule) => schedule.clone(),
                None => {
                    let sched = self.compile(algorithm, shape.collective, placement, root, peer)?;
                    let channels =
                        1 + sched.ranks.iter().flat_map(|r| &r.instrs).map(|i| i.channel as u32).max().unwrap_or(0);
                    let by_reference = (0..sched.n_ranks).all(|r| {
                        let stays = sched.sources_that_stay(r);
                        (sched.ranks[r as usize].instrs.iter().zip(stays)).all(|(i, stays)| !i.op.sends() || stays)
                    });
                    let connections = sched.n_connections();
                    let schedule = Arc::new(Shared { connections, by_reference, channels, sched });
                    compiled.insert(shared_key, schedule.clone());
                    schedule
                }
            };
            drop(compiled);
            self.schedules.insert(key.clone(), schedule);
        }
        Ok(self.schedules[&key].clone())
    }

    /// The algorithm a call runs: the one set for its collective (`set_algorithm`, `set_schedule`), else the
    /// predicted-fastest for its size in the collective's selection (`set_selection`, or one made on its first
    /// call: `Selection::from_env`; where none can be made, the library's default, with a warning).
    fn algorithm_for(&mut self, shape: &CallShape, explore: Option<usize>) -> Result<Algorithm, RuntimeError> {
        let collective = shape.collective;
        if let Some(algorithm) = self.algorithms.get(&collective) {
            return Ok(algorithm.clone());
        }
        let Some(selection) = self.selection_of(collective)? else {
            let name = library::default_for(collective);
            let source = library::get(name).unwrap_or_default().to_string();
            return Ok(Algorithm { name: name.to_string(), source, params: Vec::new(), fixed: None, costed: None });
        };
        let narrowed = match shape.op {
            ReduceOp::User(_) => {
                let key = (Arc::as_ptr(&selection) as usize, shape.op, shape.dtype);
                let narrowed = self
                    .narrowed
                    .entry(key)
                    .or_insert_with(|| selection.admitting(&[shape.op], &[shape.dtype]).map(Arc::new));
                narrowed.clone()
            }
            _ => None,
        };
        // Live learning explores and learns among the whole selection's candidates: a narrowed one goes by the model.
        let whole = narrowed.is_none();
        let selection = narrowed.unwrap_or(selection);
        let bytes = crate::select::call_bytes(collective, shape.count, shape.dtype.size_bytes(), self.n_ranks);
        let (_, class) = crate::select::class_of(collective, bytes);
        // Exploring runs the candidate asked for; a class learned live runs what it learned.
        let learned = self.live.as_ref().and_then(|live| live.learned((collective, class)));
        if let Some(index) = explore.or(learned).filter(|&i| whole && i < selection.candidates.len()) {
            return Ok(Algorithm::chosen(&selection.candidates[index]));
        }
        let chosen = selection.choose(bytes);
        let candidate = &selection.candidates[chosen.index];
        if self.rank == 0 && self.logged.insert((collective, class)) {
            let (low, high) = ((1u128 << class) >> 1, (1u128 << class) - 1);
            let runner_up = chosen.runner_up.map_or(String::from("no runner-up"), |(i, t)| {
                format!("runner-up {} {:.1} us", selection.candidates[i].name, t * 1e6)
            });
            crate::log::info(
                crate::log::Subsys::Coll,
                format_args!(
                    "{collective} of {bytes} B (sizes {low}..={high} B): {} {} {:.1} us, {runner_up}; cost model \
                     on {}",
                    candidate.name,
                    if chosen.measured { "measured on this host" } else { "predicted" },
                    chosen.predicted * 1e6,
                    selection.topology
                ),
            );
        }
        Ok(Algorithm::chosen(candidate))
    }

    /// The selection `collective`'s calls choose through: the one set, else the shared one; `None` where none can be
    /// made.
    fn selection_of(&mut self, collective: Collective) -> Result<Option<Arc<Selection>>, RuntimeError> {
        match self.selections.get(&collective) {
            Some(selection) => Ok(Some(selection.clone())),
            None => self.shared_selection(collective),
        }
    }

    /// The candidate a call of `shape` explores, while live learning (`COLLC_LEARN=1`) explores its size class: the
    /// collective must choose through a selection of two candidates or more.
    fn exploring(&mut self, shape: &CallShape) -> Result<Option<usize>, RuntimeError> {
        if self.live.is_none() || self.algorithms.contains_key(&shape.collective) {
            return Ok(None);
        }
        let Some(selection) = self.selection_of(shape.collective)? else { return Ok(None) };
        let n = selection.candidates.len();
        let bytes = crate::select::call_bytes(shape.collective, shape.count, shape.dtype.size_bytes(), self.n_ranks);
        let live = self.live.as_mut().expect("checked");
        Ok((n > 1).then(|| live.explore(crate::select::class_of(shape.collective, bytes), n)).flatten())
    }

    /// Records an exploring call that ran candidate `index` in `seconds`; once its class has tried every candidate,
    /// the ranks all-gather their medians and settle on one (logged at INFO), which the class's calls run from then
    /// on, and rank 0 merges the times into this host's timings where the ranks share the host.
    fn learn(&mut self, shape: CallShape, index: usize, seconds: f64) -> Result<(), RuntimeError> {
        let collective = shape.collective;
        let Some(selection) = self.selection_of(collective)? else { return Ok(()) };
        let n = selection.candidates.len();
        let bytes = crate::select::call_bytes(collective, shape.count, shape.dtype.size_bytes(), self.n_ranks);
        let class = crate::select::class_of(collective, bytes);
        let Some(mine) = self.live.as_mut().and_then(|live| live.record(class, index, n, seconds)) else {
            return Ok(());
        };
        let blob: Vec<u8> = mine.iter().flat_map(|&t| (t as f32).to_le_bytes()).collect();
        self.barriers += 1;
        let all = self.bootstrap.all_gather(self.rank, &blob, self.barriers, self.options.timeout)?;
        let per_rank: Vec<Vec<f64>> = all
            .iter()
            .map(|b| b.chunks_exact(4).map(|t| f32::from_le_bytes(t.try_into().expect("4 bytes")) as f64).collect())
            .collect();
        let (chosen, slowest) = self.live.as_mut().expect("recorded").settle(class, &per_rank);
        // The plans made for the class's calls so far ran the predicted candidate; the next ones run the learned.
        self.plans.clear();
        self.plan_index.clear();
        self.last_plan = None;
        if self.rank != 0 {
            return Ok(());
        }
        let times: Vec<String> =
            selection.candidates.iter().zip(&slowest).map(|(c, t)| format!("{} {:.1} us", c.name, t * 1e6)).collect();
        crate::log::info(
            crate::log::Subsys::Coll,
            format_args!(
                "{collective} of {bytes} B: learned from live calls: {} (slowest rank's median of {} timed calls each: {})",
                selection.candidates[chosen].name,
                crate::select::live::TRIES,
                times.join(", ")
            ),
        );
        if !self.fabric.transport().backend().sockets() {
            let bytes = bytes as u64;
            let points =
                selection.candidates.iter().zip(&slowest).map(|(c, &t)| Point::new(&c.name, bytes, t)).collect();
            let transport = self.fabric.transport().name();
            if let Err(e) = crate::select::Measured::keep(collective.name(), self.n_ranks, transport, points) {
                crate::log::warn(crate::log::Subsys::Coll, format_args!("live timings not kept: {e}"));
            }
        }
        Ok(())
    }

    /// The selection the rank threads of this process share for `collective`, made by the first that needs it;
    /// `None` (after a warning) where none can be made.
    fn shared_selection(&mut self, collective: Collective) -> Result<Option<Arc<Selection>>, RuntimeError> {
        let mut selections = self.compiled.selections.lock().map_err(|_| RuntimeError::Poisoned)?;
        if let Some(selection) = selections.get(&collective) {
            return Ok(Some(selection.clone()));
        }
        let ranks = (self.n_ranks, self.n_ranks);
        match Selection::from_env(collective, ranks, self.fabric.transport(), self.options.determinism) {
            Ok(selection) => {
                let selection = Arc::new(selection);
                selections.insert(collective, selection.clone());
                Ok(Some(selection))
            }
            // A filter that leaves nothing or a user's algorithm that does not load or verify is the user's to fix;
            // anything else falls back, said aloud.
            Err(error @ RuntimeError::Config(_))
                if std::env::var_os("COLLC_ALGO").is_some()
                    || std::env::var_os(crate::algo_path::VAR).is_some_and(|p| !p.is_empty()) =>
            {
                Err(error)
            }
            Err(error) => {
                let default = library::default_for(collective);
                crate::log::warn(
                    crate::log::Subsys::Coll,
                    format_args!("{collective}: no selection ({error}); running the library's default, {default}"),
                );
                Ok(None)
            }
        }
    }

    fn compile(
        &self,
        algorithm: &Algorithm,
        collective: Collective,
        placement: Placement,
        root: u32,
        peer: u32,
    ) -> Result<VerifiedSchedule, RuntimeError> {
        let Algorithm { name, source, params, fixed, costed } = algorithm.clone();
        // The schedule a selection costed, when this call can run it as it is: not built again.
        if let Some(costed) = costed.filter(|s| (s.placement, s.root, s.peer) == (placement, root, peer)) {
            return Ok(VerifiedSchedule::clone(&costed));
        }
        if let Some(fixed) = fixed {
            let sched = &fixed.0;
            let wanted = (sched.placement, sched.root, sched.peer, sched.n_ranks);
            let (root, peer) = (
                if collective.rooted() { root } else { sched.root },
                if collective == Collective::SendRecv { peer } else { sched.peer },
            );
            if (placement, root, peer, self.n_ranks) != wanted {
                return Err(RuntimeError::Compile(format!(
                    "{name} is a schedule for {} calls on {} ranks with root {} and peer {}; this call is {placement} on {} ranks with root {root} and peer {peer} (collc build writes one for it)",
                    sched.placement, sched.n_ranks, sched.root, sched.peer, self.n_ranks
                )));
            }
            return Ok(sched.clone());
        }
        let bindings = Bindings {
            n_ranks: self.n_ranks,
            root: collective.rooted().then_some(root),
            peer: (collective == Collective::SendRecv).then_some(peer),
            params,
        };
        let schedule =
            compile(&source, &bindings, CompileOptions::placed(placement), &Limits::default()).map_err(|errors| {
                let first = errors.0.first().map_or_else(String::new, |e| e.message.clone());
                RuntimeError::Compile(format!(
                    "{name} for {} ranks ({placement}) does not compile: {first}",
                    self.n_ranks
                ))
            })?;
        if schedule.collective != collective {
            return Err(RuntimeError::Compile(format!("{name} implements {}, not {collective}", schedule.collective)));
        }
        Ok(schedule)
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if self.bootstrap.leave(self.rank, Status::Left) {
            self.fabric.remove_all();
        }
    }
}

/// Spinning only pays when the peer runs on another core at the same time: with more ranks than cores, yield at
/// once. (`COLLC_SPINS` overrides.)
fn spins_for(n_ranks: u32) -> u32 {
    if let Some(spins) = std::env::var("COLLC_SPINS").ok().and_then(|s| s.parse().ok()) {
        return spins;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if n_ranks as usize > cores {
        0
    } else {
        crate::wait::SPINS
    }
}

/// What is wrong with the job when ranks' setups (`Communicator::agree`'s blobs: transport, digest and summary of
/// the users' algorithms, one line each; digest `!` when the path does not read) are not all the same, or `None`.
fn disagreement(setups: &[String]) -> Option<String> {
    let fields = |text: &str| {
        let mut lines = text.splitn(3, '\n');
        (
            lines.next().unwrap_or("").to_string(),
            lines.next().unwrap_or("").to_string(),
            lines.next().unwrap_or("").to_string(),
        )
    };
    let parsed: Vec<_> = setups.iter().map(|t| fields(t)).collect();
    let unreadable: Vec<String> =
        parsed.iter().enumerate().filter(|(_, f)| f.1 == "!").map(|(r, f)| format!("rank {r}: {}", f.2)).collect();
    if !unreadable.is_empty() {
        return Some(format!("users' algorithms cannot be read: {}", unreadable.join("; ")));
    }
    // Ranks grouped by what they run, in the order of each group's first rank.
    let mut groups: Vec<((String, String), Vec<usize>, String)> = Vec::new();
    for (rank, (transport, digest, summary)) in parsed.into_iter().enumerate() {
        match groups.iter_mut().find(|g| g.0 == (transport.clone(), digest.clone())) {
            Some(group) => group.1.push(rank),
            None => groups.push(((transport, digest), vec![rank], summary)),
        }
    }
    if groups.len() < 2 {
        return None;
    }
    let described: Vec<String> = groups
        .iter()
        .map(|((transport, _), ranks, summary)| {
            let ranks = ranks.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
            let noun = if ranks.contains(',') { "ranks" } else { "rank" };
            format!("{noun} {ranks} over {transport} with {summary}")
        })
        .collect();
    Some(format!(
        "the ranks disagree on what the job runs: {}; every rank must use one transport (--transport) and the same \
         users' algorithms (--library, COLLC_ALGO_PATH, with the same files)",
        described.join("; ")
    ))
}

pub(crate) fn check_world(rank: u32, n_ranks: u32) -> Result<(), RuntimeError> {
    if n_ranks == 0 {
        return Err(RuntimeError::Config("a communicator needs at least one rank (got 0)".into()));
    }
    if rank >= n_ranks {
        return Err(RuntimeError::Config(format!("rank {rank} is outside a world of {n_ranks} ranks")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::disagreement;

    /// Ranks that run alike pass; ranks that differ in transport or in their users' algorithms are each named, and
    /// a rank whose path does not read is named with why.
    #[test]
    fn ranks_that_disagree_on_the_job_are_named() {
        let none = "shm\n0000000000000000\nno users' algorithms".to_string();
        let mine = "shm\n00000000000000ab\nallreduce/my_ring (00000000000000ab)".to_string();
        assert_eq!(disagreement(&[none.clone(), none.clone()]), None);
        let message = disagreement(&[none.clone(), none.clone(), mine.clone()]).expect("rank 2 differs");
        assert!(
            message.contains("ranks 0, 1 over shm with no users' algorithms; rank 2 over shm with allreduce/my_ring"),
            "{message}"
        );
        let cuda = none.replace("shm", "cuda");
        let message = disagreement(&[cuda, none.clone()]).expect("transports differ");
        assert!(message.contains("rank 0 over cuda") && message.contains("rank 1 over shm"), "{message}");
        let unreadable = "shm\n!\nCOLLC_ALGO_PATH does not read: x.coll:3: bad".to_string();
        let message = disagreement(&[none, unreadable]).expect("one does not read");
        assert!(message.contains("rank 1: COLLC_ALGO_PATH does not read: x.coll:3: bad"), "{message}");
    }
}
