//! The `cuda` transport across hosts (NCCL's network transports): rank processes join through the tcp rendezvous
//! (MASTER_ADDR:MASTER_PORT and the job's token, as the tcp transport), ranks on one host keep CUDA IPC between
//! them (`ipc.rs`), and a connection to a rank on another host is carried by this process's network proxy thread:
//! both ends' connection records have their words in host-mapped memory, the device interpreter posts into and
//! reads from them as from any record, and the proxy moves the messages between them and the network
//! (`net/record.rs`).
//!
//! The network (`COLLC_NET`, NCCL_NET's role): `IB` (verbs, the ib transport's `IbLinks`; feature `ib`) or `Socket`
//! (the tcp transport's `Net`); by default IB where this build has it and an RDMA device opens, else Socket. Over
//! IB with GPUDirect RDMA (`COLLC_IB_GDR`: `auto`, `1`, `0`), a record's slots are device memory the NIC registers
//! from its dma-buf and reads and writes itself; else, and always over sockets, they follow the words in host
//! memory (staged), as NCCL's network transport without GPUDirect.

use crate::comm::{Communicator, Options};
use crate::error::RuntimeError;
use crate::exec::cuda::{Gpu, Pinned};
use crate::exec::encode::{self, conn};
use crate::exec::Plan;
use crate::launch::Launch;
use crate::link::LinkEnd;
#[cfg(feature = "ib")]
use crate::log::{self, Subsys};
use crate::transport::net::record::{Lengths, Record};
use crate::transport::net::ring::Ring;
use crate::transport::tcp::{self, Net, Rendezvous};
use crate::transport::Gather;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// How this process reaches device ranks on other hosts.
enum Network {
    /// Sockets, through the tcp transport's proxy (NCCL's NET/Socket).
    Socket(Arc<Net>),
    /// Verbs, through the ib transport's proxy (NCCL's NET/IB), with GPUDirect RDMA where `gdr`.
    #[cfg(feature = "ib")]
    Ib { links: Arc<crate::transport::ib::IbLinks>, gdr: bool },
}

/// A process's way to ranks on other hosts: its network, which ranks share its host, and the device addresses of
/// the records it carries.
pub(crate) struct Remote {
    network: Network,
    rank: u32,
    /// Each rank's host key (`tcp::host_key`).
    hosts: Vec<String>,
    /// By link and lane: the record's device address (the proxy's ring keeps its memory).
    records: Mutex<HashMap<(LinkEnd, u16), u64>>,
}

/// One of a plan's connections as the device image lists them: (sender, receiver, channel, slot bytes, lane).
type Conn = (u32, u32, u8, usize, u32);

impl Remote {
    /// Whether `peer` runs on another host.
    pub fn is_remote(&self, peer: u32) -> bool {
        self.hosts.get(peer as usize) != self.hosts.get(self.rank as usize)
    }

    /// The device addresses of the records of `plan`'s connections to and from ranks on other hosts (of `conns`,
    /// `lanes` lanes), each made the first time and carried by the proxy from then on; a sending end learns the
    /// lengths of this plan's messages. Returns once the proxy carries them all. Over IB every rank calls this for
    /// each call shape it prepares, in the same order (its queue pairs and registrations are all-gathered).
    pub fn prepare(
        &self,
        gpu: &Arc<Gpu>,
        plan: &Plan,
        conns: &[Conn],
        lanes: u32,
        gather: &mut Gather,
    ) -> Result<HashMap<(LinkEnd, u16), u64>, RuntimeError> {
        let keys: Vec<(LinkEnd, u16)> = conns
            .iter()
            .filter(|&&(from, to, ..)| self.is_remote(if to == plan.rank { from } else { to }))
            .map(|&(from, to, channel, slot_bytes, lane)| (LinkEnd { from, to, channel, slot_bytes }, lane as u16))
            .collect();
        let mut records = self.records.lock().map_err(|_| RuntimeError::Poisoned)?;
        let rings: Vec<Arc<Ring>> = match &self.network {
            Network::Socket(net) => {
                let rings = keys
                    .iter()
                    .map(|&(end, lane)| {
                        net.carry_record(end, lane, || {
                            let (record, address) = staged(gpu, plan.rank, end)?;
                            records.insert((end, lane), address);
                            Ok(record)
                        })
                    })
                    .collect::<Result<_, _>>()?;
                net.sync()?;
                rings
            }
            #[cfg(feature = "ib")]
            Network::Ib { links, gdr } => {
                let mut make = |(end, lane): (LinkEnd, u16), peer: u32| {
                    let (record, address) = match gdr {
                        true => direct(gpu, plan.rank, end)?,
                        false => staged(gpu, plan.rank, end)?,
                    };
                    records.insert((end, lane), address);
                    Ok(Ring::over_record(end, lane, peer, 0, record))
                };
                let rings = links.connect(&keys, &mut make, gather)?;
                links.sync()?;
                rings
            }
        };
        #[cfg(not(feature = "ib"))]
        let _ = gather;
        for (&(end, lane), ring) in keys.iter().zip(&rings) {
            if end.from == plan.rank {
                let record = ring.record.as_ref().expect("a device ring has its record");
                let link = plan.links.iter().position(|l| *l == end).expect("a connection is one of the plan's");
                record.learn(plan.fingerprint, Lengths::new(plan, link as u16, lane as u32, lanes));
            }
        }
        Ok(keys.iter().map(|key| (*key, records[key])).collect())
    }

