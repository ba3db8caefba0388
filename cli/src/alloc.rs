//! The binary's allocator: the system allocator, except for two kinds of block.
//!
//! - Blocks of 1 MiB or more get their own mapping and grow in place with `mremap`; a block that grows is advised
//!   to use transparent huge pages. A freed one stays mapped (`kept`): the next big blocks and slabs are cut from
//!   it, its pages already faulted in.
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
//! transfers, the deadlock graph's dependents) get them; the slabs and the blocks allocated at their full size,
//! written once in order, keep small pages (`collc check allreduce/ring --ranks 4096` median 11.1 s against 12.7 s
//! with huge pages everywhere and 12.6 s with small pages everywhere; no change at 1024). Where the kernel does not give huge
//! pages (THP off), the mappings still work with small ones. Mid-size blocks are kept for reuse until the process
//! ends: what a process holds is at most the most it ever had live in each class. Freed big blocks are kept the
//! same way (at most 32 ranges, the smallest handed back first); the prefault helper's reserve adds at most twice
//! the largest block that grew while a `Prefault` was held.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;

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

/// Freed big blocks, kept mapped for the next ones. At p = 4096 the verifiers' tables (2 GB) are made after the
/// lowered program (1.3 GB) and the scheduler's index (0.3 GB) are freed: a block made from their pages skips the
/// kernel's first touch of each page, which costs several times what clearing it costs (bench/README.md).
mod kept {
    use std::sync::Mutex;

    /// At most this many freed ranges are kept; past it the smallest is handed back to the kernel.
    const RANGES: usize = 32;

    /// A kept range of whole pages: where it starts, its bytes (0: an empty place), and whether it holds only
    /// zeros (never handed out: a range the prefault helper reserved).
    #[derive(Clone, Copy)]
    struct Range {
        start: usize,
        bytes: usize,
        zeroed: bool,
    }

    const EMPTY: Range = Range { start: 0, bytes: 0, zeroed: false };

    static KEPT: Mutex<[Range; RANGES]> = Mutex::new([EMPTY; RANGES]);

    fn unmap(start: usize, bytes: usize) {
        // SAFETY: `start..start + bytes` is a page range of mappings this allocator made, no longer in use.
        unsafe { libc::munmap(start as *mut libc::c_void, bytes) };
    }

    /// Keeps a range of whole pages for reuse (freed, or `zeroed` fresh memory), or hands it (or a smaller kept
    /// one) back to the kernel.
    pub(super) fn keep(start: usize, bytes: usize, zeroed: bool) {
        let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
        let smallest = (0..RANGES).min_by_key(|&i| kept[i].bytes).expect("RANGES > 0");
        if kept[smallest].bytes >= bytes {
            drop(kept);
            return unmap(start, bytes);
        }
        let old = std::mem::replace(&mut kept[smallest], Range { start, bytes, zeroed });
        drop(kept);
        if old.bytes > 0 {
            unmap(old.start, old.bytes);
        }
    }

    /// The start of `bytes` (whole pages) taken from the smallest kept range that holds them, if any, and whether
    /// they hold only zeros. The rest of that range stays kept when it is a big block itself, else it goes back
    /// to the kernel.
    pub(super) fn take(bytes: usize) -> Option<(usize, bool)> {
        let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
        let fit = (0..RANGES).filter(|&i| kept[i].bytes >= bytes).min_by_key(|&i| kept[i].bytes)?;
        let range = kept[fit];
        let rest = Range { start: range.start + bytes, bytes: range.bytes - bytes, ..range };
        kept[fit] = if rest.bytes >= super::BIG { rest } else { EMPTY };
        drop(kept);
        if rest.bytes > 0 && rest.bytes < super::BIG {
            unmap(rest.start, rest.bytes);
        }
        Some((range.start, range.zeroed))
    }

