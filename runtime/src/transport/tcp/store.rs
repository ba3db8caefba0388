//! The rendezvous: rank 0 hosts a hub at MASTER_ADDR:MASTER_PORT that every rank (rank 0 too) joins over an
//! authenticated connection. Through it the ranks learn each other's data addresses and do what `Bootstrap` asks:
//! barriers, all-gathers of small blobs, aborts. It also watches the ranks: a rank whose connection closes before
//! it has left is announced to every other rank as failed, naming it, so a rank killed with SIGKILL stops the job
//! at once instead of at the timeout. It relays what mismatch reports name: where each rank's plans came from
//! (sent once per plan), and the call a rank was in when it aborted.
//!
//! Messages are `[len u32][tag u8][body]`; a length over `MAX_MESSAGE` closes the connection before anything is
//! allocated for it.

use super::auth::{self, Hello, Purpose, Refusal, Token};
use crate::error::RuntimeError;
use crate::log::{self, Subsys};
use crate::transport::{Bootstrap, CallInfo, Status, BLOB_BYTES, SOURCE_BYTES};
use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const GATHER: u8 = 1;
const ABORT: u8 = 2;
const LEAVE: u8 = 3;
/// A rank stopped because of another: that one is the failure to announce (unless one already is).
const REPORT: u8 = 4;
/// Where the rank's plan of a fingerprint came from: `[fingerprint u64][source]`, relayed to every rank.
const SOURCE: u8 = 5;
const RELEASE: u8 = 11;
const FAILED: u8 = 12;
const REFUSED: u8 = 13;
/// Rank 0 has left: the hub goes when its process does, which is then no failure.
const HOST_LEFT: u8 = 14;
/// A rank's `SOURCE`: `[rank u32][fingerprint u64][source]`.
const SOURCE_OF: u8 = 15;
/// The call a rank was in when it aborted: `[rank u32][CallInfo]`, sent before the failure it causes.
const CALLED: u8 = 16;
/// A rank that timed out at a barrier asks who has not reached it: `[generation u64]`.
const WHO_WAITS: u8 = 6;
/// The hub's answer to `WHO_WAITS`: `[generation u64]`, then per rank not at it `[rank u32][joined u8]`.
const MISSING: u8 = 17;
/// A rank checking in (sent at most every `BEAT_EVERY` while it waits in a call or a barrier): no body.
const BEAT: u8 = 7;
/// A rank that timed out asks which ranks no longer check in: no body.
const WHO_STALLS: u8 = 8;
/// The hub's answer to `WHO_STALLS`: per rank joined, not left and silent for `STALL_AFTER`, `[rank u32]`.
const STALLED: u8 = 18;
/// How often a waiting rank checks in, and how long a silent one is taken to stand still (stopped, hung, cut off, or
/// busy outside collc).
const BEAT_EVERY: Duration = Duration::from_millis(50);
const STALL_AFTER: Duration = Duration::from_millis(500);
/// How long a timed-out rank waits for the hub to say who is missing.
const MISSING_WAIT: Duration = Duration::from_secs(1);
/// Sources kept per peer: the plans of its most recent call shapes.
const SOURCES_KEPT: usize = 64;
/// How long a mismatch report waits for a peer's source to come through the rendezvous.
const SOURCE_WAIT: Duration = Duration::from_millis(200);

/// The largest message for `n_ranks`: a release carries every rank's blob.
fn max_message(n_ranks: u32) -> usize {
    64 + n_ranks as usize * (BLOB_BYTES + 4)
}

fn write_message(stream: &mut TcpStream, tag: u8, body: &[u8]) -> std::io::Result<()> {
    let mut message = Vec::with_capacity(5 + body.len());
    message.extend_from_slice(&(1 + body.len() as u32).to_le_bytes());
    message.push(tag);
    message.extend_from_slice(body);
    stream.write_all(&message)
}

/// One message, or an error (EOF, a length over `max`, an empty message).
fn read_message(stream: &mut TcpStream, max: usize) -> std::io::Result<(u8, Vec<u8>)> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 || len > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a message of {len} bytes (at most {max} here)"),
        ));
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    let tag = body.remove(0);
    Ok((tag, body))
}

fn blobs_body(generation: u64, blobs: &[Vec<u8>]) -> Vec<u8> {
    let mut body = generation.to_le_bytes().to_vec();
    for blob in blobs {
        body.extend_from_slice(&(blob.len() as u32).to_le_bytes());
        body.extend_from_slice(blob);
    }
    body
}

