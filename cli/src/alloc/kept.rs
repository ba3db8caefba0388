//! Freed big blocks, kept mapped for the next ones. At p = 4096 the verifiers' tables (1.5 GB) are made after the
//! lowered program (1.3 GB) and the scheduler's index (0.3 GB) are freed: a block made from their pages skips the
//! kernel's first touch of each page (2.1-2.5 GB/s for small pages on the VM collc is developed on, bench/README.md;
//! a block asked for zeroed is cleared with `write_bytes` instead). A block no kept range holds may be joined from
//! several.

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
    if bytes == 0 {
        return;
    }
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
/// to the kernel. When no range holds them but several together do, they are joined (`join`).
pub(super) fn take(bytes: usize) -> Option<(usize, bool)> {
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    let Some(fit) = (0..RANGES).filter(|&i| kept[i].bytes >= bytes).min_by_key(|&i| kept[i].bytes) else {
        return join(&mut kept, bytes);
    };
    let (range, dropped) = cut_front(&mut kept, fit, bytes);
    // The system call outside the lock, as in `keep`.
    drop(kept);
    unmap(dropped.start, dropped.bytes);
    Some((range.start, range.zeroed))
}

/// Takes the first `bytes` of kept range `i`: returns the range as it was, and the rest when it is too small to
/// keep (no bytes when there is none or it stays kept), for the caller to hand back to the kernel (`unmap` skips
/// an empty range).
fn cut_front(kept: &mut [Range; RANGES], i: usize, bytes: usize) -> (Range, Range) {
    let range = kept[i];
    let rest = Range { start: range.start + bytes, bytes: range.bytes - bytes, ..range };
    let keep = rest.bytes >= super::BIG;
    kept[i] = if keep { rest } else { EMPTY };
    (range, if keep { EMPTY } else { rest })
}

/// `bytes` made of several kept ranges, largest first, moved side by side into a new stretch of addresses
/// (`mremap` moves pages and their page tables, nothing is copied or cleared); `None` unless the kept ranges hold
/// that much together. At p = 4096 the second verifier's 256 MiB table found only 128 MiB ranges (the scheduler's
/// index) and pieces of others: each page of a fresh one is cleared by the kernel on first touch, on the critical
/// path.
fn join(kept: &mut [Range; RANGES], bytes: usize) -> Option<(usize, bool)> {
    if kept.iter().map(|r| r.bytes).sum::<usize>() < bytes {
        return None;
    }
    // Fresh pages first: whatever a failed move leaves in place reads zero, so the block is always whole.
    let block = super::map(bytes) as usize;
    if block == 0 {
        return None;
    }
    // No list on the heap: this runs inside the allocator.
    let mut order: [usize; RANGES] = std::array::from_fn(|i| i);
    order.sort_unstable_by_key(|&i| std::cmp::Reverse(kept[i].bytes));
    let (mut filled, mut zeroed) = (0, true);
    for i in order {
        if filled == bytes || kept[i].bytes == 0 {
            break;
        }
        let range = kept[i];
        let n = range.bytes.min(bytes - filled);
        // SAFETY: `range.start..+n` is kept (mapped and unused) and `block + filled..+n` lies in `block`; the move
        // replaces that part of `block` and unmaps the source.
        let moved = unsafe {
            libc::mremap(
                range.start as *mut libc::c_void,
                n,
                n,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                (block + filled) as *mut libc::c_void,
            )
        };
        if moved == libc::MAP_FAILED {
            break;
        }
        let (_, dropped) = cut_front(kept, i, n);
        unmap(dropped.start, dropped.bytes);
        zeroed &= range.zeroed;
        filled += n;
    }
    Some((block, zeroed))
}

/// Hands every kept range back to the kernel, for a test that needs to know what is kept.
#[cfg(test)]
pub(super) fn clear() {
    let ranges = std::mem::replace(&mut *KEPT.lock().unwrap_or_else(|e| e.into_inner()), [EMPTY; RANGES]);
    for range in ranges {
        unmap(range.start, range.bytes);
    }
}

/// The kept ranges that hold only zeros.
#[cfg(test)]
pub(super) fn zeroed() -> Vec<(usize, usize)> {
    let kept = *KEPT.lock().unwrap_or_else(|e| e.into_inner());
    kept.iter().filter(|r| r.zeroed && r.bytes > 0).map(|r| (r.start, r.bytes)).collect()
}
