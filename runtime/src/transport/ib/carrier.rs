//! `Verbs`, the `Carrier` the ib transport's network proxy pumps (NCCL's net_ib): a link's message goes out as one
//! RDMA write of its 64-byte frame header (inline) into the receiver's header slot and one RDMA write with immediate
//! of its body into the receiver's message slot (the immediate names the receiver's link); the receiver's completion
//! says a message arrived whole (RC delivers in order); its consumption goes back as an RDMA write of its count into
//! the sender's credit word.

use super::verbs::{Device, Mr, Qp, INLINE};
use crate::transport::net::frame::{self, Frame};
use crate::transport::net::proxy::{Carrier, Fault};
use crate::transport::net::ring::{Ring, SLOTS_U};
use crate::transport::{LinkEnd, SLOTS};
use ibverbs_sys as ffi;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Completions polled at a time.
const POLL: usize = 32;
/// The work request id of a credit's write (a message's is its link and number).
const CREDIT: u64 = u64::MAX;

/// Where a link's other end is: the receiver's message slots and header slots (for the sender), or the sender's
/// credit word (for the receiver), and the other end's link number (a sender's immediate names the receiver's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Remote {
    pub slots: u64,
    pub slots_rkey: u32,
    pub words: u64,
    pub words_rkey: u32,
    pub index: u32,
}

/// A link's registered memory: its ring's slots, and its words (a receiver's header slots, `SLOTS` frame headers;
/// a sender's credit word).
pub(crate) struct LinkMemory {
    pub slots: Mr,
    pub words: Mr,
    /// Written by the peer's RDMA writes: read as atomics.
    storage: Box<[AtomicU64]>,
}

impl LinkMemory {
    /// The ring's slots registered (from their dma-buf where they are a GPU's memory), and its words.
    pub fn new(device: &Arc<Device>, ring: &Ring, receiving: bool) -> Result<LinkMemory, String> {
        use std::os::fd::AsFd;
        let len = SLOTS_U * ring.end.slot_bytes;
        let slots = match ring.record.as_ref().and_then(|r| r.device_slots.as_ref()) {
            Some(d) => device.register_dma_buf(d.dma_buf.as_fd(), d.offset, ring.slot(0) as u64, len, receiving)?,
            None => device.register(ring.slot(0), len, receiving)?,
        };
        let words = if receiving { SLOTS_U * frame::HEADER / 8 } else { 1 };
        let storage: Box<[AtomicU64]> = (0..words).map(|_| AtomicU64::new(0)).collect();
        let words = device.register(storage.as_ptr() as *mut u8, storage.len() * 8, true)?;
        Ok(LinkMemory { slots, words, storage })
    }

    fn word(&self, i: usize) -> u64 {
        let value = self.storage[i].load(Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Acquire);
        value
    }
}

/// A link as the carrier keeps it.
struct LinkState {
    ring: Arc<Ring>,
    memory: LinkMemory,
    remote: Remote,
    sending: bool,
    /// Its queue pair (in `Verbs::qps`).
    qp: usize,
    /// Whether a small message may go inline (the CPU copies it from the slot: not from a GPU's memory).
    inline: bool,
    /// Sender: messages written so far. Receiver: the consumed count last written back.
    queued: u64,
    reported: u64,
}

/// A link's ring by its end and lane (a device rank's channel has a ring per lane).
pub(crate) type RingKey = (LinkEnd, u16);

/// What the fabric hands the carrier for a link before its ring: its memory, its other end, its number and the
/// number of the queue pair that carries it.
pub(crate) type Setups = Arc<Mutex<HashMap<RingKey, (LinkMemory, Remote, u32, u32)>>>;

/// The ib transport's `Carrier`: a rank's queue pairs (one per peer, or one per link: `COLLC_IB_QPS`) and its
/// links.
pub(crate) struct Verbs {
    rank: u32,
    job: u64,
    device: Arc<Device>,
    qps: Vec<Qp>,
    /// By queue pair number: the peer and the queue pair's place in `qps`.
    by_qpn: HashMap<u32, (u32, usize)>,
    links: Vec<LinkState>,
    /// By the index a sender's immediate names (the receiving link's number here).
    by_index: HashMap<u32, usize>,
    /// The sending links, by their end and lane (an inline post finds its link there).
    by_end: HashMap<RingKey, usize>,
    setups: Setups,
    /// Messages that arrived for a link this rank's proxy has not taken on yet (a peer already in the call this
    /// rank is preparing: its registration, all-gathered, let the peer write): the peer, link number and length, in
    /// order, taken when the link is.
    early: Vec<(u32, u32, usize)>,
    fault: Option<Fault>,
}

impl Verbs {
    pub fn new(rank: u32, job: u64, device: Arc<Device>, setups: Setups) -> Verbs {
        Verbs {
            rank,
            job,
            device,
            qps: Vec::new(),
            by_qpn: HashMap::new(),
            links: Vec::new(),
            by_index: HashMap::new(),
            by_end: HashMap::new(),
            setups,
            early: Vec::new(),
            fault: None,
        }
    }