    /// A fault the network proxy found (the peer, and what happened).
    fn fault(&self) -> Option<(u32, String)> {
        match &self.network {
            Network::Socket(net) => net.fault(),
            #[cfg(feature = "ib")]
            Network::Ib { links, .. } => links.fault(),
        }
    }
}

/// What a record of connection `end` failing to be made says.
fn cannot_map(rank: u32, end: LinkEnd, what: &str, e: String) -> RuntimeError {
    RuntimeError::Config(format!(
        "rank {rank}: cannot map {what} for its connection to rank {} on another host (channel {}, {} bytes a \
         slot): {e}",
        if end.from == rank { end.to } else { end.from },
        end.channel,
        end.slot_bytes
    ))
}

/// A record and its slots in host-mapped memory (staged: the proxy's network copies from and into host memory),
/// and its device address.
fn staged(gpu: &Arc<Gpu>, rank: u32, end: LinkEnd) -> Result<(Record, u64), RuntimeError> {
    let memory = Pinned::new(gpu, encode::record_bytes(end.slot_bytes).div_ceil(8))
        .map_err(|e| cannot_map(rank, end, "host memory", e))?;
    memory.set(conn::SLOT_BYTES, end.slot_bytes as u64);
    let (words, address) = (memory.host, memory.dev);
    Ok((Record::new(words, Box::new(memory)), address))
}

/// A record whose words are in host-mapped memory and whose slots are device memory the NIC reaches through their
/// dma-buf (GPUDirect RDMA), and its device address.
#[cfg(feature = "ib")]
fn direct(gpu: &Arc<Gpu>, rank: u32, end: LinkEnd) -> Result<(Record, u64), RuntimeError> {
    use crate::exec::cuda::DeviceAlloc;
    use crate::transport::net::record::DeviceSlots;
    let words = Pinned::new(gpu, encode::RECORD_BYTES / 8).map_err(|e| cannot_map(rank, end, "host memory", e))?;
    words.set(conn::SLOT_BYTES, end.slot_bytes as u64);
    let bytes = (crate::link::SLOTS as usize * end.slot_bytes).next_multiple_of(4096);
    let slots = DeviceAlloc::zeroed(gpu, bytes).map_err(|e| cannot_map(rank, end, "device memory", e))?;
    let dma_buf = slots.dma_buf().map_err(|e| cannot_map(rank, end, "device memory", e))?;
    let flushed = gpu.clone();
    let warned = std::sync::Once::new();
    let flush = Box::new(move || {
        if let Err(e) = flushed.flush_rdma_writes() {
            warned.call_once(|| log::warn(Subsys::Net, format_args!("rank {rank}: {e}")));
        }
    });
    let (host, address, at) = (words.host, words.dev, slots.ptr);
    let device = DeviceSlots { dma_buf, offset: 0, flush };
    Ok((Record::with_device_slots(host, at, device, Box::new((words, slots))), address))
}

/// Which network reaches the other hosts (`COLLC_NET`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Choice {
    Ib,
    Socket,
    /// IB where it opens, else Socket.
    Auto,
}

