//! The network proxy (NCCL's proxy thread): per rank, one thread owns the progress of its network (a `Carrier`: the
//! tcp transport's sockets, `tcp/wire.rs`) and moves the links' messages between it and the rings (`ring.rs`), so
//! network copies overlap the executor's reductions and copies, and the executor's link operations are a few atomic
//! operations on a ring. It also stands in for the executor of a device's connection records (`record.rs`).
//!
//! The proxy pumps while there is anything to move, spins a little (yielding the core) when there is not, then
//! sends every credit it owes and sleeps in `poll` on the carrier's descriptors and an eventfd (at most 10 ms, 1 ms
//! while it carries device records, which post without waking it); an executor that posts or consumes while it
//! sleeps wakes it through the eventfd (`Shared::notify`). What reaches a peer (sockets) and rings reach it through
//! a queue it looks at each round; what it finds wrong (a peer that broke its connection or the protocol, a frame
//! of another call parked on a socket) it publishes for the executors to report. A proxy that stops (it panicked)
//! is a fault naming this rank.
//!
//! A thread only pays where it has a core of its own: with fewer cores than twice the ranks on the host, the
//! executors pump the wire themselves when they post, wait or release (`Mode::Inline`, through the same wire and
//! rings: the wire's lock is taken only by the executor of the rank then, never contended). `COLLC_NET_PROXY`
//! chooses: `auto` (default), `1` (a thread), `0` (inline).

use super::frame::Frame;
use super::record;
use super::ring::Ring;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long an idle proxy spins (yielding) before it sleeps, and the longest it sleeps.
const SPIN: Duration = Duration::from_micros(200);
const SLEEP_MS: i32 = 10;
/// The same where it carries device records: a device posts without waking it, so it looks at least this often.
const DEVICE_SPIN: Duration = Duration::from_millis(2);
const DEVICE_SLEEP_MS: i32 = 1;
/// A proxy thread that has not begun a round for this long (it sleeps at most `SLEEP_MS` between rounds) has fallen
/// behind for good: stuck, or starved of a core.
const STALLED: Duration = Duration::from_secs(5);
/// Executors look at the proxy at least this often (milliseconds) while they wait; a longer gap restarts their watch.
const LOOK_GAP_MS: u64 = 1000;

/// Who moves a rank's data between its rings and its sockets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A proxy thread.
    Thread,
    /// The executor, when it posts, waits or releases.
    Inline,
}

impl Mode {
    /// `COLLC_NET_PROXY` (`auto`, `1`, `0`); `auto`: a thread where this host has at least two cores per rank on it.
    pub fn from_env(local_ranks: u32) -> Result<Mode, String> {
        Mode::parse(std::env::var("COLLC_NET_PROXY").ok().as_deref(), local_ranks)
    }

    /// A value of `COLLC_NET_PROXY` (`None`: unset) for `local_ranks` ranks on this host.
    fn parse(value: Option<&str>, local_ranks: u32) -> Result<Mode, String> {
        match value {
            Some("1") => Ok(Mode::Thread),
            Some("0") => Ok(Mode::Inline),
            None | Some("") | Some("auto") => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
                Ok(if cores >= 2 * local_ranks.max(1) { Mode::Thread } else { Mode::Inline })
            }
            Some(other) => Err(format!(
                "COLLC_NET_PROXY=`{other}`: 1 runs a network proxy thread per rank, 0 lets the executor move the \
                 data, auto (the default) runs the thread where the host has two cores per rank"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Thread => "proxy thread",
            Mode::Inline => "inline",
        }
    }
}

/// A fault on the data plane: the peer, and what happened.
pub(crate) type Fault = (u32, String);

/// What a proxy pumps: one rank's network connections and the rings registered with them.
pub(crate) trait Carrier: Send + 'static {
    /// What reaches the carrier for a peer (its sockets; its queue pair).
    type Peer: Send;
    fn rank(&self) -> u32;
    fn add_peer(&mut self, peer: u32, what: Self::Peer);
    /// Takes `ring` on (its peer added before).
    fn register(&mut self, ring: Arc<Ring>);
    /// One round: moves what can move without waiting; every credit owed when `idle` (the proxy is about to wait).
    /// Whether anything moved.
    fn pump(&mut self, idle: bool) -> bool;
    /// Inline, after the executor posted on `ring`: its message out now.
    fn send_posted(&mut self, ring: &Ring);
    /// Inline, after the executor consumed a message: the credits owed for half a ring or more.
    fn send_credits(&mut self);
    /// Inline, `ring` was empty (or full, waiting for credits): what its peer sent, now.
    fn receive(&mut self, ring: &Ring);
    /// The descriptors to wait on and the events, for `poll`.
    fn poll_fds(&self, fds: &mut Vec<libc::pollfd>);
    /// Whether it must be polled rather than waited on (completion queues polled, no descriptor to wake on).
    fn busy_poll(&self) -> bool {
        false
    }
    /// The first fault found.
    fn fault(&self) -> Option<&Fault>;
    /// Frames waiting for a link this rank has not opened (a peer in another call): the peer and the frame.
    fn parked(&self) -> Vec<(u32, Frame)>;
}

