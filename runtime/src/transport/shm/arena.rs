//! Host memory that rank processes on one host read in place: single copy across processes, as NCCL's buffer
//! registration (`ncclMemAlloc`) gives it. Each process has one arena, a sparse memfd mapped once; the buffers a
//! communicator over shm allocates (`Communicator::alloc`, which `collc run` uses) are cut from it, with their pages
//! reserved up front (`fallocate`), so a full memory is an allocation that falls back to the heap rather than a
//! SIGBUS later. Each rank publishes its arena's fd with its pid; a receiver maps the sender's arena through
//! `/proc/<pid>/fd/<fd>` when it opens the link, and a message carries offsets into it.
//!
//! A caller's own buffers are not in the arena: their messages travel through the FIFOs (two copies).
//! `process_vm_readv` would save the sender's copy only for plain receives, since a reduction reads both of its
//! operands where they are, so it is not used.

use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, OnceLock};

/// The arena's address space: sparse, so only the buffers cut from it use memory.
const ARENA_BYTES: usize = 1 << 40;
/// Buffers start on a page.
const ALIGN: usize = 4096;

pub(crate) struct Arena {
    fd: OwnedFd,
    base: *mut u8,
    /// Free byte ranges, sorted and coalesced.
    free: Mutex<Vec<Range<usize>>>,
}

unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

/// This process's arena, made on first use; `None` where the kernel refuses a memfd or the mapping.
pub(crate) fn arena() -> Option<&'static Arena> {
    static ARENA: OnceLock<Option<Arena>> = OnceLock::new();
    ARENA
        .get_or_init(|| match Arena::new() {
            Ok(arena) => Some(arena),
            Err(why) => {
                crate::log::warn(crate::log::Subsys::Init, format_args!("no single copy across processes: {why}"));
                None
            }
        })
        .as_ref()
}

impl Arena {
    fn new() -> Result<Arena, String> {
        // SAFETY: a name and flags; the result is checked.
        let fd = unsafe { libc::memfd_create(c"collc-arena".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: a descriptor this process just opened and owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: resizing the memfd just created; sparse, so nothing is allocated.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), ARENA_BYTES as libc::off_t) } != 0 {
            return Err(format!("ftruncate: {}", std::io::Error::last_os_error()));
        }
        let base = map(fd.as_raw_fd(), ARENA_BYTES, libc::PROT_READ | libc::PROT_WRITE)?;
        let whole: Range<usize> = 0..ARENA_BYTES;
        Ok(Arena { fd, base, free: Mutex::new(Vec::from([whole])) })
    }

    /// The descriptor peers open through `/proc/<pid>/fd`.
    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// A buffer of `bytes` with its pages in memory, or `None` when none is left (the caller uses the heap).
    pub fn alloc(&'static self, bytes: usize) -> Option<ArenaBuf> {
        let len = bytes.max(1).next_multiple_of(ALIGN);
        let start = {
            let mut free = self.free.lock().ok()?;
            let slot = free.iter().position(|r| r.len() >= len)?;
            let start = free[slot].start;
            free[slot].start += len;
            if free[slot].is_empty() {
                free.remove(slot);
            }
            start
        };
        let buf = ArenaBuf { arena: self, range: start..start + len, bytes };
        // SAFETY: a range of the arena's file, which this process owns.
        let reserved = unsafe { libc::fallocate(self.fd(), 0, start as libc::off_t, len as libc::off_t) } == 0;
        reserved.then_some(buf)
    }

    /// The offset of `len` bytes at `ptr` when they lie in one buffer of this arena.
    pub fn offset_of(&self, ptr: *const u8, len: usize) -> Option<u64> {
        let offset = (ptr as usize).checked_sub(self.base as usize)?;
        (offset + len <= ARENA_BYTES).then_some(offset as u64)
    }

    fn release(&self, range: Range<usize>) {
        // SAFETY: the buffer's own range; its pages go back to the kernel, the range stays mapped and reads zeros.
        unsafe {
            libc::fallocate(
                self.fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                range.start as libc::off_t,
                range.len() as libc::off_t,
            )
        };
        let Ok(mut free) = self.free.lock() else { return };
        let at = free.partition_point(|r| r.start < range.start);
        free.insert(at, range);
        // Coalesce with the neighbours.
        if at + 1 < free.len() && free[at].end == free[at + 1].start {
            free[at].end = free[at + 1].end;
            free.remove(at + 1);
        }
        if at > 0 && free[at - 1].end == free[at].start {
            free[at - 1].end = free[at].end;
            free.remove(at);
        }
    }
}