fn net_choice() -> Result<Choice, String> {
    match std::env::var("COLLC_NET").ok().as_deref().map(str::trim) {
        None | Some("") => Ok(Choice::Auto),
        Some(v) if v.eq_ignore_ascii_case("ib") => Ok(Choice::Ib),
        Some(v) if v.eq_ignore_ascii_case("socket") => Ok(Choice::Socket),
        Some(other) => Err(format!(
            "COLLC_NET=`{other}`: `IB` (verbs; needs the ib feature and an RDMA device) or `Socket` (TCP); unset, IB \
             where it opens, else Socket"
        )),
    }
}

/// What a rank over IB publishes before its host key, so that a rank over sockets can tell (and the other way).
const IB_MARK: &str = "NET/IB";

/// Rank `launch.rank` of a job whose ranks are on several hosts, on GPU `i mod G` of its host, where it is the
/// host's `i`-th rank.
pub(crate) fn process(launch: &Launch, gpus: Option<u32>, options: Options) -> Result<Communicator, RuntimeError> {
    let (rank, n_ranks) = (launch.rank, launch.world_size);
    crate::comm::check_world(rank, n_ranks)?;
    crate::recorder::catch_dump_requests();
    let config = |e: String| RuntimeError::Config(format!("rank {rank}: {e}"));
    let choice = net_choice().map_err(config)?;
    let joined = join(launch, choice, gpus, options.timeout).inspect_err(|error| {
        if matches!(error, RuntimeError::PeerFailed { .. } | RuntimeError::Timeout { .. }) {
            let recorder = crate::recorder::Recorder::new(rank, n_ranks, &launch.job);
            let _ = recorder.dump(crate::exec::dump_reason(error), None);
        }
    });
    let (remote, rendezvous) = joined?;
    // This rank's place among its host's ranks chooses its GPU; the most ranks on any host, the lanes (every rank
    // computes the same).
    let hosts = &remote.hosts;
    let index = (0..rank as usize).filter(|&r| hosts[r] == hosts[rank as usize]).count() as u32;
    let most = hosts.iter().map(|h| hosts.iter().filter(|g| *g == h).count()).max().unwrap_or(1);
    let remote = Arc::new(remote);
    // Device ranks have no host executor to look at the proxy: the health checks report its faults.
    let watched = Arc::downgrade(&remote);
    rendezvous.watch(Box::new(move || watched.upgrade().and_then(|remote| remote.fault())));
    let fabric = super::ipc::IpcFabric::across_hosts(index, n_ranks, most as u32, gpus, remote).map_err(config)?;
    Communicator::process(Arc::new(fabric), rendezvous, (rank, n_ranks), &launch.job, options)
}

/// Joins the job over the chosen network.
fn join(
    launch: &Launch,
    choice: Choice,
    gpus: Option<u32>,
    timeout: std::time::Duration,
) -> Result<(Remote, Arc<Rendezvous>), RuntimeError> {
    let rank = launch.rank;
    let config = |e: String| RuntimeError::Config(format!("rank {rank}: {e}"));
    let records = Mutex::new(HashMap::new());
    // IB where this rank's device opens (where it does not, Socket unless COLLC_NET=IB); then whatever fails is an
    // error.
    #[cfg(feature = "ib")]
    if choice != Choice::Socket {
        let job = tcp::TcpJob::from_launch(launch).map_err(RuntimeError::Config)?;
        let mode = crate::transport::net::proxy::Mode::Thread;
        match crate::transport::ib::IbLinks::open(rank, launch.world_size, tcp::job_hash(&job.job), mode) {
            Ok(links) => return join_ib(launch, &job, links, gpus, timeout),
            Err(e) if choice == Choice::Ib => return Err(e),
            Err(e) => log::info(Subsys::Init, format_args!("rank {rank}: NET/IB not used ({e}); using NET/Socket")),
        }
    }
    #[cfg(not(feature = "ib"))]
    let _ = gpus;
    #[cfg(not(feature = "ib"))]
    if choice == Choice::Ib {
        return Err(config(format!("COLLC_NET=IB, but {}", crate::transport::ib::NOT_BUILT)));
    }
    let (net, rendezvous) = tcp::join_devices(launch, timeout)?;
    let hosts = (0..launch.world_size).map(|r| net.host(r).to_string()).collect::<Vec<_>>();
    if let Some(r) = hosts.iter().position(|h| h == IB_MARK) {
        return Err(config(format!(
            "rank {r} reaches the other hosts over NET/IB and this rank over NET/Socket: set COLLC_NET to the same \
             value on every rank"
        )));
    }
    Ok((Remote { network: Network::Socket(net), rank, hosts, records }, rendezvous))
}

