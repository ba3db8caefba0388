//! The `cuda` transport: ranks on GPUs, each plan run by the device interpreter (`exec/device/`; feature `cuda`).
//! Rank threads of one process reach each other's connection records through peer access (`fabric.rs`); rank
//! processes on one host map them through CUDA IPC (`ipc.rs`), their bootstrap the shm one; rank processes on
//! several hosts join through the tcp rendezvous and reach the other hosts' ranks through the network proxy
//! (`remote.rs`). Without the feature the backend is listed and every way in fails with a message saying how to
//! build it.

#[cfg(feature = "cuda")]
mod fabric;
#[cfg(feature = "cuda")]
mod ipc;
#[cfg(feature = "cuda")]
mod remote;

use super::{Backend, Ranks, SlotPolicy};
use crate::comm::{Communicator, Options};
use crate::error::RuntimeError;
use crate::launch::Launch;

pub(crate) static CUDA: Cuda = Cuda;

pub(crate) struct Cuda;

impl Backend for Cuda {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn about(&self) -> &'static str {
        "Ranks are threads on GPUs (device buffers; needs the cuda feature and a CUDA driver)"
    }

    fn ranks(&self) -> Ranks {
        Ranks::Either
    }

    fn built(&self) -> Result<(), String> {
        match cfg!(feature = "cuda") {
            true => Ok(()),
            false => Err(NOT_BUILT.into()),
        }
    }

    fn on_cpu(&self) -> bool {
        false
    }

    /// NCCL's Simple protocol: 4 MiB a channel, 8 steps of 512 KiB.
    fn slot_policy(&self) -> SlotPolicy {
        SlotPolicy { budget: 1 << 30, min: 256 << 10, max: 512 << 10 }
    }

    fn executor(&self, slots: u64, gpu: Option<i32>) -> String {
        let gpu = gpu.unwrap_or(0);
        format!(
            "device interpreter on GPU {gpu} (one cooperative launch per call and GPU, single copy between its ranks \
             where a send's source stays, else {slots}-slot records"
        )
    }

    fn group(&self, n_ranks: u32, options: Options) -> Result<Vec<Communicator>, RuntimeError> {
        group_on(n_ranks, gpus_from_env()?, options)
    }

    /// Ranks on one host need nothing more; on several, what the tcp transport needs (the rendezvous, the token).
    fn check_launch(&self, launch: &Launch) -> Result<(), String> {
        match launch.all_local() {
            true => Ok(()),
            false => super::tcp::TcpJob::from_launch(launch).map(drop),
        }
    }

    fn join(&self, launch: &Launch, options: Options) -> Result<Communicator, RuntimeError> {
        match launch.all_local() {
            true => process(&launch.job, launch.rank, launch.world_size, options),
            false => across_hosts(launch, options),
        }
    }

    /// The bootstrap of rank processes is the shm one.
    fn mark_failed(&self, job: &str, n_ranks: u32, rank: u32) -> Result<(), RuntimeError> {
        super::shm::SHM.mark_failed(job, n_ranks, rank)
    }

    fn remove_job(&self, job: &str) {
        super::shm::SHM.remove_job(job);
    }
}

/// What every way into the transport says in a build without the feature.
const NOT_BUILT: &str =
    "this collc was built without the cuda feature: build it with `cargo build --release --features cuda`";

#[cfg(not(feature = "cuda"))]
fn not_built() -> RuntimeError {
    RuntimeError::Config(NOT_BUILT.into())
}

/// `n_ranks` rank threads on the first `gpus` GPUs (all of them when `None`): rank r on GPU r mod G.
pub(crate) fn group_on(n_ranks: u32, gpus: Option<u32>, options: Options) -> Result<Vec<Communicator>, RuntimeError> {
    crate::comm::check_world(0, n_ranks)?;
    #[cfg(feature = "cuda")]
    {
        use super::shm::{Heap, Memory};
        use std::sync::Arc;
        let fabric = Arc::new(fabric::CudaFabric::new(n_ranks, gpus).map_err(RuntimeError::Config)?);
        Communicator::heap_group(fabric, &Memory::new(Arc::new(Heap::default())), n_ranks, options)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (options, gpus);
        Err(not_built())
    }
}

/// Rank `rank` of job `job` in its own process, on GPU `rank mod G`: device memory shared with the other processes
/// through CUDA IPC, the bootstrap in /dev/shm.
pub(crate) fn process(job: &str, rank: u32, n_ranks: u32, options: Options) -> Result<Communicator, RuntimeError> {
    crate::comm::check_world(rank, n_ranks)?;
    crate::recorder::catch_dump_requests();
    #[cfg(feature = "cuda")]
    {
        use super::shm::{Memory, Shm};
        use std::sync::Arc;
        let gpus = gpus_from_env()?;
        // The bootstrap's control block is a shared-memory segment of the job, which the last rank out removes.
        let memory = Arc::new(Memory::new(Arc::new(Shm::new(job))));
        let fabric = ipc::IpcFabric::new(rank, n_ranks, gpus, memory.clone()).map_err(RuntimeError::Config)?;
        let bootstrap = Arc::new(memory.bootstrap(n_ranks)?);
        Communicator::process(Arc::new(fabric), bootstrap, (rank, n_ranks), job, options)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (job, options);
        Err(not_built())
    }
}

/// Rank `launch.rank` of a job on several hosts: CUDA IPC with the ranks of this host, the network proxy to the
/// others, the bootstrap the tcp rendezvous.
fn across_hosts(launch: &Launch, options: Options) -> Result<Communicator, RuntimeError> {
    #[cfg(feature = "cuda")]
    {
        remote::process(launch, gpus_from_env()?, options)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (launch, options);
        Err(not_built())
    }
}

/// `COLLC_CUDA_GPUS`: how many GPUs the cuda transport spreads its ranks over (`None`: every one).
fn gpus_from_env() -> Result<Option<u32>, RuntimeError> {
    match std::env::var("COLLC_CUDA_GPUS") {
        Ok(text) => text
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|&n| n > 0)
            .map(Some)
            .ok_or_else(|| RuntimeError::Config(format!("COLLC_CUDA_GPUS=`{text}` is not a positive number"))),
        Err(_) => Ok(None),
    }
}
