//! A connection's message FIFO in shared memory, NCCL's SHM transport: `SLOTS` slots in a ring, the sender writes
//! a message straight into the next free slot and publishes it, the receiver reduces or copies straight out of it
//! and frees it. Each slot starts with a header holding its ready flag and the stamp of the call the message
//! belongs to (mismatched calls are caught instead of misread); small messages share that cache line. Where the
//! receiver can read the sender's chunks a message may carry where they are instead of their bytes (single copy: the
//! receiver reads them in place; the sender's call returns once they are released): between rank threads of one
//! process their addresses, between processes their offsets in the sender's arena (`arena.rs`), for chunks of
//! buffers cut from it.

use super::arena::{Arena, PeerArena};
use super::segment::{Segment, Segments};
use crate::error::RuntimeError;
use crate::link::Ring;
use crate::transport::{Link, LinkEnd, Stamp, SLOTS};
use std::sync::atomic::{AtomicU64, Ordering};

const HEADER: usize = 128;
/// A slot starts with its header; the data follows in the same cache line, so a small message travels in one
/// line (NCCL's LL protocol puts flag and data together for the same reason).
const SLOT_HEADER: usize = std::mem::size_of::<SlotHeader>();

/// Each counter is written by one side only and lives on its own cache line.
#[repr(C)]
struct Counters {
    /// Messages the sender has posted; read by the sender only.
    posted: AtomicU64,
    _pad: [u8; 56],
    /// Messages the receiver has consumed; the sender reads it only when it believes the ring is full.
    consumed: AtomicU64,
    /// Set by a receiver in another process once it has mapped the sender's arena: offsets may then be sent.
    maps_arena: AtomicU64,
}

#[repr(C)]
struct SlotHeader {
    /// 1 + the message number once the message is complete: the receiver polls this, not a shared counter.
    ready: AtomicU64,
    /// How many references (addresses, or arena offsets) the data holds in place of the message's bytes (0: its
    /// bytes).
    refs: u64,
    stamp: Stamp,
}

/// A slot's header and `slot_bytes` of data, cache-line aligned.
fn stride(slot_bytes: usize) -> usize {
    (SLOT_HEADER + slot_bytes).next_multiple_of(64)
}

/// The shared memory of one connection's FIFO with slots of `slot_bytes`.
pub fn segment_bytes(slot_bytes: usize) -> usize {
    HEADER + SLOTS as usize * stride(slot_bytes)
}

/// Whether rank threads may read each other's chunks in place (`COLLC_P2P_DIRECT_DISABLE=1`, NCCL's name, turns it
/// off: every message then carries its bytes).
pub(crate) fn direct() -> bool {
    static DIRECT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DIRECT.get_or_init(|| std::env::var("COLLC_P2P_DIRECT_DISABLE").map_or(true, |v| v.trim() != "1"))
}

/// How one end of a connection names the chunks a message carries by reference.
pub(crate) enum Refs {
    /// Every message carries its bytes.
    None,
    /// Both ends are threads of one process: addresses.
    Addresses,
    /// The sending end in a process of its own: offsets of chunks that lie in this process's arena.
    Offsets(&'static Arena),
    /// The receiving end: the sender's arena, mapped here.
    Peer(std::sync::Arc<PeerArena>),
}

/// One end of a connection.
pub(crate) struct Fifo {
    base: *mut u8,
    stride: usize,
    /// The sender's last look at `consumed`: a lower bound, refreshed only when the ring seems full.
    known_consumed: u64,
    refs: Refs,
    /// The sender's messages carried by reference so far, up to this number (the call waits until the receiver has
    /// released them).
    refs_until: u64,
    _segment: Segment,
}

unsafe impl Send for Fifo {}

impl Fifo {
    /// The FIFO of connection `end`, in the segment both of its ends open; `refs` says how this end names chunks
    /// carried by reference (`Refs::Peer`: the receiver has mapped the sender's arena, which it tells the sender).
    pub fn open(segments: &dyn Segments, end: &LinkEnd, refs: Refs) -> Result<Fifo, RuntimeError> {
        let LinkEnd { from, to, channel, slot_bytes } = *end;
        let len = segment_bytes(slot_bytes);
        let segment = segments.open(&format!("fifo-{from}-{to}-{channel}-{slot_bytes}"), len)?;
        let fifo = Fifo {
            base: segment.as_ptr(),
            stride: stride(slot_bytes),
            known_consumed: 0,
            refs,
            refs_until: 0,
            _segment: segment,
        };
        if let Refs::Peer(_) = fifo.refs {
            fifo.counters().maps_arena.store(1, Ordering::Release);
        }
        Ok(fifo)
    }

