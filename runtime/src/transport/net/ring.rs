//! One link's end as the executor and the network proxy share it: `SLOTS` message slots in local memory and the
//! counters that hand them over, with no lock. The sender's executor writes a message and its `Meta` into a slot and
//! publishes it by raising `posted`; the proxy frames it onto the socket, raises `sent` once the socket took it, and
//! raises `credited` when the receiver says it consumed messages. On the receiving end the proxy reads a frame's
//! body into a slot, records its header and raises `received`; the executor consumes it and raises `consumed`,
//! which the proxy turns into credits. Each counter has one writer; a slot is written only by the side whose turn
//! it is, as the counters say.
//!
//! A device rank's ring (`Ring::over_record`) has no executor on the host: its slots are those of the connection
//! record the device interpreter posts into and reads from (host-mapped memory), and the proxy stands in for the
//! executor through the record's words (`record.rs`).

use super::frame::Frame;
use super::record::Record;
use crate::transport::{CallInfo, LinkEnd, Stamp, SLOTS};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) const SLOTS_U: usize = SLOTS as usize;

/// What the sender says of a posted message: the proxy makes its frame header from it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Meta {
    pub stamp: Stamp,
    pub len: usize,
    pub call: CallInfo,
}

pub(crate) struct Ring {
    pub end: LinkEnd,
    /// The lane of a device rank's channel (0 for host ranks).
    pub lane: u16,
    pub peer: u32,
    /// Which of the peer's sockets carries it.
    pub socket: usize,
    /// The first slot (64-byte aligned), in `_storage` or in a device's record.
    base: *mut u8,
    _storage: Vec<u8>,
    /// A device rank's connection record, whose slots these are.
    pub record: Option<Record>,
    /// Sender: messages posted (executor), taken by the socket (proxy), and consumed by the receiver as its last
    /// credit said (proxy).
    pub posted: AtomicU64,
    pub sent: AtomicU64,
    pub credited: AtomicU64,
    meta: [UnsafeCell<Option<Meta>>; SLOTS_U],
    /// Receiver: messages arrived whole (proxy) and consumed (executor).
    pub received: AtomicU64,
    pub consumed: AtomicU64,
    arrived: [UnsafeCell<Option<Frame>>; SLOTS_U],
}

// SAFETY: the cells are written by one side at a time, as the counters hand each slot over (module doc); the
// counters' Release stores and Acquire loads order the writes before the other side's reads.
unsafe impl Sync for Ring {}
unsafe impl Send for Ring {}

impl Ring {
    pub fn new(end: LinkEnd, peer: u32, socket: usize) -> Ring {
        let mut storage = vec![0u8; SLOTS_U * end.slot_bytes + 64];
        let offset = storage.as_ptr().align_offset(64);
        // SAFETY: within the vector (64 spare bytes); its heap buffer does not move when the vector does.
        let base = unsafe { storage.as_mut_ptr().add(offset) };
        Ring::with_slots(end, 0, peer, socket, base, storage, None)
    }

    /// The ring of a device rank's connection record (lane `lane` of its channel): the record's slots, the proxy
    /// standing in for the executor.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn over_record(end: LinkEnd, lane: u16, peer: u32, socket: usize, record: Record) -> Ring {
        Ring::with_slots(end, lane, peer, socket, record.slots(), Vec::new(), Some(record))
    }

    fn with_slots(
        end: LinkEnd,
        lane: u16,
        peer: u32,
        socket: usize,
        base: *mut u8,
        storage: Vec<u8>,
        record: Option<Record>,
    ) -> Ring {
        Ring {
            end,
            lane,
            peer,
            socket,
            base,
            _storage: storage,
            record,
            posted: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            credited: AtomicU64::new(0),
            meta: std::array::from_fn(|_| UnsafeCell::new(None)),
            received: AtomicU64::new(0),
            consumed: AtomicU64::new(0),
            arrived: std::array::from_fn(|_| UnsafeCell::new(None)),
        }
    }

    /// The slot of message number `message` (64-byte aligned, `end.slot_bytes` long).
    pub fn slot(&self, message: u64) -> *mut u8 {
        let index = (message % SLOTS) as usize;
        // SAFETY: in bounds (`base` starts SLOTS slots); only a pointer is made here.
        unsafe { self.base.add(index * self.end.slot_bytes) }
    }

    // --- the executor's side ---------------------------------------------------------------------------------

    /// A free slot for the next message, while the receiver has room for it.
    pub fn reserve(&self) -> Option<*mut u8> {
        let posted = self.posted.load(Ordering::Relaxed);
        (posted - self.credited.load(Ordering::Acquire) < SLOTS).then(|| self.slot(posted))
    }

    /// Publishes the message written into the reserved slot.
    pub fn post(&self, meta: Meta) {
        let posted = self.posted.load(Ordering::Relaxed);
        // SAFETY: slot `posted` is the sender's until `posted` is raised (the proxy reads only below it).
        unsafe { *self.meta[(posted % SLOTS) as usize].get() = Some(meta) };
        self.posted.store(posted + 1, Ordering::Release);
    }

    /// The next message, once it has arrived whole: its header and slot.
    pub fn peek(&self) -> Option<(Frame, *const u8)> {
        let consumed = self.consumed.load(Ordering::Relaxed);
        if self.received.load(Ordering::Acquire) == consumed {
            return None;
        }
        // SAFETY: the proxy wrote it before raising `received` past it, and leaves it until `consumed` passes it.
        let frame = unsafe { *self.arrived[(consumed % SLOTS) as usize].get() }?;
        Some((frame, self.slot(consumed) as *const u8))
    }

    /// Frees the slot `peek` returned.
    pub fn release(&self) {
        let consumed = self.consumed.load(Ordering::Relaxed);
        self.consumed.store(consumed + 1, Ordering::Release);
    }

    /// Whether every message posted has been taken by the socket.
    pub fn flushed(&self) -> bool {
        self.sent.load(Ordering::Acquire) == self.posted.load(Ordering::Relaxed)
    }

    // --- the proxy's side ------------------------------------------------------------------------------------

    /// What the sender said of posted message `message`.
    pub fn meta(&self, message: u64) -> Meta {
        // SAFETY: written before `posted` passed `message` (the caller has seen it), not again before credits free it.
        unsafe { *self.meta[(message % SLOTS) as usize].get() }.expect("a posted message has its meta")
    }

    /// The header of arrived message `message` (below `received`, not consumed).
    pub fn arrived(&self, message: u64) -> Option<Frame> {
        // SAFETY: written by the proxy (the caller) before `received` passed `message`.
        unsafe { *self.arrived[(message % SLOTS) as usize].get() }
    }

    /// Records the header of arriving message `message` (before its body is read; `received` is raised after).
    pub fn set_arrived(&self, message: u64, frame: Frame) {
        // SAFETY: the slot is the proxy's: `received` has not passed it, and the executor consumed its last use
        // (the credits kept the sender within `SLOTS` messages of `consumed`).
        unsafe { *self.arrived[(message % SLOTS) as usize].get() = Some(frame) };
    }
}
