//! The binary's allocator: the system allocator, except for two kinds of block.
//!
//! - Blocks of 1 MiB or more get their own mapping and grow in place with `mremap`; a block that grows is advised
//!   to use transparent huge pages. A freed one stays mapped (`kept`): the next big blocks and slabs are cut from
//!   it (or from several joined), its pages already faulted in.
//! - Blocks of 128 KiB up to 1 MiB come from slabs, in classes an eighth of a power of two apart; a freed one waits
//!   on its class's free list for the next block of that class and is never handed back to the kernel.
//! - While a `Prefault` is held (lowering, in `collc check` and `collc build`), a helper thread faults in what a big
//!   block grows by, so the kernel clears those pages on the idle core, then a reserve for the blocks to come.
//!
//! Why: verifying thousands of ranks builds arrays of hundreds of megabytes, one after another, and tens of
//! thousands of per-rank lists of a few hundred kilobytes. glibc hands such blocks back to the kernel on free, so
//! every stage faults its pages in again, and at p = 4096 it maps each per-rank list of 128 KiB or more on its own:
//! 880 000 page faults per run, where the slabs leave far fewer (bench/README.md). Huge pages fault 512 times less
//! often, but the kernel's first touch of one has cost from a fifth to four times as much per byte as that of
//! small pages, depending on the VM's state (bench/README.md has both): the arrays that grow (the lowered program's
//! transfers) get them; the slabs and the blocks allocated at their full size,
//! written once in order, keep small pages (`collc check allreduce/ring --ranks 4096` median 11.1 s against 12.7 s
//! with huge pages everywhere and 12.6 s with small pages everywhere; no change at 1024). Where the kernel does not give huge
//! pages (THP off), the mappings still work with small ones. Mid-size blocks are kept for reuse until the process
//! ends: what a process holds is at most the most it ever had live in each class. Freed big blocks are kept the
//! same way (at most 32 ranges, the smallest handed back first); the prefault helper's reserve adds at most twice
//! the largest block that grew while a `Prefault` was held.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;

mod kept;
mod prefault;
#[cfg(test)]
mod tests;

pub use prefault::while_prefaulting;

pub struct MappedBlocks;

const BIG: usize = 1 << 20;
const PAGE: usize = 4096;
/// Mid-size blocks: from `MID` (glibc's threshold for mapping a block on its own) up to `BIG`, in classes 1/8 of a
/// power of two apart, so a block wastes at most an eighth of its size.
const MID: usize = 128 << 10;
const MID_LOG2: usize = MID.trailing_zeros() as usize;
/// Eight classes per power of two from `MID` up to `BIG`, and `BIG` itself (what sizes just below it round up to).
const CLASSES: usize = 8 * (BIG.trailing_zeros() as usize - MID_LOG2) + 1;
/// A slab, carved into mid-size blocks as they are first asked for.
const SLAB: usize = 32 << 20;

fn is_big(size: usize, align: usize) -> bool {
    size >= BIG && align <= PAGE
}

fn is_mid(size: usize, align: usize) -> bool {
    (MID..BIG).contains(&size) && align <= PAGE
}

/// The class of a mid-size block: its size rounded up to a multiple of an eighth of the power of two below it;
/// class `8 * r + k` holds blocks of `(8 + k) << (MID_LOG2 - 3 + r)` bytes.
fn class(size: usize) -> usize {
    let top = (usize::BITS - 1 - size.leading_zeros()) as usize;
    let step = top - 3;
    8 * (top - MID_LOG2) + size.div_ceil(1 << step) - 8
}

fn class_bytes(class: usize) -> usize {
    (8 + class % 8) << (MID_LOG2 - 3 + class / 8)
}

/// The mid-size pool: per class, the freed blocks (each holds the address of the next in its first word); and the
/// current slab's unused end, and whether it holds only zeros.
struct Pool {
    free: [usize; CLASSES],
    next: usize,
    end: usize,
    zeroed: bool,
}

static POOL: Mutex<Pool> = Mutex::new(Pool { free: [0; CLASSES], next: 0, end: 0, zeroed: true });

/// A mid-size block of `size` bytes, and whether it is fresh (zeroed) memory; null when the kernel has no more.
fn mid_alloc(size: usize) -> (*mut u8, bool) {
    let c = class(size);
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if pool.free[c] != 0 {
        let block = pool.free[c] as *mut usize;
        // SAFETY: a free block was handed back by `mid_free` with its first word holding the next free one.
        pool.free[c] = unsafe { block.read() };
        return (block.cast(), false);
    }
    let bytes = class_bytes(c);
    if pool.end - pool.next < bytes {
        let (slab, zeroed) = big_alloc(SLAB);
        if slab.is_null() {
            return (slab, false);
        }
        (pool.next, pool.end, pool.zeroed) = (slab as usize, slab as usize + SLAB, zeroed);
    }
    let block = pool.next;
    pool.next += bytes;
    (block as *mut u8, pool.zeroed)
}

