//! The control block every rank of a communicator maps: who has joined, a barrier, the call each rank is in and the
//! source of the plan it runs (for mismatch reports), and the abort flag that turns one rank's failure into an error
//! on every rank.

use super::segment::{Segment, Segments};
use crate::error::RuntimeError;
use crate::transport::{Bootstrap, CallInfo, Status, BLOB_BYTES, SOURCE_BYTES};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const MAGIC: u64 = 0x636f_6c6c_635f_6374; // "collc_ct"
/// How long `stalled` watches the ranks' health checks: a waiting rank checks in every few milliseconds.
const STALL_WINDOW: Duration = Duration::from_millis(300);
/// A rank's `call_seq` while it publishes a call.
const WRITING: u64 = u64::MAX;

#[repr(C, align(64))]
struct Header {
    magic: AtomicU64,
    n_ranks: AtomicU32,
    /// 0 while all is well; otherwise 1 + the rank that failed first, and in the high half 1 + the rank that timed
    /// out waiting for it when that one named it (`report_failure`), 0 when it failed itself.
    abort: AtomicU64,
    /// Ranks that have left; the last one out removes the job's segments.
    departed: AtomicU32,
}

/// One rank's public state, on its own cache lines.
#[repr(C, align(128))]
struct RankState {
    status: AtomicU32,
    pid: AtomicU32,
    /// 1 + the descriptor of the rank process's arena (`arena.rs`), which peers map through `/proc`; 0: none.
    arena_fd: AtomicU32,
    /// Counts the rank's health checks: a rank inside a call checks in while it waits, so one whose count stands
    /// still while others wait is the one they wait for (stopped, hung, or busy outside its calls).
    beat: AtomicU64,
    barrier: AtomicU64,
    /// The call's sequence number (0 before the first); `WRITING` while the call's other words are being written
    /// (a sequence lock, so a peer never pairs one call's number with another's fingerprint).
    call_seq: AtomicU64,
    call_count: AtomicU64,
    /// collective << 24 | dtype << 16 | op << 8 | placement.
    call_kind: AtomicU32,
    call_root: AtomicU32,
    call_fingerprint: AtomicU64,
    /// The fingerprint of the plan whose source `source` holds; 0 while it is being written.
    source_of: AtomicU64,
    source_len: AtomicU64,
    source: [AtomicU64; SOURCE_BYTES / 8],
}

/// One rank's blob of an all-gather: its length, then the bytes. Each rank has two, used by alternate barrier
/// generations: a rank writes the one of generation g + 2 only after barrier g + 1, which every rank reaches only
/// once it has read generation g's.
#[repr(C, align(64))]
struct Blob {
    len: AtomicU64,
    bytes: [u8; BLOB_BYTES],
}

pub(crate) struct Control {
    segment: Segment,
    n_ranks: u32,
    /// Bytes of the header and the rank states, after which the blobs start.
    states: usize,
    /// Whether peers are separate processes whose death `kill(pid, 0)` can see.
    processes: bool,
    /// The rank this control block's handle joined as (`u32::MAX` before it joins).
    me: AtomicU32,
}

impl Control {
    /// The process and arena descriptor of a rank that has joined, when it has an arena.
    pub fn arena_of(&self, rank: u32) -> Option<(u32, i32)> {
        let state = self.state(rank);
        let pid = state.pid.load(Ordering::Acquire);
        let fd = state.arena_fd.load(Ordering::Relaxed);
        (pid != 0 && fd != 0).then(|| (pid, fd as i32 - 1))
    }

    /// The ranks that have not reached barrier `generation`, for a timeout's message: `rank 2 (it never joined the
    /// job), rank 3`.
    fn missing(&self, generation: u64) -> String {
        let named: Vec<String> = (0..self.n_ranks)
            .filter(|&peer| self.state(peer).barrier.load(Ordering::Acquire) < generation)
            .map(|peer| match self.state(peer).status.load(Ordering::Acquire) == Status::Absent as u32 {
                true => format!("rank {peer} (it never joined the job: is it running, with this job's id?)"),
                false => format!("rank {peer}"),
            })
            .collect();
        named.join(", ")
    }