    fn counters(&self) -> &Counters {
        // SAFETY: the segment starts with the counters and lives as long as `self`.
        unsafe { &*(self.base as *const Counters) }
    }

    fn slot(&self, message: u64) -> *mut u8 {
        let index = (message % SLOTS) as usize;
        // SAFETY: index < SLOTS, inside the segment.
        unsafe { self.base.add(HEADER + index * self.stride) }
    }

    fn header(&self, message: u64) -> &SlotHeader {
        // SAFETY: every slot starts with a header, 64-byte aligned.
        unsafe { &*(self.slot(message) as *const SlotHeader) }
    }
}

impl Link for Fifo {
    /// Sender: the data area of the next message if the receiver has freed room for it.
    #[inline]
    fn reserve(&mut self) -> Option<*mut u8> {
        let c = self.counters();
        let next = c.posted.load(Ordering::Relaxed);
        if next - self.known_consumed >= SLOTS {
            self.known_consumed = c.consumed.load(Ordering::Acquire);
            if next - self.known_consumed >= SLOTS {
                return None;
            }
        }
        // SAFETY: the slot's data follows its header.
        Some(unsafe { self.slot(next).add(SLOT_HEADER) })
    }

    /// Sender: publishes the message written into the area `reserve` returned.
    #[inline]
    fn post(&mut self, stamp: Stamp, _len: usize) {
        self.publish(stamp, 0);
    }

    #[inline]
    fn reference(&self, ptr: *const u8, len: usize) -> Option<u64> {
        match &self.refs {
            Refs::Addresses => Some(ptr as u64),
            Refs::Offsets(arena) if self.counters().maps_arena.load(Ordering::Acquire) == 1 => {
                arena.offset_of(ptr, len)
            }
            _ => None,
        }
    }

    #[inline]
    fn dereference(&self, token: u64) -> *const u8 {
        match &self.refs {
            Refs::Peer(arena) => arena.at(token),
            _ => token as *const u8,
        }
    }

    /// Sender: publishes a message of `refs` references, each from `reference`.
    #[inline]
    fn post_refs(&mut self, stamp: Stamp, refs: usize) {
        debug_assert!(refs > 0);
        self.refs_until = self.publish(stamp, refs as u64) + 1;
    }

    /// Receiver: the next message's stamp and data, once it has been posted.
    #[inline]
    fn peek(&mut self) -> Option<(Stamp, *const u8)> {
        let next = self.counters().consumed.load(Ordering::Relaxed);
        let header = self.header(next);
        if header.ready.load(Ordering::Acquire) != next + 1 {
            return None;
        }
        let slot = self.slot(next) as *const SlotHeader;
        // SAFETY: `ready` was released after the stamp and the data were written.
        let stamp = unsafe { std::ptr::addr_of!((*slot).stamp).read_volatile() };
        // SAFETY: the data follows the header.
        Some((stamp, unsafe { self.slot(next).add(SLOT_HEADER) } as *const u8))
    }

    #[inline]
    fn peeked_refs(&self) -> usize {
        let next = self.counters().consumed.load(Ordering::Relaxed);
        let slot = self.slot(next) as *const SlotHeader;
        // SAFETY: the header of the message `peek` returned, written before its `ready` was released.
        unsafe { std::ptr::addr_of!((*slot).refs).read_volatile() as usize }
    }

    /// Receiver: frees the slot `peek` returned.
    #[inline]
    fn release(&mut self) {
        let c = self.counters();
        let next = c.consumed.load(Ordering::Relaxed);
        c.consumed.store(next + 1, Ordering::Release);
    }

    fn refs_outstanding(&self) -> bool {
        self.refs_until > 0 && self.counters().consumed.load(Ordering::Acquire) < self.refs_until
    }

    /// Whether the receivers have released every message this rank carried by reference (until then they may
    /// still read this rank's chunks).
    fn flushed(links: &mut [Self]) -> bool {
        !links.iter().any(|l| l.refs_outstanding())
    }