/// Puts a mid-size block of `size` bytes on its class's free list.
fn mid_free(ptr: *mut u8, size: usize) {
    let c = class(size);
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: the block is at least `MID` bytes, page-aligned (slabs are mappings and classes multiples of 16 KiB),
    // and no longer in use.
    unsafe { ptr.cast::<usize>().write(pool.free[c]) };
    pool.free[c] = ptr as usize;
}

/// A big block of `size` bytes, and whether it is fresh (zeroed) memory: a kept one that holds it if there is one
/// (`kept`), else a new mapping; null when the kernel has no more.
fn big_alloc(size: usize) -> (*mut u8, bool) {
    match kept::take(rounded(size)) {
        Some((start, zeroed)) => (start as *mut u8, zeroed),
        None => (map(size), true),
    }
}

fn rounded(size: usize) -> usize {
    size.div_ceil(PAGE) * PAGE
}

/// A fresh anonymous mapping: zeroed, page-aligned, null on failure.
fn map(size: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping touches no existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            rounded(size),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return std::ptr::null_mut();
    }
    p.cast()
}

// SAFETY: big blocks are whole mappings of at least their size, page-aligned (so any align up to PAGE); mid-size
// blocks are pieces of a slab, a multiple of `MID` long and page-aligned, each handed out once until it is freed;
// everything else goes to `System`. A block's layout decides its path, and callers pass the same layout back to free
// it (a mid-size block's class, which `realloc` may keep, follows from its size).
unsafe impl GlobalAlloc for MappedBlocks {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_mid(layout.size(), layout.align()) {
            mid_alloc(layout.size()).0
        } else if is_big(layout.size(), layout.align()) {
            big_alloc(layout.size()).0
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let (ptr, fresh) = if is_mid(layout.size(), layout.align()) {
            mid_alloc(layout.size())
        } else if is_big(layout.size(), layout.align()) {
            big_alloc(layout.size())
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            return unsafe { System.alloc_zeroed(layout) };
        };
        if !ptr.is_null() && !fresh {
            // SAFETY: the block holds at least `layout.size()` bytes and is the caller's now.
            unsafe { std::ptr::write_bytes(ptr, 0, layout.size()) };
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if is_mid(layout.size(), layout.align()) {
            mid_free(ptr, layout.size());
        } else if is_big(layout.size(), layout.align()) {
            kept::keep(ptr as usize, rounded(layout.size()), false);
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let (old_big, new_big) = (is_big(layout.size(), layout.align()), is_big(new_size, layout.align()));
        let (old_mid, new_mid) = (is_mid(layout.size(), layout.align()), is_mid(new_size, layout.align()));
        if old_mid && new_mid && class(layout.size()) == class(new_size) {
            return ptr;
        }
        if !old_big && !new_big && !old_mid && !new_mid {
            // SAFETY: forwarded with the caller's guarantees.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        if old_big && new_big {
            // SAFETY: `ptr` is a whole mapping of `rounded(layout.size())` bytes; on failure it stays valid.
            let moved =
                unsafe { libc::mremap(ptr.cast(), rounded(layout.size()), rounded(new_size), libc::MREMAP_MAYMOVE) };
            if moved != libc::MAP_FAILED {
                // SAFETY: `moved` is the mapping just resized; the advice only changes how it is backed.
                unsafe { libc::madvise(moved, rounded(new_size), libc::MADV_HUGEPAGE) };
                prefault::grown(moved as usize + rounded(layout.size()), moved as usize + rounded(new_size), new_size);
                return moved.cast();
            }
            // A block cut from kept ranges of several mappings spans more than one, which `mremap` refuses
            // (EFAULT): copy it instead.
        }
        // Another kind of block, or another class: a new block, the bytes both hold, then free the old one.
        // SAFETY: the new layout is valid (same align, the size the caller asked for).
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: as for `alloc`.
        let fresh = unsafe { self.alloc(new_layout) };
        if !fresh.is_null() {
            // SAFETY: both blocks hold at least the smaller size and do not overlap; `ptr` is freed once.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, fresh, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        fresh
    }
}