fn parse_blobs(body: &[u8], n_ranks: u32) -> Option<(u64, Vec<Vec<u8>>)> {
    let generation = u64::from_le_bytes(body.get(..8)?.try_into().ok()?);
    let mut rest = &body[8..];
    let mut blobs = Vec::with_capacity(n_ranks as usize);
    for _ in 0..n_ranks {
        let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        if len > BLOB_BYTES {
            return None;
        }
        blobs.push(rest.get(4..4 + len)?.to_vec());
        rest = &rest[4 + len..];
    }
    rest.is_empty().then_some((generation, blobs))
}

/// What the hub knows, behind one lock.
struct HubState {
    n_ranks: u32,
    /// Each rank's connection, to send to; `None` before it joins and after it leaves.
    writers: Vec<Option<TcpStream>>,
    ever_joined: Vec<bool>,
    left: Vec<bool>,
    gathers: HashMap<u64, Vec<Option<Vec<u8>>>>,
    /// When each rank last checked in (any message counts), from its joining on.
    beats: Vec<Option<Instant>>,
    /// The first failure announced: (rank, how); later ones are not announced again.
    failed: Option<(u32, String)>,
}

impl HubState {
    fn broadcast(&mut self, tag: u8, body: &[u8]) {
        for writer in self.writers.iter_mut().flatten() {
            let _ = write_message(writer, tag, body);
        }
    }

    fn fail(&mut self, rank: u32, how: String) {
        if self.failed.is_some() {
            return;
        }
        log::warn(Subsys::Net, format_args!("rendezvous: rank {rank} {how}; telling every rank"));
        let mut body = rank.to_le_bytes().to_vec();
        body.extend_from_slice(how.as_bytes());
        self.broadcast(FAILED, &body);
        self.failed = Some((rank, how));
    }
}

/// Hub ports bound ahead of their hub by `prebind`, by port.
static PREBOUND: Mutex<Vec<(u16, TcpListener)>> = Mutex::new(Vec::new());

/// The listener `prebind` bound on `port`, if it did.
fn take_prebound(port: u16) -> Option<TcpListener> {
    let mut prebound = PREBOUND.lock().unwrap_or_else(|p| p.into_inner());
    let at = prebound.iter().position(|(p, _)| *p == port)?;
    Some(prebound.swap_remove(at).1)
}

/// Binds a free port for a hub this process will start (`Communicator::group` over tcp): the port stays bound
/// from now on, so no other socket (an outgoing connection's ephemeral port) can take it before the hub starts.
pub(crate) fn prebind() -> Result<u16, RuntimeError> {
    let listener = TcpListener::bind(("0.0.0.0", 0))
        .map_err(|e| RuntimeError::Config(format!("no free port for the rendezvous: {e}")))?;
    let port = listener.local_addr().map_err(|e| RuntimeError::Config(format!("rendezvous port: {e}")))?.port();
    PREBOUND.lock().unwrap_or_else(|p| p.into_inner()).push((port, listener));
    Ok(port)
}

/// Rank 0's hub, serving until every rank has left (or the process ends).
pub struct Hub {
    state: Arc<(Mutex<HubState>, Condvar)>,
    stop: Arc<AtomicBool>,
}

