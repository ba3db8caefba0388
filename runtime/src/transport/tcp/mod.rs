//! The tcp transport: ranks on any hosts that reach each other over TCP.
//!
//! - `store.rs`: the rendezvous rank 0 hosts (MASTER_ADDR:MASTER_PORT), the `Bootstrap` of this transport.
//! - `auth.rs`: the HMAC challenge-response every connection opens with (a job token).
//! - `wire.rs`: the data plane (frames, credits) between a rank's sockets and its links' rings, the `Carrier` the
//!   network proxy runs (`net/`: the proxy, the rings the executor fills and drains without a lock, the frames).
//!
//! A rank listens for its peers on the interface `COLLC_SOCKET_IFNAME` selects and tells the others its address
//! through the rendezvous; the connection between two ranks is made when a plan first needs it (the lower rank
//! connects, the higher accepts), `sockets` per pair, each authenticated.

pub mod auth;
mod store;
mod wire;

pub use auth::Token;

use super::ifname::{self, IfPattern};
use super::{Backend, Bootstrap, Fabric, Ranks, SlotPolicy, Transport};
use crate::comm::{Communicator, Options};
use crate::error::RuntimeError;
use crate::exec::{self, Executor, Plan};
use crate::launch::Launch;
use crate::log::{self, Subsys};
use crate::transport::net::link::RingLink;
use crate::transport::net::proxy;
use crate::transport::net::record;
use crate::transport::net::ring::Ring;
use auth::{Hello, Purpose, Refusal};
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
pub(crate) use store::{prebind, Rendezvous};
use wire::{Socket, Wire};

pub(crate) static TCP: Tcp = Tcp;

/// Ranks as processes on any hosts, over sockets, joined through the rendezvous rank 0 hosts.
pub(crate) struct Tcp;

impl Backend for Tcp {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn about(&self) -> &'static str {
        "Ranks are processes on any hosts, over TCP (MASTER_ADDR:MASTER_PORT rendezvous)"
    }

    fn ranks(&self) -> Ranks {
        Ranks::Processes
    }

    fn sockets(&self) -> bool {
        true
    }

    /// Each message costs system calls: 512 MiB in all, 64 KiB to 256 KiB a slot (bench/README.md).
    fn slot_policy(&self) -> SlotPolicy {
        SlotPolicy { budget: 512 << 20, min: 64 << 10, max: 256 << 10 }
    }

    /// Rank threads of a job on the loopback: its rendezvous on a free port, a fresh token.
    fn group(&self, n_ranks: u32, options: Options) -> Result<Vec<Communicator>, RuntimeError> {
        let tcp = TcpJob::loopback(n_ranks)?;
        Communicator::rank_threads(n_ranks, &|rank| process(&TcpJob { rank, ..tcp.clone() }, options.clone()))
    }

    fn check_launch(&self, launch: &Launch) -> Result<(), String> {
        TcpJob::from_launch(launch).map(drop)
    }

    fn join(&self, launch: &Launch, options: Options) -> Result<Communicator, RuntimeError> {
        let job = TcpJob::from_launch(launch).map_err(RuntimeError::Config)?;
        process(&job, options)
    }

    /// A rendezvous on the loopback at a port free now and a fresh token (what the user set wins).
    fn spawn_env(&self) -> Result<Vec<(&'static str, String)>, String> {
        let mut vars = Vec::new();
        if std::env::var_os("COLLC_RENDEZVOUS").is_none() && std::env::var_os("MASTER_PORT").is_none() {
            let port = spawn_port()?;
            vars.push(("MASTER_ADDR", "127.0.0.1".to_string()));
            vars.push(("MASTER_PORT", port.to_string()));
        }
        if Token::from_env()?.is_none() {
            vars.push(("COLLC_JOB_TOKEN", Token::generate()?));
        }
        Ok(vars)
    }
}

