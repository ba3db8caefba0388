//! The fast host kernels: the copy and reduce the runtime runs on every piece it moves.
//!
//! They compute what [`crate::reference`] computes, bit for bit (except which NaN a sum of
//! two NaNs returns, see [`reduce`]), a block of elements at a time in vector registers, with
//! the widest instruction set this CPU has ([`VectorIsa`], detected once). A call picks its
//! loop with one table lookup (data type x operator) and, from one block up, one relaxed
//! atomic load; shorter pieces skip even that. Nothing allocates, locks or dispatches per
//! element.
//!
//! The raw-pointer entry points serve a runtime that reduces between buffers it owns as
//! pointers (in place, `dst == a`, is the common case); [`reduce_slices`] and [`reduce_into`]
//! are the checked forms.

mod blocks;
mod half_blocks;
mod half_float;
mod isa;
mod lane;
mod premul;

pub use isa::VectorIsa;
pub use premul::{premul_sum, Factor};

use half::{bf16, f16};

use crate::{DataType, KernelError, ReduceOp};
use lane::{Block, Combine, Lane, Max, Min, Prod, Sum};

/// `dst[..len] = src[..len]`: a `memcpy`, with a vector loop of its own from `VECTOR_COPY_MIN_BYTES` up on AVX2
/// machines.
///
/// Why not glibc's `memcpy` there: its `rep movsb` path runs about 20 times slower on the AMD
/// host collc is developed on when `dst` lies a few bytes after `src` modulo 4 KiB (1.8 GB/s
/// against 39 GB/s for 64 KiB in cache, measured), and a FIFO slot and a user buffer can sit at
/// exactly such offsets. The loop below has no such case and is as fast elsewhere.
///
/// A range copied onto itself is left as it is: the memory model (docs/language.md §13) lets a `Copy` name one
/// range as source and destination, and in place `in` and `out` are one buffer, so such a copy reaches here.
///
/// # Safety
/// `src` must be valid for reading `len` bytes and `dst` for writing `len` bytes, and the two
/// ranges must be the same or not overlap. There is no alignment requirement.
#[inline]
pub unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    if std::ptr::eq(dst, src) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if len >= VECTOR_COPY_MIN_BYTES && VectorIsa::detected() >= VectorIsa::Avx2 {
        // SAFETY: forwarded from the caller; AVX2 is present.
        unsafe { vector_copy::copy(dst, src, len) };
        return;
    }
    // SAFETY: the caller's contract is `copy_nonoverlapping`'s.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// Below this, `memcpy`'s short paths (no `rep movsb`) are as fast as the vector loop.
const VECTOR_COPY_MIN_BYTES: usize = 256;

#[cfg(target_arch = "x86_64")]
mod vector_copy {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_storeu_si256};

    /// 128 bytes per round in four unaligned 32-byte loads and stores; the tail by `copy_nonoverlapping`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
        let mut at = 0;
        // SAFETY (all blocks below): the caller guarantees `len` bytes at both pointers and no overlap; every access
        // is below `len`.
        unsafe {
            while at + 128 <= len {
                let v = [0, 32, 64, 96].map(|k| _mm256_loadu_si256(src.add(at + k) as *const __m256i));
                for (k, v) in [0, 32, 64, 96].into_iter().zip(v) {
                    _mm256_storeu_si256(dst.add(at + k) as *mut __m256i, v);
                }
                at += 128;
            }
            std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), len - at);
        }
    }
}

/// `dst[..len] = src[..len]` with non-temporal stores: for results that will not be read again soon (the output
/// of a message larger than the caches), so the destination's lines are not first read from memory and do not
/// evict what the next instructions need. Short copies and non-x86 targets fall back to [`copy`].
///
/// # Safety
/// As [`copy`].
pub unsafe fn copy_streaming(dst: *mut u8, src: *const u8, len: usize) {
    if std::ptr::eq(dst, src) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if len >= STREAMING_MIN_BYTES {
        // SAFETY: forwarded from the caller.
        unsafe { streaming::copy(dst, src, len) };
        return;
    }
    // SAFETY: forwarded from the caller.
    unsafe { copy(dst, src, len) }
}

/// Below this, the fence and the unaligned head cost more than non-temporal stores save.
const STREAMING_MIN_BYTES: usize = 4096;

#[cfg(target_arch = "x86_64")]
mod streaming {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};

    /// SSE2 (every x86-64 CPU): 16-byte aligned stream stores, 64 bytes per round, unaligned loads.
    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
        let head = dst.align_offset(16).min(len);
        // SAFETY (all blocks below): the caller guarantees `len` bytes at both pointers, no overlap; `dst + head`
        // is 16-byte aligned, so every stream store is aligned.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, head);
            let (mut d, mut s, mut left) = (dst.add(head), src.add(head), len - head);
            while left >= 64 {
                for k in 0..4 {
                    let v = _mm_loadu_si128(s.add(16 * k) as *const __m128i);
                    _mm_stream_si128(d.add(16 * k) as *mut __m128i, v);
                }
                (d, s, left) = (d.add(64), s.add(64), left - 64);
            }
            std::ptr::copy_nonoverlapping(s, d, left);
            // Stream stores are weakly ordered: make them visible before anything published after this copy.
            _mm_sfence();
        }
    }
}

