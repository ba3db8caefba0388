//! The ib transport's fabric: a rank's device, its proxy (`Verbs`), and the queue pairs and links set up when a plan
//! is first prepared, by all-gathers over the rendezvous (`IbLinks::connect`); for host ranks (`IbNet`) and for
//! device ranks' connections to other hosts (`cuda/remote.rs`).

use super::carrier::{LinkMemory, Remote, RingKey, Setups, Verbs};
use super::verbs::{Choice, Device, Endpoint, Qp};
use crate::comm::{Communicator, Options};
use crate::error::RuntimeError;
use crate::exec::{self, Executor, Plan};
use crate::log::{self, Subsys};
use crate::transport::net::link::RingLink;
use crate::transport::net::proxy::{Mode, Proxy};
use crate::transport::net::ring::Ring;
use crate::transport::tcp::{job_hash, Rendezvous, TcpJob};
use crate::transport::{gather_entries, Fabric, Gather, Transport};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Rank `job.rank` of an ib job: the rendezvous, then the device (`COLLC_IB_HCA`); returns once every rank has
/// joined.
pub(super) fn process(job: &TcpJob, options: Options) -> Result<Communicator, RuntimeError> {
    let (rank, n_ranks) = (job.rank, job.n_ranks);
    crate::recorder::catch_dump_requests();
    let hash = job_hash(&job.job);
    let rendezvous = Arc::new(Rendezvous::join(&job.rendezvous, rank, n_ranks, hash, &job.token, options.timeout)?);
    let mode = Mode::from_env(n_ranks.min(local_ranks()).max(1))
        .map_err(|e| RuntimeError::Config(format!("rank {rank}: {e}")))?;
    let links = IbLinks::open(rank, n_ranks, hash, mode)?;
    Communicator::process(Arc::new(IbNet { links }), rendezvous, (rank, n_ranks), &job.job, options)
}

/// The ranks on this host, as the launcher says (every one when it does not).
fn local_ranks() -> u32 {
    ["LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"]
        .iter()
        .find_map(|v| std::env::var(v).ok().and_then(|t| t.trim().parse().ok()))
        .unwrap_or(u32::MAX)
}

fn env_u8(name: &str, default: u8, most: u8) -> Result<u8, String> {
    match std::env::var(name) {
        Ok(text) => text
            .trim()
            .parse::<u8>()
            .ok()
            .filter(|&v| v <= most)
            .ok_or(format!("{name}=`{text}` is not a number from 0 to {most}")),
        Err(_) => Ok(default),
    }
}

struct State {
    rings: HashMap<RingKey, Arc<Ring>>,
    /// One queue pair a peer: the number of each peer's, once connected.
    peer_qpn: Vec<Option<u32>>,
    /// The number the next receiving link gets (a sender's immediate names it).
    next_index: u32,
}

/// A rank's verbs: its device, its network proxy (`Verbs`), and the queue pairs and rings set up so far. The host
/// ranks' fabric (`IbNet`) and device ranks reaching other hosts (`cuda/remote.rs`) both set up their rings here.
pub(crate) struct IbLinks {
    rank: u32,
    pub device: Arc<Device>,
    proxy: Proxy<Verbs>,
    setups: Setups,
    state: Mutex<State>,
    timeout: u8,
    retry_cnt: u8,
    /// A queue pair per link (`COLLC_IB_QPS=link`), else one per peer that its links share.
    per_link: bool,
}

/// One entry of the all-gather: a queue pair for a peer, or one end of a link's lane.
const QP_ENTRY: u8 = 1;
const LINK_ENTRY: u8 = 2;
const ENTRY_BYTES: usize = 1 + 4 + 4 + 1 + 4 + 8 + 4 + 8 + 4 + 4 + 2 + 4;

