//! A connection's message FIFO in shared memory, NCCL's SHM transport: `SLOTS` slots in a ring, the sender writes
//! a message straight into the next free slot and publishes it, the receiver reduces or copies straight out of it
//! and frees it. Two counters, each written by one side only, on their own cache lines. Each slot starts with a
//! header that names the call the message belongs to, so mismatched calls are caught instead of misread.

use crate::error::RuntimeError;
use crate::segment::{Segment, Segments};
use std::sync::atomic::{AtomicU64, Ordering};

/// Messages in flight per connection: NCCL's NCCL_STEPS, and the `channel_slots` the verifier proved the
/// schedules deadlock-free with.
pub const SLOTS: u64 = 8;
const HEADER: usize = 128;
const SLOT_HEADER: usize = 64;

#[repr(C)]
struct Counters {
    posted: AtomicU64,
    _pad: [u8; 56],
    consumed: AtomicU64,
}

/// The call a message belongs to.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Stamp {
    pub seq: u64,
    pub fingerprint: u64,
}

/// One end of a connection, as a plan holds it.
pub(crate) struct Fifo {
    base: *mut u8,
    slot_bytes: usize,
    pub from: u32,
    pub to: u32,
    pub channel: u8,
    _segment: Segment,
}

unsafe impl Send for Fifo {}

impl Fifo {
    pub fn open(
        segments: &dyn Segments,
        from: u32,
        to: u32,
        channel: u8,
        slot_bytes: usize,
    ) -> Result<Fifo, RuntimeError> {
        let len = HEADER + SLOTS as usize * (SLOT_HEADER + slot_bytes);
        let segment = segments.open(&format!("fifo-{from}-{to}-{channel}-{slot_bytes}"), len)?;
        Ok(Fifo { base: segment.as_ptr(), slot_bytes, from, to, channel, _segment: segment })
    }

    fn counters(&self) -> &Counters {
        // SAFETY: the segment starts with the counters and lives as long as `self`.
        unsafe { &*(self.base as *const Counters) }
    }

    fn slot(&self, message: u64) -> *mut u8 {
        let index = (message % SLOTS) as usize;
        // SAFETY: index < SLOTS, inside the segment.
        unsafe { self.base.add(HEADER + index * (SLOT_HEADER + self.slot_bytes)) }
    }

    /// Sender: the data area of the next message if the receiver has freed room for it.
    #[inline]
    pub fn reserve(&self) -> Option<*mut u8> {
        let c = self.counters();
        let next = c.posted.load(Ordering::Relaxed);
        if next - c.consumed.load(Ordering::Acquire) >= SLOTS {
            return None;
        }
        // SAFETY: the slot's data follows its header.
        Some(unsafe { self.slot(next).add(SLOT_HEADER) })
    }

    /// Sender: publishes the message written into the area `reserve` returned.
    #[inline]
    pub fn post(&self, stamp: Stamp) {
        let c = self.counters();
        let next = c.posted.load(Ordering::Relaxed);
        // SAFETY: the header area of the reserved slot; only the sender writes it before publishing.
        unsafe { std::ptr::write_volatile(self.slot(next) as *mut Stamp, stamp) };
        c.posted.store(next + 1, Ordering::Release);
    }

    /// Receiver: the next message's stamp and data, once it has been posted.
    #[inline]
    pub fn peek(&self) -> Option<(Stamp, *const u8)> {
        let c = self.counters();
        let next = c.consumed.load(Ordering::Relaxed);
        if c.posted.load(Ordering::Acquire) <= next {
            return None;
        }
        let slot = self.slot(next);
        // SAFETY: posted > next, so the sender wrote this slot before its release store.
        let stamp = unsafe { std::ptr::read_volatile(slot as *const Stamp) };
        // SAFETY: the data follows the header.
        Some((stamp, unsafe { slot.add(SLOT_HEADER) } as *const u8))
    }

    /// Receiver: frees the slot `peek` returned.
    #[inline]
    pub fn release(&self) {
        let c = self.counters();
        let next = c.consumed.load(Ordering::Relaxed);
        c.consumed.store(next + 1, Ordering::Release);
    }
}