/// `dst[i] = a[i] (op) b[i]` for `n_elems` little-endian elements of `dtype`, with
/// [`crate::reference::reduce`]'s arithmetic; `Avg` and `PreMulSum` combine as `Sum` (PreMulSum's multiplication
/// is [`Factor`]'s). A user's operator runs its compiled loop (`UserOp::reduce`): it must have been prepared for
/// `dtype`.
///
/// The one difference: when both operands of a float `Sum`, `Prod` or `Avg` are NaN, the
/// result on x86 is always `a`'s NaN made quiet, where the reference's NaN depends on how LLVM
/// compiled it (see `lane.rs`); elsewhere it is some NaN.
///
/// # Safety
/// - `a` and `b` must be valid for reading, and `dst` for writing, `n_elems *
///   dtype.size_bytes()` bytes. There is no alignment requirement, though element- or
///   64-byte-aligned buffers are the fast case.
/// - `dst` may be exactly `a` or exactly `b` (or both), but must not otherwise overlap
///   either. `a` and `b` may overlap each other in any way.
#[inline]
pub unsafe fn reduce(dtype: DataType, op: ReduceOp, dst: *mut u8, a: *const u8, b: *const u8, n_elems: usize) {
    if let ReduceOp::User(op) = op {
        // SAFETY: forwarded from the caller.
        return unsafe { op.reduce(dtype, dst, a, b, n_elems) };
    }
    let kernel = REDUCE_KERNELS[usize::from(dtype.nccl_code())][usize::from(op.nccl_code())];
    // SAFETY: forwarded from the caller; the table row is `dtype`'s scalar.
    unsafe { kernel(dst, a, b, n_elems) }
}

/// `dst = dst (op) src`, elementwise: [`crate::reference::reduce`]'s contract and checks, at
/// the host kernels' speed.
pub fn reduce_slices(dtype: DataType, op: ReduceOp, dst: &mut [u8], src: &[u8]) -> Result<(), KernelError> {
    check_same_length(dst, src)?;
    let n_elems = count_elements(dtype, dst)?;
    let dst = dst.as_mut_ptr();
    // SAFETY: both slices hold `n_elems` elements and `dst` is exactly the first operand.
    unsafe { reduce(dtype, op, dst, dst, src.as_ptr(), n_elems) };
    Ok(())
}

/// `dst = a (op) b`, elementwise, for three buffers of the same length.
pub fn reduce_into(dtype: DataType, op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) -> Result<(), KernelError> {
    check_same_length(dst, a)?;
    check_same_length(dst, b)?;
    let n_elems = count_elements(dtype, dst)?;
    // SAFETY: all three slices hold `n_elems` elements, and `dst`, being `&mut`, overlaps neither.
    unsafe { reduce(dtype, op, dst.as_mut_ptr(), a.as_ptr(), b.as_ptr(), n_elems) };
    Ok(())
}

/// One monomorphic kernel per data type and operator, indexed by their NCCL codes, so a
/// call costs one indirect jump into a small function rather than a walk through a function
/// holding all fifty.
type ReduceKernel = unsafe fn(*mut u8, *const u8, *const u8, usize);

static REDUCE_KERNELS: [[ReduceKernel; 6]; 10] = [
    kernels_for::<i8>(),
    kernels_for::<u8>(),
    kernels_for::<i32>(),
    kernels_for::<u32>(),
    kernels_for::<i64>(),
    kernels_for::<u64>(),
    kernels_for::<f16>(),
    kernels_for::<f32>(),
    kernels_for::<f64>(),
    kernels_for::<bf16>(),
];

/// `T`'s row, in `ReduceOp` code order: `Sum`, `Prod`, `Max`, `Min`, `Avg` and `PreMulSum` (both as `Sum`).
const fn kernels_for<T: Lane>() -> [ReduceKernel; 6] {
    [
        reduce_as::<T, Sum>,
        reduce_as::<T, Prod>,
        reduce_as::<T, Max>,
        reduce_as::<T, Min>,
        reduce_as::<T, Sum>,
        reduce_as::<T, Sum>,
    ]
}

/// Less than one wide block runs the baseline loop right here: wider registers would not
/// help, and the runtime sends pieces as small as one element, so this path must stay a few
/// instructions (the long path lives in its own function so its register needs do not make
/// every call save registers).
///
/// # Safety
/// As [`reduce`], with `T` the scalar of its `dtype`.
unsafe fn reduce_as<T: Lane, O: Combine>(dst: *mut u8, a: *const u8, b: *const u8, n_elems: usize) {
    let (dst, a, b) = (dst.cast::<T>(), a.cast::<T>(), b.cast::<T>());
    // SAFETY: forwarded from the caller.
    unsafe {
        if n_elems < <T::Wide as Block<T>>::LEN {
            blocks::combine_all::<T, O, false>(dst, a, b, n_elems);
        } else {
            reduce_long::<T, O>(dst, a, b, n_elems);
        }
    }
}

/// # Safety
/// As [`reduce`], in elements of `T`.
#[inline(never)]
unsafe fn reduce_long<T: Lane, O: Combine>(dst: *mut T, a: *const T, b: *const T, n_elems: usize) {
    // SAFETY: forwarded from the caller; `detected()` is what this CPU supports.
    unsafe { isa::combine_with::<T, O>(VectorIsa::detected(), dst, a, b, n_elems) }
}

fn check_same_length(dst: &[u8], src: &[u8]) -> Result<(), KernelError> {
    if dst.len() == src.len() {
        Ok(())
    } else {
        Err(KernelError::LengthMismatch { dst_bytes: dst.len(), src_bytes: src.len() })
    }
}

fn count_elements(dtype: DataType, buf: &[u8]) -> Result<usize, KernelError> {
    let n_elems = buf.len() / dtype.size_bytes();
    if n_elems * dtype.size_bytes() == buf.len() {
        Ok(n_elems)
    } else {
        Err(KernelError::PartialElement { dtype, bytes: buf.len() })
    }
}

#[cfg(test)]
mod tests;