/// What the executors hand the proxy: what reaches a peer, and rings to carry.
struct Pending<C: Carrier> {
    peers: Vec<(u32, C::Peer)>,
    rings: Vec<Arc<Ring>>,
}

impl<C: Carrier> Default for Pending<C> {
    fn default() -> Self {
        Pending { peers: Vec::new(), rings: Vec::new() }
    }
}

/// What the pumping side keeps between rounds (under the carrier's lock).
struct Round {
    /// Rings of device records, which each round looks at (`record::bridge`).
    records: Vec<Arc<Ring>>,
    /// The parked frames the executors were last told of.
    published_parked: Vec<(u32, Frame)>,
}

/// What a rank's executors and its proxy share.
pub(crate) struct Shared<C: Carrier> {
    rank: u32,
    pub mode: Mode,
    wire: Mutex<(C, Round)>,
    pending: Mutex<Pending<C>>,
    has_pending: AtomicBool,
    /// Hand-overs made (`add_*`) and taken, its frames re-read for the new rings and published.
    added: AtomicU64,
    taken: AtomicU64,
    fault: Mutex<Option<Fault>>,
    faulted: AtomicBool,
    parked: Mutex<Vec<(u32, Frame)>>,
    has_parked: AtomicBool,
    sleeping: AtomicBool,
    /// An executor is about to wait: the proxy sends every credit it owes at its next round, busy or not (a sender
    /// that waits for room while this rank waits for its next message would otherwise wait for the proxy's idling).
    flush: AtomicBool,
    stop: AtomicBool,
    alive: AtomicBool,
    wake: OwnedFd,
    /// When the proxy thread last began a round, in milliseconds since `born`.
    born: Instant,
    round_at: AtomicU64,
    /// The executors' watch on it: the round they last saw begin, since when (their clock), and when they last
    /// looked (a gap means they did not run either: a stopped process, not a stalled proxy).
    seen_round: AtomicU64,
    seen_since: AtomicU64,
    looked_at: AtomicU64,
}

impl<C: Carrier> Shared<C> {
    /// After the executor posted on `ring`: wakes the proxy thread if it sleeps (the post's `Release` store is
    /// ordered before); inline, puts the message on its socket now.
    #[inline]
    pub fn posted(&self, ring: &Ring) {
        match self.mode {
            Mode::Thread => self.notify(),
            Mode::Inline => self.inline(|wire| wire.send_posted(ring)),
        }
    }

    /// After the executor consumed a message: the proxy thread owes a credit (woken if it sleeps); inline, a credit
    /// goes out now if half the ring is free.
    #[inline]
    pub fn released(&self) {
        match self.mode {
            Mode::Thread => self.notify(),
            Mode::Inline => self.inline(|wire| wire.send_credits()),
        }
    }

    /// The executor found `ring` empty (or full): inline, it reads the ring's socket now. With a thread, nothing.
    #[inline]
    pub fn missed(&self, ring: &Ring) {
        if self.mode == Mode::Inline {
            self.inline(|wire| wire.receive(ring));
        }
    }