    pub fn open(segments: &dyn Segments, n_ranks: u32) -> Result<Control, RuntimeError> {
        let states = std::mem::size_of::<RankState>() * (n_ranks as usize + 1);
        let len = states + std::mem::size_of::<Blob>() * 2 * n_ranks as usize;
        let segment = segments.open("control", len)?;
        let processes = segments.transport().processes();
        let control = Control { segment, n_ranks, states, processes, me: AtomicU32::new(u32::MAX) };
        let header = control.header();
        match header.magic.compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => header.n_ranks.store(n_ranks, Ordering::Release),
            Err(MAGIC) => {}
            Err(other) => {
                return Err(RuntimeError::Config(format!("control block has magic {other:#x}: not a collc job")))
            }
        }
        // The creator may not have stored n_ranks yet; it does so right after the magic.
        let started = Instant::now();
        let seen = loop {
            let seen = header.n_ranks.load(Ordering::Acquire);
            if seen != 0 || started.elapsed() > Duration::from_secs(5) {
                break seen;
            }
            std::hint::spin_loop();
        };
        if seen != n_ranks {
            return Err(RuntimeError::Config(format!(
                "this rank was started with {n_ranks} ranks, the job has {seen}: all ranks need the same world size"
            )));
        }
        Ok(control)
    }

    fn me(&self) -> Option<u32> {
        Some(self.me.load(Ordering::Relaxed)).filter(|&me| me < self.n_ranks)
    }

    fn header(&self) -> &Header {
        // SAFETY: the segment holds a header followed by n_ranks states, zero-initialised, alive with `self`.
        unsafe { &*(self.segment.as_ptr() as *const Header) }
    }

    fn state(&self, rank: u32) -> &RankState {
        debug_assert!(rank < self.n_ranks);
        // SAFETY: as in `header`; rank < n_ranks.
        unsafe { &*(self.segment.as_ptr() as *const RankState).add(1 + rank as usize) }
    }

    /// Rank `rank`'s blob for barrier generation `generation`.
    fn blob(&self, rank: u32, generation: u64) -> *mut Blob {
        debug_assert!(rank < self.n_ranks);
        let index = 2 * rank as usize + (generation % 2) as usize;
        // SAFETY: the blobs follow the states, 2 per rank, inside the segment.
        unsafe { (self.segment.as_ptr().add(self.states) as *mut Blob).add(index) }
    }
}

impl Bootstrap for Control {
    fn join(&self, rank: u32) -> Result<(), RuntimeError> {
        self.me.store(rank, Ordering::Relaxed);
        let state = self.state(rank);
        let previous = state.status.swap(Status::Joined as u32, Ordering::AcqRel);
        if previous != Status::Absent as u32 && self.processes {
            return Err(RuntimeError::Config(format!(
                "rank {rank} joined this job twice: two processes claim it, or an earlier run with the same job id \
                 died without cleaning up (remove /dev/shm/collc-<job>-*, or give the job a new id)"
            )));
        }
        if self.processes {
            let fd = super::arena::arena().map_or(0, |arena| arena.fd() as u32 + 1);
            state.arena_fd.store(fd, Ordering::Relaxed);
        }
        state.pid.store(std::process::id(), Ordering::Release);
        Ok(())
    }

    /// Records how `rank` ended; returns whether it was the last rank of the job to leave.
    fn leave(&self, rank: u32, status: Status) -> bool {
        let previous = self.state(rank).status.swap(status as u32, Ordering::AcqRel);
        if status == Status::Failed {
            self.abort(rank);
        }
        let first_exit = previous == Status::Joined as u32;
        if !first_exit {
            return false;
        }
        if self.header().departed.fetch_add(1, Ordering::AcqRel) + 1 == self.n_ranks {
            return true;
        }
        // A rank process that died never leaves, nor does one that never joined a job that failed: the last one
        // alive removes what the job left. (Two leaving at once may both remove it, which is harmless.)
        let failed = self.header().abort.load(Ordering::Acquire) != 0;
        self.processes
            && (0..self.n_ranks).filter(|&r| r != rank).all(|r| {
                let state = self.state(r);
                let status = state.status.load(Ordering::Acquire);
                let pid = state.pid.load(Ordering::Acquire);
                status == Status::Left as u32
                    || status == Status::Failed as u32
                    || (pid != 0 && process_gone(pid))
                    || (failed && status == Status::Absent as u32)
            })
    }

    /// Marks the job failed, naming the first rank that failed; later calls keep the first name.
    fn abort(&self, rank: u32) {
        let _ = self.header().abort.compare_exchange(0, rank as u64 + 1, Ordering::AcqRel, Ordering::Acquire);
    }

