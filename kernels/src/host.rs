//! The fast host kernels: the copy and reduce the runtime runs on every piece it moves.
//!
//! They compute exactly what [`crate::reference`] computes, bit for bit, but a block of
//! elements at a time in vector registers, using the widest instruction set this CPU has
//! ([`VectorIsa`], detected once). A call picks its loop with two jump tables (data type,
//! operator) and, for more than one block, one relaxed atomic load; pieces smaller than a
//! block skip even that. Nothing allocates, locks or dispatches per element.
//!
//! The raw-pointer entry points serve a runtime that reduces between buffers it owns as
//! pointers (in place, `dst == a`, is the common case); [`reduce_slices`] and [`reduce_into`]
//! are the checked forms.

mod blocks;
mod half_float;
mod isa;
mod lane;

pub use isa::VectorIsa;

use crate::element::with_element_type;
use crate::{DataType, KernelError, ReduceOp};
use lane::{Block, Combine, Lane, Max, Min, Prod, Sum};

/// `dst[..len] = src[..len]`: a `memcpy`.
///
/// # Safety
/// `src` must be valid for reading `len` bytes and `dst` for writing `len` bytes, and the two
/// ranges must not overlap. There is no alignment requirement.
#[inline]
pub unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller's contract is `copy_nonoverlapping`'s.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// `dst[i] = a[i] (op) b[i]` for `n_elems` little-endian elements of `dtype`, with
/// [`crate::reference::reduce`]'s arithmetic; `Avg` combines as `Sum`.
///
/// When both operands of a float `Sum`, `Prod` or `Avg` are NaN, the result on x86 is `a`'s
/// NaN made quiet (the hardware's rule for `a + b`, which the reference follows as compiled).
///
/// # Safety
/// - `a` and `b` must be valid for reading, and `dst` for writing, `n_elems *
///   dtype.size_bytes()` bytes. There is no alignment requirement, though element- or
///   64-byte-aligned buffers are the fast case.
/// - `dst` may be exactly `a` or exactly `b` (or both), but must not otherwise overlap
///   either. `a` and `b` may overlap each other in any way.
#[inline]
pub unsafe fn reduce(dtype: DataType, op: ReduceOp, dst: *mut u8, a: *const u8, b: *const u8, n_elems: usize) {
    // SAFETY: forwarded from the caller.
    with_element_type!(dtype, Scalar => unsafe { reduce_as::<Scalar>(op, dst, a, b, n_elems) })
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

/// Picks the operator once, so each loop is compiled for exactly one.
#[inline(always)]
unsafe fn reduce_as<T: Lane>(op: ReduceOp, dst: *mut u8, a: *const u8, b: *const u8, n_elems: usize) {
    let (dst, a, b) = (dst.cast::<T>(), a.cast::<T>(), b.cast::<T>());
    // SAFETY: forwarded from the caller.
    unsafe {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => reduce_with::<T, Sum>(dst, a, b, n_elems),
            ReduceOp::Prod => reduce_with::<T, Prod>(dst, a, b, n_elems),
            ReduceOp::Max => reduce_with::<T, Max>(dst, a, b, n_elems),
            ReduceOp::Min => reduce_with::<T, Min>(dst, a, b, n_elems),
        }
    }
}

/// Less than one wide block runs the baseline loop inline: wider registers would not help,
/// and the runtime sends pieces as small as one element.
#[inline(always)]
unsafe fn reduce_with<T: Lane, O: Combine>(dst: *mut T, a: *const T, b: *const T, n_elems: usize) {
    // SAFETY: forwarded from the caller; `detected()` is what this CPU supports.
    unsafe {
        if n_elems < <T::Wide as Block<T>>::LEN {
            blocks::combine_all::<T, O>(dst, a, b, n_elems);
        } else {
            isa::combine_with::<T, O>(VectorIsa::detected(), dst, a, b, n_elems);
        }
    }
}

fn check_same_length(dst: &[u8], src: &[u8]) -> Result<(), KernelError> {
    if dst.len() == src.len() {
        Ok(())
    } else {
        Err(KernelError::LengthMismatch { dst_bytes: dst.len(), src_bytes: src.len() })
    }
}

fn count_elements(dtype: DataType, buf: &[u8]) -> Result<usize, KernelError> {
    if buf.len() % dtype.size_bytes() == 0 {
        Ok(buf.len() / dtype.size_bytes())
    } else {
        Err(KernelError::PartialElement { dtype, bytes: buf.len() })
    }
}

#[cfg(test)]
mod tests;