    /// The kept ranges that hold only zeros.
    #[cfg(test)]
    pub(super) fn zeroed() -> Vec<(usize, usize)> {
        let kept = *KEPT.lock().unwrap_or_else(|e| e.into_inner());
        kept.iter().filter(|r| r.zeroed && r.bytes > 0).map(|r| (r.start, r.bytes)).collect()
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
        if is_mid(layout.size(), layout.align()) {
            let (ptr, fresh) = mid_alloc(layout.size());
            if !ptr.is_null() && !fresh {
                // SAFETY: the block holds at least `layout.size()` bytes and is the caller's now.
                unsafe { std::ptr::write_bytes(ptr, 0, layout.size()) };
            }
            ptr
        } else if is_big(layout.size(), layout.align()) {
            let (ptr, fresh) = big_alloc(layout.size());
            if !ptr.is_null() && !fresh {
                // SAFETY: the block holds at least `layout.size()` bytes and is the caller's now.
                unsafe { std::ptr::write_bytes(ptr, 0, layout.size()) };
            }
            ptr
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.alloc_zeroed(layout) }
        }
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
            if moved == libc::MAP_FAILED {
                return std::ptr::null_mut();
            }
            // SAFETY: `moved` is the mapping just resized; the advice only changes how it is backed.
            unsafe { libc::madvise(moved, rounded(new_size), libc::MADV_HUGEPAGE) };
            prefault::grown(moved as usize + rounded(layout.size()), moved as usize + rounded(new_size), new_size);
            return moved.cast();
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

/// While a `Prefault` is held, a helper thread faults in memory on the idle core, so that the kernel clears those
/// pages there: first the part a big block grows by, front to back in steps of 2 MiB, while the block's owner fills
/// it; then, with nothing of that left, a reserve of fresh memory kept for the next blocks and slabs (`kept`), up to
/// twice the size of the largest block that grew. Worth it only where one thread fills a growing array and the
/// other core is idle: lowering, which fills the program's transfer list, took 1.16-1.20 s at p = 4096 with it and
/// 1.26-4.2 s without (bench/README.md), the slow launches being those where the kernel's first touch of its pages
/// was slow; the reserve holds the schedules' first slabs (at p = 4096 they take about twice what the lowered
/// program takes).
pub struct Prefault(());

mod prefault {
    use std::sync::{Condvar, Mutex};

    /// What the helper is asked to do.
    pub(super) struct Wanted {
        /// Whether a `Prefault` is held.
        pub on: bool,
        /// The part of the last grown block still to fault in.
        pub grown: (usize, usize),
        /// How much reserve to make, how much is made, and the part of the newest piece still to fault in.
        pub budget: usize,
        pub reserved: usize,
        pub piece: (usize, usize),
    }

    pub(super) const IDLE: Wanted = Wanted { on: false, grown: (0, 0), budget: 0, reserved: 0, piece: (0, 0) };
    pub(super) static WANTED: Mutex<Wanted> = Mutex::new(IDLE);
    pub(super) static WAKE: Condvar = Condvar::new();
    pub(super) static STARTED: std::sync::Once = std::sync::Once::new();
    const STEP: usize = 2 << 20;
    /// The reserve is mapped in pieces of this size (each kept as one range once mapped).
    const PIECE: usize = 256 << 20;

    /// A big block grew to `block` bytes: its new part is `start..end` (only the last growth is worth faulting
    /// in, as a block that grows again has moved).
    pub(super) fn grown(start: usize, end: usize, block: usize) {
        let mut wanted = WANTED.lock().unwrap_or_else(|e| e.into_inner());
        if wanted.on {
            wanted.grown = (start, end);
            wanted.budget = wanted.budget.max(2 * block);
            WAKE.notify_one();
        }
    }

    enum Job {
        Fault(usize, usize),
        Reserve(usize),
    }

    /// The next step of the wanted ranges, the grown block's first.
    fn next_job(wanted: &mut Wanted) -> Option<Job> {
        if !wanted.on {
            return None;
        }
        for range in [&mut wanted.grown, &mut wanted.piece] {
            if range.0 < range.1 {
                let end = (range.0 + STEP).min(range.1);
                let start = std::mem::replace(&mut range.0, end);
                return Some(Job::Fault(start, end));
            }
        }
        let bytes = PIECE.min(wanted.budget - wanted.reserved);
        wanted.reserved += bytes;
        (bytes > 0).then_some(Job::Reserve(bytes))
    }