    fn publish_call(&self, rank: u32, call: CallInfo) {
        let state = self.state(rank);
        state.call_seq.store(WRITING, Ordering::Relaxed);
        fence(Ordering::Release);
        state.call_count.store(call.count, Ordering::Relaxed);
        state.call_kind.store(call.kind, Ordering::Relaxed);
        state.call_root.store(call.root, Ordering::Relaxed);
        state.call_fingerprint.store(call.fingerprint, Ordering::Relaxed);
        state.call_seq.store(call.seq, Ordering::Release);
    }

    /// The failure every rank hears of is `peer`'s, named by this rank (which timed out waiting for it); `how` is
    /// the text the reports give, which the block cannot hold.
    fn report_failure(&self, peer: u32, _how: &str) {
        let reporter = self.me().map_or(0, |me| me as u64 + 1);
        let word = (peer as u64 + 1) | (reporter << 32);
        let _ = self.header().abort.compare_exchange(0, word, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The rank whose health checks stand still over `STALL_WINDOW` while this one keeps checking in (`waits_on` when
    /// it is one of them, else the lowest): every rank waiting in a call, or timed out and looking as this one is,
    /// checks in, so that one is not in a call at all.
    fn stalled(&self, waits_on: Option<u32>) -> Option<u32> {
        let me = self.me();
        let live = |rank: u32| {
            let state = self.state(rank);
            let pid = state.pid.load(Ordering::Acquire);
            state.status.load(Ordering::Acquire) == Status::Joined as u32
                && !(self.processes && pid != 0 && process_gone(pid))
        };
        let beats = || (0..self.n_ranks).map(|r| self.state(r).beat.load(Ordering::Acquire)).collect::<Vec<_>>();
        let before = beats();
        let started = Instant::now();
        while started.elapsed() < STALL_WINDOW {
            let _ = self.health(&[]);
            std::thread::sleep(Duration::from_millis(2));
        }
        let after = beats();
        let still: Vec<u32> = (0..self.n_ranks)
            .filter(|&r| Some(r) != me && live(r) && before[r as usize] == after[r as usize])
            .collect();
        match waits_on {
            Some(peer) if still.contains(&peer) => Some(peer),
            _ => still.first().copied(),
        }
    }

    fn call_of(&self, rank: u32) -> CallInfo {
        let state = self.state(rank);
        // A peer publishes a call in well under a microsecond: a few tries find it between two.
        for _ in 0..64 {
            let seq = state.call_seq.load(Ordering::Acquire);
            if seq == 0 {
                return CallInfo::NONE;
            }
            let call = CallInfo {
                seq,
                count: state.call_count.load(Ordering::Relaxed),
                kind: state.call_kind.load(Ordering::Relaxed),
                root: state.call_root.load(Ordering::Relaxed),
                fingerprint: state.call_fingerprint.load(Ordering::Relaxed),
            };
            fence(Ordering::Acquire);
            if seq != WRITING && state.call_seq.load(Ordering::Relaxed) == seq {
                return call;
            }
            std::thread::yield_now();
        }
        CallInfo::NONE
    }

    fn publish_source(&self, rank: u32, fingerprint: u64, source: &str) {
        let state = self.state(rank);
        let bytes = crate::transport::clip_source(source).as_bytes();
        state.source_of.store(0, Ordering::Relaxed);
        fence(Ordering::Release);
        for (word, chunk) in state.source.iter().zip(bytes.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            word.store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
        state.source_len.store(bytes.len() as u64, Ordering::Relaxed);
        state.source_of.store(fingerprint, Ordering::Release);
    }

    fn source_of(&self, rank: u32, fingerprint: u64) -> Option<String> {
        let state = self.state(rank);
        if fingerprint == 0 || state.source_of.load(Ordering::Acquire) != fingerprint {
            return None;
        }
        let len = (state.source_len.load(Ordering::Relaxed) as usize).min(SOURCE_BYTES);
        let bytes: Vec<u8> = state.source.iter().flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes()).collect();
        fence(Ordering::Acquire);
        // Rewritten meanwhile (the peer went on to another plan): what was read may be torn.
        if state.source_of.load(Ordering::Relaxed) != fingerprint {
            return None;
        }
        Some(String::from_utf8_lossy(&bytes[..len]).into_owned())
    }

    /// Whether the job can go on from this rank's point of view: `Err((peer, how))` names who failed and how.
    fn health(&self, peers: &[u32]) -> Result<(), (u32, String)> {
        if let Some(me) = self.me() {
            self.state(me).beat.fetch_add(1, Ordering::Relaxed);
        }
        let abort = self.header().abort.load(Ordering::Acquire);
        if abort != 0 {
            let (failed, reporter) = ((abort & 0xffff_ffff) as u32 - 1, (abort >> 32) as u32);
            return Err(match reporter {
                0 => (failed, "failed (see its error); this rank stops too".into()),
                r if self.state(failed).status.load(Ordering::Acquire) == Status::Absent as u32 => {
                    (failed, format!("never joined the job (rank {} timed out waiting for it)", r - 1))
                }
                r => (
                    failed,
                    format!(
                        "did not go on within the timeout (rank {} timed out waiting for it: stopped or hung?)",
                        r - 1
                    ),
                ),
            });
        }
        for &peer in peers {
            let state = self.state(peer);
            // A rank that left cleanly has finished every call it was part of; only a failure or a death counts.
            match state.status.load(Ordering::Acquire) {
                s if s == Status::Failed as u32 => return Err((peer, "failed (see its error)".into())),
                s if s == Status::Left as u32 => continue,
                _ => {}
            }
            let pid = state.pid.load(Ordering::Acquire);
            if self.processes && pid != 0 && process_gone(pid) {
                return Err((peer, format!("died (process {pid} is gone)")));
            }
        }
        Ok(())
    }

    /// Waits until every rank has reached barrier `generation`, failing on the timeout or a peer's failure.
    fn barrier(&self, rank: u32, generation: u64, timeout: Duration, at: &str) -> Result<(), RuntimeError> {
        self.state(rank).barrier.store(generation, Ordering::Release);
        let everyone: Vec<u32> = (0..self.n_ranks).collect();
        let mut wait = crate::wait::Backoff::new(timeout, crate::wait::SPINS);
        for peer in 0..self.n_ranks {
            while self.state(peer).barrier.load(Ordering::Acquire) < generation {
                wait.idle(|| self.health(&everyone)).map_err(|fault| {
                    let error =
                        fault.into_error((rank, "barrier".into(), at.into()), self.missing(generation), Some(peer));
                    // The others hear of the rank they all wait for, not of this one's going (as over tcp).
                    if matches!(error, RuntimeError::Timeout { .. }) {
                        self.report_failure(peer, "");
                    }
                    error
                })?;
            }
            wait.reset();
        }
        Ok(())
    }

    fn all_gather(
        &self,
        rank: u32,
        blob: &[u8],
        generation: u64,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, RuntimeError> {
        crate::transport::check_blob(blob)?;
        let mine = self.blob(rank, generation);
        // SAFETY: this rank's blob of this generation: no other rank writes it, and none reads it before the barrier.
        unsafe {
            std::ptr::copy_nonoverlapping(blob.as_ptr(), std::ptr::addr_of_mut!((*mine).bytes).cast(), blob.len());
            (*mine).len.store(blob.len() as u64, Ordering::Release);
        }
        self.barrier(rank, generation, timeout, "all-gather")?;
        let read = |peer: u32| {
            let theirs = self.blob(peer, generation);
            // SAFETY: written before `peer` reached the barrier, and not again before every rank passes the next.
            unsafe {
                let len = ((*theirs).len.load(Ordering::Acquire) as usize).min(BLOB_BYTES);
                std::slice::from_raw_parts(std::ptr::addr_of!((*theirs).bytes).cast::<u8>(), len).to_vec()
            }
        };
        Ok((0..self.n_ranks).map(read).collect())
    }
}

/// Whether process `pid` no longer runs: gone, or dead and not yet reaped by its parent (a zombie, which `kill(pid,
/// 0)` still finds: a launcher that reaps its children late would otherwise leave the peers to their timeout).
fn process_gone(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid as i32, 0) != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) }
    {
        return true;
    }
    // `/proc/PID/stat`: `pid (comm) state ...`, the state after the last `)` (comm may hold one).
    std::fs::read(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after = stat.iter().rposition(|&b| b == b')')?;
            stat.get(after + 2).copied()
        })
        .is_some_and(|state| state == b'Z' || state == b'X')
}
