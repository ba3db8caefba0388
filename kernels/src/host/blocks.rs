//! The one combine loop every instruction set shares: whole blocks of lanes, then narrow
//! blocks, then single elements.
//!
//! A block reads both operands in full before it stores its result, so `dst` may be `a` or
//! `b` itself and LLVM needs no runtime overlap check (which would send an in-place reduce
//! down its scalar path). Blocks are loaded and stored unaligned: on x86 an unaligned vector
//! access to aligned memory costs nothing extra, so there is no alignment prologue.

use super::lane::{combine_lane, Block, Combine, Lane};

/// `dst[i] = a[i] (O) b[i]` for `i < n_elems`; `F16C` lets `f16` blocks use F16C.
///
/// # Safety
/// As [`super::reduce`], in elements of `T`; the pointers need no alignment. With `F16C`,
/// the CPU must have F16C.
#[inline(always)]
pub(super) unsafe fn combine_all<T: Lane, O: Combine, const F16C: bool>(
    dst: *mut T,
    a: *const T,
    b: *const T,
    n_elems: usize,
) {
    // SAFETY: each access stays below `n_elems`, which the caller vouches for.
    unsafe {
        let done = combine_blocks::<T, O, T::Wide, F16C>(dst, a, b, 0, n_elems);
        let done = combine_blocks::<T, O, T::Narrow, F16C>(dst, a, b, done, n_elems);
        for index in done..n_elems {
            let combined = combine_lane::<T, O>(a.add(index).read_unaligned(), b.add(index).read_unaligned());
            dst.add(index).write_unaligned(combined);
        }
    }
}

/// Combines whole blocks of `B` from element `start` while a whole block fits before
/// `n_elems`; returns the index of the first element left over.
#[inline(always)]
unsafe fn combine_blocks<T: Lane, O: Combine, B: Block<T>, const F16C: bool>(
    dst: *mut T,
    a: *const T,
    b: *const T,
    start: usize,
    n_elems: usize,
) -> usize {
    let mut index = start;
    while n_elems - index >= B::LEN {
        // SAFETY: `index + B::LEN <= n_elems`; both operands are read before `dst` is written;
        // `F16C` is forwarded from the caller.
        unsafe {
            let mut block = a.add(index).cast::<B>().read_unaligned();
            let other = b.add(index).cast::<B>().read_unaligned();
            T::combine_block::<O, F16C>(block.lanes_mut(), other.lanes());
            dst.add(index).cast::<B>().write_unaligned(block);
        }
        one_block_at_a_time();
        index += B::LEN;
    }
    index
}

/// Ends an iteration of a loop over blocks with an empty instruction LLVM cannot widen, so its loop vectoriser leaves
/// the loop alone and only the block itself is vectorised. Without it, LLVM vectorised integer loops across blocks as
/// well, with AVX-512 scatter stores (one element per block): `allreduce/one_shot -d int32` of 1 MiB took 186 us
/// against float's 21 on the development VM (bench/README.md).
#[inline(always)]
pub(super) fn one_block_at_a_time() {
    // SAFETY: an empty instruction: it reads and writes nothing.
    unsafe { std::arch::asm!("", options(nomem, nostack, preserves_flags)) }
}