impl IbLinks {
    /// Rank `rank`'s device (`COLLC_IB_HCA`) and its proxy, moving data as `mode` says.
    pub fn open(rank: u32, n_ranks: u32, job: u64, mode: Mode) -> Result<IbLinks, RuntimeError> {
        let config = |e: String| RuntimeError::Config(format!("rank {rank}: {e}"));
        let choice = Choice::from_env().map_err(config)?;
        let device = Arc::new(Device::open(&choice).map_err(config)?);
        let link = match device.ethernet {
            true => format!("RoCE, GID index {}", device.gid_index),
            false => format!("InfiniBand, LID {}", device.lid),
        };
        log::info(Subsys::Init, format_args!("rank {rank}: NET/IB {} ({link})", device.port));
        let timeout = env_u8("COLLC_IB_TIMEOUT", 20, 31).map_err(config)?;
        let retry_cnt = env_u8("COLLC_IB_RETRY_CNT", 7, 7).map_err(config)?;
        let setups = Setups::default();
        let verbs = Verbs::new(rank, job, device.clone(), setups.clone());
        let proxy =
            Proxy::start(verbs, mode).map_err(|e| config(format!("cannot start the network proxy thread: {e}")))?;
        let per_link = match std::env::var("COLLC_IB_QPS").as_deref().map(str::trim) {
            Err(_) | Ok("") | Ok("peer") => false,
            Ok("link") => true,
            Ok(other) => {
                return Err(config(format!(
                    "COLLC_IB_QPS=`{other}`: `peer` (the default) makes one queue pair per pair of ranks, shared by \
                     their links; `link` one per link"
                )))
            }
        };
        let state = State { rings: HashMap::new(), peer_qpn: vec![None; n_ranks as usize], next_index: 0 };
        Ok(IbLinks { rank, device, proxy, setups, state: Mutex::new(state), timeout, retry_cnt, per_link })
    }