    fn ring(&mut self) -> Option<Ring> {
        let c = self.counters();
        let deref_base = match &self.refs {
            Refs::Peer(arena) => arena.at(0) as u64,
            _ => 0,
        };
        Some(Ring {
            posted: c.posted.as_ptr(),
            consumed: c.consumed.as_ptr(),
            slots: self.slot(0),
            stride: self.stride,
            ready_at: std::mem::offset_of!(SlotHeader, ready) as i32,
            refs_at: std::mem::offset_of!(SlotHeader, refs) as i32,
            stamp_at: std::mem::offset_of!(SlotHeader, stamp) as i32,
            data_at: SLOT_HEADER as i32,
            known_consumed: &mut self.known_consumed,
            refs_until: &mut self.refs_until,
            deref_base,
        })
    }
}

impl Fifo {
    /// Publishes the reserved message (`refs` addresses in place of its bytes, or 0); its number.
    #[inline]
    fn publish(&mut self, stamp: Stamp, refs: u64) -> u64 {
        let c = self.counters();
        let next = c.posted.load(Ordering::Relaxed);
        let slot = self.slot(next) as *mut SlotHeader;
        // SAFETY: the reserved slot's header; the receiver reads it only after `ready` says so.
        unsafe {
            std::ptr::addr_of_mut!((*slot).refs).write_volatile(refs);
            std::ptr::addr_of_mut!((*slot).stamp).write_volatile(stamp);
        }
        self.header(next).ready.store(next + 1, Ordering::Release);
        c.posted.store(next + 1, Ordering::Relaxed);
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::shm::segment::{Heap, Shm};

    /// Between rank threads a message may carry addresses: the receiver sees how many, reads them, and the
    /// sender's call is flushed only once the receiver has released it. Between processes it may not.
    #[test]
    fn a_message_of_addresses_is_flushed_only_once_released_and_only_between_threads() {
        let end = LinkEnd { from: 0, to: 1, channel: 0, slot_bytes: 4096 };
        let heap = Heap::default();
        let (mut sender, mut receiver) =
            (Fifo::open(&heap, &end, Refs::Addresses).unwrap(), Fifo::open(&heap, &end, Refs::Addresses).unwrap());
        let chunks = [[1.0f32; 4], [2.0f32; 4]];
        let stamp = Stamp { seq: 7, fingerprint: 9 };
        let area = sender.reserve().expect("room") as *mut u64;
        for (k, chunk) in chunks.iter().enumerate() {
            let token = sender.reference(chunk.as_ptr().cast(), 16).expect("an address");
            // SAFETY: the reserved slot holds 4096 bytes.
            unsafe { area.add(k).write(token) };
        }
        sender.post_refs(stamp, 2);
        assert!(!Fifo::flushed(std::slice::from_mut(&mut sender)), "not released yet");
        let (got, data) = receiver.peek().expect("posted");
        assert_eq!((got, receiver.peeked_refs()), (stamp, 2));
        // SAFETY: two references, each of a live chunk of 4 floats.
        let second = receiver.dereference(unsafe { *((data as *const u64).add(1)) }) as *const f32;
        assert_eq!(unsafe { std::slice::from_raw_parts(second, 4) }, &chunks[1]);
        receiver.release();
        assert!(Fifo::flushed(std::slice::from_mut(&mut sender)), "released");
        // A message of bytes after it says so.
        sender.reserve().expect("room");
        sender.post(stamp, 16);
        assert!(receiver.peek().is_some() && receiver.peeked_refs() == 0);

        let job = format!("fifo-test-{}", std::process::id());
        let shm = Shm::new(&job);
        let across = Fifo::open(&shm, &end, Refs::None).unwrap();
        assert!(across.reference(chunks[0].as_ptr().cast(), 16).is_none(), "processes do not share the heap");
        drop(across);
        shm.remove_all();
    }

    /// Between processes, a chunk of the sender's arena goes by its offset once the receiver has mapped the arena,
    /// and the receiver finds it there; a chunk outside the arena, or before the receiver says it maps it, does not.
    #[test]
    fn an_arena_chunk_goes_by_offset_once_the_receiver_maps_the_arena() {
        let arena = super::super::arena::arena().expect("an arena");
        let buf = arena.alloc(4096).expect("room");
        // SAFETY: 4096 bytes.
        unsafe { std::ptr::write_bytes(buf.as_mut_ptr(), 0x33, 4096) };
        let job = format!("fifo-arena-test-{}", std::process::id());
        let shm = Shm::new(&job);
        let end = LinkEnd { from: 0, to: 1, channel: 0, slot_bytes: 4096 };
        let sender = Fifo::open(&shm, &end, Refs::Offsets(arena)).unwrap();
        assert!(sender.reference(buf.as_mut_ptr(), 64).is_none(), "the receiver has not mapped the arena yet");
        let peer = PeerArena::map(std::process::id(), arena.fd()).expect("maps through /proc");
        let receiver = Fifo::open(&shm, &end, Refs::Peer(std::sync::Arc::new(peer))).unwrap();
        let token = sender.reference(buf.as_mut_ptr().wrapping_add(64), 64).expect("an arena chunk");
        // SAFETY: the receiver's mapping of the same pages.
        assert_eq!(unsafe { receiver.dereference(token).read() }, 0x33);
        let heap = [0u8; 64];
        assert!(sender.reference(heap.as_ptr(), 64).is_none(), "the heap is not the arena");
        drop((sender, receiver));
        shm.remove_all();
    }
}
