//! What executors and transports share (DESIGN.md 5a): the bottom of the runtime's seams, below `exec/` (which
//! drives links) and `transport/` (which implements them and re-exports these beside `Backend` and `Fabric`).
//!
//! - `Link`: one end of a connection, the message slots an executor reserves and posts (sending) or peeks and
//!   releases (receiving). Executors are generic over it, so each transport's hot loop is compiled for its link.
//! - `Bootstrap`: what the ranks of a communicator do together outside the schedule: join, barriers, small
//!   all-gathers, the call each rank is in and where its plans' schedules came from (mismatch reports), aborts and
//!   failure notices naming the rank.
//! - `Stamp`, `CallInfo`, `LinkEnd`, `SLOTS`: what a message, a call and a connection are on every transport.

use crate::error::RuntimeError;
use collc_compiler::sched::Placement;
use collc_compiler::Collective;
use collc_kernels::{DataType, ReduceOp};
use std::time::Duration;

/// Messages in flight per connection, on every transport (the device records too): the compiler's `CHANNEL_SLOTS`
/// (NCCL's NCCL_STEPS), the slot count the verifier proves schedules deadlock-free with unless told otherwise. A
/// plan is refused for a schedule proved with more (`RuntimeError::Slots`).
pub const SLOTS: u64 = collc_compiler::CHANNEL_SLOTS as u64;

/// The call a message belongs to: its sequence number and its fingerprint (`Plan::fingerprint`: the call's shape
/// and the hash of the schedule it runs).
/// A receiver compares it with its own before it reads the message, so mismatched calls are caught, not misread.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Stamp {
    pub seq: u64,
    pub fingerprint: u64,
}

/// One end of a connection, as an executor drives it. The sender reserves the next slot, writes the message into
/// it and posts it; the receiver peeks at the next message, reads it in place and releases it. None of these may
/// block: `None` means "not yet", and the executor tries another instruction. The associated functions act on all
/// of a plan's links at once, for transports that move data in the background of these calls (sockets); shared
/// memory needs none of them, and their defaults compile to nothing.
pub(crate) trait Link: Send + Sized {
    /// Sender: the data area of the next message (room for the connection's largest), once there is room.
    fn reserve(&mut self) -> Option<*mut u8>;
    /// Sender: publishes the first `len` bytes written into the area `reserve` returned.
    fn post(&mut self, stamp: Stamp, len: usize);
    /// Receiver: the next message's stamp and data, once it has arrived whole.
    fn peek(&mut self) -> Option<(Stamp, *const u8)>;
    /// Receiver: frees the message `peek` returned.
    fn release(&mut self);
    /// Sender: how the receiver can find `len` bytes of this rank's at `ptr` in place (an address, or an offset in
    /// this process's arena), so that a message may carry that in place of their bytes (single copy: the receiver
    /// reads them where they are); `None` where it cannot.
    fn reference(&self, ptr: *const u8, len: usize) -> Option<u64> {
        let _ = (ptr, len);
        None
    }
    /// Receiver: where the chunk a message's reference (from the sender's `reference`) names is in this process.
    fn dereference(&self, token: u64) -> *const u8 {
        let _ = token;
        unreachable!("a link that carries no references has none to resolve")
    }
    /// Sender: publishes a message of `refs` references written into the area `reserve` returned, in place of its
    /// bytes; what they name stays as it is until the receiver releases the message, which `flushed` waits for.
    /// Only with references `reference` gave.
    fn post_refs(&mut self, stamp: Stamp, refs: usize) {
        let _ = (stamp, refs);
        unreachable!("a link that does not share memory carries no addresses")
    }
    /// Sender: whether a message it carried by reference has not been released yet (the receiver may still read
    /// this rank's memory).
    fn refs_outstanding(&self) -> bool {
        false
    }
    /// Receiver: how many references the message `peek` returned carries in place of its bytes (0: its bytes).
    fn peeked_refs(&self) -> usize {
        0
    }
    /// Receiver: the call the sender of the message `peek` returned was in, when the link carries it.
    fn sender_call(&self) -> Option<CallInfo> {
        None
    }
    /// A call starts on these links.
    fn start(_links: &mut [Self], _call: &CallInfo) {}
    /// Moves what is in flight; called when a round of the executor found nothing to run. `ours` is this call's
    /// stamp, for telling a peer in another call; `block`: the executor has spun long enough, and the transport may
    /// sleep (briefly) until something arrives.
    fn progress(_links: &mut [Self], _ours: Stamp, _block: bool) -> Result<(), LinkFault> {
        Ok(())
    }
    /// Whether everything posted has left this rank, and every message carried by reference has been released (a
    /// call returns only then).
    fn flushed(_links: &mut [Self]) -> bool {
        true
    }
    /// The connection's ring of slots as plain memory both ends map, for an executor that compiles a plan into
    /// native code (`exec/jit.rs`); `None` where messages move any other way (sockets, verbs).
    fn ring(&mut self) -> Option<Ring> {
        None
    }
}