    /// The rings of `keys` (links of this rank, with their lanes), each set up the first time: made by `make`,
    /// registered, and joined to its other end with what one all-gather brings (a queue pair per new peer). Every
    /// rank of the job calls this for each call shape it prepares, in the same order, so the all-gathers meet.
    pub fn connect(
        &self,
        keys: &[RingKey],
        make: &mut dyn FnMut(RingKey, u32) -> Result<Ring, RuntimeError>,
        gather: &mut Gather,
    ) -> Result<Vec<Arc<Ring>>, RuntimeError> {
        let rank = self.rank;
        let config = |e: String| RuntimeError::Config(format!("rank {rank}: {e}"));
        let mut state = self.state.lock().map_err(|_| RuntimeError::Poisoned)?;
        // New queue pairs (a peer this rank has none with yet) and new links, with what their peers need.
        let mut entries: Vec<[u8; ENTRY_BYTES]> = Vec::new();
        let mut new_qps: Vec<(u32, Qp)> = Vec::new();
        let mut new_links: Vec<(RingKey, Arc<Ring>, LinkMemory, u32, u32, Option<Qp>)> = Vec::new();
        for &key in keys {
            let end = key.0;
            let peer = if end.from == rank { end.to } else { end.from };
            let peers_qp = state.peer_qpn[peer as usize].is_some() || new_qps.iter().any(|(p, _)| *p == peer);
            if !self.per_link && !peers_qp {
                let qp = self.device.queue_pair().map_err(config)?;
                entries.push(entry(QP_ENTRY, peer, qp.number(), 0, 0, 0, 0, 0, 0));
                new_qps.push((peer, qp));
            }
            if !state.rings.contains_key(&key) && !new_links.iter().any(|(k, ..)| *k == key) {
                let ring = Arc::new(make(key, peer)?);
                let receiving = end.to == rank;
                let memory = LinkMemory::new(&self.device, &ring, receiving).map_err(config)?;
                let index = if receiving {
                    state.next_index += 1;
                    state.next_index
                } else {
                    0
                };
                // Its own queue pair, or its peer's (the carrier finds it by its number).
                let (qpn, qp) = match self.per_link {
                    true => {
                        let qp = self.device.queue_pair().map_err(config)?;
                        (qp.number(), Some(qp))
                    }
                    false => {
                        let made = new_qps.iter().find(|(p, _)| *p == peer).map(|(_, qp)| qp.number());
                        (state.peer_qpn[peer as usize].or(made).expect("a peer's queue pair comes first"), None)
                    }
                };
                entries.push(link_entry(key, &memory, index, qpn));
                new_links.push((key, ring, memory, index, qpn, qp));
            }
        }
        let mut head = self.device.gid.to_vec();
        head.extend_from_slice(&self.device.lid.to_le_bytes());
        let theirs = gather_entries(gather, &head, &entries)?;
        // A peer's queue pair numbered `qpn`, as this rank's queue pairs connect to it (its GID and LID are in the
        // peer's head).
        let endpoint = |peer: u32, qpn: u32| -> Result<Endpoint, RuntimeError> {
            let head = &theirs[peer as usize].0;
            let gid: [u8; 16] = head
                .get(..16)
                .and_then(|g| g.try_into().ok())
                .ok_or_else(|| config(format!("rank {peer}'s GID is missing")))?;
            let lid = head.get(16..18).map_or(0, |l| u16::from_le_bytes([l[0], l[1]]));
            Ok(Endpoint { qpn, gid, lid })
        };
        let connect = |peer: u32, qp: &Qp, qpn: u32| -> Result<(), RuntimeError> {
            qp.connect(&endpoint(peer, qpn)?, self.timeout, self.retry_cnt)
                .map_err(|e| config(format!("connecting to rank {peer}: {e}")))
        };
        // Connect the new queue pairs: each peer published the number of its queue pair for this rank.
        for (peer, qp) in new_qps {
            let qpn = theirs[peer as usize]
                .1
                .iter()
                .find(|e| e[0] == QP_ENTRY && u32_at(&e[..], 1) == rank)
                .map(|e| u32_at(e, 5))
                .ok_or_else(|| config(format!("rank {peer} made no queue pair for this rank")))?;
            connect(peer, &qp, qpn)?;
            state.peer_qpn[peer as usize] = Some(qp.number());
            log::info(
                Subsys::Init,
                format_args!("rank {rank}: connected to rank {peer} via NET/IB/{}", self.device.port),
            );
            self.proxy.shared.add_peer(peer, qp);
        }
        // The new links: the other end's registration (and queue pair), from the peer's entry for the same link and
        // lane.
        for (key, ring, memory, index, qpn, qp) in new_links {
            let (end, peer) = (key.0, ring.peer);
            let other =
                theirs[peer as usize].1.iter().find(|e| e[0] == LINK_ENTRY && same_link(&e[..], key)).ok_or_else(
                    || {
                        config(format!(
                            "rank {peer} did not open the link {} -> {} channel {} lane {}",
                            end.from, end.to, end.channel, key.1
                        ))
                    },
                )?;
            if let Some(qp) = qp {
                connect(peer, &qp, u32_at(other, 44))?;
                let how =
                    format!("a queue pair for channel {} lane {}, {} B slots", end.channel, key.1, end.slot_bytes);
                log::info(
                    Subsys::Init,
                    format_args!("rank {rank}: connected to rank {peer} via NET/IB/{} ({how})", self.device.port),
                );
                self.proxy.shared.add_peer(peer, qp);
            }
            let remote = Remote {
                slots: u64_at(other, 14),
                slots_rkey: u32_at(other, 22),
                words: u64_at(other, 26),
                words_rkey: u32_at(other, 34),
                index: u32_at(other, 38),
            };
            self.setups.lock().unwrap_or_else(|p| p.into_inner()).insert(key, (memory, remote, index, qpn));
            self.proxy.shared.add_ring(ring.clone());
            state.rings.insert(key, ring);
        }
        Ok(keys.iter().map(|key| state.rings[key].clone()).collect())
    }