    /// The helper: takes the next job and does it outside the lock.
    pub(super) fn helper() {
        loop {
            let job = {
                let mut wanted = WANTED.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    match next_job(&mut wanted) {
                        Some(job) => break job,
                        None => wanted = WAKE.wait(wanted).unwrap_or_else(|e| e.into_inner()),
                    }
                }
            };
            match job {
                // SAFETY: the advice writes nothing: it faults in pages of anonymous private memory as a write
                // would, leaving what they hold. If the range was handed out meanwhile, its owner sees the same
                // bytes; if it was freed or moved, it is unmapped (the call fails, harmlessly) or belongs to another
                // anonymous block, whose pages it faults in the same way.
                Job::Fault(start, end) => unsafe {
                    libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_POPULATE_WRITE);
                },
                Job::Reserve(bytes) => {
                    let start = super::map(bytes) as usize;
                    if start != 0 {
                        // Kept before it is faulted in: a block may take it at once, the rest is faulted after.
                        super::kept::keep(start, bytes, true);
                        let mut wanted = WANTED.lock().unwrap_or_else(|e| e.into_inner());
                        if wanted.on {
                            wanted.piece = (start, start + bytes);
                        }
                    }
                }
            }
        }
    }
}

/// Runs `work` holding a `Prefault`.
pub fn while_prefaulting<T>(work: impl FnOnce() -> T) -> T {
    let _prefault = Prefault::start();
    work()
}

impl Prefault {
    /// Starts faulting in, until the value is dropped. The helper thread is started the first time and then waits
    /// between uses.
    pub fn start() -> Prefault {
        prefault::STARTED.call_once(|| {
            let _ = std::thread::Builder::new().name("prefault".into()).spawn(prefault::helper);
        });
        prefault::WANTED.lock().unwrap_or_else(|e| e.into_inner()).on = true;
        Prefault(())
    }
}

impl Drop for Prefault {
    fn drop(&mut self) {
        *prefault::WANTED.lock().unwrap_or_else(|e| e.into_inner()) = prefault::IDLE;
    }
}

#[cfg(test)]
mod tests {
    use super::{class, class_bytes, MappedBlocks, BIG, CLASSES, MID};
    use std::alloc::{GlobalAlloc, Layout};
    use std::sync::Mutex;

