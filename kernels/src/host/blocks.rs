//! The one combine loop every instruction set shares: whole blocks of lanes, then narrow
//! blocks, then single elements.
//!
//! A block reads both operands in full before it stores its result, so `dst` may be `a` or
//! `b` itself and LLVM needs no runtime overlap check (which would send an in-place reduce
//! down its scalar path). Blocks are loaded and stored unaligned: on x86 an unaligned vector
//! access to aligned memory costs nothing extra, so there is no alignment prologue.

use super::lane::{Block, Combine, Lane};

/// `dst[i] = a[i] (O) b[i]` for `i < n_elems`.
///
/// # Safety
/// As [`super::reduce`], in elements of `T`; the pointers need no alignment.
#[inline(always)]
pub(super) unsafe fn combine_all<T: Lane, O: Combine>(dst: *mut T, a: *const T, b: *const T, n_elems: usize) {
    // SAFETY: each call stays below `n_elems`, which the caller vouches for.
    unsafe {
        let done = combine_blocks::<T, O, T::Wide>(dst, a, b, 0, n_elems);
        let done = combine_blocks::<T, O, T::Narrow>(dst, a, b, done, n_elems);
        for index in done..n_elems {
            let combined = combine_lane::<T, O>(a.add(index).read_unaligned(), b.add(index).read_unaligned());
            dst.add(index).write_unaligned(combined);
        }
    }
}

/// Combines whole blocks of `B` from element `start` while a whole block fits before
/// `n_elems`; returns the index of the first element left over.
#[inline(always)]
unsafe fn combine_blocks<T: Lane, O: Combine, B: Block<T>>(
    dst: *mut T,
    a: *const T,
    b: *const T,
    start: usize,
    n_elems: usize,
) -> usize {
    let mut index = start;
    while n_elems - index >= B::LEN {
        // SAFETY: `index + B::LEN <= n_elems`; both operands are read before `dst` is written.
        unsafe {
            let mut block = a.add(index).cast::<B>().read_unaligned();
            let other = b.add(index).cast::<B>().read_unaligned();
            for (lane, &other_lane) in block.lanes_mut().iter_mut().zip(other.lanes()) {
                *lane = combine_lane::<T, O>(*lane, other_lane);
            }
            dst.add(index).cast::<B>().write_unaligned(block);
        }
        index += B::LEN;
    }
    index
}

#[inline(always)]
fn combine_lane<T: Lane, O: Combine>(a: T, b: T) -> T {
    O::apply(a.from_le(), b.from_le()).to_le()
}
