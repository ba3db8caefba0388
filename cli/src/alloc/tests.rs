//! The allocator's tests: mid-size classes and reuse, big blocks kept and handed out again, the prefault helper.

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

/// A block that no kept range holds is joined from several, largest first: their pages are moved, not cleared
/// (the bytes at each end of each range are found where the range went); asked for zeroed memory, it comes zeroed.
#[test]
fn a_block_no_kept_range_holds_is_joined_from_several() {
    // No other test's big blocks meanwhile; these are larger than theirs, so they are the two largest kept.
    let _one_at_a_time = MID_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let layout = |size: usize| Layout::from_size_align(size, 8).expect("valid layout");
    let (first, second, joined, edge) = (120 * BIG, 100 * BIG, 180 * BIG, 64 << 10);
    // SAFETY: each block is used within its size and freed once with its layout.
    unsafe {
        let a = MappedBlocks.alloc(layout(first));
        let b = MappedBlocks.alloc(layout(second));
        assert!(!a.is_null() && !b.is_null());
        fill(a, edge, 1);
        fill(a.add(first - edge), edge, 2);
        fill(b, edge, 3);
        MappedBlocks.dealloc(a, layout(first));
        MappedBlocks.dealloc(b, layout(second));
        let block = MappedBlocks.alloc(layout(joined));
        assert!(!block.is_null());
        assert!(holds(block, edge, 1) && holds(block.add(first - edge), edge, 2), "the larger range comes first");
        assert!(holds(block.add(first), edge, 3), "then the next one");
        MappedBlocks.dealloc(block, layout(joined));
        // Kept now: the joined block and the rest of the second range; together they hold this one.
        let zeroed = MappedBlocks.alloc_zeroed(layout(joined + 20 * BIG));
        assert!(!zeroed.is_null());
        assert!(std::slice::from_raw_parts(zeroed, joined + 20 * BIG).iter().all(|&b| b == 0));
        MappedBlocks.dealloc(zeroed, layout(joined + 20 * BIG));
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
        let prefault = super::prefault::Prefault::start();
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

/// A block joined from kept ranges of several mappings (one advised huge pages when it grew, one not) spans more
/// than one mapping, which `mremap` cannot grow: `realloc` copies it instead of failing (it once aborted
/// `collc run allreduce/one_shot --ranks 1024` with "memory allocation of 2097152 bytes failed").
#[test]
fn a_block_joined_from_several_mappings_grows() {
    let _one_at_a_time = MID_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let layout = |size: usize| Layout::from_size_align(size, 8).expect("valid layout");
    // Only this test's ranges kept, so that no single one holds the joined block; none left for the next test.
    super::kept::clear();
    // SAFETY: each block is used within its size and freed once with the layout it has.
    unsafe {
        let grown = MappedBlocks.alloc(layout(BIG));
        let grown = MappedBlocks.realloc(grown, layout(BIG), 40 * BIG);
        let plain = MappedBlocks.alloc(layout(40 * BIG));
        assert!(!grown.is_null() && !plain.is_null());
        MappedBlocks.dealloc(grown, layout(40 * BIG));
        MappedBlocks.dealloc(plain, layout(40 * BIG));
        let joined = MappedBlocks.alloc(layout(70 * BIG));
        assert!(!joined.is_null());
        fill(joined, 70 * BIG, 3);
        let bigger = MappedBlocks.realloc(joined, layout(70 * BIG), 90 * BIG);
        assert!(!bigger.is_null(), "a joined block could not grow");
        assert!(holds(bigger, 70 * BIG, 3), "growing a joined block lost bytes");
        MappedBlocks.dealloc(bigger, layout(90 * BIG));
    }
    super::kept::clear();
}