/// Joins over verbs with this rank's device open: the rendezvous and every rank's host key; GPUDirect RDMA where
/// the GPU exports a dma-buf the device registers (`COLLC_IB_GDR`), else staged with one WARN saying why.
#[cfg(feature = "ib")]
fn join_ib(
    launch: &Launch,
    job: &tcp::TcpJob,
    links: crate::transport::ib::IbLinks,
    gpus: Option<u32>,
    timeout: std::time::Duration,
) -> Result<(Remote, Arc<Rendezvous>), RuntimeError> {
    use crate::link::Bootstrap;
    let (rank, n_ranks) = (launch.rank, launch.world_size);
    let config = |e: String| RuntimeError::Config(format!("rank {rank}: {e}"));
    let hash = tcp::job_hash(&job.job);
    let rendezvous = Arc::new(Rendezvous::join(&job.rendezvous, rank, n_ranks, hash, &job.token, timeout)?);
    let blobs = rendezvous.all_gather(rank, format!("{IB_MARK} {}", tcp::host_key()).as_bytes(), 0, timeout)?;
    let mut hosts = Vec::with_capacity(blobs.len());
    for (r, blob) in blobs.iter().enumerate() {
        let text = String::from_utf8_lossy(blob);
        match text.split_once(' ') {
            Some((IB_MARK, host)) => hosts.push(host.to_string()),
            _ => {
                return Err(config(format!(
                    "rank {r} reaches the other hosts over NET/Socket and this rank over NET/IB: set COLLC_NET to \
                     the same value on every rank"
                )))
            }
        }
    }
    let index = (0..rank as usize).filter(|&r| hosts[r] == hosts[rank as usize]).count() as u32;
    let gdr = gdr_choice(&links, index, gpus).map_err(config)?;
    let network = Network::Ib { links: Arc::new(links), gdr };
    Ok((Remote { network, rank, hosts, records: Mutex::new(HashMap::new()) }, rendezvous))
}

/// Whether records' slots go in device memory (GPUDirect RDMA), as `COLLC_IB_GDR` says (`auto`, `1`, `0`): tried
/// once, as NCCL does, by registering a page of this rank's GPU through its dma-buf.
#[cfg(feature = "ib")]
fn gdr_choice(links: &crate::transport::ib::IbLinks, index: u32, gpus: Option<u32>) -> Result<bool, String> {
    let value = std::env::var("COLLC_IB_GDR").unwrap_or_default();
    let required = match value.trim() {
        "0" => {
            log::info(Subsys::Init, format_args!("NET/IB: GPU Direct RDMA disabled (COLLC_IB_GDR=0); staging"));
            return Ok(false);
        }
        "1" => true,
        "" | "auto" => false,
        other => {
            return Err(format!(
                "COLLC_IB_GDR=`{other}`: 1 requires GPUDirect RDMA, 0 stages through host memory, auto (the \
                 default) uses it where the GPU and the NIC can"
            ))
        }
    };
    let tried = (|| {
        let (gpu, _) = super::ipc::open_gpu(index, gpus)?;
        let page = crate::exec::cuda::DeviceAlloc::zeroed(&gpu, 4096)?;
        let fd = page.dma_buf()?;
        use std::os::fd::AsFd;
        links.device.register_dma_buf(fd.as_fd(), 0, page.ptr, 4096, true).map(drop)
    })();
    match tried {
        Ok(()) => {
            log::info(Subsys::Init, format_args!("NET/IB: GPU Direct RDMA enabled (dma-buf)"));
            Ok(true)
        }
        Err(e) if required => Err(format!("COLLC_IB_GDR=1, but GPUDirect RDMA cannot be used: {e}")),
        Err(e) => {
            log::warn(Subsys::Net, format_args!("NET/IB: GPU Direct RDMA disabled ({e}); staging through host memory"));
            Ok(false)
        }
    }
}