    /// The tests of mid-size blocks share one pool: one at a time, so that a freed block is still there to reuse;
    /// the tests that grow big blocks take it too.
    static MID_TESTS: Mutex<()> = Mutex::new(());

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
        // Its big blocks grow: not while the prefault test waits for its own.
        let _one_at_a_time = MID_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let sizes = [4096, BIG + 12345, 3 * BIG + 7, BIG + 1, 100, 5000];
        let layout = |size: usize| Layout::from_size_align(size, 8).expect("valid layout");
        // SAFETY: each block is used within its size and freed once with the layout it has.
        unsafe {
            let mut ptr = MappedBlocks.alloc(layout(sizes[0]));
            assert!(!ptr.is_null());
            fill(ptr, sizes[0], 7);
            for pair in sizes.windows(2) {
                let (old, new) = (pair[0], pair[1]);
                ptr = MappedBlocks.realloc(ptr, layout(old), new);
                assert!(!ptr.is_null(), "realloc {old} -> {new}");
                assert!(holds(ptr, old.min(new), 7), "realloc {old} -> {new} lost bytes");
                fill(ptr, new, 7);
            }
            MappedBlocks.dealloc(ptr, layout(sizes[sizes.len() - 1]));
        }
    }

    /// Mid-size blocks: `realloc` within a class keeps the block, across classes and kinds it keeps the bytes; a
    /// freed block is handed out again for its class, and zeroed when asked for zeroed memory.
    #[test]
    fn mid_size_blocks_are_reused_per_class_and_zeroed_on_demand() {
        let _one_at_a_time = MID_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let layout = |size: usize| Layout::from_size_align(size, 8).expect("valid layout");
        // SAFETY: each block is used within its size and freed once with the layout it has.
        unsafe {
            let a = MappedBlocks.alloc(layout(MID + 100));
            assert!(!a.is_null());
            assert_eq!(a as usize % 4096, 0);
            fill(a, MID + 100, 3);
            // MID + 100 is in the class of MID * 9 / 8 bytes.
            let grown = MappedBlocks.realloc(a, layout(MID + 100), MID * 9 / 8);
            assert_eq!(grown, a, "the same class grows in place");
            assert!(holds(grown, MID + 100, 3));
            let moved = MappedBlocks.realloc(grown, layout(MID * 9 / 8), 5 * MID);
            assert!(holds(moved, MID + 100, 3), "another class keeps the bytes");
            fill(moved, 5 * MID, 4);
            MappedBlocks.dealloc(moved, layout(5 * MID));
            // Freed, the block is the next one of its class, and zeroed when asked.
            let again = MappedBlocks.alloc_zeroed(layout(5 * MID - 1000));
            assert_eq!(again, moved, "a freed block is reused for its class");
            assert!(std::slice::from_raw_parts(again, 5 * MID - 1000).iter().all(|&b| b == 0));
            MappedBlocks.dealloc(again, layout(5 * MID - 1000));
        }
    }

    /// Threads allocating and freeing mid-size blocks at once never get overlapping blocks: each fills its block with
    /// its own pattern and finds it intact before freeing it.
    #[test]
    fn mid_size_blocks_are_private_to_their_owner_across_threads() {
        let _one_at_a_time = MID_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let workers: Vec<_> = (0..4u8)
            .map(|t| {
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    for round in 0..200usize {
                        let size = MID + (round * 7919 + t as usize * 104_729) % (BIG - MID);
                        let layout = Layout::from_size_align(size, 8).expect("valid layout");
                        // SAFETY: each block is used within its size and freed once with its layout.
                        unsafe {
                            let ptr = MappedBlocks.alloc(layout);
                            assert!(!ptr.is_null());
                            fill(ptr, size, t);
                            held.push((ptr as usize, layout));
                            if round % 3 == 0 {
                                let (old, old_layout) = held.swap_remove(round % held.len());
                                assert!(holds(old as *const u8, old_layout.size(), t), "thread {t} lost its block");
                                MappedBlocks.dealloc(old as *mut u8, old_layout);
                            }
                        }
                    }
                    for (ptr, layout) in held {
                        // SAFETY: as above.
                        unsafe {
                            assert!(holds(ptr as *const u8, layout.size(), t), "thread {t} lost its block");
                            MappedBlocks.dealloc(ptr as *mut u8, layout);
                        }
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().expect("no worker panics");
        }
    }

    /// Every mid size has a class whose blocks hold it and waste at most an eighth of it; classes grow with size.
    #[test]
    fn mid_size_classes_hold_their_sizes_with_little_waste() {
        let mut last = 0;
        for size in (MID..BIG).step_by(1021).chain([BIG - 1]) {
            let c = class(size);
            assert!(c < CLASSES, "{size} bytes: class {c}");
            let bytes = class_bytes(c);
            assert!(bytes >= size && bytes - size <= size / 8, "{size} bytes in a block of {bytes}");
            assert_eq!(bytes % 4096, 0, "{size} bytes: blocks of {bytes} keep page alignment");
            assert!(c >= last, "classes grow with size");
            last = c;
        }
    }

    #[test]
    fn big_zeroed_blocks_are_zero_and_page_aligned() {
        let _one_at_a_time = MID_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let layout = Layout::from_size_align(2 * BIG + 3, 4096).expect("valid layout");
        // SAFETY: the block is read within its size and freed once with its layout.
        unsafe {
            let ptr = MappedBlocks.alloc_zeroed(layout);
            assert!(!ptr.is_null());
            assert_eq!(ptr as usize % 4096, 0);
            assert!(std::slice::from_raw_parts(ptr, layout.size()).iter().all(|&b| b == 0));
            MappedBlocks.dealloc(ptr, layout);
        }
    }

    /// A freed big block is kept and handed out again, front first, the rest kept for the next block; asked for
    /// zeroed memory, a kept block that held data comes zeroed.
    #[test]
    fn freed_big_blocks_are_handed_out_again() {
        // No other test's big blocks meanwhile: they would be kept beside this one, or take it.
        let _one_at_a_time = MID_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let layout = |size: usize| Layout::from_size_align(size, 8).expect("valid layout");
        // Larger than any other test's blocks, so the smallest kept range that holds 40 or 50 of them is this one.
        let (whole, front, back) = (96 * BIG, 40 * BIG, 50 * BIG);
        // SAFETY: each block is used within its size and freed once with its layout.
        unsafe {
            let ptr = MappedBlocks.alloc(layout(whole));
            assert!(!ptr.is_null());
            fill(ptr, whole, 9);
            MappedBlocks.dealloc(ptr, layout(whole));
            let first = MappedBlocks.alloc(layout(front));
            assert_eq!(first, ptr, "the freed block's front is handed out again");
            assert!(holds(first, front, 9), "a kept block is not cleared unless asked");
            let second = MappedBlocks.alloc_zeroed(layout(back));
            assert_eq!(second as usize, ptr as usize + front, "the rest of the kept block comes next");
            assert!(std::slice::from_raw_parts(second, back).iter().all(|&b| b == 0));
            MappedBlocks.dealloc(first, layout(front));
            MappedBlocks.dealloc(second, layout(back));
        }
    }

    /// With a `Prefault` held, the part a big block grows by gets faulted in by the helper (the kernel reports its
    /// pages resident) while the block keeps its contents and the new part reads zero; then a reserve of twice the
    /// block is made and faulted in.
    #[test]
    fn a_grown_block_is_faulted_in_while_a_prefault_is_held() {
        let (old, new) = (BIG + 4096, 16 * BIG);
        let layout = Layout::from_size_align(old, 8).expect("valid layout");
        let resident = |ptr: *mut u8, len: usize| {
            let mut pages = vec![0u8; len.div_ceil(4096)];
            // SAFETY: `ptr..ptr + len` lies in one mapping of this test; `pages` has a byte per page.
            let ok = unsafe { libc::mincore(ptr.cast(), len, pages.as_mut_ptr()) } == 0;
            ok && pages.iter().all(|p| p & 1 == 1)
        };
        // The helper follows the last block that grew: no other test's meanwhile.
        let _one_at_a_time = MID_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: each block is used within its size and freed once with the layout it has.
        unsafe {
            let ptr = MappedBlocks.alloc(layout);
            fill(ptr, old, 3);
            // Kernels before 5.14 lack the advice: there the helper can do nothing, and growing must still work.
            let supported = libc::madvise(ptr.cast(), 4096, libc::MADV_POPULATE_WRITE) == 0;
            let before: Vec<usize> = super::kept::zeroed().into_iter().map(|(start, _)| start).collect();
            let prefault = super::Prefault::start();
            let grown = MappedBlocks.realloc(ptr, layout, new);
            assert!(!grown.is_null());
            let tail = (grown as usize + super::rounded(old)) as *mut u8;
            let tail_len = new - super::rounded(old);
            let started = std::time::Instant::now();
            while supported && !resident(tail, tail_len) && started.elapsed() < std::time::Duration::from_secs(10) {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            assert!(!supported || resident(tail, tail_len), "the helper did not fault in the grown part");
            // Then it reserves twice the grown block in fresh memory, kept for the next blocks, and faults it in.
            let reserved = || super::kept::zeroed().into_iter().filter(|&(start, _)| !before.contains(&start));
            while reserved().map(|(_, bytes)| bytes).sum::<usize>() < 2 * new
                || supported && !reserved().all(|(start, bytes)| resident(start as *mut u8, bytes))
            {
                assert!(started.elapsed() < std::time::Duration::from_secs(10), "no reserve was made and faulted in");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            drop(prefault);
            assert!(holds(grown, old, 3));
            assert!(std::slice::from_raw_parts(tail, tail_len).iter().all(|&b| b == 0));
            MappedBlocks.dealloc(grown, Layout::from_size_align(new, 8).expect("valid layout"));
        }
    }
}
