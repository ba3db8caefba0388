//! The `cuda` transport across hosts (NCCL's network transport with host staging): rank processes join through the
//! tcp rendezvous (MASTER_ADDR:MASTER_PORT and the job's token, as the tcp transport), ranks on one host keep CUDA
//! IPC between them (`ipc.rs`), and a connection to a rank on another host is carried by this process's network
//! proxy thread: both ends' connection records live in host-mapped memory, the device interpreter posts into and
//! reads from them as from any record, and the proxy moves the messages between them and the sockets
//! (`net/record.rs`). GPUDirect (the NIC reading device memory) comes with InfiniBand.

use crate::comm::{Communicator, Options};
use crate::error::RuntimeError;
use crate::exec::cuda::{Gpu, Pinned};
use crate::exec::encode::{self, conn};
use crate::exec::Plan;
use crate::launch::Launch;
use crate::link::LinkEnd;
use crate::transport::net::record::{Lengths, Record};
use crate::transport::tcp::{self, Net};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A process's way to ranks on other hosts: its tcp fabric (sockets, proxy) and the device addresses of the
/// records it carries.
pub(crate) struct Remote {
    pub net: Arc<Net>,
    /// By link and lane: the record's device address (the proxy's ring keeps its memory).
    records: Mutex<HashMap<(LinkEnd, u16), u64>>,
}

impl Remote {
    /// Whether `peer` runs on another host.
    pub fn is_remote(&self, peer: u32) -> bool {
        !self.net.same_host(peer)
    }

    /// The device address of the record of lane `lane` (of `lanes`) of `plan`'s link `link`, to or from a rank on
    /// another host: host-mapped memory the proxy carries, made the first time; a sending end learns the lengths of
    /// this plan's messages.
    pub fn record(&self, gpu: &Arc<Gpu>, plan: &Plan, link: u16, lane: u32, lanes: u32) -> Result<u64, RuntimeError> {
        let end = plan.links[link as usize];
        let key = (end, lane as u16);
        let config = |e: String| {
            RuntimeError::Config(format!(
                "rank {}: cannot map host memory for its connection to rank {} on another host (channel {}, {} \
                 bytes a slot): {e}",
                plan.rank,
                if end.from == plan.rank { end.to } else { end.from },
                end.channel,
                end.slot_bytes
            ))
        };
        let mut records = self.records.lock().map_err(|_| RuntimeError::Poisoned)?;
        let mut address = records.get(&key).copied();
        let ring = self.net.carry_record(end, key.1, || {
            let memory = Pinned::new(gpu, encode::record_bytes(end.slot_bytes).div_ceil(8)).map_err(config)?;
            memory.set(conn::SLOT_BYTES, end.slot_bytes as u64);
            address = Some(memory.dev);
            let words = memory.host;
            Ok(Record::new(words, Box::new(memory)))
        })?;
        let address = address.expect("a carried record has its address");
        records.insert(key, address);
        if end.from == plan.rank {
            let record = ring.record.as_ref().expect("a device ring has its record");
            record.learn(plan.fingerprint, Lengths::new(plan, link, lane, lanes));
        }
        Ok(address)
    }
}

/// Rank `launch.rank` of a job whose ranks are on several hosts, on GPU `i mod G` of its host, where it is the
/// host's `i`-th rank.
pub(crate) fn process(launch: &Launch, gpus: Option<u32>, options: Options) -> Result<Communicator, RuntimeError> {
    let (rank, n_ranks) = (launch.rank, launch.world_size);
    crate::comm::check_world(rank, n_ranks)?;
    crate::recorder::catch_dump_requests();
    let (net, rendezvous) = tcp::join_devices(launch, options.timeout).inspect_err(|error| {
        if matches!(error, RuntimeError::PeerFailed { .. } | RuntimeError::Timeout { .. }) {
            let recorder = crate::recorder::Recorder::new(rank, n_ranks, &launch.job);
            let _ = recorder.dump(crate::exec::dump_reason(error), None);
        }
    })?;
    // This rank's place among its host's ranks chooses its GPU; the most ranks on any host, the lanes (every rank
    // computes the same).
    let index = (0..rank).filter(|&r| net.same_host(r)).count() as u32;
    let most = (0..n_ranks).map(|r| (0..n_ranks).filter(|&s| net.same_host_as(r, s)).count()).max().unwrap_or(1);
    let remote = Remote { net: net.clone(), records: Mutex::new(HashMap::new()) };
    let fabric = super::ipc::IpcFabric::across_hosts(index, n_ranks, most as u32, gpus, remote)
        .map_err(|e| RuntimeError::Config(format!("rank {rank}: {e}")))?;
    // Device ranks have no host executor to look at the proxy: the health checks report its faults.
    let watched = Arc::downgrade(&net);
    rendezvous.watch(Box::new(move || watched.upgrade().and_then(|net| net.fault())));
    Communicator::process(Arc::new(fabric), rendezvous, (rank, n_ranks), &launch.job, options)
}