    #[inline]
    fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) {
            self.wake_now();
        }
    }

    /// Runs `work` on the wire for the executor (inline), after a whole round if something was handed over (its
    /// sockets read again for the new rings before the hand-over counts as taken), and publishes what it finds.
    fn inline(&self, work: impl FnOnce(&mut C)) {
        if let Ok(mut guard) = self.wire.try_lock() {
            if self.has_pending.load(Ordering::Acquire) {
                self.pump(&mut guard, false);
            }
            work(&mut guard.0);
            self.publish(&mut guard);
        }
    }

    /// The executor has nothing to do but wait. Inline, it moves everything it can, says all the room it has and,
    /// when `sleep`, sleeps until a socket is ready (at most a millisecond); with a thread, it asks the thread for
    /// every credit owed when about to sleep, and wakes it if it sleeps.
    pub fn progress(&self, sleep: bool) {
        if self.mode == Mode::Thread {
            if sleep && !self.flush.load(Ordering::Relaxed) {
                self.flush.store(true, Ordering::Release);
            }
            self.notify();
            return;
        }
        let Ok(mut wire) = self.wire.try_lock() else { return };
        if sleep && !self.pump(&mut wire, true) {
            let mut fds = Vec::new();
            wire.0.poll_fds(&mut fds);
            drop(wire);
            if fds.is_empty() {
                std::thread::sleep(Duration::from_micros(100));
            } else {
                // SAFETY: `fds` is a valid array of `fds.len()` pollfd structures for the call's duration.
                unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1) };
            }
            return;
        }
        self.pump(&mut wire, false);
    }

    fn wake_now(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to the eventfd this struct owns.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Hands the proxy what reaches `peer`.
    pub fn add_peer(&self, peer: u32, what: C::Peer) {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).peers.push((peer, what));
        self.added.fetch_add(1, Ordering::AcqRel);
        self.has_pending.store(true, Ordering::Release);
        self.wake_now();
    }

    /// Hands the proxy a ring to carry (after its peer's sockets).
    pub fn add_ring(&self, ring: Arc<Ring>) {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).rings.push(ring);
        self.added.fetch_add(1, Ordering::AcqRel);
        self.has_pending.store(true, Ordering::Release);
        self.wake_now();
    }

    /// Waits until the proxy has taken everything handed to it and published what it then found parked: a plan's
    /// links are the proxy's before its first call (a frame for one of them is not taken for another call's).
    pub fn sync(&self) -> Result<(), Fault> {
        let added = self.added.load(Ordering::Acquire);
        while self.taken.load(Ordering::Acquire) < added {
            if let Some(fault) = self.fault() {
                return Err(fault);
            }
            if self.mode == Mode::Inline {
                let mut wire = self.wire.lock().unwrap_or_else(|p| p.into_inner());
                self.pump(&mut wire, false);
                continue;
            }
            if !self.alive.load(Ordering::Acquire) {
                return Err(self.fault().unwrap_or((self.rank, "lost its network proxy thread".into())));
            }
            self.wake_now();
            std::thread::yield_now();
        }
        Ok(())
    }

    /// The fault the proxy found, if any; a proxy thread that stopped, or that the executors watching it saw begin
    /// no round for `STALLED` while they ran, is one naming this rank.
    pub fn fault(&self) -> Option<Fault> {
        if self.faulted.load(Ordering::Acquire) {
            return self.fault.lock().unwrap_or_else(|p| p.into_inner()).clone();
        }
        if self.mode == Mode::Inline {
            return None;
        }
        if !self.alive.load(Ordering::Acquire) {
            return Some((self.rank, "lost its network proxy thread (it stopped: see its error)".into()));
        }
        let now = self.born.elapsed().as_millis() as u64;
        let round = self.round_at.load(Ordering::Acquire);
        let gap = now.saturating_sub(self.looked_at.swap(now, Ordering::AcqRel));
        if round != self.seen_round.swap(round, Ordering::AcqRel) || gap > LOOK_GAP_MS {
            self.seen_since.store(now, Ordering::Release);
            return None;
        }
        stalled(now, self.seen_since.load(Ordering::Acquire)).map(|behind| {
            let how = format!(
                "has a network proxy thread that has not run for {:.1} s (stuck, or starved of a core: \
                 COLLC_NET_PROXY=0 moves the data without it)",
                behind.as_secs_f64()
            );
            (self.rank, how)
        })
    }

    /// A frame of the call numbered `seq` parked on a socket (its peer is in that call with another plan).
    pub fn parked_in(&self, seq: u64) -> Option<(u32, Frame)> {
        if !self.has_parked.load(Ordering::Acquire) {
            return None;
        }
        let parked = self.parked.lock().unwrap_or_else(|p| p.into_inner());
        parked.iter().find(|(_, f)| f.seq == seq).copied()
    }

    /// One round: takes what was handed over, moves what can move (every credit owed when `idle`), publishes faults
    /// and parked frames (so the hand-overs count as taken only after). Whether anything moved.
    fn pump(&self, wire: &mut MutexGuard<'_, (C, Round)>, idle: bool) -> bool {
        let took = self.take_pending(wire);
        let (carrier, round) = &mut **wire;
        let mut moved = false;
        for ring in &round.records {
            moved |= record::bridge(ring);
        }
        moved |= carrier.pump(idle);
        for ring in &round.records {
            moved |= record::bridge(ring);
        }
        self.publish(wire);
        if let Some(added) = took {
            self.taken.store(added, Ordering::Release);
        }
        moved
    }

    /// Puts what was handed over into the wire; the hand-overs it took, if any.
    fn take_pending(&self, wire: &mut (C, Round)) -> Option<u64> {
        // A load first: the executor's every inline step passes here, and a swap would be a locked instruction.
        if !self.has_pending.load(Ordering::Acquire) || !self.has_pending.swap(false, Ordering::AcqRel) {
            return None;
        }
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let took = self.added.load(Ordering::Acquire);
        let pending = std::mem::take(&mut *pending);
        for (peer, what) in pending.peers {
            wire.0.add_peer(peer, what);
        }
        for ring in pending.rings {
            if ring.record.is_some() {
                wire.1.records.push(ring.clone());
            }
            wire.0.register(ring);
        }
        Some(took)
    }

    /// Tells the executors of a new fault, and of the frames parked on sockets when they change.
    fn publish(&self, wire: &mut (C, Round)) {
        let (carrier, round) = wire;
        if let Some(fault) = carrier.fault().filter(|_| !self.faulted.load(Ordering::Relaxed)) {
            *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = Some(fault.clone());
            self.faulted.store(true, Ordering::Release);
        }
        // No allocation while nothing is parked (the usual case).
        let parked = carrier.parked();
        if parked != round.published_parked {
            self.has_parked.store(!parked.is_empty(), Ordering::Release);
            *self.parked.lock().unwrap_or_else(|p| p.into_inner()) = parked.clone();
            round.published_parked = parked;
        }
    }
}