/// A buffer cut from this process's arena; its range goes back when it drops.
pub struct ArenaBuf {
    arena: &'static Arena,
    range: Range<usize>,
    bytes: usize,
}

unsafe impl Send for ArenaBuf {}

impl ArenaBuf {
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.arena.base.wrapping_add(self.range.start)
    }

    pub fn len(&self) -> usize {
        self.bytes
    }
}

impl Drop for ArenaBuf {
    fn drop(&mut self) {
        self.arena.release(self.range.clone());
    }
}

/// A peer process's arena, mapped into this one.
pub(crate) struct PeerArena {
    base: *mut u8,
}

unsafe impl Send for PeerArena {}
unsafe impl Sync for PeerArena {}

impl PeerArena {
    /// The arena `fd` of process `pid`, through `/proc`, read-only: a receiver only reads what it is sent.
    pub fn map(pid: u32, fd: i32) -> Result<PeerArena, String> {
        let path = format!("/proc/{pid}/fd/{fd}");
        let file = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
        let len = file.metadata().map_err(|e| format!("{path}: {e}"))?.len() as usize;
        if len != ARENA_BYTES {
            return Err(format!("{path} is not a collc arena ({len} bytes)"));
        }
        Ok(PeerArena { base: map(file.as_raw_fd(), ARENA_BYTES, libc::PROT_READ)? })
    }

    /// Where the peer's offset `offset` is in this process.
    pub fn at(&self, offset: u64) -> *const u8 {
        self.base.wrapping_add(offset as usize)
    }
}

impl Drop for PeerArena {
    fn drop(&mut self) {
        // SAFETY: mapped in `map` with this length, unmapped once.
        unsafe { libc::munmap(self.base.cast(), ARENA_BYTES) };
    }
}

/// A shared mapping of `len` bytes of `fd` with `protection`, reserving no swap.
fn map(fd: i32, len: usize, protection: i32) -> Result<*mut u8, String> {
    // SAFETY: a new shared mapping of a descriptor the caller holds open; the result is checked.
    let ptr =
        unsafe { libc::mmap(std::ptr::null_mut(), len, protection, libc::MAP_SHARED | libc::MAP_NORESERVE, fd, 0) };
    match ptr == libc::MAP_FAILED {
        true => Err(format!("mmap of {len} bytes: {}", std::io::Error::last_os_error())),
        false => Ok(ptr.cast()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer is readable where a peer maps the arena, at the offset the sender names; freed ranges are reused and
    /// coalesce.
    #[test]
    fn a_peer_reads_an_arena_buffer_at_its_offset() {
        // An arena of its own, so the other tests' buffers do not move the ranges this one checks.
        let arena: &'static Arena = Box::leak(Box::new(Arena::new().expect("an arena")));
        let buf = arena.alloc(10_000).expect("room");
        // SAFETY: the buffer holds 10 000 bytes.
        unsafe { std::ptr::write_bytes(buf.as_mut_ptr(), 0x5A, 10_000) };
        let offset = arena.offset_of(buf.as_mut_ptr().wrapping_add(100), 64).expect("inside the arena");
        let peer = PeerArena::map(std::process::id(), arena.fd()).expect("maps through /proc");
        // SAFETY: the peer mapping shows the same pages.
        assert_eq!(unsafe { peer.at(offset).read() }, 0x5A);
        assert!(arena.offset_of(&0u8 as *const u8, 1).is_none(), "the stack is not in the arena");
        let start = buf.as_mut_ptr();
        drop(buf);
        let again = arena.alloc(4096).expect("room");
        assert_eq!(again.as_mut_ptr(), start, "a freed range is reused");
        // SAFETY: a hole punched on release reads zeros.
        assert_eq!(unsafe { again.as_mut_ptr().read() }, 0);
    }
}
