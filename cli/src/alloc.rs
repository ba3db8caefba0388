//! The binary's allocator: the system allocator, except that blocks of 1 MiB or more get their own mapping with
//! transparent huge pages and grow in place with `mremap`.
//!
//! Why: verifying thousands of ranks builds arrays of hundreds of megabytes, one after another. With 4 KiB pages the
//! kernel's page-fault path took about a fifth of `collc check allreduce/ring --ranks 1024` (perf), and glibc hands
//! such blocks back to the kernel on free, so every stage faults its pages in again. Huge pages fault 512 times
//! less often. Where the kernel does not give them (THP off), the mapping still works with small pages.

use std::alloc::{GlobalAlloc, Layout, System};

pub struct HugeBlocks;

const BIG: usize = 1 << 20;
const PAGE: usize = 4096;

fn is_big(size: usize, align: usize) -> bool {
    size >= BIG && align <= PAGE
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
    // SAFETY: `p` is the mapping just made; the advice only changes how it is backed.
    unsafe { libc::madvise(p, rounded(size), libc::MADV_HUGEPAGE) };
    p.cast()
}

// SAFETY: big blocks are whole mappings of at least their size, page-aligned (so any align up to PAGE); everything
// else goes to `System`. A block's layout decides its path, and callers pass the same layout back to free it.
unsafe impl GlobalAlloc for HugeBlocks {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_big(layout.size(), layout.align()) {
            map(layout.size())
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_big(layout.size(), layout.align()) {
            map(layout.size())
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if is_big(layout.size(), layout.align()) {
            // SAFETY: `ptr` is a mapping of `rounded(size)` bytes made by `map` or `realloc`.
            unsafe { libc::munmap(ptr.cast(), rounded(layout.size())) };
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let (old_big, new_big) = (is_big(layout.size(), layout.align()), is_big(new_size, layout.align()));
        if !old_big && !new_big {
            // SAFETY: forwarded with the caller's guarantees.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        if old_big && new_big {
            // SAFETY: `ptr` is a whole mapping of `rounded(layout.size())` bytes; on failure it stays valid.
            let moved =
                unsafe { libc::mremap(ptr.cast(), rounded(layout.size()), rounded(new_size), libc::MREMAP_MAYMOVE) };
            if moved == libc::MAP_FAILED {
                return std::ptr::null_mut();
            }
            // SAFETY: `moved` is the mapping just resized.
            unsafe { libc::madvise(moved, rounded(new_size), libc::MADV_HUGEPAGE) };
            return moved.cast();
        }
        // Crossing the threshold: a block of the other kind, the bytes both hold, then free the old one.
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

#[cfg(test)]
mod tests {
    use super::{HugeBlocks, BIG};
    use std::alloc::{GlobalAlloc, Layout};

    /// Fills `len` bytes at `ptr` with a pattern that depends on `seed`.
    fn fill(ptr: *mut u8, len: usize, seed: u8) {
        // SAFETY: the callers pass blocks of at least `len` bytes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
        }
    }

    fn holds(ptr: *const u8, len: usize, seed: u8) -> bool {
        // SAFETY: the callers pass blocks of at least `len` bytes.
        let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
        bytes.iter().enumerate().all(|(i, &b)| b == (i as u8).wrapping_mul(31).wrapping_add(seed))
    }

    /// Every path of `realloc` keeps the bytes both sizes hold: small to big, big to bigger (mremap), big to
    /// smaller, big to small, small to small.
    #[test]
    fn realloc_keeps_the_contents_across_the_threshold() {
        let sizes = [4096, BIG + 12345, 3 * BIG + 7, BIG + 1, 100, 5000];
        let layout = |size: usize| Layout::from_size_align(size, 8).expect("valid layout");
        // SAFETY: each block is used within its size and freed once with the layout it has.
        unsafe {
            let mut ptr = HugeBlocks.alloc(layout(sizes[0]));
            assert!(!ptr.is_null());
            fill(ptr, sizes[0], 7);
            for pair in sizes.windows(2) {
                let (old, new) = (pair[0], pair[1]);
                ptr = HugeBlocks.realloc(ptr, layout(old), new);
                assert!(!ptr.is_null(), "realloc {old} -> {new}");
                assert!(holds(ptr, old.min(new), 7), "realloc {old} -> {new} lost bytes");
                fill(ptr, new, 7);
            }
            HugeBlocks.dealloc(ptr, layout(sizes[sizes.len() - 1]));
        }
    }

    #[test]
    fn big_zeroed_blocks_are_zero_and_page_aligned() {
        let layout = Layout::from_size_align(2 * BIG + 3, 4096).expect("valid layout");
        // SAFETY: the block is read within its size and freed once with its layout.
        unsafe {
            let ptr = HugeBlocks.alloc_zeroed(layout);
            assert!(!ptr.is_null());
            assert_eq!(ptr as usize % 4096, 0);
            assert!(std::slice::from_raw_parts(ptr, layout.size()).iter().all(|&b| b == 0));
            HugeBlocks.dealloc(ptr, layout);
        }
    }
}