/// A rank's proxy: its thread, or the carrier its executor pumps; stops when dropped, and its thread is joined then,
/// so the rings it held (a device's records among them, freed through the driver) go before the process does.
pub(crate) struct Proxy<C: Carrier> {
    pub shared: Arc<Shared<C>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<C: Carrier> Proxy<C> {
    pub fn start(wire: C, mode: Mode) -> std::io::Result<Proxy<C>> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let rank = wire.rank();
        let round = Round { records: Vec::new(), published_parked: Vec::new() };
        let shared = Arc::new(Shared {
            rank,
            mode,
            wire: Mutex::new((wire, round)),
            pending: Mutex::new(Pending::default()),
            has_pending: AtomicBool::new(false),
            added: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            fault: Mutex::new(None),
            faulted: AtomicBool::new(false),
            parked: Mutex::new(Vec::new()),
            has_parked: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            flush: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            alive: AtomicBool::new(true),
            // SAFETY: `fd` is a new descriptor this struct now owns.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
            born: Instant::now(),
            round_at: AtomicU64::new(0),
            seen_round: AtomicU64::new(0),
            seen_since: AtomicU64::new(0),
            looked_at: AtomicU64::new(0),
        });
        let thread = match mode {
            Mode::Thread => {
                let theirs = shared.clone();
                Some(std::thread::Builder::new().name(format!("collc proxy {rank}")).spawn(move || run(&theirs))?)
            }
            Mode::Inline => None,
        };
        Ok(Proxy { shared, thread })
    }
}