/// A link's message ring as memory, for compiled plans: the counters, the slots and a slot's layout. The sender
/// reserves slot `posted % SLOTS` once `posted - consumed < SLOTS`, writes the data, the references count and the
/// stamp, then stores `posted + 1` into the slot's ready word (release) and bumps `posted`; the receiver reads slot
/// `consumed % SLOTS` once its ready word is `consumed + 1` (acquire), checks the stamp, and frees it by storing
/// `consumed + 1` (release). The pointers stay valid as long as the link.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ring {
    /// Messages posted, written by the sender only; messages consumed, written by the receiver only.
    pub posted: *mut u64,
    pub consumed: *mut u64,
    /// Slot 0; slot `k` is `stride * k` bytes on.
    pub slots: *mut u8,
    pub stride: usize,
    /// Where in a slot its ready word, its count of references, its stamp (`seq`, then `fingerprint`) and its data
    /// are.
    pub ready_at: i32,
    pub refs_at: i32,
    pub stamp_at: i32,
    pub data_at: i32,
    /// Sender: its last look at `consumed` (refreshed only when the ring seems full), and the number its messages
    /// carried by reference run up to (the call ends once the receiver has consumed that far).
    pub known_consumed: *mut u64,
    pub refs_until: *mut u64,
    /// Receiver: what a reference plus this is in this process (0: references are addresses).
    pub deref_base: u64,
}

/// What went wrong on a link, found while moving data.
#[derive(Debug)]
pub(crate) enum LinkFault {
    /// A peer broke the connection or broke the protocol.
    Peer(u32, String),
    /// A peer is in another call than this rank: its stamp and, when known, its call.
    Mismatch { peer: u32, theirs: Stamp, call: Option<CallInfo> },
}

/// How a rank ended, as its peers see it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u32)]
pub(crate) enum Status {
    Absent = 0,
    Joined = 1,
    Left = 2,
    Failed = 3,
}

/// The call a rank is in, as its peers see it: for mismatch reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CallInfo {
    pub seq: u64,
    pub count: u64,
    /// collective << 24 | dtype << 16 | op << 8 | placement.
    pub kind: u32,
    pub root: u32,
    /// As the call's messages are stamped: two ranks in the same call with different fingerprints run different
    /// shapes or schedules, whether or not a message of it has arrived yet.
    pub fingerprint: u64,
}

impl CallInfo {
    /// No call yet.
    pub const NONE: CallInfo = CallInfo { seq: 0, count: 0, kind: 0, root: 0, fingerprint: 0 };
    pub const BYTES: usize = 32;

    /// Its bytes, as the tcp rendezvous relays a failed rank's call.
    pub fn to_bytes(self) -> [u8; CallInfo::BYTES] {
        let mut b = [0u8; CallInfo::BYTES];
        b[0..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..16].copy_from_slice(&self.count.to_le_bytes());
        b[16..20].copy_from_slice(&self.kind.to_le_bytes());
        b[20..24].copy_from_slice(&self.root.to_le_bytes());
        b[24..32].copy_from_slice(&self.fingerprint.to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8]) -> Option<CallInfo> {
        let b: &[u8; CallInfo::BYTES] = b.try_into().ok()?;
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Some(CallInfo { seq: u64_at(0), count: u64_at(8), kind: u32_at(16), root: u32_at(20), fingerprint: u64_at(24) })
    }
}

/// `allreduce float sum count 1000 root 0`: a call as peers publish it, for mismatch reports.
pub(crate) fn describe_kind(kind: u32, count: u64, root: u32) -> String {
    let collective = Collective::ALL.get((kind >> 24) as usize).map_or("?", |c| c.name());
    let dtype = DataType::ALL.get(((kind >> 16) & 0xff) as usize).map_or("?".into(), |d| d.to_string());
    // A premulsum's factor is its rank's own (peers may pass others): only its name is published.
    let op = match ((kind >> 8) & 0xff) as u8 {
        5 => "premulsum".to_string(),
        6 => "a user's operator".to_string(),
        code => ReduceOp::from_nccl_code(code).map_or("?".into(), |o| o.to_string()),
    };
    let placement = if kind & 0xff == Placement::InPlace as u32 { "in-place" } else { "out-of-place" };
    format!("{collective} {dtype} {op} count {count} root {root} {placement}")
}

/// The longest source a rank publishes for its peers' mismatch reports (`Bootstrap::publish_source`).
pub(crate) const SOURCE_BYTES: usize = 112;

/// `source` cut to `SOURCE_BYTES`, keeping its end (a path's file name and the schedule's hash).
pub(crate) fn clip_source(source: &str) -> &str {
    let mut start = source.len().saturating_sub(SOURCE_BYTES);
    while !source.is_char_boundary(start) {
        start += 1;
    }
    &source[start..]
}