    fn fail(&mut self, peer: u32, how: String) {
        self.fault.get_or_insert((peer, how));
    }

    /// Completions: arrived messages (a receive with the link's number), sent messages, and errors.
    fn poll(&mut self) -> bool {
        let mut wcs = [ffi::ibv_wc::default(); POLL];
        // SAFETY: the device's completion queue, `POLL` entries (ibv_poll_cq is inline in verbs.h).
        let n =
            unsafe { (*self.device.ctx).ops.poll_cq.expect("poll_cq")(self.device.cq, POLL as i32, wcs.as_mut_ptr()) };
        if n < 0 {
            self.fail(self.rank, "polling its completion queue failed".into());
            return false;
        }
        for wc in &wcs[..n as usize] {
            let (peer, qp) = self.by_qpn.get(&wc.qp_num).copied().unwrap_or((self.rank, usize::MAX));
            if let Some((status, vendor)) = wc.error() {
                if status == ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                    // Flushed: this rank's queue pair went to the error state (a cause reported first wins).
                    let how =
                        format!("has its queue pair with rank {peer} in the error state (its work requests flushed)");
                    self.fail(self.rank, how);
                } else {
                    let what = describe(status);
                    let how = format!(
                        "did not complete an RDMA write with this rank: {what} (status {status}, vendor error {vendor:#x})"
                    );
                    self.fail(peer, how);
                }
                continue;
            }
            if wc.opcode() == ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM {
                let index = u32::from_be(wc.imm_data().unwrap_or(0));
                self.arrived(peer, index, wc.len());
                if let Some(qp) = self.qps.get(qp) {
                    if let Err(e) = qp.post_recv() {
                        self.fail(self.rank, e);
                    }
                }
            } else if wc.wr_id() != CREDIT {
                let (link, message) = ((wc.wr_id() >> 40) as usize, wc.wr_id() & ((1 << 40) - 1));
                if let Some(state) = self.links.get(link) {
                    state.ring.sent.fetch_max(message + 1, Ordering::Release);
                }
            }
        }
        n > 0
    }

    /// A message arrived whole on this rank's link number `index`, from `peer`.
    fn arrived(&mut self, peer: u32, index: u32, len: usize) {
        let Some(&link) = self.by_index.get(&index) else {
            self.early.push((peer, index, len));
            return;
        };
        let state = &self.links[link];
        let ring = &state.ring;
        let message = ring.received.load(Ordering::Relaxed);
        if message - ring.consumed.load(Ordering::Acquire) >= SLOTS {
            return self
                .fail(peer, format!("wrote more than {SLOTS} messages ahead of this rank (beyond its credits)"));
        }
        let at = (message % SLOTS) as usize * frame::HEADER / 8;
        let mut header = [0u8; frame::HEADER];
        for (w, bytes) in header.chunks_exact_mut(8).enumerate() {
            bytes.copy_from_slice(&state.memory.word(at + w).to_le_bytes());
        }
        match Frame::decode(&header) {
            Ok(frame) if frame.job == self.job && frame.len as usize == len && len <= ring.end.slot_bytes => {
                ring.set_arrived(message, frame);
                ring.received.store(message + 1, Ordering::Release);
            }
            Ok(frame) => {
                self.fail(peer, format!("sent a message whose header does not match it ({frame:?}, {len} bytes)"))
            }
            Err(e) => self.fail(peer, format!("sent a bad frame header: {e}")),
        }
    }

    /// Writes what the executors posted.
    fn send_posted_all(&mut self) -> bool {
        let mut moved = false;
        for link in 0..self.links.len() {
            moved |= self.send_link(link);
        }
        moved
    }

    fn send_link(&mut self, link: usize) -> bool {
        let state = &self.links[link];
        if !state.sending {
            return false;
        }
        let posted = state.ring.posted.load(Ordering::Acquire);
        let mut moved = false;
        while self.links[link].queued < posted {
            let state = &self.links[link];
            let message = state.queued;
            let qp = &self.qps[state.qp];
            let meta = state.ring.meta(message);
            let end = state.ring.end;
            let header = Frame::data(
                (end.channel, state.ring.lane),
                end.slot_bytes as u32,
                meta.len as u32,
                meta.stamp,
                self.job,
                meta.call,
            )
            .encode();
            let slot = message % SLOTS;
            let remote = state.remote;
            let to_header = remote.words + slot * frame::HEADER as u64;
            let to_slot = remote.slots + slot * end.slot_bytes as u64;
            let wr_id = ((link as u64) << 40) | message;
            let written = qp
                .write(header.as_ptr(), frame::HEADER, None, to_header, remote.words_rkey, None, 0, false)
                .and_then(|()| {
                    // A small body goes inline too (copied into the request: no DMA read of the slot).
                    let lkey = (meta.len > INLINE || !state.inline).then(|| state.memory.slots.lkey());
                    qp.write(
                        state.ring.slot(message),
                        meta.len,
                        lkey,
                        to_slot,
                        remote.slots_rkey,
                        Some(remote.index),
                        wr_id,
                        true,
                    )
                });
            if let Err(e) = written {
                let peer = state.ring.peer;
                self.fail(peer, format!("could not be written to ({})", std::io::Error::from_raw_os_error(e)));
                return moved;
            }
            self.links[link].queued += 1;
            moved = true;
        }
        moved
    }

    /// Credits: the senders' words read into their rings; the receivers' consumption written back (half a ring,
    /// or any when `all`).
    fn credits(&mut self, all: bool) -> bool {
        let mut moved = false;
        for link in 0..self.links.len() {
            let state = &self.links[link];
            if state.sending {
                let credited = state.memory.word(0);
                if credited > state.ring.credited.load(Ordering::Relaxed) && credited <= state.queued {
                    state.ring.credited.fetch_max(credited, Ordering::Release);
                    moved = true;
                }
                continue;
            }
            let consumed = state.ring.consumed.load(Ordering::Acquire);
            let owed = consumed - state.reported;
            if owed == 0 || (!all && owed < SLOTS / 2) {
                continue;
            }
            let qp = &self.qps[state.qp];
            let remote = state.remote;
            let word = consumed.to_le_bytes();
            // Signaled: a send queue frees unsignaled requests only at a later completion, and a rank that only
            // receives from a peer writes nothing else on its queue pair.
            if let Err(e) = qp.write(word.as_ptr(), 8, None, remote.words, remote.words_rkey, None, CREDIT, true) {
                let peer = state.ring.peer;
                self.fail(peer, format!("could not be sent credits ({})", std::io::Error::from_raw_os_error(e)));
                continue;
            }
            self.links[link].reported = consumed;
            moved = true;
        }
        moved
    }
}