impl<C: Carrier> Drop for Proxy<C> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake_now();
        // It looks at `stop` every round (its waits are bounded); not from itself.
        if let Some(thread) = self.thread.take().filter(|t| t.thread().id() != std::thread::current().id()) {
            let _ = thread.join();
        }
    }
}

/// Marks the proxy gone when its thread ends, however it ends.
struct Alive<'a, C: Carrier>(&'a Shared<C>);

impl<C: Carrier> Drop for Alive<'_, C> {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::Release);
    }
}

fn run<C: Carrier>(shared: &Shared<C>) {
    let _alive = Alive(shared);
    let mut idle_since: Option<Instant> = None;
    let mut fds: Vec<libc::pollfd> = Vec::new();
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        shared.round_at.store(shared.born.elapsed().as_millis() as u64, Ordering::Release);
        let mut wire = shared.wire.lock().unwrap_or_else(|p| p.into_inner());
        let flush = shared.flush.load(Ordering::Relaxed) && shared.flush.swap(false, Ordering::AcqRel);
        if shared.pump(&mut wire, flush) {
            idle_since = None;
            continue;
        }
        let since = *idle_since.get_or_insert_with(Instant::now);
        let polled = !wire.1.records.is_empty() || wire.0.busy_poll();
        let (spin, sleep_ms) = if polled { (DEVICE_SPIN, DEVICE_SLEEP_MS) } else { (SPIN, SLEEP_MS) };
        if since.elapsed() < spin {
            drop(wire);
            std::thread::yield_now();
            continue;
        }
        // About to sleep: every sender hears of all the room this rank has, then a last look after saying so.
        shared.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if shared.pump(&mut wire, true) || shared.has_pending.load(Ordering::Acquire) {
            shared.sleeping.store(false, Ordering::Relaxed);
            idle_since = None;
            continue;
        }
        fds.clear();
        fds.push(libc::pollfd { fd: shared.wake.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        wire.0.poll_fds(&mut fds);
        drop(wire);
        if !shared.stop.load(Ordering::Acquire) {
            // SAFETY: `fds` is a valid array of `fds.len()` pollfd structures for the call's duration.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, sleep_ms) };
        }
        if fds[0].revents != 0 {
            let mut count = 0u64;
            // SAFETY: reading 8 bytes into a live u64 from the eventfd (non-blocking).
            unsafe { libc::read(shared.wake.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
        }
        shared.sleeping.store(false, Ordering::Relaxed);
        idle_since = None;
    }
}

/// How far behind a proxy thread whose rounds the executors have seen stand still since `since` is at `now`
/// (milliseconds), if by `STALLED` or more.
fn stalled(now: u64, since: u64) -> Option<Duration> {
    let behind = Duration::from_millis(now.saturating_sub(since));
    (behind >= STALLED).then_some(behind)
}

#[cfg(test)]
mod tests {
    use super::{stalled, Mode, STALLED};

    /// A proxy is behind only once its last round is `STALLED` old; `COLLC_NET_PROXY` says the mode, and a value it
    /// does not know is an error naming it.
    #[test]
    fn a_proxy_falls_behind_only_after_the_stall_window_and_the_mode_is_read_as_said() {
        let window = STALLED.as_millis() as u64;
        assert_eq!(stalled(window - 1, 0), None);
        assert_eq!(stalled(10 + window, 10), Some(STALLED));
        assert_eq!(stalled(5, 10), None);
        assert_eq!(Mode::parse(Some("1"), 64), Ok(Mode::Thread));
        assert_eq!(Mode::parse(Some("0"), 1), Ok(Mode::Inline));
        assert!(Mode::parse(Some("yes"), 1).is_err_and(|e| e.contains("COLLC_NET_PROXY=`yes`")));
        // auto: a thread with two cores per rank on the host, else inline (as many ranks as cores never has two).
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        assert_eq!(Mode::parse(Some("auto"), cores), Ok(Mode::Inline));
        let half = (cores / 2).max(1);
        assert_eq!(Mode::parse(None, half), Ok(if cores >= 2 * half { Mode::Thread } else { Mode::Inline }));
    }
}