/// A port for the rendezvous of ranks `collc run` spawns, free now: drawn below the kernel's ephemeral range, so no
/// socket the ranks bind to port 0 meanwhile (data ports, a verbs library's listeners) takes it before rank 0 binds
/// it; else one the kernel gives.
fn spawn_port() -> Result<u16, String> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let low = range.split_whitespace().next().and_then(|t| t.parse::<u32>().ok()).unwrap_or(32768);
    const FLOOR: u32 = 20000;
    if low > FLOOR + 1000 {
        for _ in 0..64 {
            let mut bytes = [0u8; 4];
            getrandom::fill(&mut bytes).map_err(|e| format!("no randomness from the OS: {e}"))?;
            let port = (FLOOR + u32::from_le_bytes(bytes) % (low - FLOOR)) as u16;
            if TcpListener::bind(("0.0.0.0", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port for the rendezvous: {e}"))
}

/// Rank `job.rank` of a tcp job; returns once every rank has joined.
pub(crate) fn process(job: &TcpJob, options: Options) -> Result<Communicator, RuntimeError> {
    crate::comm::check_world(job.rank, job.n_ranks)?;
    crate::recorder::catch_dump_requests();
    let (net, rendezvous) = join(job, options.timeout).inspect_err(|error| {
        // Setup waits on the peers too (their addresses are all-gathered): a rank that fails there is dumped, with
        // no call yet, so the dumps of a job that never started say whom it waited for.
        if matches!(error, RuntimeError::PeerFailed { .. } | RuntimeError::Timeout { .. }) {
            let recorder = crate::recorder::Recorder::new(job.rank, job.n_ranks, &job.job);
            let _ = recorder.dump(crate::exec::dump_reason(error), None);
        }
    })?;
    Communicator::process(net, rendezvous, (job.rank, job.n_ranks), &job.job, options)
}

/// How one rank joins a tcp job.
#[derive(Clone, Debug)]
pub struct TcpJob {
    /// `host:port` of the rendezvous, which rank 0 hosts.
    pub rendezvous: String,
    pub rank: u32,
    pub n_ranks: u32,
    /// Names the job; every rank gives the same.
    pub job: String,
    pub token: Token,
    /// `COLLC_SOCKET_IFNAME`; `None`: NCCL's default.
    pub ifname: Option<IfPattern>,
    /// Connections per pair of ranks (`COLLC_NSOCKS_PERPEER`).
    pub sockets: u8,
    /// Who moves the data between the links and the sockets (`COLLC_NET_PROXY`).
    pub(crate) proxy: proxy::Mode,
}

impl TcpJob {
    /// Rank 0 of a job of `n_ranks` rank threads on the loopback: a rendezvous on a free port, a fresh token.
    pub(crate) fn loopback(n_ranks: u32) -> Result<TcpJob, RuntimeError> {
        crate::comm::check_world(0, n_ranks)?;
        let port = prebind()?;
        let token = Token::new(Token::generate().map_err(RuntimeError::Config)?).map_err(RuntimeError::Config)?;
        Ok(TcpJob {
            rendezvous: format!("127.0.0.1:{port}"),
            rank: 0,
            n_ranks,
            job: super::shm::group_job_id(),
            token,
            ifname: Some("lo".parse().map_err(RuntimeError::Config)?),
            sockets: 1,
            proxy: proxy::Mode::from_env(n_ranks).map_err(RuntimeError::Config)?,
        })
    }

    /// As `from_env`, for a launch (whose ranks on this host choose the proxy's mode), with the rendezvous and token
    /// the launch gives where it gives them.
    pub fn from_launch(launch: &Launch) -> Result<TcpJob, String> {
        let local = launch.local_world_size.unwrap_or(launch.world_size);
        match &launch.rendezvous {
            Some((at, token)) => {
                let token = Token::new(token.as_str())?;
                TcpJob::with_rendezvous(at.clone(), token, launch.rank, launch.world_size, &launch.job, local)
            }
            None => TcpJob::from_env(launch.rank, launch.world_size, &launch.job, local),
        }
    }

    /// From a launcher's environment: MASTER_ADDR/MASTER_PORT (or `COLLC_RENDEZVOUS`), the token
    /// (`COLLC_JOB_TOKEN` or `COLLC_JOB_TOKEN_FILE`), `COLLC_SOCKET_IFNAME`, `COLLC_NSOCKS_PERPEER` and
    /// `COLLC_NET_PROXY` (for `local_ranks` ranks on this host).
    pub fn from_env(rank: u32, n_ranks: u32, job: &str, local_ranks: u32) -> Result<TcpJob, String> {
        let rendezvous = rendezvous_from(|name| std::env::var(name).ok())?;
        let token = Token::from_env()?.ok_or(
            "the tcp transport needs the job's token: set COLLC_JOB_TOKEN (or COLLC_JOB_TOKEN_FILE) to the same \
             secret on every rank (`collc run` makes one when it starts the ranks itself)",
        )?;
        TcpJob::with_rendezvous(rendezvous, token, rank, n_ranks, job, local_ranks)
    }

    /// As `from_env`, with the rendezvous and the token given (a `Launch` that carries them: torch.distributed's
    /// backend shares them through its store, rank 0 taking a `free_port` and making a token).
    fn with_rendezvous(
        rendezvous: String,
        token: Token,
        rank: u32,
        n_ranks: u32,
        job: &str,
        local_ranks: u32,
    ) -> Result<TcpJob, String> {
        let port = rendezvous.rsplit_once(':').map(|(_, port)| port).unwrap_or_default();
        check_port(port, &format!("rendezvous `{rendezvous}`"))?;
        let ifname = match std::env::var("COLLC_SOCKET_IFNAME") {
            Ok(text) => Some(text.parse::<IfPattern>().map_err(|e| format!("COLLC_SOCKET_IFNAME: {e}"))?),
            Err(_) => None,
        };
        let sockets = match std::env::var("COLLC_NSOCKS_PERPEER") {
            Ok(text) => text
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|n| (1..=16).contains(n))
                .ok_or(format!("COLLC_NSOCKS_PERPEER=`{text}` is not in 1..=16"))?,
            Err(_) => 1,
        };
        let proxy = proxy::Mode::from_env(local_ranks)?;
        Ok(TcpJob { rendezvous, rank, n_ranks, job: job.to_string(), token, ifname, sockets, proxy })
    }
}

/// A free port for rank 0's rendezvous, held bound until `Communicator::tcp` serves it (so no other process takes it
/// in between).
pub fn free_port() -> Result<u16, RuntimeError> {
    store::prebind()
}

/// The rendezvous address: `COLLC_RENDEZVOUS`, else MASTER_ADDR:MASTER_PORT (torchrun's port 29500 when only the
/// address is set), else under Slurm the first host of `SLURM_JOB_NODELIST` and port 15000 + the job id's last four
/// digits (the convention of PyTorch Lightning's Slurm environment), so every rank of the job derives the same.
fn rendezvous_from(var: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    if let Some(addr) = var("COLLC_RENDEZVOUS") {
        let port = addr.rsplit_once(':').map(|(_, port)| port).unwrap_or_default();
        check_port(port, &format!("COLLC_RENDEZVOUS=`{addr}`"))?;
        return Ok(addr);
    }
    if let Some(addr) = var("MASTER_ADDR") {
        let port = var("MASTER_PORT").unwrap_or_else(|| "29500".into());
        check_port(&port, &format!("MASTER_PORT=`{port}`"))?;
        return Ok(format!("{addr}:{port}"));
    }
    if let (Some(list), Some(id)) = (var("SLURM_JOB_NODELIST").or_else(|| var("SLURM_NODELIST")), var("SLURM_JOB_ID")) {
        let host = first_node(&list).ok_or(format!("SLURM_JOB_NODELIST=`{list}` names no host"))?;
        let digits: String = id.chars().rev().take_while(char::is_ascii_digit).take(4).collect();
        let low = digits.chars().rev().collect::<String>().parse::<u16>().unwrap_or(0);
        return Ok(format!("{host}:{}", var("MASTER_PORT").unwrap_or_else(|| (15000 + low).to_string())));
    }
    Err("the tcp transport needs the rendezvous: set MASTER_ADDR and MASTER_PORT (rank 0's host and a free port; \
         with mpirun, `-x MASTER_ADDR=... -x MASTER_PORT=...`), or COLLC_RENDEZVOUS=host:port"
        .into())
}

/// Refuses a rendezvous port that is not one (`what` names where it came from), before any rank tries to reach it.
fn check_port(port: &str, what: &str) -> Result<(), String> {
    match port.trim().parse::<u16>() {
        Ok(1..) => Ok(()),
        _ => Err(format!("{what}: the rendezvous port must be a number from 1 to 65535 (host:port)")),
    }
}

/// The first host of a Slurm node list: `gpu[003-010,012],cpu07` -> `gpu003`, `rack[1-2]-n[01-04]` -> `rack1-n01`.
fn first_node(list: &str) -> Option<String> {
    let mut host = String::new();
    let mut chars = list.trim().chars();
    while let Some(c) = chars.next() {
        match c {
            ',' => break,
            '[' => {
                let group: String = chars.by_ref().take_while(|&c| c != ']').collect();
                host.extend(group.chars().take_while(|&c| c != ',' && c != '-'));
            }
            c => host.push(c),
        }
    }
    (!host.is_empty()).then_some(host)
}

pub(crate) fn job_hash(job: &str) -> u64 {
    job.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// Connections the acceptor has authenticated, by (peer, socket index), until a plan takes them.
#[derive(Default)]
struct Inbox {
    streams: Mutex<HashMap<(u32, u8), TcpStream>>,
    arrived: Condvar,
}

/// The rings made so far, by link and lane (plans of several shapes share a link's ring), and the peers connected.
type Rings = (HashMap<(super::LinkEnd, u16), Arc<Ring>>, Vec<bool>);

/// One rank's tcp fabric: its proxy, its links' rings, its peers' addresses, and the acceptor of its data port.
pub(crate) struct Net {
    proxy: proxy::Proxy<Wire>,
    rings: Mutex<Rings>,
    rendezvous: Arc<Rendezvous>,
    addrs: Vec<SocketAddr>,
    /// Each rank's host (`host_key`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    hosts: Vec<String>,
    inbox: Arc<Inbox>,
    stop: Arc<AtomicBool>,
    job: TcpJob,
    timeout: Duration,
}

/// Joins `job`: the rendezvous, then every rank's data address; returns the fabric and the bootstrap.
pub(crate) fn join(job: &TcpJob, timeout: Duration) -> Result<(Arc<Net>, Arc<Rendezvous>), RuntimeError> {
    let TcpJob { rank, n_ranks, .. } = *job;
    let config = |e: String| RuntimeError::Config(format!("rank {rank}: {e}"));
    let hash = job_hash(&job.job);
    let all = ifname::interfaces().map_err(|e| config(format!("cannot list the network interfaces: {e}")))?;
    let chosen = ifname::select(job.ifname.as_ref(), &all).map_err(config)?;
    let interface = chosen.first().ok_or_else(|| config("no interface is up".into()))?;
    let listener = TcpListener::bind((interface.addr, 0))
        .map_err(|e| config(format!("cannot listen on {interface} for its peers: {e}")))?;
    let data_addr = listener.local_addr().map_err(|e| config(format!("data port: {e}")))?;
    log::info(Subsys::Init, format_args!("rank {rank}: data port {data_addr} on {}", interface.name));
    let rendezvous = Arc::new(Rendezvous::join(&job.rendezvous, rank, n_ranks, hash, &job.token, timeout)?);
    // Each rank's data address and host (which ranks share a host: a device rank reaches those through IPC).
    let blobs = rendezvous.all_gather(rank, format!("{data_addr} {}", host_key()).as_bytes(), 0, timeout)?;
    let mut addrs = Vec::with_capacity(blobs.len());
    let mut hosts = Vec::with_capacity(blobs.len());
    for (r, blob) in blobs.iter().enumerate() {
        let text = String::from_utf8_lossy(blob);
        let (addr, host) = text.split_once(' ').unwrap_or((&text, ""));
        addrs.push(addr.parse::<SocketAddr>().map_err(|_| config(format!("rank {r} gave `{addr}` as its address")))?);
        hosts.push(host.to_string());
    }
    let inbox = Arc::new(Inbox::default());
    let stop = Arc::new(AtomicBool::new(false));
    listener.set_nonblocking(true).map_err(|e| config(format!("data port: {e}")))?;
    let (acceptor_inbox, acceptor_stop, token) = (inbox.clone(), stop.clone(), job.token.clone());
    std::thread::Builder::new()
        .name(format!("collc accept {rank}"))
        .spawn(move || accept_peers(listener, rank, n_ranks, hash, token, acceptor_inbox, acceptor_stop))
        .map_err(|e| config(format!("cannot start the acceptor thread: {e}")))?;
    let proxy = proxy::Proxy::start(Wire::new(rank, n_ranks, hash), job.proxy)
        .map_err(|e| config(format!("cannot start the network proxy thread: {e}")))?;
    let net = Net {
        proxy,
        rings: Mutex::new((HashMap::new(), vec![false; n_ranks as usize])),
        rendezvous: rendezvous.clone(),
        addrs,
        hosts,
        inbox,
        stop,
        job: job.clone(),
        timeout,
    };
    Ok((Arc::new(net), rendezvous))
}

/// Accepts this rank's peers on its data port: each authenticated connection goes into the inbox, until a plan
/// takes it.
fn accept_peers(
    listener: TcpListener,
    rank: u32,
    n_ranks: u32,
    job: u64,
    token: Token,
    inbox: Arc<Inbox>,
    stop: Arc<AtomicBool>,
) {
    let expect = move |h: &Hello| -> Option<Refusal> {
        if h.purpose != Purpose::Data {
            Some(Refusal::Purpose)
        } else if h.job != job {
            Some(Refusal::Job)
        } else if h.world != n_ranks || h.rank >= rank {
            // Only lower ranks connect to this one.
            Some(Refusal::Rank)
        } else {
            None
        }
    };
    let accepted = move |stream: TcpStream, hello: Hello| {
        let mut streams = inbox.streams.lock().unwrap_or_else(|p| p.into_inner());
        if streams.insert((hello.rank, hello.socket), stream).is_some() {
            log::warn(Subsys::Net, format_args!("rank {rank}: rank {} connected twice", hello.rank));
        }
        inbox.arrived.notify_all();
    };
    auth::serve(listener, token, stop, format!("rank {rank}'s data port"), expect, accepted);
}

impl Drop for Net {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Net {
    /// The sockets to `peer`, made and handed to the proxy if this rank has none yet.
    fn reach(&self, connected: &mut [bool], peer: u32) -> Result<(), RuntimeError> {
        if connected[peer as usize] {
            return Ok(());
        }
        let rank = self.job.rank;
        let fail = |how: String| RuntimeError::PeerFailed {
            rank,
            what: "connecting".into(),
            at: "communicator setup".into(),
            peer,
            how,
        };
        let mut sockets = Vec::new();
        for socket in 0..self.job.sockets {
            let stream = if rank < peer {
                let addr = self.addrs[peer as usize];
                let mut stream = TcpStream::connect_timeout(&addr, self.timeout.min(Duration::from_secs(30)))
                    .map_err(|e| fail(format!("cannot be reached at {addr}: {e}")))?;
                let job = job_hash(&self.job.job);
                let hello = Hello { purpose: Purpose::Data, socket, rank, world: self.job.n_ranks, job };
                auth::connect(&mut stream, &self.job.token, &hello, auth::HANDSHAKE_TIMEOUT * 2)
                    .map_err(|e| fail(format!("refused this rank's connection to {addr}: {e}")))?;
                stream
            } else {
                self.accepted(peer, socket)?
            };
            sockets.push(Socket::new(stream).map_err(|e| fail(format!("socket setup: {e}")))?);
        }
        let (n, mode) = (sockets.len(), self.job.proxy.name());
        log::info(Subsys::Init, format_args!("rank {rank}: connected to rank {peer} via NET/Socket/{n} ({mode})"));
        self.proxy.shared.add_peer(peer, sockets);
        connected[peer as usize] = true;
        Ok(())
    }

    /// Waits for the acceptor to have authenticated `peer`'s connection number `socket`.
    fn accepted(&self, peer: u32, socket: u8) -> Result<TcpStream, RuntimeError> {
        let started = Instant::now();
        let mut streams = self.inbox.streams.lock().map_err(|_| RuntimeError::Poisoned)?;
        loop {
            if let Some(stream) = streams.remove(&(peer, socket)) {
                return Ok(stream);
            }
            let at = "communicator setup".to_string();
            let what = format!("waiting for rank {peer} to connect");
            if let Err((failed, how)) = self.rendezvous.health(&[]) {
                return Err(RuntimeError::PeerFailed { rank: self.job.rank, what, at, peer: failed, how });
            }
            if started.elapsed() > self.timeout {
                return Err(RuntimeError::Timeout {
                    rank: self.job.rank,
                    what,
                    at,
                    seconds: started.elapsed().as_secs_f64(),
                    waiting_for: format!("rank {peer}'s connection to this rank's data port"),
                    waits_on: Some(peer),
                });
            }
            streams = self
                .inbox
                .arrived
                .wait_timeout(streams, Duration::from_millis(50))
                .map_err(|_| RuntimeError::Poisoned)?
                .0;
        }
    }
}

impl Fabric for Net {
    fn transport(&self) -> Transport {
        Transport::of(&TCP)
    }

    fn remove_all(&self) {}

    fn prepare(&self, plan: Plan) -> Result<Box<dyn Executor>, RuntimeError> {
        let mut guard = self.rings.lock().map_err(|_| RuntimeError::Poisoned)?;
        let (rings, connected) = &mut *guard;
        let mut links = Vec::with_capacity(plan.links.len());
        for end in &plan.links {
            let peer = if end.from == self.job.rank { end.to } else { end.from };
            self.reach(connected, peer)?;
            let ring = rings.entry((*end, 0)).or_insert_with(|| {
                let ring = Arc::new(Ring::new(*end, peer, end.channel as usize % self.job.sockets.max(1) as usize));
                self.proxy.shared.add_ring(ring.clone());
                ring
            });
            links.push(RingLink::new(ring.clone(), self.proxy.shared.clone()));
        }
        drop(guard);
        self.sync()?;
        Ok(exec::executor(plan, links))
    }
}

/// What device ranks on different hosts use of a tcp fabric (the `cuda` transport's, `cuda/remote.rs`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl Net {
    /// Rank `r`'s host key (`host_key`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn host(&self, r: u32) -> &str {
        self.hosts.get(r as usize).map_or("", String::as_str)
    }

    /// The ring carrying lane `lane` of the connection `end` between a device rank of this process and one on
    /// another host: made the first time (its record from `record`, connecting to the peer), then shared by every
    /// call shape with that link and lane. The record's device address is the caller's to keep.
    pub(crate) fn carry_record(
        &self,
        end: super::LinkEnd,
        lane: u16,
        record: impl FnOnce() -> Result<record::Record, RuntimeError>,
    ) -> Result<Arc<Ring>, RuntimeError> {
        let mut guard = self.rings.lock().map_err(|_| RuntimeError::Poisoned)?;
        let (rings, connected) = &mut *guard;
        if let Some(ring) = rings.get(&(end, lane)) {
            return Ok(ring.clone());
        }
        let peer = if end.from == self.job.rank { end.to } else { end.from };
        self.reach(connected, peer)?;
        let socket = (end.channel as usize + lane as usize) % self.job.sockets.max(1) as usize;
        let ring = Arc::new(Ring::over_record(end, lane, peer, socket, record()?));
        rings.insert((end, lane), ring.clone());
        self.proxy.shared.add_ring(ring.clone());
        Ok(ring)
    }

    /// Waits until the proxy carries every ring handed to it (before a plan's first call).
    pub(crate) fn sync(&self) -> Result<(), RuntimeError> {
        self.proxy.shared.sync().map_err(|(peer, how)| RuntimeError::PeerFailed {
            rank: self.job.rank,
            what: "preparing a call".into(),
            at: "its links".into(),
            peer,
            how,
        })
    }

    /// What the proxy found wrong (a peer that broke its connection or the protocol, a proxy gone or stalled).
    pub(crate) fn fault(&self) -> Option<(u32, String)> {
        self.proxy.shared.fault()
    }
}

/// Joins a tcp job for device ranks on several hosts (the `cuda` transport across hosts): as `join`, with the
/// network proxy always a thread (no host executor pumps the wire).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn join_devices(launch: &Launch, timeout: Duration) -> Result<(Arc<Net>, Arc<Rendezvous>), RuntimeError> {
    let mut job = TcpJob::from_launch(launch).map_err(RuntimeError::Config)?;
    if std::env::var("COLLC_NET_PROXY").is_ok_and(|v| v.trim() == "0") {
        return Err(RuntimeError::Config(format!(
            "rank {}: COLLC_NET_PROXY=0, but a GPU rank's connections to other hosts need the network proxy thread \
             (its device posts into host memory the proxy sends from): unset it or set 1",
            launch.rank
        )));
    }
    job.proxy = proxy::Mode::Thread;
    join(&job, timeout)
}

/// Which host this process runs on, as ranks compare it: `COLLC_HOSTID` where set (NCCL_HOSTID's role), else the
/// host name, the boot id and the network namespace (ranks in two namespaces or containers of one machine count
/// as two hosts, as they reach each other only through the network).
pub(crate) fn host_key() -> String {
    if let Ok(id) = std::env::var("COLLC_HOSTID") {
        return format!("id:{}", id.trim());
    }
    let read = |path: &str| std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_default();
    let netns = std::fs::read_link("/proc/self/ns/net").map(|p| p.display().to_string()).unwrap_or_default();
    let key = format!("{}/{}/{netns}", read("/proc/sys/kernel/hostname"), read("/proc/sys/kernel/random/boot_id"));
    key.replace(' ', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    #[test]
    fn rendezvous_comes_from_collc_then_torchrun_then_slurm() {
        let all =
            [("COLLC_RENDEZVOUS", "a:1"), ("MASTER_ADDR", "b"), ("SLURM_JOB_NODELIST", "c"), ("SLURM_JOB_ID", "9")];
        assert_eq!(rendezvous_from(env(&all)).unwrap(), "a:1");
        assert_eq!(rendezvous_from(env(&all[1..])).unwrap(), "b:29500");
        assert_eq!(rendezvous_from(env(&[("MASTER_ADDR", "b"), ("MASTER_PORT", "7")])).unwrap(), "b:7");
        let err = rendezvous_from(env(&[("MASTER_ADDR", "b"), ("MASTER_PORT", "70000")])).unwrap_err();
        assert!(err.starts_with("MASTER_PORT=`70000`: the rendezvous port must be"), "{err}");
        assert!(rendezvous_from(env(&[("COLLC_RENDEZVOUS", "a")])).is_err());
        let slurm = [("SLURM_JOB_NODELIST", "gpu[003-010,012],cpu07"), ("SLURM_JOB_ID", "4123456")];
        assert_eq!(rendezvous_from(env(&slurm)).unwrap(), "gpu003:18456");
        let err = rendezvous_from(env(&[("PMI_RANK", "0")])).unwrap_err();
        assert!(err.contains("MASTER_ADDR") && err.contains("-x MASTER_ADDR"), "{err}");
    }

    #[test]
    fn first_node_expands_only_the_first_of_each_range() {
        assert_eq!(first_node("node7").as_deref(), Some("node7"));
        assert_eq!(first_node("rack[1-2]-n[01-04],x").as_deref(), Some("rack1-n01"));
        assert_eq!(first_node("a[5,1-3]").as_deref(), Some("a5"));
        assert_eq!(first_node(" ,x"), None);
    }
}