/// A completion status in words.
fn describe(status: u32) -> &'static str {
    match status {
        ffi::ibv_wc_status::IBV_WC_RETRY_EXC_ERR => "transport retries exceeded (the peer is gone or cut off)",
        ffi::ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR => "receiver-not-ready retries exceeded",
        ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR => "remote access error (a write its memory did not allow)",
        ffi::ibv_wc_status::IBV_WC_REM_INV_REQ_ERR => "remote invalid request",
        ffi::ibv_wc_status::IBV_WC_LOC_PROT_ERR => "local protection error",
        ffi::ibv_wc_status::IBV_WC_LOC_LEN_ERR => "local length error",
        _ => "a failed work request",
    }
}

impl Carrier for Verbs {
    /// A peer's queue pair, connected.
    type Peer = Qp;

    fn rank(&self) -> u32 {
        self.rank
    }

    fn add_peer(&mut self, peer: u32, qp: Qp) {
        self.by_qpn.insert(qp.number(), (peer, self.qps.len()));
        self.qps.push(qp);
    }

    fn register(&mut self, ring: Arc<Ring>) {
        let key = (ring.end, ring.lane);
        let setup = self.setups.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        let Some((memory, remote, index, qpn)) = setup else {
            return self
                .fail(self.rank, format!("a link without its registration ({:?} lane {})", ring.end, ring.lane));
        };
        let Some(&(_, qp)) = self.by_qpn.get(&qpn) else {
            return self.fail(self.rank, format!("a link without its queue pair ({:?} lane {})", ring.end, ring.lane));
        };
        let sending = ring.end.from == self.rank;
        if !sending {
            self.by_index.insert(index, self.links.len());
        } else {
            self.by_end.insert(key, self.links.len());
        }
        let inline = ring.record.as_ref().is_none_or(|r| r.device_slots.is_none());
        self.links.push(LinkState { ring, memory, remote, sending, qp, inline, queued: 0, reported: 0 });
        if !sending && self.early.iter().any(|&(_, i, _)| i == index) {
            let (now, later): (Vec<_>, Vec<_>) =
                std::mem::take(&mut self.early).into_iter().partition(|e| e.1 == index);
            self.early = later;
            for (peer, index, len) in now {
                self.arrived(peer, index, len);
            }
        }
    }

    fn pump(&mut self, idle: bool) -> bool {
        let mut moved = self.poll();
        moved |= self.send_posted_all();
        moved |= self.credits(idle);
        moved
    }

    fn send_posted(&mut self, ring: &Ring) {
        if let Some(&link) = self.by_end.get(&(ring.end, ring.lane)) {
            self.send_link(link);
        }
    }

    fn send_credits(&mut self) {
        self.credits(false);
    }

    fn receive(&mut self, _ring: &Ring) {
        self.poll();
        self.credits(false);
    }

    fn poll_fds(&self, _fds: &mut Vec<libc::pollfd>) {}

    fn busy_poll(&self) -> bool {
        true
    }

    fn fault(&self) -> Option<&Fault> {
        self.fault.as_ref()
    }

    fn parked(&self) -> Vec<(u32, Frame)> {
        Vec::new()
    }
}