/// What the ranks of a communicator do together outside the schedule. One per rank; `rank` is its own.
pub(crate) trait Bootstrap: Send + Sync {
    /// Enters the job as `rank`: fails when another process claims that rank, or the world sizes disagree.
    fn join(&self, rank: u32) -> Result<(), RuntimeError>;
    /// Records how `rank` ended; whether it was the last rank of the job to leave (who then removes what the job
    /// left behind).
    fn leave(&self, rank: u32, status: Status) -> bool;
    /// Marks the job failed, naming `rank` as the first to fail (later calls keep the first name).
    fn abort(&self, rank: u32);
    /// Whether the job can go on from this rank's point of view: `Err((peer, how))` names who failed and how.
    fn health(&self, peers: &[u32]) -> Result<(), (u32, String)>;
    /// Waits until every rank has reached barrier `generation`, failing on the timeout or a peer's failure.
    fn barrier(&self, rank: u32, generation: u64, timeout: Duration, at: &str) -> Result<(), RuntimeError>;
    /// Every rank's `blob` (at most `BLOB_BYTES`), in rank order; a collective: every rank calls it with the same
    /// `generation`, the next barrier's.
    fn all_gather(
        &self,
        rank: u32,
        blob: &[u8],
        generation: u64,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, RuntimeError>;
    /// Tells the peers which call this rank is in.
    fn publish_call(&self, rank: u32, call: CallInfo);
    /// Tells the peers where this rank's plan of `fingerprint` came from (`Plan::source`, clipped to
    /// `SOURCE_BYTES`), so that a mismatch report on another rank can name it. Called before the first call of a
    /// plan, and whenever this rank goes back to a plan another call used since.
    fn publish_source(&self, rank: u32, fingerprint: u64, source: &str);
    /// Where `rank`'s plan of `fingerprint` came from, once it has published it; where that travels (tcp), it may
    /// wait a moment for it.
    fn source_of(&self, rank: u32, fingerprint: u64) -> Option<String>;
    /// This rank stops because rank `peer` failed (`how`): where the bootstrap announces failures, that one is the
    /// failure the others hear of (unless another came first), not this rank's going.
    fn report_failure(&self, _peer: u32, _how: &str) {}
    /// After this rank timed out: the rank the job stopped at, which every rank waits for in the end (one that no
    /// longer checks in: stopped, hung, or busy outside its calls), where the bootstrap can tell (`waits_on`, the
    /// rank this one waited for, is preferred among several).
    fn stalled(&self, _waits_on: Option<u32>) -> Option<u32> {
        None
    }
    /// The call `rank` last published, as far as this rank knows it (`CallInfo::NONE` where it does not: over tcp,
    /// a peer's call is known once the rendezvous has announced it failed).
    fn call_of(&self, rank: u32) -> CallInfo;
}

/// The largest blob `Bootstrap::all_gather` carries: addresses, IPC handles, queue-pair numbers, reports.
pub(crate) const BLOB_BYTES: usize = 256;

/// Refuses a blob `Bootstrap::all_gather` cannot carry.
pub(crate) fn check_blob(blob: &[u8]) -> Result<(), RuntimeError> {
    if blob.len() > BLOB_BYTES {
        return Err(RuntimeError::Config(format!("an all-gather blob of {} bytes exceeds {BLOB_BYTES}", blob.len())));
    }
    Ok(())
}

/// One of the rank's connections: who sends, who receives, on which channel, and the bytes its slots hold (the
/// largest message it carries in the call, rounded up to a power of two, so calls of similar sizes share a link).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct LinkEnd {
    pub from: u32,
    pub to: u32,
    pub channel: u8,
    pub slot_bytes: usize,
}

#[cfg(test)]
mod tests {
    use super::{clip_source, CallInfo, SOURCE_BYTES};

    #[test]
    fn a_call_round_trips_through_its_bytes_and_a_long_source_keeps_its_end() {
        let call = CallInfo { seq: 3, count: 1 << 40, kind: 0x0102_0304, root: 7, fingerprint: 0xfeed_beef };
        assert_eq!(CallInfo::from_bytes(&call.to_bytes()), Some(call));
        assert_eq!(CallInfo::from_bytes(&call.to_bytes()[1..]), None);
        let long = format!("/très/{}/ring.sched (.sched file; schedule 0123456789abcdef)", "é".repeat(80));
        let clipped = clip_source(&long);
        assert!(clipped.len() <= SOURCE_BYTES && long.ends_with(clipped), "{clipped}");
        assert!(clipped.ends_with("ring.sched (.sched file; schedule 0123456789abcdef)"));
        assert_eq!(clip_source("ring.sched"), "ring.sched");
    }
}
