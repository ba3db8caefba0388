//! A device rank's connection to a rank on another host, as the network proxy carries it (NCCL's network transport
//! with host staging): the connection's record (`exec::encode::conn`) lives in host-mapped memory on each side, its
//! slots are the ring's (`Ring::over_record`), and the proxy stands in for the host executor through the record's
//! words.
//!
//! - Sending end: the device interpreter writes a message into a slot, its stamp, then raises `tail`. The proxy
//!   posts every message below `tail` on the ring (its length from the plan, as the device does not say it), and
//!   sets `head` to the messages the receiver has consumed (its credits): the device reuses a slot only once the
//!   other side has read it, so the connection holds at most `SLOTS` messages end to end, as the verifier proved.
//! - Receiving end: the wire reads a frame's body straight into the record's slot; the proxy writes its stamp and
//!   raises `tail`; the device checks the stamp, reads the slot and raises `head`, which the proxy takes as consumed
//!   (and the wire turns into credits).
//!
//! The device publishes with system-scope fences; the proxy reads `tail` before the slot and writes the slot and
//! the stamp before `tail` (volatile accesses ordered by fences).
//!
//! With GPUDirect RDMA (the ib transport) the record's slots are device memory the NIC reads and writes, at the
//! record's `SLOTS_AT`; its words stay in host-mapped memory for the proxy, which never touches the slots, and
//! flushes the NIC's writes into them before it raises `tail` (`DeviceSlots`).

use super::ring::Ring;
use crate::exec::encode::{conn, NONE_LINK, RECORD_BYTES};
use crate::exec::Plan;
use crate::link::{CallInfo, Stamp, SLOTS};
use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Mutex;

/// A connection record in host-mapped memory, and what the proxy needs to carry its messages.
pub(crate) struct Record {
    words: *mut u64,
    slots: *mut u8,
    /// Where the slots are device memory (GPUDirect RDMA).
    pub device_slots: Option<DeviceSlots>,
    /// Keeps the record's memory alive as long as the ring (the proxy may look at it until it stops).
    _memory: Box<dyn std::any::Any + Send + Sync>,
    /// Sending end: the length of each message of a call, by the call shape's fingerprint.
    lengths: Mutex<HashMap<u64, Lengths>>,
    /// Sending end, the proxy's: the call of the last message posted (sequence, fingerprint) and its index there.
    call_seq: AtomicU64,
    call_fingerprint: AtomicU64,
    index: AtomicU64,
}

/// A record's slots in device memory: their dma-buf (whole, from `offset`) for the NIC to register, and the flush
/// that makes its writes visible to the device.
#[cfg_attr(not(all(feature = "cuda", feature = "ib")), allow(dead_code))]
pub(crate) struct DeviceSlots {
    pub dma_buf: std::os::fd::OwnedFd,
    pub offset: u64,
    pub flush: Box<dyn Fn() + Send + Sync>,
}

// SAFETY: `words` points into `_memory`, which lives as long as the record; each word has one writer (module doc).
unsafe impl Send for Record {}
unsafe impl Sync for Record {}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl Record {
    /// The record at host address `words` (a record of `RECORD_BYTES` and its slots), kept alive by `memory`.
    pub fn new(words: *mut u64, memory: Box<dyn std::any::Any + Send + Sync>) -> Record {
        // SAFETY: the record is `RECORD_BYTES` of words, then its slots.
        let slots = unsafe { words.cast::<u8>().add(RECORD_BYTES) };
        Record::with_slots(words, slots, None, memory)
    }

    /// The record at host address `words` whose slots are device memory at device address `slots` (its `SLOTS_AT`
    /// word says so to the device), both kept alive by `memory`.
    #[cfg_attr(not(all(feature = "cuda", feature = "ib")), allow(dead_code))]
    pub fn with_device_slots(
        words: *mut u64,
        slots: u64,
        device: DeviceSlots,
        memory: Box<dyn std::any::Any + Send + Sync>,
    ) -> Record {
        let record = Record::with_slots(words, slots as *mut u8, Some(device), memory);
        record.store(conn::SLOTS_AT, slots);
        record
    }

    fn with_slots(
        words: *mut u64,
        slots: *mut u8,
        device_slots: Option<DeviceSlots>,
        memory: Box<dyn std::any::Any + Send + Sync>,
    ) -> Record {
        Record {
            words,
            slots,
            device_slots,
            _memory: memory,
            lengths: Mutex::new(HashMap::new()),
            call_seq: AtomicU64::new(u64::MAX),
            call_fingerprint: AtomicU64::new(0),
            index: AtomicU64::new(0),
        }
    }

    /// Where the record's slots start (a device address when they are device memory: not for the host to touch).
    pub fn slots(&self) -> *mut u8 {
        self.slots
    }

    /// Teaches the sending end the lengths of the messages of a call shape.
    pub fn learn(&self, fingerprint: u64, lengths: Lengths) {
        self.lengths.lock().unwrap_or_else(|p| p.into_inner()).insert(fingerprint, lengths);
    }

    fn load(&self, word: usize) -> u64 {
        // SAFETY: a word of the record; volatile, as the device writes it.
        let value = unsafe { self.words.add(word).read_volatile() };
        fence(Ordering::Acquire);
        value
    }

    fn store(&self, word: usize, value: u64) {
        fence(Ordering::Release);
        // SAFETY: a word of the record this side writes; volatile, as the device reads it.
        unsafe { self.words.add(word).write_volatile(value) };
    }