impl Hub {
    /// Binds the hub's port (every address of the host) and starts serving it.
    pub fn start(port: u16, n_ranks: u32, job: u64, token: Token) -> Result<Hub, RuntimeError> {
        let listener = take_prebound(port).map_or_else(|| TcpListener::bind(("0.0.0.0", port)), Ok).map_err(|e| {
            RuntimeError::Config(match e.kind() {
                std::io::ErrorKind::AddrInUse => format!(
                    "the rendezvous port {port} is in use (another job, or one that has not ended): choose another \
                     MASTER_PORT or --rendezvous"
                ),
                _ => format!("cannot listen on the rendezvous port {port}: {e}"),
            })
        })?;
        let state = HubState {
            n_ranks,
            writers: (0..n_ranks).map(|_| None).collect(),
            ever_joined: vec![false; n_ranks as usize],
            left: vec![false; n_ranks as usize],
            gathers: HashMap::new(),
            beats: vec![None; n_ranks as usize],
            failed: None,
        };
        let state = Arc::new((Mutex::new(state), Condvar::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (serve_state, serve_stop) = (state.clone(), stop.clone());
        listener.set_nonblocking(true).map_err(|e| RuntimeError::Config(format!("rendezvous socket: {e}")))?;
        std::thread::Builder::new()
            .name("collc rendezvous".into())
            .spawn(move || serve(listener, serve_state, serve_stop, job, token))
            .map_err(|e| RuntimeError::Config(format!("cannot start the rendezvous thread: {e}")))?;
        Ok(Hub { state, stop })
    }

    /// Waits (up to `timeout`) until the hub has taken rank 0's leave: then everything it sent before is in the
    /// ranks' sockets, and they know that its going is no failure.
    fn wait_for_host_leave(&self, timeout: Duration) {
        let (lock, changed) = &*self.state;
        let deadline = Instant::now() + timeout;
        let mut state = lock.lock().unwrap_or_else(|p| p.into_inner());
        while !state.left[0] {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = changed.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve(listener: TcpListener, state: Arc<(Mutex<HubState>, Condvar)>, stop: Arc<AtomicBool>, job: u64, token: Token) {
    let n_ranks = state.0.lock().unwrap_or_else(|p| p.into_inner()).n_ranks;
    let expect = move |h: &Hello| -> Option<Refusal> {
        if h.purpose != Purpose::Rendezvous {
            Some(Refusal::Purpose)
        } else if h.job != job {
            Some(Refusal::Job)
        } else if h.world != n_ranks || h.rank >= n_ranks {
            Some(Refusal::Rank)
        } else {
            None
        }
    };
    let accepted = move |stream: TcpStream, hello: Hello| session(stream, hello.rank, &state);
    auth::serve(listener, token, stop, "rendezvous".into(), expect, accepted);
}

/// Serves one rank's connection until it leaves or the connection ends.
fn session(stream: TcpStream, rank: u32, state: &(Mutex<HubState>, Condvar)) {
    let (lock, changed) = state;
    let mut reader = stream;
    let _ = reader.set_read_timeout(None);
    let _ = reader.set_nodelay(true);
    {
        let mut hub = lock.lock().unwrap_or_else(|p| p.into_inner());
        if hub.ever_joined[rank as usize] {
            drop(hub);
            log::warn(Subsys::Net, format_args!("rendezvous: a second connection claims rank {rank}; refused"));
            let _ = write_message(&mut reader, REFUSED, format!("rank {rank} has already joined this job").as_bytes());
            return;
        }
        hub.ever_joined[rank as usize] = true;
        hub.beats[rank as usize] = Some(Instant::now());
        hub.writers[rank as usize] = reader.try_clone().ok();
        // A failure announced before this rank joined is news to it too.
        if let Some((failed, how)) = hub.failed.clone() {
            let mut body = failed.to_le_bytes().to_vec();
            body.extend_from_slice(how.as_bytes());
            if let Some(w) = hub.writers[rank as usize].as_mut() {
                let _ = write_message(w, FAILED, &body);
            }
        }
    }
    let max = max_message(lock.lock().unwrap_or_else(|p| p.into_inner()).n_ranks);
    let ended = loop {
        let (tag, body) = match read_message(&mut reader, max) {
            Ok(message) => message,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                break "closed its connection to the rendezvous without leaving: its process died".into()
            }
            Err(e) => break format!("lost its connection to the rendezvous ({e}): its process died or was cut off"),
        };
        let mut hub = lock.lock().unwrap_or_else(|p| p.into_inner());
        hub.beats[rank as usize] = Some(Instant::now());
        match tag {
            BEAT if body.is_empty() => {}
            WHO_STALLS if body.is_empty() => {
                let silent = |r: usize| hub.beats[r].is_some_and(|at| at.elapsed() > STALL_AFTER) && !hub.left[r];
                let answer: Vec<u8> =
                    (0..hub.n_ranks).filter(|&r| silent(r as usize)).flat_map(|r| r.to_le_bytes()).collect();
                if let Some(w) = hub.writers[rank as usize].as_mut() {
                    let _ = write_message(w, STALLED, &answer);
                }
            }
            GATHER if body.len() >= 8 && body.len() <= 8 + BLOB_BYTES => {
                let generation = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
                let n = hub.n_ranks as usize;
                let entry = hub.gathers.entry(generation).or_insert_with(|| vec![None; n]);
                entry[rank as usize] = Some(body[8..].to_vec());
                if entry.iter().all(Option::is_some) {
                    let blobs: Vec<Vec<u8>> =
                        hub.gathers.remove(&generation).expect("just seen").into_iter().flatten().collect();
                    hub.broadcast(RELEASE, &blobs_body(generation, &blobs));
                }
            }
            WHO_WAITS if body.len() == 8 => {
                let generation = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
                let arrived = hub.gathers.get(&generation);
                let mut answer = body.clone();
                for peer in 0..hub.n_ranks {
                    if arrived.is_none_or(|blobs| blobs[peer as usize].is_none()) {
                        answer.extend_from_slice(&peer.to_le_bytes());
                        answer.push(hub.ever_joined[peer as usize] as u8);
                    }
                }
                if let Some(w) = hub.writers[rank as usize].as_mut() {
                    let _ = write_message(w, MISSING, &answer);
                }
            }
            ABORT => {
                if body.len() == CallInfo::BYTES {
                    let mut called = rank.to_le_bytes().to_vec();
                    called.extend_from_slice(&body);
                    hub.broadcast(CALLED, &called);
                }
                hub.fail(rank, "failed (see its error)".into())
            }
            SOURCE if body.len() >= 8 && body.len() <= 8 + SOURCE_BYTES => {
                let mut relayed = rank.to_le_bytes().to_vec();
                relayed.extend_from_slice(&body);
                hub.broadcast(SOURCE_OF, &relayed);
            }
            REPORT if body.len() >= 4 && body.len() <= 4 + 512 => {
                let peer = u32::from_le_bytes(body[..4].try_into().expect("4 bytes"));
                if peer < hub.n_ranks && peer != rank {
                    let how = String::from_utf8_lossy(&body[4..]).into_owned();
                    hub.fail(peer, how);
                }
            }
            LEAVE if body.len() == 1 => {
                hub.left[rank as usize] = true;
                hub.writers[rank as usize] = None;
                if body[0] == Status::Failed as u8 {
                    hub.fail(rank, "failed (see its error)".into());
                }
                if rank == 0 {
                    hub.broadcast(HOST_LEFT, &[]);
                }
                changed.notify_all();
                return;
            }
            _ => break format!("sent a malformed rendezvous message (tag {tag}, {} bytes)", body.len()),
        }
    };
    let mut hub = lock.lock().unwrap_or_else(|p| p.into_inner());
    hub.writers[rank as usize] = None;
    if !hub.left[rank as usize] {
        hub.left[rank as usize] = true;
        hub.fail(rank, ended);
    }
    changed.notify_all();
}

/// What a rank has heard from the hub.
#[derive(Default)]
struct Heard {
    releases: HashMap<u64, Vec<Vec<u8>>>,
    /// The calls ranks were in when they aborted.
    calls: HashMap<u32, CallInfo>,
    /// Per rank, the sources of its plans by fingerprint, most recent last.
    sources: HashMap<u32, Vec<(u64, String)>>,
    failure: Option<(u32, String)>,
    refused: Option<String>,
    /// Per barrier generation, the ranks the hub says have not reached it, each with whether it ever joined.
    missing: HashMap<u64, Vec<(u32, bool)>>,
    /// The hub's last answer to `WHO_STALLS`: the ranks that no longer check in.
    stalled: Option<Vec<u32>>,
    /// Rank 0 has left: the hub's going is expected.
    host_left: bool,
}

/// A rank's end of the rendezvous: its `Bootstrap` for the tcp transport.
pub struct Rendezvous {
    writer: Mutex<TcpStream>,
    heard: Arc<(Mutex<Heard>, Condvar)>,
    failed: Arc<AtomicBool>,
    leaving: Arc<AtomicBool>,
    n_ranks: u32,
    rank: u32,
    /// The call this rank is in (its peers learn theirs from the frames' headers, or when it aborts).
    call: Mutex<CallInfo>,
    /// The fingerprints whose sources this rank has sent the hub.
    sources_sent: Mutex<HashSet<u64>>,
    /// Rank 0 hosts the hub.
    hub: Option<Hub>,
    /// When this end was made, and when (since then, in milliseconds) it last checked in with the hub.
    born: Instant,
    last_beat: std::sync::atomic::AtomicU64,
    /// A data plane whose faults the health checks report too, where no executor looks at it (device ranks).
    watched: std::sync::OnceLock<DataPlane>,
}

/// The faults of a data plane: the peer at fault, and how.
type DataPlane = Box<dyn Fn() -> Option<(u32, String)> + Send + Sync>;

impl Rendezvous {
    /// Reports `faults` through the health checks from now on (a process's network proxy, for device ranks).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn watch(&self, faults: DataPlane) {
        let _ = self.watched.set(faults);
    }

    /// Joins the job at `addr` (rank 0 starts the hub there first), retrying until `timeout` while the hub is not
    /// up yet.
    pub fn join(
        addr: &str,
        rank: u32,
        n_ranks: u32,
        job: u64,
        token: &Token,
        timeout: Duration,
    ) -> Result<Rendezvous, RuntimeError> {
        let hub = match rank {
            0 => {
                let port = addr
                    .rsplit_once(':')
                    .and_then(|(_, p)| p.parse::<u16>().ok())
                    .ok_or_else(|| RuntimeError::Config(format!("rendezvous address `{addr}` is not host:port")))?;
                Some(Hub::start(port, n_ranks, job, token.clone())?)
            }
            _ => None,
        };
        let hello = Hello { purpose: Purpose::Rendezvous, socket: 0, rank, world: n_ranks, job };
        let started = Instant::now();
        let mut last_error;
        let stream = loop {
            match connect_once(addr, &hello, token, timeout) {
                Ok(stream) => break stream,
                // Refusals are final: retrying would not change the token or the world size.
                Err(Fatal(message)) => return Err(RuntimeError::Config(message)),
                Err(Retry(message)) => last_error = message,
            }
            if started.elapsed() > timeout {
                return Err(RuntimeError::Config(format!(
                    "rank {rank}: could not join the rendezvous at {addr} within {:.0} s: {last_error} (is rank 0 \
                     running, and MASTER_ADDR/MASTER_PORT the same on every rank?)",
                    timeout.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let heard = Arc::new((Mutex::new(Heard::default()), Condvar::new()));
        let failed = Arc::new(AtomicBool::new(false));
        let leaving = Arc::new(AtomicBool::new(false));
        let reader = stream.try_clone().map_err(|e| RuntimeError::Config(format!("rendezvous socket: {e}")))?;
        let (h, f, l) = (heard.clone(), failed.clone(), leaving.clone());
        std::thread::Builder::new()
            .name("collc rendezvous client".into())
            .spawn(move || listen(reader, n_ranks, &h, &f, &l))
            .map_err(|e| RuntimeError::Config(format!("cannot start the rendezvous reader: {e}")))?;
        Ok(Rendezvous {
            writer: Mutex::new(stream),
            heard,
            failed,
            leaving,
            n_ranks,
            rank,
            call: Mutex::new(CallInfo::NONE),
            sources_sent: Mutex::new(HashSet::new()),
            hub,
            born: Instant::now(),
            last_beat: std::sync::atomic::AtomicU64::new(0),
            watched: std::sync::OnceLock::new(),
        })
    }

    /// Checks in with the hub if `BEAT_EVERY` has passed since this rank last did (its health checks and barrier
    /// waits call this: a rank that stops, hangs or is cut off falls silent).
    fn beat(&self) {
        let now = self.born.elapsed().as_millis() as u64;
        let last = self.last_beat.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= BEAT_EVERY.as_millis() as u64
            && self.last_beat.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            let _ = self.send(BEAT, &[]);
        }
    }

    fn send(&self, tag: u8, body: &[u8]) -> Result<(), RuntimeError> {
        let mut writer = self.writer.lock().map_err(|_| RuntimeError::Poisoned)?;
        write_message(&mut writer, tag, body)
            .map_err(|e| RuntimeError::Config(format!("rank {}: the rendezvous connection failed: {e}", self.rank)))
    }
}

enum Attempt {
    Retry(String),
    Fatal(String),
}
use Attempt::{Fatal, Retry};

/// One attempt to reach the hub at `addr` as `hello` says.
fn connect_once(addr: &str, hello: &Hello, token: &Token, timeout: Duration) -> Result<TcpStream, Attempt> {
    let Hello { rank, world: n_ranks, .. } = *hello;
    let addrs: Vec<SocketAddr> =
        addr.to_socket_addrs().map_err(|e| Retry(format!("cannot resolve `{addr}`: {e}")))?.collect();
    let target = addrs.first().ok_or_else(|| Retry(format!("`{addr}` resolves to no address")))?;
    let mut stream =
        TcpStream::connect_timeout(target, Duration::from_secs(2)).map_err(|e| Retry(format!("{target}: {e}")))?;
    auth::connect(&mut stream, token, hello, timeout.min(auth::HANDSHAKE_TIMEOUT * 2)).map_err(|e| match e {
        auth::HandshakeError::RefusedByPeer(Refusal::Rank) => Fatal(format!(
            "rank {rank}: the rendezvous at {addr} refused it: this rank was started with {n_ranks} ranks and \
             rank {rank}, the job has another world size (every rank needs the same WORLD_SIZE)"
        )),
        auth::HandshakeError::RefusedByPeer(why) => {
            Fatal(format!("rank {rank}: the rendezvous at {addr} refused it: {}", why.reason()))
        }
        auth::HandshakeError::Impostor => {
            Fatal(format!("rank {rank}: the rendezvous at {addr} does not hold this job's token: another job's port?"))
        }
        other => Retry(format!("handshake with {target}: {other}")),
    })?;
    let _ = stream.set_read_timeout(None);
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Reads what the hub sends until the connection ends.
fn listen(
    mut reader: TcpStream,
    n_ranks: u32,
    heard: &(Mutex<Heard>, Condvar),
    failed: &AtomicBool,
    leaving: &AtomicBool,
) {
    let (lock, changed) = heard;
    loop {
        let message = read_message(&mut reader, max_message(n_ranks));
        let mut h = lock.lock().unwrap_or_else(|p| p.into_inner());
        match message {
            Ok((RELEASE, body)) => match parse_blobs(&body, n_ranks) {
                Some((generation, blobs)) => {
                    h.releases.insert(generation, blobs);
                }
                None => {
                    h.failure.get_or_insert((0, "sent a malformed release (the rendezvous host)".into()));
                    failed.store(true, Ordering::Release);
                }
            },
            Ok((FAILED, body)) if body.len() >= 4 => {
                let rank = u32::from_le_bytes(body[..4].try_into().expect("4 bytes"));
                let how = String::from_utf8_lossy(&body[4..]).into_owned();
                h.failure.get_or_insert((rank, how));
                failed.store(true, Ordering::Release);
            }
            Ok((HOST_LEFT, _)) => h.host_left = true,
            Ok((SOURCE_OF, body)) if body.len() >= 12 => {
                let rank = u32::from_le_bytes(body[..4].try_into().expect("4 bytes"));
                let fingerprint = u64::from_le_bytes(body[4..12].try_into().expect("8 bytes"));
                let source = String::from_utf8_lossy(&body[12..]).into_owned();
                let known = h.sources.entry(rank).or_default();
                known.retain(|(f, _)| *f != fingerprint);
                if known.len() == SOURCES_KEPT {
                    known.remove(0);
                }
                known.push((fingerprint, source));
            }
            Ok((CALLED, body)) if body.len() == 4 + CallInfo::BYTES => {
                let rank = u32::from_le_bytes(body[..4].try_into().expect("4 bytes"));
                if let Some(call) = CallInfo::from_bytes(&body[4..]) {
                    h.calls.insert(rank, call);
                }
            }
            Ok((MISSING, body)) if body.len() >= 8 && (body.len() - 8) % 5 == 0 => {
                let generation = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
                let ranks = body[8..]
                    .chunks_exact(5)
                    .map(|r| (u32::from_le_bytes(r[..4].try_into().expect("4 bytes")), r[4] != 0))
                    .filter(|&(rank, _)| rank < n_ranks)
                    .collect();
                h.missing.insert(generation, ranks);
            }
            Ok((STALLED, body)) if body.len() % 4 == 0 => {
                let ranks = body.chunks_exact(4).map(|r| u32::from_le_bytes(r.try_into().expect("4 bytes")));
                h.stalled = Some(ranks.filter(|&rank| rank < n_ranks).collect());
            }
            Ok((REFUSED, body)) => {
                h.refused = Some(String::from_utf8_lossy(&body).into_owned());
                failed.store(true, Ordering::Release);
            }
            Ok((tag, _)) => {
                h.failure.get_or_insert((0, format!("sent an unknown message (tag {tag}): the rendezvous host")));
                failed.store(true, Ordering::Release);
            }
            Err(e) => {
                // A refused rank's connection is closed by the hub after it says why: that is the news.
                if !leaving.load(Ordering::Acquire) && !h.host_left && h.refused.is_none() {
                    let how = format!("(the rendezvous host) closed its connection ({e}): its process is gone?");
                    h.failure.get_or_insert((0, how));
                    failed.store(true, Ordering::Release);
                }
                changed.notify_all();
                return;
            }
        }
        changed.notify_all();
    }
}

impl Bootstrap for Rendezvous {
    fn join(&self, _rank: u32) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn leave(&self, _rank: u32, status: Status) -> bool {
        let _ = self.send(LEAVE, &[status as u8]);
        self.leaving.store(true, Ordering::Release);
        if let Some(hub) = &self.hub {
            hub.wait_for_host_leave(Duration::from_secs(5));
        }
        false
    }

    fn report_failure(&self, peer: u32, how: &str) {
        let mut body = peer.to_le_bytes().to_vec();
        body.extend_from_slice(&how.as_bytes()[..how.len().min(512)]);
        let _ = self.send(REPORT, &body);
    }

    fn abort(&self, rank: u32) {
        // This rank stops at once; the hub tells the others, and which call this rank was in (a peer whose call
        // has the same number and another fingerprint reports the mismatch, not only this rank's failure).
        let mut heard = self.heard.0.lock().unwrap_or_else(|p| p.into_inner());
        heard.failure.get_or_insert((rank, "aborted".into()));
        self.failed.store(true, Ordering::Release);
        drop(heard);
        let call = *self.call.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self.send(ABORT, &call.to_bytes());
    }

    fn health(&self, _peers: &[u32]) -> Result<(), (u32, String)> {
        if !self.failed.load(Ordering::Acquire) {
            self.beat();
            return self.watched.get().and_then(|faults| faults()).map_or(Ok(()), Err);
        }
        let heard = self.heard.0.lock().unwrap_or_else(|p| p.into_inner());
        match (&heard.refused, &heard.failure) {
            (Some(refused), _) => Err((self.rank, format!("was refused by the rendezvous: {refused}"))),
            (None, Some(failure)) => Err(failure.clone()),
            (None, None) => Ok(()),
        }
    }

    fn barrier(&self, rank: u32, generation: u64, timeout: Duration, at: &str) -> Result<(), RuntimeError> {
        self.gather(rank, &[], generation, timeout, at).map(drop)
    }

    fn all_gather(
        &self,
        rank: u32,
        blob: &[u8],
        generation: u64,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, RuntimeError> {
        self.gather(rank, blob, generation, timeout, "all-gather")
    }

    /// The rank the hub has not heard from for `STALL_AFTER` (`waits_on` when it is one of them, else the lowest),
    /// after this rank has checked in for that long itself; `None` where the hub does not answer (then it may be
    /// this rank that is cut off).
    fn stalled(&self, waits_on: Option<u32>) -> Option<u32> {
        let started = Instant::now();
        while started.elapsed() < STALL_AFTER + BEAT_EVERY {
            self.beat();
            std::thread::sleep(BEAT_EVERY / 5);
        }
        let (lock, changed) = &*self.heard;
        lock.lock().unwrap_or_else(|p| p.into_inner()).stalled = None;
        self.send(WHO_STALLS, &[]).ok()?;
        let deadline = Instant::now() + MISSING_WAIT;
        let mut heard = lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(still) = heard.stalled.take() {
                let still: Vec<u32> = still.into_iter().filter(|&r| r != self.rank).collect();
                return match waits_on {
                    Some(peer) if still.contains(&peer) => Some(peer),
                    _ => still.first().copied(),
                };
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            heard = changed.wait_timeout(heard, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    fn publish_call(&self, _rank: u32, call: CallInfo) {
        *self.call.lock().unwrap_or_else(|p| p.into_inner()) = call;
    }

    fn call_of(&self, rank: u32) -> CallInfo {
        if rank == self.rank {
            return *self.call.lock().unwrap_or_else(|p| p.into_inner());
        }
        let heard = self.heard.0.lock().unwrap_or_else(|p| p.into_inner());
        heard.calls.get(&rank).copied().unwrap_or(CallInfo::NONE)
    }

    fn publish_source(&self, _rank: u32, fingerprint: u64, source: &str) {
        // Once per plan: the hub relays it to every rank, which keeps it.
        if self.sources_sent.lock().unwrap_or_else(|p| p.into_inner()).insert(fingerprint) {
            let mut body = fingerprint.to_le_bytes().to_vec();
            body.extend_from_slice(crate::transport::clip_source(source).as_bytes());
            let _ = self.send(SOURCE, &body);
        }
    }

    fn source_of(&self, rank: u32, fingerprint: u64) -> Option<String> {
        let (lock, changed) = &*self.heard;
        let deadline = Instant::now() + SOURCE_WAIT;
        let mut heard = lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let known = heard.sources.get(&rank).and_then(|k| k.iter().find(|(f, _)| *f == fingerprint));
            if let Some((_, source)) = known {
                return Some(source.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            heard = changed.wait_timeout(heard, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

impl Rendezvous {
    /// Who the hub says has not reached barrier `generation`, for a timeout's message (`rank 2 (it never joined the
    /// job), rank 3`, or every rank when the hub does not answer in time), and the first of them with whether it
    /// ever joined.
    fn missing_at(&self, generation: u64) -> (String, Option<(u32, bool)>) {
        let unanswered = || ("every rank to reach it (the rendezvous did not answer who is missing)".into(), None);
        if self.send(WHO_WAITS, &generation.to_le_bytes()).is_err() {
            return unanswered();
        }
        let (lock, changed) = &*self.heard;
        let deadline = Instant::now() + MISSING_WAIT;
        let mut heard = lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(missing) = heard.missing.remove(&generation) {
                let named: Vec<String> = missing
                    .iter()
                    .map(|&(peer, joined)| match joined {
                        true => format!("rank {peer}"),
                        false => format!(
                            "rank {peer} (it never joined the job: is it running, with this job's \
                                          MASTER_ADDR, MASTER_PORT and token?)"
                        ),
                    })
                    .collect();
                let text = match named.is_empty() {
                    true => "the rendezvous to release it (every rank has reached it)".into(),
                    false => named.join(", "),
                };
                let first = missing.iter().find(|(_, joined)| !joined).or(missing.first()).copied();
                return (text, first);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return unanswered();
            }
            heard = changed.wait_timeout(heard, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    fn gather(
        &self,
        rank: u32,
        blob: &[u8],
        generation: u64,
        timeout: Duration,
        at: &str,
    ) -> Result<Vec<Vec<u8>>, RuntimeError> {
        crate::transport::check_blob(blob)?;
        let mut body = generation.to_le_bytes().to_vec();
        body.extend_from_slice(blob);
        self.send(GATHER, &body)?;
        let (lock, changed) = &*self.heard;
        let started = Instant::now();
        let mut heard = lock.lock().map_err(|_| RuntimeError::Poisoned)?;
        loop {
            if let Some(blobs) = heard.releases.remove(&generation) {
                debug_assert_eq!(blobs.len(), self.n_ranks as usize);
                return Ok(blobs);
            }
            let what = "barrier".to_string();
            if let Some(refused) = &heard.refused {
                return Err(RuntimeError::Config(format!("rank {rank}: the rendezvous refused it: {refused}")));
            }
            if let Some((peer, how)) = heard.failure.clone() {
                return Err(RuntimeError::PeerFailed { rank, what, at: at.into(), peer, how });
            }
            let waited = started.elapsed();
            if waited > timeout {
                drop(heard);
                let (waiting_for, first) = self.missing_at(generation);
                // The others hear of the rank they all wait for, not of this one's going.
                if let Some((peer, joined)) = first {
                    let how = match joined {
                        true => "did not reach the barrier within the timeout (stopped, hung or cut off?)",
                        false => "never joined the job (is it running, with this job's rendezvous and token?)",
                    };
                    self.report_failure(peer, how);
                }
                let (seconds, waits_on) = (waited.as_secs_f64(), first.map(|(peer, _)| peer));
                return Err(RuntimeError::Timeout { rank, what, at: at.into(), seconds, waiting_for, waits_on });
            }
            drop(heard);
            self.beat();
            heard = lock.lock().map_err(|_| RuntimeError::Poisoned)?;
            if heard.releases.contains_key(&generation) || heard.failure.is_some() || heard.refused.is_some() {
                continue;
            }
            heard = changed.wait_timeout(heard, BEAT_EVERY).map_err(|_| RuntimeError::Poisoned)?.0;
        }
    }
}