    /// Waits until the proxy carries every ring handed to it (before a plan's first call).
    pub fn sync(&self) -> Result<(), RuntimeError> {
        self.proxy.shared.sync().map_err(|(peer, how)| RuntimeError::PeerFailed {
            rank: self.rank,
            what: "preparing a call".into(),
            at: "its links".into(),
            peer,
            how,
        })
    }

    /// A fault the proxy found (the peer, and what happened).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn fault(&self) -> Option<(u32, String)> {
        self.proxy.shared.fault()
    }
}

/// The ib transport's fabric for host ranks: each link one ring, carried by the rank's proxy.
pub(super) struct IbNet {
    links: IbLinks,
}

impl Fabric for IbNet {
    fn transport(&self) -> Transport {
        Transport::of(&super::IB)
    }

    fn remove_all(&self) {}

    fn prepare(&self, _plan: Plan) -> Result<Box<dyn Executor>, RuntimeError> {
        Err(RuntimeError::Config("the ib transport's ranks prepare together (prepare_collective)".into()))
    }

    fn prepare_collective(&self, plan: Plan, gather: &mut Gather) -> Result<Box<dyn Executor>, RuntimeError> {
        let keys: Vec<RingKey> = plan.links.iter().map(|&end| (end, 0)).collect();
        let rings = self.links.connect(&keys, &mut |(end, _), peer| Ok(Ring::new(end, peer, 0)), gather)?;
        let shared = &self.links.proxy.shared;
        let links: Vec<RingLink<Verbs>> = rings.into_iter().map(|ring| RingLink::new(ring, shared.clone())).collect();
        self.links.sync()?;
        Ok(exec::executor(plan, links))
    }
}

#[allow(clippy::too_many_arguments)]
fn entry(
    kind: u8,
    a: u32,
    b: u32,
    channel: u8,
    slot_bytes: u32,
    x: u64,
    xk: u32,
    y: u64,
    yk: u32,
) -> [u8; ENTRY_BYTES] {
    let mut e = [0u8; ENTRY_BYTES];
    e[0] = kind;
    e[1..5].copy_from_slice(&a.to_le_bytes());
    e[5..9].copy_from_slice(&b.to_le_bytes());
    e[9] = channel;
    e[10..14].copy_from_slice(&slot_bytes.to_le_bytes());
    e[14..22].copy_from_slice(&x.to_le_bytes());
    e[22..26].copy_from_slice(&xk.to_le_bytes());
    e[26..34].copy_from_slice(&y.to_le_bytes());
    e[34..38].copy_from_slice(&yk.to_le_bytes());
    e
}

/// A link's end as its peer needs it: its slots and words (address, rkey), its number, its lane and its queue pair.
fn link_entry((end, lane): RingKey, memory: &LinkMemory, index: u32, qpn: u32) -> [u8; ENTRY_BYTES] {
    let (slots, words) = (&memory.slots, &memory.words);
    let mut e = entry(
        LINK_ENTRY,
        end.from,
        end.to,
        end.channel,
        end.slot_bytes as u32,
        slots.addr(),
        slots.rkey(),
        words.addr(),
        words.rkey(),
    );
    e[38..42].copy_from_slice(&index.to_le_bytes());
    e[42..44].copy_from_slice(&lane.to_le_bytes());
    e[44..48].copy_from_slice(&qpn.to_le_bytes());
    e
}

fn same_link(e: &[u8], (end, lane): RingKey) -> bool {
    u16::from_le_bytes([e[42], e[43]]) == lane
        && u32_at(e, 1) == end.from
        && u32_at(e, 5) == end.to
        && e[9] == end.channel
        && u32_at(e, 10) as usize == end.slot_bytes
}

fn u32_at(e: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(e[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(e: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(e[at..at + 8].try_into().expect("8 bytes"))
}