    /// The bytes of the next message of call `stamp` on the sending end: from the plan, else the whole slot.
    fn length(&self, stamp: Stamp, slot_bytes: usize) -> usize {
        let same = self.call_seq.load(Ordering::Relaxed) == stamp.seq
            && self.call_fingerprint.load(Ordering::Relaxed) == stamp.fingerprint;
        let index = if same { self.index.load(Ordering::Relaxed) } else { 0 };
        self.call_seq.store(stamp.seq, Ordering::Relaxed);
        self.call_fingerprint.store(stamp.fingerprint, Ordering::Relaxed);
        self.index.store(index + 1, Ordering::Relaxed);
        let lengths = self.lengths.lock().unwrap_or_else(|p| p.into_inner());
        lengths.get(&stamp.fingerprint).and_then(|l| l.of(index)).map_or(slot_bytes, |len| len.min(slot_bytes))
    }
}

/// The messages one lane of a plan sends on one link in a call, as the device interpreter writes them: per tile of
/// the lane, one message per instruction on the link, `n` pieces at the tile's stride, the last one the tile's
/// elements (the host executor's `len`).
#[derive(Clone, Debug)]
pub(crate) struct Lengths {
    /// Pieces of the instruction at each position on the link within a tile.
    pieces: Vec<u64>,
    tile: u64,
    capacity: u64,
    elem: u64,
    lane: u64,
    lanes: u64,
}

impl Lengths {
    /// For `plan`'s sending link `link`, lane `lane` of `lanes`.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn new(plan: &Plan, link: u16, lane: u32, lanes: u32) -> Lengths {
        let mut by_position: Vec<(u32, u64)> = plan
            .steps
            .iter()
            .filter(|step| step.send == link && link != NONE_LINK)
            .map(|step| (step.send_pos, step.n as u64))
            .collect();
        by_position.sort_unstable();
        Lengths {
            pieces: by_position.into_iter().map(|(_, n)| n).collect(),
            tile: plan.tile as u64,
            capacity: plan.capacity as u64,
            elem: plan.elem as u64,
            lane: lane as u64,
            lanes: lanes.max(1) as u64,
        }
    }

    /// Bytes of message `index` of the call on this lane; `None` past its last one.
    fn of(&self, index: u64) -> Option<usize> {
        let per_tile = self.pieces.len() as u64;
        if per_tile == 0 {
            return None;
        }
        let tile = self.lane + (index / per_tile) * self.lanes;
        let lo = tile * self.tile;
        if lo >= self.capacity {
            return None;
        }
        let hi = (lo + self.tile).min(self.capacity);
        let n = self.pieces[(index % per_tile) as usize].max(1);
        Some((((n - 1) * self.tile + (hi - lo)) * self.elem) as usize)
    }
}

/// One look at a device ring's record (the proxy's, each round): the sender's new messages posted and its credits
/// passed on; the receiver's arrived messages published and its consumption taken. Whether anything moved.
pub(crate) fn bridge(ring: &Ring) -> bool {
    let Some(record) = &ring.record else { return false };
    let mut moved = false;
    if ring.end.to == ring.peer {
        let tail = record.load(conn::TAIL);
        let mut posted = ring.posted.load(Ordering::Relaxed);
        while posted < tail {
            let slot = (posted % SLOTS) as usize;
            let stamp = Stamp {
                seq: record.load(conn::STAMPS + 2 * slot),
                fingerprint: record.load(conn::STAMPS + 2 * slot + 1),
            };
            let len = record.length(stamp, ring.end.slot_bytes);
            let call = CallInfo { seq: stamp.seq, fingerprint: stamp.fingerprint, ..CallInfo::NONE };
            ring.post(super::ring::Meta { stamp, len, call });
            posted += 1;
            moved = true;
        }
        let credited = ring.credited.load(Ordering::Acquire);
        if record.load(conn::HEAD) != credited {
            record.store(conn::HEAD, credited);
            moved = true;
        }
    } else {
        let received = ring.received.load(Ordering::Acquire);
        let mut tail = record.load(conn::TAIL);
        if tail < received {
            if let Some(device) = &record.device_slots {
                (device.flush)();
            }
            while tail < received {
                let slot = (tail % SLOTS) as usize;
                let frame = ring.arrived(tail).expect("an arrived message has its header");
                record.store(conn::STAMPS + 2 * slot, frame.seq);
                record.store(conn::STAMPS + 2 * slot + 1, frame.fingerprint);
                tail += 1;
            }
            record.store(conn::TAIL, tail);
            moved = true;
        }
        let head = record.load(conn::HEAD);
        if head > ring.consumed.load(Ordering::Relaxed) {
            ring.consumed.store(head, Ordering::Release);
            moved = true;
        }
    }
    moved
}

#[cfg(test)]
mod tests {
    use super::Lengths;

    /// Message lengths follow the lane's tiles: full tiles of `n` pieces, the last tile short; nothing past it.
    #[test]
    fn lengths_follow_the_lanes_tiles_and_the_last_tile_is_short() {
        // 2 messages a tile (1 and 3 pieces), tiles of 10 elements of 4 bytes, 25 elements: tiles 0, 1, 2 (5 long).
        let lengths = Lengths { pieces: vec![1, 3], tile: 10, capacity: 25, elem: 4, lane: 0, lanes: 1 };
        let all: Vec<Option<usize>> = (0..7).map(|i| lengths.of(i)).collect();
        assert_eq!(all, [Some(40), Some(120), Some(40), Some(120), Some(20), Some(100), None]);
        // Lane 1 of 2: tile 1 only.
        let lane = Lengths { lane: 1, lanes: 2, ..lengths };
        assert_eq!((0..3).map(|i| lane.of(i)).collect::<Vec<_>>(), [Some(40), Some(120), None]);
    }
}
