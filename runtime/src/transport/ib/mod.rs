//! The ib transport: ranks on any hosts over InfiniBand or RoCE verbs (feature `ib`; issue 33), NCCL's net_ib on
//! the network proxy the tcp transport runs (`net/`).
//!
//! - `hca.rs`: which devices and ports (`COLLC_IB_HCA`, NCCL_IB_HCA's grammar).
//! - `verbs.rs`: the device, RC queue pairs (one per pair of ranks, multiplexing their links), registered memory.
//! - `carrier.rs`: `Verbs`, the carrier the proxy pumps: RDMA writes with immediate into the receiver's registered
//!   slots, credits written back into the sender's credit word, completions polled.
//! - `fabric.rs`: the fabric, queue pairs and links set up when a plan is first prepared.
//! - `soft/`: the software verbs library the tests run on where no RDMA device is.
//!
//! The ranks join through the tcp transport's rendezvous (MASTER_ADDR:MASTER_PORT and the job token), and exchange
//! what their queue pairs and links need (queue pair numbers, GIDs, slot addresses and rkeys) over it when a plan is
//! first prepared: every rank prepares the same call shapes in the same order, so the all-gathers meet.

#[cfg(feature = "ib")]
mod carrier;
pub mod hca;
#[cfg(feature = "ib")]
pub mod soft;
#[cfg(feature = "ib")]
mod verbs;

use super::{Backend, Ranks, SlotPolicy};
use crate::comm::{Communicator, Options};
use crate::error::RuntimeError;
use crate::launch::Launch;

pub(crate) static IB: Ib = Ib;

pub(crate) struct Ib;

/// What every way in says in a build without the feature.
pub(crate) const NOT_BUILT: &str =
    "this collc was built without the ib feature: build it with `cargo build --release --features ib` \
                         (it links rdma-core's libibverbs)";

impl Backend for Ib {
    fn name(&self) -> &'static str {
        "ib"
    }

    fn about(&self) -> &'static str {
        "Ranks are processes on any hosts, over InfiniBand or RoCE verbs (needs the ib feature and an RDMA device)"
    }

    fn ranks(&self) -> Ranks {
        Ranks::Processes
    }

    fn built(&self) -> Result<(), String> {
        match cfg!(feature = "ib") {
            true => Ok(()),
            false => Err(NOT_BUILT.into()),
        }
    }

    /// Every message crosses the network card, even between ranks of one host.
    fn sockets(&self) -> bool {
        true
    }

    fn on_cpu(&self) -> bool {
        false
    }

    /// NCCL's: 512 KiB chunks (NCCL_IB's `NCCL_P2P_NET_CHUNKSIZE`), 512 MiB in all.
    fn slot_policy(&self) -> SlotPolicy {
        SlotPolicy { budget: 512 << 20, min: 64 << 10, max: 512 << 10 }
    }

    /// Rank threads of a job on this host, each with its own device context, joined through a loopback rendezvous.
    fn group(&self, n_ranks: u32, options: Options) -> Result<Vec<Communicator>, RuntimeError> {
        let job = super::tcp::TcpJob::loopback(n_ranks)?;
        Communicator::rank_threads(n_ranks, &|rank| {
            process(&super::tcp::TcpJob { rank, ..job.clone() }, options.clone())
        })
    }

    fn check_launch(&self, launch: &Launch) -> Result<(), String> {
        self.built()?;
        super::tcp::TcpJob::from_launch(launch).map(drop)
    }

    fn join(&self, launch: &Launch, options: Options) -> Result<Communicator, RuntimeError> {
        let job = super::tcp::TcpJob::from_launch(launch).map_err(RuntimeError::Config)?;
        process(&job, options)
    }

    /// As tcp: a loopback rendezvous and a fresh token (what the user set wins).
    fn spawn_env(&self) -> Result<Vec<(&'static str, String)>, String> {
        super::tcp::TCP.spawn_env()
    }
}

/// Rank `job.rank` of an ib job; returns once every rank has joined.
fn process(job: &super::tcp::TcpJob, options: Options) -> Result<Communicator, RuntimeError> {
    crate::comm::check_world(job.rank, job.n_ranks)?;
    #[cfg(feature = "ib")]
    {
        fabric::process(job, options)
    }
    #[cfg(not(feature = "ib"))]
    {
        let _ = options;
        Err(RuntimeError::Config(NOT_BUILT.into()))
    }
}

#[cfg(feature = "ib")]
mod fabric;
#[cfg(all(feature = "ib", feature = "cuda"))]
pub(crate) use fabric::IbLinks;
